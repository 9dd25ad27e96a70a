"""A host's desired state as the agent reads it (docs/dataplane.md, "Desired state of a host").

The control plane validates a desired state against its inventory before storing it; the agent checks
again what it needs to act safely (names, MIG layouts against the catalogue, one runtime per instance, MPS
layouts and their partitions), so that a malformed document is refused as a whole and the host keeps what
it runs. A desired state can also come from a file (`tessera agent --desired-file`), for hosts run without
a control plane.

MPS (issue 17, gpulets): a GPU in MPS mode lists its partitions (`mps_layout`, "mps60@0", largest first);
the runtimes of one partition (`gpu0/mps60@0/0`, `gpu0/mps60@0/1`, ...) are served by one runtime process,
so they are grouped here into a `DesiredPartition` whose fingerprint covers every model in it.

Vertical scaling (issue 19, Sponge/Biscale): a CPU runtime may carry a `vertical` block, `{"policy": "sponge"|
"biscale", "model": {"gamma1", "eps1", "delta1", "eta1"}, "min_cores", "max_cores", "max_batch", "reserve_ms"}`
(workers/runtime/vertical.py checks it; its `cpu_threads` must lie in min_cores..max_cores). A CPU runtime's `cpu_threads` and `vertical` are not part
of its restart `fingerprint`: changing them resizes the running process in place (`resize_fingerprint`,
the reconciler's `runtime.resize`), and with a `vertical` block the agent's fast loop sizes it from then on
(workers/agent/vertical.py)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from engine.geometry import names
from engine.geometry.layout import Placement, placement_parse
from workers.runtime.vertical import VerticalSpec, vertical_parse

__all__ = [
    "DesiredGpu",
    "DesiredPartition",
    "DesiredRuntime",
    "DesiredState",
    "DesiredStateError",
    "desired_state_parse",
    "runtime_key_parse",
]

class DesiredStateError(ValueError):
    """The desired-state document is malformed; the message says where."""


@dataclass(frozen=True)
class DesiredGpu:
    index: int
    mig_enabled: bool
    layout: tuple[Placement, ...]
    mps_enabled: bool = False
    mps_layout: tuple[tuple[int, int], ...] = ()  # (percent, index), by index: largest first

    @property
    def mps_placements(self) -> tuple[str, ...]:
        """The layout as written: ("mps60@0", "mps40@1")."""
        return tuple(names.mps_placement(percent, index) for percent, index in self.mps_layout)


@dataclass(frozen=True)
class DesiredRuntime:
    key: str
    device_kind: str  # "gpu" | "cpu"
    device_index: int
    placement: Placement | None
    cpu_threads: int | None
    application: str
    variant: dict[str, Any]  # {"id", "name", "artifact": {"id", "sha256", "size_bytes", "download"} | None}
    max_batch: int
    batching: dict[str, Any]
    profile: tuple[tuple[int, float], ...]
    document: dict[str, Any] = field(compare=False, repr=False)
    mps_percent: int | None = None  # set on a model in an MPS partition (gpu0/mps60@0/1): the key's 60
    duty_cycle_ms: float | None = None  # the partition's round (the same for every model of the partition)
    turn_ms: float | None = None  # the model's planned turn in the round (None: its profile at max_batch)
    vertical: VerticalSpec | None = None  # a CPU runtime sized by the agent's fast loop (Sponge)

    @property
    def device(self) -> str:
        return f"{self.device_kind}{self.device_index}"

    @property
    def batch_limit(self) -> int:
        """The largest batch cap the fast loop may set: the vertical block's max_batch when it gives one, else
        max_batch or the largest profiled batch when above it (the runtime's own limit, workers/runtime/served.py)."""
        if self.vertical is not None and self.vertical.max_batch:
            return self.vertical.max_batch
        return max([self.max_batch] + [b for b, _ms in self.profile])

    @property
    def partition_key(self) -> str | None:
        """`gpu0/mps60@0` for a model in that MPS partition; None for every other runtime."""
        return names.partition_key(self.key) if self.mps_percent is not None else None

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything the runtime process was started with changes (then it is replaced), except
        a CPU runtime's `cpu_threads` and `vertical`: those are resized in place (`resize_fingerprint`)."""
        document = self.document
        if self.device_kind == "cpu":
            document = {k: v for k, v in document.items() if k not in _RESIZED_IN_PLACE}
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def resize_fingerprint(self) -> str:
        """Changes whenever what a CPU runtime is resized to in place changes (its `cpu_threads`, its `vertical`
        block); "" on GPU runtimes, which are never resized."""
        if self.device_kind != "cpu":
            return ""
        canonical = json.dumps({"cpu_threads": self.cpu_threads, "vertical": self.vertical.to_dict() if self.vertical else None},
                               sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# A CPU runtime's fields a change of which resizes the running process instead of replacing it.
_RESIZED_IN_PLACE = ("cpu_threads", "vertical")


@dataclass(frozen=True)
class DesiredPartition:
    """The models of one MPS partition, served by one runtime process (contract of issue 17): `key` is the
    partition's (`gpu0/mps60@0`), `runtimes` its models by slot."""

    key: str
    device_index: int
    percent: int
    index: int
    duty_cycle_ms: float | None
    runtimes: tuple[DesiredRuntime, ...]

    @property
    def placement(self) -> str:
        return names.mps_placement(self.percent, self.index)

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything about any of its models changes: the process is then replaced (a new
        one started and ready before the old one stops)."""
        canonical = json.dumps(
            {"key": self.key, "models": [r.document for r in self.runtimes]}, sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DesiredState:
    host: str
    version: int
    gpus: tuple[DesiredGpu, ...]
    runtimes: tuple[DesiredRuntime, ...]

    def gpu(self, index: int) -> DesiredGpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def runtime(self, key: str) -> DesiredRuntime | None:
        return next((r for r in self.runtimes if r.key == key), None)

    @property
    def process_runtimes(self) -> tuple[DesiredRuntime, ...]:
        """The runtimes with a process of their own (MIG instances, whole GPUs, CPUs): all but MPS models."""
        return tuple(r for r in self.runtimes if r.mps_percent is None)

    def partitions(self) -> tuple[DesiredPartition, ...]:
        """The MPS partitions the runtimes use, by key, each with its models by slot."""
        grouped: dict[str, list[DesiredRuntime]] = {}
        for runtime in self.runtimes:
            if runtime.partition_key is not None:
                grouped.setdefault(runtime.partition_key, []).append(runtime)
        out = []
        for key, runtimes in sorted(grouped.items()):
            parsed = names.runtime_key_parse(key)
            runtimes.sort(key=lambda r: names.runtime_key_parse(r.key).slot or 0)
            out.append(DesiredPartition(
                key=key, device_index=parsed.index, percent=parsed.mps_percent or 0, index=parsed.mps_index or 0,
                duty_cycle_ms=runtimes[0].duty_cycle_ms, runtimes=tuple(runtimes),
            ))
        return tuple(out)

    def partition(self, key: str) -> DesiredPartition | None:
        return next((p for p in self.partitions() if p.key == key), None)


def runtime_key_parse(key: str) -> tuple[str, int, Placement | None, int | None]:
    """`gpu0/3g.20gb@4` -> ("gpu", 0, Placement, None); `gpu1` -> ("gpu", 1, None, None);
    `cpu0/2` -> ("cpu", 0, None, 2); `gpu0/mps60@0/1` -> ("gpu", 0, None, 1) (an MPS partition is not a MIG
    placement: `names.runtime_key_parse` tells its percent and index). The names are the engine's
    (`engine.geometry.names`), shared with the control plane."""
    try:
        parsed = names.runtime_key_parse(key)
        placement = placement_parse(parsed.placement) if parsed.placement and not parsed.is_mps else None
    except ValueError as exc:
        raise DesiredStateError(f"runtime key {key!r}: {exc}") from None
    return parsed.kind, parsed.index, placement, parsed.slot


def _int(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DesiredStateError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _gpu_parse(raw: Any, where: str) -> DesiredGpu:
    if not isinstance(raw, dict):
        raise DesiredStateError(f"{where}: expected an object")
    index = _int(raw.get("index"), f"{where}.index")
    mig_enabled = raw.get("mig_enabled", False)
    if not isinstance(mig_enabled, bool):
        raise DesiredStateError(f"{where}.mig_enabled: expected true or false")
    layout_raw = raw.get("layout", [])
    if not isinstance(layout_raw, list):
        raise DesiredStateError(f"{where}.layout: expected a list of placements")
    try:
        layout = tuple(sorted(placement_parse(p) for p in layout_raw))
    except (ValueError, TypeError) as exc:
        raise DesiredStateError(f"{where}.layout: {exc}") from None
    if layout and not mig_enabled:
        raise DesiredStateError(f"{where}: MIG instances need mig_enabled: true")
    mps_enabled = raw.get("mps_enabled", False)
    if not isinstance(mps_enabled, bool):
        raise DesiredStateError(f"{where}.mps_enabled: expected true or false")
    if mps_enabled and mig_enabled:
        raise DesiredStateError(f"{where}: mig_enabled and mps_enabled cannot both be true (a GPU is partitioned one way)")
    mps_layout = _mps_layout_parse(raw.get("mps_layout", []), f"{where}.mps_layout")
    if mps_layout and not mps_enabled:
        raise DesiredStateError(f"{where}: MPS partitions need mps_enabled: true")
    return DesiredGpu(index, mig_enabled, layout, mps_enabled, mps_layout)


def _mps_layout_parse(raw: Any, where: str) -> tuple[tuple[int, int], ...]:
    """["mps60@0", "mps40@1"] -> ((60, 0), (40, 1)): indices 0..n-1 in order, largest first, <= 100 % in all."""
    if not isinstance(raw, list):
        raise DesiredStateError(f"{where}: expected a list of partitions such as ['mps60@0', 'mps40@1']")
    layout = []
    for i, item in enumerate(raw):
        try:
            layout.append(names.mps_placement_parse(item))
        except ValueError as exc:
            raise DesiredStateError(f"{where}[{i}]: {exc}") from None
    indices = [index for _percent, index in layout]
    if indices != list(range(len(layout))):
        raise DesiredStateError(f"{where}: partition indices must be 0..{len(layout) - 1} in order, got {indices}")
    percents = [percent for percent, _index in layout]
    if percents != sorted(percents, reverse=True):
        raise DesiredStateError(f"{where}: partitions must be listed largest first, got {' + '.join(map(str, percents))} %")
    if sum(percents) > 100:
        raise DesiredStateError(f"{where}: partitions add up to {sum(percents)} % of the GPU, more than 100 %")
    return tuple(layout)


def _runtime_parse(raw: Any, where: str) -> DesiredRuntime:
    if not isinstance(raw, dict):
        raise DesiredStateError(f"{where}: expected an object")
    key = raw.get("key")
    if not isinstance(key, str):
        raise DesiredStateError(f"{where}.key: expected a string")
    kind, index, placement, _slot = runtime_key_parse(key)
    parsed = names.runtime_key_parse(key)
    if raw.get("device") not in (None, f"{kind}{index}"):
        raise DesiredStateError(f"{where}: device {raw.get('device')!r} does not match key {key!r}")
    declared = raw.get("placement")
    if parsed.is_mps:
        if parsed.slot is None:
            raise DesiredStateError(
                f"{where}: {key!r} is an MPS partition's own key; a runtime is one model in it, "
                f"'{key}/<slot>' (slot 0, 1, ... its position in the partition)"
            )
        if declared is not None and declared != parsed.placement:
            raise DesiredStateError(f"{where}: placement {declared!r} does not match key {key!r}")
    elif declared is not None:
        try:
            matches = placement is not None and placement_parse(declared) == placement
        except ValueError:
            matches = False
        if not matches:
            raise DesiredStateError(f"{where}: placement {declared!r} does not match key {key!r}")
    mps_percent, duty_cycle_ms, turn_ms = raw.get("mps_percent"), raw.get("duty_cycle_ms"), raw.get("turn_ms")
    if parsed.is_mps:
        if mps_percent is None:
            mps_percent = parsed.mps_percent
        elif isinstance(mps_percent, bool) or mps_percent != parsed.mps_percent:
            raise DesiredStateError(f"{where}: mps_percent {mps_percent!r} does not match key {key!r} ({parsed.mps_percent} %)")
        if duty_cycle_ms is not None:
            if isinstance(duty_cycle_ms, bool) or not isinstance(duty_cycle_ms, (int, float)) or not 0 < duty_cycle_ms < float("inf"):
                raise DesiredStateError(f"{where}.duty_cycle_ms: expected a number of milliseconds > 0 or null, got {duty_cycle_ms!r}")
            duty_cycle_ms = float(duty_cycle_ms)
        if turn_ms is not None:
            if isinstance(turn_ms, bool) or not isinstance(turn_ms, (int, float)) or not 0 < turn_ms < float("inf"):
                raise DesiredStateError(f"{where}.turn_ms: expected a number of milliseconds > 0 or null, got {turn_ms!r}")
            turn_ms = float(turn_ms)
    else:
        for name, value in (("mps_percent", mps_percent), ("duty_cycle_ms", duty_cycle_ms), ("turn_ms", turn_ms)):
            if value is not None:
                raise DesiredStateError(f"{where}: {name} is for models in an MPS partition only ('gpu<i>/mps<NN>@<k>/<slot>')")
    threads = raw.get("cpu_threads")
    if kind == "cpu":
        threads = _int(threads, f"{where}.cpu_threads", 1)
    elif threads is not None:
        raise DesiredStateError(f"{where}: cpu_threads is for CPU runtimes only")
    vertical = raw.get("vertical")
    if vertical is not None:
        if kind != "cpu":
            raise DesiredStateError(f"{where}: vertical is for CPU runtimes only (a GPU instance is resized by the plan)")
        try:
            vertical = vertical_parse(vertical, f"{where}.vertical")
        except ValueError as exc:
            raise DesiredStateError(str(exc)) from None
        if not vertical.min_cores <= threads <= vertical.max_cores:
            raise DesiredStateError(f"{where}: cpu_threads {threads} is outside vertical min_cores..max_cores "
                                    f"({vertical.min_cores}..{vertical.max_cores}); the fast loop starts from it")
    application = raw.get("application")
    if not isinstance(application, str) or not application:
        raise DesiredStateError(f"{where}.application: expected a name")
    variant = raw.get("variant")
    if not isinstance(variant, dict) or not isinstance(variant.get("name"), str):
        raise DesiredStateError(f"{where}.variant: expected {{id, name, artifact}}")
    artifact = variant.get("artifact")
    if artifact is not None and not (isinstance(artifact, dict) and isinstance(artifact.get("sha256"), str) and artifact.get("download")):
        raise DesiredStateError(f"{where}.variant.artifact: expected {{sha256, download, ...}} or null")
    if kind == "cpu" and artifact is None:
        raise DesiredStateError(f"{where}: a CPU runtime computes for real and needs the variant's artifact")
    max_batch = _int(raw.get("max_batch"), f"{where}.max_batch", 1)
    batching = raw.get("batching")
    if not isinstance(batching, dict) or not isinstance(batching.get("slo_ms"), (int, float)) or batching["slo_ms"] <= 0:
        raise DesiredStateError(f"{where}.batching: expected {{policy, params, drop_rule, queue_order, slo_ms > 0}}")
    profile_raw = raw.get("profile")
    if not isinstance(profile_raw, list) or not profile_raw:
        raise DesiredStateError(f"{where}.profile: expected a non-empty list of {{batch, latency_ms}}")
    profile = []
    for i, point in enumerate(profile_raw):
        try:
            batch, latency = int(point["batch"]), float(point["latency_ms"])
        except (KeyError, TypeError, ValueError):
            raise DesiredStateError(f"{where}.profile[{i}]: expected {{batch, latency_ms}}") from None
        if batch < 1 or not latency > 0:
            raise DesiredStateError(f"{where}.profile[{i}]: batch >= 1 and latency_ms > 0")
        profile.append((batch, latency))
    return DesiredRuntime(
        key=key, device_kind=kind, device_index=index, placement=placement, cpu_threads=threads,
        application=application, variant=variant, max_batch=max_batch, batching=batching,
        profile=tuple(sorted(profile)), document=raw, mps_percent=mps_percent, duty_cycle_ms=duty_cycle_ms,
        turn_ms=turn_ms, vertical=vertical,
    )


def desired_state_parse(doc: Any) -> DesiredState:
    """Parse and check a desired-state document; raises `DesiredStateError` saying what is wrong."""
    if not isinstance(doc, dict):
        raise DesiredStateError("a desired state is a JSON object")
    host = doc.get("host", "")
    version = _int(doc.get("version"), "version")
    gpus_raw, runtimes_raw = doc.get("gpus", []), doc.get("runtimes", [])
    if not isinstance(gpus_raw, list) or not isinstance(runtimes_raw, list):
        raise DesiredStateError("gpus and runtimes must be lists")
    gpus = tuple(_gpu_parse(g, f"gpus[{i}]") for i, g in enumerate(gpus_raw))
    if len({g.index for g in gpus}) != len(gpus):
        raise DesiredStateError("gpus: a GPU is listed twice")
    runtimes = tuple(_runtime_parse(r, f"runtimes[{i}]") for i, r in enumerate(runtimes_raw))
    if len({r.key for r in runtimes}) != len(runtimes):
        raise DesiredStateError("runtimes: a key is listed twice")
    by_index = {g.index: g for g in gpus}
    whole: set[int] = set()
    duty_cycles: dict[str, float | None] = {}
    for r in runtimes:
        if r.device_kind != "gpu":
            continue
        gpu = by_index.get(r.device_index)
        if r.mps_percent is not None:
            parsed = names.runtime_key_parse(r.key)
            if gpu is None or not gpu.mps_enabled:
                raise DesiredStateError(
                    f"runtime {r.key}: an MPS partition on {r.device}, which this version does not list with mps_enabled: true"
                )
            if (parsed.mps_percent, parsed.mps_index) not in gpu.mps_layout:
                raise DesiredStateError(
                    f"runtime {r.key}: partition {parsed.placement} is not in {r.device}'s mps_layout "
                    f"({', '.join(gpu.mps_placements) or 'empty'})"
                )
            partition = parsed.partition_key or ""
            if partition in duty_cycles and duty_cycles[partition] != r.duty_cycle_ms:
                raise DesiredStateError(
                    f"runtime {r.key}: duty_cycle_ms {r.duty_cycle_ms!r} differs from another model's of partition "
                    f"{partition} ({duty_cycles[partition]!r}); a partition has one duty cycle"
                )
            duty_cycles[partition] = r.duty_cycle_ms
            continue
        if gpu is None:
            continue  # a GPU whose geometry this version leaves alone; checked against reality when applied
        if r.placement is None:
            if gpu.mig_enabled:
                raise DesiredStateError(f"runtime {r.key}: a whole-GPU runtime on a GPU with MIG enabled")
            if gpu.mps_enabled:
                raise DesiredStateError(
                    f"runtime {r.key}: a whole-GPU runtime on a GPU in MPS mode (give it a partition: "
                    f"'{r.device}/mps100@0/0' with mps_layout ['mps100@0'])"
                )
            if r.device_index in whole:
                raise DesiredStateError(f"runtime {r.key}: two runtimes on the whole GPU {r.device}")
            whole.add(r.device_index)
        elif r.placement not in gpu.layout:
            raise DesiredStateError(f"runtime {r.key}: instance {r.placement} is not in {r.device}'s layout")
    return DesiredState(host=str(host), version=version, gpus=gpus, runtimes=runtimes)
