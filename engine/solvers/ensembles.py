"""Planning ensemble applications with planners that know one variant per query (proteus, joint, the
baselines, garrison-demand, the MPS and pipeline planners): each member of a random ensemble must serve its
own share of the queries, so it is planned as an application of its own.

`ensemble_problem_split` replaces each application whose ensemble policy draws several members per query
(mode random or learned) by one application per member with a sampling probability > 0: the member its
only variant, its demand the rows it serves (the application's demand x the member's inclusion rate, the
mean over the ensemble sizes of the inclusion probabilities (engine/ensembles/sampling.py), x the mean
query size), the same SLO and priority. `ensemble_plan_merge` puts the plan back on the original problem:
the instances are the same (a variant's name is unchanged), and served traffic, shortfall and routing are
recomputed per original application by `plan_from_instances` (served = rows / the application's load
factor). The `garrison` planner (Algorithm 1) reads ensembles itself and is not split.
"""
from __future__ import annotations

import dataclasses

from engine.ensembles.sampling import inclusion_probabilities
from engine.plans.problem import ApplicationSpec, Plan, Problem
from engine.solvers.assemble import plan_from_instances

__all__ = ["ensemble_member_rates", "ensemble_plan_merge", "ensemble_problem_split", "ensembles_to_split"]

# Separates an ensemble application's name from its member's in the split problem's application names.
SEPARATOR = "::"


def ensembles_to_split(problem: Problem) -> list[ApplicationSpec]:
    return [a for a in problem.applications if a.ensemble is not None and a.ensemble.mode != "single"]


def ensemble_member_rates(app: ApplicationSpec) -> dict[str, float]:
    """Each member's share of the application's queries it answers (its inclusion rate)."""
    assert app.ensemble is not None
    members = [m for m in app.ensemble.members if m.probability > 0]
    sizes = range(app.ensemble.min_size, app.ensemble.max_size + 1)
    rates = sum(inclusion_probabilities([m.probability for m in members], k) for k in sizes) / len(sizes)
    return {m.variant: float(r) for m, r in zip(members, rates)}


def ensemble_problem_split(problem: Problem) -> Problem:
    """The problem with each ensemble application replaced by one application per member (see the module
    docstring); the problem itself when it has none."""
    split = {a.name: a for a in ensembles_to_split(problem)}
    if not split:
        return problem
    applications: list[ApplicationSpec] = []
    owner: dict[str, str] = {}  # member variant -> its application in the split problem
    for app in problem.applications:
        if app.name not in split:
            applications.append(app)
            continue
        for member, rate in ensemble_member_rates(app).items():
            name = f"{app.name}{SEPARATOR}{member}"
            owner[member] = name
            applications.append(ApplicationSpec(name=name, slo_ms=app.slo_ms, demand_rps=app.demand_rps * rate * app.mean_query_size,
                                                priority=app.priority))
    variants = tuple(dataclasses.replace(v, application=owner[v.name]) if v.name in owner else v
                     for v in problem.variants if v.application not in split or v.name in owner)
    return dataclasses.replace(problem, applications=tuple(applications), variants=variants)


def ensemble_plan_merge(problem: Problem, plan: Plan) -> Plan:
    """`plan` (made for the split problem) on the original `problem`."""
    split = ensembles_to_split(problem)
    if not split:
        return plan
    notes = list(plan.notes) + [f"ensembles: {a.name} planned as one application per member ({', '.join(ensemble_member_rates(a))}), "
                                f"each for its share of the rows" for a in split]
    merged = plan_from_instances(problem, list(plan.instances), status=plan.status, solver=plan.solver, objective=plan.objective,
                                 bound=plan.bound, gap=plan.gap, solve_seconds=plan.solve_seconds, layouts=plan.layouts, notes=notes)
    return dataclasses.replace(merged, pipelines=plan.pipelines)
