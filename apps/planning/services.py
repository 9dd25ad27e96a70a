"""Plan runs: from observed demand and the fleet as it is to a validated plan, with the simulator's
prediction, what applying it would write (each host's desired state, each application's routing table:
`translate.plan_translate`) and the diff against what runs now (`diff.plan_diff`).

`plan_run_start` creates the planning job (one at a time in the fleet) and queues `planning.plan_run`;
`plan_run_execute` is that job's work, step by step (each with progress and a log line on the job):

a. demand: `apps.planning.demand.demand_for_planning()`, with the run's own `demand` option (a what-if) in place
   of the estimate of the applications it names;
b. snapshot: `snapshot.fleet_problem_build` for the demand times the headroom factor;
c. solve with the configured planner; the plan is stored at once as a DRAFT, so a retried job finds it
   (by its job) and never solves twice;
d. `plan_validate`, the engine's independent validator;
e. prediction: the engine's simulator replays a Poisson trace at the observed demand against the plan;
f. translation (`plan_translate`) into each planned host's desired state and each application's routes,
   every desired state checked by the deployments service (dry run) so a plan that applying would refuse
   fails now; the routes are the engine's `routing_tables_from_plan`, the tables the prediction simulated;
g. diff (`plan_diff`) against the active plan (per host, else the host's latest desired state) and the
   routing tables;
h. VALIDATED (or FAILED with the problems), with the shortfall and notes; auto-apply when the re-planning
   policy says so.

Options (job params "options", defaults in PLAN_RUN_DEFAULTS): solver, objective, time_limit_s, mip_gap,
reconfiguration_penalty, headroom, headroom_target, include_registered, demand ({application: rps}, a what-if in place of
the estimate of the applications it names), prediction_s, seed."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from typing import Any, Mapping

import numpy as np
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.core.context import change_context
from apps.jobs.choices import JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import JobConflict, job_checkpoint_set, job_create, job_enqueue, job_progress
from apps.policies.models import ReplanPolicy, SloPolicy
from apps.registry.selectors import application_batching_overrides
from engine.dataplane.batching import DEFAULT_BATCHING_POLICY
from engine.dataplane.rounds import ROUND_BATCHING_POLICY
from engine.plans.problem import (
    OBJECTIVES,
    Problem,
    SolveOptions,
    plan_from_dict,
    problem_from_dict,
    problem_to_dict,
)
from engine.plans.problem import (
    Plan as EnginePlan,
)
from engine.plans.validate import plan_validate
from engine.simulation.simulator import SimulationConfig, simulate
from engine.simulation.workload import arrivals_poisson
from engine.simulation.pipeline import PipelineSimulationConfig, fleet_pipeline_simulate
from engine.solvers.registry import DEFAULT_PLANNER, planner_names
from engine.solvers.solve import plan_solve

from .choices import PlanStatusChoices, PlanTriggerChoices
from .demand import replan_policy_current
from .diff import plan_diff, plan_diff_summary_text
from .models import Plan
from .selectors import plan_active_get
from .snapshot import fleet_problem_build
from .translate import plan_translate

__all__ = [
    "PLAN_RUN_DEFAULTS",
    "PLAN_RUN_JOB_KEY",
    "PLAN_RUN_SOLVERS",
    "JobConflict",
    "plan_run_execute",
    "plan_run_options_clean",
    "plan_run_start",
    "prediction_simulation_config",
]

log = logging.getLogger("tessera.planning")

PLAN_RUN_JOB_KEY = "planning:fleet"
PLAN_RUN_DEFAULTS: dict[str, Any] = {
    "solver": DEFAULT_PLANNER,  # the fleet model (engine/solvers/registry.py)
    "objective": "max-accuracy",
    "time_limit_s": 30.0,
    "mip_gap": None,  # the engine's (0: proven optimal within the time limit)
    # Per MIG instance destroyed or created, in effective-accuracy units (the joint planner reshapes GPUs for
    # negligible gains without one; proteus keeps layouts anyway).
    "reconfiguration_penalty": 0.001,
    "headroom": 1.25,  # plan for the observed demand times this
    # The fleet planner: when the most accurate plan could serve less than this multiple of the planned
    # demand, plan for accuracy at the largest multiple up to this (engine SolveOptions.headroom_target).
    # None: the governing re-planning policy's (1 without one).
    "headroom_target": None,
    "include_registered": False,  # plan hosts whose agent never reported, as declared
    "demand": None,  # {application: rps}: plan these applications for this instead of their estimate (what-if)
    "prediction_s": 30.0,  # simulated seconds of the prediction
    "seed": 0,
}
# The planners a run may use (engine/solvers/registry.py): every kind but Proteus's evaluation baselines,
# which exist to be compared against in simulation, not to run a fleet.
PLAN_RUN_KINDS: tuple[str, ...] = ("fleet", "mps", "pipeline", "vertical")
PLAN_RUN_SOLVERS: tuple[str, ...] = planner_names(*PLAN_RUN_KINDS)
TIME_LIMIT_MAX_S = 600.0
HEADROOM_MAX = 10.0
PREDICTION_MAX_S = 120.0
# The prediction is kept short: at most this many simulated queries (the trace is shortened to fit).
PREDICTION_MAX_QUERIES = 100_000


# --------------------------------------------------------------------------- starting a run


def _number(options: Mapping[str, Any], name: str, *, minimum: float, maximum: float, strict: bool = False) -> float:
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationError({name: f"Expected a number, got {value!r}."})
    if value < minimum or (strict and value == minimum) or value > maximum:
        low = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ValidationError({name: f"Must be {low} and <= {maximum:g}, got {value:g}."})
    return float(value)


def plan_run_options_clean(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's options with defaults filled in; ValidationError naming the option otherwise."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(PLAN_RUN_DEFAULTS))
    if unknown:
        raise ValidationError({"options": f"Unknown options {', '.join(unknown)} (known: {', '.join(PLAN_RUN_DEFAULTS)})."})
    cleaned = {**PLAN_RUN_DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    if not isinstance(cleaned["solver"], str) or cleaned["solver"] not in PLAN_RUN_SOLVERS:
        raise ValidationError({"solver": f"{cleaned['solver']!r} is not one of {', '.join(PLAN_RUN_SOLVERS)}."})
    if cleaned["objective"] not in OBJECTIVES:
        raise ValidationError({"objective": f"{cleaned['objective']!r} is not one of {', '.join(OBJECTIVES)}."})
    cleaned["time_limit_s"] = _number(cleaned, "time_limit_s", minimum=0, maximum=TIME_LIMIT_MAX_S, strict=True)
    if cleaned["mip_gap"] is not None:
        cleaned["mip_gap"] = _number(cleaned, "mip_gap", minimum=0, maximum=1)
    cleaned["reconfiguration_penalty"] = _number(cleaned, "reconfiguration_penalty", minimum=0, maximum=1)
    cleaned["headroom"] = _number(cleaned, "headroom", minimum=1, maximum=HEADROOM_MAX)
    if cleaned["headroom_target"] is None:
        policy = replan_policy_current()
        cleaned["headroom_target"] = policy.headroom_target if policy is not None else SolveOptions.headroom_target
    cleaned["headroom_target"] = _number(cleaned, "headroom_target", minimum=1, maximum=HEADROOM_MAX)
    cleaned["prediction_s"] = _number(cleaned, "prediction_s", minimum=0, maximum=PREDICTION_MAX_S, strict=True)
    if not isinstance(cleaned["include_registered"], bool):
        raise ValidationError({"include_registered": "Expected true or false."})
    if isinstance(cleaned["seed"], bool) or not isinstance(cleaned["seed"], int) or cleaned["seed"] < 0:
        raise ValidationError({"seed": "Expected an integer >= 0."})
    demand = cleaned["demand"]
    if demand is not None:
        if not isinstance(demand, Mapping) or not all(isinstance(k, str) and k for k in demand):
            raise ValidationError({"demand": "Expected an object {application name: rps}."})
        for name, rps in demand.items():
            if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not math.isfinite(rps) or rps < 0:
                raise ValidationError({"demand": f"{name}: expected a number of queries per second >= 0, got {rps!r}."})
        cleaned["demand"] = {k: float(v) for k, v in demand.items()}
    return cleaned


def plan_run_start(*, trigger: str, trigger_detail: str = "", actor: Any = None, options: dict | None = None) -> Job:
    """Create the planning job and queue `planning.plan_run` once this transaction commits. Raises
    JobConflict (carrying the active job) when a plan run is already pending or running: one at a time."""
    from .tasks import plan_run_task

    if trigger not in PlanTriggerChoices.values:
        raise ValidationError({"trigger": f"{trigger!r} is not one of {', '.join(PlanTriggerChoices.values)}."})
    cleaned = plan_run_options_clean(options)
    is_user = getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None)
    with transaction.atomic():
        job = job_create(
            kind=JobKindChoices.PLANNING, actor=actor, actor_name="" if is_user else f"trigger:{trigger}",
            params={"trigger": trigger, "trigger_detail": trigger_detail[:500], "options": cleaned}, key=PLAN_RUN_JOB_KEY,
        )
        job_enqueue(job=job, task=plan_run_task)
    return job


# --------------------------------------------------------------------------- the run


def _demand_observe() -> dict[str, Any]:
    """The demand estimate the planner uses (apps/planning/demand.py)."""
    from .demand import demand_for_planning

    return demand_for_planning()


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _demand_step(job: Job, options: dict[str, Any]) -> dict[str, Any]:
    """{"rps": {application: rps}, "method": str, "details": {...}}, remembered on the job so that a retry
    plans for the same demand. A run's what-if `demand` replaces the estimate of the applications it names
    only; every other application keeps its own (apps/planning/demand.py)."""
    if "demand" in job.checkpoint:
        return job.checkpoint["demand"]
    raw = _demand_observe() or {}
    rps = raw.get("rps") or {}
    observed = {
        "rps": {str(k): float(v) for k, v in rps.items() if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0},
        "method": str(raw.get("method", "")),
        "details": _jsonable({k: v for k, v in raw.items() if k not in ("rps", "method")}),
    }
    if options["demand"] is not None:
        given = dict(options["demand"])
        observed["rps"].update(given)
        observed["method"] = f"{observed['method']}; a what-if for {', '.join(sorted(given))}" if observed["method"] else "given"
        basis = observed["details"].setdefault("basis", {})
        if isinstance(basis, dict):
            basis.update({name: "what-if" for name in given})
        observed["details"]["what_if"] = given
    job_checkpoint_set(job_id=job.pk, name="demand", value=observed)
    return observed


def _log(job: Job, progress: int, line: str) -> None:
    job_progress(job_id=job.pk, progress=progress, log_line=line)


def _actor(job: Job):
    return job.actor if job.actor_id else None


def _fmt_rps(value: float) -> str:
    return f"{value:.4g}"


def plan_run_execute(*, job: Job) -> dict:
    """The plan run's work (see the module docstring). Idempotent: a retried job finds the plan it already
    stored and carries on from there; a finished plan is not touched again."""
    options = plan_run_options_clean(job.params.get("options"))
    timings: dict[str, float] = {}
    with change_context(source="task", principal=_actor(job)):
        plan = Plan.objects.filter(job=job).first()
        if plan is None:
            plan = _plan_solve_and_store(job=job, options=options, timings=timings)
        else:
            _log(job, 60, f"plan {plan.pk} was already stored by an earlier attempt; not solving again")
        if plan.status == PlanStatusChoices.DRAFT:
            plan = _plan_complete(job=job, plan=plan, options=options, timings=timings)
        auto = _auto_apply(job=job, plan=plan)
    plan.refresh_from_db()
    result = {
        "plan": plan.pk, "status": plan.status, "solver": plan.solver, "solver_status": plan.solver_status,
        "effective_accuracy": plan.effective_accuracy, "shortfall": plan.shortfall, "notes": plan.notes,
        "seconds": {k: round(v, 3) for k, v in timings.items()},
    }
    if auto:
        result["auto_apply"] = auto
    return result


def _plan_solve_and_store(*, job: Job, options: dict[str, Any], timings: dict[str, float]) -> Plan:
    """Steps a-c: demand, snapshot, solve; the plan is stored as a DRAFT (or, when there is nothing to plan,
    FAILED with the reason)."""
    trigger = job.params.get("trigger", PlanTriggerChoices.MANUAL)
    trigger_detail = job.params.get("trigger_detail", "")
    started = time.perf_counter()
    _log(job, 2, "estimating demand")
    observed = _demand_step(job, options)
    headroom = options["headroom"]
    planned = {name: rps * headroom for name, rps in observed["rps"].items()}
    timings["demand"] = time.perf_counter() - started
    total = sum(observed["rps"].values())
    _log(job, 10, f"demand ({observed['method'] or 'unknown method'}): {_fmt_rps(total)} rps observed over "
                  f"{len(observed['rps'])} applications; planning for x{headroom:g}")

    started = time.perf_counter()
    solve_options = SolveOptions(
        objective=options["objective"], time_limit_s=options["time_limit_s"],
        mip_gap=options["mip_gap"] if options["mip_gap"] is not None else SolveOptions.mip_gap,
        reconfiguration_penalty=options["reconfiguration_penalty"], headroom_target=options["headroom_target"],
    )
    snapshot = fleet_problem_build(demand=planned, options=solve_options, include_registered=options["include_registered"])
    timings["snapshot"] = time.perf_counter() - started
    demand_record = {
        "observed": {name: observed["rps"].get(name, 0.0) for name in snapshot.applications} | {
            k: v for k, v in observed["rps"].items() if k not in snapshot.applications
        },
        "planned": {name: info["demand_rps"] for name, info in snapshot.applications.items()},
        "headroom": headroom, "method": observed["method"], "details": observed["details"],
    }
    common = dict(
        trigger=trigger, trigger_detail=trigger_detail[:500], job=job, created_by=_actor(job), demand=demand_record,
        devices=snapshot.devices, previous=plan_active_get(), solver=options["solver"], objective_kind=options["objective"],
    )
    nothing = None
    if snapshot.problem is None:
        nothing = snapshot.notes[-1] if snapshot.notes else "nothing to plan"
    elif not any(a.demand_rps > 0 for a in snapshot.problem.applications):
        nothing = ("nothing to plan: no planned application has any demand (none observed or declared, and every one "
                   "scales to zero); declare an SLO policy's expected_rps, or give the run a `demand`, to plan for one")
    if nothing is not None:
        notes = [nothing] + [n for n in snapshot.notes if n != nothing]
        with transaction.atomic():
            plan = Plan.objects.create(
                **common, status=PlanStatusChoices.FAILED,
                problem=problem_to_dict(snapshot.problem) if snapshot.problem is not None else {},
                validation={"valid": False, "problems": [nothing], "warnings": []}, notes=notes,
            )
            job_checkpoint_set(job_id=job.pk, name="plan", value={"id": plan.pk, "variants": snapshot.variant_ids})
        _log(job, 100, f"{nothing}; plan {plan.pk} stored as failed, nothing to apply")
        return plan
    problem = snapshot.problem
    gpus = sum(1 for d in problem.devices if not d.is_cpu)
    _log(job, 15, f"snapshot: {len(snapshot.hosts)} hosts ({gpus} GPUs, {len(problem.devices) - gpus} CPUs), "
                  f"{len(problem.applications)} applications, {len(problem.variants)} variants, {len(problem.profiles)} profile points")

    started = time.perf_counter()
    _log(job, 20, f"solving with {options['solver']} ({options['objective']}, time limit {options['time_limit_s']:g} s)")
    engine_plan = plan_solve(problem, options["solver"], objective=options["objective"], time_limit_s=options["time_limit_s"],
                             mip_gap=options["mip_gap"])
    timings["solve"] = time.perf_counter() - started
    _log(job, 60, f"solved: {engine_plan.status}, {len(engine_plan.instances)} instances, "
                  f"{_fmt_rps(engine_plan.total_served_rps)} of {_fmt_rps(problem.total_demand_rps)} rps served, "
                  f"{engine_plan.solve_seconds:.2f} s")
    with transaction.atomic():
        plan = Plan.objects.create(
            **common, status=PlanStatusChoices.DRAFT, problem=problem_to_dict(problem), solver_status=engine_plan.status,
            objective=_finite_or_none(engine_plan.objective), bound=_finite_or_none(engine_plan.bound),
            gap=_finite_or_none(engine_plan.gap), solve_seconds=engine_plan.solve_seconds, result=_jsonable(engine_plan.to_dict()),
            effective_accuracy=engine_plan.effective_accuracy, notes=list(snapshot.notes),
        )
        job_checkpoint_set(job_id=job.pk, name="plan", value={"id": plan.pk, "variants": snapshot.variant_ids})
    return plan


def _finite_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _plan_complete(*, job: Job, plan: Plan, options: dict[str, Any], timings: dict[str, float]) -> Plan:
    """Steps d-h for a stored DRAFT plan."""
    problem = problem_from_dict(plan.problem)
    engine_plan = plan_from_dict(plan.result)
    variant_ids = _variant_ids(job, problem)
    notes = list(plan.notes)
    problems: list[str] = []

    started = time.perf_counter()
    verdict = plan_validate(problem, engine_plan)
    validation = {"valid": verdict.valid, "problems": list(verdict.errors), "warnings": list(verdict.warnings)}
    timings["validate"] = time.perf_counter() - started
    _log(job, 65, f"validator: {'valid' if verdict.valid else 'INVALID'} ({len(verdict.errors)} errors, {len(verdict.warnings)} warnings)")
    problems += verdict.errors
    served_total = engine_plan.total_served_rps
    if engine_plan.status == "infeasible" or served_total <= 0:
        problems.append("the plan serves nothing: " + ("; ".join(engine_plan.notes) or "no application can be served within its SLO on this fleet"))

    started = time.perf_counter()
    observed = {name: float(plan.demand.get("observed", {}).get(name, 0.0)) for name in (a.name for a in problem.applications)}
    try:
        prediction = _prediction(problem, engine_plan, observed, seconds=options["prediction_s"], seed=options["seed"])
    except Exception as exc:  # noqa: BLE001 - a prediction failure is reported on the plan, not fatal
        log.exception("plan %s: prediction failed", plan.pk)
        prediction = {"error": f"{type(exc).__name__}: {exc}"}
    timings["predict"] = time.perf_counter() - started
    if "error" in prediction:
        _log(job, 75, f"prediction failed: {prediction['error']}")
    elif prediction.get("queries"):
        _log(job, 75, f"prediction: {prediction['queries']} queries over {prediction['duration_s']:g} s, SLO violations "
                      f"{prediction['slo_violation_ratio']:.2%}, effective accuracy {_pct(prediction['effective_accuracy'])}")

    started = time.perf_counter()
    translation = plan_translate(problem=problem, engine_plan=engine_plan, devices=plan.devices, variant_ids=variant_ids)
    desired_states, routing = translation.desired_states, translation.routing
    problems += translation.problems
    timings["translate"] = time.perf_counter() - started
    _log(job, 85, f"translated: desired states for {len(desired_states)} hosts, routing for {len(routing)} applications"
                  + (f"; {len(translation.problems)} refused by the desired-state check" if translation.problems else ""))

    started = time.perf_counter()
    diff = plan_diff(plan=plan, desired_states=desired_states, routing=routing)
    timings["diff"] = time.perf_counter() - started
    _log(job, 92, "diff against " + diff["against"]["description"] + ": " + plan_diff_summary_text(summary=diff["summary"]))

    shortfall = {name: rps for name, rps in engine_plan.shortfall_rps.items() if rps > 0}
    for name, missing in sorted(shortfall.items()):
        planned = plan.demand.get("planned", {}).get(name, 0.0)
        served = engine_plan.served_rps.get(name, 0.0)
        covers = " (covers the observed demand, not the headroom)" if served >= observed.get(name, 0.0) - 1e-9 and observed.get(name, 0) > 0 else ""
        notes.append(f"cannot fully serve {name}: {_fmt_rps(served)} of {_fmt_rps(planned)} rps planned "
                     f"({_fmt_rps(observed.get(name, 0.0))} observed){covers}")
    unserved = [a.name for a in problem.applications if a.demand_rps <= 0]
    if unserved:
        notes.append(f"no demand, so no capacity, for: {', '.join(unserved)}")
    notes += [f"planner: {n}" for n in engine_plan.notes]
    if problems:
        validation["valid"] = False
        validation["problems"] = problems
    status = PlanStatusChoices.FAILED if problems else PlanStatusChoices.VALIDATED
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.status != PlanStatusChoices.DRAFT:
            return locked  # finished by a concurrent attempt
        locked.validation = validation
        locked.prediction = prediction
        locked.desired_states = desired_states
        locked.routing = routing
        locked.diff = diff
        locked.previous_id = diff["against"]["plan"]  # the active plan the diff is against (it may have changed since the solve)
        locked.shortfall = shortfall
        locked.notes = notes
        locked.status = status
        # Not the problem and result the plan was created with: unchanged, they need no second copy.
        locked.save(update_fields=["validation", "prediction", "desired_states", "routing", "diff", "previous", "shortfall", "notes",
                                   "status", "last_updated"])
    if status == PlanStatusChoices.FAILED:
        _log(job, 100, f"plan {plan.pk} failed: " + "; ".join(problems[:5]) + (" …" if len(problems) > 5 else ""))
    else:
        _log(job, 100, f"plan {plan.pk} validated" + (f"; cannot fully serve {', '.join(sorted(shortfall))}" if shortfall else ""))
    return locked


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _variant_ids(job: Job, problem: Problem) -> dict[str, int]:
    """Engine variant name -> ModelVariant id, as the snapshot had them (remembered on the job)."""
    job.refresh_from_db(fields=["checkpoint"])
    ids = (job.checkpoint.get("plan") or {}).get("variants")
    if ids:
        return {k: int(v) for k, v in ids.items()}
    # The checkpoint is written with the plan, in one transaction; this is a fallback for plans made elsewhere.
    from apps.registry.models import ModelVariant

    names = {(v.application, v.name.partition("/")[2] or v.name): v.name for v in problem.variants}
    found = {}
    for variant in ModelVariant.objects.select_related("application").filter(application__name__in={a for a, _ in names}):
        key = (variant.application.name, variant.name)
        if key in names:
            found[names[key]] = variant.pk
    return found


# --------------------------------------------------------------------------- prediction


def prediction_simulation_config(problem: Problem, *, seed: int = 0, **changes: Any) -> SimulationConfig:
    """How a plan's prediction simulates the fleet the plan makes: the SLO policies' drop rules, the
    batching the desired states give each runtime (the default policy; Nexus's rounds on MPS partitions,
    `ROUND_BATCHING_POLICY`; an application's own where it names one), the plan held fixed (no re-plan, no
    burst trigger), the problem's demand from the first second. `changes` replace fields (benches/fidelity.py
    holds a plan for a trace of its own with them)."""
    names = [a.name for a in problem.applications]
    rules = dict(SloPolicy.objects.filter(application__name__in=names).values_list("application__name", "drop_rule"))
    config = SimulationConfig(batching=DEFAULT_BATCHING_POLICY, drop_rule=rules or "deadline", seed=seed, replan_interval_s=None, burst_factor=None,
                              initial_demand="problem", mps_batching=ROUND_BATCHING_POLICY,
                              batching_by_application=application_batching_overrides(names=names))
    return dataclasses.replace(config, **changes) if changes else config


def _prediction(problem: Problem, engine_plan: EnginePlan, observed: dict[str, float], *, seconds: float, seed: int) -> dict[str, Any]:
    """Replay a Poisson trace at the observed demand (not the headroom) against the plan, with the SLO
    policies' drop rules and the batching policies the desired states use (proteus; Nexus's on MPS
    partitions, `ROUND_BATCHING_POLICY`); the plan is fixed (no
    re-planning). The simulator routes with `routing_tables_from_plan`, as the translation does: the
    prediction is for the routing tables that applying the plan publishes. Each pipeline the plan planned
    as one is simulated end to end instead (engine/simulation/pipeline.py: its paths at their demand, stage
    after stage with the placed replicas), under `pipelines`."""
    pipelines = _pipelines_prediction(problem, engine_plan, seconds=seconds, seed=seed)
    ensembles = _ensembles_prediction(problem, engine_plan, observed, seconds=seconds, seed=seed)
    staged = {st.application for p in problem.pipelines if p.name in engine_plan.pipelines for st in p.stages}
    rates = {name: rps for name, rps in observed.items() if rps > 0 and name not in staged and name not in ensembles}
    extra = {**({"pipelines": pipelines} if pipelines else {}), **({"ensembles": ensembles} if ensembles else {})}
    if not rates:
        skipped: dict[str, Any] = {"skipped": "no observed demand to replay", "demand_rps": observed}
        return {**skipped, **extra}
    total = sum(rates.values())
    duration = min(float(seconds), PREDICTION_MAX_QUERIES / total)
    streams = np.random.SeedSequence(seed).spawn(len(problem.applications))
    trace = None
    for application, stream in zip(problem.applications, streams):
        rate = rates.get(application.name)
        if not rate:
            continue
        part = arrivals_poisson(rate, duration, stream, application=application.name)
        trace = part if trace is None else trace.merge(part)
    replay = dataclasses.replace(problem, applications=tuple(dataclasses.replace(a, demand_rps=observed.get(a.name, 0.0)) for a in problem.applications))

    def planned(_problem: Problem) -> EnginePlan:
        return engine_plan

    summary = simulate(replay, trace, planner=planned, config=prediction_simulation_config(problem, seed=seed)).summary
    return {
        "trace": "poisson", "seed": seed, "duration_s": round(duration, 3), "demand_rps": observed,
        "queries": summary["queries"], "on_time": summary["on_time"], "late": summary["late"], "dropped": summary["dropped"],
        "slo_violation_ratio": summary["slo_violation_ratio"], "effective_accuracy": summary["effective_accuracy"],
        "latency_p50_ms": summary["latency_p50_ms"], "latency_p99_ms": summary["latency_p99_ms"],
        "applications": {
            name: {k: app[k] for k in ("queries", "on_time", "late", "dropped", "slo_violation_ratio", "effective_accuracy", "latency_p99_ms")}
            for name, app in summary["applications"].items() if name not in staged and name not in ensembles
        },
        "wall_s": summary["wall_s"],
        **extra,
    }


def _ensembles_prediction(problem: Problem, engine_plan: EnginePlan, observed: dict[str, float], *, seconds: float,
                          seed: int) -> dict[str, Any]:
    """Per application served by random ensembles with observed demand: the ensemble simulator
    (engine/simulation/ensembles.py: each query to the members its scheduler draws, on the plan's instances
    of them, Garrison's instance routing, latency = the slowest chosen member) at the observed rate, with the
    policy's scheduler (a learned one from the shipped policies when it loads, else the random ensemble)."""
    from engine.ensembles import POLICIES_DIR
    from engine.ensembles.policy import EnsemblePolicy as EnginePolicy
    from engine.ensembles.scheduler import RandomEnsembleScheduler, scheduler_for_policy
    from engine.simulation.ensembles import ensemble_scenario_from_plan, ensemble_simulate

    out: dict[str, Any] = {}
    for app in problem.applications:
        rate = observed.get(app.name, 0.0)
        if app.ensemble is None or app.ensemble.mode == "single" or rate <= 0:
            continue
        # The planning problem names variants "application/variant"; policies are trained on the bare names.
        bare = {m.variant: m.variant.removeprefix(f"{app.name}/") for m in app.ensemble.members}
        policy = dataclasses.replace(app.ensemble, members=tuple(dataclasses.replace(m, variant=bare[m.variant]) for m in app.ensemble.members))
        renamed = dataclasses.replace(engine_plan, instances=[dataclasses.replace(i, variant=bare.get(i.variant, i.variant)) for i in engine_plan.instances])
        view = dataclasses.replace(problem, applications=tuple(dataclasses.replace(a, ensemble=policy) if a.name == app.name else a for a in problem.applications),
                                   variants=tuple(dataclasses.replace(v, name=bare.get(v.name, v.name)) for v in problem.variants),
                                   profiles=tuple(dataclasses.replace(p, variant=bare.get(p.variant, p.variant)) for p in problem.profiles))
        scenario = ensemble_scenario_from_plan(view, renamed, app.name, rate_rps=rate, duration_s=min(float(seconds), PREDICTION_MAX_QUERIES / rate))
        if not scenario.instances:
            out[app.name] = {"skipped": "the plan runs none of its members"}
            continue
        try:
            scheduler = scheduler_for_policy(policy, scheduler_dir=POLICIES_DIR)
        except (OSError, ValueError, KeyError) as exc:
            scheduler = RandomEnsembleScheduler(EnginePolicy("random", policy.members, policy.min_size, policy.max_size, policy.vote))
            note = f"the learned policy could not be loaded ({exc}); predicted with the random ensemble"
        else:
            note = None
        run = ensemble_simulate(scenario, scheduler, seed=seed)
        summary = run.summary()
        out[app.name] = {"scheduler": summary["scheduler"], "queries": summary["queries"], "slo_violation_ratio": summary["violation_ratio"],
                         "latency_p99_ms": summary["p99_ms"] if math.isfinite(summary["p99_ms"]) else None,
                         "mean_ensemble": summary["mean_ensemble"], "mean_voted": summary["mean_voted"], "bias": summary["bias"],
                         **({"note": note} if note else {})}
    return out


def _pipelines_prediction(problem: Problem, engine_plan: EnginePlan, *, seconds: float, seed: int) -> dict[str, Any]:
    """Per pipeline of the plan with replicas placed: its paths simulated end to end (violations, p99)."""
    out: dict[str, Any] = {}
    for name in engine_plan.pipelines:
        try:
            result = fleet_pipeline_simulate(problem, engine_plan, name, PipelineSimulationConfig(duration_s=float(seconds), seed=seed))
        except ValueError as exc:  # nothing placed: the plan's pipeline summary says why
            out[name] = {"skipped": str(exc)}
            continue
        out[name] = {
            "slo_violation_ratio": result.violation_ratio,
            "paths": {path: {"queries": o.arrivals, "on_time": o.on_time, "late": o.late, "dropped": o.dropped,
                             "slo_violation_ratio": o.violation_ratio, "latency_p99_ms": o.p99_ms} for path, o in result.paths.items()},
        }
    return out


# --------------------------------------------------------------------------- auto-apply


def auto_apply_policy() -> ReplanPolicy | None:
    """The re-planning policy whose `auto_apply` decides: the one named "default", else the only enabled
    one (none when several are enabled and none is named "default")."""
    policy = ReplanPolicy.objects.filter(name="default").first()
    if policy is not None:
        return policy
    enabled = list(ReplanPolicy.objects.filter(enabled=True)[:2])
    return enabled[0] if len(enabled) == 1 else None


def _auto_apply(*, job: Job, plan: Plan) -> dict[str, Any] | None:
    """Approve and apply a validated plan when the re-planning policy (enabled) has auto_apply; once per job."""
    job.refresh_from_db(fields=["checkpoint"])
    if "auto_apply" in job.checkpoint:
        return job.checkpoint["auto_apply"]
    policy = auto_apply_policy()
    if policy is None or not (policy.enabled and policy.auto_apply) or plan.status != PlanStatusChoices.VALIDATED:
        return None
    from .rollout import plan_apply, plan_approve

    try:
        with transaction.atomic():
            approved = plan_approve(plan=plan, actor=None)
            rollout = plan_apply(plan=approved, actor=None)
        outcome = {"policy": policy.name, "rollout_job": rollout.pk}
        job_progress(job_id=job.pk, log_line=f"auto-apply ({policy.name}): plan {plan.pk} approved, rollout job {rollout.pk} started")
    except (JobConflict, ValidationError) as exc:
        message = str(exc) if isinstance(exc, JobConflict) else "; ".join(exc.messages)
        outcome = {"policy": policy.name, "skipped": message}
        job_progress(job_id=job.pk, log_line=f"auto-apply ({policy.name}) skipped: {message}")
        Plan.objects.filter(pk=plan.pk).update(notes=[*plan.notes, f"auto-apply skipped: {message}"])
    job_checkpoint_set(job_id=job.pk, name="auto_apply", value=outcome)
    return outcome
