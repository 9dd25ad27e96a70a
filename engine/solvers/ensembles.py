"""Planning in rows: ensemble applications and applications whose queries carry several rows, for planners
that know one variant per one-row query (proteus, joint, fleet, the baselines, garrison-demand, the MPS
and pipeline planners).

An instance's capacity counts rows (a batch of b rows per run), and a plan's `served_rps` counts queries:
served = the rows assigned / the application's load factor (`ApplicationSpec.load_factor`: mean query size x
mean ensemble size). `ensemble_problem_split` writes the problem in rows, so a planner that fills demand
rows fills what the plan counts:
- each application whose ensemble policy draws several members per query (mode random or learned) becomes
  one application per member with a sampling probability > 0: the member its only variant, its demand the
  rows it serves (the application's demand x the member's inclusion rate, the mean over the ensemble sizes
  of the inclusion probabilities (engine/ensembles/sampling.py), x the mean query size), the same SLO and
  priority;
- an application with `query_sizes` whose mean is not 1 (and that is no pipeline's stage, whose rates are
  its pipeline's) keeps its name and variants, its demand in rows (demand x mean query size).
`split_owners` says, for each application of the split problem, which original application it serves and
how many queries a row of it is worth (1 / load factor): the fleet model (model.py) counts fair shares,
served traffic, minimum accuracy and accuracy per original application through it, so an ensemble is
planned whole there; the other planners treat each member as an application of its own.
`ensemble_plan_merge` puts the plan back on the original problem: the instances are the same (a variant's
name is unchanged), and served traffic, shortfall and routing are recomputed per original application by
`plan_from_instances`. The `garrison` planner (Algorithm 1) reads ensembles and query sizes itself and is
not split.
"""
from __future__ import annotations

import dataclasses

from engine.ensembles.sampling import inclusion_probabilities
from engine.plans.problem import ApplicationSpec, Plan, Problem
from engine.solvers.assemble import plan_from_instances

__all__ = ["applications_to_split", "ensemble_member_rates", "ensemble_plan_merge", "ensemble_problem_split", "ensembles_to_split",
           "split_owners"]

# Separates an ensemble application's name from its member's in the split problem's application names.
SEPARATOR = "::"


def ensembles_to_split(problem: Problem) -> list[ApplicationSpec]:
    return [a for a in problem.applications if a.ensemble is not None and a.ensemble.mode != "single"]


def _query_sized(problem: Problem) -> list[ApplicationSpec]:
    """Applications whose queries carry more (or fewer) than one row on average, outside ensembles and pipelines."""
    staged = {st.application for p in problem.pipelines for st in p.stages}
    return [a for a in problem.applications
            if a.mean_query_size != 1.0 and a.name not in staged and (a.ensemble is None or a.ensemble.mode == "single")]


def applications_to_split(problem: Problem) -> list[ApplicationSpec]:
    """The applications `ensemble_problem_split` rewrites: random ensembles and query-sized applications."""
    return ensembles_to_split(problem) + _query_sized(problem)


def ensemble_member_rates(app: ApplicationSpec) -> dict[str, float]:
    """Each member's share of the application's queries it answers (its inclusion rate)."""
    assert app.ensemble is not None
    members = [m for m in app.ensemble.members if m.probability > 0]
    sizes = range(app.ensemble.min_size, app.ensemble.max_size + 1)
    rates = sum(inclusion_probabilities([m.probability for m in members], k) for k in sizes) / len(sizes)
    return {m.variant: float(r) for m, r in zip(members, rates)}


def ensemble_problem_split(problem: Problem) -> Problem:
    """The problem in rows (see the module docstring); the problem itself when nothing needs rewriting."""
    split = {a.name: a for a in ensembles_to_split(problem)}
    sized = {a.name for a in _query_sized(problem)}
    if not split and not sized:
        return problem
    applications: list[ApplicationSpec] = []
    owner: dict[str, str] = {}  # member variant -> its application in the split problem
    for app in problem.applications:
        if app.name in sized:
            applications.append(dataclasses.replace(app, demand_rps=app.demand_rps * app.mean_query_size, query_sizes=None))
            continue
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


def split_owners(problem: Problem) -> dict[str, tuple[str, float]]:
    """For each application `ensemble_problem_split(problem)` rewrites or makes: (the application of
    `problem` it serves, the queries one of its rows is worth: 1 / that application's load factor)."""
    owners = {a.name: (a.name, 1.0 / a.load_factor) for a in _query_sized(problem)}
    for app in ensembles_to_split(problem):
        owners.update({f"{app.name}{SEPARATOR}{member}": (app.name, 1.0 / app.load_factor) for member in ensemble_member_rates(app)})
    return owners


def ensemble_plan_merge(problem: Problem, plan: Plan, *, whole: bool = False) -> Plan:
    """`plan` (made for the split problem) on the original `problem`. `whole`: the planner counted each
    ensemble as one application (`split_owners`), which the note then says."""
    ensembles, sized = ensembles_to_split(problem), _query_sized(problem)
    if not ensembles and not sized:
        return plan
    how = "planned whole: one fair share and one served fraction per ensemble, over" if whole else "planned as"
    notes = list(plan.notes) + [f"ensembles: {a.name} {how} one application per member ({', '.join(ensemble_member_rates(a))}), "
                                f"each for its share of the rows" for a in ensembles]
    notes += [f"{a.name}: planned in rows ({a.mean_query_size:g} rows per query on average)" for a in sized]
    merged = plan_from_instances(problem, list(plan.instances), status=plan.status, solver=plan.solver, objective=plan.objective,
                                 bound=plan.bound, gap=plan.gap, solve_seconds=plan.solve_seconds, layouts=plan.layouts, notes=notes)
    return dataclasses.replace(merged, pipelines=plan.pipelines)
