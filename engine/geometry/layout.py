"""MIG layouts: the set of GPU instances on one GPU, each written ``profile@start`` (``"3g.20gb@4"``),
the start counted in memory slices the way ``nvidia-smi mig -lgipp`` prints it. Parsing, the validator
(one small named check per rule of NVIDIA's placement table), enumeration of every valid layout, minimal
diffs between two layouts, and packing profile counts into explicit placements.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Union

from engine.geometry.catalogue import (
    PROFILE_NAME_RE,
    GpuModelSpec,
    MigProfileSpec,
    gpu_model_resolve,
    profile_name_normalise,
)

__all__ = [
    "CODE_COMPUTE_OVER",
    "CODE_ILLEGAL_START",
    "CODE_MEDIA_EXTENSION_OVER",
    "CODE_OVERLAP",
    "CODE_TOO_MANY",
    "CODE_UNKNOWN_PROFILE",
    "InvalidLayout",
    "Layout",
    "LayoutDiff",
    "LayoutLike",
    "LayoutVerdict",
    "Placement",
    "layout_counts",
    "layout_parse",
    "mig_counts_to_layout",
    "mig_layout_diff",
    "mig_layout_require_valid",
    "mig_layout_validate",
    "mig_layouts_enumerate",
    "placement_parse",
]

CODE_UNKNOWN_PROFILE = "unknown_profile"
CODE_ILLEGAL_START = "illegal_start"
CODE_OVERLAP = "overlap"
CODE_TOO_MANY = "too_many"
CODE_COMPUTE_OVER = "compute_over"
CODE_MEDIA_EXTENSION_OVER = "media_extension_over"

# "profile@start"; nvidia-smi's "MIG " prefix on the profile is tolerated.
_PLACEMENT_RE = re.compile(r"^\s*(?:MIG\s+)?(?P<profile>[^@\s]+)\s*@\s*(?P<start>[0-9]+)\s*$", re.IGNORECASE)


class InvalidLayout(ValueError):
    """A layout failed validation; ``verdict`` says why."""

    def __init__(self, verdict: LayoutVerdict, what: str = "layout") -> None:
        self.verdict = verdict
        super().__init__(f"invalid {what}: {verdict.reason} [{verdict.code}]")



# --------------------------------------------------------------------------- placements


@functools.total_ordering
@dataclass(frozen=True)
class Placement:
    """One GPU instance: a profile at a start memory slice, written ``profile@start``."""

    profile: str
    start: int

    def __post_init__(self) -> None:
        if not isinstance(self.profile, str) or not self.profile:
            raise ValueError(f"placement profile must be a non-empty string, got {self.profile!r}")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise ValueError(f"placement start must be a non-negative integer, got {self.start!r}")

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def __lt__(self, other: object) -> bool:
        # Layouts read left to right along the memory slices, as -lgi prints them.
        if not isinstance(other, Placement):
            return NotImplemented
        return (self.start, self.profile) < (other.start, other.profile)


Layout = tuple[Placement, ...]
LayoutLike = Union[str, Iterable[Union[Placement, str]]]


def placement_parse(text: str) -> Placement:
    """Parse ``"3g.20gb@0"`` (the form ``str(Placement)`` gives back)."""
    if not isinstance(text, str):
        raise ValueError(f"a placement must be written as text such as '3g.20gb@0', got {text!r}")
    match = _PLACEMENT_RE.match(text)
    if match is None:
        raise ValueError(f"malformed placement {text!r}: expected '<profile>@<start>', such as '3g.20gb@0'")
    profile = profile_name_normalise(match["profile"])
    if not PROFILE_NAME_RE.match(profile):
        raise ValueError(
            f"malformed placement {text!r}: {match['profile']!r} is not a GPU instance profile name "
            "such as '3g.20gb'"
        )
    return Placement(profile, int(match["start"]))


def layout_parse(items: LayoutLike) -> Layout:
    """Parse a layout into a sorted tuple of placements.

    Accepts a list of ``"profile@start"`` strings and/or ``Placement`` objects, or a
    single string with placements separated by spaces or commas.
    """
    if isinstance(items, str):
        items = [part for part in re.split(r"[\s,]+", items) if part]
    placements = [item if isinstance(item, Placement) else placement_parse(item) for item in items]
    return tuple(sorted(placements))


def layout_counts(layout: LayoutLike) -> dict[str, int]:
    """How many instances of each profile a layout holds."""
    return dict(Counter(placement.profile for placement in layout_parse(layout)))


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class LayoutVerdict:
    """Result of validating a layout: ``valid``, else a human ``reason`` and a ``code``."""

    valid: bool
    reason: str | None = None
    code: str | None = None


_VALID = LayoutVerdict(valid=True)
_Resolved = list[tuple[Placement, MigProfileSpec]]


def mig_layout_validate(gpu_model: GpuModelSpec | str, layout: LayoutLike) -> LayoutVerdict:
    """Check a layout against the GPU model's MIG rules.

    Checks run from the most specific to the most global, and the first failure is
    reported: unknown profile, illegal start, more than one ``+me`` instance, too
    many instances of a profile, compute slices over the GPU's total, and only then
    overlapping memory slices. Counting checks come before the overlap check so that
    a layout that asks for too much is told so, rather than told which two
    instances happened to collide.
    """
    model = gpu_model_resolve(gpu_model)
    placements = layout_parse(layout)
    verdict, resolved = _check_profiles_known(model, placements)
    if verdict is not None:
        return verdict
    checks = (_check_starts_legal, _check_media_extensions, _check_counts, _check_compute, _check_overlaps)
    for check in checks:
        verdict = check(model, resolved)
        if verdict is not None:
            return verdict
    return _VALID


def _invalid(code: str, reason: str) -> LayoutVerdict:
    return LayoutVerdict(valid=False, reason=reason, code=code)


def _check_profiles_known(model: GpuModelSpec, placements: Layout) -> tuple[LayoutVerdict | None, _Resolved]:
    resolved: _Resolved = []
    for placement in placements:
        profile = model.profile_find(placement.profile)
        if profile is None:
            reason = (
                f"{placement}: profile {placement.profile} does not exist on {model.name} "
                f"(known: {', '.join(model.profile_names)})"
            )
            return _invalid(CODE_UNKNOWN_PROFILE, reason), []
        resolved.append((placement, profile))
    return None, resolved


def _check_starts_legal(model: GpuModelSpec, resolved: _Resolved) -> LayoutVerdict | None:
    for placement, profile in resolved:
        if placement.start not in profile.starts:
            legal = ", ".join(str(start) for start in profile.starts)
            reason = (
                f"{placement}: start {placement.start} is not a legal start for {profile.name} "
                f"on {model.name} (legal: {legal})"
            )
            return _invalid(CODE_ILLEGAL_START, reason)
    return None


def _check_media_extensions(model: GpuModelSpec, resolved: _Resolved) -> LayoutVerdict | None:
    # The media extensions (NVJPG, OFA) exist once per GPU, so only one +me (or +me.all) instance fits,
    # whatever its size (on A30 a 1g and a 2g profile carry them). A +me.all instance takes every media
    # engine (MIG user guide, Profile References), so only -me instances (none) may sit beside it.
    media = [placement for placement, profile in resolved if profile.holds_media_extensions]
    if len(media) > 1:
        reason = (
            f"{', '.join(map(str, media))}: at most one media-extension (+me or +me.all) instance fits on "
            f"{model.name}, the layout has {len(media)}"
        )
        return _invalid(CODE_MEDIA_EXTENSION_OVER, reason)
    every = next((placement for placement, profile in resolved if profile.media_engines_all), None)
    if every is not None:
        holders = [p for p, profile in resolved if p != every and not profile.media_engines_none]
        if holders:
            reason = (
                f"{every} takes every media engine of {model.name}, so only -me instances may sit beside it; "
                f"{', '.join(map(str, holders))} {'holds' if len(holders) == 1 else 'hold'} media engines"
            )
            return _invalid(CODE_MEDIA_EXTENSION_OVER, reason)
    return None


def _media_state_after(state: tuple[int, bool, bool], profile: MigProfileSpec) -> tuple[int, bool, bool] | None:
    """(media-extension instances, a +me.all among them, an instance holding media engines besides it)
    after adding `profile`, or None when the media-engine rules refuse it (see _check_media_extensions)."""
    holders, every, engines = state
    if profile.holds_media_extensions and holders >= 1:
        return None
    if profile.media_engines_all and engines:
        return None
    if every and not profile.media_engines_none:
        return None
    return (
        holders + int(profile.holds_media_extensions),
        every or profile.media_engines_all,
        engines or (not profile.media_engines_none and not profile.media_engines_all),
    )


def _check_counts(model: GpuModelSpec, resolved: _Resolved) -> LayoutVerdict | None:
    counts = Counter(profile.name for _, profile in resolved)
    for profile in model.profiles:
        if counts[profile.name] > profile.max_count:
            reason = (
                f"{profile.name}: {counts[profile.name]} instances, more than the {profile.max_count} "
                f"{model.name} allows"
            )
            return _invalid(CODE_TOO_MANY, reason)
    return None


def _check_compute(model: GpuModelSpec, resolved: _Resolved) -> LayoutVerdict | None:
    total = sum(profile.compute_slices for _, profile in resolved)
    if total > model.compute_slices:
        parts = ", ".join(f"{placement}: {profile.compute_slices}" for placement, profile in resolved)
        reason = (
            f"compute slices sum to {total}, more than the {model.compute_slices} of "
            f"{model.name} ({parts})"
        )
        return _invalid(CODE_COMPUTE_OVER, reason)
    return None


def _check_overlaps(model: GpuModelSpec, resolved: _Resolved) -> LayoutVerdict | None:
    # NVML: a GPU instance holds the memory slices [start, start + size); creating
    # one that touches an occupied slice fails.
    for i, (first, first_profile) in enumerate(resolved):
        first_slices = set(first_profile.occupies(first.start))
        for second, second_profile in resolved[i + 1:]:
            shared = sorted(first_slices.intersection(second_profile.occupies(second.start)))
            if shared:
                return _invalid(CODE_OVERLAP, f"{first} overlaps {second} on {_slices_text(shared)}")
    return None


def _slices_text(slices: Sequence[int]) -> str:
    if len(slices) == 1:
        return f"memory slice {slices[0]}"
    return f"memory slices {slices[0]}-{slices[-1]}"


def mig_layout_require_valid(model: GpuModelSpec, layout: LayoutLike, what: str) -> Layout:
    """The layout, valid on `model` (else InvalidLayout), with every profile under its catalogue name (a
    board's other name for a profile, such as early GB200's 7g.189gb, becomes 7g.186gb)."""
    placements = layout_parse(layout)
    verdict = mig_layout_validate(model, placements)
    if not verdict.valid:
        raise InvalidLayout(verdict, what)
    return tuple(sorted(Placement(model.profile_get(p.profile).name, p.start) for p in placements))


# --------------------------------------------------------------------------- enumeration


_NO_MEDIA = (0, False, False)


@dataclass(frozen=True)
class _Occupancy:
    """What a partial layout uses up; enough to tell whether one more instance fits."""

    slices: frozenset[int]
    counts: Mapping[str, int]
    compute: int
    media: tuple[int, bool, bool]

    @classmethod
    def of(cls, model: GpuModelSpec, layout: Layout) -> _Occupancy:
        profiles = [model.profile_get(placement.profile) for placement in layout]
        media: tuple[int, bool, bool] | None = _NO_MEDIA
        for spec in profiles:
            media = _media_state_after(media, spec) if media is not None else None
        return cls(
            slices=frozenset(s for p, spec in zip(layout, profiles) for s in spec.occupies(p.start)),
            counts=Counter(spec.name for spec in profiles),
            compute=sum(spec.compute_slices for spec in profiles),
            media=media if media is not None else (99, True, True),
        )

    def admits(self, model: GpuModelSpec, profile: MigProfileSpec, start: int) -> bool:
        return (
            start in profile.starts
            and self.slices.isdisjoint(profile.occupies(start))
            and self.counts.get(profile.name, 0) < profile.max_count
            and self.compute + profile.compute_slices <= model.compute_slices
            and _media_state_after(self.media, profile) is not None
        )


def mig_layouts_enumerate(gpu_model: GpuModelSpec | str, maximal: bool = False) -> list[Layout]:
    """Every valid layout of the GPU model, as sorted tuples, each exactly once.

    The empty layout is included. With ``maximal=True`` only the layouts to which no
    further instance can be added are kept (the empty layout is never maximal).
    """
    model = gpu_model_resolve(gpu_model)
    layouts = _layouts_maximal(model) if maximal else _layouts_all(model)
    return list(layouts)


@functools.lru_cache(maxsize=64)
def _layouts_all(model: GpuModelSpec) -> tuple[Layout, ...]:
    profiles_at = {
        start: tuple(p for p in model.profiles if start in p.starts) for start in range(model.memory_slices)
    }
    index_of = {profile.name: i for i, profile in enumerate(model.profiles)}

    @functools.lru_cache(maxsize=None)
    def suffixes(cursor: int, counts: tuple[int, ...], compute: int, media: tuple[int, bool, bool]) -> tuple[Layout, ...]:
        # Walk the memory slices left to right: either nothing starts at `cursor`, or
        # one instance starts there and the walk resumes after it. Each layout has
        # exactly one such walk, so nothing is produced twice and nothing overlaps.
        # The remaining choices depend only on (cursor, counts, compute, media), so
        # suffixes are shared between prefixes.
        if cursor >= model.memory_slices:
            return ((),)
        found = list(suffixes(cursor + 1, counts, compute, media))
        for profile in profiles_at[cursor]:
            i = index_of[profile.name]
            media_after = _media_state_after(media, profile)
            if (
                cursor + profile.memory_slices > model.memory_slices
                or counts[i] >= profile.max_count
                or compute + profile.compute_slices > model.compute_slices
                or media_after is None
            ):
                continue
            after = counts[:i] + (counts[i] + 1,) + counts[i + 1:]
            head = Placement(profile.name, cursor)
            rest = suffixes(cursor + profile.memory_slices, after, compute + profile.compute_slices, media_after)
            found.extend((head, *tail) for tail in rest)
        return tuple(found)

    layouts = suffixes(0, (0,) * len(model.profiles), 0, _NO_MEDIA)
    return tuple(sorted(layouts, key=_layout_sort_key))


@functools.lru_cache(maxsize=64)
def _layouts_maximal(model: GpuModelSpec) -> tuple[Layout, ...]:
    return tuple(layout for layout in _layouts_all(model) if _layout_is_maximal(model, layout))


def _layout_is_maximal(model: GpuModelSpec, layout: Layout) -> bool:
    occupancy = _Occupancy.of(model, layout)
    return not any(occupancy.admits(model, p, start) for p in model.profiles for start in p.starts)


def _layout_sort_key(layout: Layout) -> tuple[tuple[int, str], ...]:
    return tuple((placement.start, placement.profile) for placement in layout)


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True)
class LayoutDiff:
    """How to turn one layout into another, touching as little as possible.

    ``operations`` lists every destroy before every create; after any prefix of it
    the GPU holds a valid layout.
    """

    keep: Layout
    destroy: Layout
    create: Layout
    operations: tuple[tuple[Literal["destroy", "create"], Placement], ...]


def mig_layout_diff(gpu_model: GpuModelSpec | str, current: LayoutLike, target: LayoutLike) -> LayoutDiff:
    """Minimal reconfiguration from ``current`` to ``target``.

    Instances with the same profile and the same start survive untouched, so the
    workloads on them keep serving (partial reconfiguration). Everything else in
    ``current`` is destroyed first, then the rest of ``target`` is created. Both
    layouts must be valid (else :class:`InvalidLayout`); since every subset of a
    valid layout is valid, every intermediate state is valid too.
    """
    model = gpu_model_resolve(gpu_model)
    before = Counter(mig_layout_require_valid(model, current, "current layout"))
    after = Counter(mig_layout_require_valid(model, target, "target layout"))
    keep = tuple(sorted((before & after).elements()))
    destroy = tuple(sorted((before - after).elements()))
    # Create the largest instances first, as mig-parted does; with explicit
    # placements any order works, this one just matches what operators expect.
    create = tuple(sorted((after - before).elements(), key=lambda p: _create_order_key(model, p)))
    operations = tuple([("destroy", p) for p in destroy] + [("create", p) for p in create])
    return LayoutDiff(keep=keep, destroy=destroy, create=create, operations=operations)


def _create_order_key(model: GpuModelSpec, placement: Placement) -> tuple[int, int, int, str]:
    profile = model.profile_get(placement.profile)
    return (-profile.memory_slices, -profile.compute_slices, placement.start, placement.profile)


# --------------------------------------------------------------------------- counts to placements


def mig_counts_to_layout_keeping(gpu_model: GpuModelSpec | str, counts: Mapping[str, int], keep: Iterable[Placement]) -> Layout | None:
    """A valid layout with exactly `counts` instances of each profile that holds every placement of `keep`
    (instances that keep serving while the rest of the GPU is re-partitioned: MIG's local reconfiguration),
    or None when there is none. Deterministic: the first such layout in the enumeration's order."""
    model = gpu_model_resolve(gpu_model)
    wanted = {profile.name: n for profile, n in _counts_normalise(model, counts).items() if n}
    kept = set(keep)
    if any(wanted.get(profile, 0) < n for profile, n in Counter(p.profile for p in kept).items()):
        return None
    for layout in _layouts_all(model):
        if kept <= set(layout) and Counter(p.profile for p in layout) == wanted:
            return layout
    return None


def mig_counts_to_layout(gpu_model: GpuModelSpec | str, counts: Mapping[str, int]) -> Layout | None:
    """Place the given number of instances of each profile, or return None if they cannot fit.

    mig-parted configs carry counts, not placements. The search is deterministic:
    instances are placed largest profile first, each at the lowest free legal start,
    backtracking when a later instance does not fit; the first complete placement
    is returned as a sorted layout. Unknown profile names raise
    :class:`UnknownMigProfile`; negative or non-integer counts raise ValueError.
    """
    model = gpu_model_resolve(gpu_model)
    wanted = _counts_normalise(model, counts)
    if not _counts_can_fit(model, wanted):
        return None
    queue = sorted(
        (profile for profile, n in wanted.items() for _ in range(n)),
        key=lambda p: (-p.memory_slices, -p.compute_slices, p.name),
    )
    found = _place_in_order(model, queue, 0, frozenset(), -1)
    return None if found is None else tuple(sorted(found))


def _counts_normalise(model: GpuModelSpec, counts: Mapping[str, int]) -> dict[MigProfileSpec, int]:
    if not isinstance(counts, Mapping):
        raise ValueError(f"counts must be a mapping of profile name to count, got {type(counts).__name__}")
    wanted: dict[MigProfileSpec, int] = {}
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"count for {name!r} must be a non-negative integer, got {n!r}")
        profile = model.profile_get(name)
        if n:
            wanted[profile] = wanted.get(profile, 0) + n
    return wanted


def _counts_can_fit(model: GpuModelSpec, wanted: Mapping[MigProfileSpec, int]) -> bool:
    # Cheap necessary conditions first, so hopeless requests skip the search.
    media: tuple[int, bool, bool] | None = _NO_MEDIA
    for profile, n in wanted.items():
        for _ in range(n):
            media = _media_state_after(media, profile) if media is not None else None
    return (
        media is not None
        and all(n <= profile.max_count for profile, n in wanted.items())
        and sum(profile.compute_slices * n for profile, n in wanted.items()) <= model.compute_slices
        and sum(profile.memory_slices * n for profile, n in wanted.items()) <= model.memory_slices
    )


def _place_in_order(
    model: GpuModelSpec,
    queue: Sequence[MigProfileSpec],
    i: int,
    used: frozenset[int],
    previous_start: int,
) -> list[Placement] | None:
    if i == len(queue):
        return []
    profile = queue[i]
    # Instances of one profile are interchangeable: demand increasing starts among
    # them so each assignment is tried once, not once per permutation.
    same_as_previous = i > 0 and queue[i - 1] is profile
    for start in profile.starts:
        if same_as_previous and start <= previous_start:
            continue
        slices = profile.occupies(start)
        if not used.isdisjoint(slices):
            continue
        rest = _place_in_order(model, queue, i + 1, used.union(slices), start)
        if rest is not None:
            return [Placement(profile.name, start), *rest]
    return None
