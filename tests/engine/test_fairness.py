"""Overload: when demand exceeds what the fleet can serve, no application is starved while another is fully
served, unless an SLO policy's priority says so (issue 16, finding 5).

The fleets are identical whole GPUs, one instance each, and application i's demand is `factor` times its
even share of the fleet (N / n GPUs of its fastest variant). The best smallest served fraction is then
exactly 1 / factor: every application on N / n GPUs. Serving the most traffic instead (what the planners
did before) gives every GPU to the applications with the most queries per GPU and nothing to the rest."""
from __future__ import annotations

from typing import Any

import pytest

from engine.plans.problem import DEFAULT_PRIORITY, Plan, Problem, ProblemError, problem_from_dict, problem_to_dict
from engine.plans.schema import json_validate, problem_schema
from engine.plans.validate import plan_validate
from engine.reference.generate import mig_fleet_problem
from engine.solvers.solve import plan_solve
from tests.engine.test_solvers_milp import OBJ_TOL, brute_force

V100 = "V100-16GB"
# Fastest variant's queries per second on one GPU, per application; the accurate variant serves a third.
SPEEDS = (400.0, 300.0, 200.0, 150.0, 100.0)


def overload_problem(n_apps: int, n_gpus: int, factor: float, priorities: dict[str, int] | None = None) -> Problem:
    apps: list[dict[str, Any]] = []
    variants: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    for i in range(n_apps):
        app, speed = f"app{i}", SPEEDS[i]
        raw_app: dict[str, Any] = {"name": app, "slo_ms": 100, "demand_rps": factor * n_gpus * speed / n_apps}
        if priorities and app in priorities:
            raw_app["priority"] = priorities[app]
        apps.append(raw_app)
        for name, accuracy, latency in ((f"{app}-fast", 0.7, 1000 / speed), (f"{app}-slow", 0.9, 3000 / speed)):
            variants.append({"name": name, "application": app, "accuracy": accuracy})
            profiles.append({"variant": name, "device_type": V100, "slice": "full", "batch": 1, "latency_ms": latency})
    devices = [{"name": f"v{k:02d}", "type": V100, "memory_mb": 16000} for k in range(n_gpus)]
    return problem_from_dict({"applications": apps, "variants": variants, "devices": devices, "profiles": profiles})


def served_fractions(problem: Problem, plan: Plan) -> dict[str, float]:
    return {a.name: plan.served_rps[a.name] / a.demand_rps for a in problem.applications if a.demand_rps > 0}


def assert_no_starvation(problem: Problem, plan: Plan) -> None:
    """While some application is fully served, none of equal or higher priority gets nothing."""
    fractions = served_fractions(problem, plan)
    for full in (a for a in problem.applications if fractions.get(a.name, 0) >= 1 - 1e-6):
        for other in problem.applications:
            if other.demand_rps > 0 and other.priority_tier >= full.priority_tier:
                assert fractions[other.name] > 1e-6, f"{other.name} starved while {full.name} is fully served: {fractions}"


@pytest.mark.parametrize("n_apps,n_gpus", [(2, 4), (5, 10)])
@pytest.mark.parametrize("factor", [1.5, 3.0])
@pytest.mark.parametrize("solver", ["proteus", "joint"])
@pytest.mark.parametrize("objective", ["max-accuracy", "min-gpus"])
def test_overload_gives_every_application_an_equal_share(n_apps: int, n_gpus: int, factor: float, solver: str, objective: str) -> None:
    problem = overload_problem(n_apps, n_gpus, factor)
    plan = plan_solve(problem, solver, objective=objective)
    assert plan.status == "optimal", plan.notes
    assert plan_validate(problem, plan).valid, plan_validate(problem, plan)
    fractions = served_fractions(problem, plan)
    for name, fraction in fractions.items():
        assert fraction == pytest.approx(1 / factor, rel=1e-5), fractions
    assert_no_starvation(problem, plan)
    assert any("fair shares" in n for n in plan.notes), plan.notes
    assert any("lexicographic" in n for n in plan.notes), plan.notes


def test_fair_shares_then_most_traffic_then_accuracy() -> None:
    """Five applications on twelve GPUs: two GPUs each is the fair share (2 x 5 / (3 x 12) of demand), and
    the two GPUs left over go where they serve the most, the fastest application (400 rps per GPU)."""
    problem = overload_problem(5, 12, 3.0)
    plan = plan_solve(problem, "proteus")
    fractions = served_fractions(problem, plan)
    share = 2 * 5 / (3.0 * 12)
    assert min(fractions.values()) == pytest.approx(share, rel=1e-5)
    assert fractions["app0"] == pytest.approx(4 * 5 / (3.0 * 12), rel=1e-5)
    assert plan.total_served_rps == pytest.approx(2 * sum(SPEEDS) + 2 * SPEEDS[0], rel=1e-6)
    # Every GPU runs a fast variant (a slow one would serve a third as much), so accuracy is 0.7 throughout.
    assert plan.objective == pytest.approx(0.7 * plan.total_served_rps / problem.total_demand_rps, abs=OBJ_TOL)


def test_mig_fleet_overload_starves_nobody() -> None:
    for load in (1.5, 3.0):
        problem = mig_fleet_problem(4, seed=0, load=load, current_layout=["3g.20gb@0", "3g.20gb@4"])
        plan = plan_solve(problem, "joint", mip_gap=0.01)
        assert plan_validate(problem, plan).valid
        fractions = served_fractions(problem, plan)
        assert min(fractions.values()) > 0.1, fractions
        assert_no_starvation(problem, plan)


@pytest.mark.parametrize("solver", ["proteus", "joint"])
def test_priority_is_served_first(solver: str) -> None:
    # app1 serves less per GPU than app0, so most-traffic alone would favour app0; its priority decides.
    problem = overload_problem(2, 4, 3.0, priorities={"app1": 80})
    fractions = served_fractions(problem, plan_solve(problem, solver))
    assert fractions == pytest.approx({"app0": 0.0, "app1": 4 / 6}, abs=1e-6)  # 6 GPUs' worth of demand, 4 GPUs
    problem = overload_problem(2, 4, 1.5, priorities={"app1": 80})
    fractions = served_fractions(problem, plan_solve(problem, solver))
    assert fractions == pytest.approx({"app0": 1 / 3, "app1": 1.0}, abs=1e-6)  # app1 needs 3, app0 gets the last
    # Two tiers on twelve GPUs at 1.5x (6 GPUs' worth each): app2 takes six, app0 and app1 (equal, below) three each.
    problem = overload_problem(3, 12, 1.5, priorities={"app2": 90, "app0": 10, "app1": 10})
    plan = plan_solve(problem, solver)
    fractions = served_fractions(problem, plan)
    assert fractions == pytest.approx({"app0": 0.5, "app1": 0.5, "app2": 1.0}, abs=1e-6)
    assert_no_starvation(problem, plan)


def test_without_overload_the_plan_is_the_accuracy_optimum() -> None:
    """No fair-share stage runs when all demand can be served: the plan is the max-accuracy optimum."""
    problem = overload_problem(2, 4, 0.6)
    plan = plan_solve(problem, "proteus")
    expected = brute_force(problem, joint=False)
    assert expected.full_feasible
    assert plan.objective == pytest.approx(expected.accuracy, abs=OBJ_TOL)
    assert not any("fair shares" in n or "lexicographic" in n for n in plan.notes), plan.notes


def test_one_application_overloaded_is_most_traffic_then_accuracy() -> None:
    problem = overload_problem(1, 3, 2.0)
    plan = plan_solve(problem, "proteus")
    assert plan.total_served_rps == pytest.approx(3 * SPEEDS[0])
    assert not any("fair shares" in n for n in plan.notes), plan.notes


def test_priority_in_the_problem_format() -> None:
    problem = overload_problem(2, 2, 1.0, priorities={"app0": 70})
    assert [a.priority for a in problem.applications] == [70, None]
    assert [a.priority_tier for a in problem.applications] == [70, DEFAULT_PRIORITY]
    raw = problem_to_dict(problem)
    json_validate(raw, problem_schema())
    assert raw["applications"][0]["priority"] == 70 and "priority" not in raw["applications"][1]
    assert problem_from_dict(raw).applications == problem.applications
    for bad, message in ((101, "must be <= 100"), (-1, "must be >= 0"), (2.5, "whole number"), ("high", "finite number")):
        raw["applications"][0]["priority"] = bad
        with pytest.raises(ProblemError, match=rf"applications\[0\] \(app0\)\.priority: .*{message}"):
            problem_from_dict(raw)
