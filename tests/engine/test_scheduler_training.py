"""Training the learned ensemble scheduler (issue 20; Garrison §5.2): PPO from stable-baselines3 on the
Gymnasium environment, the actor exported to ONNX (checked against torch's logits at export), then run by
onnxruntime; and `tessera scheduler train|evaluate`. The train extra is installed by .ci/run (make
train-deps); elsewhere these tests skip when it is missing."""
from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from tests.conftest import service_unavailable


@pytest.fixture(scope="module", autouse=True)
def train_extra() -> None:
    if importlib.util.find_spec("stable_baselines3") is None or importlib.util.find_spec("torch") is None:
        service_unavailable("the train extra (stable-baselines3, torch) is not installed: make train-deps")


def test_a_short_training_run_moves_the_policy_and_exports_what_it_learned(tmp_path) -> None:
    from engine.ensembles.scheduler import LearnedScheduler
    from engine.ensembles.training import scheduler_train
    from engine.reference.ensembles import scenario_build
    from engine.simulation.ensembles import ensemble_simulate

    _problem, _plan, scenario = scenario_build("table1-a", load=1.2, duration_s=10)
    result = scheduler_train(scenario, tmp_path / "a", timesteps=4096, seed=0)
    assert result.path.exists() and result.timesteps == 4096
    meta = json.loads(result.path.with_suffix(".json").read_text())
    assert meta["scenario"] == "table1-a" and meta["algorithm"].startswith("PPO") and meta["spec"]["members"] == list(scenario.members)
    run = ensemble_simulate(scenario, LearnedScheduler(result.path, scenario.policy), seed=1)
    assert 1 <= run.mean_chosen <= len(scenario.members) and run.outcomes
    # Training moved the policy, and to the better: on evaluation episodes it never trained on (the same queries for
    # both), the trained policy earns more reward per query than the untrained one; the export carries the figures.
    assert result.weight_change > 0.01, result
    assert result.reward_trained > result.reward_untrained, result
    assert meta["evaluation"]["reward_per_query_trained"] == result.reward_trained
    assert meta["evaluation"]["reward_per_query_untrained"] == result.reward_untrained


def test_the_cli_trains_and_evaluates(tmp_path) -> None:
    from controlplane.cli import app

    runner = CliRunner()
    out = tmp_path / "policy"
    trained = runner.invoke(app, ["scheduler", "train", "--scenario", "table1-b", "--timesteps", "1024", "--out", str(out)])
    assert trained.exit_code == 0, trained.output
    assert (tmp_path / "policy.onnx").exists() and "wrote" in trained.output and "untrained" in trained.output
    evaluated = runner.invoke(app, ["scheduler", "evaluate", "--scenario", "table1-b", "--policy", str(tmp_path / "policy.onnx"),
                                    "--duration", "3", "--sizes", "3", "--out", str(tmp_path / "runs.csv")])
    assert evaluated.exit_code == 0, evaluated.output
    for name in ("full ensemble (10)", "random ensemble (1-10)", "random ensemble of 3", "learned (policy)"):
        assert name in evaluated.output
    assert (tmp_path / "runs.csv").read_text().count("\n") == 5  # header and four runs


def test_the_cli_refuses_bad_input() -> None:
    from controlplane.cli import app

    runner = CliRunner()
    for args, message in ((["scheduler", "train", "--scenario", "nope"], "--scenario must be one of"),
                          (["scheduler", "train", "--scenario", "table1-a", "--timesteps", "0"], "--timesteps must be >= 1"),
                          (["scheduler", "evaluate", "--scenario", "table1-a", "--sizes", "99"], "--sizes must be within"),
                          (["scheduler", "evaluate", "--scenario", "table1-a", "--load", "-1"], "--load and --duration")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_the_cli_lists_the_engine_scenarios() -> None:
    from controlplane.cli.scheduler import SCENARIOS, TABLE1_SCENARIOS
    from engine.reference.ensembles import SCENARIO_NAMES

    assert TABLE1_SCENARIOS == SCENARIO_NAMES and SCENARIOS[-1] == "demo"
