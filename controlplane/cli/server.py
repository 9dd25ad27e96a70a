"""The control plane's processes: `demo` (seed and run everything locally), `serve` (Daphne), `ingest` (the data
plane's HTTP API on uvicorn), `worker` (Celery)."""
from __future__ import annotations

import os
from pathlib import Path

import typer

from ._common import EXIT_MALFORMED, django_setup


def demo(
    host: str = typer.Option("127.0.0.1", help="Address to serve on"),
    port: int = typer.Option(8000, help="Port to serve on"),
    serve: bool = typer.Option(True, help="Run the control plane after seeding"),
    dataplane: bool = typer.Option(True, help="Also run the demo's simulated agents and a router (port 8100)"),
    router_port: int = typer.Option(8100, help="Port of the demo's router"),
    router_grpc_port: int = typer.Option(8101, help="Port of the demo's router's gRPC (the Open Inference Protocol); 0: none"),
    admin_password: str = typer.Option(None, envvar="TESSERA_ADMIN_PASSWORD", help="Admin password (random if unset)"),
) -> None:
    """Migrate, seed the demo fleet, run the control plane on embedded defaults with simulated agents and a router."""
    django_setup()
    from django.conf import settings
    from django.core.management import call_command

    from controlplane.demo import demo_dataplane_start, demo_dataplane_stop, demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    result = demo_seed(admin_password=admin_password)
    database = settings.DATABASES["default"]
    typer.echo(f"Database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
    typer.echo("Demo fleet: " + ("seeded" if result.created else "already present, kept"))
    typer.echo(f"Control plane: http://{host}:{port}/   admin: http://{host}:{port}/admin/   API: http://{host}:{port}/api/v1/docs/")
    for user, password in result.logins.items():
        typer.echo(f"  login {user:<9} password {password}")
    if not serve:
        return
    running = None
    if settings.CELERY_TASK_ALWAYS_EAGER:  # no broker and no beat: the control loop's clock runs in this process
        from controlplane.embedded import embedded_scheduler_start

        embedded_scheduler_start()
        typer.echo("Control loop: planning watch every 5 s and periodic re-plans in this process (no beat without Redis)")
    if dataplane:
        state_root = Path(settings.VAR_DIR) / "demo-dataplane"
        running = demo_dataplane_start(control_plane=f"http://{host}:{port}", state_root=state_root, router_port=router_port,
                                       router_grpc_port=router_grpc_port or None)
        typer.echo(f"Data plane: 4 simulated agents and a router at {running.router_url}"
                   + (f" (gRPC {running.router_grpc})" if running.router_grpc else "") + f" (logs in {state_root / 'logs'})")
        typer.echo(f"  try: curl -s {running.router_url}/v1/infer/tabular-cpu -H 'Content-Type: application/json' "
                   "-d '{\"inputs\": [{\"name\": \"input\", \"shape\": [1, 8], \"datatype\": \"FP32\", "
                   "\"data\": [0.5, -1.2, 0.3, 2.0, -0.7, 0.1, 1.5, -0.4]}]}'")
    import signal

    def terminate(signum, frame):
        raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: agents drain and stop their runtimes

    signal.signal(signal.SIGTERM, terminate)
    try:
        call_command("runserver", f"{host}:{port}", use_reloader=False)
    except KeyboardInterrupt:
        pass
    finally:
        if running is not None:
            typer.echo("Stopping the demo's agents (they stop their runtimes) and router...")
            demo_dataplane_stop(running)


def serve(
    bind: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0: every interface, as the images and manifests ask)"),
    port: int = typer.Option(8000),
    processes: int = typer.Option(1, min=1, max=64, help="Daphne processes sharing one listening socket (needs Redis)"),
) -> None:
    """Run the control plane with Daphne (HTTP and WebSocket) under the current settings.

    One Python process uses one core: with --processes N, N Daphne processes accept from one socket (the
    kernel spreads connections), and the Redis channel layer carries live events between them."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    if processes == 1:
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(["-b", bind, "-p", str(port), "--proxy-headers", "controlplane.asgi:application"])
        return
    import sys

    raise typer.Exit(_serve_processes(
        bind=bind, port=port, processes=processes, server="Daphne", why="--processes",
        command=lambda fd: [sys.executable, "-m", "daphne", "--fd", str(fd), "--proxy-headers", "controlplane.asgi:application"]))


# The agents' endpoint server: uvicorn with httptools' parser and uvloop (already the router's server), HTTP
# only. Per request it costs about a quarter of Daphne's (Twisted's) parsing and dispatch.
INGEST_UVICORN_OPTIONS = ["--proxy-headers", "--loop", "uvloop", "--http", "httptools", "--ws", "none", "--lifespan", "off",
                          "--no-access-log", "--timeout-keep-alive", "75"]


def ingest(
    bind: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0: every interface, as the images and manifests ask)"),
    port: int = typer.Option(8001),
    processes: int = typer.Option(1, min=1, max=64, help="Processes sharing one listening socket"),
) -> None:
    """Serve the data plane's HTTP API (agents' metrics and state, routers' reports) apart from operators.

    The same application as `serve`, HTTP only (no WebSocket), on uvicorn, which parses a request at about
    a quarter of Daphne's cost: point the agents' TESSERA_CONTROL_PLANE (or a proxy's /api/v1/hosts/ route)
    here, so a fleet's reports never queue ahead of operators' requests on `serve`'s processes. Needs
    REDIS_URL: the live events of what it ingests reach browsers through the Redis channel layer."""
    import sys

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    raise typer.Exit(_serve_processes(
        bind=bind, port=port, processes=processes, server="uvicorn", why="tessera ingest",
        command=lambda fd: [sys.executable, "-m", "uvicorn", "--fd", str(fd), *INGEST_UVICORN_OPTIONS, "controlplane.asgi:application"]))


def _serve_processes(*, bind: str, port: int, processes: int, server: str, why: str, command) -> int:
    """Bind once, start `processes` server children (`command(fd)`) on the inherited socket, relay
    SIGTERM/SIGINT to them and return the first failed child's exit status (0 when all stopped cleanly)."""
    import signal
    import socket
    import subprocess
    import time

    django_setup(os.environ["DJANGO_SETTINGS_MODULE"])
    from django.conf import settings

    if settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer":
        typer.echo(f"error: {why} needs REDIS_URL: the in-memory channel layer does not reach other processes, so "
                   "a browser on one would miss what the others ingest", err=True)
        return EXIT_MALFORMED
    listener = socket.create_server((bind, port), backlog=2048)
    listener.set_inheritable(True)
    children = [subprocess.Popen(command(listener.fileno()), pass_fds=(listener.fileno(),))  # nosec B603 - this Python, the server module
                for _ in range(processes)]
    listener.close()  # the children hold it
    typer.echo(f"Serving on {bind}:{port} with {processes} {server} processes: {' '.join(str(c.pid) for c in children)}")

    def relay(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, relay)
    signal.signal(signal.SIGINT, relay)
    # Fail together: when one child stops (or a signal came), stop the others, so a supervisor restarts
    # the whole service rather than leaving it at part capacity.
    while all(child.poll() is None for child in children):
        time.sleep(0.5)
    relay(None, None)
    statuses = [child.wait() for child in children]
    failed = next((s for s in statuses if s not in (0, -signal.SIGTERM)), 0)
    return 128 - failed if failed < 0 else failed  # killed by signal N: 128 + N, as a shell reports it


def worker(
    concurrency: int = typer.Option(2, help="Worker processes"),
    beat: bool = typer.Option(False, help="Also run the beat scheduler in this process"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run a Celery worker for the control plane's background jobs."""
    django_setup()
    from controlplane.celery import app as celery_app

    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}"]
    if beat:
        argv.append("--beat")
    celery_app.worker_main(argv)
