"""An application's ensemble policy as typed values: which of its variants answer a query together, how
often each is drawn and how much its vote counts (Garrison, DAC'24, §2.1 and §5; cited
in docs/references.md).

§2.1: adversarial ensemble defense serves each query with a *random ensemble*: "Each model in the ensemble
has a sampling probability, wherein models exhibiting stronger defensive performance are sampled with
higher probabilities during inference", and "the ensemble applies a decision rule (e.g., weighted vote) to
combine multiple models' inference results". §5.1-5.2: a learned scheduler picks, per query, the binary
vector e in {0, 1}^a of members that answer, keeping each member's sampling frequency near its
probability while using as many members as the latency allows.

The three modes:

- `single`: one variant per query, as the plan's routing table splits the traffic (Tessera's default; no
  vote).
- `random`: each query draws a random ensemble: a size k uniform in [min_size, max_size], then k distinct
  members with inclusion probabilities proportional to the sampling probabilities
  (`engine.ensembles.sampling.ensemble_draw`); with min_size == max_size this is the paper's "random
  ensemble with fixed size" baseline.
- `learned`: the learned scheduler's policy (an ONNX file run by onnxruntime,
  `engine.ensembles.scheduler`) picks the members; the size bounds still hold (a pick outside them is
  completed or trimmed by sampling probability).

Departure, and why: the paper gives each model a probability but does not say how an ensemble of k > 1
members is drawn from them; we draw with inclusion probabilities k * p_i (capped at 1), so that each
member's share of the votes cast equals its probability wherever k * p_i <= 1 (the paper's randomness
bias, f_i - p_i, is then zero in expectation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

__all__ = [
    "ENSEMBLE_MODES",
    "ENSEMBLE_VOTES",
    "EnsembleError",
    "EnsembleMember",
    "EnsemblePolicy",
    "ensemble_policy_from_dict",
    "ensemble_policy_to_dict",
    "ensemble_policy_validate",
]

EnsembleMode = Literal["single", "random", "learned"]
ENSEMBLE_MODES: tuple[str, ...] = ("single", "random", "learned")
# How the members' answers are combined (classification): the weighted mean of their output tensors
# (class probabilities: "soft"), or the weighted count of each member's top class ("hard").
EnsembleVote = Literal["soft", "hard"]
ENSEMBLE_VOTES: tuple[str, ...] = ("soft", "hard")


class EnsembleError(ValueError):
    """An ensemble policy is malformed; the message names the offending field."""


@dataclass(frozen=True)
class EnsembleMember:
    variant: str
    probability: float  # sampling probability p_i, in [0, 1]; the members' probabilities sum to 1
    weight: float = 1.0  # its vote's weight, > 0


@dataclass(frozen=True)
class EnsemblePolicy:
    mode: EnsembleMode
    members: tuple[EnsembleMember, ...]
    min_size: int = 1
    max_size: int = 1
    vote: EnsembleVote = "soft"
    # The learned scheduler's policy (mode `learned`): a path or name the serving side resolves.
    scheduler: str | None = None

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(m.variant for m in self.members)

    @property
    def probabilities(self) -> dict[str, float]:
        return {m.variant: m.probability for m in self.members}

    @property
    def weights(self) -> dict[str, float]:
        return {m.variant: m.weight for m in self.members}

    def member(self, variant: str) -> EnsembleMember:
        for m in self.members:
            if m.variant == variant:
                return m
        raise KeyError(variant)

    @property
    def mean_size(self) -> float:
        """The expected ensemble size of a `random` draw (1 for `single`)."""
        return 1.0 if self.mode == "single" else (self.min_size + self.max_size) / 2.0


# How far the probabilities may sum from 1 (they are typed by people; renormalising silently would hide a typo).
PROBABILITY_SUM_TOLERANCE = 1e-6


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ensemble_policy_validate(policy: EnsemblePolicy, *, variants: Iterable[str] | None = None) -> None:
    """Raise `EnsembleError` naming the first thing wrong: the mode and vote, at least one member and no
    duplicates, each probability a number in [0, 1] and together 1, each weight a number > 0, the size
    bounds 1 <= min_size <= max_size <= the number of members with a probability > 0 (mode `single`: both
    1), a scheduler for `learned`, and, where `variants` (the application's variants) is given, every member
    one of them."""
    if policy.mode not in ENSEMBLE_MODES:
        raise EnsembleError(f"mode must be one of {', '.join(ENSEMBLE_MODES)}, got {policy.mode!r}")
    if policy.vote not in ENSEMBLE_VOTES:
        raise EnsembleError(f"vote must be one of {', '.join(ENSEMBLE_VOTES)}, got {policy.vote!r}")
    if not policy.members:
        raise EnsembleError("members: at least one is needed")
    seen: set[str] = set()
    known = set(variants) if variants is not None else None
    for i, m in enumerate(policy.members):
        where = f"members[{i}] ({m.variant})"
        if not isinstance(m.variant, str) or not m.variant:
            raise EnsembleError(f"members[{i}].variant: a variant name is needed")
        if m.variant in seen:
            raise EnsembleError(f"{where}: listed twice")
        seen.add(m.variant)
        if known is not None and m.variant not in known:
            raise EnsembleError(f"{where}: not a variant of this application (its variants: {', '.join(sorted(known)) or 'none'})")
        if not _finite(m.probability) or not 0.0 <= m.probability <= 1.0:
            raise EnsembleError(f"{where}.probability: must be a number in [0, 1], got {m.probability!r}")
        if not _finite(m.weight) or m.weight <= 0:
            raise EnsembleError(f"{where}.weight: must be a number > 0, got {m.weight!r}")
    total = sum(m.probability for m in policy.members)
    if abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
        raise EnsembleError(f"members: the probabilities must sum to 1, they sum to {total:.6g}")
    drawable = sum(1 for m in policy.members if m.probability > 0)
    for name in ("min_size", "max_size"):
        value = getattr(policy, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise EnsembleError(f"{name}: must be a whole number, got {value!r}")
    if policy.mode == "single":
        if (policy.min_size, policy.max_size) != (1, 1):
            raise EnsembleError("min_size and max_size: a single-variant policy answers with one member (both 1)")
    elif not 1 <= policy.min_size <= policy.max_size <= drawable:
        raise EnsembleError(f"need 1 <= min_size <= max_size <= {drawable} (the members with a probability > 0), "
                            f"got min_size {policy.min_size}, max_size {policy.max_size}")
    if policy.mode == "learned" and not policy.scheduler:
        raise EnsembleError("scheduler: a learned policy needs the scheduler it runs (an ONNX policy)")


def ensemble_policy_from_dict(raw: Any, *, variants: Iterable[str] | None = None) -> EnsemblePolicy:
    """An ensemble policy from its JSON form: {mode, members: [{variant, probability, weight}] or
    {variant: probability | {probability, weight}}, min_size, max_size, vote, scheduler}; validated."""
    if not isinstance(raw, Mapping):
        raise EnsembleError("an ensemble policy must be an object {mode, members, min_size, max_size, vote}")
    unknown = set(raw) - {"mode", "members", "min_size", "max_size", "vote", "scheduler"}
    if unknown:
        raise EnsembleError(f"unknown keys: {', '.join(sorted(unknown))}")
    raw_members = raw.get("members")
    items: list[tuple[str, Any]]
    if isinstance(raw_members, Mapping):
        items = list(raw_members.items())
    elif isinstance(raw_members, (list, tuple)):
        items = []
        for i, m in enumerate(raw_members):
            if not isinstance(m, Mapping) or "variant" not in m:
                raise EnsembleError(f"members[{i}]: expected {{variant, probability, weight}}")
            items.append((m["variant"], {k: v for k, v in m.items() if k != "variant"}))
    else:
        raise EnsembleError("members: expected a list of {variant, probability, weight} or an object variant -> probability")
    members = []
    for i, (variant, spec) in enumerate(items):
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = {"probability": spec}
        if not isinstance(spec, Mapping):
            raise EnsembleError(f"members[{i}] ({variant}): expected a probability or {{probability, weight}}")
        extra = set(spec) - {"probability", "weight"}
        if extra:
            raise EnsembleError(f"members[{i}] ({variant}): unknown keys: {', '.join(sorted(extra))}")
        if "probability" not in spec:
            raise EnsembleError(f"members[{i}] ({variant}).probability: required")
        members.append(EnsembleMember(variant=variant, probability=spec["probability"], weight=spec.get("weight", 1.0)))
    mode = raw.get("mode", "random")
    default_size = 1 if mode == "single" else len([m for m in members if _finite(m.probability) and m.probability > 0])
    policy = EnsemblePolicy(
        mode=mode, members=tuple(members),
        min_size=raw.get("min_size", 1), max_size=raw.get("max_size", max(1, default_size)),
        vote=raw.get("vote", "soft"), scheduler=raw.get("scheduler"),
    )
    ensemble_policy_validate(policy, variants=variants)
    return policy


def ensemble_policy_to_dict(policy: EnsemblePolicy) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": policy.mode,
        "members": [{"variant": m.variant, "probability": m.probability, "weight": m.weight} for m in policy.members],
        "min_size": policy.min_size, "max_size": policy.max_size, "vote": policy.vote,
    }
    if policy.scheduler:
        out["scheduler"] = policy.scheduler
    return out
