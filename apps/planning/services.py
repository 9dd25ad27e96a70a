"""Plan runs: from observed demand and the fleet as it is to a validated plan, with the simulator's
prediction, what applying it would write (each host's desired state, each application's routing table) and
the diff against what runs now.

`plan_run_start` creates the planning job (one at a time in the fleet) and queues `planning.plan_run`;
`plan_run_execute` is that job's work, step by step (each with progress and a log line on the job):

a. demand: `apps.planning.demand.demand_for_planning()` (or the run's own `demand` option, a what-if);
b. snapshot: `snapshot.fleet_problem_build` for the demand times the headroom factor;
c. solve with the configured planner; the plan is stored at once as a DRAFT, so a retried job finds it
   (by its job) and never solves twice;
d. `plan_validate`, the engine's independent validator;
e. prediction: the engine's simulator replays a Poisson trace at the observed demand against the plan;
f. translation into each planned host's desired state and each application's routes, every desired state
   checked by the deployments service (dry run) so a plan that applying would refuse fails now;
g. diff against the active plan (per host, else the host's latest desired state) and the routing tables;
h. VALIDATED (or FAILED with the problems), with the shortfall and notes; auto-apply when the re-planning
   policy says so.

Options (job params "options", defaults in PLAN_RUN_DEFAULTS): solver, objective, time_limit_s, mip_gap,
reconfiguration_penalty, headroom, include_registered, demand ({application: rps}, a what-if instead of
the observed demand), prediction_s, seed."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections import defaultdict
from typing import Any, Mapping

import numpy as np
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.core.context import change_context
from apps.deployments.models import HostDesiredState, RoutingTable
from apps.deployments.services import host_desired_state_validate
from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, Host
from apps.jobs.choices import JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import JobConflict, job_checkpoint_set, job_create, job_enqueue, job_progress
from apps.policies.models import ReplanPolicy, SloPolicy
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import mig_layout_diff
from engine.geometry.names import instance_id
from engine.plans.problem import (
    FULL_SLICE,
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
from engine.solvers.solve import PLANNERS, plan_solve

from .choices import PlanStatusChoices, PlanTriggerChoices
from .models import Plan
from .snapshot import fleet_problem_build

__all__ = [
    "PLAN_RUN_DEFAULTS",
    "PLAN_RUN_JOB_KEY",
    "JobConflict",
    "plan_run_execute",
    "plan_run_options_clean",
    "plan_run_start",
]

log = logging.getLogger("tessera.planning")

PLAN_RUN_JOB_KEY = "planning:fleet"
PLAN_RUN_DEFAULTS: dict[str, Any] = {
    "solver": "proteus",
    "objective": "max-accuracy",
    "time_limit_s": 30.0,
    "mip_gap": None,  # the engine's (0: proven optimal within the time limit)
    # Per MIG instance destroyed or created, in effective-accuracy units (the joint planner reshapes GPUs for
    # negligible gains without one; proteus keeps layouts anyway).
    "reconfiguration_penalty": 0.001,
    "headroom": 1.25,  # plan for the observed demand times this
    "include_registered": False,  # plan hosts whose agent never reported, as declared
    "demand": None,  # {application: rps}: plan for this instead of the observed demand (what-if)
    "prediction_s": 30.0,  # simulated seconds of the prediction
    "seed": 0,
}
TIME_LIMIT_MAX_S = 600.0
HEADROOM_MAX = 10.0
PREDICTION_MAX_S = 120.0
# The prediction is kept short: at most this many simulated queries (the trace is shortened to fit).
PREDICTION_MAX_QUERIES = 100_000
# Weight changes below this (share of an application's traffic) are not listed in the diff.
WEIGHT_EPSILON = 1e-4


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
    if cleaned["solver"] not in PLANNERS:
        raise ValidationError({"solver": f"{cleaned['solver']!r} is not one of {', '.join(PLANNERS)}."})
    if cleaned["objective"] not in OBJECTIVES:
        raise ValidationError({"objective": f"{cleaned['objective']!r} is not one of {', '.join(OBJECTIVES)}."})
    cleaned["time_limit_s"] = _number(cleaned, "time_limit_s", minimum=0, maximum=TIME_LIMIT_MAX_S, strict=True)
    if cleaned["mip_gap"] is not None:
        cleaned["mip_gap"] = _number(cleaned, "mip_gap", minimum=0, maximum=1)
    cleaned["reconfiguration_penalty"] = _number(cleaned, "reconfiguration_penalty", minimum=0, maximum=1)
    cleaned["headroom"] = _number(cleaned, "headroom", minimum=1, maximum=HEADROOM_MAX)
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
    plans for the same demand."""
    if "demand" in job.checkpoint:
        return job.checkpoint["demand"]
    if options["demand"] is not None:
        observed = {"rps": dict(options["demand"]), "method": "given", "details": {"note": "the run's own demand (a what-if)"}}
    else:
        raw = _demand_observe() or {}
        rps = raw.get("rps") or {}
        observed = {
            "rps": {str(k): float(v) for k, v in rps.items() if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0},
            "method": str(raw.get("method", "")),
            "details": _jsonable({k: v for k, v in raw.items() if k not in ("rps", "method")}),
        }
    job_checkpoint_set(job_id=job.pk, name="demand", value=observed)
    return observed


def _log(job: Job, progress: int, line: str) -> None:
    job_progress(job_id=job.pk, progress=progress, log_line=line)


def _actor(job: Job):
    return job.actor if job.actor_id else None


def _active_plan(exclude: Plan | None = None) -> Plan | None:
    qs = Plan.objects.filter(status=PlanStatusChoices.ACTIVE)
    if exclude is not None:
        qs = qs.exclude(pk=exclude.pk)
    return qs.first()


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
        reconfiguration_penalty=options["reconfiguration_penalty"],
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
        devices=snapshot.devices, previous=_active_plan(), solver=options["solver"], objective_kind=options["objective"],
    )
    nothing = None
    if snapshot.problem is None:
        nothing = snapshot.notes[-1] if snapshot.notes else "nothing to plan"
    elif not any(a.demand_rps > 0 for a in snapshot.problem.applications):
        nothing = ("nothing to plan: no planned application has any demand"
                   + (" (the routers reported none); give the run a `demand` to plan for one" if options["demand"] is None else ""))
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
    desired_states, routing, translate_problems = _translate(problem, engine_plan, plan.devices, variant_ids)
    problems += translate_problems
    timings["translate"] = time.perf_counter() - started
    _log(job, 85, f"translated: desired states for {len(desired_states)} hosts, routing for {len(routing)} applications"
                  + (f"; {len(translate_problems)} refused by the desired-state check" if translate_problems else ""))

    started = time.perf_counter()
    diff = _diff(plan=plan, desired_states=desired_states, routing=routing)
    timings["diff"] = time.perf_counter() - started
    _log(job, 92, "diff against " + diff["against"]["description"] + ": " + _summary_text(diff["summary"]))

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
        locked.save()
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


def _prediction(problem: Problem, engine_plan: EnginePlan, observed: dict[str, float], *, seconds: float, seed: int) -> dict[str, Any]:
    """Replay a Poisson trace at the observed demand (not the headroom) against the plan, with the SLO
    policies' drop rules and the proteus batching policy the desired states use; the plan is fixed (no
    re-planning)."""
    rates = {name: rps for name, rps in observed.items() if rps > 0}
    if not rates:
        return {"skipped": "no observed demand to replay", "demand_rps": observed}
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
    rules = dict(SloPolicy.objects.filter(application__name__in=[a.name for a in problem.applications]).values_list("application__name", "drop_rule"))
    replay = dataclasses.replace(problem, applications=tuple(dataclasses.replace(a, demand_rps=observed.get(a.name, 0.0)) for a in problem.applications))

    def planned(_problem: Problem) -> EnginePlan:
        return engine_plan

    config = SimulationConfig(batching="proteus", drop_rule=rules or "deadline", seed=seed, replan_interval_s=None, burst_factor=None,
                              initial_demand="problem")
    summary = simulate(replay, trace, planner=planned, config=config).summary
    return {
        "trace": "poisson", "seed": seed, "duration_s": round(duration, 3), "demand_rps": observed,
        "queries": summary["queries"], "on_time": summary["on_time"], "late": summary["late"], "dropped": summary["dropped"],
        "slo_violation_ratio": summary["slo_violation_ratio"], "effective_accuracy": summary["effective_accuracy"],
        "latency_p50_ms": summary["latency_p50_ms"], "latency_p99_ms": summary["latency_p99_ms"],
        "applications": {
            name: {k: app[k] for k in ("queries", "on_time", "late", "dropped", "slo_violation_ratio", "effective_accuracy", "latency_p99_ms")}
            for name, app in summary["applications"].items()
        },
        "wall_s": summary["wall_s"],
    }


# --------------------------------------------------------------------------- translation


def _runtime_key(device: Mapping[str, Any], slice_name: str, start: int | None) -> str:
    if device["kind"] == AcceleratorKindChoices.CPU:
        return f"cpu{device['index']}/0"  # the engine runs one instance per CPU
    if start is not None:
        return f"gpu{device['index']}/{slice_name}@{start}"
    return f"gpu{device['index']}"


def _current_gpu(accelerator: Accelerator) -> dict[str, Any]:
    layout = [gi.placement for gi in sorted(accelerator.gpu_instances.all(), key=lambda g: g.placement_start)] if accelerator.mig_enabled else []
    return {"index": accelerator.index, "mig_enabled": bool(accelerator.mig_enabled), "layout": layout}


def _translate(problem: Problem, engine_plan: EnginePlan, devices: Mapping[str, Mapping[str, Any]],
               variant_ids: Mapping[str, int]) -> tuple[dict[str, dict], dict[str, list], list[str]]:
    """({host name: desired-state spec (POST form)}, {application: routes}, problems). Every planned host
    gets a spec, an empty runtime list where the plan runs nothing on it."""
    problems: list[str] = []
    host_ids = sorted({d["host"] for d in devices.values()})
    hosts = {h.pk: h for h in Host.objects.filter(pk__in=host_ids)}
    accelerators = {
        (a.host_id, a.kind, a.index): a
        for a in Accelerator.objects.filter(host_id__in=host_ids).prefetch_related("gpu_instances")
    }
    specs: dict[str, dict[str, Any]] = {}
    for name, info in sorted(devices.items()):
        host = hosts.get(info["host"])
        if host is None:
            problems.append(f"{name}: its host no longer exists")
            continue
        specs.setdefault(host.name, {"gpus": [], "runtimes": []})
    instances_by_device: dict[str, list] = defaultdict(list)
    for inst in engine_plan.instances:
        instances_by_device[inst.device].append(inst)
    engine_instances: dict[str, tuple[str, str, int, float]] = {}  # engine id -> (host, key, variant id, rps)
    for name, info in sorted(devices.items(), key=lambda kv: (kv[1]["host_name"], kv[1]["kind"], kv[1]["index"])):
        host = hosts.get(info["host"])
        if host is None:
            continue
        spec = specs[host.name]
        device = problem.device(name) if name in {d.name for d in problem.devices} else None
        if info["kind"] == AcceleratorKindChoices.GPU:
            accelerator = accelerators.get((host.pk, "gpu", info["index"]))
            if accelerator is None:
                problems.append(f"{name}: the GPU is no longer in the inventory")
                continue
            if device is not None and device.mig:
                if name in engine_plan.layouts:
                    layout = list(engine_plan.layouts[name])
                    whole = any(i.slice == FULL_SLICE for i in instances_by_device.get(name, []))
                    gpu = {"index": info["index"], "mig_enabled": (not whole) and (bool(layout) or accelerator.mig_enabled),
                           "layout": [] if whole else layout}
                else:
                    gpu = _current_gpu(accelerator)  # idle and left as it is
            else:
                gpu = {"index": info["index"], "mig_enabled": False, "layout": []}
            spec["gpus"].append(gpu)
        for inst in sorted(instances_by_device.get(name, []), key=lambda i: (i.start if i.start is not None else -1, i.slice)):
            variant_id = variant_ids.get(inst.variant)
            if variant_id is None:
                problems.append(f"{inst.id}: variant {inst.variant} is no longer in the registry")
                continue
            key = _runtime_key(info, inst.slice, inst.start)
            cpu = info["kind"] == AcceleratorKindChoices.CPU
            spec["runtimes"].append({
                "key": key, "device": f"{info['kind']}{info['index']}",
                "placement": f"{inst.slice}@{inst.start}" if inst.start is not None else None,
                "cpu_threads": int(inst.slice) if cpu else None,
                "application": problem.variant(inst.variant).application, "variant": variant_id, "max_batch": int(inst.batch),
                "batching": {"policy": "proteus"},
            })
            engine_instances[inst.id] = (host.name, key, variant_id, float(inst.assigned_rps))
    for host_name, spec in specs.items():
        spec["gpus"].sort(key=lambda g: g["index"])
        spec["runtimes"].sort(key=lambda r: r["key"])
    routing: dict[str, list[dict[str, Any]]] = {}
    for application in problem.applications:
        routes = []
        for entry in engine_plan.routing.get(application.name, []):
            target = engine_instances.get(entry.instance)
            if target is None or target[3] <= 0:
                continue
            host_name, key, variant_id, rps = target
            routes.append({"instance": instance_id(host_name, key), "variant": variant_id, "weight": rps})
        routing[application.name] = routes
    # What applying would write must pass the same checks applying makes (dry run, nothing stored).
    by_name = {h.name: h for h in hosts.values()}
    for host_name, spec in sorted(specs.items()):
        try:
            host_desired_state_validate(host=by_name[host_name], spec=spec)
        except ValidationError as exc:
            problems += [f"desired state of {host_name}: {message}" for message in exc.messages]
    return specs, routing, problems


# --------------------------------------------------------------------------- diff


def _variant_of(runtime: Mapping[str, Any]) -> int | None:
    variant = runtime.get("variant")
    if isinstance(variant, Mapping):
        variant = variant.get("id")
    return variant if isinstance(variant, int) and not isinstance(variant, bool) else None


def _runtime_summary(runtime: Mapping[str, Any]) -> dict[str, Any]:
    return {"key": runtime.get("key"), "application": runtime.get("application"), "variant": _variant_of(runtime),
            "max_batch": runtime.get("max_batch")}


def _layout_diff(model_name: str, before: dict, after: dict) -> dict[str, Any]:
    spec = mig_catalogue_load().gpu_model_find(model_name)
    out: dict[str, Any] = {"mig_enabled": {"before": before["mig_enabled"], "after": after["mig_enabled"]},
                           "keep": [], "destroy": [], "create": []}
    old = list(before["layout"]) if before["mig_enabled"] else []
    new = list(after["layout"]) if after["mig_enabled"] else []
    if spec is None:
        return out
    try:
        diff = mig_layout_diff(spec, old, new)
    except ValueError as exc:  # a stored layout the catalogue refuses: say so rather than fail the diff
        out["error"] = str(exc)
        return out
    out.update(keep=[str(p) for p in diff.keep], destroy=[str(p) for p in diff.destroy], create=[str(p) for p in diff.create])
    return out


def _routes_by_instance(routes: list[Mapping[str, Any]]) -> dict[str, tuple[int | None, float]]:
    total = sum(max(0.0, float(r.get("weight") or 0.0)) for r in routes)
    return {
        str(r["instance"]): (r.get("variant"), (max(0.0, float(r.get("weight") or 0.0)) / total) if total > 0 else 0.0)
        for r in routes if r.get("instance")
    }


def _diff(*, plan: Plan, desired_states: dict[str, dict], routing: dict[str, list]) -> dict[str, Any]:
    """What applying the plan changes, against the active plan where it covers a host or an application,
    else against the host's latest desired state and the active routing tables."""
    active = _active_plan(exclude=plan)
    hosts = {h.name: h for h in Host.objects.filter(name__in=desired_states)}
    latest: dict[int, dict] = {}
    for state in HostDesiredState.objects.filter(host__in=hosts.values()).order_by("host_id", "-version"):
        latest.setdefault(state.host_id, state.spec)
    accelerators = {(a.host_id, a.index): a for a in Accelerator.objects.filter(host__in=hosts.values(), kind="gpu").prefetch_related("gpu_instances")}
    summary = defaultdict(int)
    host_diffs: dict[str, Any] = {}
    for host_name, after_spec in sorted(desired_states.items()):
        host = hosts.get(host_name)
        if host is None:
            continue
        if active is not None and host_name in active.desired_states:
            before_spec, baseline = active.desired_states[host_name], f"plan {active.pk}"
        elif host.pk in latest:
            before_spec, baseline = latest[host.pk], f"desired state v{latest[host.pk].get('version')}"
        else:
            before_spec, baseline = {"gpus": [], "runtimes": []}, "nothing (no desired state yet)"
        before_gpus = {g["index"]: g for g in before_spec.get("gpus", [])}
        gpus: dict[str, Any] = {}
        for gpu in after_spec.get("gpus", []):
            accelerator = accelerators.get((host.pk, gpu["index"]))
            if accelerator is None:
                continue
            before = before_gpus.get(gpu["index"]) or _current_gpu(accelerator)
            change = _layout_diff(accelerator.model_name, before, gpu)
            summary["mig_created"] += len(change["create"])
            summary["mig_destroyed"] += len(change["destroy"])
            summary["mig_mode_changes"] += int(change["mig_enabled"]["before"] != change["mig_enabled"]["after"])
            if change["create"] or change["destroy"] or change["mig_enabled"]["before"] != change["mig_enabled"]["after"]:
                gpus[f"gpu{gpu['index']}"] = change
        old = {r["key"]: _runtime_summary(r) for r in before_spec.get("runtimes", []) if r.get("key")}
        new = {r["key"]: _runtime_summary(r) for r in after_spec.get("runtimes", [])}
        added = [new[k] for k in sorted(set(new) - set(old))]
        removed = [old[k] for k in sorted(set(old) - set(new))]
        changed = [
            {"key": k, "before": old[k], "after": new[k]}
            for k in sorted(set(old) & set(new))
            if (old[k]["variant"], old[k]["max_batch"], old[k]["application"]) != (new[k]["variant"], new[k]["max_batch"], new[k]["application"])
        ]
        kept = len(set(old) & set(new)) - len(changed)
        summary["runtimes_added"] += len(added)
        summary["runtimes_removed"] += len(removed)
        summary["runtimes_changed"] += len(changed)
        summary["runtimes_kept"] += kept
        host_changed = bool(gpus or added or removed or changed)
        summary["hosts_changed"] += int(host_changed)
        host_diffs[host_name] = {"baseline": baseline, "changed": host_changed, "gpus": gpus,
                                 "runtimes": {"added": added, "removed": removed, "changed": changed, "kept": kept}}

    if active is not None:
        routing_before = {name: list(routes) for name, routes in active.routing.items()}
    else:
        routing_before = {}
    tables = {t.application.name: t.routes for t in RoutingTable.objects.filter(active=True).select_related("application")}
    routing_diffs: dict[str, Any] = {}
    for application in sorted(set(routing) | set(routing_before) | set(tables)):
        if application not in routing:
            continue  # not in this plan: its table is not part of the diff
        before_routes = routing_before[application] if application in routing_before else tables.get(application, [])
        old = _routes_by_instance(before_routes)
        new = _routes_by_instance(routing[application])
        added = [{"instance": i, "variant": new[i][0], "weight": round(new[i][1], 6)} for i in sorted(set(new) - set(old))]
        removed = [{"instance": i, "variant": old[i][0], "weight": round(old[i][1], 6)} for i in sorted(set(old) - set(new))]
        reweighted = []
        for i in sorted(set(old) & set(new)):
            delta = new[i][1] - old[i][1]
            if abs(delta) > WEIGHT_EPSILON or old[i][0] != new[i][0]:
                reweighted.append({"instance": i, "variant_before": old[i][0], "variant_after": new[i][0],
                                   "weight_before": round(old[i][1], 6), "weight_after": round(new[i][1], 6), "delta": round(delta, 6)})
        summary["routes_added"] += len(added)
        summary["routes_removed"] += len(removed)
        summary["routes_reweighted"] += len(reweighted)
        changed = bool(added or removed or reweighted)
        summary["applications_rerouted"] += int(changed)
        routing_diffs[application] = {"changed": changed, "added": added, "removed": removed, "reweighted": reweighted}
    summary = {k: summary.get(k, 0) for k in (
        "hosts_changed", "mig_created", "mig_destroyed", "mig_mode_changes", "runtimes_added", "runtimes_removed",
        "runtimes_changed", "runtimes_kept", "applications_rerouted", "routes_added", "routes_removed", "routes_reweighted",
    )}
    summary["changes"] = sum(summary[k] for k in ("mig_created", "mig_destroyed", "mig_mode_changes", "runtimes_added", "runtimes_removed",
                                                   "runtimes_changed", "routes_added", "routes_removed", "routes_reweighted"))
    against = {"plan": active.pk if active is not None else None,
               "description": f"active plan {active.pk}" if active is not None else "the hosts' latest desired states and the active routing tables"}
    return {"against": against, "summary": summary, "hosts": host_diffs, "routing": routing_diffs}


def _summary_text(summary: Mapping[str, int]) -> str:
    if not summary.get("changes"):
        return "no change"
    parts = [f"{summary[k]} {label}" for k, label in (
        ("mig_destroyed", "MIG instances destroyed"), ("mig_created", "MIG instances created"),
        ("mig_mode_changes", "MIG mode changes"), ("runtimes_added", "runtimes added"), ("runtimes_removed", "runtimes removed"),
        ("runtimes_changed", "runtimes changed"), ("applications_rerouted", "applications rerouted"),
    ) if summary.get(k)]
    return ", ".join(parts)


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
