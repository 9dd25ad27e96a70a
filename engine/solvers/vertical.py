"""Planning CPU applications that scale vertically in place (thesis P2 Sponge, P4 Biscale; issue 19).

`plan_solve(problem, "sponge")` (`vertical_part_solve`): every CPU application (one whose variants are profiled on CPUs only,
outside pipelines) gets one instance, sized by Biscale's vertical programme on one stage (Algorithm 3
with n = 1; Sponge's P2.3 with every request's budget the whole SLO, which is all a plan knows ahead of
the requests): the fewest cores, then the smallest batch, whose latency plus the batch's wait (b - 1) /
lambda fits the latency budget (`options.latency_budget_fraction` x SLO, the capacity model's rule that
the validator checks) while serving `options.pipeline_headroom` x the demand. When one instance on the
largest host cannot serve it, more instances of the largest such size do (the rate bisection of
Algorithm 3). Each instance carries its `VerticalScaling`: the latency model P2.2 fitted to the
variant's CPU profiles and the cores it may grow to, so that the agent's fast loop resizes it in place
every second by Sponge's rule on the live requests' remaining budgets (workers/agent/vertical.py,
engine/vertical/controller.py). Every other application is planned by the fleet planner on the devices
left (engine/solvers/compose.py). `plan_solve(problem, "biscale")` plans the problem's pipelines by
Biscale (engine/solvers/pipelines.py) and its flat CPU applications as `sponge` does.

Where this departs, and why: the planned sizes are among the variant's profiled core counts (the
validator checks every plan against measured profiles), while the fast loop may take any count between
its bounds on the fitted model; an instance may grow into every core of its host that no planned
instance holds, up to the largest core count its variant was profiled at (`max_cores`: the model is not
extrapolated past what it was fitted on), several vertical instances on one host sharing that room,
which the agent divides between them (it never gives out more than the host has)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from engine.plans.capacity import profile_interpolate
from engine.plans.problem import CPU_DEVICE_TYPE, PlanInstance, PlanStatus, Problem, VerticalScaling
from engine.solvers.assemble import PartPlan
from engine.solvers.hosts import CpuHostUse, replicas_place
from engine.vertical.biscale import BiscaleProblem, BiscaleStage, biscale_vertical_solve
from engine.vertical.sponge import BATCH_MAX, VerticalLatency, vertical_latency_fit

__all__ = ["vertical_apps", "vertical_bounds_attach", "vertical_model_from_profiles", "vertical_part_solve"]


def vertical_model_from_profiles(problem: Problem, variant: str) -> VerticalLatency | None:
    """P2.2 fitted to the variant's CPU profiles at every core count and batch; None when they cannot
    determine it (fewer than two core counts or four distinct points)."""
    points = [(p.batch, int(p.slice), p.latency_ms) for p in problem.profiles
              if p.variant == variant and p.device_type == CPU_DEVICE_TYPE and p.slice.isdigit()]
    if len({c for _, c, _ in points}) < 2 or len({(b, c) for b, c, _ in points}) < 4:
        return None
    return vertical_latency_fit(points)


def vertical_apps(problem: Problem) -> list[str]:
    """The CPU applications outside pipelines: every variant profiled on CPUs only, at least one of them."""
    staged = {st.application for p in problem.pipelines for st in p.stages}
    out = []
    for app in problem.applications:
        if app.name in staged:
            continue
        types = {p.device_type for v in problem.variants_of(app.name) for p in problem.profiles if p.variant == v.name}
        if types == {CPU_DEVICE_TYPE}:
            out.append(app.name)
    return out


class ProfiledLatency:
    """l(b, c) read off a variant's CPU profiles (linear between profiled batches, as the validator reads
    them), infinite where nothing was profiled: the plan's sizes are then exactly what the validator checks."""

    def __init__(self, problem: Problem, variant: str, counts: Sequence[int]) -> None:
        self.points = {c: problem.profiles_for(variant, CPU_DEVICE_TYPE, str(c)) for c in counts}

    def l(self, batch: int, cores: int) -> float:
        points = self.points.get(cores)
        if not points or batch > points[-1].batch:
            return math.inf
        value = profile_interpolate(points, batch, "latency_ms")
        return math.inf if value is None else float(value)

    def throughput_rps(self, batch: int, cores: int) -> float:
        ms = self.l(batch, cores)
        return 0.0 if not math.isfinite(ms) else 1000.0 * batch / ms


def _core_counts(problem: Problem, variant: str, host_cores: int) -> list[int]:
    return sorted({int(p.slice) for p in problem.profiles if p.variant == variant and p.device_type == CPU_DEVICE_TYPE
                   and p.slice.isdigit() and 1 <= int(p.slice) <= host_cores})


def vertical_bounds_attach(problem: Problem, instances: Sequence[PlanInstance], scaling: Mapping[str, tuple[str, VerticalLatency, float, int]],
                           used: Mapping[str, int]) -> list[PlanInstance]:
    """Each instance whose application is in `scaling` (application -> (policy, model, reserve_ms,
    max_batch)) with its VerticalScaling: from one core to its planned cores plus every core of its host
    that no planned instance holds (`used`: cores given per host), and no more than the variant was
    profiled at: the fitted model is not trusted past the core counts it was fitted on (a host larger than
    the machine that profiled the variant gets a profiling request first, then the room)."""
    out = []
    for inst in instances:
        app = problem.variant(inst.variant).application
        if app not in scaling:
            out.append(inst)
            continue
        policy, model, reserve_ms, max_batch = scaling[app]
        device = problem.device(inst.device)
        free = max(0, (device.cores or 0) - used.get(inst.device, 0))
        profiled = max(_core_counts(problem, inst.variant, device.cores or 0), default=int(inst.slice))
        out.append(PlanInstance(**{**inst.__dict__, "vertical": VerticalScaling(
            policy, round(model.gamma1, 6), round(model.eps1, 6), round(model.delta1, 6), round(model.eta1, 6), min_cores=1,
            max_cores=max(int(inst.slice), min(int(inst.slice) + free, profiled)), max_batch=max(inst.batch, max_batch),
            reserve_ms=round(reserve_ms, 6))}))
    return out


def vertical_part_solve(problem: Problem, hosts: CpuHostUse) -> PartPlan:
    """Size every CPU application outside pipelines (`vertical_apps`) for in-place vertical scaling on the CPU
    hosts' free cores (`hosts`, updated); see the module docstring. The applications it cannot model are
    left to the composition's fleet planner (engine/solvers/compose.py), with a note."""
    cpu_hosts = [d for d in problem.devices if d.is_cpu]
    host_cores = max((hosts.free_cores(h) for h in cpu_hosts), default=0)
    notes: list[str] = []
    statuses: list[PlanStatus] = []
    placed_all: list[PlanInstance] = []
    scaling: dict[str, tuple[str, VerticalLatency, float, int]] = {}
    taken: set[str] = set()
    cpu_apps = vertical_apps(problem)
    for name in cpu_apps:
        app = problem.application(name)
        picked = _vertical_variant(problem, name, host_cores)
        if picked is None:
            notes.append(f"{name}: no variant has CPU profiles at two or more core counts up to {host_cores} (the latency model l(b, c) needs them); "
                         "the fleet planner plans it")
            continue
        variant, model, counts = picked
        taken.add(name)
        batches = sorted({p.batch for c in counts for p in problem.profiles_for(variant, CPU_DEVICE_TYPE, str(c))})
        max_batch = min(BATCH_MAX, batches[-1])
        stage = BiscaleStage(name, ProfiledLatency(problem, variant, counts), max_batch=max_batch, max_cores=counts[-1],  # type: ignore[arg-type]
                             core_counts=tuple(counts))
        budget = app.slo_ms * problem.options.latency_budget_fraction
        rate = max(app.demand_rps * problem.options.pipeline_headroom, 1e-3)
        plan = biscale_vertical_solve(BiscaleProblem((stage,), budget, rate))
        if plan.status == "infeasible" or not plan.decisions:
            statuses.append("infeasible")
            notes.append(f"{name}: no size of {variant} up to {counts[-1]} cores answers within {budget:g} ms "
                         f"({problem.options.latency_budget_fraction:g} x its SLO)")
            continue
        d = plan.decisions[name]
        statuses.append("optimal" if plan.status == "optimal" else "feasible")
        if plan.status == "feasible":
            notes.append(f"{name}: one instance of {variant} serves {plan.vertical_rate_rps:g} of {rate:.4g} rps at most; {d.instances} instances "
                         f"of {d.cores} cores")
        keys = [(f"{name}#{r}", d.cores) for r in range(d.instances)]
        placed, left = replicas_place(cpu_hosts, keys, hosts.used)
        if left:
            notes.append(f"{name}: not enough CPU cores: {len(keys) - len(left)} of {len(keys)} instances placed")
        mine = []
        for host, host_keys in sorted(placed.items()):
            for _key in sorted(host_keys):
                latency = round(stage.latency.l(d.batch, d.cores), 6)
                mine.append(PlanInstance(device=host, slice=str(d.cores), start=hosts.number(host), variant=variant, batch=d.batch,
                                         latency_ms=latency, capacity_rps=d.batch * 1000.0 / latency, assigned_rps=0.0))
        capacity = sum(i.capacity_rps for i in mine)
        for inst in mine:
            share = app.demand_rps * inst.capacity_rps / capacity if capacity > 0 else 0.0
            placed_all.append(PlanInstance(**{**inst.__dict__, "assigned_rps": min(share, inst.capacity_rps)}))
        scaling[name] = ("sponge", model, 0.0, BATCH_MAX)
    if not cpu_apps:
        notes.append("the problem has no CPU applications (every variant profiled on CPUs only); nothing scales vertically")

    def finish(held: Mapping[str, int]) -> list[PlanInstance]:
        # The room to grow is what no planned instance holds once every part is planned.
        return vertical_bounds_attach(problem, placed_all, scaling, held)

    return PartPlan(solver="sponge", instances=placed_all, taken=taken, statuses=statuses, notes=notes, finish=finish)


def _vertical_variant(problem: Problem, application: str, host_cores: int) -> tuple[str, VerticalLatency, list[int]] | None:
    """The most accurate variant (at or above the application's min_accuracy) whose CPU profiles give a
    latency model, its model and its profiled core counts up to the largest host."""
    app = problem.application(application)
    best = None
    for v in sorted(problem.variants_of(application), key=lambda v: (-v.accuracy, v.name)):
        if app.min_accuracy is not None and v.accuracy < app.min_accuracy:
            continue
        counts = _core_counts(problem, v.name, host_cores)
        model = vertical_model_from_profiles(problem, v.name) if counts else None
        if model is not None and not math.isnan(model.l(1, 1)):
            best = (v.name, model, counts)
            break
    return best
