"""Random ensembles (issue 20; Garrison §2.1, §5): the policy's validation, the per-query draw, the
frequency table and the weighted vote."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.ensembles import (
    EnsembleError,
    EnsemblePolicy,
    SamplingFrequencies,
    ensemble_complete,
    ensemble_draw,
    ensemble_policy_from_dict,
    ensemble_policy_to_dict,
    ensemble_vote,
    inclusion_probabilities,
    randomness_bias,
)

FOUR = {"mode": "random", "members": {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}, "min_size": 2, "max_size": 2}


def test_a_policy_round_trips_and_defaults_to_every_member() -> None:
    policy = ensemble_policy_from_dict({"members": [{"variant": "a", "probability": 0.5, "weight": 2}, {"variant": "b", "probability": 0.5}]})
    assert policy.mode == "random" and (policy.min_size, policy.max_size) == (1, 2) and policy.vote == "soft"
    assert policy.weights == {"a": 2, "b": 1.0}
    assert ensemble_policy_from_dict(ensemble_policy_to_dict(policy)) == policy


@pytest.mark.parametrize(("raw", "message"), [
    ({**FOUR, "members": {"a": 0.5, "b": 0.6}}, "sum to 1"),
    ({**FOUR, "members": {"a": 1.5, "b": -0.5}}, r"in \[0, 1\]"),
    ({**FOUR, "members": {"a": float("nan"), "b": 1.0}}, r"in \[0, 1\]"),
    ({**FOUR, "members": [{"variant": "a", "probability": 1.0, "weight": 0}]}, "weight"),
    ({**FOUR, "members": [{"variant": "a", "probability": 0.5}, {"variant": "a", "probability": 0.5}]}, "twice"),
    ({**FOUR, "min_size": 3, "max_size": 2}, "min_size"),
    ({**FOUR, "max_size": 5}, "max_size <= 4"),
    ({**FOUR, "members": {"a": 1.0, "b": 0.0}}, "max_size <= 1"),
    ({**FOUR, "mode": "single"}, "both 1"),
    ({**FOUR, "mode": "learned"}, "scheduler"),
    ({**FOUR, "mode": "majority"}, "mode must be"),
    ({**FOUR, "vote": "max"}, "vote must be"),
    ({**FOUR, "members": "a,b"}, "members"),
    ({**FOUR, "colour": 1}, "unknown keys: colour"),
])
def test_bad_policies_are_refused_with_the_field_named(raw, message) -> None:
    with pytest.raises(EnsembleError, match=message):
        ensemble_policy_from_dict(raw)


def test_members_must_belong_to_the_application() -> None:
    with pytest.raises(EnsembleError, match="not a variant of this application"):
        ensemble_policy_from_dict(FOUR, variants=["a", "b", "c"])
    assert ensemble_policy_from_dict(FOUR, variants=["a", "b", "c", "d", "e"]).variants == ("a", "b", "c", "d")


def test_inclusion_probabilities_sum_to_the_size_and_cap_at_one() -> None:
    assert np.allclose(inclusion_probabilities([0.4, 0.3, 0.2, 0.1], 2), [0.8, 0.6, 0.4, 0.2])
    capped = inclusion_probabilities([0.7, 0.1, 0.1, 0.1], 2)
    assert np.allclose(capped, [1.0, 1 / 3, 1 / 3, 1 / 3]) and math.isclose(capped.sum(), 2.0)
    assert np.allclose(inclusion_probabilities([0.5, 0.5, 0.0], 2), [1, 1, 0])
    with pytest.raises(EnsembleError):
        inclusion_probabilities([0.5, 0.5, 0.0], 3)


def test_the_draw_has_the_size_asked_and_follows_the_probabilities() -> None:
    policy = ensemble_policy_from_dict(FOUR)
    rng = np.random.default_rng(0)
    table = SamplingFrequencies(policy.variants, window=20000)
    for _ in range(20000):
        drawn = ensemble_draw(policy, rng)
        assert len(drawn) == 2 and len(set(drawn)) == 2
        table.record(drawn)
    # Each member's share of the votes equals its probability (inclusion 2 p_i, no p_i above 1/2).
    assert table.bias(policy.probabilities) < 0.005, table.frequencies()
    assert np.allclose(list(table.rates().values()), [0.8, 0.6, 0.4, 0.2], atol=0.015)
    assert table.mean_size() == 2.0


def test_the_size_is_drawn_within_the_bounds() -> None:
    policy = ensemble_policy_from_dict({**FOUR, "min_size": 1, "max_size": 4})
    rng = np.random.default_rng(1)
    sizes = {len(ensemble_draw(policy, rng)) for _ in range(400)}
    assert sizes == {1, 2, 3, 4}


def test_a_scheduler_pick_is_held_to_the_bounds() -> None:
    policy = ensemble_policy_from_dict({**FOUR, "min_size": 2, "max_size": 3})
    rng = np.random.default_rng(2)
    assert ensemble_complete(policy, ["d", "a"], rng) == ("a", "d")
    assert len(ensemble_complete(policy, [], rng)) == 2
    assert len(ensemble_complete(policy, ["a", "b", "c", "d"], rng)) == 3
    assert set(ensemble_complete(policy, ["c"], rng)) >= {"c"}


def test_the_frequency_table_forgets_past_its_window() -> None:
    table = SamplingFrequencies(["a", "b"], window=2)
    for ensemble in (["a"], ["a"], ["b"], ["b"]):
        table.record(ensemble)
    assert table.frequencies() == {"a": 0.0, "b": 1.0} and table.totals == {"a": 2, "b": 2} and table.queries == 4
    assert math.isclose(randomness_bias(table.frequencies(), {"a": 0.5, "b": 0.5}), 0.5)


def test_soft_and_hard_weighted_votes() -> None:
    outputs = {"a": np.array([[0.6, 0.4], [0.1, 0.9]]), "b": np.array([[0.2, 0.8], [0.3, 0.7]]), "c": np.array([[0.3, 0.7], [0.8, 0.2]])}
    weights = {"a": 3.0, "b": 1.0, "c": 1.0}
    soft = ensemble_vote(outputs, weights, "soft")
    assert np.allclose(soft.scores, [[(1.8 + 0.2 + 0.3) / 5, (1.2 + 0.8 + 0.7) / 5], [(0.3 + 0.3 + 0.8) / 5, (2.7 + 0.7 + 0.2) / 5]])
    assert soft.labels.tolist() == [1, 1] and soft.voters == ("a", "b", "c")
    hard = ensemble_vote(outputs, weights, "hard")
    assert np.allclose(hard.scores, [[0.6, 0.4], [0.2, 0.8]]) and hard.labels.tolist() == [0, 1]
    # A member that did not answer is left out; the vote is over those present.
    late = ensemble_vote({"b": outputs["b"]}, weights, "hard")
    assert late.labels.tolist() == [1, 1] and late.voters == ("b",)


def test_a_vote_with_nothing_or_mismatched_shapes_is_refused() -> None:
    with pytest.raises(EnsembleError, match="nothing to vote"):
        ensemble_vote({}, {"a": 1.0})
    with pytest.raises(EnsembleError, match="shape"):
        ensemble_vote({"a": np.zeros((1, 2)), "b": np.zeros((1, 3))}, {"a": 1.0, "b": 1.0})
    with pytest.raises(EnsembleError, match="weight"):
        ensemble_vote({"a": np.zeros((1, 2))}, {})


def test_single_mode_policy() -> None:
    policy = EnsemblePolicy(mode="single", members=ensemble_policy_from_dict(FOUR).members)
    assert policy.mean_size == 1.0


# --------------------------------------------------------------------------- in the planning problem

def _problem_raw(**app_extra):
    return {
        "applications": [{"name": "defend", "slo_ms": 100, "demand_rps": 50, **app_extra}],
        "variants": [{"name": n, "application": "defend", "accuracy": 0.8} for n in ("a", "b", "c", "d")],
        "devices": [{"name": "g0", "type": "A100-SXM4-40GB", "mig": True}],
        "profiles": [],
    }


def test_the_problem_carries_query_sizes_and_the_ensemble_and_round_trips() -> None:
    from engine.plans.problem import problem_from_dict, problem_to_dict
    from engine.plans.schema import json_validate, problem_schema

    raw = _problem_raw(query_sizes={"1": 0.5, "8": 0.25, "32": 0.25}, ensemble=FOUR)
    problem = problem_from_dict(raw)
    app = problem.application("defend")
    assert app.query_sizes == ((1, 0.5), (8, 0.25), (32, 0.25)) and math.isclose(app.mean_query_size, 10.5)
    assert app.ensemble is not None and app.ensemble.variants == ("a", "b", "c", "d")
    again = problem_to_dict(problem)
    json_validate(again, problem_schema(), what="problem")
    assert problem_from_dict(again) == problem


@pytest.mark.parametrize(("extra", "message"), [
    ({"query_sizes": {"0": 1.0}}, "whole numbers 1..4096"),
    ({"query_sizes": {"1.5": 1.0}}, "whole numbers"),
    ({"query_sizes": {"1": 0.5}}, "sum to 1"),
    ({"query_sizes": {}}, "not empty"),
    ({"ensemble": {**FOUR, "members": {"a": 0.5, "zz": 0.5}}}, r"applications\[0\] \(defend\)\.ensemble: .*not a variant"),
])
def test_a_bad_query_size_distribution_or_ensemble_names_the_field(extra, message) -> None:
    from engine.plans.problem import ProblemError, problem_from_dict

    with pytest.raises(ProblemError, match=message):
        problem_from_dict(_problem_raw(**extra))


# --------------------------------------------------------------------------- planned by the one-variant planners

@pytest.mark.parametrize("solver", ["proteus", "joint", "garrison-demand", "garrison"])
def test_every_member_of_an_ensemble_gets_its_share_of_the_rows(solver) -> None:
    from engine.plans.validate import plan_validate
    from engine.solvers.ensembles import ensemble_member_rates
    from engine.solvers.solve import plan_solve
    from tests.engine.test_garrison import ensemble_problem

    ensemble = {"mode": "random", "members": {f"{f}-{i}": 0.1 for f, n in (("mobilenet", 2), ("googlenet", 2), ("densenet40", 6)) for i in range(n)},
                "min_size": 2, "max_size": 4}
    problem = ensemble_problem(gpus=2, ensemble=ensemble, demand_rps=20.0, query_sizes={"1": 0.5, "8": 0.5})
    if solver == "proteus":  # proteus keeps the layouts it is given: seven 1g slices a GPU, room for every member
        from engine.plans.problem import problem_from_dict, problem_to_dict

        raw = problem_to_dict(problem)
        for device in raw["devices"]:
            device["layout"] = [f"1g.5gb@{i}" for i in range(7)]
        problem = problem_from_dict(raw)
    plan = plan_solve(problem, solver, time_limit_s=20)
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    app = problem.application("defend")
    rows = {v.name: 0.0 for v in problem.variants}
    for instance in plan.instances:
        rows[instance.variant] += instance.assigned_rps
    rates = ensemble_member_rates(app)
    for member, rate in rates.items():
        # Each member serves its inclusion rate of the queries, in rows (mean query size 4.5).
        assert rows[member] == pytest.approx(rate * 20.0 * 4.5, rel=1e-6), (solver, member, plan.notes)
    assert plan.served_rps["defend"] == pytest.approx(20.0, rel=1e-6) and plan.shortfall_rps["defend"] == pytest.approx(0.0, abs=1e-6)
    assert set(plan.routing) == {"defend"}
