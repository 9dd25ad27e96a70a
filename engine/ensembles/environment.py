"""The learned ensemble scheduler's environment (Garrison, DAC'24, §5.2; cited
in docs/references.md), a Gymnasium `Env` over Tessera's ensemble simulator
(engine/simulation/ensembles.py: the same draw, routing and frequency table the router uses).

One step is one query: the observation is `scheduler_features` of the serving state when it arrives
(§5.2's S_t x S_p x S_q, per member; see engine/ensembles/scheduler.py for where that departs), the
action the binary vector e in {0, 1}^a of members that answer it (held to the policy's size bounds, as
the router holds a pick), the reward §5.2's w1 x E / RMS(f - p) x (B - w2 x N) with E the members that
answered in time, B the query's size, N the queries among the last T that missed the SLO and f the
sampling frequencies over the last `window` queries. An episode is `episode_queries` Poisson arrivals
of the scenario; it is truncated, never terminated (serving has no end state).

The reward is multiplied by `reward_scale` (default BIAS_FLOOR / (members x largest query size), so that it
lies within about [-1, 1]): a positive constant changes no optimal policy, but PPO's gradient clipping is
on the sum of the actor's and the critic's gradients, and a critic fitting rewards in the thousands leaves
the actor no gradient at all.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from engine.ensembles.sampling import ensemble_complete
from engine.ensembles.scheduler import BIAS_FLOOR, scheduler_features, scheduler_reward
from engine.simulation.ensembles import EnsembleScenario, EnsembleServing, query_sizes_draw

__all__ = ["EnsembleSchedulingEnv"]


class EnsembleSchedulingEnv(gym.Env):
    """See the module docstring. `routing` is the simulator's instance routing (Garrison's by default)."""

    metadata = {"render_modes": []}

    def __init__(self, scenario: EnsembleScenario, *, routing: str = "garrison", episode_queries: int = 512,
                 window: int = 200, w1: float = 1.0, w2: float = 1.0, noise_sigma: float = 0.05, reward_scale: float | None = None) -> None:
        super().__init__()
        if episode_queries < 1:
            raise ValueError(f"episode_queries must be >= 1, got {episode_queries}")
        self.scenario = scenario
        self.scheduler_spec = scenario.spec()
        self.routing = routing
        self.episode_queries = int(episode_queries)
        self.window = int(window)
        self.w1, self.w2 = float(w1), float(w2)
        self.noise_sigma = noise_sigma
        self.reward_scale = (BIAS_FLOOR / (len(self.scheduler_spec.members) * self.scheduler_spec.max_size)
                             if reward_scale is None else float(reward_scale))
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(self.scheduler_spec.feature_count,), dtype=np.float32)
        self.action_space = spaces.MultiBinary(len(self.scheduler_spec.members))
        self._serving: EnsembleServing | None = None
        self._arrivals = np.zeros(0)
        self._sizes = np.zeros(0, dtype=int)
        self._index = 0

    def _observe(self) -> np.ndarray:
        assert self._serving is not None
        view = self._serving.view(float(self._arrivals[self._index]), int(self._sizes[self._index]))
        return scheduler_features(self.scheduler_spec, view)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        rng = self.np_random
        gaps = rng.exponential(1000.0 / self.scenario.rate_rps, self.episode_queries)
        self._arrivals = np.cumsum(gaps)
        self._sizes = query_sizes_draw(self.scenario.query_sizes, self.episode_queries, rng)
        self._serving = EnsembleServing(self.scenario, routing=self.routing, noise_sigma=self.noise_sigma,
                                        rng=np.random.default_rng(int(rng.integers(2**32))), window=self.window)
        self._index = 0
        return self._observe(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._serving is None:
            raise RuntimeError("call reset() before step()")
        picked = [m for m, take in zip(self.scheduler_spec.members, np.asarray(action).reshape(-1)) if take]
        members = ensemble_complete(self.scenario.policy, picked, self.np_random)
        size = int(self._sizes[self._index])
        outcome = self._serving.serve(members, size)
        reward = scheduler_reward(members=len(outcome.voted), size=size, timeouts=sum(self._serving.recent_missed),
                                  frequencies=self._serving.frequencies.frequencies(), probabilities=self.scenario.policy.probabilities,
                                  w1=self.w1, w2=self.w2) * self.reward_scale
        self._index += 1
        truncated = self._index >= self.episode_queries
        info = {"members": members, "voted": outcome.voted, "latency_ms": outcome.latency_ms, "met_slo": outcome.met_slo}
        observation = np.zeros(self.scheduler_spec.feature_count, dtype=np.float32) if truncated else self._observe()
        return observation, reward, False, truncated, info
