"""NVIDIA mig-parted ``config.yaml`` files (``version: v1``): read them into validated entries, resolve which
entries of a named config apply to a GPU model (``device-filter`` against the model's PCI device ids, the
profile names against its profiles), and write layouts back out, with the explicit placements as YAML
comments (mig-parted itself takes counts only).

The rules are mig-parted's own (NVIDIA/mig-parted api/spec/v1/spec.go and helpers.go, pkg/types/device.go
and mig_config.go, and go-nvlib's pkg/nvlib/device/mig_profile.go for profile names):

- top level: ``version: v1`` and a non-empty ``mig-configs`` mapping, nothing else; every config a
  non-empty list of entries;
- an entry: ``devices`` (``all`` or a list of GPU indices) and ``mig-enabled`` are required;
  ``mig-devices`` is required when MIG is enabled and must be empty when it is not; ``device-filter`` is
  one PCI device id or a list of them (``0xDDDDVVVV``: device id, then vendor id, optionally
  ``:0xSSSSVVVV`` for the subsystem); nothing else;
- ``mig-devices``: profile name to count, counts non-negative and, when any is given, not all zero;
  names ``[<c>c.]<g>g.<gb>gb`` with ``+attributes`` or ``-attributes`` (comma-separated, such as
  ``+me``, ``+me.all``, ``+gfx``, ``-me``);
- applying: for every GPU, each entry whose filter matches the GPU's PCI device id (no filter matches
  every GPU) and whose ``devices`` include its index is applied in turn (assert/assert.go
  WalkSelectedMigConfigForEachGPU), so the last such entry decides.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import yaml

from engine.geometry.catalogue import (
    GpuModelSpec,
    UnknownMigProfile,
    gpu_model_resolve,
    pci_device_id_format,
)
from engine.geometry.layout import Layout, LayoutLike, layout_counts, mig_counts_to_layout, mig_layout_require_valid

__all__ = [
    "DeviceFilter",
    "MigPartedEntry",
    "MigPartedError",
    "MigPartedExportEntry",
    "MigPartedTarget",
    "NODE_LABEL",
    "mig_parted_export",
    "mig_parted_import",
    "mig_parted_node_configs",
    "mig_parted_profile_parse",
    "mig_parted_resolve",
]

_MIG_PARTED_VERSION = "v1"
# The node label NVIDIA's MIG manager (GPU operator, mig-parted deployments) watches: the name of the
# config (of its ConfigMap) to apply on that node.
NODE_LABEL = "nvidia.com/mig.config"
# A Kubernetes label value: at most 63 characters, alphanumerics at both ends, '-', '_' and '.' between.
_LABEL_VALUE_RE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class MigPartedError(ValueError):
    """A mig-parted config that is not valid YAML or not a valid ``version: v1`` config, or a config that
    cannot be resolved on a GPU."""


Devices = Union[Literal["all"], tuple[int, ...]]

# --------------------------------------------------------------------------- device ids and profile names


@dataclass(frozen=True)
class DeviceFilter:
    """One ``device-filter`` id: a board's PCI device id (device << 16 | vendor), optionally qualified by
    its subsystem id; written back the way mig-parted's DeviceID.String() writes it."""

    device_id: int
    subsystem_id: int | None = None

    @classmethod
    def parse(cls, text: str) -> DeviceFilter:
        # pkg/types/device.go NewDeviceIDFromString: "<devicevendor>" or "<devicevendor>:<subdevicevendor>",
        # each parsed by strconv.ParseUint(s, 0, 32): a 0x hex, 0o octal, 0b binary or decimal number.
        if not isinstance(text, str):
            raise ValueError(f"a device-filter id must be text such as '0x20B010DE', got {text!r}")
        parts = text.split(":")
        if len(parts) > 2:
            raise ValueError(f"invalid device-filter id {text!r}: expected '<devicevendor>' or '<devicevendor>:<subdevicevendor>'")
        numbers = [_go_uint32(part, text) for part in parts]
        return cls(numbers[0], numbers[1] if len(numbers) == 2 else None)

    def __str__(self) -> str:
        primary = pci_device_id_format(self.device_id)
        return primary if self.subsystem_id is None else f"{primary}:{pci_device_id_format(self.subsystem_id)}"

    def matches(self, device_id: int, subsystem_id: int | None = None) -> bool:
        """mig-parted's DeviceID.Matches: the device and vendor must be equal; a subsystem in the filter
        must be equal too (a GPU whose subsystem is unknown does not match a subsystem filter)."""
        if self.device_id != device_id:
            return False
        return self.subsystem_id is None or self.subsystem_id == subsystem_id


def _go_uint32(part: str, text: str) -> int:
    match = re.fullmatch(r"(?:0[xX](?P<hex>[0-9a-fA-F]+)|0[oO](?P<oct>[0-7]+)|0[bB](?P<bin>[01]+)|(?P<dec>[0-9]+))", part)
    if match is None:
        raise ValueError(f"invalid device-filter id {text!r}: {part!r} is not a number such as 0x20B010DE")
    if match["hex"]:
        value = int(match["hex"], 16)
    elif match["oct"]:
        value = int(match["oct"], 8)
    elif match["bin"]:
        value = int(match["bin"], 2)
    else:
        value = int(part, 10)
    if value > 0xFFFFFFFF:
        raise ValueError(f"invalid device-filter id {text!r}: {part} does not fit in 32 bits")
    return value


_PROFILE_FIELD_RE = re.compile(r"^(?:(?P<c>[0-9]+)c\.)?(?P<g>[0-9]+)g\.(?P<gb>[0-9]+)gb$")
_ATTRIBUTE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*(?<!\.)$")


@dataclass(frozen=True)
class _ProfileName:
    compute: int
    slices: int
    gb: int
    attributes: tuple[str, ...]
    lacks: tuple[str, ...]

    @property
    def gpu_instance_name(self) -> str:
        """The GPU instance profile's name, without the compute-instance prefix."""
        suffix = "+" + ",".join(self.attributes) if self.attributes else ("-" + ",".join(self.lacks) if self.lacks else "")
        return f"{self.slices}g.{self.gb}gb{suffix}"


def mig_parted_profile_parse(name: str) -> _ProfileName:
    """Parse a mig-parted profile name the way go-nvlib does (parseMigProfile): ``[<c>c.]<g>g.<gb>gb`` then
    ``+`` or ``-`` and a comma-separated list of attributes, each of letters, digits and inner dots, not
    starting with a digit, not repeated; not both ``+`` and ``-``. ValueError naming what is wrong."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{name!r} is not a MIG profile name such as '1g.5gb'")
    if "+" in name and "-" in name:
        raise ValueError(f"profile {name!r} contains both '+' and '-' attributes")
    sign = "+" if "+" in name else ("-" if "-" in name else "")
    head, _, tail = name.partition(sign) if sign else (name, "", "")
    match = _PROFILE_FIELD_RE.match(head)
    if match is None:
        raise ValueError(f"{name!r} is not a MIG profile name such as '1g.5gb', '1c.3g.20gb' or '1g.24gb+me.all'")
    attributes: tuple[str, ...] = ()
    if sign:
        attributes = tuple(tail.split(","))
        if not all(_ATTRIBUTE_RE.match(a) for a in attributes):
            raise ValueError(f"profile {name!r}: attributes are letters, digits and inner dots, such as 'me' or 'me.all'")
        if len(set(attributes)) != len(attributes):
            raise ValueError(f"profile {name!r}: an attribute is listed twice")
    slices = int(match["g"])
    compute = int(match["c"]) if match["c"] is not None else slices
    return _ProfileName(compute, slices, int(match["gb"]), attributes if sign == "+" else (), attributes if sign == "-" else ())


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class MigPartedEntry:
    """One entry of a mig-parted config: which devices (and, with a filter, which boards), MIG on or off,
    how many of each profile (the names as the file writes them)."""

    devices: Devices
    mig_enabled: bool
    counts: Mapping[str, int] = field(default_factory=dict, hash=False)
    device_filter: tuple[str, ...] | None = None  # each as DeviceFilter prints it: "0x20B010DE"

    @property
    def filters(self) -> tuple[DeviceFilter, ...]:
        return tuple(DeviceFilter.parse(text) for text in self.device_filter or ())

    def matches_device(self, device_id: int | None, subsystem_id: int | None = None) -> bool:
        """helpers.go MatchesDeviceFilter: no filter matches every GPU; a GPU of unknown PCI id matches
        no filter."""
        if not self.device_filter:
            return True
        return device_id is not None and any(f.matches(device_id, subsystem_id) for f in self.filters)

    def matches_index(self, index: int) -> bool:
        """helpers.go MatchesDevices: ``all``, or the index is listed."""
        return self.devices == "all" or index in self.devices


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
    """Parse a mig-parted ``config.yaml`` (``version: v1``) by mig-parted's own rules (see the module
    docstring). Zero counts are dropped. Anything else raises :class:`MigPartedError` naming the path."""
    if not isinstance(text, str):
        raise MigPartedError(f"mig-parted config must be text, got {type(text).__name__}")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506  # nosec B506 - a SafeLoader subclass
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
        if not isinstance(name, str):
            raise MigPartedError(f"{where}: {name!r} is not a MIG profile name such as '1g.5gb'")
        try:
            mig_parted_profile_parse(name)
        except ValueError as exc:
            raise MigPartedError(f"{where}: {exc}") from exc
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MigPartedError(f"{where}.{name}: count must be a non-negative integer, got {n!r}")
        if n:
            counts[name] = n
    if raw and not counts:
        # mig_config.go AssertValidFormat: a non-empty mig-devices needs a count above zero.
        raise MigPartedError(f"{where}: all counts are 0 (write 'mig-devices: {{}}' for MIG on without instances)")
    return counts


def _mig_parted_filter_parse(where: str, raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise MigPartedError(f"{where}: must be a PCI device id string or a list of them, got {raw!r}")
    try:
        parsed = tuple(str(DeviceFilter.parse(item)) for item in items if item != "")
    except ValueError as exc:
        raise MigPartedError(f"{where}: {exc}") from exc
    return parsed or None  # an empty filter matches every GPU, as no filter does


# --------------------------------------------------------------------------- resolution on a GPU model

TargetStatus = Literal["applies", "filtered_out", "not_for_model", "does_not_fit"]


@dataclass(frozen=True)
class MigPartedTarget:
    """What one entry of a config does on one GPU model.

    ``status``: ``applies`` (it matches the model and places: `counts` and `layout` hold the result, the
    layout None when MIG is off), ``filtered_out`` (its device-filter names other boards),
    ``not_for_model`` (no device-filter, and it names a profile the model does not have: an entry written
    for other GPUs, as most of mig-parted's generic ``all-*`` configs are) or ``does_not_fit`` (the
    model has every profile it names, or its device-filter names this board, yet it cannot be placed:
    mig-parted would fail to apply it here). ``reason`` says why for all but ``applies``."""

    index: int
    entry: MigPartedEntry
    status: TargetStatus
    reason: str = ""
    counts: Mapping[str, int] = field(default_factory=dict)
    layout: Layout | None = None


def mig_parted_resolve(
    entries: Sequence[MigPartedEntry], gpu_model: GpuModelSpec | str, *, device_id: int | str | None = None,
) -> list[MigPartedTarget]:
    """Which entries of one config apply to `gpu_model`, each placed on it (see MigPartedTarget).

    A device-filter is matched against `device_id` when given (it must be one of the model's), else
    against every PCI device id the model's boards carry: when they disagree (mig-parted's all-balanced
    names only the RTX PRO 6000 Server Edition, not the Workstation ones) MigPartedError asks for the id.
    A model without known PCI ids (one described from NVML) matches only entries without a filter."""
    model = gpu_model_resolve(gpu_model)
    if device_id is not None:
        wanted = DeviceFilter.parse(device_id).device_id if isinstance(device_id, str) else int(device_id)
        if model.pci_device_ids and wanted not in model.pci_device_ids:
            known = ", ".join(map(pci_device_id_format, model.pci_device_ids))
            raise MigPartedError(f"{pci_device_id_format(wanted)} is not a PCI device id of {model.name} (its boards: {known})")
        candidates: tuple[int | None, ...] = (wanted,)
    else:
        candidates = model.pci_device_ids or (None,)
    matching = [tuple(entry.matches_device(candidate) for entry in entries) for candidate in candidates]
    if len(set(matching)) > 1:
        by_board = "; ".join(
            f"{pci_device_id_format(c)}: entries {[i for i, m in enumerate(row) if m] or 'none'}"
            for c, row in zip(candidates, matching)
        )
        raise MigPartedError(
            f"the config's device-filters treat {model.name}'s boards differently ({by_board}); "
            "name the board's PCI device id"
        )
    return [_target(i, entry, model, matched) for i, (entry, matched) in enumerate(zip(entries, matching[0]))]


def _target(i: int, entry: MigPartedEntry, model: GpuModelSpec, matched: bool) -> MigPartedTarget:
    if not matched:
        return MigPartedTarget(i, entry, "filtered_out", f"its device-filter ({', '.join(entry.device_filter or ())}) names other boards")
    if not entry.mig_enabled:
        return MigPartedTarget(i, entry, "applies")
    try:
        counts = _counts_on_model(model, entry.counts)
    except UnknownMigProfile as exc:
        return MigPartedTarget(i, entry, "does_not_fit" if entry.device_filter else "not_for_model", str(exc))
    except ValueError as exc:
        return MigPartedTarget(i, entry, "does_not_fit", str(exc))
    layout = mig_counts_to_layout(model, counts)
    if layout is None:
        asked = ", ".join(f"{n} x {p}" for p, n in counts.items())
        return MigPartedTarget(i, entry, "does_not_fit", f"{asked} does not fit on {model.name}", counts)
    return MigPartedTarget(i, entry, "applies", counts=counts, layout=layout)


def _counts_on_model(model: GpuModelSpec, counts: Mapping[str, int]) -> dict[str, int]:
    """The entry's counts under the model's profile names (a board's other name resolves to the
    catalogue's); ValueError for a profile the model lacks or a compute-instance split Tessera does not
    make (it creates one full-size compute instance per GPU instance)."""
    placed: dict[str, int] = {}
    for name, n in counts.items():
        parsed = mig_parted_profile_parse(name)
        if parsed.compute != parsed.slices:
            raise ValueError(
                f"{name}: a {parsed.compute}-slice compute instance in a {parsed.slices}g GPU instance; Tessera "
                "creates one full-size compute instance per GPU instance"
            )
        profile = model.profile_find(parsed.gpu_instance_name)
        if profile is None:
            raise UnknownMigProfile(parsed.gpu_instance_name, model.name, model.profile_names)
        placed[profile.name] = placed.get(profile.name, 0) + n
    return placed


# --------------------------------------------------------------------------- export


@dataclass(frozen=True)
class MigPartedExportEntry:
    """One entry to write: a layout (None: MIG off) for `gpu_model` on `devices` (None: ``all`` for a
    config's only entry, else the entry's position), and an optional device-filter: PCI device ids, or
    True for the model's own (so that mig-parted applies the entry only to that kind of board)."""

    gpu_model: GpuModelSpec | str
    layout: LayoutLike | None
    devices: Devices | Sequence[int] | None = None
    device_filter: Sequence[int | str] | bool | None = None


ExportEntry = Union[
    MigPartedExportEntry,
    tuple[Union[GpuModelSpec, str], Union[LayoutLike, None]],
    tuple[Union[GpuModelSpec, str], Union[LayoutLike, None], Union[Devices, Sequence[int]]],
]


def mig_parted_export(configs: Mapping[str, Sequence[ExportEntry]]) -> str:
    """Write layouts as a mig-parted ``config.yaml`` (``version: v1``).

    ``configs`` maps a config name to entries: `MigPartedExportEntry`, or tuples ``(gpu_model, layout)``
    and ``(gpu_model, layout, devices)``. ``layout=None`` disables MIG on those devices; an empty layout
    enables MIG with no instances. Without ``devices``, a config with a single entry applies to ``all``
    devices and otherwise entry *i* applies to device *i*. mig-parted keeps counts only, so each entry
    carries its exact placements as a YAML comment. Layouts are validated (:class:`InvalidLayout`).
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
            lines.extend(_mig_parted_entry_lines(name, i, len(entries), _export_entry(name, i, entry), seen_devices))
    return "\n".join(lines) + "\n"


def _export_entry(config: str, i: int, entry: Any) -> MigPartedExportEntry:
    if isinstance(entry, MigPartedExportEntry):
        return entry
    if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
        raise ValueError(f"config {config!r} entry {i}: expected (gpu_model, layout[, devices]), got {entry!r}")
    return MigPartedExportEntry(entry[0], entry[1], entry[2] if len(entry) == 3 else None)


def _mig_parted_entry_lines(
    config: str, i: int, total: int, entry: MigPartedExportEntry, seen_devices: set[int]
) -> list[str]:
    model = gpu_model_resolve(entry.gpu_model)
    devices = _export_devices(config, i, total, entry.devices, seen_devices)
    devices_text = "all" if devices == "all" else "[" + ", ".join(map(str, devices)) + "]"
    filters = _export_filter(config, i, model, entry.device_filter)
    head = [f"    - device-filter: [{', '.join(json.dumps(f) for f in filters)}]", f"      devices: {devices_text}"] \
        if filters else [f"    - devices: {devices_text}"]
    if entry.layout is None:
        return [f"    # {model.label}: MIG disabled", *head, "      mig-enabled: false"]
    layout = mig_layout_require_valid(model, entry.layout, f"layout for config {config!r} entry {i}")
    placements_text = " ".join(map(str, layout)) or "(no instances)"
    lines = [f"    # {model.label}: {placements_text}", *head, "      mig-enabled: true"]
    counts = layout_counts(layout)
    if not counts:
        return lines + ["      mig-devices: {}"]
    lines.append("      mig-devices:")
    # Largest profiles first, the order mig-parted itself creates them in.
    for profile in sorted(model.profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name)):
        if counts.get(profile.name):
            lines.append(f"        {json.dumps(profile.name)}: {counts[profile.name]}")
    return lines


def _export_filter(config: str, i: int, model: GpuModelSpec, wanted: Any) -> list[str]:
    if wanted is None or wanted is False:
        return []
    if wanted is True:
        if not model.pci_device_ids:
            raise ValueError(f"config {config!r} entry {i}: {model.label} has no known PCI device id to filter on")
        return [pci_device_id_format(d) for d in model.pci_device_ids]
    if isinstance(wanted, (str, int)):
        wanted = [wanted]
    try:
        return [str(DeviceFilter.parse(w)) if isinstance(w, str) else pci_device_id_format(int(w)) for w in wanted]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config {config!r} entry {i}: {exc}") from exc


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


# --------------------------------------------------------------------------- one config per node


def mig_parted_node_configs(
    prefix: str, hosts: Mapping[str, Sequence[tuple[int, GpuModelSpec | str, LayoutLike | None]]],
) -> tuple[dict[str, list[MigPartedExportEntry]], dict[str, str]]:
    """One mig-parted config per host, for a MIG manager that applies the config its node's
    ``nvidia.com/mig.config`` label names: `hosts` maps a host to its GPUs as (index, model, layout or
    None for MIG off). Returns (configs for `mig_parted_export`, {host: config name}, the label value to
    set). Each entry names its GPU by index and filters on its model's PCI device ids where the
    catalogue knows them, so that a board other than the planned one is left alone. Names are valid
    Kubernetes label values (at most 63 characters; a hash keeps long ones apart)."""
    configs: dict[str, list[MigPartedExportEntry]] = {}
    labels: dict[str, str] = {}
    for host, gpus in sorted(hosts.items()):
        if not gpus:
            continue
        name = _label_value(f"{prefix}-{host}")
        clash = next((other for other, taken in labels.items() if taken == name), None)
        if clash is not None:
            raise ValueError(f"hosts {clash!r} and {host!r} would share the config name {name!r}")
        entries = []
        for index, gpu_model, layout in sorted(gpus, key=lambda g: g[0]):
            model = gpu_model_resolve(gpu_model)
            entries.append(MigPartedExportEntry(model, layout, (index,), True if model.pci_device_ids else None))
        configs[name] = entries
        labels[host] = name
    if not configs:
        raise ValueError("no host has a MIG-capable GPU to configure")
    return configs, labels


def _label_value(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-_.")
    if len(cleaned) > 63:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        cleaned = cleaned[:54].rstrip("-_.") + "-" + digest
    if not cleaned or not _LABEL_VALUE_RE.match(cleaned):
        raise ValueError(f"cannot make a Kubernetes label value of {text!r}")
    return cleaned
