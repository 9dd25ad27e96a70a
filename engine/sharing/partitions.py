"""MPS partitions of one GPU (gpulets, ATC'22, §4.1-4.3): a "gpulet" is a share of a GPU's SMs given to a
process with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; the paper's scheduler uses the shares {20, 40, 50, 60, 80,
100} %, the partitions of one GPU add up to at most 100 %, and a partition may hold several models served in
turn (temporal sharing, each with its duty cycle, §2.2 and §4.3 "Temporal scheduling for gpulets").

A layout is written as the partitions' percents joined by "+", largest first: "50+30+20"; an empty GPU is
"" (no partition). Partitions are told apart by their index in that order (`MpsPartition.slot`: "mps50@0"),
since MPS partitions have no placement. Departure: the allowed set is a parameter (the paper fixes it), so
fleets may allow other shares; every check names what it found."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

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
    """A model served in a partition by temporal sharing: its batch and the fraction of the partition's
    time it runs (the duty cycles of one partition add up to at most 1)."""

    model: str
    batch: int
    duty_cycle: float = 1.0


MpsLayout = tuple[MpsPartition, ...]


def mps_layout_of(percents: Iterable[int]) -> MpsLayout:
    """The layout of these shares, largest first and indexed in that order."""
    return tuple(MpsPartition(p, i) for i, p in enumerate(sorted(percents, reverse=True)))


def mps_layout_parse(text: str) -> MpsLayout:
    """ "50+30+20" -> the layout (a ValueError naming the part that is not a whole percent)."""
    text = text.strip()
    if not text:
        return ()
    percents = []
    for part in text.split("+"):
        part = part.strip().removesuffix("%")
        if not part.isdigit():
            raise ValueError(f"MPS layout {text!r}: {part!r} is not a whole percent")
        percents.append(int(part))
    return mps_layout_of(percents)


def mps_layout_format(layout: Iterable[MpsPartition | int]) -> str:
    return "+".join(str(p.percent if isinstance(p, MpsPartition) else p) for p in sorted(layout, key=_percent, reverse=True))


def _percent(item: MpsPartition | int) -> int:
    return item.percent if isinstance(item, MpsPartition) else item


def mps_layout_validate(layout: Iterable[MpsPartition | int], *, allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> list[str]:
    """Every problem with a layout, in words (empty: valid): a share outside `allowed`, shares adding up
    to more than the GPU, indices that are not 0..n-1."""
    items = list(layout)
    problems = []
    percents = [_percent(p) for p in items]
    unknown = sorted({p for p in percents if p not in allowed})
    if unknown:
        problems.append(f"partition sizes {unknown} are not allowed (allowed: {', '.join(map(str, sorted(allowed)))} %)")
    if sum(percents) > 100:
        problems.append(f"partitions add up to {sum(percents)} % of the GPU (at most 100 %)")
    indices = [p.index for p in items if isinstance(p, MpsPartition)]
    if indices and sorted(indices) != list(range(len(items))):
        duplicated = sorted(i for i, n in Counter(indices).items() if n > 1)
        problems.append(f"partition indices must be 0..{len(items) - 1}" + (f" (repeated: {duplicated})" if duplicated else ""))
    return problems


def mps_layout_require_valid(layout: Iterable[MpsPartition | int], what: str = "MPS layout", *,
                             allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> MpsLayout:
    items = list(layout)
    problems = mps_layout_validate(items, allowed=allowed)
    if problems:
        raise InvalidMpsLayout(f"invalid {what} {mps_layout_format(items)!r}: {'; '.join(problems)}")
    return mps_layout_of(_percent(p) for p in items)


@dataclass(frozen=True)
class MpsLayoutDiff:
    """How to go from one layout to another: shares kept, stopped and started (an MPS partition is a
    process with a thread percentage, so a share that stays keeps its process and serves on)."""

    keep: tuple[int, ...]
    stop: tuple[int, ...]
    start: tuple[int, ...]


def mps_layout_diff(current: Iterable[MpsPartition | int], target: Iterable[MpsPartition | int], *,
                    allowed: Sequence[int] = MPS_PARTITIONS_DEFAULT) -> MpsLayoutDiff:
    """The fewest partitions to stop and start. gpulets §4.6 starts the new partitions before the old ones
    stop (both held at once, over 100 % for a moment), so serving never pauses; that order is the agent's."""
    before = Counter(p.percent for p in mps_layout_require_valid(current, "current MPS layout", allowed=allowed))
    after = Counter(p.percent for p in mps_layout_require_valid(target, "target MPS layout", allowed=allowed))
    ordered = lambda c: tuple(sorted(c.elements(), reverse=True))  # noqa: E731
    return MpsLayoutDiff(keep=ordered(before & after), stop=ordered(before - after), start=ordered(after - before))
