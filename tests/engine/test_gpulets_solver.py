"""The MPS planners end to end on engine/reference/data/gpulet: a planning problem with MPS GPUs solved by `gpulets`,
`sbp`, `best-fit` and `ideal` through `plan_solve`, every plan checked by the independent validator, and
the CLI. (The schedulers themselves are tested in test_gpulets_scheduling.py.)"""
from __future__ import annotations

import json
import random

import pytest

from engine.plans.problem import ProblemError, plan_from_dict, problem_from_dict, problem_to_dict
from engine.plans.validate import plan_validate
from engine.reference.gpulet_problem import gpulet_mps_problem, gpulet_mps_problem_dict, gpulet_slo_ms
from engine.sharing.partitions import mps_slice_percent
from engine.solvers.gpulets import SHARING_SOLVERS, sharing_problem_from
from engine.solvers.solve import plan_solve

MODELS = ["vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet121", "densenet169", "densenet201", "inception", "mobilenet"]


def scenario(seed: int, scale: float = 1.0) -> dict[str, float]:
    rng = random.Random(seed)
    return {m: rng.choice([0, 100, 200]) * scale for m in MODELS}


@pytest.mark.parametrize("solver", SHARING_SOLVERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_mps_planner_gives_a_valid_plan(solver, seed):
    """Each MPS planner plans 3 x a {0,100,200} scenario on 4 GPUs (gpulets and the ideal in full) and the
    validator finds nothing wrong."""
    problem = gpulet_mps_problem(scenario(seed, 3.0))
    plan = plan_solve(problem, solver)
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert plan.solver == solver and plan.status == "feasible"
    if solver in ("gpulets", "ideal"):  # best-fit (one model per partition) and SBP may fall short here
        assert sum(plan.shortfall_rps.values()) == 0
    if sum(plan.shortfall_rps.values()) > 0:
        assert plan.notes[0].startswith("SHORTFALL: "), plan.notes
    for inst in plan.instances:
        assert mps_slice_percent(inst.slice) is not None and inst.duty_cycle_ms is not None
        assert inst.interference_factor >= 1
    for layout in plan.layouts.values():
        percents = [mps_slice_percent(slot.split("@")[0]) for slot in layout]
        assert None not in percents and sum(percents) <= 100 and len(percents) <= 2
    if solver == "sbp":
        assert all(inst.slice == "mps100" for inst in plan.instances)
    if solver == "best-fit":
        if any("whole-GPU plan" in n for n in plan.notes):
            # Best-fit fell short here and its whole-GPU fallback (unsplit, time-shared GPUs) served more.
            assert all(inst.slice == "mps100" for inst in plan.instances)
        else:
            slots = [(i.device, i.slice, i.start) for i in plan.instances]
            assert len(slots) == len(set(slots)), "best-fit runs one model per partition"


def test_gpulets_time_shares_and_splits_gpus():
    """At low rates gpulets packs several models into one partition (one duty cycle) on fewer GPUs than exist."""
    problem = gpulet_mps_problem(scenario(0))
    plan = plan_solve(problem, "gpulets")
    assert plan_validate(problem, plan).valid
    assert plan.gpus_used < len(problem.devices)
    by_slot: dict[tuple, list] = {}
    for inst in plan.instances:
        by_slot.setdefault((inst.device, inst.slice, inst.start), []).append(inst)
    shared = [members for members in by_slot.values() if len(members) > 1]
    assert shared, "some partition is time-shared"
    for members in shared:
        assert len({m.duty_cycle_ms for m in members}) == 1
        assert sum(m.latency_ms for m in members) <= members[0].duty_cycle_ms * (1 + 1e-9)


def test_interference_raises_latency_and_is_in_the_plan():
    """With the interference model, an instance next to a busy partition carries a factor > 1 and its latency
    includes it; without the model the plan says partitions were planned as if they did not interfere."""
    rates = scenario(3, 4.0)
    with_model = gpulet_mps_problem(rates)
    plan = plan_solve(with_model, "gpulets")
    assert plan_validate(with_model, plan).valid
    assert any(i.interference_factor > 1.0 for i in plan.instances)
    without = gpulet_mps_problem(rates, interference=False)
    plain = plan_solve(without, "gpulets")
    assert all(i.interference_factor == 1.0 for i in plain.instances)
    assert any("as if they did not interfere" in n for n in plain.notes)


def test_overload_is_reported_as_shortfall_not_as_a_wrong_plan():
    """Far beyond 4 GPUs, gpulets serves what fits, reports the rest as shortfall, and the plan is valid."""
    problem = gpulet_mps_problem(scenario(4, 40.0))
    plan = plan_solve(problem, "gpulets")
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert sum(plan.shortfall_rps.values()) > 0
    assert any("unschedulable" in n for n in plan.notes)
    assert plan.gpus_used == len(problem.devices)


def test_gpu_scaling_starts_from_the_gpus_running_now():
    """Algorithm 2 keeps the GPUs that run something first: a GPU already busy is the first one planned."""
    rates = {"resnet50": 100.0, "mobilenet": 100.0}
    running = [{}, {"mps_layout": "100", "running": {"mps100@0": "resnet50"}}]
    problem = gpulet_mps_problem(rates, gpus=2, running=running)
    plan = plan_solve(problem, "gpulets")
    assert plan_validate(problem, plan).valid
    assert set(plan.layouts) == {"gpu1"}


def test_no_mps_gpu_gives_an_infeasible_plan_with_a_reason():
    """A fleet without MPS GPUs: nothing is planned, and the notes say why."""
    raw = gpulet_mps_problem_dict({"resnet50": 100.0}, gpus=1)
    raw["devices"][0]["mps"] = False
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "gpulets")
    assert plan.status == "infeasible" and not plan.instances
    assert any("no MPS GPU" in n for n in plan.notes)


def test_problem_with_utilisation_and_interference_round_trips():
    """The problem JSON keeps profile utilisations and the interference model through a round trip."""
    problem = gpulet_mps_problem(scenario(5))
    again = problem_from_dict(json.loads(json.dumps(problem_to_dict(problem))))
    assert again == problem
    assert again.interference is not None and again.interference.form == "operating-point-log"
    assert any(p.l2_util_pct is not None for p in again.profiles)
    sharing, _ = sharing_problem_from(again)
    assert sharing is not None and sharing.interference is not None
    assert {m.slo_ms for m in sharing.models} <= {gpulet_slo_ms(m) for m in MODELS}


@pytest.mark.parametrize("bad, message", [
    ({"form": "cubic", "coefficients": [1.0]}, "interference.form"),
    ({"form": "paper", "coefficients": [1.0, 2.0]}, "has 5"),
    ({"form": "constant"}, "missing 'coefficients'"),
])
def test_a_malformed_interference_model_is_refused(bad, message):
    """A wrong form or coefficient count is a clear ProblemError."""
    raw = gpulet_mps_problem_dict({"resnet50": 100.0}, gpus=1)
    raw["interference"] = bad
    with pytest.raises(ProblemError, match=message):
        problem_from_dict(raw)


def test_plan_json_round_trip_keeps_duty_cycles():
    """A gpulets plan written and read back validates the same (duty cycles and factors included)."""
    problem = gpulet_mps_problem(scenario(6, 2.0))
    plan = plan_solve(problem, "gpulets")
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert plan_validate(problem, again).valid
    assert [i.duty_cycle_ms for i in again.instances] == [i.duty_cycle_ms for i in plan.instances]


def test_cli_plan_solve_with_gpulets(tmp_path):
    """`tessera plan solve --solver gpulets` writes a plan the validator accepts (exit 0)."""
    from typer.testing import CliRunner

    from controlplane.cli import app

    path = tmp_path / "problem.json"
    path.write_text(json.dumps(gpulet_mps_problem_dict(scenario(7, 2.0))))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["plan", "solve", "--problem", str(path), "--solver", "gpulets", "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = plan_from_dict(json.loads(out.read_text()))
    assert plan.solver == "gpulets" and plan.instances
