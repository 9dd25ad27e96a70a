"""Planning a fleet's pipelines: FA2 or IPA per pipeline, replicas placed on CPU hosts, the rest of the
applications planned by Proteus (or the planner named) on what is left.

A problem's `pipelines` (engine/plans/problem.py, `PipelineSpec`) are DAGs of stages, each an application
of the registry with its own variants and profiles. `plan_solve(problem, "fa2" | "ipa" | "biscale")` plans each
pipeline as a whole (`pipeline_part_solve`, a part of the plan engine/solvers/compose.py composes):

- `fa2` (thesis P1 §p1.4): per stage one variant (pinned, else the most accurate with CPU profiles: FA2
  scales, it does not trade accuracy), one homogeneous instance size (the variant's smallest profiled core
  count, one core when profiled, as FA2 scales one-core instances), and the batch and replicas that
  minimise instances with every path within its SLO: problem P1.3 solved exactly with HiGHS
  (engine/pipelines/exact.py), or by FA2's dynamic programme (engine/pipelines/fa2.py) with
  `method="dp"`, or when the exact solve finds nothing in its time limit.
- `ipa` (thesis P3 §p3.4, linear pipelines): per stage the variant, batch and replicas maximising
  alpha * PAS - beta * cores - delta * batches (engine/pipelines/ipa.py) with each variant's base allocation
  R_m found as P3.1 defines it (`ipa_base_allocation`).
- `biscale` (thesis P4 §p4.4): `fa2` with FA2's dynamic programme, which over one-core replicas is
  Biscale's horizontal Algorithm 4, and every replica given its in-place vertical scaling
  (`VerticalScaling`: P4.1 fitted to the variant's CPU profiles, the room its host leaves, and the later
  stages' planned time kept out of its budgets, `reserve_ms`), which the agents' fast loop uses
  (engine/solvers/vertical.py, workers/agent/vertical.py).

Each stage's latency model (`stage_latency_bound`) is the thesis's quadratic fitted to its CPU profile at
the instance's core count, raised until it is nowhere below the profile, and it carries the profile itself:
FA2's dynamic programme plans with the paper's raised quadratic (valid, not always the fewest instances),
while the exact programme (P1.3) and IPA read the profiled latency, interpolated between profiled batches
as the validator reads it, so an `optimal` plan is optimal on the validator's model. Replicas are sized for
`options.pipeline_headroom` times each stage's rate (default 1.25: benches/pipelines.py measured 2.3-21.7 %
violations in simulation for plans sized for the exact rate, at most 0.45 % with 1.25x), while queueing
delay (b - 1) / lambda is the real rate's, the longer wait.

Placement: a replica needs its cores on one CPU host, and a host runs several replicas side by side as
long as their cores add up to at most its own (`replicas_place`: largest replicas first, each on the
first host with room among those running one of the pipeline's stages now, then the largest hosts, each
filled before the next is opened). Replicas that do not fit are reported: the stage's capacity falls short and so does
the traffic it serves. Every other application is planned by `proteus` (or, when `plan_solve` was asked for
another planner on a problem with pipelines, that one) on the devices no pipeline replica uses and the cores
the replicas leave free on the hosts they use (compose.py).

Departures, stated: pipelines run on CPU hosts only (GPU shares for pipeline stages are not planned
here); the base allocation's latency condition P3.1c is checked at batch 1 against the stage's share of
the SLO (split by the stages' batch-1 latencies), since at the largest batch of 64 CPU variants rarely
meet any per-stage SLA; the thesis's own SLA_s (5x the mean batch-1 latency, after Swayam) is a
benchmark setting, not an operator's SLO."""
from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from engine.pipelines.problem import (
    ExecutionPath,
    PipelineProblem,
    PipelineProblemError,
    PipelineStage,
    StageLatency,
    queueing_delay_ms,
    stage_latency_bound,
)
from engine.plans.capacity import InstanceCapacity, profile_interpolate
from engine.plans.problem import CPU_DEVICE_TYPE, DeviceSpec, PlanInstance, PipelineSpec, Problem, ProfilePoint
from engine.solvers.assemble import PartPlan
from engine.solvers.budget import budget_share
from engine.solvers.hosts import CpuHostUse, replicas_place
from engine.solvers.registry import PLANNERS
from engine.solvers.vertical import vertical_bounds_attach, vertical_model_from_profiles

__all__ = ["PIPELINE_SOLVERS", "PipelineOutcome", "StagePick", "ipa_base_allocation", "pipeline_fa2_at", "pipeline_part_solve",
           "pipeline_summary", "replica_capacity"]

# The pipeline planners as the registry names them: fa2, ipa, and biscale (a vertical planner that plans pipelines).
PIPELINE_SOLVERS: tuple[str, ...] = tuple(dict.fromkeys(p.pipelines_by for p in PLANNERS.values()))


@dataclass(frozen=True)
class StagePick:
    """What a pipeline planner chose for one stage: every replica runs `variant` on `cores` cores at `batch`."""

    application: str
    variant: str
    cores: int
    batch: int
    replicas: int
    model: StageLatency  # the d(b) the solver planned with


@dataclass
class PipelineOutcome:
    pipeline: PipelineSpec
    solver: str
    status: str
    picks: list[StagePick]
    objective: float | None
    runtime_s: float
    notes: list[str]
    pas: float | None = None


# --------------------------------------------------------------------------- profiles


def _cpu_points(problem: Problem, variant: str, cores: int) -> tuple[ProfilePoint, ...]:
    return problem.profiles_for(variant, CPU_DEVICE_TYPE, str(cores))


def _cpu_core_counts(problem: Problem, variant: str, host_cores: int) -> list[int]:
    """The core counts the variant has CPU profiles for, at most the largest host's cores, ascending."""
    counts = {int(p.slice) for p in problem.profiles if p.variant == variant and p.device_type == CPU_DEVICE_TYPE and p.slice.isdigit()}
    return sorted(c for c in counts if 1 <= c <= host_cores)


def _stage_model(problem: Problem, variant: str, cores: int, max_batch: int) -> tuple[StageLatency, int]:
    """The stage's latency model at `cores` (the bounded quadratic with its profile) and the largest batch
    the plan may use (no extrapolation past the profiled batches)."""
    points = _cpu_points(problem, variant, cores)
    model = stage_latency_bound([(p.batch, p.latency_ms) for p in points])
    return model, max(1, min(max_batch, points[-1].batch))


def _batch1_ms(problem: Problem, variant: str, cores: int) -> float:
    points = _cpu_points(problem, variant, cores)
    value = profile_interpolate(points, 1, "latency_ms")
    return float(value if value is not None else points[0].latency_ms / points[0].batch)


def ipa_base_allocation(problem: Problem, variant: str, *, host_cores: int, threshold_rps: float, stage_sla_ms: float) -> int | None:
    """R_m of thesis P3.1: the fewest cores (among the profiled core counts) at which one replica of the
    variant reaches `threshold_rps` (P3.1b, at its largest profiled batch) and answers within the stage's
    SLA (P3.1c, here at batch 1, see the module docstring). When no core count meets both, the count with
    the highest throughput that still meets the SLA; None when none meets the SLA at all."""
    meeting_sla = []
    for cores in _cpu_core_counts(problem, variant, host_cores):
        points = _cpu_points(problem, variant, cores)
        if _batch1_ms(problem, variant, cores) > stage_sla_ms:
            continue
        throughput = max(1000.0 * p.batch / p.latency_ms for p in points)
        if throughput >= threshold_rps:
            return cores
        meeting_sla.append((throughput, -cores, cores))
    return max(meeting_sla)[2] if meeting_sla else None


# --------------------------------------------------------------------------- per pipeline


def _fa2_solve(problem: Problem, spec: PipelineSpec, host_cores: int, *, method: str, time_limit_s: float) -> PipelineOutcome:
    from engine.pipelines.exact import pipeline_milp_solve
    from engine.pipelines.fa2 import fa2_solve

    started = time.perf_counter()
    chosen: dict[str, tuple[str, int]] = {}
    stages = []
    for st in spec.stages:
        candidates = [v for v in problem.variants_of(st.application) if st.variant in (None, v.name)]
        candidates = [v for v in candidates if _cpu_core_counts(problem, v.name, host_cores)]
        if not candidates:
            return PipelineOutcome(spec, "fa2", "infeasible", [], None, time.perf_counter() - started,
                                   [f"stage {st.application}: no variant{' ' + st.variant if st.variant else ''} has a CPU profile "
                                    f"at up to {host_cores} cores"])
        variant = max(candidates, key=lambda v: (v.accuracy, v.name))
        cores = _cpu_core_counts(problem, variant.name, host_cores)[0]
        model, max_batch = _stage_model(problem, variant.name, cores, st.max_batch)
        chosen[st.application] = (variant.name, cores)
        stages.append(PipelineStage(st.application, model, max_batch))
    paths = tuple(ExecutionPath(q.name, q.stages, q.slo_ms, q.demand_rps) for q in spec.paths)
    engine_problem = PipelineProblem(tuple(stages), paths, headroom=problem.options.pipeline_headroom)
    notes: list[str] = []
    if method == "exact":
        plan = pipeline_milp_solve(engine_problem, time_limit_s=time_limit_s, options=problem.options)
        if plan.status == "no-solution":
            notes.append(f"the exact programme found no plan in {time_limit_s:g} s; FA2's dynamic programme planned instead")
            plan = fa2_solve(engine_problem)
    else:
        plan = fa2_solve(engine_problem)
    notes.extend(plan.notes)
    picks = [
        StagePick(name, chosen[name][0], chosen[name][1], d.batch, d.instances, engine_problem.by_name[name].latency)
        for name, d in plan.decisions.items()
    ]
    return PipelineOutcome(spec, "fa2" if method == "dp" else "fa2 (exact P1.3)", plan.status, picks, plan.objective,
                           time.perf_counter() - started, notes)


def _ipa_solve(problem: Problem, spec: PipelineSpec, host_cores: int, *, time_limit_s: float) -> PipelineOutcome:
    from engine.pipelines.ipa import IpaPipeline, IpaStage, IpaVariant, ipa_solve

    started = time.perf_counter()

    def refused(reason: str) -> PipelineOutcome:
        return PipelineOutcome(spec, "ipa", "infeasible", [], None, time.perf_counter() - started, [reason])

    if not spec.is_chain:
        return refused("IPA plans linear pipelines (one path through every stage); use the fa2 solver for a DAG")
    path = spec.paths[0]
    if path.demand_rps <= 0:
        return refused(f"path {path.name}: no demand to plan for")
    # The stages' share of the SLO, by their batch-1 latency at the smallest profiled core count.
    weight: dict[str, float] = {}
    for st in spec.stages:
        times = [_batch1_ms(problem, v.name, counts[0]) for v in problem.variants_of(st.application)
                 if st.variant in (None, v.name) and (counts := _cpu_core_counts(problem, v.name, host_cores))]
        if not times:
            return refused(f"stage {st.application}: no variant{' ' + st.variant if st.variant else ''} has a CPU profile at up to {host_cores} cores")
        weight[st.application] = sum(times) / len(times)
    total = sum(weight.values())
    built = []
    models: dict[tuple[str, str], tuple[int, StageLatency]] = {}
    for st in spec.stages:
        sla = path.slo_ms * weight[st.application] / total
        variants = []
        for v in problem.variants_of(st.application):
            if st.variant not in (None, v.name) or not _cpu_core_counts(problem, v.name, host_cores):
                continue
            floor = problem.application(st.application).min_accuracy
            if floor is not None and v.accuracy < floor:
                continue  # the stage's SLO policy asks for at least this accuracy
            cores = ipa_base_allocation(problem, v.name, host_cores=host_cores, threshold_rps=spec.ipa_threshold_rps, stage_sla_ms=sla)
            if cores is None:
                continue
            model, max_batch = _stage_model(problem, v.name, cores, st.max_batch)
            models[(st.application, v.name)] = (cores, model)
            variants.append((IpaVariant(v.name, v.accuracy, cores, model), max_batch))
        if not variants:
            floor = problem.application(st.application).min_accuracy
            return refused(f"stage {st.application}: no variant{f' of accuracy >= {floor:g}' if floor is not None else ''} answers a "
                           f"single query within its share of the SLO ({sla:.4g} ms)")
        max_batch = min(mb for _, mb in variants)
        built.append(IpaStage(st.application, tuple(v for v, _ in variants), max_batch))
    try:
        pipeline = IpaPipeline(spec.name, tuple(built), path.slo_ms, path.demand_rps, alpha=spec.alpha, beta=spec.beta, delta=spec.delta,
                               headroom=problem.options.pipeline_headroom)
    except PipelineProblemError as exc:
        return refused(str(exc))
    plan = ipa_solve(pipeline, time_limit_s=time_limit_s, options=problem.options)
    picks = [StagePick(c.stage, c.variant, models[(c.stage, c.variant)][0], c.batch, c.replicas, models[(c.stage, c.variant)][1])
             for c in plan.choices]
    return PipelineOutcome(spec, "ipa", plan.status, picks, plan.objective, time.perf_counter() - started, list(plan.notes), pas=plan.pas)


def pipeline_fa2_at(problem: Problem, spec: PipelineSpec, fraction: float, *, host_cores: int, time_limit_s: float) -> PipelineOutcome:
    """FA2's plan (P1.3, exact) for `fraction` of every path's demand: the replicas the pipeline needs to
    carry that much with its headroom, each stage's batch waiting for that rate. The fleet model's options
    for a pipeline (engine/solvers/fleet.py) are these at a ladder of fractions."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    scaled = dataclasses.replace(spec, paths=tuple(dataclasses.replace(q, demand_rps=q.demand_rps * fraction) for q in spec.paths))
    outcome = _fa2_solve(problem, scaled, host_cores, method="exact", time_limit_s=time_limit_s)
    outcome.pipeline = spec
    return outcome


def replica_capacity(problem: Problem, pick: StagePick) -> InstanceCapacity:
    """One replica of a stage as the plan runs it: its profiled latency at the chosen batch (rounded as the
    plan writes it) and the rate that gives."""
    latency = round(float(profile_interpolate(_cpu_points(problem, pick.variant, pick.cores), pick.batch, "latency_ms")), 6)
    return InstanceCapacity(batch=pick.batch, latency_ms=latency, capacity_rps=pick.batch * 1000.0 / latency,
                            memory_mb=problem.variant(pick.variant).memory_mb)


def pipeline_summary(problem: Problem, outcome: PipelineOutcome, placed: list[PlanInstance]) -> dict[str, Any]:
    """The plan's summary of a pipeline run as `outcome` planned it on the instances `placed` (its stages')."""
    return _outcome_summary(problem, outcome, placed)


# --------------------------------------------------------------------------- the part of a fleet


def pipeline_part_solve(problem: Problem, hosts: CpuHostUse, *, solver: str, method: str = "exact") -> PartPlan:
    """Plan every pipeline of `problem` with `solver` (fa2 | ipa | biscale) and place its replicas on the CPU
    hosts' free cores (`hosts`, updated), within `options.time_limit_s` for all the pipelines together (see the
    module docstring). The other applications are the composition's (engine/solvers/compose.py)."""
    if solver not in PIPELINE_SOLVERS:
        raise ValueError(f"unknown pipeline solver {solver!r}; choose one of: {', '.join(PIPELINE_SOLVERS)}")
    if method not in ("exact", "dp"):
        raise ValueError(f"method must be 'exact' or 'dp', got {method!r}")
    deadline = time.perf_counter() + problem.options.time_limit_s
    cpu_hosts = [d for d in problem.devices if d.is_cpu]
    host_cores = max((hosts.free_cores(h) for h in cpu_hosts), default=0)
    instances: list[PlanInstance] = []
    summaries: dict[str, Any] = {}
    statuses: list[str] = []
    notes: list[str] = []
    for n, spec in enumerate(problem.pipelines):
        # One budget: each pipeline gets an equal share of what is left.
        limit = budget_share(deadline, len(problem.pipelines) - n)
        if not cpu_hosts or host_cores <= 0:
            outcome = PipelineOutcome(spec, solver, "infeasible", [], None, 0.0, ["the fleet has no free CPU host; pipelines are planned on CPU hosts"])
        elif solver == "fa2":
            outcome = _fa2_solve(problem, spec, host_cores, method=method, time_limit_s=limit)
        elif solver == "biscale":
            # Biscale's horizontal plan is Algorithm 4, FA2's DP over one-core instances (thesis §p4.4.4.2);
            # the vertical part is the agents' fast loop, bounded below (`_biscale_scaling`).
            outcome = _fa2_solve(problem, spec, host_cores, method="dp", time_limit_s=limit)
            outcome.solver = "biscale (Algorithm 4)"
        else:
            outcome = _ipa_solve(problem, spec, host_cores, time_limit_s=limit)
        placed_instances, outcome_notes = _outcome_place(problem, outcome, cpu_hosts, hosts)
        instances.extend(placed_instances)
        outcome.notes.extend(outcome_notes)
        statuses.append(outcome.status)
        summaries[spec.name] = _outcome_summary(problem, outcome, placed_instances)
        notes.extend(f"pipeline {spec.name}: {n}" for n in outcome.notes)
    staged = {st.application for p in problem.pipelines for st in p.stages}

    def biscale_finish(held: Mapping[str, int]) -> list[PlanInstance]:
        # The replicas' room to grow is what no planned instance holds, once every part is planned.
        return _biscale_scaling(problem, instances, summaries, dict(held), notes)

    return PartPlan(solver=solver, instances=instances, taken=staged, statuses=statuses, notes=notes, pipelines=summaries,
                    finish=biscale_finish if solver == "biscale" else None)


def _biscale_scaling(problem: Problem, instances: list[PlanInstance], summaries: dict[str, Any], used: dict[str, int],
                     notes: list[str]) -> list[PlanInstance]:
    """Every pipeline replica with its in-place vertical scaling (P4.1 fitted to its variant's CPU
    profiles), keeping for the later stages of its tightest path their planned time (`reserve_ms`), and
    each pipeline's summary with the models."""
    scaling: dict[str, Any] = {}
    for spec in problem.pipelines:
        summary = summaries.get(spec.name) or {}
        stages = summary.get("stages") or {}
        for app, stage in stages.items():
            model = vertical_model_from_profiles(problem, stage["variant"])
            if model is None:
                notes.append(f"pipeline {spec.name}: stage {app}: {stage['variant']} has CPU profiles at fewer than two core counts; "
                             "its replicas keep their size (no vertical scaling)")
                continue
            reserve = float(max((sum(stages[s]["budget_ms"] for s in q.stages[q.stages.index(app) + 1:] if s in stages)
                                 for q in spec.paths if app in q.stages), default=0.0))
            scaling[app] = ("biscale", model, reserve, 16)
            stage["vertical"] = {"gamma1": model.gamma1, "eps1": model.eps1, "delta1": model.delta1, "eta1": model.eta1, "reserve_ms": reserve}
    return vertical_bounds_attach(problem, instances, scaling, used)


def _outcome_place(problem: Problem, outcome: PipelineOutcome, hosts: list[DeviceSpec], use: CpuHostUse) -> tuple[list[PlanInstance], list[str]]:
    """The outcome's replicas as plan instances on the hosts, each stage's rate spread over its replicas by
    capacity (capped at capacity: what does not fit is shortfall)."""
    keys: dict[str, StagePick] = {}
    wanted = []
    for pick in outcome.picks:
        for r in range(pick.replicas):
            key = f"{pick.application}#{r}"
            keys[key] = pick
            wanted.append((key, pick.cores))
    stage_apps = {pick.application for pick in outcome.picks}
    running_here = {h.name for h in hosts if any(problem.variant(v).application in stage_apps for _slot, v in h.running)}
    placed, left = replicas_place(hosts, wanted, use.used, prefer=running_here)
    notes = []
    if left:
        unplaced: dict[str, int] = defaultdict(int)
        for key in left:
            unplaced[keys[key].application] += 1
        wanted_by_app = {pick.application: pick.replicas for pick in outcome.picks}
        notes.append("not enough CPU cores: " + ", ".join(
            f"{app} placed {wanted_by_app[app] - n} of {wanted_by_app[app]} replicas" for app, n in sorted(unplaced.items())))
    by_stage: dict[str, list[PlanInstance]] = defaultdict(list)
    for host, host_keys in sorted(placed.items()):
        for key in sorted(host_keys):
            pick = keys[key]
            points = _cpu_points(problem, pick.variant, pick.cores)
            latency = float(profile_interpolate(points, pick.batch, "latency_ms"))
            start = use.number(host)
            by_stage[pick.application].append(PlanInstance(
                device=host, slice=str(pick.cores), start=start, variant=pick.variant, batch=pick.batch,
                latency_ms=round(latency, 6), capacity_rps=pick.batch * 1000.0 / round(latency, 6), assigned_rps=0.0,
            ))
    out: list[PlanInstance] = []
    for app, stage_instances in by_stage.items():
        rate = outcome.pipeline.stage_rate(app)
        capacity = sum(i.capacity_rps for i in stage_instances)
        for inst in stage_instances:
            share = rate * inst.capacity_rps / capacity if capacity > 0 else 0.0
            out.append(dataclasses.replace(inst, assigned_rps=min(share, inst.capacity_rps)))
    return out, notes


def _outcome_summary(problem: Problem, outcome: PipelineOutcome, placed: list[PlanInstance]) -> dict[str, Any]:
    """What the dashboard and the validator read: per stage its choice and time, per path its predicted
    end-to-end latency (profiled batch latency + (b - 1) / lambda per stage) against its SLO."""
    spec = outcome.pipeline
    stages: dict[str, Any] = {}
    time_at: dict[str, float] = {}
    for pick in outcome.picks:
        rate = spec.stage_rate(pick.application)
        points = _cpu_points(problem, pick.variant, pick.cores)
        latency = float(profile_interpolate(points, pick.batch, "latency_ms"))
        queueing = queueing_delay_ms(pick.batch, rate)
        time_at[pick.application] = latency + queueing
        mine = [i for i in placed if problem.variant(i.variant).application == pick.application]
        stages[pick.application] = {
            "variant": pick.variant, "cores_per_replica": pick.cores, "batch": pick.batch, "replicas": pick.replicas,
            "replicas_placed": len(mine), "rate_rps": rate, "capacity_rps": sum(i.capacity_rps for i in mine),
            "latency_ms": latency, "queueing_ms": queueing, "budget_ms": latency + queueing,
            "model": {"alpha": pick.model.alpha, "beta": pick.model.beta, "gamma": pick.model.gamma},
        }
    paths = {}
    for q in spec.paths:
        total = sum(time_at.get(s, math.nan) for s in q.stages) if outcome.picks else None
        paths[q.name] = {"stages": list(q.stages), "slo_ms": q.slo_ms, "demand_rps": q.demand_rps,
                         "latency_ms": None if total is None or not math.isfinite(total) else total}
    summary: dict[str, Any] = {
        "solver": outcome.solver, "status": outcome.status, "objective": outcome.objective, "runtime_s": outcome.runtime_s,
        "cores": sum(s["cores_per_replica"] * s["replicas_placed"] for s in stages.values()),
        "stages": stages, "paths": paths, "notes": list(outcome.notes),
    }
    if outcome.pas is not None:
        summary["pas"] = outcome.pas
    return summary
