"""NVIDIA mig-parted ``config.yaml`` files (``version: v1``): read them into validated entries and write
layouts back out, with the explicit placements as YAML comments (mig-parted itself takes counts only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import yaml

from engine.geometry.catalogue import GpuModelSpec, gpu_model_resolve
from engine.geometry.layout import LayoutLike, layout_counts, mig_layout_require_valid

__all__ = ["MigPartedEntry", "MigPartedError", "mig_parted_export", "mig_parted_import"]

# mig-parted also accepts compute-instance-qualified names ("1c.3g.20gb").
_MIG_PARTED_PROFILE_RE = re.compile(r"^(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[+-][a-z]+(?:\.[a-z]+)*)?$")
_MIG_PARTED_VERSION = "v1"


class MigPartedError(ValueError):
    """A mig-parted config that is not valid YAML or not a valid ``version: v1`` config."""



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
    model = gpu_model_resolve(entry[0])
    devices = _export_devices(config, i, total, entry[2] if len(entry) == 3 else None, seen_devices)
    devices_text = "all" if devices == "all" else "[" + ", ".join(map(str, devices)) + "]"
    if entry[1] is None:
        return [
            f"    # {model.name}: MIG disabled",
            f"    - devices: {devices_text}",
            "      mig-enabled: false",
        ]
    layout = mig_layout_require_valid(model, entry[1], f"layout for config {config!r} entry {i}")
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
