"""The MIG catalogue: per GPU model, which GPU instance profiles exist, how many memory and compute
slices each one takes, and where each one may start (``data/mig_catalogue.json``, transcribed from
NVIDIA's MIG user guide, "Supported MIG Profiles", and mig-parted's shipped configs; each model cites its
own sources). A model also carries the PCI device ids of its boards (what mig-parted's ``device-filter``
matches) and, for renamed profiles, the other names NVML gives them.

Models the catalogue lacks can be described from what NVML reports on the GPU itself
(`gpu_model_from_nvml`); such a model is labelled as such (``origin == "nvml"``) wherever it shows, and
`mig_catalogue_extended` lets the engine plan with it for the span of one solve.

Pure Python (stdlib only): the engine imports no Django, so it runs in agents, tests and benches alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CATALOGUE_PATH",
    "NVML_ORIGIN_LABEL",
    "PROFILE_NAME_RE",
    "CatalogueError",
    "GpuModelSpec",
    "MigCatalogue",
    "MigProfileSpec",
    "UnknownGpuModel",
    "UnknownMigProfile",
    "PLAIN_GPU_MODELS",
    "PlainGpuModel",
    "gpu_model_canonical",
    "gpu_model_from_nvml",
    "gpu_model_resolve",
    "mig_catalogue_extended",
    "pci_device_id_format",
    "pci_device_id_parse",
    "plain_gpu_model_find",
    "mig_catalogue_load",
    "profile_attributes",
    "profile_name_normalise",
]

DEFAULT_CATALOGUE_PATH = Path(__file__).resolve().parent / "data" / "mig_catalogue.json"
SUPPORTED_SCHEMA_VERSIONS = frozenset({2})
# How a GPU model described from NVML (not from the catalogue) is labelled wherever it shows.
NVML_ORIGIN_LABEL = "from NVML, not in the catalogue"

# A GPU instance profile name as NVIDIA writes it: "<compute>g.<memory>gb" with an optional attribute
# suffix: "+" and a comma-separated list of attributes ("+me", "+gfx", "+me.all"), or "-" and the
# attributes the profile lacks ("-me"). The attribute grammar is go-nvlib's (pkg/nvlib/device/
# mig_profile.go, parseMigProfileAttributes): letters and digits and inner dots, not starting with a digit.
_ATTRIBUTE = r"[a-z][a-z0-9]*(?:\.[a-z0-9]+)*"
PROFILE_NAME_RE = re.compile(rf"^[0-9]+g\.[0-9]+gb(?:[+-]{_ATTRIBUTE}(?:,{_ATTRIBUTE})*)?$")

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


# --------------------------------------------------------------------------- catalogue


def profile_attributes(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(attributes, attributes it lacks) of a profile name: "1g.24gb+me.all" -> (("me.all",), ()),
    "1g.24gb-me" -> ((), ("me",)), "3g.20gb" -> ((), ())."""
    for sign in "+-":
        if sign in name:
            _, _, suffix = name.partition(sign)
            attributes = tuple(suffix.split(","))
            return (attributes, ()) if sign == "+" else ((), attributes)
    return (), ()


@dataclass(frozen=True)
class MigProfileSpec:
    """One GPU instance profile of one GPU model (one row of ``nvidia-smi mig -lgip``)."""

    name: str
    profile_id: int | None  # the "ID" column of nvidia-smi mig -lgip (per GPU model!); None where unpublished
    memory_slices: int  # placement size, in memory slices (of GpuModelSpec.memory_slices)
    compute_slices: int  # SM slices (of GpuModelSpec.compute_slices)
    memory_gb: int  # nominal size, as in the profile name
    starts: tuple[int, ...]  # legal placement starts, in memory slices
    max_count: int
    media_extensions: bool  # a "+me" profile
    memory_gib_lgip: float | None = None  # informational: what -lgip printed in the cited capture
    aliases: tuple[str, ...] = ()  # other names boards give this profile (early GB200: 1g.24gb for 1g.23gb)

    def occupies(self, start: int) -> range:
        """Memory slices an instance of this profile started at ``start`` holds."""
        return range(start, start + self.memory_slices)

    @property
    def attributes(self) -> tuple[str, ...]:
        return profile_attributes(self.name)[0]

    @property
    def lacks(self) -> tuple[str, ...]:
        return profile_attributes(self.name)[1]

    @property
    def media_engines_all(self) -> bool:
        """A "+me.all" profile: it takes every media engine of the GPU (the guide's Profile References)."""
        return "me.all" in self.attributes

    @property
    def media_engines_none(self) -> bool:
        """A "-me" profile: it holds no media engine."""
        return "me" in self.lacks

    @property
    def holds_media_extensions(self) -> bool:
        """Whether an instance takes the GPU's one set of media extensions (+me, or all of them, +me.all)."""
        return self.media_extensions or self.media_engines_all


@dataclass(frozen=True)
class GpuModelSpec:
    """A MIG-capable GPU model: its slices, the profiles it offers and the PCI device ids of its boards.
    `origin` is "catalogue", or "nvml" for a model described from what NVML reports on a GPU the catalogue
    lacks (`label` then says so)."""

    name: str
    nvml_names: tuple[str, ...]
    memory_mib: int
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfileSpec, ...]
    pci_device_ids: tuple[int, ...] = ()  # 0xDDDDVVVV: device id in the high half, vendor (0x10DE) low
    origin: str = "catalogue"
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(profile.name for profile in self.profiles)

    @property
    def from_nvml(self) -> bool:
        return self.origin == "nvml"

    @property
    def label(self) -> str:
        """The model's name, and where it comes from when that is not the catalogue."""
        return f"{self.name} ({NVML_ORIGIN_LABEL})" if self.from_nvml else self.name

    def profile_find(self, name: str) -> MigProfileSpec | None:
        """The profile called `name`, or known by it on some boards (an alias), or None."""
        key = profile_name_normalise(name)
        for profile in self.profiles:
            if profile.name == key:
                return profile
        for profile in self.profiles:
            if key in profile.aliases:
                return profile
        return None

    def profile_by_id(self, profile_id: int) -> MigProfileSpec | None:
        """The profile with this -lgip id on this model (ids differ from model to model), or None."""
        return next((p for p in self.profiles if p.profile_id is not None and p.profile_id == profile_id), None)

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

    def gpu_model_find_by_pci(self, device_id: int | str) -> GpuModelSpec | None:
        """The model whose boards carry this PCI device id (0xDDDDVVVV, as mig-parted's device-filter
        writes it, or as an int), or None."""
        try:
            wanted = pci_device_id_parse(device_id)
        except ValueError:
            return None
        return next((m for m in self.gpu_models if wanted in m.pci_device_ids), None)

    def with_models(self, extra: Iterable[GpuModelSpec]) -> MigCatalogue:
        """This catalogue and `extra` (models described from NVML); a name that is already known keeps
        the catalogue's model, never the extra one."""
        added = tuple(m for m in extra if self.gpu_model_find(m.name) is None)
        if not added:
            return self
        return MigCatalogue(
            gpu_models=self.gpu_models + added, schema_version=self.schema_version, source=self.source,
            notes=self.notes,
        )

    def gpu_model_get(self, name: str) -> GpuModelSpec:
        model = self.gpu_model_find(name)
        if model is None:
            raise UnknownGpuModel(str(name), self.gpu_model_names)
        return model


def profile_name_normalise(name: str) -> str:
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


def pci_device_id_parse(value: int | str) -> int:
    """A PCI device id as mig-parted writes it ("0x20B010DE": device 0x20B0, vendor 0x10DE) -> int.
    ValueError for anything else (a subsystem-qualified id is not a board's device id)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a PCI device id")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"0[xX][0-9a-fA-F]{1,8}", value.strip()):
        number = int(value.strip(), 16)
    else:
        raise ValueError(f"{value!r} is not a PCI device id such as '0x20B010DE' (device id, then vendor id)")
    if not 0 < number <= 0xFFFFFFFF:
        raise ValueError(f"{value!r} is not a 32-bit PCI device id")
    return number


def pci_device_id_format(value: int) -> str:
    """0x20B010DE -> "0x20B010DE", the form mig-parted's DeviceID.String() prints."""
    return f"0x{value:08X}"


def _gpu_model_index_build(models: Iterable[GpuModelSpec]) -> dict[str, GpuModelSpec]:
    index: dict[str, GpuModelSpec] = {}
    owners: dict[int, GpuModelSpec] = {}
    for model in models:
        for device_id in model.pci_device_ids:
            other = owners.setdefault(device_id, model)
            if other is not model:
                raise CatalogueError(
                    f"PCI device id {pci_device_id_format(device_id)} is ambiguous: it names both "
                    f"{other.name} and {model.name}"
                )
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


def _default_catalogue_load() -> MigCatalogue:
    extra = _EXTENDED.get()
    return _default_catalogue_with(extra) if extra else _default_catalogue_read()


@functools.lru_cache(maxsize=16)
def _default_catalogue_with(extra: tuple[GpuModelSpec, ...]) -> MigCatalogue:
    # One catalogue object per set of extra models, so the layout caches keyed by model keep working.
    return _default_catalogue_read().with_models(extra)


@functools.lru_cache(maxsize=1)
def _default_catalogue_read() -> MigCatalogue:
    return _catalogue_read(DEFAULT_CATALOGUE_PATH)


# Models described from NVML that the default catalogue includes for the current context (one solve, one
# validation): a context variable, so concurrent solves in threads or tasks do not see each other's.
_EXTENDED: contextvars.ContextVar[tuple[GpuModelSpec, ...]] = contextvars.ContextVar("mig_catalogue_extended", default=())


@contextlib.contextmanager
def mig_catalogue_extended(models: Iterable[GpuModelSpec]) -> Iterator[MigCatalogue]:
    """Within the block, `mig_catalogue_load()` also knows `models` (GPU models described from NVML, for
    GPUs the catalogue lacks), so the planners, the validator and the layout code use them by name."""
    added = tuple(models)
    for model in added:
        if not isinstance(model, GpuModelSpec):
            raise TypeError(f"mig_catalogue_extended takes GpuModelSpec, got {type(model).__name__}")
    token = _EXTENDED.set(_EXTENDED.get() + added)
    try:
        yield mig_catalogue_load()
    finally:
        _EXTENDED.reset(token)


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
    names = [n for p in profiles for n in (p.name, *p.aliases)]
    ids = [p.profile_id for p in profiles if p.profile_id is not None]
    for attribute, values in (("name", names), ("profile_id", ids)):
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise CatalogueError(f"{where}: duplicate profile {attribute}: {', '.join(duplicates)}")
    source = raw.get("source")
    if not isinstance(source, dict) or not source or not all(isinstance(v, str) and v for v in source.values()):
        raise CatalogueError(f"{where}.source: every model must cite its sources (an object of non-empty texts)")
    raw_ids = raw.get("pci_device_ids")
    if not isinstance(raw_ids, list):
        raise CatalogueError(f"{where}.pci_device_ids: expected a list such as [\"0x20B010DE\"]")
    try:
        pci_ids = tuple(pci_device_id_parse(v) for v in raw_ids)
    except ValueError as exc:
        raise CatalogueError(f"{where}.pci_device_ids: {exc}") from exc
    if len(set(pci_ids)) != len(pci_ids):
        raise CatalogueError(f"{where}.pci_device_ids: an id is listed twice")
    return GpuModelSpec(
        name=name,
        nvml_names=tuple(nvml_names),
        memory_mib=_require(raw.get("memory_mib"), int, f"{where}.memory_mib", 1),
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        profiles=profiles,
        pci_device_ids=pci_ids,
        source=dict(source),
    )


def _profile_from_data(raw: Any, where: str, memory_slices: int, compute_slices: int) -> MigProfileSpec:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: expected an object")
    name = _require(raw.get("name"), str, f"{where}.name")
    where = f"{where} ({name})"
    if not PROFILE_NAME_RE.match(name):
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
    if media != ("me" in profile_attributes(name)[0]):
        raise CatalogueError(f"{where}: media_extensions must be true exactly for '+me' profiles")
    gib = raw.get("memory_gib_lgip")
    if gib is not None:
        _require(gib, (int, float), f"{where}.memory_gib_lgip", 0)
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and PROFILE_NAME_RE.match(a) for a in aliases):
        raise CatalogueError(f"{where}.aliases: expected a list of profile names such as '1g.24gb'")
    if any(profile_attributes(a) != profile_attributes(name) for a in aliases):
        raise CatalogueError(f"{where}.aliases: an alias must carry the same attributes as {name!r}")
    profile_id = raw.get("profile_id")
    return MigProfileSpec(
        name=name,
        profile_id=None if profile_id is None else _require(profile_id, int, f"{where}.profile_id", 0),
        memory_slices=size,
        compute_slices=compute,
        memory_gb=_require(raw.get("memory_gb"), int, f"{where}.memory_gb", 1),
        starts=tuple(starts),
        max_count=max_count,
        media_extensions=media,
        memory_gib_lgip=None if gib is None else float(gib),
        aliases=tuple(aliases),
    )


def gpu_model_from_nvml(
    name: str, memory_mib: int, profiles: Sequence[Mapping[str, Any]], nvml_names: Sequence[str] = (),
) -> GpuModelSpec:
    """A GPU model described from NVML's own profile table, for a GPU the catalogue lacks: `profiles` as
    the agent reports them ({"name", "profile_id", "memory_slices", "compute_slices", "memory_mb",
    "starts", "max_count"}; every start with the same size). The GPU's memory slices are where the
    largest placement ends, its compute slices the largest profile's. The model is labelled
    `NVML_ORIGIN_LABEL`; `nvml_names` are other names it goes by (NVML's own, where `name` is the
    device type profiles are kept under). CatalogueError when the table is not a consistent profile table."""
    where = f"NVML profile table of {name!r}"
    if not isinstance(name, str) or not name.strip():
        raise CatalogueError(f"{where}: the GPU needs a name")
    if not isinstance(profiles, Sequence) or isinstance(profiles, (str, bytes)) or not profiles:
        raise CatalogueError(f"{where}: no profiles")
    try:
        memory_slices = max(int(p["starts"][-1]) + int(p["memory_slices"]) for p in profiles if p.get("starts"))
        compute_slices = max(int(p["compute_slices"]) for p in profiles)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CatalogueError(f"{where}: malformed profile ({exc})") from exc
    rows = []
    for p in profiles:
        profile_name = profile_name_normalise(str(p.get("name", "")))
        memory_mb = p.get("memory_mb")
        rows.append({
            "name": profile_name,
            "profile_id": p.get("profile_id"),
            "memory_slices": p.get("memory_slices"),
            "compute_slices": p.get("compute_slices"),
            # NVML gives MiB; the nominal GB is what the profile's name says, where it says it.
            "memory_gb": _name_gb(profile_name) or max(1, round((memory_mb or 1024) / 1024)),
            "starts": sorted(p.get("starts") or []),
            "max_count": p.get("max_count"),
            "media_extensions": "me" in profile_attributes(profile_name)[0],
        })
    raw = {
        "name": name.strip(), "nvml_names": list(dict.fromkeys([name.strip(), *nvml_names])), "memory_mib": int(memory_mib or 1),
        "memory_slices": memory_slices, "compute_slices": compute_slices, "profiles": rows,
        "pci_device_ids": [], "source": {"profiles": "NVML on the GPU itself (nvmlDeviceGetGpuInstanceProfileInfo, "
                                                     "nvmlDeviceGetGpuInstancePossiblePlacements)"},
    }
    model = _gpu_model_from_data(raw, where)
    return GpuModelSpec(
        name=model.name, nvml_names=model.nvml_names, memory_mib=model.memory_mib, memory_slices=model.memory_slices,
        compute_slices=model.compute_slices, profiles=model.profiles, origin="nvml", source=model.source,
    )


def _name_gb(profile_name: str) -> int | None:
    match = re.match(r"^[0-9]+g\.([0-9]+)gb", profile_name)
    return int(match[1]) if match and int(match[1]) > 0 else None


def gpu_model_resolve(gpu_model: GpuModelSpec | str) -> GpuModelSpec:
    if isinstance(gpu_model, GpuModelSpec):
        return gpu_model
    if isinstance(gpu_model, str):
        return mig_catalogue_load().gpu_model_get(gpu_model)
    raise TypeError(f"gpu_model must be a GpuModelSpec or a model name, got {type(gpu_model).__name__}")


# --------------------------------------------------------------------------- GPUs without MIG


@dataclass(frozen=True)
class PlainGpuModel:
    """A GPU model without MIG that Tessera knows by name (served whole or shared with MPS): the name
    profiles and problems use, the names NVML reports for it, its memory."""

    name: str
    nvml_names: tuple[str, ...]
    memory_mib: int


# The names profiles are keyed by (gpulets' measurements: engine.reference.profiles.GPULET_GPU_MODEL) and
# what NVML reports for the board, so an agent's inventory and the registry's profiles meet.
PLAIN_GPU_MODELS: tuple[PlainGpuModel, ...] = (
    PlainGpuModel("T4", ("Tesla T4", "NVIDIA T4"), 15360),
    PlainGpuModel("L4", ("NVIDIA L4",), 23034),
    PlainGpuModel("RTX-2080Ti", ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"), 11264),
)
_PLAIN_INDEX = {_model_key(alias): m for m in PLAIN_GPU_MODELS for alias in (m.name, *m.nvml_names)}


def plain_gpu_model_find(name: str) -> PlainGpuModel | None:
    """The GPU without MIG `name` names (its name or an NVML name, spelt loosely), or None."""
    return _PLAIN_INDEX.get(_model_key(name)) if isinstance(name, str) else None


def gpu_model_canonical(name: str, catalogue: MigCatalogue | None = None) -> str | None:
    """The one spelling of a known GPU model in profiles and problems: the MIG catalogue's name, else the
    name of a known GPU without MIG; None for a GPU Tessera does not know (callers keep its name)."""
    spec = (catalogue or mig_catalogue_load()).gpu_model_find(name)
    if spec is not None:
        return spec.name
    plain = plain_gpu_model_find(name)
    return plain.name if plain is not None else None
