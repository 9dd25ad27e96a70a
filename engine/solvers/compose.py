"""How a problem is split among planners, and how their plans are merged: the one place that decides it.

A plan run reads as a straight line (`plan_compose`):

1. **Rows.** A planner that does not read ensembles (every one but garrison and fleet, `reads_ensembles`)
   gets the problem in rows (engine/solvers/ensembles.py): one application per member of each random
   ensemble, and a query-sized application's demand in rows; the plan is put back on the original
   applications at the end. (fleet writes it in rows itself and counts each ensemble whole.)
2. **Pipelines.** When the problem has pipelines, the planner the chosen one names (`pipelines_by`: fa2 by
   default, ipa, biscale) plans them all on the CPU hosts (engine/solvers/pipelines.py), unless the chosen
   planner plans them in its own model (`plans_pipelines`: fleet), which then plans the whole problem.
3. **Vertical scaling.** When the chosen planner is sponge or biscale, the CPU applications outside
   pipelines are sized for in-place vertical scaling on the cores left (engine/solvers/vertical.py).
4. **The fleet.** The chosen planner, or proteus when it plans only parts, plans every application left on
   the devices left: every GPU, every CPU host no part placed an instance on, and a host a part did as the
   cores its replicas leave free (numbered after them when merged), unless those replicas grow in place
   (sponge, biscale: the free cores are their room). A fleet with MPS GPUs and other devices both is planned by an MPS planner and a fleet planner in
   two stages, in both orders, the better kept (engine/solvers/mixed.py).
5. **Merge.** Every part's instances and the fleet's, their vertical bounds set once every core is given
   (`PartPlan.finish`), in one `plan_from_instances`: served traffic, shortfall and routing computed once.

One time budget (`options.time_limit_s`) covers the whole solve: each solve gets an equal share of what is
left for the solves still to come. A plan of one strategy on the whole problem keeps its own status,
objective, bound and gap; a composition's objective is measured on the whole plan (`plan_objective`), it
has no bound or gap, and its status is `composed_status`'s: `optimal` only for pipelines alone, each proved
optimal with nothing short (their objectives add up and they share nothing); otherwise `feasible` (or
`infeasible` when nothing is served), with each part's own status in the notes."""
from __future__ import annotations

import dataclasses
import time

from engine.plans.problem import DeviceSpec, Plan, PlanInstance, PlanStatus, Problem
from engine.solvers.assemble import PartPlan, composed_status, plan_from_instances, plan_objective
from engine.solvers.budget import problem_timed
from engine.solvers.ensembles import applications_to_split, ensemble_plan_merge, ensemble_problem_split
from engine.solvers.hosts import CpuHostUse
from engine.solvers.mixed import fleet_is_mixed, mixed_plan_solve
from engine.solvers.registry import DEFAULT_FLEET_PLANNER, DEFAULT_MPS_PLANNER, WHOLE_KINDS, PlannerInfo, planner_get

__all__ = ["plan_compose"]


def _without(problem: Problem, taken: set[str]) -> Problem:
    """The problem without the applications in `taken`, their variants and profiles, and without pipelines."""
    applications = tuple(a for a in problem.applications if a.name not in taken)
    variants = tuple(v for v in problem.variants if v.application not in taken)
    names = {v.name for v in variants}
    return dataclasses.replace(problem, applications=applications, variants=variants,
                               profiles=tuple(p for p in problem.profiles if p.variant in names), pipelines=())


def _devices_left(problem: Problem, hosts: CpuHostUse, *, grows_in_place: bool) -> tuple[DeviceSpec, ...]:
    """The devices the fleet planner plans on: every one no part uses, and a CPU host where a part placed
    instances as the cores they leave free (the same host, fewer cores), unless the parts' replicas grow
    in place (`grows_in_place`: sponge, biscale), whose room to grow those cores are. A pipeline's replicas
    take few cores of a host, and the fleet planners run one instance per host: without this, the rest
    of the host stood idle while an application that could run there went short."""
    left = []
    for device in problem.devices:
        used = hosts.used.get(device.name, 0) if device.is_cpu else 0
        if not used:
            left.append(device)
        elif not grows_in_place and (device.cores or 0) - used >= 1:
            left.append(dataclasses.replace(device, cores=(device.cores or 0) - used))
    return tuple(left)


def _fleet_plan(problem: Problem, chosen: PlannerInfo, deadline: float) -> Plan:
    """Step 4: the fleet planner on the problem left, in two stages on a mixed fleet."""
    base = chosen.name if chosen.kind in WHOLE_KINDS else DEFAULT_FLEET_PLANNER
    if fleet_is_mixed(problem) and not planner_get(base).plans_mps:
        mps_name = base if planner_get(base).kind == "mps" else DEFAULT_MPS_PLANNER
        other_name = DEFAULT_FLEET_PLANNER if planner_get(base).kind == "mps" else base
        return mixed_plan_solve(problem, mps_solver=mps_name, other_solver=other_name, mps_planner=planner_get(mps_name).strategy(),
                                other_planner=planner_get(other_name).strategy(), deadline=deadline)
    return planner_get(base).strategy()(problem_timed(problem, deadline, 1))


def plan_compose(problem: Problem, chosen: PlannerInfo, *, started: float | None = None) -> Plan:
    """Plan `problem` with the planner `chosen` (see the module docstring), within `options.time_limit_s`
    counted from `started` (a `time.perf_counter()` reading: when the caller was asked; default now)."""
    from engine.solvers.pipelines import pipeline_part_solve
    from engine.solvers.vertical import vertical_part_solve

    started = time.perf_counter() if started is None else started
    deadline = started + problem.options.time_limit_s
    original = problem
    if not chosen.reads_ensembles and applications_to_split(problem):
        problem = ensemble_problem_split(problem)  # step 1

    parts: list[PartPlan] = []
    hosts = CpuHostUse()
    taken: set[str] = set()
    vertical = chosen.kind == "vertical"
    if problem.pipelines and not chosen.plans_pipelines:  # step 2
        part = pipeline_part_solve(problem_timed(problem, deadline, 2 + vertical), hosts, solver=chosen.pipelines_by)
        parts.append(part)
        taken |= part.taken
    if vertical:  # step 3
        part = vertical_part_solve(problem_timed(_without(problem, taken), deadline, 2), hosts)
        parts.append(part)
        taken |= part.taken
    planned = [p for p in parts if p.taken]
    part_notes = [n for p in parts if not p.taken for n in p.notes]

    fleet: Plan | None = None
    fleet_notes: list[str] = []
    if not planned:  # step 4, on the whole problem
        fleet = _fleet_plan(problem, chosen, deadline)
    else:  # step 4, on what the parts left
        rest = _without(problem, taken)
        devices = _devices_left(rest, hosts, grows_in_place=vertical)
        if rest.applications and devices:
            fleet = _fleet_plan(dataclasses.replace(rest, devices=devices), chosen, deadline)
        elif rest.applications:
            fleet_notes.append(f"no device is left for the {len(rest.applications)} application(s) the other parts did not plan")

    if not planned and fleet is not None:  # one strategy planned the whole problem: its plan stands
        plan = ensemble_plan_merge(original, fleet) if problem is not original else fleet
        if parts:
            plan.solver = "+".join([p.solver for p in parts] + [fleet.solver])
            plan.notes[:0] = part_notes
        plan.solve_seconds = time.perf_counter() - started
        return plan
    return _merge(original, problem, planned, part_notes, fleet, fleet_notes, hosts, started)


def _merge(original: Problem, problem: Problem, parts: list[PartPlan], part_notes: list[str], fleet: Plan | None,
           fleet_notes: list[str], hosts: CpuHostUse, started: float) -> Plan:
    """Step 5: one plan of the parts and the fleet planner's plan."""
    fleet_instances = list(fleet.instances) if fleet is not None else []
    for k, inst in enumerate(fleet_instances):
        if problem.device(inst.device).is_cpu and hosts.used.get(inst.device):
            # Beside a part's replicas on the cores they left: numbered after them, its cores taken.
            hosts.take(inst.device, int(inst.slice))
            fleet_instances[k] = dataclasses.replace(inst, start=hosts.number(inst.device))
            fleet_notes.append(f"{inst.device}: {inst.variant} on {inst.slice} of the cores the other parts left free")
    instances: list[PlanInstance] = []
    notes: list[str] = list(part_notes)
    statuses: list[PlanStatus] = []
    for part in parts:
        instances.extend(part.finish(dict(hosts.used)) if part.finish is not None else part.instances)
        statuses.extend(part.statuses)
        notes.extend(part.notes)
    if fleet is not None:
        instances.extend(fleet_instances)
        statuses.append(fleet.status)
        notes.append(f"{fleet.solver} planned the applications the other parts left, on the devices they left: {fleet.status}")
        notes.extend(fleet.notes)
    notes.extend(fleet_notes)
    label = "+".join([p.solver for p in parts] + ([fleet.solver] if fleet is not None else []))
    plan = plan_from_instances(problem, instances, status="feasible", solver=label, objective=None, bound=None, gap=None,
                               solve_seconds=0.0, layouts=fleet.layouts if fleet is not None else None, notes=notes)
    plan.pipelines = {name: summary for part in parts for name, summary in part.pipelines.items()}
    if problem is not original:
        plan = ensemble_plan_merge(original, plan)
    plan.objective = plan_objective(original, plan)
    # Pipelines alone are separable: each minimises its own instances on cores no other part uses.
    separable = fleet is None and not fleet_notes and all(p.pipelines for p in parts)
    plan.status = composed_status(original, plan, statuses, separable=separable)
    parts_text = [f"{p.solver} {'/'.join(sorted(set(p.statuses))) or 'nothing to plan'}" for p in parts]
    parts_text += [f"{fleet.solver} {fleet.status}"] if fleet is not None else []
    plan.notes.insert(0, f"composed plan ({label}): {', '.join(parts_text)}; the whole is {plan.status}"
                         + ("" if plan.status == "optimal" else " (a split of the fleet decided before solving proves no optimum)"))
    plan.solve_seconds = time.perf_counter() - started
    return plan
