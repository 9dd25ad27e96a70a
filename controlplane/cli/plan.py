"""`tessera plan`: solve a planning problem, validate a plan, export a stored plan for other servers."""
from __future__ import annotations

from pathlib import Path

import typer

from engine.solvers.registry import DEFAULT_PLANNER, PLANNERS, planner_names

from ._common import EXIT_INVALID, django_setup, fail, number, plan_read, problem_read

plan_app = typer.Typer(help="Placement plans: solve a planning problem, validate a plan, export a stored plan.", no_args_is_help=True)

# `plan solve`: a valid plan that leaves demand unserved (a shortfall, or nothing served at all) is no success.
EXIT_SHORTFALL = 3


def _verdict_echo(verdict) -> None:
    typer.echo(f"verdict      {'valid' if verdict.valid else 'INVALID'}" + (f" ({len(verdict.warnings)} warning(s))" if verdict.warnings else ""))
    for error in verdict.errors:
        typer.echo(f"  error: {error}")
    for warning in verdict.warnings:
        typer.echo(f"  warning: {warning}")


# Pipeline plans are simulated before they are shown (engine/simulation/pipeline.py): this long, Poisson
# arrivals at each path's demand, the placed replicas on their profiled latencies.
PIPELINE_SIMULATION_S = 60.0


def _pipeline_simulation(problem, plan, name: str):
    from engine.simulation.pipeline import fleet_pipeline_simulate, PipelineSimulationConfig

    try:
        return fleet_pipeline_simulate(problem, plan, name, PipelineSimulationConfig(duration_s=PIPELINE_SIMULATION_S))
    except ValueError:
        return None  # nothing placed: the summary's status and notes say why


def _plan_summary_echo(problem, plan) -> None:
    demand = problem.total_demand_rps
    shortfall = sum(plan.shortfall_rps.values())
    gap = "-" if plan.gap is None else f"{plan.gap:.2%}"
    typer.echo(f"status       {plan.status}{', SHORT of demand' if shortfall else ''} ({plan.solver}, {plan.objective_kind})")
    typer.echo(f"objective    {number(plan.objective)}   bound {number(plan.bound)}   gap {gap}")
    typer.echo(f"solve time   {plan.solve_seconds:.2f} s")
    typer.echo(f"accuracy     {number(plan.effective_accuracy, '.4f')} effective")
    typer.echo(f"served       {plan.total_served_rps:.6g} / {demand:.6g} rps" + (f"   shortfall {shortfall:.6g} rps" if shortfall else ""))
    typer.echo(f"GPUs used    {plan.gpus_used} of {sum(1 for d in problem.devices if not d.is_cpu)}   instances {len(plan.instances)}")
    for name, summary in plan.pipelines.items():
        typer.echo(f"pipeline     {name}: {summary['status']} ({summary['solver']}), {summary['cores']} cores"
                   + (f", PAS {summary['pas']:.4f}" if summary.get("pas") is not None else ""))
        for stage, s in summary["stages"].items():
            typer.echo(f"  stage {stage}: {s['variant']} x{s['replicas_placed']}/{s['replicas']} on {s['cores_per_replica']} core(s), "
                       f"batch {s['batch']}, {s['latency_ms']:.4g} + {s['queueing_ms']:.4g} ms queueing")
        simulated = _pipeline_simulation(problem, plan, name)
        for path, q in summary["paths"].items():
            latency = "-" if q["latency_ms"] is None else f"{q['latency_ms']:.4g}"
            outcome = simulated.paths.get(path) if simulated is not None else None
            seen = (f"; simulated {PIPELINE_SIMULATION_S:g} s: {outcome.violation_ratio:.2%} violations, p99 {number(outcome.p99_ms, '.4g')} ms"
                    if outcome is not None else "")
            typer.echo(f"  path {path}: {latency} ms of SLO {q['slo_ms']:g} ms at {q['demand_rps']:g} rps ({' -> '.join(q['stages'])}){seen}")
    for inst in plan.instances:
        if inst.vertical is not None:
            v = inst.vertical
            typer.echo(f"vertical     {inst.id} ({inst.variant}): {inst.slice} core(s) at batch {inst.batch}, resized in place by {v.policy} "
                       f"within {v.min_cores}..{v.max_cores} cores, batch up to {v.max_batch}"
                       + (f", {v.reserve_ms:.4g} ms kept for later stages" if v.reserve_ms else ""))
    for note in plan.notes:
        typer.echo(f"  note: {note}")


@plan_app.command("solve")
def plan_solve_cmd(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON (see docs/planning.md)"),
    solver: str = typer.Option(DEFAULT_PLANNER, "--solver", help=" | ".join(planner_names()) + " (tessera plan solvers lists them)"),
    objective: str = typer.Option(None, "--objective", help="max-accuracy | min-gpus (default: the problem's options)"),
    time_limit: float = typer.Option(None, "--time-limit", help="Solver time limit in seconds (default: the problem's options)"),
    gap: float = typer.Option(None, "--gap", help="Relative MIP gap to stop at, e.g. 0.01"),
    backend: str = typer.Option(None, "--backend", help="MIP backend: highs | cbc"),
    threads: int = typer.Option(None, "--threads", help="Solver threads (CBC searches in parallel; HiGHS's MIP search is serial)"),
    headroom_target: float = typer.Option(
        None, "--headroom-target",
        help="fleet: keep up to this multiple of every demand servable before spending capacity on accuracy, 1-10 (default: the problem's options)"),
    out: Path = typer.Option(None, "--out", help="Write the plan JSON here"),
) -> None:
    """Solve a planning problem, print a summary, write the plan and check it with the independent validator.
    Exit 0 when the plan is valid and serves every application's demand, 1 when it fails validation, 2 for
    malformed input, 3 when the plan is valid but leaves demand unserved (its shortfall, printed)."""
    import json

    from engine.plans.problem import HEADROOM_MAX, OBJECTIVES, SOLVERS

    if solver not in PLANNERS:
        raise fail(f"--solver must be one of {', '.join(planner_names())}, got {solver!r}")
    if objective is not None and objective not in OBJECTIVES:
        raise fail(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if backend is not None and backend not in SOLVERS:
        raise fail(f"--backend must be one of {', '.join(SOLVERS)}, got {backend!r}")
    if time_limit is not None and not time_limit > 0:
        raise fail(f"--time-limit must be positive, got {time_limit:g}")
    if gap is not None and not 0 <= gap <= 1:
        raise fail(f"--gap must be between 0 and 1, got {gap:g}")
    if threads is not None and threads < 1:
        raise fail(f"--threads must be at least 1, got {threads}")
    if headroom_target is not None and not 1 <= headroom_target <= HEADROOM_MAX:
        raise fail(f"--headroom-target must be between 1 and {HEADROOM_MAX:g}, got {headroom_target:g}")
    problem = problem_read(problem_path)
    changed = {k: v for k, v in (("threads", threads), ("headroom_target", headroom_target)) if v is not None}
    if changed:
        import dataclasses

        problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, **changed))

    from engine.plans.validate import plan_validate
    from engine.solvers.solve import plan_solve

    try:
        plan = plan_solve(problem, solver, objective=objective, time_limit_s=time_limit, mip_gap=gap, backend=backend)
    except ValueError as exc:  # ProblemError is a ValueError
        raise fail(str(exc)) from exc
    _plan_summary_echo(problem, plan)
    if out is not None:
        out.write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
        typer.echo(f"plan         written to {out}")
    verdict = plan_validate(problem, plan)
    _verdict_echo(verdict)
    if not verdict.valid:
        raise typer.Exit(EXIT_INVALID)
    short = {name: rps for name, rps in plan.shortfall_rps.items() if rps > 0}
    if short:
        typer.echo(f"SHORTFALL    {sum(short.values()):.6g} of {problem.total_demand_rps:.6g} rps unserved: "
                   + ", ".join(f"{name} {rps:.6g}" for name, rps in short.items()))
        raise typer.Exit(EXIT_SHORTFALL)


@plan_app.command("solvers")
def plan_solvers_cmd() -> None:
    """List every planner `plan solve --solver` takes: its kind, what it does and the paper it follows."""
    for info in PLANNERS.values():
        typer.echo(f"{info.name:<16} {info.kind:<9} {info.summary} [{info.paper}]")


@plan_app.command("validate")
def plan_validate_cmd(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON"),
    plan_path: Path = typer.Option(..., "--plan", help="Plan JSON, as `tessera plan solve --out` writes it"),
) -> None:
    """Check a plan against its problem without trusting any solver: exit 0 valid, 1 invalid (errors listed), 2 malformed input."""
    from engine.plans.validate import plan_validate

    problem = problem_read(problem_path)
    plan = plan_read(plan_path)
    verdict = plan_validate(problem, plan)
    _verdict_echo(verdict)
    if not verdict.valid:
        raise typer.Exit(EXIT_INVALID)


# What `plan export --format` writes: Triton model repositories (apps/planning/export.py).
EXPORT_FORMATS = ("triton-repository",)


@plan_app.command("export")
def plan_export_cmd(
    plan_id: int = typer.Argument(..., help="Id of a stored plan (GET /api/v1/plans/)"),
    export_format: str = typer.Option(..., "--format", help="triton-repository: one Triton model repository per MIG instance, whole GPU, MPS partition or CPU allotment"),
    out: Path = typer.Option(..., "--out", help="Folder to create (it must not exist, or be empty)"),
) -> None:
    """Export a stored plan for serving by other means; exit 0 when written, 2 when it cannot be (nothing is written).

    --format triton-repository: a Triton model repository per instance (config.pbtxt and the ONNX file),
    a launch.sh per host and index.json (docs/deploy.md)."""
    if export_format not in EXPORT_FORMATS:
        raise fail(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {export_format!r}")
    django_setup()
    from apps.planning.export import plan_triton_repository_export
    from apps.planning.models import Plan
    from engine.dataplane.triton import TritonExportError

    plan = Plan.objects.filter(pk=plan_id).first()
    if plan is None:
        raise fail(f"no plan {plan_id}")
    try:
        export = plan_triton_repository_export(plan=plan, out=out)
    except TritonExportError as exc:
        raise fail(str(exc)) from exc
    models = sum(len(server["models"]) for server in export.servers)
    typer.echo(f"plan {plan.pk} ({plan.status}): {len(export.servers)} Triton server(s), {models} model(s), written to {out}")
    for server in export.servers:
        names = ", ".join(m["name"] for m in server["models"])
        wait = f"   (set ${server['pending_device_variable']} first)" if server["pending_device_variable"] else ""
        typer.echo(f"  {server['host']:<16} {server['server']:<20} port {server['ports']['http']}: {names}{wait}")
