"""MPS partitions of one GPU (gpulets, ATC'22, §4.1-4.3): a "gpulet" is a share of a GPU's SMs given to a
process with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; the paper's scheduler uses the shares {20, 40, 50, 60, 80,
100} %, the partitions of one GPU add up to at most 100 %, and a partition may hold several models served in
turn (temporal sharing, each with its duty cycle, §2.2 and §4.3 "Temporal scheduling for gpulets").

A layout is written as the partitions' percents joined by "+", largest first: "50+30+20"; an empty GPU is
"" (no partition: a valid layout, the state before the first plan and after a drain). Partitions are told
apart by their index in that order (`MpsPartition.slot`: "mps50@0"), since MPS partitions have no placement.

The validator mirrors `engine.geometry.layout.mig_layout_validate` (it returns, it does not raise; a
malformed text raises ValueError while parsing; `mps_layout_require_valid` raises) but names *every*
problem as a list of sentences, not the first one as a verdict. Departure: the allowed set is a parameter
(the paper fixes it), so fleets may allow other shares."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

__all__ = [
    "MPS_PARTITIONS_DEFAULT",
    "InvalidMpsLayout",
    "ModelShare",
    "MpsLayout",
    "MpsLayoutDiff",
    "MpsLayoutLike",
    "MpsPartition",
    "model_shares_validate",
    "mps_layout_diff",
    "mps_layout_format",
    "mps_layout_of",
    "mps_layout_parse",
    "mps_layout_require_valid",
    "mps_layout_validate",
    "mps_slice_name",
    "mps_slice_percent",
]

# gpulets §4.3 / §5: the partition sizes its scheduler and its ideal baseline use ((2:8), (4:6), (5:5), (10:0)).
MPS_PARTITIONS_DEFAULT: tuple[int, ...] = (20, 40, 50, 60, 80, 100)


class InvalidMpsLayout(ValueError):
    """A layout failed `mps_layout_validate`; the message lists every problem."""


@dataclass(frozen=True, order=True)
class MpsPartition:
    """One partition: `percent` of the GPU's SMs, `index` its place in the layout (largest first)."""

    percent: int
    index: int = 0

    @property
    def slot(self) -> str:
        """The partition's name in plans and runtime keys, e.g. "mps50@0"."""
        return f"mps{self.percent}@{self.index}"


@dataclass(frozen=True)
class ModelShare:
    """A model served in a partition by temporal sharing (gpulets §2.2, §4.3): its batch and the fraction of
    the partition's time it runs. The duty cycles of one partition add up to at most 1
    (`model_shares_validate`)."""

    model: str
    batch: int
    duty_cycle: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"a model share needs a model name, got {self.model!r}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"{self.model}: batch must be a whole number >= 1, got {self.batch!r}")
        if isinstance(self.duty_cycle, bool) or not isinstance(self.duty_cycle, (int, float)) \
                or not math.isfinite(self.duty_cycle) or not 0 < self.duty_cycle <= 1:
            raise ValueError(f"{self.model}: duty cycle must be in (0, 1], got {self.duty_cycle!r}")


def model_shares_validate(shares: Iterable[ModelShare]) -> list[str]:
    """Every problem with the models time-sharing one partition (empty: valid): duty cycles over 1 in all,
    a model listed twice (one model has one batcher per partition)."""
    items = list(shares)
    problems = []
    total = sum(share.duty_cycle for share in items)
    if total > 1 + 1e-9:  # the tolerance keeps 0.1 + 0.2 + 0.7 valid
        parts = ", ".join(f"{share.model}: {share.duty_cycle:g}" for share in items)
        problems.append(f"duty cycles add up to {total:g}, more than the partition's time ({parts})")
    repeated = sorted(model for model, n in Counter(share.model for share in items).items() if n > 1)
    if repeated:
        problems.append(f"models listed more than once: {', '.join(repeated)}")
    return problems


MpsLayout = tuple[MpsPartition, ...]
MpsLayoutLike = Union[str, Iterable[Union[MpsPartition, int]]]


def mps_slice_name(percent: int) -> str:
    """The slice a partition of `percent` % of the SMs is profiled and planned on: 50 -> "mps50". A percent
    that is not a whole number 1..100 is a ValueError."""
    if not _whole(percent) or not 1 <= percent <= 100:
        raise ValueError(f"an MPS partition is a whole percent 1..100 of the GPU, got {percent!r}")
    return f"mps{percent}"


def mps_slice_percent(name: str) -> int | None:
    """The percent of an MPS slice name as `mps_slice_name` writes it ("mps50" -> 50); None for anything
    else (other spellings, a MIG profile, "full", a percent outside 1..100)."""
    if not isinstance(name, str) or not name.startswith("mps"):
        return None
    digits = name[3:]
    if not digits.isascii() or not digits.isdigit() or digits.startswith("0"):
        return None
    percent = int(digits)
    return percent if 1 <= percent <= 100 else None


def mps_layout_of(percents: Iterable[int]) -> MpsLayout:
    """The layout of these shares, largest first and indexed in that order."""
    return tuple(MpsPartition(p, i) for i, p in enumerate(sorted(percents, reverse=True)))


def mps_layout_parse(text: str) -> MpsLayout:
    """ "50+30+20" (a trailing "%" on a part is tolerated) -> the layout; "" -> no partition. A part that is
    not a whole percent is a ValueError naming it."""
    if not isinstance(text, str):
        raise ValueError(f"an MPS layout must be written as text such as '50+30+20', got {text!r}")
    text = text.strip()
    if not text:
        return ()
    percents = []
    for part in text.split("+"):
        part = part.strip().removesuffix("%").strip()
        if not part.isdigit():
            raise ValueError(f"MPS layout {text!r}: {part!r} is not a whole percent (expected e.g. '50+30+20')")
        percents.append(int(part))
    return mps_layout_of(percents)


def mps_layout_format(layout: MpsLayoutLike) -> str:
    """The layout as text, largest first: "50+30+20" ("" for no partition); `mps_layout_parse` reads it back."""
    return "+".join(str(p) for p in sorted((_percent(p) for p in _items(layout)), reverse=True))


def _items(layout: MpsLayoutLike) -> list[MpsPartition | int]:
    return list(mps_layout_parse(layout)) if isinstance(layout, str) else list(layout)


def _percent(item: MpsPartition | int) -> int:
    return item.percent if isinstance(item, MpsPartition) else item


# --------------------------------------------------------------------------- validation: one check per rule


def _check_sizes(percents: list[int], allowed: Sequence[int]) -> str | None:
    unknown = sorted({p for p in percents if not _whole(p) or p not in allowed},
                     key=lambda p: (0, p) if _number(p) else (1, repr(p)))
    if unknown:
        return f"partition sizes {unknown} are not allowed (allowed: {', '.join(map(str, sorted(allowed)))} %)"
    return None


def _check_total(percents: list[int]) -> str | None:
    total = sum(p for p in percents if _number(p))  # what is not a number is already named by _check_sizes
    if total > 100:
        return f"partitions add up to {total} % of the GPU (at most 100 %)"
    return None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_indices(items: list[MpsPartition | int]) -> str | None:
    # Bare percents take their index from their order; partitions must carry 0..n-1, once each.
    indices = [p.index for p in items if isinstance(p, MpsPartition)]
    if indices and sorted(indices) != list(range(len(items))):
        repeated = sorted(i for i, n in Counter(indices).items() if n > 1)
        detail = f" (repeated: {repeated})" if repeated else f", got {sorted(indices)}"
        return f"partition indices must be 0..{len(items) - 1}{detail}"
    return None


def mps_layout_validate(layout: MpsLayoutLike, *, allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> list[str]:
    """Every problem with a layout, in words (empty list: valid): a share outside `allowed`, shares adding
    up to more than the GPU, indices that are not 0..n-1 once each. No partition at all is valid."""
    items = _items(layout)
    percents = [_percent(p) for p in items]
    checks = (_check_sizes(percents, allowed), _check_total(percents), _check_indices(items))
    return [problem for problem in checks if problem is not None]


def mps_layout_require_valid(layout: MpsLayoutLike, what: str = "MPS layout", *,
                             allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> MpsLayout:
    """The layout, re-indexed largest first, or InvalidMpsLayout naming every problem."""
    items = _items(layout)
    problems = mps_layout_validate(items, allowed=allowed)
    if problems:
        raise InvalidMpsLayout(f"invalid {what} {mps_layout_format(items)!r}: {'; '.join(problems)}")
    return mps_layout_of(_percent(p) for p in items)


@dataclass(frozen=True)
class MpsLayoutDiff:
    """How to go from one layout to another: shares kept, stopped and started (an MPS partition is a
    process with a thread percentage, fixed when it starts (§4.6), so a share that stays keeps its process
    and serves on, and a share that changes is a stop and a start)."""

    keep: tuple[int, ...]
    stop: tuple[int, ...]
    start: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return not self.stop and not self.start


def mps_layout_diff(current: MpsLayoutLike, target: MpsLayoutLike, *,
                    allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> MpsLayoutDiff:
    """The fewest partitions to stop and start (InvalidMpsLayout if either layout is invalid). gpulets §4.6
    starts the new partitions before the old ones stop (both held at once, over 100 % for a moment), so
    serving never pauses; that order is the agent's."""
    before = Counter(p.percent for p in mps_layout_require_valid(current, "current MPS layout", allowed=allowed))
    after = Counter(p.percent for p in mps_layout_require_valid(target, "target MPS layout", allowed=allowed))

    def ordered(counts: Counter[int]) -> tuple[int, ...]:
        return tuple(sorted(counts.elements(), reverse=True))

    return MpsLayoutDiff(keep=ordered(before & after), stop=ordered(before - after), start=ordered(after - before))
