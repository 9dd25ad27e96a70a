"""Put a plan's idle devices to work: every whole GPU and CPU host the solver left empty gets an instance,
and each application's traffic is spread over its instances so that the busiest runs as far below its
capacity as the plan's accuracy allows.

Why. The accuracy MILP (model.py, Proteus §4 Eq. (1)-(7)) serves the planned demand exactly, at the
highest accuracy, and has no reason to use a device beyond that: with Eq. (1) as "at most one variant per
device" it leaves devices idle and runs the others at up to 100 % of their capacity, so any burst between
two re-plans queues and expires. Proteus's artefact does not do that (UMass-LIDS/Proteus,
`algorithms/ilp.py`: Eq. (1) is an equality, `sum_j x[i, j] == 1`, so every device hosts a variant;
`core/simulator.py` `postprocess_predictor_dict`: a device the solution routes nothing to is upgraded to
the most accurate variant of its family that meets the SLO there, "to ensure the cluster does not go under
utilized since ILP will only try to meet throughput, but will not use beyond it"; `core/executor.py`
`enqueue_request`: traffic is then spread evenly over all of a family's devices). That is what its
recorded end-to-end figures were measured with.

What is done here, in two steps:
1. Fill (`spare_devices_assign`). Each device without an instance (a whole GPU, a CPU host, or a MIG GPU
   the plan runs whole; MIG slices and MPS partitions are not touched) gets the most accurate variant that
   fits it within the latency budget of one application, as in the artefact. Which application: the one
   running there now if it still has traffic (a spare device keeps its model, nothing reloads), else the
   application with the least headroom, capacity over planned traffic (the artefact leaves the family to
   the solver's arbitrary choice of x for an unrouted device).
2. Spread (`traffic_spread`). Per application, one small LP over its instances: minimise the largest
   utilisation u (r_i <= u cap_i) subject to serving the plan's traffic (sum r_i = served) at no less than
   the plan's accuracy (sum acc_i r_i >= the MILP's accuracy-weighted traffic). Departure from the
   artefact, which spreads evenly by count: an even split overloads a slow device (a CPU beside GPUs) and
   ignores the accuracy the MILP chose; this split keeps both the MILP's accuracy and every instance's
   capacity. `traffic_spread_even` is the artefact's split, kept for a faithful port: an equal share per
   instance, capped at its capacity (what a cap leaves goes evenly to the others, where the artefact would
   queue it on a device that cannot keep up).

Used by the MILP planners (`model.fleet_solve`) when the objective is max-accuracy and
`options.spare_capacity` is "fill" (the default: fill, then the LP's spread) or "artefact" (fill, then the
even spread, as Proteus's artefact); "idle" keeps the paper's letter (Eq. (1) as an inequality, idle
devices)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.plans.capacity import capacity_for, cpu_slice
from engine.plans.problem import FULL_SLICE, DeviceSpec, Plan, Problem, device_slot_id
from engine.solvers.assemble import RPS_EPSILON, Assignment, assignment_of, plan_assemble

# The spread may give up this much accuracy-weighted traffic (relative) to the LP's rounding.
ACCURACY_REL_TOL = 1e-9


@dataclass(frozen=True)
class SpareChoice:
    """A variant for an idle device: where it runs and what it can serve."""

    device: str
    slice: str
    variant: str
    application: str
    capacity_rps: float


def _device_slice(problem: Problem, device: DeviceSpec, variant: str) -> str | None:
    if device.is_cpu:
        return cpu_slice(problem, variant, device)
    return FULL_SLICE


def spare_devices(problem: Problem, plan: Plan) -> list[DeviceSpec]:
    """Devices the plan runs nothing on and that a whole-device instance can use (no MIG layout, no MPS)."""
    used = {inst.device for inst in plan.instances}
    layouts = plan.layouts or {}
    out = []
    for device in problem.devices:
        if device.name in used or device.mps:
            continue
        if device.mig and (layouts.get(device.name) or device.layout):
            continue  # a MIG GPU with instances (planned or current): its free slices are the joint planner's business
        out.append(device)
    return out


def _best_variant(problem: Problem, device: DeviceSpec, application: str) -> SpareChoice | None:
    """The most accurate variant of `application` that serves something on `device` (ties: more capacity)."""
    best: tuple[float, float, str, str] | None = None
    for variant in problem.variants_of(application):
        slice_name = _device_slice(problem, device, variant.name)
        if slice_name is None:
            continue
        capacity = capacity_for(problem, variant.name, device, slice_name)
        if capacity is None or capacity.capacity_rps <= 0:
            continue
        key = (variant.accuracy, capacity.capacity_rps, variant.name, slice_name)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return None
    return SpareChoice(device=device.name, slice=best[3], variant=best[2], application=application, capacity_rps=best[1])


def _running_choice(problem: Problem, device: DeviceSpec, traffic: dict[str, float]) -> SpareChoice | None:
    """What the idle device runs now, if it still serves something the plan routes (nothing reloads)."""
    slot = device_slot_id(FULL_SLICE, None, is_cpu=device.is_cpu)
    for running_slot, name in device.running:
        if running_slot != slot or not any(v.name == name for v in problem.variants):
            continue
        application = problem.variant(name).application
        slice_name = _device_slice(problem, device, name)
        capacity = capacity_for(problem, name, device, slice_name) if slice_name is not None else None
        if application in traffic and capacity is not None and capacity.capacity_rps > 0:
            return SpareChoice(device=device.name, slice=slice_name, variant=name, application=application, capacity_rps=capacity.capacity_rps)
    return None


def spare_devices_assign(problem: Problem, plan: Plan) -> list[SpareChoice]:
    """One choice per idle device (see the module docstring, step 1), in device order."""
    capacity: dict[str, float] = defaultdict(float)
    for inst in plan.instances:
        capacity[problem.variant(inst.variant).application] += inst.capacity_rps
    # A pipeline's stage runs one variant at one batch on replicas its planner sized: never a spare device's.
    traffic = {app: rps for app, rps in plan.served_rps.items() if rps > RPS_EPSILON and problem.pipeline_of(app) is None}
    if not traffic:
        return []
    choices: list[SpareChoice] = []
    for device in spare_devices(problem, plan):
        choice = _running_choice(problem, device, traffic)
        if choice is None:
            options = {app: best for app in traffic if (best := _best_variant(problem, device, app)) is not None}
            if not options:
                continue
            # Least headroom first: capacity / traffic smallest; ties by name, so the choice is reproducible.
            app = min(options, key=lambda a: (capacity[a] / traffic[a], a))
            choice = options[app]
        choices.append(choice)
        capacity[choice.application] += choice.capacity_rps
    return choices


def traffic_spread(served_rps: float, capacities: Sequence[float], accuracies: Sequence[float], accuracy_traffic: float) -> list[float]:
    """Rates r_i for one application's instances: sum r_i = served_rps, 0 <= r_i <= cap_i,
    sum acc_i r_i >= accuracy_traffic (less ACCURACY_REL_TOL), minimising max_i r_i / cap_i (module
    docstring, step 2). Solved with HiGHS through SciPy."""
    from scipy.optimize import linprog

    n = len(capacities)
    if n == 0 or served_rps <= 0:
        return [0.0] * n
    cap = np.asarray(capacities, dtype=float)
    acc = np.asarray(accuracies, dtype=float)
    # Variables: r_1..r_n, u. Minimise u.
    c = np.zeros(n + 1)
    c[-1] = 1.0
    a_ub = np.zeros((n + 1, n + 1))
    a_ub[:n, :n] = np.eye(n)
    a_ub[:n, n] = -cap  # r_i - u cap_i <= 0
    a_ub[n, :n] = -acc  # -sum acc_i r_i <= -accuracy_traffic
    b_ub = np.zeros(n + 1)
    b_ub[n] = -accuracy_traffic * (1.0 - ACCURACY_REL_TOL)
    a_eq = np.zeros((1, n + 1))
    a_eq[0, :n] = 1.0
    bounds = [(0.0, float(x)) for x in cap] + [(0.0, 1.0)]
    result = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[served_rps], bounds=bounds, method="highs")
    if result.status != 0:
        raise ValueError(f"traffic spread LP failed: {result.message}")
    rates = np.clip(result.x[:n], 0.0, cap)
    # Rounding: hand any difference to the instances with room, so the total is exactly the plan's.
    rates *= served_rps / rates.sum() if rates.sum() > 0 else 0.0
    return [float(x) for x in np.minimum(rates, cap)]


def traffic_spread_even(served_rps: float, capacities: Sequence[float]) -> list[float]:
    """The artefact's spread: an equal share of `served_rps` per instance, each capped at its capacity, what
    the caps leave shared evenly among the others (water-filling). Sums to `served_rps` when the capacities
    allow it (they do for a plan's own traffic)."""
    cap = [max(0.0, float(c)) for c in capacities]
    rates = [0.0] * len(cap)
    open_ = [i for i, c in enumerate(cap) if c > 0]
    left = float(served_rps)
    while left > RPS_EPSILON and open_:
        share = left / len(open_)
        still = []
        for i in open_:
            add = min(share, cap[i] - rates[i])
            rates[i] += add
            if cap[i] - rates[i] > RPS_EPSILON:
                still.append(i)
        left = served_rps - sum(rates)
        open_ = still
    return rates


def plan_spare_fill(problem: Problem, plan: Plan, *, even: bool = False) -> Plan:
    """`plan` with its idle devices put to work and each application's traffic spread (module docstring):
    by the LP, or evenly by count (`even`, the artefact's). The plan's status, objective, bound and gap are
    the solver's; served traffic is unchanged; with the LP every application's accuracy is at least the
    solver's (the even spread may lower it). A plan with nothing to fill and nothing to spread comes back
    as it was."""
    if plan.status == "infeasible" or not plan.instances:
        return plan
    choices = spare_devices_assign(problem, plan)
    assignments = [assignment_of(problem, i) for i in plan.instances]
    assignments += [Assignment(c.device, c.slice, None, c.variant, 0.0) for c in choices]
    by_app: dict[str, list[int]] = defaultdict(list)
    capacities: list[float] = []
    for k, a in enumerate(assignments):
        by_app[problem.variant(a.variant).application].append(k)
        device = problem.device(a.device)
        cap = a.capacity or capacity_for(problem, a.variant, device, a.slice)
        capacities.append(cap.capacity_rps if cap is not None else 0.0)
    rates = [a.assigned_rps for a in assignments]
    for app, members in by_app.items():
        served = sum(assignments[k].assigned_rps for k in members)
        if served <= RPS_EPSILON or problem.pipeline_of(app) is not None:
            continue  # a pipeline's replicas keep the equal shares their planner gave them
        accuracies = [problem.variant(assignments[k].variant).accuracy for k in members]
        accuracy_traffic = sum(a * assignments[k].assigned_rps for a, k in zip(accuracies, members))
        caps = [capacities[k] for k in members]
        spread_rates = traffic_spread_even(served, caps) if even else traffic_spread(served, caps, accuracies, accuracy_traffic)
        for k, r in zip(members, spread_rates):
            rates[k] = r
    spread = [dataclasses.replace(a, assigned_rps=r) for a, r in zip(assignments, rates)]
    notes = list(plan.notes)
    if choices:
        how = ("traffic spread evenly over each application's instances, as Proteus's artefact (the objective is the solver's, "
               "before the spread)" if even else "traffic spread to minimise the busiest instance's utilisation at the solver's accuracy")
        notes.append(f"spare capacity: {len(choices)} idle devices given an instance ({', '.join(sorted({c.application for c in choices}))}); {how}")
    filled = plan_assemble(
        problem, spread, status=plan.status, solver=plan.solver, objective=plan.objective, bound=plan.bound, gap=plan.gap,
        solve_seconds=plan.solve_seconds, layouts=plan.layouts, notes=notes,
    )
    filled.pipelines = plan.pipelines
    return filled
