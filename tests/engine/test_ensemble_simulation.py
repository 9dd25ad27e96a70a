"""Serving random ensembles in the simulator (issue 20; Garrison §5, §6.2): the ensemble latency is the
slowest chosen member, a random ensemble keeps the p99 where the full ensemble misses it, the draw keeps
the sampling frequencies, and Garrison's routing (§5.3) costs normalised usage time."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.ensembles import ensemble_policy_from_dict
from engine.ensembles.scheduler import (
    FixedSizeScheduler,
    FullEnsembleScheduler,
    RandomEnsembleScheduler,
    SchedulerView,
    scheduler_features,
    scheduler_reward,
)
from engine.simulation.ensembles import EnsembleScenario, EnsembleServing, ensemble_simulate, instances_from_profiles

SIZES = (1, 8, 32, 64)


def _points(fixed_ms: float, per_row_ms: float, level: float) -> list[tuple[int, float]]:
    return [(s, fixed_ms + per_row_ms * s / level) for s in SIZES]


def scenario(rate_rps: float = 90.0, *, duration_s: float = 30.0) -> EnsembleScenario:
    # Four members: a slow one (the straggler of §2.3's Figure 3a) and three fast ones, two instances each
    # (a GI(1) and a GI(2) in kind).
    costs = {"slow": (4.0, 1.2), "fast-a": (1.0, 0.2), "fast-b": (1.0, 0.25), "fast-c": (1.5, 0.3)}
    instances = []
    for name, (fixed, per_row) in costs.items():
        instances += instances_from_profiles(name, {1.0: _points(fixed, per_row, 1.0), 2.0: _points(fixed, per_row, 2.0)})
    policy = ensemble_policy_from_dict({"mode": "random", "members": {"slow": 0.1, "fast-a": 0.3, "fast-b": 0.3, "fast-c": 0.3},
                                        "min_size": 2, "max_size": 2})
    return EnsembleScenario("four", policy, tuple(instances), slo_ms=100.0, rate_rps=rate_rps, duration_s=duration_s,
                            query_sizes=((1, 0.4), (8, 0.3), (32, 0.2), (64, 0.1)))


def test_the_full_ensemble_misses_the_slo_where_a_random_pair_keeps_it() -> None:
    s = scenario()
    full = ensemble_simulate(s, FullEnsembleScheduler(s.policy), seed=1)
    pair = ensemble_simulate(s, RandomEnsembleScheduler(s.policy), seed=1)
    assert full.mean_chosen == 4 and pair.mean_chosen == 2
    assert full.latency_percentile(99) > s.slo_ms > pair.latency_percentile(99), (full.summary(), pair.summary())
    assert pair.violation_ratio < 0.01 < full.violation_ratio
    # The draw follows the probabilities (member shares of the votes) within sampling noise.
    assert pair.bias < 0.02, pair.frequencies
    # Every voted member answered by the deadline; a late one is left out, never waited for.
    for o in pair.outcomes:
        assert set(o.voted) <= set(o.chosen)
        if o.met_slo:
            assert o.voted == o.chosen


def test_the_ensemble_latency_is_its_slowest_member() -> None:
    s = scenario(rate_rps=1.0, duration_s=1.0)
    serving = EnsembleServing(s, routing="earliest", noise_sigma=0.0)
    serving.view(0.0, 32)
    outcome = serving.serve(("slow", "fast-a"), 32)
    # On idle instances each member takes its GI(2) (earliest completion): slow 4 + 1.2 x 32 / 2.
    assert outcome.latency_ms == pytest.approx(4.0 + 1.2 * 32 / 2) and outcome.met_slo
    # A member whose every instance is busy past the deadline is not sent: the query is answered without it.
    for instance in serving.by_member["slow"]:
        serving.free_at[instance.id] = 500.0
    serving.view(1.0, 1)
    late = serving.serve(("slow", "fast-a"), 1)
    assert late.voted == ("fast-a",) and not late.met_slo and math.isinf(late.latency_ms)


def test_garrison_routing_prefers_the_cheaper_granularity_when_both_make_the_deadline() -> None:
    s = scenario(rate_rps=1.0, duration_s=1.0)
    garrison = EnsembleServing(s, routing="garrison", noise_sigma=0.0)
    garrison.view(0.0, 1)
    instance = garrison._instance_for("fast-a", 1, 100.0)
    # Size 1: 1.2 ms on GI(1) against 1.1 ms on GI(2); U = 1.2 x 1 < 1.1 x 2.
    assert instance is not None and instance.level == 1.0
    earliest = EnsembleServing(s, routing="earliest", noise_sigma=0.0)
    earliest.view(0.0, 1)
    assert earliest._instance_for("fast-a", 1, 100.0).level == 2.0


@pytest.mark.parametrize("routing", ["garrison", "earliest", "least-loaded", "size-threshold"])
def test_every_routing_rule_serves_the_pair_within_the_slo(routing: str) -> None:
    s = scenario(duration_s=10.0)
    run = ensemble_simulate(s, FixedSizeScheduler(s.policy, 2), routing=routing, seed=3)
    assert run.violation_ratio < 0.05, run.summary()


def test_the_learned_scheduler_state_and_reward() -> None:
    s = scenario()
    spec = s.spec()
    assert spec.members == ("slow", "fast-a", "fast-b", "fast-c") and spec.range_sizes == (1, 8, 32, 64)
    view = SchedulerView(8, (0.0, 10.0, 0.0, 5.0), tuple((1.0, 2.0, 3.0, 4.0) for _ in range(4)), (1, 64), (0.1, -0.1, 0.0, 0.0))
    features = scheduler_features(spec, view)
    assert features.shape == (spec.feature_count,) and features.dtype == np.float32
    assert features[0] == pytest.approx(8 / 64) and features[2] == pytest.approx(0.1)
    # The reward grows with the ensemble and shrinks with bias and timeouts; zero bias is floored, not a division by zero.
    fair = {"a": 0.5, "b": 0.5}
    assert scheduler_reward(members=2, size=8, timeouts=0, frequencies=fair, probabilities=fair) == pytest.approx(2 / 0.01 * 8)
    assert scheduler_reward(members=1, size=8, timeouts=0, frequencies={"a": 0.7, "b": 0.3}, probabilities=fair) == pytest.approx(1 / 0.2 * 8)
    assert scheduler_reward(members=2, size=8, timeouts=10, frequencies=fair, probabilities=fair, w2=1.0) < 0


def test_the_environment_follows_the_gymnasium_api_and_rewards_as_section_5_2() -> None:
    from gymnasium.utils.env_checker import check_env

    from engine.ensembles.environment import EnsembleSchedulingEnv

    env = EnsembleSchedulingEnv(scenario(), episode_queries=64)
    check_env(env, skip_render_check=True)
    observation, _ = env.reset(seed=5)
    assert observation.shape == (env.scheduler_spec.feature_count,)
    total, steps, truncated = 0.0, 0, False
    while not truncated:
        observation, reward, terminated, truncated, info = env.step(np.array([1, 1, 0, 0]))
        assert not terminated and 2 <= len(info["members"]) <= 2  # held to the policy's size bounds
        total += reward
        steps += 1
    assert steps == 64 and np.isfinite(total)
    # Same seed, same episode.
    first, _ = env.reset(seed=9)
    again, _ = env.reset(seed=9)
    assert np.array_equal(first, again)


def test_a_learned_policy_runs_from_onnx_and_its_picks_are_sampled_and_bounded(tmp_path) -> None:
    from engine.ensembles.export import policy_mlp_write
    from engine.ensembles.scheduler import LearnedScheduler

    s = scenario()
    spec = s.spec()
    # A hand-set policy (no training): one hidden layer; the logits favour fast-a and fast-b, whatever the state.
    hidden = np.zeros((8, spec.feature_count), dtype=np.float32)
    out = np.zeros((4, 8), dtype=np.float32)
    path = policy_mlp_write(tmp_path / "pair", [(hidden, np.zeros(8)), (out, np.array([-6.0, 6.0, 6.0, -6.0]))], spec,
                            meta={"made_by": "test"})
    learned = LearnedScheduler(path, s.policy)
    view = SchedulerView(8, (0.0,) * 4, tuple((1.0,) * 4 for _ in range(4)), (), (0.0,) * 4)
    assert np.allclose(learned.logits(scheduler_features(spec, view)), [-6, 6, 6, -6])
    rng = np.random.default_rng(0)
    picks = [learned.choose(view, rng) for _ in range(200)]
    assert all(len(p) == 2 for p in picks)  # min_size = max_size = 2
    assert sum(p == ("fast-a", "fast-b") for p in picks) > 190  # sigmoid(6) = 0.9975 each
    run = ensemble_simulate(s, learned, seed=2)
    assert run.violation_ratio < 0.01 and run.mean_chosen == 2
    # A policy trained for other members is refused with the reason.
    other = ensemble_policy_from_dict({"mode": "random", "members": {"x": 0.5, "y": 0.5}})
    with pytest.raises(ValueError, match="trained for members"):
        LearnedScheduler(path, other)
    with pytest.raises(ValueError, match="logits"):
        policy_mlp_write(tmp_path / "bad", [(np.zeros((3, spec.feature_count)), np.zeros(3))], spec)
