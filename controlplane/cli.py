"""`tessera`: the command line. Subcommands that need the database set Django up themselves; the engine's
subcommands (mig, plan, simulate) run without Django."""
from __future__ import annotations

import os
import sys
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
PLANNERS = ("proteus", "joint", "garrison")


def _django_setup(settings: str = "controlplane.settings.local") -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


@app.command()
def demo(
    host: str = typer.Option("127.0.0.1", help="Address to serve on"),
    port: int = typer.Option(8000, help="Port to serve on"),
    serve: bool = typer.Option(True, help="Run the control plane after seeding"),
    admin_password: str = typer.Option(None, envvar="TESSERA_ADMIN_PASSWORD", help="Admin password (random if unset)"),
) -> None:
    """Migrate, seed the demo fleet and run the control plane on embedded defaults."""
    _django_setup()
    from django.conf import settings
    from django.core.management import call_command

    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    result = demo_seed(admin_password=admin_password)
    database = settings.DATABASES["default"]
    typer.echo(f"Database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
    typer.echo("Demo fleet: " + ("seeded" if result.created else "already present, kept"))
    typer.echo(f"Control plane: http://{host}:{port}/   admin: http://{host}:{port}/admin/   API: http://{host}:{port}/api/v1/docs/")
    for user, password in result.logins.items():
        typer.echo(f"  login {user:<9} password {password}")
    if serve:
        call_command("runserver", f"{host}:{port}", use_reloader=False)


@app.command()
def serve(
    bind: str = typer.Option("0.0.0.0", help="Address to bind"),
    port: int = typer.Option(8000),
) -> None:
    """Run the control plane with Daphne (HTTP and WebSocket) under the current settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(["-b", bind, "-p", str(port), "--proxy-headers", "controlplane.asgi:application"])


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


# --------------------------------------------------------------------------- engine commands
# The engine is imported inside each command: `tessera --help` stays fast and never loads the solvers.


def _fail(message: str, code: int = EXIT_MALFORMED) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _gpu_model(name: str):
    from apps.planning.engine.mig import mig_catalogue_load

    catalogue = mig_catalogue_load()
    model = catalogue.gpu_model_find(name)
    if model is None:
        raise _fail(f"unknown GPU model {name!r} (MIG catalogue: {', '.join(catalogue.gpu_model_names)})")
    return model


def _layout(placements: list[str]):
    from apps.planning.engine.mig import layout_parse

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
    from apps.planning.engine.mig import mig_layout_validate

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

    from apps.planning.engine.mig import mig_layouts_enumerate

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
    from apps.planning.engine.mig import InvalidLayout, mig_parted_export

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
    from apps.planning.engine.mig import MigPartedError, UnknownMigProfile, mig_counts_to_layout, mig_parted_import

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
    from apps.planning.engine.problem import ProblemError, problem_from_dict
    from apps.planning.engine.schemas import json_validate, problem_schema

    raw = _json_read(path, "problem")
    try:
        json_validate(raw, problem_schema(), what=f"problem {path}")
        return problem_from_dict(raw)
    except ProblemError as exc:  # SchemaError is a ProblemError
        raise _fail(str(exc) if str(exc).startswith("problem ") else f"problem {path}: {exc}") from exc


def _plan_read(path: Path):
    from apps.planning.engine.problem import ProblemError, plan_from_dict
    from apps.planning.engine.schemas import json_validate, plan_schema

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
    solver: str = typer.Option("proteus", "--solver", help="proteus | joint | garrison"),
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

    from apps.planning.engine.problem import OBJECTIVES, SOLVERS

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

    from apps.planning.engine.solve import SolverUnavailable, plan_solve
    from apps.planning.engine.validate import plan_validate

    try:
        plan = plan_solve(problem, solver, objective=objective, time_limit_s=time_limit, mip_gap=gap, backend=backend)
    except (ValueError, SolverUnavailable) as exc:  # ProblemError is a ValueError
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
    from apps.planning.engine.validate import plan_validate

    problem = _problem_read(problem_path)
    plan = _plan_read(plan_path)
    verdict = plan_validate(problem, plan)
    _verdict_echo(verdict)
    if not verdict.valid:
        raise typer.Exit(EXIT_INVALID)


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())
