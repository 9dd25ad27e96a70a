"""A host's desired state as the agent reads it (docs/dataplane.md, "Desired state of a host").

The control plane validates a desired state against its inventory before storing it; the agent checks
again what it needs to act safely (names, MIG layouts against the catalogue, one runtime per instance), so
that a malformed document is refused as a whole and the host keeps what it runs. A desired state can also
come from a file (`tessera agent --desired-file`), for hosts run without a control plane."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from engine.geometry import names
from engine.geometry.layout import Placement, placement_parse

__all__ = [
    "DesiredGpu",
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

    @property
    def device(self) -> str:
        return f"{self.device_kind}{self.device_index}"

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything the runtime process was started with changes (then it is replaced)."""
        canonical = json.dumps(self.document, sort_keys=True, separators=(",", ":"))
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


def runtime_key_parse(key: str) -> tuple[str, int, Placement | None, int | None]:
    """`gpu0/3g.20gb@4` -> ("gpu", 0, Placement, None); `gpu1` -> ("gpu", 1, None, None);
    `cpu0/2` -> ("cpu", 0, None, 2). The names are the engine's (`engine.geometry.names`), shared with
    the control plane."""
    try:
        parsed = names.runtime_key_parse(key)
        placement = placement_parse(parsed.placement) if parsed.placement else None
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
    return DesiredGpu(index, mig_enabled, layout)


def _runtime_parse(raw: Any, where: str) -> DesiredRuntime:
    if not isinstance(raw, dict):
        raise DesiredStateError(f"{where}: expected an object")
    key = raw.get("key")
    if not isinstance(key, str):
        raise DesiredStateError(f"{where}.key: expected a string")
    kind, index, placement, _slot = runtime_key_parse(key)
    if raw.get("device") not in (None, f"{kind}{index}"):
        raise DesiredStateError(f"{where}: device {raw.get('device')!r} does not match key {key!r}")
    declared = raw.get("placement")
    if declared is not None and (placement is None or placement_parse(declared) != placement):
        raise DesiredStateError(f"{where}: placement {declared!r} does not match key {key!r}")
    threads = raw.get("cpu_threads")
    if kind == "cpu":
        threads = _int(threads, f"{where}.cpu_threads", 1)
    elif threads is not None:
        raise DesiredStateError(f"{where}: cpu_threads is for CPU runtimes only")
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
        profile=tuple(sorted(profile)), document=raw,
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
    for r in runtimes:
        if r.device_kind != "gpu":
            continue
        gpu = by_index.get(r.device_index)
        if gpu is None:
            continue  # a GPU whose geometry this version leaves alone; checked against reality when applied
        if r.placement is None:
            if gpu.mig_enabled:
                raise DesiredStateError(f"runtime {r.key}: a whole-GPU runtime on a GPU with MIG enabled")
            if r.device_index in whole:
                raise DesiredStateError(f"runtime {r.key}: two runtimes on the whole GPU {r.device}")
            whole.add(r.device_index)
        elif r.placement not in gpu.layout:
            raise DesiredStateError(f"runtime {r.key}: instance {r.placement} is not in {r.device}'s layout")
    return DesiredState(host=str(host), version=version, gpus=gpus, runtimes=runtimes)
