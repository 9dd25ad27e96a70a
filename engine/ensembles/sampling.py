"""Drawing a random ensemble per query, and the frequency table that says how closely the draws follow the
sampling probabilities (Garrison, DAC'24, §5.1: "it records the models used for constructing the ensemble
and calculates the actual sampling frequencies over a past time period to form a frequency table. After
each action, the table is updated, and the difference between the sampling frequencies and the sampling
probabilities, called randomness bias is calculated"; cited in docs/references.md).

`ensemble_draw` draws k distinct members with inclusion probabilities pi_i = min(1, c * p_i), c chosen so
that sum pi_i = k (`inclusion_probabilities`), by randomized systematic sampling (Goodman & Kish, 1950: the
members in a random order, one uniform start, every unit step along the cumulative pi): exactly k members,
each included with probability exactly pi_i. Where no p_i exceeds 1/k, each member's share of the votes cast
(count_i / sum counts) is p_i in expectation, so the randomness bias is zero but for sampling noise.

The paper does not define f_i's normalisation; we take f_i as member i's share of all member uses in the
window (sums to 1, like p), so that a larger ensemble does not by itself read as bias.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from typing import Iterable, Mapping, Sequence

import numpy as np

from engine.ensembles.policy import EnsembleError, EnsemblePolicy

__all__ = [
    "SamplingFrequencies",
    "ensemble_complete",
    "ensemble_draw",
    "ensemble_size_draw",
    "inclusion_probabilities",
    "randomness_bias",
]


def inclusion_probabilities(probabilities: Sequence[float], size: int) -> np.ndarray:
    """pi_i = min(1, c * p_i) with sum pi = size: members whose share would pass 1 are always included and
    the rest share what is left in proportion to p. `size` must be within 1..(members with p > 0)."""
    p = np.asarray(probabilities, dtype=float)
    positive = int(np.count_nonzero(p > 0))
    if not 1 <= size <= positive:
        raise EnsembleError(f"an ensemble of {size} needs at least {size} members with a probability > 0 (there are {positive})")
    pi = np.zeros_like(p)
    fixed = np.zeros(p.shape, dtype=bool)
    while True:
        free = (~fixed) & (p > 0)
        left = size - int(fixed.sum())
        pi[free] = left * p[free] / p[free].sum()
        over = free & (pi > 1.0)
        if not over.any():
            break
        fixed |= over
        pi[fixed] = 1.0
    return pi


def ensemble_size_draw(policy: EnsemblePolicy, rng: np.random.Generator) -> int:
    """The size of the next random ensemble: uniform in [min_size, max_size]."""
    return int(rng.integers(policy.min_size, policy.max_size + 1))


def ensemble_draw(policy: EnsemblePolicy, rng: np.random.Generator, size: int | None = None) -> tuple[str, ...]:
    """One random ensemble (see the module docstring): `size` members (a size drawn by
    `ensemble_size_draw` when None), in the policy's member order."""
    k = ensemble_size_draw(policy, rng) if size is None else int(size)
    pi = inclusion_probabilities([m.probability for m in policy.members], k)
    order = rng.permutation(len(pi))
    cumulative = np.concatenate(([0.0], np.cumsum(pi[order])))
    start = rng.random()
    # Member order[j] is taken when some start + n (n = 0..k-1) falls in [cumulative[j], cumulative[j+1]).
    chosen = set()
    for n in range(k):
        point = start + n
        j = int(np.searchsorted(cumulative, point, side="right")) - 1
        chosen.add(int(order[min(j, len(order) - 1)]))
    if len(chosen) != k:  # only by rounding at a boundary: top up with the largest pi left
        for i in np.argsort(-pi, kind="stable"):
            if len(chosen) == k:
                break
            if pi[i] > 0:
                chosen.add(int(i))
    return tuple(policy.members[i].variant for i in sorted(chosen))


def ensemble_complete(policy: EnsemblePolicy, picked: Iterable[str], rng: np.random.Generator) -> tuple[str, ...]:
    """A scheduler's pick held to the policy's size bounds: too few members are completed, too many trimmed,
    each by a draw weighted by sampling probability (members with probability 0 are never added)."""
    members = policy.variants
    chosen = [v for v in members if v in set(picked)]
    if len(chosen) < policy.min_size:
        rest = [m for m in policy.members if m.variant not in chosen and m.probability > 0]
        need = policy.min_size - len(chosen)
        p = np.array([m.probability for m in rest])
        extra = rng.choice(len(rest), size=need, replace=False, p=p / p.sum())
        chosen += [rest[int(i)].variant for i in extra]
    elif len(chosen) > policy.max_size:
        p = np.array([policy.member(v).probability for v in chosen]) + 1e-12
        keep = rng.choice(len(chosen), size=policy.max_size, replace=False, p=p / p.sum())
        chosen = [chosen[int(i)] for i in keep]
    return tuple(v for v in members if v in set(chosen))


def randomness_bias(frequencies: Mapping[str, float], probabilities: Mapping[str, float]) -> float:
    """The paper's randomness bias as its reward uses it: sqrt(sum_i (f_i - p_i)^2 / n) over the n members."""
    names = list(probabilities)
    if not names:
        return 0.0
    return math.sqrt(sum((frequencies.get(v, 0.0) - probabilities[v]) ** 2 for v in names) / len(names))


class SamplingFrequencies:
    """The frequency table over the last `window` queries (the paper's "past time interval of length T"):
    which members answered each, and each member's share of the member uses (`frequencies`). Also counts
    every query since it was made (`totals`), for the dashboard's long-run table."""

    def __init__(self, members: Sequence[str], window: int = 1000) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.members = tuple(members)
        self.window = int(window)
        self._recent: deque[tuple[str, ...]] = deque()
        self._counts: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()
        self.queries = 0

    def record(self, ensemble: Iterable[str]) -> None:
        chosen = tuple(ensemble)
        self._recent.append(chosen)
        self._counts.update(chosen)
        self.totals.update(chosen)
        self.queries += 1
        if len(self._recent) > self.window:
            self._counts.subtract(self._recent.popleft())

    def frequencies(self) -> dict[str, float]:
        uses = sum(self._counts[v] for v in self.members)
        return {v: (self._counts[v] / uses if uses else 0.0) for v in self.members}

    def rates(self) -> dict[str, float]:
        """Each member's share of the window's queries (how often it answers at all)."""
        n = len(self._recent)
        return {v: (self._counts[v] / n if n else 0.0) for v in self.members}

    def mean_size(self) -> float:
        return sum(len(e) for e in self._recent) / len(self._recent) if self._recent else 0.0

    def bias(self, probabilities: Mapping[str, float]) -> float:
        return randomness_bias(self.frequencies(), probabilities)
