"""MIG (NVIDIA Multi-Instance GPU) geometry for the planning engine.

What lives here:

* the MIG catalogue (``data/mig_catalogue.json``): per GPU model, which GPU
  instance profiles exist, how many memory and compute slices each one takes,
  and where each one may start;
* layouts: a layout is the set of GPU instances on one GPU, each written
  ``profile@start`` (``"3g.20gb@4"``), the start counted in memory slices the
  way ``nvidia-smi mig -lgipp`` prints it;
* validation, enumeration and minimal diffs of layouts;
* import and export of NVIDIA mig-parted ``config.yaml`` files.

The module is pure Python (stdlib and PyYAML): the planning engine must not
import Django, so that it can run in workers and in tests without settings.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

__all__ = [
    "CODE_COMPUTE_OVER",
    "CODE_ILLEGAL_START",
    "CODE_MEDIA_EXTENSION_OVER",
    "CODE_OVERLAP",
    "CODE_TOO_MANY",
    "CODE_UNKNOWN_PROFILE",
    "DEFAULT_CATALOGUE_PATH",
    "CatalogueError",
    "GpuModelSpec",
    "InvalidLayout",
    "Layout",
    "LayoutDiff",
    "LayoutVerdict",
    "MigCatalogue",
    "MigPartedEntry",
    "MigPartedError",
    "MigProfileSpec",
    "Placement",
    "UnknownGpuModel",
    "UnknownMigProfile",
    "layout_counts",
    "layout_parse",
    "mig_catalogue_load",
    "mig_counts_to_layout",
    "mig_layout_diff",
    "mig_layout_validate",
    "mig_layouts_enumerate",
    "mig_parted_export",
    "mig_parted_import",
    "placement_parse",
]

DEFAULT_CATALOGUE_PATH = Path(__file__).resolve().parent / "data" / "mig_catalogue.json"
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

CODE_UNKNOWN_PROFILE = "unknown_profile"
CODE_ILLEGAL_START = "illegal_start"
CODE_OVERLAP = "overlap"
CODE_TOO_MANY = "too_many"
CODE_COMPUTE_OVER = "compute_over"
CODE_MEDIA_EXTENSION_OVER = "media_extension_over"

# A GPU instance profile name as NVIDIA writes it: "<compute>g.<memory>gb" with an
# optional attribute suffix ("+me", and on newer parts "-me", "+gfx", "+me.all").
_PROFILE_NAME_RE = re.compile(r"^[0-9]+g\.[0-9]+gb(?:[+-][a-z]+(?:\.[a-z]+)*)?$")
# mig-parted also accepts compute-instance-qualified names ("1c.3g.20gb").
_MIG_PARTED_PROFILE_RE = re.compile(r"^(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[+-][a-z]+(?:\.[a-z]+)*)?$")
# "profile@start"; nvidia-smi's "MIG " prefix on the profile is tolerated.
_PLACEMENT_RE = re.compile(r"^\s*(?:MIG\s+)?(?P<profile>[^@\s]+)\s*@\s*(?P<start>[0-9]+)\s*$", re.IGNORECASE)
_MIG_PARTED_VERSION = "v1"


# --------------------------------------------------------------------------- errors


class CatalogueError(ValueError):
    """The catalogue file is missing, unreadable or internally inconsistent."""


class UnknownGpuModel(ValueError):
    """A GPU model name that is neither a catalogue key nor one of its NVML names."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown GPU model {name!r}; known models: {', '.join(self.known)}")


class UnknownMigProfile(ValueError):
    """A profile name that the given GPU model does not offer."""

    def __init__(self, profile: str, gpu_model: str, known: Sequence[str]) -> None:
        self.profile = profile
        self.gpu_model = gpu_model
        self.known = tuple(known)
        super().__init__(
            f"profile {profile!r} does not exist on {gpu_model} (known: {', '.join(self.known)})"
        )


class InvalidLayout(ValueError):
    """A layout failed validation; ``verdict`` says why."""

    def __init__(self, verdict: LayoutVerdict, what: str = "layout") -> None:
        self.verdict = verdict
        super().__init__(f"invalid {what}: {verdict.reason} [{verdict.code}]")


class MigPartedError(ValueError):
    """A mig-parted config that is not valid YAML or not a valid ``version: v1`` config."""


# --------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class MigProfileSpec:
    """One GPU instance profile of one GPU model (one row of ``nvidia-smi mig -lgip``)."""

    name: str
    profile_id: int  # the "ID" column of nvidia-smi mig -lgip, used by -cgi
    memory_slices: int  # placement size, in memory slices (of GpuModelSpec.memory_slices)
    compute_slices: int  # SM slices (of GpuModelSpec.compute_slices)
    memory_gb: int  # nominal size, as in the profile name
    starts: tuple[int, ...]  # legal placement starts, in memory slices
    max_count: int
    media_extensions: bool  # a "+me" profile
    memory_gib_lgip: float | None = None  # informational: what -lgip printed in the cited capture

    def occupies(self, start: int) -> range:
        """Memory slices an instance of this profile started at ``start`` holds."""
        return range(start, start + self.memory_slices)


@dataclass(frozen=True)
class GpuModelSpec:
    """A MIG-capable GPU model: its slices and the profiles it offers."""

    name: str
    nvml_names: tuple[str, ...]
    memory_mib: int
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfileSpec, ...]

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(profile.name for profile in self.profiles)

    def profile_find(self, name: str) -> MigProfileSpec | None:
        key = _profile_key(name)
        for profile in self.profiles:
            if profile.name == key:
                return profile
        return None

    def profile_get(self, name: str) -> MigProfileSpec:
        profile = self.profile_find(name)
        if profile is None:
            raise UnknownMigProfile(name, self.name, self.profile_names)
        return profile


@dataclass(frozen=True)
class MigCatalogue:
    """Every GPU model the engine knows, looked up by key or NVML product name."""

    gpu_models: tuple[GpuModelSpec, ...]
    schema_version: int
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    notes: tuple[str, ...] = ()
    _index: Mapping[str, GpuModelSpec] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        # The index is derived data; frozen dataclasses need object.__setattr__ for it.
        object.__setattr__(self, "_index", _gpu_model_index_build(self.gpu_models))

    @property
    def gpu_model_names(self) -> tuple[str, ...]:
        return tuple(model.name for model in self.gpu_models)

    def gpu_model_find(self, name: str) -> GpuModelSpec | None:
        if not isinstance(name, str):
            return None
        return self._index.get(_model_key(name))

    def gpu_model_get(self, name: str) -> GpuModelSpec:
        model = self.gpu_model_find(name)
        if model is None:
            raise UnknownGpuModel(str(name), self.gpu_model_names)
        return model


def _profile_key(name: str) -> str:
    # nvidia-smi prints "MIG 1g.5gb"; people type "1G.5GB". Both mean 1g.5gb.
    text = name.strip().lower()
    if text.startswith("mig "):
        text = text[4:].strip()
    return text


def _model_key(name: str) -> str:
    # NVML says "NVIDIA A100-SXM4-40GB", Kubernetes GFD labels say
    # "NVIDIA-A100-SXM4-40GB", people say "a100-sxm4-40gb": fold them together.
    text = re.sub(r"[\s_\-]+", "-", name.strip().lower()).strip("-")
    if text.startswith("nvidia-"):
        text = text[len("nvidia-"):]
    return text


def _gpu_model_index_build(models: Iterable[GpuModelSpec]) -> dict[str, GpuModelSpec]:
    index: dict[str, GpuModelSpec] = {}
    for model in models:
        for alias in (model.name, *model.nvml_names):
            key = _model_key(alias)
            other = index.get(key)
            if other is not None and other is not model:
                raise CatalogueError(
                    f"GPU model name {alias!r} is ambiguous: it names both {other.name} and {model.name}"
                )
            index[key] = model
    return index


def mig_catalogue_load(path: str | Path | None = None) -> MigCatalogue:
    """Load the MIG catalogue; the default file is read once and cached."""
    if path is None:
        return _default_catalogue_load()
    return _catalogue_read(Path(path))


@functools.lru_cache(maxsize=1)
def _default_catalogue_load() -> MigCatalogue:
    return _catalogue_read(DEFAULT_CATALOGUE_PATH)


def _catalogue_read(path: Path) -> MigCatalogue:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogueError(f"cannot read MIG catalogue {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CatalogueError(f"MIG catalogue {path} is not valid JSON: {exc}") from exc
    return _catalogue_from_data(data, str(path))


def _catalogue_from_data(data: Any, origin: str) -> MigCatalogue:
    if not isinstance(data, dict):
        raise CatalogueError(f"{origin}: the catalogue must be a JSON object")
    version = data.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise CatalogueError(
            f"{origin}: schema_version {version!r} is not supported "
            f"(supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})"
        )
    if "source" not in data:
        raise CatalogueError(f"{origin}: the catalogue must cite its source")
    raw_models = data.get("gpu_models")
    if not isinstance(raw_models, list) or not raw_models:
        raise CatalogueError(f"{origin}: gpu_models must be a non-empty list")
    models = tuple(
        _gpu_model_from_data(raw, f"{origin}: gpu_models[{i}]") for i, raw in enumerate(raw_models)
    )
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        raise CatalogueError(f"{origin}: notes must be a list of strings")
    source = data["source"] if isinstance(data["source"], dict) else {"text": data["source"]}
    try:
        return MigCatalogue(gpu_models=models, schema_version=version, source=source, notes=tuple(notes))
    except CatalogueError as exc:
        raise CatalogueError(f"{origin}: {exc}") from exc


def _require(value: Any, kind: type | tuple[type, ...], where: str, minimum: int | None = None) -> Any:
    # bool is an int in Python; a catalogue that says "memory_slices": true is wrong.
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise CatalogueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    if minimum is not None and value < minimum:
        raise CatalogueError(f"{where}: must be at least {minimum}, got {value!r}")
    return value


def _gpu_model_from_data(raw: Any, where: str) -> GpuModelSpec:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: expected an object")
    name = _require(raw.get("name"), str, f"{where}.name")
    where = f"{where} ({name})"
    nvml_names = raw.get("nvml_names", [])
    if not isinstance(nvml_names, list) or not all(isinstance(n, str) and n for n in nvml_names):
        raise CatalogueError(f"{where}.nvml_names: expected a list of names")
    memory_slices = _require(raw.get("memory_slices"), int, f"{where}.memory_slices", 1)
    compute_slices = _require(raw.get("compute_slices"), int, f"{where}.compute_slices", 1)
    raw_profiles = raw.get("profiles")
    if not isinstance(raw_profiles, list) or not raw_profiles:
        raise CatalogueError(f"{where}.profiles: expected a non-empty list")
    profiles = tuple(
        _profile_from_data(p, f"{where}.profiles[{i}]", memory_slices, compute_slices)
        for i, p in enumerate(raw_profiles)
    )
    for attribute in ("name", "profile_id"):
        values = [getattr(p, attribute) for p in profiles]
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise CatalogueError(f"{where}: duplicate profile {attribute}: {', '.join(duplicates)}")
    return GpuModelSpec(
        name=name,
        nvml_names=tuple(nvml_names),
        memory_mib=_require(raw.get("memory_mib"), int, f"{where}.memory_mib", 1),
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        profiles=profiles,
    )


def _profile_from_data(raw: Any, where: str, memory_slices: int, compute_slices: int) -> MigProfileSpec:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: expected an object")
    name = _require(raw.get("name"), str, f"{where}.name")
    where = f"{where} ({name})"
    if not _PROFILE_NAME_RE.match(name):
        raise CatalogueError(f"{where}: {name!r} is not a GPU instance profile name such as '3g.20gb'")
    size = _require(raw.get("memory_slices"), int, f"{where}.memory_slices", 1)
    compute = _require(raw.get("compute_slices"), int, f"{where}.compute_slices", 1)
    if size > memory_slices or compute > compute_slices:
        raise CatalogueError(
            f"{where}: larger than the GPU "
            f"({size}/{memory_slices} memory, {compute}/{compute_slices} compute slices)"
        )
    starts = raw.get("starts")
    if not isinstance(starts, list) or not starts:
        raise CatalogueError(f"{where}.starts: expected a non-empty list")
    for start in starts:
        _require(start, int, f"{where}.starts", 0)
        if start + size > memory_slices:
            raise CatalogueError(
                f"{where}: start {start} + size {size} runs past memory slice {memory_slices - 1}"
            )
    if starts != sorted(set(starts)):
        raise CatalogueError(f"{where}.starts: must be strictly increasing")
    max_count = _require(raw.get("max_count"), int, f"{where}.max_count", 1)
    if max_count > len(starts):
        # Two instances at the same start would overlap, so a profile can never
        # have more instances than it has starts.
        raise CatalogueError(f"{where}: max_count {max_count} exceeds its {len(starts)} starts")
    media = _require(raw.get("media_extensions"), bool, f"{where}.media_extensions")
    if media != name.endswith("+me"):
        raise CatalogueError(f"{where}: media_extensions must be true exactly for '+me' profiles")
    gib = raw.get("memory_gib_lgip")
    if gib is not None:
        _require(gib, (int, float), f"{where}.memory_gib_lgip", 0)
    return MigProfileSpec(
        name=name,
        profile_id=_require(raw.get("profile_id"), int, f"{where}.profile_id", 0),
        memory_slices=size,
        compute_slices=compute,
        memory_gb=_require(raw.get("memory_gb"), int, f"{where}.memory_gb", 1),
        starts=tuple(starts),
        max_count=max_count,
        media_extensions=media,
        memory_gib_lgip=None if gib is None else float(gib),
    )


def _gpu_model_resolve(gpu_model: GpuModelSpec | str) -> GpuModelSpec:
    if isinstance(gpu_model, GpuModelSpec):
        return gpu_model
    if isinstance(gpu_model, str):
        return mig_catalogue_load().gpu_model_get(gpu_model)
    raise TypeError(f"gpu_model must be a GpuModelSpec or a model name, got {type(gpu_model).__name__}")


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
    profile = _profile_key(match["profile"])
    if not _PROFILE_NAME_RE.match(profile):
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
    model = _gpu_model_resolve(gpu_model)
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
    # The media engines (NVJPG, OFA) exist once per GPU, so only one +me instance fits.
    media = [placement for placement, profile in resolved if profile.media_extensions]
    if len(media) > 1:
        reason = (
            f"{', '.join(map(str, media))}: at most one media-extension (+me) instance fits on "
            f"{model.name}, the layout has {len(media)}"
        )
        return _invalid(CODE_MEDIA_EXTENSION_OVER, reason)
    return None


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


def _layout_require_valid(model: GpuModelSpec, layout: LayoutLike, what: str) -> Layout:
    placements = layout_parse(layout)
    verdict = mig_layout_validate(model, placements)
    if not verdict.valid:
        raise InvalidLayout(verdict, what)
    return placements


# --------------------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class _Occupancy:
    """What a partial layout uses up; enough to tell whether one more instance fits."""

    slices: frozenset[int]
    counts: Mapping[str, int]
    compute: int
    media: int

    @classmethod
    def of(cls, model: GpuModelSpec, layout: Layout) -> _Occupancy:
        profiles = [model.profile_get(placement.profile) for placement in layout]
        return cls(
            slices=frozenset(s for p, spec in zip(layout, profiles) for s in spec.occupies(p.start)),
            counts=Counter(spec.name for spec in profiles),
            compute=sum(spec.compute_slices for spec in profiles),
            media=sum(1 for spec in profiles if spec.media_extensions),
        )

    def admits(self, model: GpuModelSpec, profile: MigProfileSpec, start: int) -> bool:
        return (
            start in profile.starts
            and self.slices.isdisjoint(profile.occupies(start))
            and self.counts.get(profile.name, 0) < profile.max_count
            and self.compute + profile.compute_slices <= model.compute_slices
            and not (profile.media_extensions and self.media >= 1)
        )


def mig_layouts_enumerate(gpu_model: GpuModelSpec | str, maximal: bool = False) -> list[Layout]:
    """Every valid layout of the GPU model, as sorted tuples, each exactly once.

    The empty layout is included. With ``maximal=True`` only the layouts to which no
    further instance can be added are kept (the empty layout is never maximal).
    """
    model = _gpu_model_resolve(gpu_model)
    layouts = _layouts_maximal(model) if maximal else _layouts_all(model)
    return list(layouts)


@functools.lru_cache(maxsize=64)
def _layouts_all(model: GpuModelSpec) -> tuple[Layout, ...]:
    profiles_at = {
        start: tuple(p for p in model.profiles if start in p.starts) for start in range(model.memory_slices)
    }
    index_of = {profile.name: i for i, profile in enumerate(model.profiles)}

    @functools.lru_cache(maxsize=None)
    def suffixes(cursor: int, counts: tuple[int, ...], compute: int, media: int) -> tuple[Layout, ...]:
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
            if (
                cursor + profile.memory_slices > model.memory_slices
                or counts[i] >= profile.max_count
                or compute + profile.compute_slices > model.compute_slices
                or (profile.media_extensions and media >= 1)
            ):
                continue
            after = counts[:i] + (counts[i] + 1,) + counts[i + 1:]
            head = Placement(profile.name, cursor)
            rest = suffixes(
                cursor + profile.memory_slices,
                after,
                compute + profile.compute_slices,
                media + int(profile.media_extensions),
            )
            found.extend((head, *tail) for tail in rest)
        return tuple(found)

    layouts = suffixes(0, (0,) * len(model.profiles), 0, 0)
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
    model = _gpu_model_resolve(gpu_model)
    before = Counter(_layout_require_valid(model, current, "current layout"))
    after = Counter(_layout_require_valid(model, target, "target layout"))
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


def mig_counts_to_layout(gpu_model: GpuModelSpec | str, counts: Mapping[str, int]) -> Layout | None:
    """Place the given number of instances of each profile, or return None if they cannot fit.

    mig-parted configs carry counts, not placements. The search is deterministic:
    instances are placed largest profile first, each at the lowest free legal start,
    backtracking when a later instance does not fit; the first complete placement
    is returned as a sorted layout. Unknown profile names raise
    :class:`UnknownMigProfile`; negative or non-integer counts raise ValueError.
    """
    model = _gpu_model_resolve(gpu_model)
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
    return (
        all(n <= profile.max_count for profile, n in wanted.items())
        and sum(n for profile, n in wanted.items() if profile.media_extensions) <= 1
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


# --------------------------------------------------------------------------- mig-parted


Devices = Union[Literal["all"], tuple[int, ...]]


@dataclass(frozen=True)
class MigPartedEntry:
    """One entry of a mig-parted config: which devices, MIG on or off, how many of each profile."""

    devices: Devices
    mig_enabled: bool
    counts: Mapping[str, int] = field(default_factory=dict, hash=False)
    device_filter: tuple[str, ...] | None = None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _mapping_construct_unique(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let the normal constructor report it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_construct_unique)


def mig_parted_import(text: str) -> dict[str, list[MigPartedEntry]]:
    """Parse a mig-parted ``config.yaml`` (``version: v1``).

    Follows mig-parted's own rules (api/spec/v1/spec.go): only ``version`` and
    ``mig-configs`` at the top; every config a non-empty list; every entry needs
    ``devices`` (``all`` or a list of indices) and ``mig-enabled``; ``mig-devices``
    is required when MIG is enabled and must be empty when it is not. Zero counts
    are dropped. Anything else raises :class:`MigPartedError` naming the offending path.
    """
    if not isinstance(text, str):
        raise MigPartedError(f"mig-parted config must be text, got {type(text).__name__}")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise MigPartedError(f"malformed YAML in mig-parted config: {exc}") from exc
    if not isinstance(data, dict):
        raise MigPartedError("mig-parted config must be a mapping with 'version' and 'mig-configs'")
    unexpected = sorted(str(key) for key in data if key not in ("version", "mig-configs"))
    if unexpected:
        raise MigPartedError(f"unexpected top-level field(s): {', '.join(unexpected)}")
    if data.get("version") != _MIG_PARTED_VERSION:
        raise MigPartedError(f"unsupported mig-parted config version {data.get('version')!r} (expected 'v1')")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigPartedError("'mig-configs' must be a non-empty mapping of config name to entries")
    return {str(name): _mig_parted_config_parse(str(name), entries) for name, entries in configs.items()}


def _mig_parted_config_parse(name: str, entries: Any) -> list[MigPartedEntry]:
    where = f"mig-configs.{name}"
    if not isinstance(entries, list) or not entries:
        raise MigPartedError(f"{where}: must be a non-empty list of entries")
    return [_mig_parted_entry_parse(f"{where}[{i}]", entry) for i, entry in enumerate(entries)]


def _mig_parted_entry_parse(where: str, entry: Any) -> MigPartedEntry:
    if not isinstance(entry, dict):
        raise MigPartedError(f"{where}: each entry must be a mapping")
    allowed = ("devices", "mig-enabled", "mig-devices", "device-filter")
    unexpected = sorted(str(k) for k in entry if k not in allowed)
    if unexpected:
        raise MigPartedError(f"{where}: unexpected field(s): {', '.join(unexpected)}")
    for required in ("devices", "mig-enabled"):
        if required not in entry:
            raise MigPartedError(f"{where}: missing required field '{required}'")
    enabled = entry["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigPartedError(f"{where}.mig-enabled: must be true or false, got {enabled!r}")
    if enabled and "mig-devices" not in entry:
        raise MigPartedError(f"{where}: 'mig-devices' is required when 'mig-enabled' is true")
    counts = _mig_parted_counts_parse(f"{where}.mig-devices", entry.get("mig-devices"))
    if not enabled and counts:
        raise MigPartedError(f"{where}: MIG devices listed while 'mig-enabled' is false")
    return MigPartedEntry(
        devices=_mig_parted_devices_parse(f"{where}.devices", entry["devices"]),
        mig_enabled=enabled,
        counts=counts,
        device_filter=_mig_parted_filter_parse(f"{where}.device-filter", entry.get("device-filter")),
    )


def _mig_parted_devices_parse(where: str, devices: Any) -> Devices:
    if devices == "all":
        return "all"
    if isinstance(devices, list) and devices:
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            raise MigPartedError(f"{where}: device indices must be non-negative integers, got {devices!r}")
        if len(set(devices)) != len(devices):
            raise MigPartedError(f"{where}: a device index is listed twice in {devices!r}")
        return tuple(devices)
    raise MigPartedError(f"{where}: must be 'all' or a non-empty list of device indices, got {devices!r}")


def _mig_parted_counts_parse(where: str, raw: Any) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MigPartedError(f"{where}: must be a mapping of profile name to count, got {raw!r}")
    counts: dict[str, int] = {}
    for name, n in raw.items():
        if not isinstance(name, str) or not _MIG_PARTED_PROFILE_RE.match(name):
            raise MigPartedError(f"{where}: {name!r} is not a MIG profile name such as '1g.5gb'")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MigPartedError(f"{where}.{name}: count must be a non-negative integer, got {n!r}")
        if n:
            counts[name] = n
    return counts


def _mig_parted_filter_parse(where: str, raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        return tuple(raw)
    raise MigPartedError(f"{where}: must be a PCI device id string or a list of them, got {raw!r}")


ExportEntry = Union[
    tuple[Union[GpuModelSpec, str], Union[LayoutLike, None]],
    tuple[Union[GpuModelSpec, str], Union[LayoutLike, None], Union[Devices, Sequence[int]]],
]


def mig_parted_export(configs: Mapping[str, Sequence[ExportEntry]]) -> str:
    """Write layouts as a mig-parted ``config.yaml`` (``version: v1``).

    ``configs`` maps a config name to entries ``(gpu_model, layout)`` or
    ``(gpu_model, layout, devices)``. ``layout=None`` disables MIG on those devices;
    an empty layout enables MIG with no instances. Without ``devices``, a config
    with a single entry applies to ``all`` devices and otherwise entry *i* applies
    to device *i*. mig-parted keeps counts only, so each entry carries its exact
    placements as a YAML comment. Layouts are validated (:class:`InvalidLayout`).
    """
    if not isinstance(configs, Mapping) or not configs:
        raise ValueError("mig-parted export needs at least one named config")
    lines = [f"version: {_MIG_PARTED_VERSION}", "mig-configs:"]
    for name, entries in configs.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"config names must be non-empty strings, got {name!r}")
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence) or not entries:
            raise ValueError(f"config {name!r} needs a non-empty list of (gpu_model, layout) entries")
        lines.append(f"  {_yaml_scalar(name)}:")
        seen_devices: set[int] = set()
        for i, entry in enumerate(entries):
            lines.extend(_mig_parted_entry_lines(name, i, len(entries), entry, seen_devices))
    return "\n".join(lines) + "\n"


def _mig_parted_entry_lines(
    config: str, i: int, total: int, entry: Any, seen_devices: set[int]
) -> list[str]:
    if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
        raise ValueError(
            f"config {config!r} entry {i}: expected (gpu_model, layout[, devices]), got {entry!r}"
        )
    model = _gpu_model_resolve(entry[0])
    devices = _export_devices(config, i, total, entry[2] if len(entry) == 3 else None, seen_devices)
    devices_text = "all" if devices == "all" else "[" + ", ".join(map(str, devices)) + "]"
    if entry[1] is None:
        return [
            f"    # {model.name}: MIG disabled",
            f"    - devices: {devices_text}",
            "      mig-enabled: false",
        ]
    layout = _layout_require_valid(model, entry[1], f"layout for config {config!r} entry {i}")
    placements_text = " ".join(map(str, layout)) or "(no instances)"
    lines = [
        f"    # {model.name}: {placements_text}",
        f"    - devices: {devices_text}",
        "      mig-enabled: true",
    ]
    counts = layout_counts(layout)
    if not counts:
        return lines + ["      mig-devices: {}"]
    lines.append("      mig-devices:")
    # Largest profiles first, the order mig-parted itself creates them in.
    for profile in sorted(model.profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name)):
        if counts.get(profile.name):
            lines.append(f"        {json.dumps(profile.name)}: {counts[profile.name]}")
    return lines


def _export_devices(config: str, i: int, total: int, devices: Any, seen: set[int]) -> Devices:
    where = f"config {config!r} entry {i}"
    if devices is None:
        devices = "all" if total == 1 else (i,)
    if devices == "all":
        if total > 1:
            raise ValueError(f"{where}: 'all' devices only makes sense for a single entry")
        return "all"
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise ValueError(f"{where}: devices must be 'all' or device indices, got {devices!r}")
    indices = tuple(devices)
    if not indices or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in indices):
        raise ValueError(f"{where}: devices must be non-negative integers, got {devices!r}")
    clash = sorted(seen.intersection(indices))
    if clash or len(set(indices)) != len(indices):
        raise ValueError(f"{where}: device(s) {clash or list(indices)} given twice")
    seen.update(indices)
    return indices


def _yaml_scalar(text: str) -> str:
    # Plain when YAML reads it back as the same string ("all-1g.5gb"); quoted when
    # it would turn into something else ("true", "1", "a: b").
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(text)
