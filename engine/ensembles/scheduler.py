"""Who answers a query: the ensemble schedulers the router and the simulator share, the learned
scheduler's state and reward (Garrison, DAC'24, §5.1-5.2; cited in docs/references.md), and
the learned policy run by onnxruntime (serving never imports torch).

§5.2 (transcribed). State S = S_t x S_p x S_q: S_t "the remaining execution time calculated by the
estimator for each instance"; S_p "the inference time of differently-batched queries on instance k"; S_q
"the sizes of historical queries arriving at the server within the past time interval of length T".
Action: "a binary vector e in {0, 1}^a, where e_i = 1 signifying the selection of model M_i". Reward:
    r = w1 x E / sqrt(sum_i (f_i - p_i)^2 / n) x (B - w2 x N)
with E the number of models ensembled, B the query's batch size, N the number of timeout queries in the
system, p_i the sampling probabilities and f_i the frequencies over the past interval T.

Where this departs, and why:
- The state is per member, not per instance: S_t is the time until the member's earliest instance is free,
  S_p the member's best latency per query-size range (over its instances). A plan may give a member more
  or fewer instances at any re-plan; a per-member state keeps the trained policy valid across plans.
- The state also carries the current query's size and the randomness bias f_i - p_i per member. The paper
  applies the bias through the reward only; without it in the state the policy cannot see what the
  reward's negative feedback asks of it.
- Times are divided by the SLO and sizes by the largest query size, so that one policy reads any scale.
- The reward's bias is floored at `BIAS_FLOOR` (a guard the paper omits: at zero bias it divides by zero),
  and N counts the queries among the last T whose ensemble missed the SLO, this one's predicted outcome
  included.
- The policy's action is sampled, not taken greedily: e_i ~ Bernoulli(sigmoid(logit_i)), so the ensemble
  stays random per query (the defense needs randomness, §2.1), then held to the size bounds
  (`ensemble_complete`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from engine.ensembles.policy import EnsembleError, EnsemblePolicy
from engine.ensembles.sampling import ensemble_complete, ensemble_draw, randomness_bias

__all__ = [
    "BIAS_FLOOR",
    "EnsembleScheduler",
    "FixedSizeScheduler",
    "FullEnsembleScheduler",
    "LearnedScheduler",
    "RandomEnsembleScheduler",
    "SchedulerSpec",
    "SchedulerView",
    "scheduler_features",
    "scheduler_reward",
    "scheduler_for_policy",
]

BIAS_FLOOR = 0.01
# The ONNX policy's tensor names (engine/ensembles/training.py exports them so).
POLICY_INPUT = "features"
POLICY_OUTPUT = "logits"


@dataclass(frozen=True)
class SchedulerSpec:
    """What fixes the shape of the state: the members in order, the query-size ranges' upper sizes, the
    history length T, the SLO and the largest query size (for scaling)."""

    members: tuple[str, ...]
    range_sizes: tuple[int, ...]
    history: int
    slo_ms: float
    max_size: int

    @property
    def feature_count(self) -> int:
        n = len(self.members)
        return 1 + n + n * len(self.range_sizes) + self.history + n

    def to_dict(self) -> dict:
        return {"members": list(self.members), "range_sizes": list(self.range_sizes), "history": self.history,
                "slo_ms": self.slo_ms, "max_size": self.max_size}

    @classmethod
    def from_dict(cls, raw: dict) -> "SchedulerSpec":
        return cls(tuple(raw["members"]), tuple(int(s) for s in raw["range_sizes"]), int(raw["history"]), float(raw["slo_ms"]), int(raw["max_size"]))


@dataclass(frozen=True)
class SchedulerView:
    """What a scheduler sees when a query arrives (per member, in the spec's order)."""

    size: int  # the query's rows
    remaining_ms: tuple[float, ...]  # S_t: until the member's earliest instance is free
    latency_ms: tuple[tuple[float, ...], ...]  # S_p: per member, its best latency at each range size
    recent_sizes: tuple[int, ...]  # S_q: the last T query sizes, newest last (fewer at the start)
    bias: tuple[float, ...]  # f_i - p_i over the window


def scheduler_features(spec: SchedulerSpec, view: SchedulerView) -> np.ndarray:
    """The state vector (float32, `spec.feature_count` long), scaled as the module docstring says."""
    n = len(spec.members)
    if len(view.remaining_ms) != n or len(view.latency_ms) != n or len(view.bias) != n:
        raise EnsembleError(f"the view has {len(view.remaining_ms)} members, the scheduler {n}")
    recent = list(view.recent_sizes)[-spec.history:]
    recent = [0] * (spec.history - len(recent)) + recent
    parts = [[view.size / spec.max_size], [r / spec.slo_ms for r in view.remaining_ms],
             [l / spec.slo_ms for row in view.latency_ms for l in row], [s / spec.max_size for s in recent], list(view.bias)]
    out = np.asarray([x for part in parts for x in part], dtype=np.float32)
    return np.clip(np.nan_to_num(out, nan=0.0, posinf=10.0, neginf=-10.0), -10.0, 10.0)


def scheduler_reward(*, members: int, size: int, timeouts: int, frequencies: dict[str, float], probabilities: dict[str, float],
                     w1: float = 1.0, w2: float = 1.0) -> float:
    """§5.2's reward, w1 x E / max(bias, BIAS_FLOOR) x (B - w2 x N)."""
    bias = max(randomness_bias(frequencies, probabilities), BIAS_FLOOR)
    return float(w1 * members / bias * (size - w2 * timeouts))


class EnsembleScheduler(Protocol):
    name: str

    def choose(self, view: SchedulerView, rng: np.random.Generator) -> tuple[str, ...]: ...


class FullEnsembleScheduler:
    """Every member answers every query (TritonX(N) in the paper's §6.2)."""

    def __init__(self, policy: EnsemblePolicy) -> None:
        self.members = tuple(m.variant for m in policy.members if m.probability > 0)
        self.name = f"full ensemble ({len(self.members)})"

    def choose(self, view: SchedulerView, rng: np.random.Generator) -> tuple[str, ...]:
        return self.members


class RandomEnsembleScheduler:
    """The policy's random ensemble: a size uniform in its bounds, members drawn by probability."""

    def __init__(self, policy: EnsemblePolicy) -> None:
        self.policy = policy
        self.name = f"random ensemble ({policy.min_size}-{policy.max_size})" if policy.min_size != policy.max_size else f"random ensemble ({policy.min_size})"

    def choose(self, view: SchedulerView, rng: np.random.Generator) -> tuple[str, ...]:
        return ensemble_draw(self.policy, rng)


class FixedSizeScheduler(RandomEnsembleScheduler):
    """A random ensemble of exactly `size` members (the paper's fixed-size baseline)."""

    def __init__(self, policy: EnsemblePolicy, size: int) -> None:
        super().__init__(policy)
        self.size = int(size)
        self.name = f"random ensemble of {self.size}"

    def choose(self, view: SchedulerView, rng: np.random.Generator) -> tuple[str, ...]:
        return ensemble_draw(self.policy, rng, self.size)


class LearnedScheduler:
    """The learned policy (an ONNX file with its spec beside it, `<name>.onnx` and `<name>.json`) run by
    onnxruntime on the CPU: logits per member, sampled, held to the policy's size bounds."""

    def __init__(self, path: str | Path, policy: EnsemblePolicy) -> None:
        import json

        import onnxruntime as ort

        path = Path(path)
        meta = json.loads(path.with_suffix(".json").read_text())
        self.spec = SchedulerSpec.from_dict(meta["spec"])
        if set(self.spec.members) - set(policy.variants):
            raise EnsembleError(f"the scheduler {path.name} was trained for members {', '.join(self.spec.members)}, "
                                f"the policy has {', '.join(policy.variants)}")
        self.policy = policy
        self.name = f"learned ({path.stem})"
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # a tiny MLP: threads cost more than they save
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def logits(self, features: np.ndarray) -> np.ndarray:
        (out,) = self.session.run([POLICY_OUTPUT], {POLICY_INPUT: features.reshape(1, -1).astype(np.float32)})
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def choose(self, view: SchedulerView, rng: np.random.Generator) -> tuple[str, ...]:
        logits = self.logits(scheduler_features(self.spec, view))
        chance = 1.0 / (1.0 + np.exp(-np.clip(logits, -30, 30)))
        picked = [m for m, take in zip(self.spec.members, rng.random(len(chance)) < chance) if take]
        return ensemble_complete(self.policy, picked, rng)


def scheduler_for_policy(policy: EnsemblePolicy, *, scheduler_dir: str | Path | None = None) -> EnsembleScheduler:
    """The scheduler a policy's mode names: random (and single, as a random ensemble of one) or learned
    (its `scheduler` resolved in `scheduler_dir` when it is not a path)."""
    if policy.mode == "learned":
        path = Path(policy.scheduler or "")
        if not path.suffix:
            path = path.with_suffix(".onnx")
        if not path.is_absolute() and scheduler_dir is not None:
            path = Path(scheduler_dir) / path
        return LearnedScheduler(path, policy)
    if policy.mode == "single":
        return FixedSizeScheduler(policy, 1)
    return RandomEnsembleScheduler(policy)

