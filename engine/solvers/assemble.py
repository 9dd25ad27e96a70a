"""Turning a solver's decisions into a Plan. Every strategy and every composition ends in
`plan_from_instances`, so served traffic, shortfall, effective accuracy and routing weights are computed one
way for all of them; `plan_objective` is the objective of a composed plan, and `composed_status` its status.
`PartPlan` is what a strategy that plans part of a problem (pipelines, vertically scaled
CPU applications) hands back to the composition (engine/solvers/compose.py)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from engine.plans.capacity import InstanceCapacity, capacity_for
from engine.plans.problem import Plan, PlanInstance, PlanStatus, Problem, RouteEntry
from engine.sharing.partitions import mps_slice_percent

# Traffic below this (queries per second) is solver noise, not an assignment.
RPS_EPSILON = 1e-6
# The validator's relative tolerance on served traffic (engine/plans/validate.py REL_TOL).
SHORTFALL_REL_TOL = 1e-6


@dataclass(frozen=True)
class Assignment:
    """One instance the plan runs, with the traffic the solver sent to it."""

    device: str
    slice: str
    start: int | None
    variant: str
    assigned_rps: float
    # Given by planners that derive an instance's capacity themselves (MPS partitions: interference and
    # time-sharing, engine/solvers/fleet.py); otherwise the capacity model's on the slice alone.
    capacity: InstanceCapacity | None = None
    duty_cycle_ms: float | None = None
    interference_factor: float = 1.0


def assignment_of(problem: Problem, instance: PlanInstance) -> Assignment:
    """A planned instance as an assignment to assemble again (with other traffic): an MPS partition keeps the
    capacity, interference factor and duty cycle its planner derived, a pipeline replica its batch."""
    if mps_slice_percent(instance.slice) is None and problem.pipeline_of(problem.variant(instance.variant).application) is None:
        return Assignment(instance.device, instance.slice, instance.start, instance.variant, instance.assigned_rps)
    # An MPS partition, or a pipeline replica (at the batch its pipeline's planner chose): as planned.
    capacity = InstanceCapacity(batch=instance.batch, latency_ms=instance.latency_ms, capacity_rps=instance.capacity_rps,
                                memory_mb=problem.variant(instance.variant).memory_mb)
    return Assignment(instance.device, instance.slice, instance.start, instance.variant, instance.assigned_rps, capacity=capacity,
                      duty_cycle_ms=instance.duty_cycle_ms, interference_factor=instance.interference_factor)


def plan_assemble(
    problem: Problem,
    assignments: Iterable[Assignment],
    *,
    status: PlanStatus,
    solver: str,
    objective: float | None,
    bound: float | None,
    gap: float | None,
    solve_seconds: float,
    layouts: dict[str, Sequence[str]] | None = None,
    notes: Sequence[str] = (),
) -> Plan:
    instances: list[PlanInstance] = []
    for a in sorted(assignments, key=lambda a: (a.device, a.start if a.start is not None else -1, a.slice)):
        device = problem.device(a.device)
        capacity = a.capacity or capacity_for(problem, a.variant, device, a.slice)
        if capacity is None:
            raise ValueError(f"{a.variant} cannot run on {a.device}/{a.slice} within its SLO and memory")
        assigned = max(0.0, min(a.assigned_rps, capacity.capacity_rps))
        assigned = 0.0 if assigned < RPS_EPSILON else assigned
        instances.append(PlanInstance(
            device=a.device, slice=a.slice, start=a.start, variant=a.variant, batch=capacity.batch,
            latency_ms=capacity.latency_ms if a.capacity else round(capacity.latency_ms, 6), capacity_rps=capacity.capacity_rps,
            assigned_rps=assigned, duty_cycle_ms=a.duty_cycle_ms, interference_factor=a.interference_factor,
        ))
    return plan_from_instances(problem, instances, status=status, solver=solver, objective=objective, bound=bound, gap=gap,
                               solve_seconds=solve_seconds, layouts=layouts, notes=notes)


def plan_from_instances(
    problem: Problem,
    instances: list[PlanInstance],
    *,
    status: PlanStatus,
    solver: str,
    objective: float | None,
    bound: float | None,
    gap: float | None,
    solve_seconds: float,
    layouts: dict[str, Sequence[str]] | None = None,
    notes: Sequence[str] = (),
) -> Plan:
    """The Plan of instances whose batch, capacity and traffic are decided: served traffic, shortfall,
    accuracy and routing weights derived from them."""
    served: dict[str, float] = defaultdict(float)
    accuracy_weighted: dict[str, float] = defaultdict(float)
    per_app_instances: dict[str, list[PlanInstance]] = defaultdict(list)
    for instance in instances:
        variant = problem.variant(instance.variant)
        served[variant.application] += instance.assigned_rps
        accuracy_weighted[variant.application] += instance.assigned_rps * variant.accuracy
        per_app_instances[variant.application].append(instance)

    routing: dict[str, list[RouteEntry]] = {}
    accuracy_by_app: dict[str, float] = {}
    shortfall: dict[str, float] = {}
    for app in problem.applications:
        total = served.get(app.name, 0.0)
        routing[app.name] = [
            RouteEntry(i.id, i.assigned_rps / total) for i in per_app_instances.get(app.name, []) if total > 0 and i.assigned_rps > 0
        ]
        if total > 0:
            accuracy_by_app[app.name] = accuracy_weighted[app.name] / total
        # Rows assigned to instances, queries served: a query of s rows answered by k members is s * k rows.
        total /= app.load_factor
        served[app.name] = total
        missing = app.demand_rps - total
        # What the validator allows to be rounded to zero (twice its tolerance, engine/plans/validate.py): a MILP
        # meets its demand rows within HiGHS's feasibility tolerance times an instance's capacity (a plan for
        # 18.75 rps served 18.74998), which is no shortfall anyone could measure.
        shortfall[app.name] = missing if missing > 2 * max(RPS_EPSILON, SHORTFALL_REL_TOL * app.demand_rps) else 0.0
    rows_served = sum(i.assigned_rps for i in instances)
    effective = sum(accuracy_weighted.values()) / rows_served if rows_served > 0 else None
    gpus = {i.device for i in instances if not problem.device(i.device).is_cpu}
    return Plan(
        status=status, solver=solver, objective_kind=problem.options.objective, objective=objective, bound=bound, gap=gap,
        solve_seconds=solve_seconds, effective_accuracy=effective, served_rps=dict(served), shortfall_rps=shortfall,
        instances=instances, routing=routing, layouts={k: list(v) for k, v in (layouts or {}).items()},
        accuracy_by_application=accuracy_by_app, gpus_used=len(gpus), notes=list(notes),
    )


def plan_objective(problem: Problem, plan: Plan) -> float:
    """The problem's objective measured on a plan: for max-accuracy the served-weighted accuracy over the
    total demand (what the fleet planners maximise once fairness is settled), for min-gpus the GPUs used."""
    if problem.options.objective == "min-gpus":
        return float(plan.gpus_used)
    demand = problem.total_demand_rps
    return sum(plan.served_rps.get(a, 0.0) * acc for a, acc in plan.accuracy_by_application.items()) / demand if demand > 0 else 0.0


def composed_status(problem: Problem, plan: Plan, parts: Sequence[PlanStatus], *, separable: bool) -> PlanStatus:
    """The status of a plan composed of parts solved apart (`parts`: their statuses). `infeasible` when
    demand is positive and nothing is served; `optimal` only when the parts are `separable` (they share no
    device and no objective, e.g. pipelines alone, each minimising its own instances), every part proved
    optimal and nothing is short; else `feasible`: a split of the devices decided before solving proves no
    optimum for the whole."""
    if problem.total_demand_rps > 0 and plan.total_served_rps <= 0:
        return "infeasible"
    if separable and parts and all(s == "optimal" for s in parts) and not any(plan.shortfall_rps.values()):
        return "optimal"
    return "feasible"


@dataclass
class PartPlan:
    """What a part strategy planned: its instances, the applications it took (none of them is planned by
    another part), each of its solves' statuses, notes, the pipelines' summaries, and `finish`: called by the
    composition once every part is planned, with the cores held per host, it returns this part's instances
    completed (their in-place vertical scaling bounded by the room finally left)."""

    solver: str
    instances: list[PlanInstance]
    taken: set[str]
    statuses: list[PlanStatus]
    notes: list[str]
    pipelines: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[Mapping[str, int]], list[PlanInstance]] | None = None
