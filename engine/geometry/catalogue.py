"""The MIG catalogue: per GPU model, which GPU instance profiles exist, how many memory and compute
slices each one takes, and where each one may start (``data/mig_catalogue.json``, transcribed from
NVIDIA's MIG user guide, "Supported MIG Profiles").

Pure Python (stdlib only): the engine imports no Django, so it runs in agents, tests and benches alike.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CATALOGUE_PATH",
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
    "gpu_model_resolve",
    "plain_gpu_model_find",
    "mig_catalogue_load",
    "profile_name_normalise",
]

DEFAULT_CATALOGUE_PATH = Path(__file__).resolve().parent / "data" / "mig_catalogue.json"
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

# A GPU instance profile name as NVIDIA writes it: "<compute>g.<memory>gb" with an
# optional attribute suffix ("+me", and on newer parts "-me", "+gfx", "+me.all").
PROFILE_NAME_RE = re.compile(r"^[0-9]+g\.[0-9]+gb(?:[+-][a-z]+(?:\.[a-z]+)*)?$")

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
        key = profile_name_normalise(name)
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
