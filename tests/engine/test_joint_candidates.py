"""The joint planner's MIG geometry candidates under a reconfiguration penalty (issue 16, finding 5): they
include the current layout and non-maximal layouts, and a penalised plan never scores worse than the best
plan that keeps every current instance (found here by brute force: every valid layout that contains the
current one, planned as a fixed layout, less the penalty for the instances it adds)."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import layout_counts, layout_parse, mig_layouts_enumerate
from engine.plans.problem import Problem, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.joint import candidate_counts, candidate_layouts, joint_fleet
from engine.solvers.solve import plan_solve
from tests.engine.test_solvers_milp import A100, random_problem

SPEC = mig_catalogue_load().gpu_model_get(A100)
# Objectives carry the variant-change tie-break (1e-6 per instance); keep-plans and joint plans may differ by it.
SCORE_TOL = 1e-5


def _flat(variant: str, slice_name: str, latency_ms: float) -> dict[str, Any]:
    return {"variant": variant, "device_type": A100, "slice": slice_name, "batch": 1, "latency_ms": latency_ms}


def one_more_small_app(penalty: float, objective: str = "max-accuracy") -> Problem:
    """`a` runs on the current 4g.20gb; `b` only has a 1g.5gb profile and needs one such instance. Adding
    1g.5gb@4 beside 4g.20gb@0 is one change; every maximal layout keeping 4g.20gb@0 adds two or three."""
    return problem_from_dict({
        "applications": [{"name": "a", "slo_ms": 100, "demand_rps": 100}, {"name": "b", "slo_ms": 100, "demand_rps": 40}],
        "variants": [{"name": "a1", "application": "a", "accuracy": 0.8}, {"name": "b1", "application": "b", "accuracy": 0.7}],
        "devices": [{"name": "m0", "type": A100, "mig": True, "layout": ["4g.20gb@0"], "running": {"4g.20gb@0": "a1"}}],
        "profiles": [_flat("a1", "4g.20gb", 10.0), _flat("b1", "1g.5gb", 20.0)],
        "options": {"reconfiguration_penalty": penalty, "objective": objective},
    })


def best_keeping_score(problem: Problem) -> float | None:
    """The best score (the objective, negated under min-gpus so that higher is better) of a plan that serves
    all demand and keeps every current MIG instance: the layout stays as it is or gains instances beside
    it (every valid superset, tried as a fixed layout). None when no such plan serves all demand."""
    assert len(problem.devices) == 1 and problem.devices[0].layout
    device = problem.devices[0]
    current = set(device.layout)
    penalty = problem.options.reconfiguration_penalty
    sign = 1.0 if problem.options.objective == "max-accuracy" else -1.0
    best = None
    for layout in mig_layouts_enumerate(SPEC):
        if not current <= set(layout):
            continue
        fixed = dataclasses.replace(device, layout=layout, fixed_layout=True)
        plan = plan_solve(dataclasses.replace(problem, devices=(fixed,)), "proteus")
        if plan.status == "infeasible" or sum(plan.shortfall_rps.values()) > 1e-6:
            continue  # compare plans that serve all demand (the objective means the same then)
        score = sign * plan.objective - penalty * (len(layout) - len(current))
        best = score if best is None else max(best, score)
    return best


def test_candidates_include_the_current_layout_and_non_maximal_ones() -> None:
    problem = one_more_small_app(0.01)
    configs = joint_fleet(problem).device_classes[0].configs
    layouts = {tuple(sorted(map(str, c.layout))): c.instances_changed for c in configs if c.layout is not None and c.uses_device}
    assert layouts[("4g.20gb@0",)] == 0  # the current layout, unchanged
    assert layouts[("1g.5gb@4", "4g.20gb@0")] == 1  # one instance added: not a maximal layout
    maximal = {tuple(sorted(layout_counts(layout).items())) for layout in mig_layouts_enumerate(SPEC, maximal=True)}
    assert any(tuple(sorted(layout_counts(layout_parse(list(k))).items())) not in maximal for k in layouts)
    # Without a penalty every change is free and the maximal geometries are all that is needed.
    free = joint_fleet(one_more_small_app(0.0)).device_classes[0].configs
    assert len([c for c in free if c.layout is not None and c.uses_device and c.name != "current"]) == len(candidate_counts(SPEC))


def test_candidates_drop_only_dominated_layouts() -> None:
    current = tuple(layout_parse(["4g.20gb@0"]))
    candidates = candidate_layouts(SPEC, current, True)
    for layout, changed in candidates:
        counts = layout_counts(layout)
        for other, other_changed in candidates:
            other_counts = layout_counts(other)
            if other != layout and other_changed <= changed:
                assert not all(other_counts.get(p, 0) >= n for p, n in counts.items()), (layout, other)
    assert all("+me" not in p.profile for layout, _ in candidates for p in layout)


@pytest.mark.parametrize("objective", ["max-accuracy", "min-gpus"])
def test_one_change_beats_a_maximal_layout(objective: str) -> None:
    problem = one_more_small_app(0.01, objective)
    plan = plan_solve(problem, "joint")
    assert plan_validate(problem, plan).valid
    assert sorted(plan.layouts["m0"]) == ["1g.5gb@4", "4g.20gb@0"]
    keep = best_keeping_score(problem)
    score = plan.objective if objective == "max-accuracy" else -plan.objective
    assert keep is not None and score >= keep - SCORE_TOL
    assert any("1 MIG instances destroyed or created" in n for n in plan.notes), plan.notes


CURRENT_LAYOUTS = (["3g.20gb@4"], ["4g.20gb@0"], ["2g.10gb@0", "3g.20gb@4"], ["3g.20gb@0", "2g.10gb@4"])


@pytest.mark.parametrize("current", CURRENT_LAYOUTS, ids="+".join)
@pytest.mark.parametrize("seed", [1, 2])
def test_penalised_plan_never_worse_than_keeping_every_instance(current: list[str], seed: int) -> None:
    device = {"name": "m0", "type": A100, "mig": True, "layout": current}
    base = random_problem(seed, [device], apps=2, variants=2, load=0.5)
    for penalty in (0.003, 0.03):
        problem = dataclasses.replace(base, options=dataclasses.replace(base.options, reconfiguration_penalty=penalty))
        plan = plan_solve(problem, "joint")
        assert plan.status == "optimal"
        if sum(plan.shortfall_rps.values()) > 1e-6:
            continue
        keep = best_keeping_score(problem)
        if keep is not None:  # else no plan keeping every instance serves all demand: nothing to compare with
            assert plan.objective >= keep - SCORE_TOL, (penalty, plan.layouts, plan.objective, keep)
