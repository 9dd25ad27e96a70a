"""The MPS planners: a planning `Problem` solved by the schedulers of `engine/sharing/scheduling.py`
(gpulets, ATC'22: elastic partitioning with GPU scaling, and the baselines of its evaluation), and the
schedule written back as a `Plan` the independent validator checks.

- `gpulets`: Algorithm 2 (§4.5) around Algorithm 1 (§4.3): from the MPS GPUs running something now (the
  "previous period"), one GPU more at a time until every rate is served, at most the fleet's MPS GPUs.
- `sbp`, `best-fit`, `ideal`: squishy bin packing (whole GPUs, time-shared), greedy best-fit on partitions,
  and the exhaustive search over the splits (2:8), (4:6), (5:5), (10:0), on every MPS GPU of the fleet.

What the adapter decides (the paper's scheduler has one model per application and one GPU type):
- GPUs: the fleet's MPS devices (`DeviceSpec.mps`) of one type, the type with the most of them (its
  profiles are the L(b, p) the scheduler reads); other devices are left alone, with a note. GPUs are
  taken in the order: running something now, then by name, so a re-plan keeps using the same GPUs.
- Models: per application, its most accurate variant that meets `min_accuracy` and has MPS profiles on
  that type (gpulets has no accuracy scaling); its rate is the application's demand, its SLO the
  application's.
- Partitions: the sizes every MPS GPU of the type allows and every chosen variant has profiles for (the
  validator reads latency from profiles, so a size without one cannot be planned).
- Interference: the problem's `interference` model with the profiles' L2 and DRAM utilisations; without
  either, partitions are planned as if they did not interfere, and the plan says so in a note. On the GPU
  type the bundled co-runs were measured on (engine/reference/data/gpulet, RTX 2080 Ti), the prediction is
  never below a measured co-run of that model, batch, partition and co-runner (`InterferencePredictor`'s
  `measured`), so a plan that keeps its SLOs on the prediction keeps them on the measured co-run latencies.
- Shortfall: `gpulets`, `best-fit` and `ideal` fall back to the whole-GPU plan (`whole_gpu_fallback`: SBP's
  unsplit, time-shared GPUs) on the GPUs they were given when it serves more than they do, so no plan leaves
  demand unserved that whole GPUs would serve. What is still unserved is the plan's `shortfall_rps`, its
  status is then `feasible` (never `optimal`; `infeasible` when nothing is served), its first note says
  how much is short, and `tessera plan solve` exits 3.
- Memory: a variant's footprint is the most memory any of its MPS profiles (or its own figure) names; the
  models on one GPU share its memory.
- Every partition is written with its duty cycle (the round of Nexus's rules), its entries' interference
  factors and latencies including them; capacity is a batch per round."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine.plans.problem import DeviceSpec, Plan, PlanInstance, Problem
from engine.reference.profiles import (
    GPULET_GPU_MODEL,
    GpuletMemUtil,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
    reference_data_dir,
)
from engine.sharing.interference import CorunSample, InterferenceModel, InterferencePredictor, interference_samples_build
from engine.sharing.latency import PartitionLatencyModel
from engine.sharing.partitions import mps_slice_name, mps_slice_percent
from engine.sharing.scheduling import (
    ModelDemand,
    SharingProblem,
    SharingSchedule,
    best_fit_schedule,
    elastic_partitioning_schedule,
    gpu_scaling_schedule,
    ideal_schedule,
    sbp_schedule,
    whole_gpu_fallback,
)
from engine.solvers.assemble import plan_from_instances, plan_objective
from engine.solvers.registry import planner_names

__all__ = ["SHARING_SOLVERS", "interference_predictor_for", "measured_coruns_for", "sharing_problem_from", "sharing_plan_solve"]

SHARING_SOLVERS: tuple[str, ...] = planner_names("mps")


@dataclass
class _Mapping:
    """What the adapter chose: the GPUs in order, the variant of each application, and why (notes)."""

    devices: list[DeviceSpec]
    variant_of: dict[str, str]
    notes: list[str]


def _mps_devices(problem: Problem, notes: list[str]) -> list[DeviceSpec]:
    mps = [d for d in problem.devices if d.mps and not d.mig and not d.is_cpu]
    others = [d.name for d in problem.devices if d not in mps]
    if others:
        notes.append(f"not MPS GPUs, left alone by this planner: {', '.join(sorted(others))}")
    if not mps:
        return []
    kind, _ = Counter(d.type for d in mps).most_common(1)[0]
    skipped = sorted(d.name for d in mps if d.type != kind)
    if skipped:
        notes.append(f"MPS GPUs of another type than {kind}, not used (one GPU type per plan): {', '.join(skipped)}")
    chosen = [d for d in mps if d.type == kind]
    return sorted(chosen, key=lambda d: (not d.running, d.name))


def _percents_profiled(problem: Problem, variant: str, device_type: str) -> set[int]:
    return {pct for p in problem.profiles if p.variant == variant and p.device_type == device_type
            for pct in [mps_slice_percent(p.slice)] if pct is not None}


def sharing_problem_from(problem: Problem) -> tuple[SharingProblem | None, _Mapping]:
    """The scheduler's problem for `problem` (None, with notes saying why, when nothing can be scheduled)."""
    notes: list[str] = []
    devices = _mps_devices(problem, notes)
    if not devices:
        notes.append("no MPS GPU in the fleet (a device with \"mps\": true)")
        return None, _Mapping([], {}, notes)
    device_type = devices[0].type
    allowed = set.intersection(*(set(d.mps_partitions) for d in devices))
    variant_of: dict[str, str] = {}
    for app in problem.applications:
        candidates = [v for v in problem.variants_of(app.name)
                      if (app.min_accuracy is None or v.accuracy >= app.min_accuracy) and 100 in _percents_profiled(problem, v.name, device_type)]
        if not candidates:
            notes.append(f"{app.name}: no variant with MPS profiles on {device_type} (including mps100) meets its accuracy floor")
            continue
        variant_of[app.name] = max(candidates, key=lambda v: (v.accuracy, v.name)).name
    if not variant_of:
        return None, _Mapping(devices, variant_of, notes)
    partitions = set(allowed)
    for variant in variant_of.values():
        partitions &= _percents_profiled(problem, variant, device_type)
    dropped = sorted(allowed - partitions)
    if dropped:
        notes.append(f"partition sizes without a profile for every model, not used: {', '.join(map(str, dropped))} %")
    if 100 not in partitions:
        notes.append("the MPS GPUs do not allow a 100 % partition")
        return None, _Mapping(devices, variant_of, notes)
    points = [(p.variant, p.batch, mps_slice_percent(p.slice), p.latency_ms) for p in problem.profiles
              if p.device_type == device_type and p.variant in variant_of.values() and mps_slice_percent(p.slice) in partitions]
    latency = PartitionLatencyModel.from_points(points)
    memory = {}
    for variant in variant_of.values():
        measured = [p.memory_mb for p in problem.profiles if p.variant == variant and p.device_type == device_type
                    and mps_slice_percent(p.slice) is not None and p.memory_mb is not None]
        memory[variant] = max(measured + [problem.variant(variant).memory_mb])
    interference = interference_predictor_for(problem, device_type, set(variant_of.values()), notes)
    models = tuple(ModelDemand(variant_of[app.name], app.demand_rps, app.slo_ms)
                   for app in problem.applications if app.name in variant_of)
    sharing = SharingProblem(models, latency, interference, tuple(sorted(partitions)), problem.options.latency_budget_fraction,
                             memory, min((d.memory_mb for d in devices if d.memory_mb is not None), default=None))
    return sharing, _Mapping(devices, variant_of, notes)


@lru_cache(maxsize=2)
def _reference_coruns(folder: Path) -> tuple[CorunSample, ...]:
    return tuple(interference_samples_build(gpulet_inference_read(folder / "gpulet" / "inference.csv"),
                                            gpulet_interference_read(folder / "gpulet" / "interference.csv"),
                                            gpulet_mem_util_read(folder / "gpulet" / "mem_util.csv")).samples)


def measured_coruns_for(device_type: str, variants: set[str]) -> list[CorunSample]:
    """The measured co-runs that bound interference from below on `device_type`: those of the reference data
    (engine/reference/data/gpulet, or TESSERA_REFERENCE_DATA) when it is the GPU type they were measured on,
    for pairs of `variants`; none otherwise."""
    if device_type != GPULET_GPU_MODEL:
        return []
    try:
        samples = _reference_coruns(reference_data_dir())
    except (OSError, ValueError):
        return []
    return [s for s in samples if s.model in variants and s.corunner in variants]


def interference_predictor_for(problem: Problem, device_type: str, variants: set[str], notes: list[str], *,
                               measured: Sequence[CorunSample] | None = None) -> InterferencePredictor | None:
    """The problem's interference model with the L2/DRAM utilisations its profiles give for `variants` on
    `device_type` (what the planners and the simulator read), bounded below by `measured` co-runs (default:
    `measured_coruns_for`); None, with a note saying why, when the model or the utilisations are missing."""
    if problem.interference is None:
        notes.append("no interference model in the problem: MPS partitions planned as if they did not interfere")
        return None
    utilisation = [GpuletMemUtil(p.variant, p.batch, mps_slice_percent(p.slice), p.dram_util_pct, p.l2_util_pct)
                   for p in problem.profiles
                   if p.device_type == device_type and p.variant in variants and mps_slice_percent(p.slice) is not None
                   and p.l2_util_pct is not None and p.dram_util_pct is not None]
    missing = sorted(variants - {u.model for u in utilisation})
    if missing:
        notes.append(f"no L2/DRAM utilisation in the profiles of {', '.join(missing)}: MPS partitions planned as if they did not interfere")
        return None
    floor = list(measured_coruns_for(device_type, variants) if measured is None else measured)
    if floor:
        notes.append(f"interference: the fitted model, never below the {len(floor)} measured co-runs of these models on {device_type}")
    return InterferencePredictor(InterferenceModel(problem.interference.form, problem.interference.coefficients), utilisation, floor)


def _schedule(problem: Problem, sharing: SharingProblem, mapping: _Mapping, solver: str) -> SharingSchedule:
    gpus = len(mapping.devices)
    if solver == "gpulets":
        before = sum(1 for d in mapping.devices if d.running)
        return gpu_scaling_schedule(sharing, gpu_limit=gpus, gpus_before=before, scheduler=whole_gpu_fallback(elastic_partitioning_schedule))
    schedulers: dict[str, Callable[[SharingProblem, int], SharingSchedule]] = {
        "sbp": sbp_schedule, "best-fit": whole_gpu_fallback(best_fit_schedule), "ideal": whole_gpu_fallback(ideal_schedule),
    }
    return schedulers[solver](sharing, gpus)


def sharing_plan_solve(problem: Problem, solver: str = "gpulets") -> Plan:
    """Plan the fleet's MPS GPUs with `solver` (gpulets | sbp | best-fit | ideal)."""
    if solver not in SHARING_SOLVERS:
        raise ValueError(f"unknown MPS solver {solver!r}; choose one of: {', '.join(SHARING_SOLVERS)}")
    started = time.perf_counter()
    sharing, mapping = sharing_problem_from(problem)
    if sharing is None:
        return _plan_empty(problem, solver, mapping.notes, time.perf_counter() - started)
    schedule = _schedule(problem, sharing, mapping, solver)
    return _plan_from_schedule(problem, schedule, mapping, solver, time.perf_counter() - started)


def _plan_empty(problem: Problem, solver: str, notes: list[str], seconds: float) -> Plan:
    return Plan(
        status="infeasible", solver=solver, objective_kind=problem.options.objective, objective=None, bound=None, gap=None,
        solve_seconds=seconds, effective_accuracy=None, served_rps={a.name: 0.0 for a in problem.applications},
        shortfall_rps={a.name: a.demand_rps for a in problem.applications}, instances=[],
        routing={a.name: [] for a in problem.applications}, layouts={}, notes=notes,
    )


def _plan_from_schedule(problem: Problem, schedule: SharingSchedule, mapping: _Mapping, solver: str, seconds: float) -> Plan:
    instances: list[PlanInstance] = []
    layouts: dict[str, list[str]] = {}
    for gpu in schedule.gpus:
        device = mapping.devices[gpu.index]
        busy = [p for p in gpu.partitions if p.entries]
        if not busy:
            continue
        layouts[device.name] = [f"{mps_slice_name(p.percent)}@{index}" for index, p in enumerate(busy)]
        for index, part in enumerate(busy):
            for entry in part.entries:
                instances.append(PlanInstance(
                    device=device.name, slice=mps_slice_name(part.percent), start=index, variant=entry.model, batch=entry.batch,
                    latency_ms=entry.latency_ms, capacity_rps=entry.batch * 1000.0 / part.duty_cycle_ms,
                    assigned_rps=entry.rate_rps, duty_cycle_ms=part.duty_cycle_ms, interference_factor=entry.interference_factor,
                ))
    notes = list(mapping.notes) + list(schedule.notes)
    plan = plan_from_instances(problem, instances, status="feasible", solver=solver, objective=None, bound=None, gap=None,
                               solve_seconds=seconds, layouts=layouts, notes=notes)
    plan.objective = plan_objective(problem, plan)
    if problem.total_demand_rps > 0 and plan.total_served_rps <= 0:
        plan.status = "infeasible"
    short = {a: v for a, v in plan.shortfall_rps.items() if v > 0}
    if short:
        # First, so that the summary a user reads starts with it.
        plan.notes.insert(0, f"SHORTFALL: {sum(short.values()):.6g} of {problem.total_demand_rps:.6g} req/s unserved "
                             f"({', '.join(f'{a} {v:.6g}' for a, v in short.items())}): {schedule.scheduler} is unschedulable on "
                             f"{schedule.gpus_available} MPS GPU(s)")
    return plan
