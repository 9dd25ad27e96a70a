"""Combining the members' answers by weighted vote (Garrison, DAC'24, §3, step 3 of Figure 4: "an
aggregator combines the results according to the different models' weights to obtain a robust
prediction"; §1: "The ensemble applies a decision rule (e.g., weighted vote)"; cited
in docs/references.md). One implementation for the router and the simulator.

Two rules, as the policy says (`EnsemblePolicy.vote`), both over a classification output of shape
(rows, classes):
- `soft`: the weighted mean of the members' outputs (class probabilities): sum_i w_i y_i / sum_i w_i.
- `hard`: each member votes for its top class in each row; a class's score is the summed weight of the
  members that voted for it, over the summed weight of all who voted.
The answer is the score tensor (same shape and class order) and, per row, the winning class (the lowest
index on a tie). Members that did not answer in time are simply absent: the vote is over those present.

The paper does not give the rule's formula; these are the two standard weighted votes (a weighted
average of probabilities, and weighted plurality).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from engine.ensembles.policy import ENSEMBLE_VOTES, EnsembleError

__all__ = ["EnsembleVoteResult", "ensemble_vote"]


@dataclass(frozen=True)
class EnsembleVoteResult:
    scores: np.ndarray  # (rows, classes), float32
    labels: np.ndarray  # (rows,), int64: the winning class per row
    voters: tuple[str, ...]  # the members whose answers were counted, in the order given


def ensemble_vote(outputs: Mapping[str, np.ndarray], weights: Mapping[str, float], rule: str = "soft") -> EnsembleVoteResult:
    """Weighted vote over `outputs` (member -> array (rows, classes), or (classes,) for one row) with the
    members' `weights`; raises `EnsembleError` when there is nothing to vote on, a member has no weight,
    or the shapes differ."""
    if rule not in ENSEMBLE_VOTES:
        raise EnsembleError(f"vote must be one of {', '.join(ENSEMBLE_VOTES)}, got {rule!r}")
    if not outputs:
        raise EnsembleError("no member answered: nothing to vote on")
    voters = tuple(outputs)
    arrays = []
    for name in voters:
        if name not in weights or not weights[name] > 0:
            raise EnsembleError(f"member {name!r} has no positive weight")
        array = np.asarray(outputs[name], dtype=np.float64)
        arrays.append(array.reshape(1, -1) if array.ndim == 1 else array)
    shape = arrays[0].shape
    if len(shape) != 2 or any(a.shape != shape for a in arrays):
        raise EnsembleError(f"members' outputs must share one (rows, classes) shape, got {[a.shape for a in arrays]}")
    w = np.array([float(weights[name]) for name in voters])
    stacked = np.stack(arrays)  # (members, rows, classes)
    if rule == "soft":
        scores = np.tensordot(w, stacked, axes=1) / w.sum()
    else:
        top = stacked.argmax(axis=2)  # (members, rows)
        scores = np.zeros(shape)
        for i in range(len(voters)):
            scores[np.arange(shape[0]), top[i]] += w[i]
        scores /= w.sum()
    return EnsembleVoteResult(scores.astype(np.float32), scores.argmax(axis=1).astype(np.int64), voters)
