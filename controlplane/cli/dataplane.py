"""The data plane's processes, run on the serving hosts: `agent` and `router` (no Django: they use the REST API)."""
from __future__ import annotations

from pathlib import Path

import typer

from ._common import fail


def _logging_setup(level: str) -> None:
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs every request at INFO: an agent's two calls a second would be 170,000 lines a day (the soak's
        # agents wrote 1 MB an hour each). Its warnings stay; --log-level debug shows the requests again.
        logging.getLogger("httpx").setLevel(logging.WARNING)


def agent(
    control_plane: str = typer.Option(None, envvar="TESSERA_CONTROL_PLANE", help="Control plane URL, e.g. http://cp:8000"),
    token: str = typer.Option(None, envvar="TESSERA_AGENT_TOKEN", help="The host's agent token (tsa_...)"),
    backend: str = typer.Option("nvml", help="Device backend: nvml (real GPUs) or simulated"),
    simulate: str = typer.Option("", help='Simulated GPUs, e.g. "2xA100-SXM4-40GB,1xH100-SXM5-80GB" (with --backend simulated; none: a CPU-only host)'),
    simulate_cpu_cores: int = typer.Option(None, min=1, help="Declared CPU cores of a simulated host (with --backend simulated; default: the machine's)"),
    state_dir: Path = typer.Option(Path("var/agent"), help="Where runtime records, cached artifacts and logs live"),
    desired_file: Path = typer.Option(None, help="Follow this desired-state file instead of the control plane"),
    bind: str = typer.Option("127.0.0.1", help="Address the runtimes listen on"),
    advertise: str = typer.Option(None, help="Address routers reach the runtimes at (default: the bind address)"),
    metrics_port: int = typer.Option(0, help="Serve Prometheus /metrics on this port (0: off)"),
    once: bool = typer.Option(False, help="One pass (register, reconcile, report), then exit; runtimes keep running"),
    keep_mig_modes: bool = typer.Option(False, "--keep-mig-modes", envvar="TESSERA_AGENT_KEEP_MIG_MODES",
                                        help="Never switch a GPU's MIG mode (another tool owns it): a desired state that would is "
                                             "refused for that GPU and reported; instances are still made within the mode"),
    stop_runtimes_on_exit: bool = typer.Option(False, help="Drain and stop the runtimes when the agent exits"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run the worker agent: register the host, apply its desired state (MIG and runtimes), report, heartbeat."""
    import signal

    from workers.agent.main import agent_build, crash_failpoint_from_env

    _logging_setup(loglevel)
    if desired_file is None and not (control_plane and token):
        raise fail("give --control-plane and --token (or --desired-file to run without a control plane)")
    try:
        the_agent = agent_build(
            control_plane=control_plane, token=token, backend=backend, simulate=simulate, simulate_cpu_cores=simulate_cpu_cores, state_dir=state_dir,
            desired_file=desired_file, bind=bind, advertise=advertise, metrics_port=metrics_port,
            on_operation=crash_failpoint_from_env(), keep_mig_modes=keep_mig_modes,
        )
    except ValueError as exc:
        raise fail(str(exc))

    def shutdown(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, shutdown)
    try:
        the_agent.run(once=once)
    except KeyboardInterrupt:
        pass
    finally:
        the_agent.stop(stop_runtimes=stop_runtimes_on_exit)


def router(
    control_plane: str = typer.Option(..., envvar="TESSERA_CONTROL_PLANE", help="Control plane URL"),
    token: str = typer.Option(..., envvar="TESSERA_ROUTER_TOKEN",
                              help="The router's credential (tessera router-credential issue NAME prints one)"),
    listen: str = typer.Option("127.0.0.1:8100", help="host:port to serve HTTP on (POST /v1/infer/{application}, /v2)"),
    grpc_listen: str = typer.Option(None, help="host:port to serve the Open Inference Protocol over gRPC on "
                                               "(default: --listen's host, its port + 1; 'off': HTTP only)"),
    name: str = typer.Option(None, help="Name in router reports: the credential's (default: asked of the control plane)"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run the router: the inference endpoint (HTTP and gRPC), following the control plane's routing tables."""
    from workers.router.main import router_main

    _logging_setup(loglevel)
    host, port = _host_port(listen, "--listen")
    if grpc_listen is None:
        grpc_listen = f"{host}:{port + 1 if port else 0}"
    elif grpc_listen != "off":
        _host_port(grpc_listen, "--grpc-listen")
    router_main(control_plane=control_plane, token=token, host=host, port=port, name=name,
                grpc_listen=None if grpc_listen == "off" else grpc_listen)


def _host_port(value: str, option: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise fail(f"{option} must be host:port, not {value!r}")
    return host, int(port)
