"""A runtime process's spec (the JSON file `--spec` names; docs/dataplane.md, "The runtime process and its
spec"): `RuntimeSpec` for one model, `PartitionSpec` for the models that time-share one MPS partition, read
and checked field by field (`RuntimeSpecError` names the field), and the ready file the agent polls for."""
from __future__ import annotations

import abc
import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from engine.dataplane.batching import DEFAULT_BATCHING_POLICY
from workers.runtime.simulated import profile_points
from workers.runtime.vertical import vertical_parse

__all__ = ["BatchingSpec", "PartitionSpec", "RuntimeSpec", "RuntimeSpecError", "batching_margin_ms", "ready_file_write",
           "spec_from_dict", "spec_load"]


class RuntimeSpecError(ValueError):
    """The spec file is missing, unreadable, or a field is wrong; the message names the field."""


@dataclass
class BatchingSpec:
    policy: str = DEFAULT_BATCHING_POLICY
    params: dict[str, Any] = field(default_factory=dict)
    drop_rule: str = "deadline"
    queue_order: str = "fifo"
    slo_ms: float = 1000.0
    margin_ms: float | None = None  # None: batching_margin_ms(slo_ms)


def batching_margin_ms(slo_ms: float) -> float:
    """The live batcher's planning margin (workers/runtime/batcher.py): 5% of the SLO, at least 1 ms, at
    most a quarter of the SLO."""
    return min(max(1.0, 0.05 * slo_ms), 0.25 * slo_ms)


class _SpecFile(abc.ABC):
    """Reading and writing a spec as its JSON file (the dataclass's fields)."""

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The spec from its JSON object (RuntimeSpecError naming the field that is wrong)."""

    @classmethod
    def load(cls, path: str | Path) -> Any:
        return cls.from_dict(_spec_read(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def dump(self, path: str | Path) -> Path:
        path = Path(path)
        _atomic_write(path, json.dumps(self.to_dict(), indent=1))
        return path


@dataclass
class RuntimeSpec(_SpecFile):
    """What one runtime process serves. The JSON file holds these fields (`artifact` is accepted for
    `artifact_path`; unknown fields are ignored). `instance` is the fleet-unique instance id used in the
    Prometheus labels (default: the key)."""

    key: str
    application: str
    variant: str
    artifact_path: str | None = None
    sha256: str | None = None
    simulated: bool = False
    device_uuid: str | None = None
    cpu_threads: int = 1
    max_batch: int = 1
    batching: BatchingSpec = field(default_factory=BatchingSpec)
    profile: list[dict[str, Any]] = field(default_factory=list)
    instance: str | None = None
    turn_ms: float | None = None  # a partition's model: its planned turn in the round (None: its profile at max_batch)
    vertical: dict[str, Any] | None = None  # a CPU runtime's Sponge block (workers/runtime/vertical.py), normalised
    cpu_oversubscribe: bool = False  # a resize may ask for more cores than the process has CPUs (simulated hosts)
    variant_id: int | None = None  # the variant's number in the registry: the protocol's model version, where given

    @property
    def model_version(self) -> str:
        """The Open Inference Protocol's `model_version` of its answers: the variant's number (the version
        numbering of the whole protocol surface, docs/dataplane.md), or its name for a runtime started
        without one."""
        return str(self.variant_id) if self.variant_id is not None else self.variant

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RuntimeSpec":
        if not isinstance(data, Mapping):
            raise RuntimeSpecError(f"the spec must be a JSON object, got {type(data).__name__}")
        for name in ("key", "application", "variant"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise RuntimeSpecError(f"spec field {name!r} must be a non-empty string, got {data.get(name)!r}")
        artifact = data.get("artifact_path") or data.get("artifact")
        if artifact is not None and not isinstance(artifact, str):
            raise RuntimeSpecError(f"spec field 'artifact_path' must be a path or null, got {artifact!r}")
        simulated = data.get("simulated", False)
        if not isinstance(simulated, bool):
            raise RuntimeSpecError(f"spec field 'simulated' must be true or false, got {simulated!r}")
        if artifact is None and not simulated:
            raise RuntimeSpecError("spec: a runtime that is not simulated needs 'artifact_path'")
        ints = {}
        for name, default in (("cpu_threads", 1), ("max_batch", 1)):
            value = data.get(name)
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RuntimeSpecError(f"spec field {name!r} must be an integer >= 1, got {value!r}")
            ints[name] = value
        raw = data.get("batching") or {}
        if not isinstance(raw, Mapping):
            raise RuntimeSpecError("spec field 'batching' must be an object")
        slo = raw.get("slo_ms", 1000.0)
        if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not math.isfinite(slo) or slo <= 0:
            raise RuntimeSpecError(f"spec field 'batching.slo_ms' must be a finite number > 0, got {slo!r}")
        params = raw.get("params") or {}
        if not isinstance(params, Mapping):
            raise RuntimeSpecError("spec field 'batching.params' must be an object")
        margin = raw.get("margin_ms")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < slo):
            raise RuntimeSpecError(f"spec field 'batching.margin_ms' must be >= 0 and below slo_ms, got {margin!r}")
        batching = BatchingSpec(
            policy=str(raw.get("policy") or DEFAULT_BATCHING_POLICY), params=dict(params), drop_rule=str(raw.get("drop_rule") or "deadline"),
            queue_order=str(raw.get("queue_order") or "fifo"), slo_ms=float(slo),
            margin_ms=None if margin is None else float(margin),
        )
        profile = data.get("profile") or []
        if not isinstance(profile, list):
            raise RuntimeSpecError("spec field 'profile' must be a list of {batch, latency_ms}")
        try:
            profile_points(profile)
        except ValueError as exc:
            raise RuntimeSpecError(f"spec field {exc}") from None
        vertical = data.get("vertical")
        if vertical is not None:
            try:
                vertical = vertical_parse(vertical, "vertical").to_dict()
            except ValueError as exc:
                raise RuntimeSpecError(f"spec field {exc}") from None
        oversubscribe = data.get("cpu_oversubscribe", False)
        if not isinstance(oversubscribe, bool):
            raise RuntimeSpecError(f"spec field 'cpu_oversubscribe' must be true or false, got {oversubscribe!r}")
        if simulated and not profile and vertical is None:
            raise RuntimeSpecError("spec: a simulated runtime needs a 'profile' (its service time) or a 'vertical' model")
        for name in ("sha256", "device_uuid", "instance"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise RuntimeSpecError(f"spec field {name!r} must be a string or null, got {data[name]!r}")
        variant_id = data.get("variant_id")
        if variant_id is not None and (isinstance(variant_id, bool) or not isinstance(variant_id, int) or variant_id < 1):
            raise RuntimeSpecError(f"spec field 'variant_id' must be an integer >= 1 or null, got {variant_id!r}")
        turn = data.get("turn_ms")
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, (int, float)) or not math.isfinite(turn) or turn <= 0):
            raise RuntimeSpecError(f"spec field 'turn_ms' must be a finite number > 0 or null, got {turn!r}")
        return cls(
            key=data["key"], application=data["application"], variant=data["variant"], artifact_path=artifact,
            sha256=data.get("sha256") or None, simulated=simulated, device_uuid=data.get("device_uuid") or None,
            cpu_threads=ints["cpu_threads"], max_batch=ints["max_batch"], batching=batching,
            profile=[dict(p) if isinstance(p, Mapping) else {"batch": p[0], "latency_ms": p[1]} for p in profile],
            instance=data.get("instance") or None, turn_ms=None if turn is None else float(turn), vertical=vertical,
            cpu_oversubscribe=oversubscribe, variant_id=variant_id,
        )


_SLOT = re.compile(r"0|[1-9][0-9]*")
_MPS_PLACEMENT = re.compile(r"mps([0-9]+)@([0-9]+)")


@dataclass
class PartitionSpec(_SpecFile):
    """What a partition runtime process serves: the models that time-share one MPS partition (gpulets,
    ATC'22 §4.2-4.3; workers/runtime/partition.py), one `RuntimeSpec` each. The JSON file holds these fields,
    `models` a list of single-model specs (RuntimeSpec's JSON, each with its own key `<key>/<slot>` and
    instance); a spec with `models` is a partition spec (`spec_load`). `partition_percent` is the partition's
    share of the GPU's SMs (the process is started with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set to it; the
    runtime only reports it), `duty_cycle_ms` the plan's round (None: not planned as one). The models run on
    one GPU: a model without `device_uuid` takes the partition's, and the partition takes the models' when
    it names none. A model without `instance` gets `<instance>/<slot>` when the partition has an instance."""

    key: str
    partition_percent: int
    models: list[RuntimeSpec]
    duty_cycle_ms: float | None = None
    device_uuid: str | None = None
    instance: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PartitionSpec":
        if not isinstance(data, Mapping):
            raise RuntimeSpecError(f"the spec must be a JSON object, got {type(data).__name__}")
        key = data.get("key")
        if not isinstance(key, str) or not key:
            raise RuntimeSpecError(f"partition spec field 'key' must be a non-empty string, got {key!r}")
        percent = data.get("partition_percent")
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
            raise RuntimeSpecError(f"partition spec field 'partition_percent' must be an integer in 1..100, got {percent!r}")
        placement = _MPS_PLACEMENT.fullmatch(key.rsplit("/", 1)[-1])
        if placement is not None and int(placement.group(1)) != percent:
            raise RuntimeSpecError(f"partition spec: key {key!r} names mps{placement.group(1)} but 'partition_percent' is {percent}")
        duty = data.get("duty_cycle_ms")
        if duty is not None and (isinstance(duty, bool) or not isinstance(duty, (int, float)) or not math.isfinite(duty) or duty <= 0):
            raise RuntimeSpecError(f"partition spec field 'duty_cycle_ms' must be a finite number > 0 or null, got {duty!r}")
        for name in ("device_uuid", "instance"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise RuntimeSpecError(f"partition spec field {name!r} must be a string or null, got {data[name]!r}")
        raw_models = data.get("models")
        if not isinstance(raw_models, list) or not raw_models:
            raise RuntimeSpecError(f"partition spec field 'models' must be a non-empty list of runtime specs, got {raw_models!r}")
        instance = data.get("instance") or None
        models: list[RuntimeSpec] = []
        seen_keys: dict[str, int] = {}
        for i, raw in enumerate(raw_models):
            try:
                model = RuntimeSpec.from_dict(raw)
            except RuntimeSpecError as exc:
                raise RuntimeSpecError(f"partition spec models[{i}]: {exc}") from None
            parent, _, slot = model.key.rpartition("/")
            if parent != key or not _SLOT.fullmatch(slot):
                raise RuntimeSpecError(f"partition spec models[{i}]: key {model.key!r} is not {key + '/<slot>'!r} (slot 0, 1, 2, ...)")
            if model.key in seen_keys:
                raise RuntimeSpecError(f"partition spec: models[{seen_keys[model.key]}] and models[{i}] have the same key {model.key!r}")
            seen_keys[model.key] = i
            for name, want in (("mps_percent", percent), ("duty_cycle_ms", duty)):
                # Fields of the desired state's runtime documents the agent may pass on: they must agree.
                if name in raw and raw[name] is not None and raw[name] != want:
                    raise RuntimeSpecError(f"partition spec models[{i}] ({model.key}): {name} {raw[name]!r} is not the partition's {want!r}")
            if model.instance is None and instance is not None:
                model.instance = f"{instance}/{slot}"
            models.append(model)
        uuids = {m.device_uuid for m in models if m.device_uuid} | ({data["device_uuid"]} if data.get("device_uuid") else set())
        if len(uuids) > 1:
            named = [f"{m.key}: {m.device_uuid}" for m in models if m.device_uuid]
            if data.get("device_uuid"):
                named.insert(0, f"partition: {data['device_uuid']}")
            raise RuntimeSpecError(f"partition spec: the models of a partition run on one GPU, but they name {len(uuids)} "
                                   f"({', '.join(named)})")
        device_uuid = next(iter(uuids), None)
        for model in models:
            model.device_uuid = device_uuid
        instances: dict[str, str] = {}
        for model in models:
            served_as = model.instance or model.key
            if served_as in instances:
                raise RuntimeSpecError(f"partition spec: {instances[served_as]} and {model.key} have the same instance {served_as!r}")
            instances[served_as] = model.key
        return cls(key=key, partition_percent=percent, models=models, duty_cycle_ms=None if duty is None else float(duty),
                   device_uuid=device_uuid, instance=instance)


def _spec_read(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise RuntimeSpecError(f"cannot read the spec {path}: {exc}") from None
    except ValueError as exc:
        raise RuntimeSpecError(f"the spec {path} is not valid JSON: {exc}") from None


def spec_from_dict(data: Mapping[str, Any]) -> RuntimeSpec | PartitionSpec:
    """A partition spec when `data` has "models", else a single-model spec."""
    if isinstance(data, Mapping) and "models" in data:
        return PartitionSpec.from_dict(data)
    return RuntimeSpec.from_dict(data)


def spec_load(path: str | Path) -> RuntimeSpec | PartitionSpec:
    """The spec file `path` (what `--spec` names): a partition spec when it has "models", else a single-model spec."""
    return spec_from_dict(_spec_read(path))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def ready_file_write(path: str | Path, endpoint: str) -> None:
    """Write the endpoint to the ready file atomically (temp file in the same folder, then os.replace)."""
    _atomic_write(Path(path), endpoint)

