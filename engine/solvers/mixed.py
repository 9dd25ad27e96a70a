"""Planning a mixed fleet: MPS GPUs beside MIG GPUs, whole GPUs and CPUs, in one plan.

The planners split by what they can partition: the MIG planners (proteus, joint, garrison and the
allocation baselines) place variants on MIG instances, whole GPUs and CPU cores and leave MPS GPUs alone;
the MPS planners (gpulets and its evaluation's baselines, solvers/gpulets.py) place models on MPS
partitions and leave the rest alone. A fleet with both would lose one half to whichever planner ran, so a
plan for it is composed of both, in two stages, one planner on its devices after the other:

- MPS first: the MPS planner on the MPS GPUs with each application's whole demand (gpulets' Algorithm 2,
  ATC'22 §4.5, takes the fewest MPS GPUs that keep every SLO, up to all of them, and reports what it could
  not schedule), then the MIG planner on every other device with what that left unserved.
- Other first: the MIG planner on the MIG GPUs, whole GPUs and CPUs with the whole demand (its priorities
  and fair shares applied), then the MPS planner with what that left.

Both orders are solved and the better composition is kept: more demand served, then the better objective
(served-weighted accuracy over the demand for max-accuracy, GPUs used for min-gpus), then fewer GPUs,
then MPS first (the older or smaller cards put to use, the larger ones left free). Neither order alone is
right: MPS first gives an application gpulets' variant (its most accurate one with MPS profiles) where a
MIG GPU could have served a more accurate one, and empties the MIG GPUs at light load; other first leaves
the MPS GPUs idle until the rest is full. Choosing by the plan's own objective keeps the more accurate
plan at light load and puts the MPS GPUs to work on the overflow at heavy load. The cost: each planner
runs twice.

With `spare_capacity: fill` (the MILP planners' default, solvers/spare.py) the stages are solved without
it, so that the order needing fewer GPUs can still be told apart, and the kept composition's non-MPS
stage is filled afterwards: same traffic, no less accuracy, so the choice stands.

The chosen solver names the planner of its kind; the other kind gets the default (gpulets for MPS,
proteus otherwise; engine/solvers/registry.py), and compose.py passes both in. The stages share the solve's
one time budget. The plan is the union of both stages: instances, layouts (MIG and MPS ones, each
keyed by its device), served rates added, each application's routes weighted by the share of its traffic
each stage serves, the shortfall what neither served (engine/solvers/assemble.py). Its objective is
measured on the whole plan; no bound or gap, since a composition proves no optimum. The independent validator checks the composed plan
as any other. Departure from gpulets, stated: the paper plans a homogeneous MPS cluster; the two-stage
composition with a choice of order is ours.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from engine.plans.problem import DeviceSpec, Plan, Problem
from engine.solvers.assemble import RPS_EPSILON, composed_status, plan_from_instances, plan_objective
from engine.solvers.budget import problem_timed
from engine.solvers.spare import plan_spare_fill

__all__ = ["fleet_is_mixed", "mixed_plan_solve"]

# The planners whose own plans fill idle devices (model.fleet_solve): the composition does it for them.
_FILLED_SOLVERS = ("proteus", "joint")


def _is_mps(device: DeviceSpec) -> bool:
    return device.mps and not device.mig and not device.is_cpu


def fleet_is_mixed(problem: Problem) -> bool:
    """True when the fleet has MPS GPUs and other devices (MIG or whole GPUs, CPUs) both."""
    kinds = {_is_mps(d) for d in problem.devices}
    return kinds == {True, False}


def _stage_problem(problem: Problem, devices: list[DeviceSpec], demand: dict[str, float]) -> Problem:
    applications = tuple(dataclasses.replace(a, demand_rps=demand[a.name]) for a in problem.applications)
    # No spare-capacity fill inside a stage (solvers/spare.py): a stage that spread its traffic over every
    # idle device would use all GPUs of its kind, and the composition could no longer prefer the order
    # that needs fewer. The kept composition's non-MPS stage is filled afterwards (mixed_plan_solve).
    options = dataclasses.replace(problem.options, spare_capacity="idle")
    return dataclasses.replace(problem, devices=tuple(devices), applications=applications, options=options)


def mixed_plan_solve(problem: Problem, *, mps_solver: str, other_solver: str, mps_planner: Callable[[Problem], Plan],
                     other_planner: Callable[[Problem], Plan], deadline: float) -> Plan:
    """The better of the two compositions of a mixed fleet's plan (see the module docstring): `mps_planner`
    (named `mps_solver`) on the MPS GPUs, `other_planner` on the rest, each stage solve given an equal share
    of the time left before `deadline` (time.perf_counter())."""
    started = time.perf_counter()
    mps_devices = [d for d in problem.devices if _is_mps(d)]
    other_devices = [d for d in problem.devices if not _is_mps(d)]
    demand = {a.name: a.demand_rps for a in problem.applications}
    solves_left = [4]  # two stages in each of two orders, sharing one budget

    def timed(stage_problem: Problem) -> Problem:
        solves_left[0] -= 1
        return problem_timed(stage_problem, deadline, solves_left[0] + 1)

    def staged(first_planner, first_devices: list[DeviceSpec], second_planner, second_devices: list[DeviceSpec]):
        first_problem = _stage_problem(problem, first_devices, demand)
        first = first_planner(timed(first_problem))
        remainder = {name: max(0.0, rps - first.served_rps.get(name, 0.0)) for name, rps in demand.items()}
        remainder = {name: (0.0 if rps <= RPS_EPSILON else rps) for name, rps in remainder.items()}
        second_problem = _stage_problem(problem, second_devices, remainder)
        return (first, first_problem), (second_planner(timed(second_problem)), second_problem)

    (mps_plan, _), (other_plan, other_problem) = staged(mps_planner, mps_devices, other_planner, other_devices)
    mps_first = _plans_compose(problem, mps_plan, other_plan, mps_solver, other_solver, "MPS first")
    stages = {"MPS first": (mps_plan, other_plan, other_problem)}
    (other_plan, other_problem), (mps_plan, _) = staged(other_planner, other_devices, mps_planner, mps_devices)
    other_first = _plans_compose(problem, mps_plan, other_plan, mps_solver, other_solver, "other first")
    stages["other first"] = (mps_plan, other_plan, other_problem)
    # max() keeps the first of equals: MPS first on a tie.
    best = max((mps_first, other_first), key=lambda plan: _composition_rank(problem, plan))
    rejected = other_first if best is mps_first else mps_first
    if problem.options.spare_capacity != "idle" and problem.options.objective == "max-accuracy" and other_solver in _FILLED_SOLVERS:
        # The order is chosen; now the non-MPS stage's idle devices take spare capacity (solvers/spare.py),
        # which serves the same traffic at no less accuracy, so the choice stands.
        order = _order_of(best)
        stage_mps, stage_other, stage_problem = stages[order]
        filled = plan_spare_fill(stage_problem, stage_other, even=problem.options.spare_capacity == "artefact")
        best = _plans_compose(problem, stage_mps, filled, mps_solver, other_solver, order, filled_spare=True)
    best.notes.insert(1, f"kept {_order_of(best)} ({_composition_text(best)}) over {_order_of(rejected)} "
                         f"({_composition_text(rejected)})")
    best.solve_seconds = time.perf_counter() - started
    return best


def _order_of(plan: Plan) -> str:
    return "MPS first" if "MPS first" in plan.notes[0] else "other first"


def _composition_rank(problem: Problem, plan: Plan) -> tuple[float, float, int]:
    """Larger is better: demand served (to a millionth of the total, so rounding does not decide), the
    objective (negated for min-gpus; to 1e-6, for the same reason: the two orders' MILPs differ in solver
    noise below that), fewer GPUs."""
    scale = max(problem.total_demand_rps, 1.0) * 1e-6
    served = round(plan.total_served_rps / scale)
    objective = plan.objective if plan.objective is not None else float("-inf")
    if problem.options.objective == "min-gpus":
        objective = -objective
    return (served, round(objective, 6), -plan.gpus_used)


def _composition_text(plan: Plan) -> str:
    objective = "none" if plan.objective is None else f"{plan.objective:.6g}"
    return f"{plan.total_served_rps:.6g} req/s served, objective {objective}, {plan.gpus_used} GPUs"


def _plans_compose(problem: Problem, first: Plan, second: Plan, mps_solver: str, other_solver: str, order: str, *, filled_spare: bool = False) -> Plan:
    """One plan of `first` (the MPS GPUs' plan) and `second` (the other devices'), solved in `order`: served
    traffic, shortfall and routing by `plan_from_instances`, the objective measured on the whole
    (`plan_objective`), the status by `composed_status` (never optimal: the device split proves nothing)."""
    if order == "MPS first":
        how = f"{mps_solver} on the MPS GPUs first, then {other_solver} on the other devices with the demand left unserved"
    else:
        how = f"{other_solver} on the non-MPS devices first, then {mps_solver} on the MPS GPUs with the demand left unserved"
    notes = [f"mixed fleet, {order}: {how} (engine/solvers/mixed.py); no optimality bound for the composition"
             + ("; then the non-MPS devices left idle were given spare capacity" if filled_spare else "")]
    notes += [f"{mps_solver}: {n}" for n in first.notes] + [f"{other_solver}: {n}" for n in second.notes]
    plan = plan_from_instances(problem, list(first.instances) + list(second.instances), status="feasible",
                               solver=f"{mps_solver}+{other_solver}", objective=None, bound=None, gap=None, solve_seconds=0.0,
                               layouts={**second.layouts, **first.layouts}, notes=notes)
    plan.objective = plan_objective(problem, plan)
    plan.status = composed_status(problem, plan, [first.status, second.status], separable=False)
    return plan
