"""`tessera`: the command line. Subcommands that need the database set Django up themselves; the engine's
subcommands (mig, plan, simulate) run without Django."""
from __future__ import annotations

import os
from pathlib import Path

import typer

app = typer.Typer(help="Tessera: SLO-aware control plane for GPU inference fleets.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens for CI and scripts.", no_args_is_help=True)
app.add_typer(token_app, name="token")
mig_app = typer.Typer(help="MIG geometry: validate and enumerate layouts, mig-parted config files.", no_args_is_help=True)
app.add_typer(mig_app, name="mig")
plan_app = typer.Typer(help="Placement plans: solve a planning problem, validate a plan.", no_args_is_help=True)
app.add_typer(plan_app, name="plan")

# Exit codes of the engine commands: 0 fine, 1 the thing checked is invalid, 2 the input is malformed.
EXIT_INVALID = 1
EXIT_MALFORMED = 2
PLANNERS = ("proteus", "joint", "garrison", "clipper-ha", "clipper-ht", "sommelier", "infaas")


def _django_setup(settings: str = "controlplane.settings.local") -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


@app.command()
def demo(
    host: str = typer.Option("127.0.0.1", help="Address to serve on"),
    port: int = typer.Option(8000, help="Port to serve on"),
    serve: bool = typer.Option(True, help="Run the control plane after seeding"),
    dataplane: bool = typer.Option(True, help="Also run the demo's simulated agents and a router (port 8100)"),
    router_port: int = typer.Option(8100, help="Port of the demo's router"),
    admin_password: str = typer.Option(None, envvar="TESSERA_ADMIN_PASSWORD", help="Admin password (random if unset)"),
) -> None:
    """Migrate, seed the demo fleet, run the control plane on embedded defaults with simulated agents and a router."""
    _django_setup()
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
        running = demo_dataplane_start(control_plane=f"http://{host}:{port}", state_root=state_root, router_port=router_port)
        typer.echo(f"Data plane: 4 simulated agents and a router at {running.router_url} (logs in {state_root / 'logs'})")
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


@app.command()
def serve(
    bind: str = typer.Option("0.0.0.0", help="Address to bind"),
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
    raise typer.Exit(_serve_processes(bind=bind, port=port, processes=processes))


def _serve_processes(*, bind: str, port: int, processes: int) -> int:
    """Bind once, start `processes` Daphne children on the inherited socket, relay SIGTERM/SIGINT to them
    and return the first failed child's exit status (0 when all stopped cleanly)."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    _django_setup(os.environ["DJANGO_SETTINGS_MODULE"])
    from django.conf import settings

    if settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer":
        typer.echo("error: --processes needs REDIS_URL: the in-memory channel layer does not reach other processes, so "
                   "a browser on one would miss what the others ingest", err=True)
        return EXIT_MALFORMED
    listener = socket.create_server((bind, port), backlog=2048)
    listener.set_inheritable(True)
    command = [sys.executable, "-m", "daphne", "--fd", str(listener.fileno()), "--proxy-headers", "controlplane.asgi:application"]
    children = [subprocess.Popen(command, pass_fds=(listener.fileno(),)) for _ in range(processes)]
    listener.close()  # the children hold it
    typer.echo(f"Serving on {bind}:{port} with {processes} Daphne processes: {' '.join(str(c.pid) for c in children)}")

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


@app.command()
def worker(
    concurrency: int = typer.Option(2, help="Worker processes"),
    beat: bool = typer.Option(False, help="Also run the beat scheduler in this process"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run a Celery worker for the control plane's background jobs."""
    _django_setup()
    from controlplane.celery import app as celery_app

    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}"]
    if beat:
        argv.append("--beat")
    celery_app.worker_main(argv)


@token_app.command("create")
def token_create_cmd(
    user: str = typer.Option(..., help="Username that the token acts for"),
    description: str = typer.Option("", help="What the token is for"),
    read_only: bool = typer.Option(False, help="Refuse writes with this token"),
) -> None:
    """Create an API token for USER and print its secret (shown once)."""
    _django_setup()
    from django.contrib.auth import get_user_model

    from apps.core.context import change_context
    from apps.users.services import token_create

    account = get_user_model().objects.filter(username=user).first()
    if account is None:
        typer.echo(f"error: no user {user!r}", err=True)
        raise typer.Exit(2)
    with change_context(source="command"):
        token, secret = token_create(user=account, description=description, write_enabled=not read_only)
    typer.echo(secret)


@app.command()
def agent_token(host: str = typer.Argument(..., help="Host name")) -> None:
    """Issue a new agent token for HOST and print it (shown once; the previous token stops working)."""
    _django_setup()
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate

    target = Host.objects.filter(name=host).first()
    if target is None:
        typer.echo(f"error: no host {host!r}", err=True)
        raise typer.Exit(2)
    with change_context(source="command"):
        typer.echo(host_agent_token_rotate(host=target))


# --------------------------------------------------------------------------- data plane commands
# These run on the serving hosts and never set Django up: they reach the control plane over its REST API.


def _logging_setup(level: str) -> None:
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
def agent(
    control_plane: str = typer.Option(None, envvar="TESSERA_CONTROL_PLANE", help="Control plane URL, e.g. http://cp:8000"),
    token: str = typer.Option(None, envvar="TESSERA_AGENT_TOKEN", help="The host's agent token (tsa_...)"),
    backend: str = typer.Option("nvml", help="Device backend: nvml (real GPUs) or simulated"),
    simulate: str = typer.Option("", help='Simulated GPUs, e.g. "2xA100-SXM4-40GB,1xH100-SXM5-80GB" (with --backend simulated; none: a CPU-only host)'),
    state_dir: Path = typer.Option(Path("var/agent"), help="Where runtime records, cached artifacts and logs live"),
    desired_file: Path = typer.Option(None, help="Follow this desired-state file instead of the control plane"),
    bind: str = typer.Option("127.0.0.1", help="Address the runtimes listen on"),
    advertise: str = typer.Option(None, help="Address routers reach the runtimes at (default: the bind address)"),
    metrics_port: int = typer.Option(0, help="Serve Prometheus /metrics on this port (0: off)"),
    once: bool = typer.Option(False, help="One pass (register, reconcile, report), then exit; runtimes keep running"),
    stop_runtimes_on_exit: bool = typer.Option(False, help="Drain and stop the runtimes when the agent exits"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run the worker agent: register the host, apply its desired state (MIG and runtimes), report, heartbeat."""
    import signal

    from workers.agent.main import agent_build, crash_failpoint_from_env

    _logging_setup(loglevel)
    if desired_file is None and not (control_plane and token):
        raise _fail("give --control-plane and --token (or --desired-file to run without a control plane)")
    try:
        the_agent = agent_build(
            control_plane=control_plane, token=token, backend=backend, simulate=simulate, state_dir=state_dir,
            desired_file=desired_file, bind=bind, advertise=advertise, metrics_port=metrics_port,
            on_operation=crash_failpoint_from_env(),
        )
    except ValueError as exc:
        raise _fail(str(exc))

    def shutdown(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, shutdown)
    try:
        the_agent.run(once=once)
    except KeyboardInterrupt:
        pass
    finally:
        the_agent.stop(stop_runtimes=stop_runtimes_on_exit)


@app.command()
def router(
    control_plane: str = typer.Option(..., envvar="TESSERA_CONTROL_PLANE", help="Control plane URL"),
    token: str = typer.Option(..., envvar="TESSERA_AGENT_TOKEN", help="Agent token of the host the router runs on"),
    listen: str = typer.Option("127.0.0.1:8100", help="host:port to serve POST /v1/infer/{application} on"),
    name: str = typer.Option(None, help="Name in router reports (default: the host's name)"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run the router: the inference endpoint, following the control plane's routing tables."""
    from workers.router.main import router_main

    _logging_setup(loglevel)
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise _fail(f"--listen must be host:port, not {listen!r}")
    router_main(control_plane=control_plane, token=token, host=host, port=int(port), name=name)


# --------------------------------------------------------------------------- engine commands
# The engine is imported inside each command: `tessera --help` stays fast and never loads the solvers.


def _fail(message: str, code: int = EXIT_MALFORMED) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _gpu_model(name: str):
    from engine.geometry.catalogue import mig_catalogue_load

    catalogue = mig_catalogue_load()
    model = catalogue.gpu_model_find(name)
    if model is None:
        raise _fail(f"unknown GPU model {name!r} (MIG catalogue: {', '.join(catalogue.gpu_model_names)})")
    return model


def _layout(placements: list[str]):
    from engine.geometry.layout import layout_parse

    try:
        return layout_parse(placements)
    except ValueError as exc:
        raise _fail(str(exc)) from exc


@mig_app.command("validate")
def mig_validate_cmd(
    placements: list[str] = typer.Argument(None, help="GPU instances as profile@start, e.g. 3g.20gb@0 2g.10gb@4"),
    gpu: str = typer.Option(..., "--gpu", help="GPU model, e.g. A100-SXM4-40GB (NVML names work too)"),
) -> None:
    """Check a MIG layout: exit 0 when valid, 1 with the reason when not, 2 for an unknown GPU or a malformed placement."""
    from engine.geometry.layout import mig_layout_validate

    model = _gpu_model(gpu)
    layout = _layout(placements or [])
    verdict = mig_layout_validate(model, layout)
    shown = " ".join(map(str, layout)) or "(no instances)"
    if not verdict.valid:
        typer.echo(f"invalid: {verdict.reason}")
        raise typer.Exit(EXIT_INVALID)
    typer.echo(f"valid: {shown} on {model.name}")


@mig_app.command("layouts")
def mig_layouts_cmd(
    gpu: str = typer.Option(..., "--gpu", help="GPU model, e.g. H100-SXM5-80GB"),
    maximal: bool = typer.Option(False, "--maximal", help="Only layouts to which no further instance can be added"),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of layouts"),
) -> None:
    """Every valid MIG layout of a GPU model, one per line (the empty layout prints as '-')."""
    import json

    from engine.geometry.layout import mig_layouts_enumerate

    layouts = mig_layouts_enumerate(_gpu_model(gpu), maximal=maximal)
    if as_json:
        typer.echo(json.dumps([[str(p) for p in layout] for layout in layouts]))
        return
    for layout in layouts:
        typer.echo(" ".join(map(str, layout)) or "-")


@mig_app.command("export")
def mig_export_cmd(
    placements: list[str] = typer.Argument(None, help="GPU instances as profile@start (none: MIG on, no instances)"),
    gpu: str = typer.Option(..., "--gpu", help="GPU model"),
    name: str = typer.Option("tessera", "--name", help="Name of the mig-parted config"),
    devices: str = typer.Option("all", "--devices", help="'all' or comma-separated GPU indices"),
    mig_off: bool = typer.Option(False, "--mig-off", help="Disable MIG on the devices instead"),
    out: Path = typer.Option(None, "--out", help="Write the config.yaml here instead of printing it"),
) -> None:
    """Write a layout as a mig-parted config.yaml (version v1); the exact placements ride along as a comment."""
    from engine.geometry.layout import InvalidLayout
    from engine.geometry.migparted import mig_parted_export

    model = _gpu_model(gpu)
    layout = None if mig_off else _layout(placements or [])
    try:
        targets = "all" if devices.strip() == "all" else tuple(int(d) for d in devices.split(","))
        text = mig_parted_export({name: [(model, layout, targets)]})
    except InvalidLayout as exc:
        typer.echo(f"invalid: {exc}")
        raise typer.Exit(EXIT_INVALID) from exc
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}")


@mig_app.command("import")
def mig_import_cmd(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="mig-parted config.yaml"),
    gpu: str = typer.Option(None, "--gpu", help="Also place each entry's instance counts on this GPU model"),
) -> None:
    """Read a mig-parted config.yaml: per config and entry, the devices and instance counts (and, with
    --gpu, a concrete layout for those counts)."""
    from engine.geometry.catalogue import UnknownMigProfile
    from engine.geometry.layout import mig_counts_to_layout
    from engine.geometry.migparted import MigPartedError, mig_parted_import

    try:
        configs = mig_parted_import(config.read_text())
    except MigPartedError as exc:
        raise _fail(str(exc)) from exc
    model = _gpu_model(gpu) if gpu else None
    unplaceable = False
    for cname, entries in configs.items():
        typer.echo(f"{cname}:")
        for entry in entries:
            devices = entry.devices if entry.devices == "all" else ",".join(map(str, entry.devices))
            if not entry.mig_enabled:
                typer.echo(f"  devices {devices}: MIG disabled")
                continue
            counts = ", ".join(f"{n} x {p}" for p, n in entry.counts.items()) or "no instances"
            line = f"  devices {devices}: {counts}"
            if model is not None:
                try:
                    layout = mig_counts_to_layout(model, entry.counts)
                except (UnknownMigProfile, ValueError) as exc:
                    layout, line = None, f"{line} -> {exc}"
                if layout is not None:
                    line += " -> " + (" ".join(map(str, layout)) or "(no instances)")
                elif "->" not in line:
                    line += f" -> does not fit on {model.name}"
                unplaceable = unplaceable or layout is None
            typer.echo(line)
    if unplaceable:
        raise typer.Exit(EXIT_INVALID)


def _json_read(path: Path, what: str):
    import json

    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise _fail(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise _fail(f"{what} {path} is not valid JSON: {exc}") from exc


def _problem_read(path: Path):
    from engine.plans.problem import ProblemError, problem_from_dict
    from engine.plans.schema import json_validate, problem_schema

    raw = _json_read(path, "problem")
    try:
        json_validate(raw, problem_schema(), what=f"problem {path}")
        return problem_from_dict(raw)
    except ProblemError as exc:  # SchemaError is a ProblemError
        raise _fail(str(exc) if str(exc).startswith("problem ") else f"problem {path}: {exc}") from exc


def _plan_read(path: Path):
    from engine.plans.problem import ProblemError, plan_from_dict
    from engine.plans.schema import json_validate, plan_schema

    raw = _json_read(path, "plan")
    try:
        json_validate(raw, plan_schema(), what=f"plan {path}")
        return plan_from_dict(raw)
    except ProblemError as exc:
        raise _fail(str(exc) if str(exc).startswith("plan ") else f"plan {path}: {exc}") from exc


def _verdict_echo(verdict) -> None:
    typer.echo(f"verdict      {'valid' if verdict.valid else 'INVALID'}" + (f" ({len(verdict.warnings)} warning(s))" if verdict.warnings else ""))
    for error in verdict.errors:
        typer.echo(f"  error: {error}")
    for warning in verdict.warnings:
        typer.echo(f"  warning: {warning}")


def _number(value: float | None, fmt: str = ".6g") -> str:
    return "-" if value is None else format(value, fmt)


def _plan_summary_echo(problem, plan) -> None:
    demand = problem.total_demand_rps
    shortfall = sum(plan.shortfall_rps.values())
    gap = "-" if plan.gap is None else f"{plan.gap:.2%}"
    typer.echo(f"status       {plan.status} ({plan.solver}, {plan.objective_kind})")
    typer.echo(f"objective    {_number(plan.objective)}   bound {_number(plan.bound)}   gap {gap}")
    typer.echo(f"solve time   {plan.solve_seconds:.2f} s")
    typer.echo(f"accuracy     {_number(plan.effective_accuracy, '.4f')} effective")
    typer.echo(f"served       {plan.total_served_rps:.6g} / {demand:.6g} rps" + (f"   shortfall {shortfall:.6g} rps" if shortfall else ""))
    typer.echo(f"GPUs used    {plan.gpus_used} of {sum(1 for d in problem.devices if not d.is_cpu)}   instances {len(plan.instances)}")
    for note in plan.notes:
        typer.echo(f"  note: {note}")


@plan_app.command("solve")
def plan_solve_cmd(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON (see docs/planning.md)"),
    solver: str = typer.Option("proteus", "--solver", help="proteus | joint | garrison, or a baseline: clipper-ha | clipper-ht | sommelier | infaas"),
    objective: str = typer.Option(None, "--objective", help="max-accuracy | min-gpus (default: the problem's options)"),
    time_limit: float = typer.Option(None, "--time-limit", help="Solver time limit in seconds (default: the problem's options)"),
    gap: float = typer.Option(None, "--gap", help="Relative MIP gap to stop at, e.g. 0.01"),
    backend: str = typer.Option(None, "--backend", help="MIP backend: highs | cbc"),
    threads: int = typer.Option(None, "--threads", help="Solver threads (CBC searches in parallel; HiGHS's MIP search is serial)"),
    out: Path = typer.Option(None, "--out", help="Write the plan JSON here"),
) -> None:
    """Solve a planning problem, print a summary, write the plan and check it with the independent validator.
    Exit 0 when the plan is valid, 1 when it fails validation, 2 for malformed input."""
    import json

    from engine.plans.problem import OBJECTIVES, SOLVERS

    if solver not in PLANNERS:
        raise _fail(f"--solver must be one of {', '.join(PLANNERS)}, got {solver!r}")
    if objective is not None and objective not in OBJECTIVES:
        raise _fail(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if backend is not None and backend not in SOLVERS:
        raise _fail(f"--backend must be one of {', '.join(SOLVERS)}, got {backend!r}")
    if time_limit is not None and not time_limit > 0:
        raise _fail(f"--time-limit must be positive, got {time_limit:g}")
    if gap is not None and not 0 <= gap <= 1:
        raise _fail(f"--gap must be between 0 and 1, got {gap:g}")
    if threads is not None and threads < 1:
        raise _fail(f"--threads must be at least 1, got {threads}")
    problem = _problem_read(problem_path)
    if threads is not None:
        import dataclasses

        problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, threads=threads))

    from engine.plans.validate import plan_validate
    from engine.solvers.solve import plan_solve

    try:
        plan = plan_solve(problem, solver, objective=objective, time_limit_s=time_limit, mip_gap=gap, backend=backend)
    except ValueError as exc:  # ProblemError is a ValueError
        raise _fail(str(exc)) from exc
    _plan_summary_echo(problem, plan)
    if out is not None:
        out.write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
        typer.echo(f"plan         written to {out}")
    verdict = plan_validate(problem, plan)
    _verdict_echo(verdict)
    if not verdict.valid:
        raise typer.Exit(EXIT_INVALID)


@plan_app.command("validate")
def plan_validate_cmd(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON"),
    plan_path: Path = typer.Option(..., "--plan", help="Plan JSON, as `tessera plan solve --out` writes it"),
) -> None:
    """Check a plan against its problem without trusting any solver: exit 0 valid, 1 invalid (errors listed), 2 malformed input."""
    from engine.plans.validate import plan_validate

    problem = _problem_read(problem_path)
    plan = _plan_read(plan_path)
    verdict = plan_validate(problem, plan)
    _verdict_echo(verdict)
    if not verdict.valid:
        raise typer.Exit(EXIT_INVALID)


SIMULATE_PLANNERS = PLANNERS
SIMULATE_BATCHING = ("proteus", "aimd", "nexus", "max-delay", "fixed")


def _batching_params(pairs: list[str] | None) -> dict:
    """`key=value` pairs; values are read as JSON where they parse (numbers, lists), else kept as text."""
    import json

    params: dict = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise _fail(f"--batching-param must be key=value, got {pair!r}")
        try:
            params[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip()] = raw
    return params


@app.command()
def simulate(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON (fleet, variants, profiles, SLOs)"),
    trace_path: Path = typer.Option(..., "--trace", help="Trace CSV: time_s,application[,deadline_ms]"),
    planner: str = typer.Option("proteus", "--planner", help="|".join(SIMULATE_PLANNERS)),
    batching: str = typer.Option("proteus", "--batching", help="|".join(SIMULATE_BATCHING)),
    batching_param: list[str] = typer.Option(None, "--batching-param", help="Policy parameter key=value (repeatable), e.g. size=4"),
    routing: str = typer.Option("weights", "--routing", help="weights (plan weights, alias tables) | matching (Garrison)"),
    queue_order: str = typer.Option("fifo", "--queue-order", help="fifo | edf"),
    drop_rule: str = typer.Option("deadline", "--drop-rule", help="never | deadline | slo-1x | slo-2x"),
    noise: float = typer.Option(0.05, "--noise", help="Log-normal sigma of the service-time noise (mean-preserving)"),
    replan_every: float = typer.Option(30.0, "--replan-every", help="Re-planning interval in seconds (0: never)"),
    burst_factor: float = typer.Option(1.5, "--burst-factor", help="Re-plan when an application's 1 s demand exceeds the plan's by this factor (0: off)"),
    reconfig_delay: float = typer.Option(5.0, "--reconfig-delay", help="Seconds a newly created instance serves nothing"),
    initial_demand: str = typer.Option("trace", "--initial-demand", help="trace (first interval of the trace) | problem"),
    headroom: float = typer.Option(1.0, "--headroom", help="Plan for observed demand times this (e.g. 1.25 keeps instances off 100% load)"),
    seed: int = typer.Option(1, "--seed"),
    out: Path = typer.Option(None, "--out", help="Write summary.json, per_second.csv and plots.png here"),
) -> None:
    """Replay a trace on a planned fleet (discrete-event simulation, closed loop with the planner) and print
    the summary: SLO violations, effective accuracy, latency. Exit 0, or 2 for malformed input."""
    if planner not in SIMULATE_PLANNERS:
        raise _fail(f"--planner must be one of {', '.join(SIMULATE_PLANNERS)}, got {planner!r}")
    if batching not in SIMULATE_BATCHING:
        raise _fail(f"--batching must be one of {', '.join(SIMULATE_BATCHING)}, got {batching!r}")
    from engine.simulation.simulator import SimulationConfig
    from engine.simulation.simulator import simulate as simulate_run
    from engine.simulation.workload import trace_read

    try:
        config = SimulationConfig(
            batching=batching, batching_params=_batching_params(batching_param), queue_order=queue_order, drop_rule=drop_rule,
            noise_sigma=noise, seed=seed, replan_interval_s=replan_every or None, burst_factor=burst_factor or None,
            reconfiguration_delay_s=reconfig_delay, routing=routing, initial_demand=initial_demand, demand_headroom=headroom,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    problem = _problem_read(problem_path)
    try:
        trace = trace_read(trace_path)
    except OSError as exc:
        raise _fail(f"cannot read trace {trace_path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # TraceFormatError
        raise _fail(str(exc)) from exc
    try:
        result = simulate_run(problem, trace, planner=planner, config=config)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    except RuntimeError as exc:
        raise _fail(str(exc), EXIT_INVALID) from exc
    s = result.summary

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.2%}"

    typer.echo(f"simulated    {s['queries']} queries over {s['duration_s']:.1f} s ({planner} + {batching}, routing {routing})")
    typer.echo(f"on time      {s['on_time']}   late {s['late']}   dropped {s['dropped']} "
               f"(expired {s['dropped_expired']}, no capacity {s['dropped_no_capacity']}, unfinished {s['dropped_unfinished']})")
    typer.echo(f"SLO violations {pct(s['slo_violation_ratio'])}   throughput {s['throughput_qps']:.6g} q/s")
    typer.echo(f"accuracy     {_number(s['effective_accuracy'], '.4f')} effective   max drop {_number(s['max_accuracy_drop'], '.4f')}")
    typer.echo(f"latency      p50 {_number(s['latency_p50_ms'], '.3f')} ms   p99 {_number(s['latency_p99_ms'], '.3f')} ms")
    typer.echo(f"plans        {s['plans_applied']} applied, {s['replans']} re-plans ({s['replans_interval']} on the interval, {s['replans_burst']} on a burst)")
    typer.echo(f"instances    {s['instances_created']}   mean utilisation {pct(s['mean_utilisation'])}   mean batch {_number(s['mean_batch'], '.2f')}")
    typer.echo(f"speed        {s['simulated_queries_per_wall_s']:.0f} simulated queries per wall second (planner {s['planner_wall_s']:.2f} s apart)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(result.to_json() + "\n")
        result.write_csv(out / "per_second.csv")
        try:
            result.plot(out / "plots.png")
            plotted = "plots.png"
        except ImportError:
            plotted = "no plots.png (matplotlib is not installed: pip install -e '.[bench]')"
        typer.echo(f"written      {out}/summary.json, per_second.csv, {plotted}")


# --------------------------------------------------------------------------- trace commands

trace_app = typer.Typer(help="Query-arrival traces: generate synthetic workloads, summarise trace files.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
TRACE_KINDS = ("uniform", "poisson", "gamma", "macro-bursts", "diurnal")  # = workload.KINDS


def _trace_summary_echo(trace, path: Path, verb: str) -> None:
    from engine.simulation.workload import trace_summary

    s = trace_summary(trace)
    typer.echo(f"trace        {path} ({verb})")
    typer.echo(f"queries      {s.queries}")
    typer.echo(f"duration     {s.duration_s:.6g} s (last arrival)")
    typer.echo(f"mean rate    {s.mean_rate:.6g} qps")
    typer.echo(f"peak 1 s     {s.peak_rate:.6g} qps (second {s.peak_at_s:.0f})")
    if trace.deadline_ms is not None:
        import numpy as np

        with_deadline = int(np.count_nonzero(~np.isnan(trace.deadline_ms)))
        typer.echo(f"deadlines    {with_deadline} of {s.queries} queries")
    typer.echo(f"applications {len(trace.applications)}")
    width = max((len(name) for name in trace.applications), default=0)
    for name, share in s.shares.items():
        typer.echo(f"  {name:<{width}}  {share:7.2%}  {s.counts[name]}")


@trace_app.command("generate")
def trace_generate_cmd(
    kind: str = typer.Option(..., "--kind", help="|".join(TRACE_KINDS)),
    rate: float = typer.Option(..., "--rate", help="Mean total arrival rate, queries per second"),
    duration: float = typer.Option(..., "--duration", help="Trace length in seconds"),
    out: Path = typer.Option(..., "--out", help="Write the trace CSV here"),
    shape: float = typer.Option(None, "--shape", help="gamma: shape of the inter-arrival gamma (default 0.05; CV = 1/sqrt(shape))"),
    applications: str = typer.Option("default", "--applications", help="Comma-separated application names, most popular first"),
    zipf_alpha: float = typer.Option(1.001, "--zipf-alpha", help="Zipf exponent of application popularity"),
    seed: int = typer.Option(1, "--seed"),
    independent: bool = typer.Option(False, "--independent", help="One process per application (independent bursts) instead of splitting one"),
    deadline_ms: float = typer.Option(None, "--deadline-ms", help="Give every query this deadline (adds the deadline_ms column)"),
    burst_factor: float = typer.Option(None, "--burst-factor", help="macro-bursts: high rate / low rate (default 4)"),
    period: float = typer.Option(None, "--period", help="macro-bursts: seconds per low+high period (default 60)"),
    high_fraction: float = typer.Option(None, "--high-fraction", help="macro-bursts: fraction of each period at the high rate (default 0.25)"),
    peak_to_trough: float = typer.Option(None, "--peak-to-trough", help="diurnal: peak / trough of the daily curve (default 2)"),
    spikes: int = typer.Option(None, "--spikes", help="diurnal: number of random spikes (default 3)"),
    day: float = typer.Option(None, "--day", help="diurnal: seconds of trace per compressed day (default 1440)"),
) -> None:
    """Generate a seeded synthetic trace, write it as CSV and print a summary. Exit 2 for bad input."""
    from engine.simulation.workload import trace_for_applications, trace_write

    if kind not in TRACE_KINDS:
        raise _fail(f"--kind must be one of {', '.join(TRACE_KINDS)}, got {kind!r}")
    for option, value in (("--rate", rate), ("--duration", duration)):
        if not value > 0 or value == float("inf"):
            raise _fail(f"{option} must be a positive number, got {value:g}")
    given = {
        "--shape": ("gamma", "shape", shape),
        "--burst-factor": ("macro-bursts", "burst_factor", burst_factor),
        "--period": ("macro-bursts", "period_s", period),
        "--high-fraction": ("macro-bursts", "high_fraction", high_fraction),
        "--peak-to-trough": ("diurnal", "peak_to_trough", peak_to_trough),
        "--spikes": ("diurnal", "spikes", spikes),
        "--day": ("diurnal", "day_s", day),
    }
    params = {}
    for option, (for_kind, name, value) in given.items():
        if value is None:
            continue
        if for_kind != kind:
            raise _fail(f"{option} applies to --kind {for_kind} only")
        params[name] = value
    names = [name.strip() for name in applications.split(",")]
    if not all(names):
        raise _fail(f"--applications must be comma-separated non-empty names, got {applications!r}")
    try:
        trace = trace_for_applications(
            kind, names, rate, duration, seed, zipf_alpha=zipf_alpha, independent=independent, deadline_ms=deadline_ms, **params
        )
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    try:
        trace_write(trace, out)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror or exc}") from exc
    _trace_summary_echo(trace, out, "written")


@trace_app.command("show")
def trace_show_cmd(path: Path = typer.Argument(..., help="Trace CSV: time_s,application[,deadline_ms]")) -> None:
    """Summarise a trace file: queries, mean and peak 1 s rate, per-application shares. Exit 2 when the file is missing or malformed (the message names the line)."""
    from engine.simulation.workload import trace_read

    try:
        trace = trace_read(path)
    except ValueError as exc:  # TraceFormatError, including unreadable files
        raise _fail(str(exc)) from exc
    _trace_summary_echo(trace, path, "read")


if __name__ == "__main__":
    app()
