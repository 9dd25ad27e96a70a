"""Spare capacity (engine/solvers/spare.py): with `spare_capacity: fill` (the default) every device the
MILP leaves idle gets the most accurate variant of the application with the least headroom, or keeps what
runs there; each application's traffic is then spread so that its busiest instance is as far below
capacity as the solver's accuracy allows. The plan still passes the independent validator, serves the
same traffic at no less accuracy, and `idle` keeps the paper's plan (idle devices)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from engine.plans.problem import ProblemError, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.solve import plan_solve
from engine.solvers.spare import traffic_spread, traffic_spread_even


def problem_dict(*, demand: dict[str, float] | None = None, gpus: int = 4, spare: str | None = None, objective: str = "max-accuracy") -> dict:
    """Two applications on `gpus` whole GPUs of one made-up type (stated fixture): each has an accurate slow
    variant and a fast less accurate one. At the default demand the MILP needs two GPUs."""
    demand = demand or {"vision": 150.0, "text": 100.0}
    raw = {
        "applications": [{"name": name, "slo_ms": 100.0, "demand_rps": rps} for name, rps in demand.items()],
        "variants": [
            {"name": "vision-large", "application": "vision", "accuracy": 0.9, "memory_mb": 100},
            {"name": "vision-small", "application": "vision", "accuracy": 0.7, "memory_mb": 100},
            {"name": "text-large", "application": "text", "accuracy": 0.95, "memory_mb": 100},
            {"name": "text-small", "application": "text", "accuracy": 0.8, "memory_mb": 100},
        ],
        "devices": [{"name": f"gpu{i}", "type": "T", "memory_mb": 16_000} for i in range(gpus)],
        # Batch 4 in 20 ms (200 rps) for the large variants, in 8 ms (500 rps) for the small ones.
        "profiles": [
            {"variant": v, "device_type": "T", "slice": "full", "batch": b, "latency_ms": ms * b / 4}
            for v, ms in (("vision-large", 20.0), ("vision-small", 8.0), ("text-large", 20.0), ("text-small", 8.0)) for b in (1, 2, 4)
        ],
        "options": {"objective": objective, **({"spare_capacity": spare} if spare else {})},
    }
    return raw


def utilisation_max(plan, app: str, problem) -> float:
    return max(i.assigned_rps / i.capacity_rps for i in plan.instances if problem.variant(i.variant).application == app and i.assigned_rps > 0)


def test_idle_devices_are_filled_and_traffic_spread_at_the_solvers_accuracy() -> None:
    idle = problem_from_dict(problem_dict(spare="idle"))
    fill = problem_from_dict(problem_dict())
    assert fill.options.spare_capacity == "fill"  # the default
    before, after = plan_solve(idle, "proteus"), plan_solve(fill, "proteus")
    assert {i.device for i in before.instances} == {"gpu0", "gpu1"}  # the paper's Eq. (1): two GPUs idle
    assert {i.device for i in after.instances} == {"gpu0", "gpu1", "gpu2", "gpu3"}
    for plan, problem in ((before, idle), (after, fill)):
        verdict = plan_validate(problem, plan)
        assert verdict.valid, verdict.errors
    for app in ("vision", "text"):
        assert math.isclose(after.served_rps[app], before.served_rps[app], rel_tol=1e-9)
        assert after.accuracy_by_application[app] >= before.accuracy_by_application[app] - 1e-9
        assert utilisation_max(after, app, fill) < utilisation_max(before, app, idle) - 0.2
    # The least-headroom application gets the first spare device: vision (150 rps on 200) before text (100 on 200).
    spare_apps = [fill.variant(i.variant).application for i in after.instances if i.device in ("gpu2", "gpu3")]
    assert spare_apps == ["vision", "text"]
    # The spare devices run each application's most accurate variant.
    assert {i.variant for i in after.instances if i.device in ("gpu2", "gpu3")} == {"vision-large", "text-large"}
    assert any("spare capacity: 2 idle devices" in n for n in after.notes)
    assert after.objective == pytest.approx(before.objective) and after.status == before.status


def test_a_spare_device_keeps_the_model_it_runs() -> None:
    raw = problem_dict()
    raw["devices"][3]["running"] = {"full": "text-small"}
    raw["devices"][2]["running"] = {"full": "text-large"}
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "proteus")
    assert plan_validate(problem, plan).valid
    on = {i.device: i.variant for i in plan.instances}
    # The MILP keeps text-large where it runs (gpu2) at no cost; the spare device gpu3 keeps its model,
    # text-small, rather than loading text's most accurate variant or vision's (less headroom).
    assert on["gpu2"] == "text-large" and on["gpu3"] == "text-small"


def test_min_gpus_and_infeasible_plans_are_not_filled() -> None:
    problem = problem_from_dict(problem_dict(objective="min-gpus"))
    plan = plan_solve(problem, "proteus")
    assert len({i.device for i in plan.instances}) == 2
    over = problem_from_dict(problem_dict(demand={"vision": 5000.0, "text": 5000.0}))
    plan = plan_solve(over, "proteus")
    assert plan_validate(over, plan).valid
    assert len(plan.instances) == 4  # overloaded: the MILP uses every GPU itself


def test_spare_capacity_option_is_checked() -> None:
    with pytest.raises(ProblemError, match="spare_capacity"):
        problem_from_dict(problem_dict(spare="sometimes"))


def test_traffic_spread_minimises_the_busiest_instance_at_the_accuracy_floor() -> None:
    # Two instances: accurate (cap 100, acc 0.9) and fast (cap 300, acc 0.6); 100 rps at accuracy 0.9 x 100.
    rates = traffic_spread(100.0, [100.0, 300.0], [0.9, 0.6], 90.0)
    assert rates == pytest.approx([100.0, 0.0], abs=1e-6)  # the floor forces everything onto the accurate one
    # Floor at the fast one's accuracy: equal utilisation, 25 % each.
    rates = traffic_spread(100.0, [100.0, 300.0], [0.9, 0.6], 60.0)
    assert rates == pytest.approx([25.0, 75.0], abs=1e-6)
    # Equal accuracy: equal utilisation.
    rates = traffic_spread(120.0, [100.0, 200.0, 300.0], [0.8, 0.8, 0.8], 96.0)
    assert rates == pytest.approx([20.0, 40.0, 60.0], abs=1e-6)
    assert sum(traffic_spread(50.0, [30.0, 30.0], [0.5, 0.9], 0.0)) == pytest.approx(50.0)
    assert traffic_spread(0.0, [10.0], [0.5], 0.0) == [0.0]


def test_joint_planner_fills_whole_gpus_too() -> None:
    problem = problem_from_dict(problem_dict())
    plan = plan_solve(dataclasses.replace(problem), "joint")
    assert plan_validate(problem, plan).valid
    assert len({i.device for i in plan.instances}) == 4


def test_artefact_mode_fills_and_spreads_evenly() -> None:
    """`spare_capacity: artefact`, Proteus's artefact: the same fill, then an equal share per instance
    (capped at capacity), whatever the accuracy; the plan still validates."""
    problem = problem_from_dict(problem_dict(spare="artefact"))
    plan = plan_solve(problem, "proteus")
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert len({i.device for i in plan.instances}) == 4
    for app in ("vision", "text"):
        rates = [i.assigned_rps for i in plan.instances if problem.variant(i.variant).application == app]
        assert max(rates) - min(rates) < 1e-6  # equal shares (no cap binds at this load)
    assert any("spread evenly" in n for n in plan.notes)


def test_even_spread_shares_equally_up_to_each_capacity() -> None:
    assert traffic_spread_even(90.0, [100.0, 100.0, 100.0]) == pytest.approx([30.0, 30.0, 30.0])
    # A small instance is capped; what it cannot take goes evenly to the others.
    assert traffic_spread_even(90.0, [10.0, 100.0, 100.0]) == pytest.approx([10.0, 40.0, 40.0])
    assert traffic_spread_even(0.0, [5.0]) == [0.0]
    assert traffic_spread_even(50.0, [0.0, 100.0]) == pytest.approx([0.0, 50.0])

