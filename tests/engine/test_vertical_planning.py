"""The vertical planners: `plan_solve(problem, "sponge")` sizes each CPU application's instance (Algorithm 3
on one stage, over the profiled core counts) and hands it the bounds and latency model the agents' fast
loop resizes it by; `"biscale"` plans pipelines by Algorithm 4 (FA2's DP on one-core replicas) with the
same in-place scaling and each stage's reserve for the stages after it. Plans pass the validator and the
schema, and the validator refuses vertical scaling where it cannot be."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.cli import app as cli_app
from engine.plans.problem import VerticalScaling, plan_from_dict, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.solve import plan_solve
from engine.solvers.vertical import vertical_apps, vertical_model_from_profiles
from tests.engine.test_pipeline_planning import _assert_valid, _profile, _raw


def _raw_with_cpu_app(demand: float = 60.0, **extra: Any) -> dict[str, Any]:
    raw = _raw()
    raw["applications"].append({"name": "tab", "slo_ms": 100, "demand_rps": demand, **extra})
    raw["variants"] += [{"name": "tab-1", "application": "tab", "accuracy": 0.7}, {"name": "tab-0", "application": "tab", "accuracy": 0.5}]
    raw["profiles"] += _profile("tab-1", 1, 4, 1.5) + _profile("tab-1", 2, 4, 1.5) + _profile("tab-1", 4, 4, 1.5) + _profile("tab-0", 1, 2, 1)
    return raw


def test_sponge_gives_each_cpu_application_one_instance_it_may_resize_in_place() -> None:
    problem = problem_from_dict(_raw_with_cpu_app())
    assert vertical_apps(problem) == ["other", "tab"]  # CPU-only applications outside the pipeline
    plan = plan_solve(problem, "sponge")
    _assert_valid(problem, plan)
    (tab,) = [i for i in plan.instances if i.variant.startswith("tab")]
    assert tab.variant == "tab-1"  # the most accurate variant with profiles at several core counts
    v = tab.vertical
    # Room to grow: the host's 8 cores, but no further than the model was fitted on (profiles at 1, 2 and 4 cores).
    assert v is not None and v.policy == "sponge" and v.min_cores == 1 and v.max_cores == 4 and v.reserve_ms == 0
    model = vertical_model_from_profiles(problem, "tab-1")
    assert (v.gamma1, v.eps1) == (round(model.gamma1, 6), round(model.eps1, 6))
    # The plan's size is the fewest profiled cores, then the smallest batch, within the latency budget.
    assert tab.slice == "1" and tab.assigned_rps == pytest.approx(60.0)
    # "other" has profiles at one core count only: no model, so proteus plans it at a fixed size.
    assert all(i.vertical is None for i in plan.instances if i.variant == "oth")
    assert any("other: no variant has CPU profiles at two or more core counts" in n for n in plan.notes)
    # The pipeline is FA2's, at fixed sizes.
    assert all(i.vertical is None for i in plan.instances if i.variant.startswith(("det", "cls")))


def test_more_load_than_the_largest_profiled_size_serves_adds_instances_of_that_size() -> None:
    problem = problem_from_dict(_raw_with_cpu_app(demand=2000.0))
    plan = plan_solve(problem, "sponge")
    _assert_valid(problem, plan)
    tabs = [i for i in plan.instances if i.variant == "tab-1"]
    assert len(tabs) > 1 and len({i.slice for i in tabs}) == 1
    assert any("one instance of tab-1 serves" in n for n in plan.notes)


def test_biscale_plans_pipelines_on_one_core_replicas_with_room_to_grow_and_a_reserve_for_later_stages() -> None:
    problem = problem_from_dict(_raw_with_cpu_app())
    plan = plan_solve(problem, "biscale")
    _assert_valid(problem, plan)
    assert plan.solver.startswith("biscale+sponge")
    stages = plan.pipelines["video"]["stages"]
    detect = [i for i in plan.instances if i.variant.startswith("det")]
    classify = [i for i in plan.instances if i.variant.startswith("cls")]
    assert detect and classify and all(i.vertical is not None and i.vertical.policy == "biscale" for i in detect + classify)
    # The first stage keeps the second's planned time for it; the last keeps nothing.
    assert detect[0].vertical.reserve_ms == stages["classify"]["budget_ms"] > 0
    assert classify[0].vertical.reserve_ms == 0
    assert "vertical" in stages["detect"]
    # Room to grow: every core of the host that no planned instance holds, up to the most the variant was
    # profiled at (det-l: 4 cores; cls-l: 2).
    host = problem.device(detect[0].device)
    held = sum(int(i.slice) for i in plan.instances if i.device == host.name)
    assert detect[0].vertical.max_cores == min(int(detect[0].slice) + host.cores - held, 4)
    assert classify[0].vertical.max_cores == 2
    assert [i for i in plan.instances if i.variant == "tab-1"][0].vertical.policy == "sponge"


def test_the_validator_refuses_vertical_scaling_it_cannot_carry_out() -> None:
    problem = problem_from_dict(_raw_with_cpu_app())
    plan = plan_solve(problem, "sponge")
    (tab,) = [i for i in plan.instances if i.variant == "tab-1"]

    def with_vertical(**change: Any):
        bad = dataclasses.replace(tab, vertical=dataclasses.replace(tab.vertical, **change))
        return dataclasses.replace(plan, instances=[bad if i is tab else i for i in plan.instances])

    assert "and stay within h1's 8" in str(plan_validate(problem, with_vertical(max_cores=9)))
    assert "must hold its planned 1" in str(plan_validate(problem, with_vertical(min_cores=2)))
    assert "below the planned batch" in str(plan_validate(problem, with_vertical(max_batch=0)))
    assert "finite coefficients" in str(plan_validate(problem, with_vertical(gamma1=-1.0)))
    assert "not one of sponge, biscale" in str(plan_validate(problem, with_vertical(policy="hpa")))
    # The JSON form keeps it, and the desired-state block says the same.
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [i.vertical for i in again.instances] == [i.vertical for i in plan.instances]
    assert tab.vertical.to_desired()["model"] == {"gamma1": tab.vertical.gamma1, "eps1": tab.vertical.eps1, "delta1": tab.vertical.delta1,
                                                  "eta1": tab.vertical.eta1}
    assert isinstance(tab.vertical, VerticalScaling)


def test_plan_solve_on_the_command_line_names_the_vertical_instances(tmp_path) -> None:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(_raw_with_cpu_app()))
    result = CliRunner().invoke(cli_app, ["plan", "solve", "--problem", str(path), "--solver", "sponge"])
    assert result.exit_code == 0, result.output
    assert "resized in place by sponge within 1..4 cores" in result.output
    bad = CliRunner().invoke(cli_app, ["plan", "solve", "--problem", str(path), "--solver", "vpa"])
    assert bad.exit_code != 0 and "sponge, biscale" in bad.output
