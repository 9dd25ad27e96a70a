"""The runtime process: one serving instance (a GPU, a MIG instance, or a CPU allotment), or the models that
time-share one MPS partition, behind the router's frame protocol (docs/dataplane.md, "Router <-> runtime
frames").

    python -m workers.runtime.server --spec SPEC.json --listen 127.0.0.1:0 --ready-file PATH

Start-up: read the spec (`RuntimeSpec`), pin the GPU (CUDA_VISIBLE_DEVICES = device_uuid, unless the
environment already sets it), load the model (`OnnxSession`, its sha256 checked) or a `SimulatedSession`,
warm it up, start the instance batcher (threaded, the spec's batching policy, drop rule, queue order and
SLO, the profile as the policy's latency function), bind the TCP server, and only then write the endpoint
it listens on, `tcp://HOST:PORT` (the real port when 0 was asked), to the ready file, atomically (a temp
file renamed over it): the agent polls for that file. A runtime that cannot start writes no ready file,
prints `tessera-runtime: error: ...` on stderr and exits with status 2.

A spec with "models" is a partition spec (`PartitionSpec`): the models of one MPS partition (`key`
`gpu<i>/mps<NN>@<k>`, `partition_percent` NN, `duty_cycle_ms`, `device_uuid`, `instance`), each an ordinary
runtime spec keyed `<key>/<slot>`. One process serves them all (temporal sharing, gpulets ATC'22 §4.2-4.3):
one session and one batcher per model, each with its own queue, policy, drop rule and SLO, and at most one
batch running on the partition at a time (workers/runtime/partition.py): with a `duty_cycle_ms`, the plan's
rounds drive the batchers (`PartitionRounds`, the simulator's round: each model at its fixed slot, its
planned turn `turn_ms` long, sizes and runs a batch); without one, models with a batch ready take
work-conserving turns (`PartitionTurns`). The agent starts the process with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and the MPS daemon's directories in its environment; the runtime does not
read them. A partition's frames name their model by "key" (`<key>/<slot>`), else by "instance" (the model's
fleet instance id, what the router sends): `infer`, and `health`, `stats`, `metrics` naming a model, answer
for that model in exactly the single-model shape below; a key or instance the partition does not serve is
answered 404 `unknown_instance` (nothing runs), and so is an infer frame naming no model. Without a key,
`health` answers for the partition (`key`, `instance`, `partition_percent`, `duty_cycle_ms`, `device_uuid`,
`state`, `simulated`, `queue_length`, `in_flight`, `running`, `waiting`, `pid`, `uptime_s`, and `models`: each
model's keyed health without `id` and `status`, plus its `turns`: turns, wait_ms_total, wait_ms_max,
run_ms_total, over_duty_cycle; in rounds, the wait is how much later than its slot a turn came), `stats` answers `{"status": 200, "models": [one stats item per model]}`, and
`metrics` every model's series (labelled by its instance). `drain` drains the whole process. A single-model
runtime takes every frame as its model's, whatever key or instance the frame names.

Frames (one JSON header and a body each; any number in flight on a connection, answered as they finish,
matched by `id`, which is echoed back):

- `{"op": "infer", "id": 7, "deadline_ms": 48.5, "content_type": ..., "header_length": N or null,
  "instance": "<host>/<key>", "routing_version": 2, "application": "classify-resnet", "variant": "resnet50"}`
  with the client's KServe v2 body. `deadline_ms` is RELATIVE: milliseconds from when the runtime reads the
  frame (the router's remaining budget; clocks of two hosts are not comparable); absent: the SLO.
  `application` and `variant` are what the router's route expects this instance to serve: a runtime that
  serves anything else refuses the query with 409 `wrong_model` and runs nothing (a route the routing table
  has not withdrawn yet must never be answered by another model); absent or empty: not checked. Answer
  `{"id", "status": 200, "application", "variant", "simulated", "content_type", "header_length"}` with the
  KServe v2 response body (binary outputs when the request asked for them; `header_length` is then the
  response's Inference-Header-Content-Length). Errors carry `{"id", "status", "code", "message",
  "application", "variant", "simulated", "content_type": "application/json"}` and the body `{"error":
  {"status", "code", "message"}}`: 400 `malformed` (WireError, unknown or missing inputs, wrong datatype or
  shape), 409 `wrong_model`, 504 `deadline_exceeded` (the drop rule gave up on the query), 503 `draining`,
  500 `internal` (the model failed).
- `{"op": "health"}` -> `{"status": 200, "state": "ready"|"draining", "key", "application", "variant",
  "instance", "simulated", "providers", "max_batch", "queue_length", "in_flight", "pid", "uptime_s",
  "counters": {arrivals, served, late, dropped, failed, batches, queue_length since the start}}`, and on
  CPU runtimes what a resize changes: "cores", "cpus", "max_batch_limit", "resizes", "vertical" (the spec's
  block), "vertical_model" (the l(b, c) the policy plans with now, null: the profile)}`.
- `{"op": "stats"}` -> `{"status": 200, "stats": {...}}`: `InstanceStats.snapshot_and_reset()`, the
  interval's item of the agent's metrics `runtimes[]` (the agent calls it every second), plus the sizes
  `cores` (null on GPU runtimes), `max_batch`, `max_batch_limit`, `cpus` and what Sponge sizes an instance with: `rate_rps`
  (arrivals per second over the interval) and `budgets_ms` (the remaining budgets, deadline minus now, of
  the queries queued now, tightest first, then those the interval's other arrivals had on arrival, newest
  first; at most `BUDGETS_MAX` = 512 in all), `queued_budgets` how many of them are queued now. `{"op": "stats", "reader": "vertical"}` reads the sizes and
  signals over that reader's own interval and resets nothing else (the agent's fast vertical loop; the
  metrics interval is not disturbed).
- `{"op": "resize", "cores": N, "max_batch": B, "cpus": [ids], "model": {...} | null}` (CPU runtimes only;
  issue 19, vertical scaling in place): serve on N intra-op threads with batch cap B (default: unchanged;
  1..the largest of the spec's max_batch, its largest profiled batch and its vertical max_batch), every thread of the process pinned to `cpus`
  (N distinct CPU ids; default: the CPUs the process was started with). N is at most the CPUs the process
  may run on, unless the spec has `cpu_oversubscribe: true` (then up to 256). `model` replaces the
  vertical latency model l(b, c) the batching policy plans with (null: back to the profile). The session
  for N is built in the background while the current one serves (sessions are cached per core count,
  `SESSION_CACHE_MAX`), then swapped between batches with the new cap and latency function: nothing queued
  or in flight is dropped or failed. Answer `{"status": 200, "key", "cores", "max_batch", "cpus",
  "resize_ms" (frame to swap), "prepared" (a session for N was cached), "affinity_error" (null, or why the
  platform refused to pin: the resize stands), "vertical_model"}`; 400 `bad_resize` (nothing changes), 409
  `not_cpu_runtime` (a GPU runtime, an MPS partition), 500 `resize_failed` (the new session could not be
  built; nothing changes). `health` and `stats` report the current `cores` and `max_batch`.
- `{"op": "metrics"}` -> `{"status": 200, "content_type": ...}` with the Prometheus text as the body.
- `{"op": "drain", "timeout_ms": 10000}` -> stop taking queries (503 `draining` from now on) and answer
  `{"status": 200, "state": "drained"}` once nothing is queued or in flight, or `{"status": 504, "code":
  "drain_timeout"}` when `timeout_ms` (default: none) passes first. The process keeps running.

SIGTERM / SIGINT: drain (at most `--drain-timeout-s`), close, exit 0.

The hot path does not log, does not copy binary tensors (the arrays alias the frame's body; a query that
carries its own batch axis and runs alone goes to the model as it is), and hops threads once per query:
to the batcher's worker thread, which runs the batch and writes the answers itself.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import json
import logging
import math
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from engine.dataplane.batching import DEFAULT_BATCHING_POLICY, batching_policy_make, policy_latency_function
from engine.dataplane.rounds import round_batch_cap
from workers.metrics import PROMETHEUS_CONTENT_TYPE, RuntimeStats, exposition_merge
from workers.runtime.batcher import BatcherClosed, DeadlineExceeded, InstanceBatcher
from workers.runtime.partition import PartitionRounds, PartitionTurns, RoundMember
from workers.runtime.simulated import SimulatedSession, profile_points, vertical_points
from workers.runtime.vertical import ArrivalLog, VerticalSpec, affinity_apply, process_cpus, vertical_model_parse, vertical_parse
from workers.wire import (FRAME_PREFIX, UNKNOWN_INSTANCE, WRONG_MODEL, FrameParser, RequestedOutputs, WireError, datatype_of, error_body,
                          frame_pack, request_decode, response_encode)

__all__ = ["UNKNOWN_INSTANCE", "BatchingSpec", "PartitionSpec", "RuntimeServer", "RuntimeSpec", "RuntimeSpecError", "ServedModel",
           "ready_file_write", "main", "session_load", "spec_from_dict", "spec_load"]

log = logging.getLogger("tessera.runtime")

JSON_CT = "application/json"
BINARY_CT = "application/octet-stream"



def _text_check(name: str, array: np.ndarray) -> None:
    """WireError unless every element of a BYTES input is UTF-8 text (onnxruntime's string tensors are text)."""
    for i, value in enumerate(array.reshape(-1).tolist()):
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise WireError(f"input {name!r}: element {i} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                f"the model's string inputs are text") from None

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


@dataclass
class RuntimeSpec:
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

    @classmethod
    def load(cls, path: str | Path) -> "RuntimeSpec":
        return cls.from_dict(_spec_read(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dump(self, path: str | Path) -> Path:
        path = Path(path)
        _atomic_write(path, json.dumps(self.to_dict(), indent=1))
        return path


_SLOT = re.compile(r"0|[1-9][0-9]*")
_MPS_PLACEMENT = re.compile(r"mps([0-9]+)@([0-9]+)")


@dataclass
class PartitionSpec:
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

    @classmethod
    def load(cls, path: str | Path) -> "PartitionSpec":
        return cls.from_dict(_spec_read(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dump(self, path: str | Path) -> Path:
        path = Path(path)
        _atomic_write(path, json.dumps(self.to_dict(), indent=1))
        return path


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


def session_load(spec: RuntimeSpec) -> Any:
    """The spec's session: a SimulatedSession, or an OnnxSession on the artifact (sha256 checked), warm."""
    if spec.simulated:
        if spec.vertical is not None:  # its service time is Sponge's l(b, c) at its cores
            vertical = vertical_parse(spec.vertical)
            limit = max([spec.max_batch, vertical.max_batch or 1] + [p.batch for p in profile_points(spec.profile)])
            return SimulatedSession(spec.profile, limit, vertical=vertical.model, cores=spec.cpu_threads)
        return SimulatedSession(spec.profile, spec.max_batch)
    from workers.runtime.session import OnnxSession

    if spec.device_uuid and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device_uuid
    assert spec.artifact_path is not None
    session = OnnxSession(spec.artifact_path, sha256=spec.sha256, intra_op_threads=spec.cpu_threads, device_uuid=spec.device_uuid)
    session.warmup(sorted({1, spec.max_batch}))
    return session


def _input_signature(session: Any) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """{input name: (numpy dtype or None, dims)} read from an OnnxSession (empty: accept anything)."""
    inputs = getattr(session, "_inputs", None)
    if not inputs:
        return {}
    from workers.runtime.session import _ONNX_DTYPES

    out = {}
    for i in inputs:
        dt = np.dtype(object) if i.type == "tensor(string)" else _ONNX_DTYPES.get(i.type)  # BYTES: object arrays of bytes
        out[i.name] = (np.dtype(dt) if dt is not None else None, tuple(i.shape))
    return out


def _datatype_name(dt: np.dtype) -> str:
    """The protocol's name of a numpy dtype (BYTES for object arrays), or numpy's where it has none."""
    try:
        return datatype_of(np.empty(0, dtype=dt))
    except WireError:
        return str(dt)


def _measured_profile(session: Any, max_batch: int, signature: dict) -> list[dict[str, Any]]:
    """A latency profile measured on the session (a real runtime started without one)."""
    points = []
    for b in sorted({1, max_batch}):
        feed = []
        for _ in range(b):
            feed.append({name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in dims[1:]], dtype=dt or np.float32)
                         for name, (dt, dims) in signature.items()})
        times = []
        for _ in range(5):
            t = time.perf_counter()
            session.run_batch(feed)
            times.append((time.perf_counter() - t) * 1000.0)
        points.append({"batch": b, "latency_ms": sorted(times)[len(times) // 2]})
    return points


class _Query:
    __slots__ = ("inputs", "batched", "arrival_ms", "deadline_ms", "end_ms", "compute_ms", "start_ms")

    def __init__(self, inputs: dict, batched: bool, arrival_ms: float, deadline_ms: float) -> None:
        self.inputs = inputs
        self.batched = batched  # every input carries its own batch axis (the model can take it as it is)
        self.arrival_ms = arrival_ms
        self.deadline_ms = deadline_ms
        self.start_ms = self.end_ms = self.compute_ms = 0.0


class _Connection:
    """One frame connection. Reads happen on the event loop (`loop.add_reader`, non-blocking recv); writes
    come from any thread (the loop for control answers, the batcher's worker thread for inference answers,
    which saves a thread hop per query): one lock per connection keeps frames whole, and a write waits until
    it is complete, at most `_SEND_TIMEOUT_S` (a peer that stops reading for that long is disconnected)."""

    __slots__ = ("server", "sock", "fd", "parser", "closed", "lock", "peer")

    def __init__(self, server: "RuntimeServer", sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.parser = FrameParser()
        self.closed = False
        self.lock = threading.Lock()
        try:
            self.peer = sock.getpeername()
        except OSError:
            self.peer = None

    def readable(self) -> None:
        try:
            data = self.sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        try:
            frames = self.parser.feed(data)
        except ValueError as exc:  # FrameError: this connection cannot be trusted any more
            log.warning("closing the connection from %s: %s", self.peer, exc)
            self.close()
            return
        handle = self.server.frame_handle
        for header, body in frames:
            handle(self, header, body)

    def send(self, header: dict, body: bytes = b"") -> None:
        """Send one frame (any thread)."""
        self.send_bytes(frame_pack(header, body))

    def send_bytes(self, data: bytes, body: bytes | memoryview = b"") -> None:
        """Send `data`, then `body` (a large answer's tensor bytes, gathered into the same sendmsg rather than
        copied onto the frame's head)."""
        if self.closed:
            return
        with self.lock:
            try:
                if not body:
                    self.sock.sendall(data)
                else:
                    sent = self.sock.sendmsg((data, body))
                    if sent < len(data) + len(body):  # the kernel took part of it (a full send buffer)
                        if sent < len(data):
                            self.sock.sendall(memoryview(data)[sent:])
                            sent = len(data)
                        self.sock.sendall(memoryview(body)[sent - len(data):])
            except OSError:
                self.closed = True
                loop = self.server._loop
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(self.close)

    def close(self) -> None:
        """Close (event loop thread)."""
        self.closed = True
        loop = self.server._loop
        if self.fd >= 0:
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self.fd)
            self.fd = -1
            with self.lock:
                self.sock.close()
        self.server._connections.discard(self)


_RECV_BYTES = 1 << 18
_GATHER_BYTES = 1 << 16  # an answer body above this is sent after its frame head by one sendmsg, not copied onto it
_SEND_TIMEOUT_S = 10.0


class _Prepared:
    """A session ready to serve at one core count: what a batch reads, as one object, so that a swap (one
    attribute store) is never seen half done. `points`: the latency profile the batching policy plans with
    at these cores when no vertical model says it (the spec's at its own cores, else measured on the session),
    `model`: the vertical model a simulated session was built with (its service time)."""

    __slots__ = ("cores", "session", "run_direct", "points", "model")

    def __init__(self, cores: int, session: Any, run_direct: Any, points: list | None, model: Any = None) -> None:
        self.cores = cores
        self.session = session
        self.run_direct = run_direct
        self.points = points
        self.model = model


# Sessions kept per model, by core count, the active one included (least recently used goes first): a resize
# back to a recent size swaps at once. Each ONNX session holds its own copy of the weights and an idle
# thread pool of cores - 1 threads.
SESSION_CACHE_MAX = 4
# A resize of a spec with `cpu_oversubscribe` may ask for up to this many cores, whatever the CPUs.
OVERSUBSCRIBED_CORES_MAX = 256
_UNSET = object()
NOT_CPU_RUNTIME = "not_cpu_runtime"


def _is_cpu_runtime(spec: RuntimeSpec, session: Any) -> bool:
    """A CPU runtime: its key names a CPU (`cpu0/1`); a key that is no fleet key: no GPU named and no CUDA."""
    from engine.geometry import names

    try:
        return names.runtime_key_parse(spec.key).kind == "cpu"
    except ValueError:
        return spec.device_uuid is None and "CUDAExecutionProvider" not in list(getattr(session, "providers", []))


class ServedModel:
    """One model a runtime process serves: its spec, session, batcher and stats, and the way of its queries
    (checks, the batch run on the batcher's worker thread, the answers). A single-model runtime has one; a
    partition runtime one per model, their batchers taking turns on the partition (`turns`, work-conserving)
    or driven by its duty-cycle rounds (`round_driven`; `round_member` is what the rounds need).

    A CPU model can be resized in place (`resize`, issue 19): its sessions are kept per core count
    (`SESSION_CACHE_MAX`), one built in a background thread while the active one serves, and the swap is
    one store of `_active`, which each batch reads once, taken under the batcher's lock together with the
    new batch cap and latency function."""

    def __init__(self, server: "RuntimeServer", spec: RuntimeSpec, session: Any | None = None, turns: PartitionTurns | None = None,
                 *, field_prefix: str = "", round_driven: bool = False) -> None:
        self.server = server
        self.spec = spec
        self.instance = spec.instance or spec.key
        self.vertical: VerticalSpec | None = vertical_parse(spec.vertical) if spec.vertical is not None else None
        self.model = self.vertical.model if self.vertical is not None else None  # l(b, c) the policy plans with, if any
        session = session if session is not None else session_load(spec)
        self.simulated = bool(getattr(session, "simulated", False))
        self.is_cpu = _is_cpu_runtime(spec, session) and server.partition is None
        if self.vertical is not None and not self.is_cpu:
            raise RuntimeSpecError(f"spec field '{field_prefix}vertical': vertical scaling is for CPU runtimes only ({spec.key} is not one)")
        self.signature = _input_signature(session)
        profile = spec.profile or (None if self.model is not None and self.simulated else _measured_profile(session, spec.max_batch, self.signature))
        points = profile_points(profile) if profile else []
        # The largest batch a resize may ask for: the plan's cap, the largest profiled batch or the vertical
        # block's max_batch, whichever is largest.
        self.batch_limit = max([spec.max_batch] + [p.batch for p in points]
                               + ([self.vertical.max_batch] if self.vertical is not None and self.vertical.max_batch else []))
        self.cores = spec.cpu_threads
        self.cpus: frozenset[int] | None = server.cpus_allowed  # the process's CPUs until a resize pins it
        self._active = _Prepared(self.cores, session, getattr(session, "run", None) if self.signature else None, points or None,
                                 self.model if self.simulated else None)
        self._sessions: dict[int, _Prepared] = {self.cores: self._active}  # by core count, least recently used first
        self._resize_queue: Any = None  # the resize thread's work (started on the first resize)
        self.resizes = 0
        latency_ms = self._latency_function(self._active)
        # One registry per model: `metrics` with a key answers for that model alone, as a single-model runtime.
        self.stats = RuntimeStats()
        self.instance_stats = self.stats.instance(
            key=spec.key, application=spec.application, variant=spec.variant, instance=self.instance, simulated=self.simulated)
        self.arrivals = ArrivalLog(time.monotonic() * 1000.0)
        b = spec.batching
        try:
            policy = batching_policy_make(b.policy, **b.params)
            self.batcher = InstanceBatcher(
                policy, latency_ms=latency_ms, max_batch=spec.max_batch, execute=self._execute, drop_rule=b.drop_rule,
                slo_ms=b.slo_ms, queue_order=b.queue_order,
                margin_ms=b.margin_ms if b.margin_ms is not None else batching_margin_ms(b.slo_ms),
                turn=None if turns is None else functools.partial(turns.turn, spec.key), round_driven=round_driven,
            )
        except (ValueError, TypeError) as exc:
            raise RuntimeSpecError(f"spec field '{field_prefix}batching': {exc}") from None
        # In a round: the plan's turn (its batch's latency on the partition, interference included), else
        # the profile's at the planned batch; a turn may run up to the largest profiled batch.
        self.round_member = RoundMember(
            key=spec.key, batcher=self.batcher, turn_ms=spec.turn_ms if spec.turn_ms is not None else float(latency_ms(spec.max_batch)),
            cap=round_batch_cap(spec.max_batch, (p.batch for p in points)))
        self.instance_stats.queue_length_source(self.batcher.__len__)
        self.turns = turns
        self.in_flight = 0
        self._count_lock = threading.Lock()
        self._params_default = {"variant": spec.variant, "instance": self.instance, "simulated": self.simulated}
        self._reply_head = ('{"status":200,"application":%s,"variant":%s,"simulated":%s,"content_type":' % (
            json.dumps(spec.application), json.dumps(spec.variant), "true" if self.simulated else "false")).encode()

    @property
    def session(self) -> Any:
        """The session batches run on now."""
        return self._active.session

    def _latency_function(self, prepared: _Prepared) -> Any:
        """The batching policy's latency function at `prepared`'s cores: Sponge's l(b, c) when a vertical model
        is set, else the session's profile points."""
        if self.model is not None:
            points = vertical_points(self.model, prepared.cores, self.batch_limit)
        else:
            points = prepared.points or []
        latency_ms, _ = policy_latency_function(points, self.batch_limit)
        return latency_ms

    # ------------------------------------------------------------------ the batcher's side (worker thread)

    def _execute(self, queries: list[_Query]) -> list[Any]:
        active = self._active  # read once: a resize swaps it between batches, never within one
        start = time.monotonic()  # on a partition: once the turn is granted (the batcher takes it around this call)
        if len(queries) == 1 and queries[0].batched and active.run_direct is not None:
            # One query that already has its batch axis: the model takes its arrays as they are
            # (run_batch would stack and split for nothing).
            outputs = [active.run_direct(queries[0].inputs)]
        else:
            outputs = active.session.run_batch([q.inputs for q in queries])
        end = time.monotonic()
        start_ms, end_ms = start * 1000.0, end * 1000.0
        compute_ms = end_ms - start_ms
        self.instance_stats.batch(len(queries), compute_ms)
        for q in queries:
            q.start_ms = start_ms
            q.end_ms = end_ms
            q.compute_ms = compute_ms
        return outputs

    # ------------------------------------------------------------------ frames (event loop thread)

    def error(self, conn: _Connection, rid: Any, status: int, code: str, message: str) -> None:
        conn.send({"id": rid, "status": status, "code": code, "message": message, "application": self.spec.application,
                   "variant": self.spec.variant, "simulated": self.simulated, "content_type": JSON_CT}, error_body(status, code, message))

    def health(self, rid: Any) -> dict:
        health = {
            "id": rid, "status": 200, "state": "draining" if self.server.draining else "ready", "key": self.spec.key,
            "application": self.spec.application, "variant": self.spec.variant, "instance": self.instance,
            "simulated": self.simulated, "providers": list(getattr(self.session, "providers", [])), "max_batch": self.batcher.max_batch,
            "queue_length": len(self.batcher), "in_flight": self.in_flight, "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.server.started, 3), "counters": self.instance_stats.totals(),
        }
        if self.is_cpu:  # what a resize changes (GPU runtimes keep their shape)
            health.update(cores=self.cores, cpus=sorted(self.cpus) if self.cpus is not None else None, max_batch_limit=self.batch_limit,
                          resizes=self.resizes, vertical=self.vertical.to_dict() if self.vertical else None,
                          vertical_model=dataclasses.asdict(self.model) if self.model is not None else None)
        return health

    def stats_item(self, reader: str | None) -> dict:
        """The `stats` answer's item. Without a reader (the agent's metrics loop): the interval's report
        (`InstanceStats.snapshot_and_reset`, which starts a new interval) with the sizes and Sponge's signals
        added; a named reader (the agent's fast vertical loop: "vertical") gets the sizes and signals over its
        own interval, and resets nothing else."""
        now_ms = time.monotonic() * 1000.0
        rate, budgets, interval_s, arrivals, queued = self.arrivals.read(reader or "", now_ms, self.batcher.queued_deadlines_ms())
        if reader:
            item: dict[str, Any] = {"key": self.spec.key, "application": self.spec.application, "variant": self.spec.variant,
                                    "arrivals": arrivals, "queue_length": len(self.batcher), "interval_s": round(interval_s, 6)}
        else:
            item = self.instance_stats.snapshot_and_reset()
        item["cores"] = self.cores if self.is_cpu else None
        item["max_batch"] = self.batcher.max_batch
        item["max_batch_limit"] = self.batch_limit
        item["cpus"] = sorted(self.cpus) if self.is_cpu and self.cpus is not None else None
        item["rate_rps"] = round(rate, 3)
        item["budgets_ms"] = budgets
        item["queued_budgets"] = queued
        return item

    # ------------------------------------------------------------------ resize (issue 19: vertical scaling in place)

    def resize(self, conn: _Connection, header: dict) -> None:
        """A `resize` frame (event loop thread): checked here (400 and nothing changes), done on the resize
        thread (the new session is built there while the active one serves), answered from there."""
        rid = header.get("id")
        received = time.monotonic()
        if not self.is_cpu:
            where = "an MPS partition's models run on a GPU" if self.server.partition is not None else "it runs on a GPU"
            self.error(conn, rid, 409, NOT_CPU_RUNTIME, f"instance {self.instance} cannot be resized: {where}; only CPU runtimes "
                       "change their cores in place (a GPU instance is resized by the plan: a new instance)")
            return
        try:
            request = self._resize_parse(header)
        except ValueError as exc:
            self.error(conn, rid, 400, "bad_resize", str(exc))
            return
        if self._resize_queue is None:
            import queue

            self._resize_queue = queue.SimpleQueue()
            # A daemon thread, not an executor: a resize left behind never holds the process's exit.
            threading.Thread(target=self._resize_worker, name="tessera-resize", daemon=True).start()
        self._resize_queue.put((conn, rid, request, received))

    def _resize_parse(self, header: dict) -> tuple[int, int, frozenset[int] | None, Any]:
        """(cores, max_batch, cpus, model) of a resize frame; ValueError saying what is wrong."""
        cores = header.get("cores")
        allowed = self.server.cpus_allowed
        limit = OVERSUBSCRIBED_CORES_MAX if self.spec.cpu_oversubscribe else (len(allowed) if allowed else (os.cpu_count() or 1))
        if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= limit:
            why = ("the spec allows oversubscription" if self.spec.cpu_oversubscribe
                   else "the CPUs this process may run on; a spec with cpu_oversubscribe: true allows more")
            raise ValueError(f"'cores' must be an integer in 1..{limit} ({why}), got {cores!r}")
        max_batch = header.get("max_batch")
        if max_batch is None:
            max_batch = self.batcher.max_batch
        elif isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= self.batch_limit:
            raise ValueError(f"'max_batch' must be an integer in 1..{self.batch_limit} (the largest of the spec's max_batch, its "
                             f"largest profiled batch and its vertical max_batch), got {max_batch!r}")
        cpus = header.get("cpus")
        if cpus is not None:
            if not isinstance(cpus, list) or not cpus or any(isinstance(c, bool) or not isinstance(c, int) for c in cpus) or len(set(cpus)) != len(cpus):
                raise ValueError(f"'cpus' must be a non-empty list of distinct CPU ids, got {cpus!r}")
            if allowed is not None and not set(cpus) <= allowed:
                raise ValueError(f"'cpus' {sorted(set(cpus) - allowed)} are not among the CPUs this process may run on {sorted(allowed)}")
            if len(cpus) != cores and not self.spec.cpu_oversubscribe:
                raise ValueError(f"'cpus' names {len(cpus)} CPUs for {cores} cores; give one CPU per core (or leave 'cpus' out)")
            cpus = frozenset(cpus)
        model: Any = _UNSET
        if "model" in header:
            model = None if header["model"] is None else vertical_model_parse(header["model"], "'model'")
        return cores, max_batch, cpus, model

    def _resize_worker(self) -> None:
        while True:
            conn, rid, request, received = self._resize_queue.get()
            try:
                reply = self._resize_run(request, received)
            except Exception as exc:  # the new session could not be built: nothing changed
                log.warning("resize of %s failed: %s: %s", self.instance, type(exc).__name__, exc)
                self.error(conn, rid, 500, "resize_failed", f"the resize failed and nothing changed: {type(exc).__name__}: {exc}")
                continue
            reply["id"] = rid
            conn.send(reply)

    def _resize_run(self, request: tuple[int, int, frozenset[int] | None, Any], received: float) -> dict:
        """Prepare the session for the new cores (cached, or built now while the active one serves), pin the
        threads, then swap between batches; the reply of docs/dataplane.md's `resize`."""
        cores, max_batch, cpus, model = request
        if model is not _UNSET and model != self.model:
            self.model = model
            # A simulated session's service time is its model: the cached ones are of the old model.
            for key in [k for k, p in self._sessions.items() if self.simulated and p is not self._active]:
                del self._sessions[key]
        prepared_entry = self._sessions.get(cores)
        if prepared_entry is not None and self.simulated and prepared_entry.model != self.model:
            prepared_entry = None
        prepared = prepared_entry is not None
        if prepared_entry is None:
            prepared_entry = self._session_build(cores, max_batch)
        self._sessions.pop(cores, None)
        self._sessions[cores] = prepared_entry  # the most recently used last
        latency_ms = self._latency_function(prepared_entry)
        target = cpus if cpus is not None else self.server.cpus_allowed
        affinity_error = affinity_apply(target) if target is not None else "this platform does not report the process's CPUs"

        def swap() -> None:
            self._active = prepared_entry
            self.cores = cores
            self.cpus = target if affinity_error is None else process_cpus()

        self.batcher.reconfigure(max_batch=max_batch, latency_ms=latency_ms, apply=swap)
        resize_ms = (time.monotonic() - received) * 1000.0
        while len(self._sessions) > SESSION_CACHE_MAX:
            oldest = next(k for k, p in self._sessions.items() if p is not self._active)
            del self._sessions[oldest]  # a batch still running on it holds its own reference
        self.resizes += 1
        return {"status": 200, "key": self.spec.key, "cores": cores, "max_batch": max_batch,
                "cpus": sorted(self.cpus) if self.cpus is not None else None, "resize_ms": round(resize_ms, 3), "prepared": prepared,
                "affinity_error": affinity_error, "vertical_model": self.model is not None}

    def _session_build(self, cores: int, max_batch: int) -> _Prepared:
        """A session at `cores`, warm, with its latency profile when no model says it (resize thread)."""
        spec = self.spec
        if self.simulated:
            session = SimulatedSession(spec.profile, self.batch_limit, vertical=self.model, cores=cores)
            return _Prepared(cores, session, None, profile_points(spec.profile) or None, self.model)
        from workers.runtime.session import OnnxSession

        assert spec.artifact_path is not None
        session = OnnxSession(spec.artifact_path, sha256=spec.sha256, intra_op_threads=cores, device_uuid=spec.device_uuid)
        session.warmup(sorted({1, max_batch}))
        points = None
        if self.model is None:
            # The spec's profile was measured at its own cores; at others the session is measured now.
            points = (profile_points(spec.profile) if spec.profile and cores == spec.cpu_threads
                      else profile_points(_measured_profile(session, self.batch_limit, self.signature)))
        return _Prepared(cores, session, session.run if self.signature else None, points)

    def infer(self, conn: _Connection, header: dict, body: bytes) -> None:
        rid = header.get("id")
        application, variant = header.get("application"), header.get("variant")
        if (application and application != self.spec.application) or (variant and variant != self.spec.variant):
            # The router's route is stale (the slot now serves another model): refuse before anything runs.
            self.error(conn, rid, 409, WRONG_MODEL, f"instance {self.instance} serves "
                       f"{self.spec.application}/{self.spec.variant}, not {application or '?'}/{variant or '?'}")
            return
        if self.server.draining:
            self.error(conn, rid, 503, "draining", f"instance {self.instance} is draining")
            return
        arrival_ms = time.monotonic() * 1000.0
        try:
            request_id, inputs, binary = request_decode(body, header.get("header_length"))
            batched = self._inputs_check(inputs) if self.signature else False
        except WireError as exc:
            self.error(conn, rid, 400, "malformed", str(exc))
            return
        budget = header.get("deadline_ms")
        deadline_ms = arrival_ms + (float(budget) if budget is not None else self.spec.batching.slo_ms)
        query = _Query(inputs, batched, arrival_ms, deadline_ms)
        self.instance_stats.arrival()
        self.arrivals.add(arrival_ms, deadline_ms)
        with self._count_lock:
            self.in_flight += 1
        context = (conn, rid, header)
        try:
            # The answer is encoded and sent from the thread that resolves the query (the batcher's worker).
            self.batcher.submit(query, arrival_ms=arrival_ms, deadline_ms=deadline_ms, done=lambda result, exc: self._infer_done(context, query, request_id, binary, result, exc))
        except BatcherClosed:
            with self._count_lock:
                self.in_flight -= 1
            self.instance_stats.failed()
            self.error(conn, rid, 503, "draining", "the instance is shutting down")

    def _inputs_check(self, inputs: dict) -> bool:
        """WireError unless `inputs` are the model's, with its datatypes and shapes (batch axis optional);
        True when every input carries the batch axis."""
        signature = self.signature
        batched = True
        missing = [n for n in signature if n not in inputs]
        if missing:
            raise WireError(f"missing inputs {missing}; the model takes {list(signature)}")
        if len(inputs) != len(signature):
            unknown = [n for n in inputs if n not in signature]
            raise WireError(f"unknown inputs {unknown}; the model takes {list(signature)}")
        for name, array in inputs.items():
            dt, dims = signature[name]
            if dt is not None and array.dtype != dt:
                raise WireError(f"input {name!r}: datatype {_datatype_name(array.dtype)} but the model takes {_datatype_name(dt)}")
            if array.dtype.kind == "O":
                _text_check(name, array)  # here, not in the batch's run, where it would fail the query's batch-mates too
            rank = len(dims)
            if array.ndim != rank:
                if array.ndim != rank - 1:
                    raise WireError(f"input {name!r}: shape {list(array.shape)} but the model takes {list(dims)} (batch axis optional)")
                batched = False
            tail = dims[1:]
            got = array.shape[array.ndim - len(tail):] if tail else ()
            for want, have in zip(tail, got):
                if isinstance(want, int) and want > 0 and want != have:
                    raise WireError(f"input {name!r}: shape {list(array.shape)} but the model takes {list(dims)}")
        return batched

    def _infer_done(self, context: tuple, query: _Query, request_id: str | None, binary: RequestedOutputs, result: Any, exc: BaseException | None) -> None:
        """A query's answer (any thread; usually the batcher's worker, right after its batch)."""
        conn, rid, header = context
        now_ms = time.monotonic() * 1000.0
        latency = now_ms - query.arrival_ms
        stats = self.instance_stats
        try:
            if exc is None:
                params = self._params_default
                instance, version = header.get("instance"), header.get("routing_version")
                if instance or version is not None:
                    params = dict(params)
                    if instance:
                        params["instance"] = instance
                    if version is not None:
                        params["routing_version"] = version
                try:
                    result = binary.select(result)
                except WireError as err:  # an output the model does not have: the request's fault
                    stats.failed(latency)
                    self.error(conn, rid, 400, "malformed", str(err))
                    return
                try:
                    body, header_length = response_encode(request_id, result, model_name=self.spec.application,
                                                          model_version=self.spec.model_version, parameters=params, binary=binary)
                except WireError as err:
                    stats.failed(latency)
                    self.error(conn, rid, 500, "internal", f"cannot encode the outputs: {err}")
                else:
                    stats.served(latency, query.start_ms - query.arrival_ms, query.compute_ms, query.end_ms > query.deadline_ms + 1e-6)
                    rid_json = b"%d" % rid if type(rid) is int else json.dumps(rid).encode()  # the router's ids are ints
                    # The query's time queued and computing, for the router's statistics (the protocol's stats extension).
                    timing = b'"queue_us":%d,"compute_us":%d' % (int((query.start_ms - query.arrival_ms) * 1000.0), int(query.compute_ms * 1000.0))
                    if header_length is None:
                        tail = b'"application/json","header_length":null,%s,"id":%s}' % (timing, rid_json)
                    else:
                        tail = b'"application/octet-stream","header_length":%d,%s,"id":%s}' % (header_length, timing, rid_json)
                    head = self._reply_head + tail
                    if len(body) > _GATHER_BYTES:
                        conn.send_bytes(FRAME_PREFIX.pack(len(head), len(body)) + head, body)
                    else:
                        conn.send_bytes(b"".join((FRAME_PREFIX.pack(len(head), len(body)), head, body)))
            elif isinstance(exc, DeadlineExceeded):
                stats.dropped(latency, latency)
                self.error(conn, rid, 504, "deadline_exceeded", f"the query cannot meet its deadline ({exc.rule!r} drop rule at the instance)")
            elif isinstance(exc, BatcherClosed):
                stats.failed(latency)
                self.error(conn, rid, 503, "draining", "the instance shut down before serving the query")
            else:
                stats.failed(latency, reason="BACKEND")
                self.error(conn, rid, 500, "internal", f"the model failed: {type(exc).__name__}: {exc}")
        finally:
            with self._count_lock:
                self.in_flight -= 1
            server = self.server
            if server._drain_waiters and server.in_flight == 0:
                loop = server._loop
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(server._drained)


class RuntimeServer:
    """The frame server around the process's models (see the module docstring): one `ServedModel` for a
    single-model spec, one per model for a partition spec, with the partition's `turns`. `sessions`
    (partition) or `session` (single model) replace what the spec would load (tests); `record_turns` keeps
    the partition's turn timeline. `start(host, port)` binds and returns the endpoint; `wait_closed()`
    returns once a shutdown finished."""

    def __init__(self, spec: RuntimeSpec | PartitionSpec, session: Any | None = None, *, sessions: Mapping[str, Any] | None = None,
                 record_turns: bool = False) -> None:
        self.spec = spec
        self.started = time.monotonic()
        self.draining = False
        self.cpus_allowed = process_cpus()  # what a resize may pin to: the CPUs the process was started with
        self._drain_waiters: list[tuple[_Connection, Any, asyncio.TimerHandle | None]] = []
        self.turns: PartitionTurns | PartitionRounds | None
        if isinstance(spec, PartitionSpec):
            self.partition: PartitionSpec | None = spec
            sessions = sessions or {}
            if spec.duty_cycle_ms is None:  # work-conserving turns
                self.turns = PartitionTurns([m.key for m in spec.models], None, record=record_turns)
                self.models = [ServedModel(self, m, sessions.get(m.key), self.turns, field_prefix=f"models[{i}].")
                               for i, m in enumerate(spec.models)]
            else:  # the plan's duty-cycle rounds drive the batchers
                self.models = [ServedModel(self, m, sessions.get(m.key), field_prefix=f"models[{i}].", round_driven=True)
                               for i, m in enumerate(spec.models)]
                self.turns = PartitionRounds([m.round_member for m in self.models], spec.duty_cycle_ms, record=record_turns)
        else:
            self.partition = None
            self.turns = None
            self.models = [ServedModel(self, spec, session)]
        self._by_key = {m.spec.key: m for m in self.models}
        self._by_instance = {m.instance: m for m in self.models}
        self.simulated = all(m.simulated for m in self.models)
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._closed: asyncio.Event | None = None
        self.endpoint: str | None = None

    @property
    def in_flight(self) -> int:
        """Queries taken and not answered yet (queued or in a batch), every model's."""
        return sum(m.in_flight for m in self.models)

    def model(self, key: str) -> ServedModel:
        """The model served under `key` (KeyError: none)."""
        return self._by_key[key]

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the batchers, bind, serve; returns the endpoint `tcp://HOST:PORT`."""
        self._loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        for model in self.models:
            model.batcher.start()
        if isinstance(self.turns, PartitionRounds):
            self.turns.start()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._loop.add_reader(listener.fileno(), self._accept)
        sockname = listener.getsockname()
        self.endpoint = f"tcp://{_host_str(sockname[0])}:{sockname[1]}"
        return self.endpoint

    def _accept(self) -> None:
        assert self._listener is not None and self._loop is not None
        while True:
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next readiness
                log.warning("accept failed: %s", exc)
                return
            # Blocking for sendall, with a kernel send timeout (not settimeout: that polls before every
            # send); reads never wait (MSG_DONTWAIT, on readiness).
            sock.setblocking(True)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(_SEND_TIMEOUT_S), 0))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            self._connections.add(conn)
            self._loop.add_reader(conn.fd, conn.readable)

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop taking queries, wait (at most `drain_timeout_s`) for what is queued and in flight, close."""
        self.draining = True
        deadline = time.monotonic() + drain_timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for conn in list(self._connections):
            conn.close()
        if isinstance(self.turns, PartitionRounds):
            self.turns.close(timeout=5.0)  # first: its batch in flight completes before the batchers fail the rest
        for model in self.models:
            model.batcher.close(timeout=5.0)
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        assert self._closed is not None
        await self._closed.wait()

    # ------------------------------------------------------------------ frames (event loop thread)

    def frame_handle(self, conn: _Connection, header: dict, body: bytes) -> None:
        op = header.get("op")
        rid = header.get("id")
        if op == "drain":  # the whole process, whatever the frame names
            self._drain(conn, header)
            return
        if op not in _MODEL_OPS:
            self._error(conn, rid, 400, "unknown_op", f"unknown op {op!r}; known: infer, health, stats, metrics, resize, drain")
            return
        model, unknown = self._select(header)
        reader = header.get("reader") if op == "stats" else None
        if reader is not None and not isinstance(reader, str):
            self._error(conn, rid, 400, "malformed", f"'reader' must be a name, got {reader!r}")
            return
        if model is None:
            if unknown is not None:
                self._error(conn, rid, 404, UNKNOWN_INSTANCE, unknown)
            elif op == "health":
                conn.send(self._partition_health(rid))
            elif op == "stats":
                conn.send({"id": rid, "status": 200, "models": [m.stats_item(reader) for m in self.models]})
            elif op == "resize":
                self._error(conn, rid, 409, NOT_CPU_RUNTIME, f"partition {self.spec.key} cannot be resized: an MPS partition's "
                            "models run on a GPU; only CPU runtimes change their cores in place")
            elif op == "metrics":
                text = exposition_merge(m.stats.exposition() for m in self.models)
                conn.send({"id": rid, "status": 200, "content_type": PROMETHEUS_CONTENT_TYPE}, text)
            else:
                self._error(conn, rid, 404, UNKNOWN_INSTANCE, f"partition {self.spec.key} serves {len(self.models)} models: an infer "
                            f"frame names one by 'key' ({', '.join(self._by_key)}) or 'instance' ({', '.join(self._by_instance)})")
            return
        if op == "infer":
            model.infer(conn, header, body)
        elif op == "health":
            conn.send(model.health(rid))
        elif op == "stats":
            conn.send({"id": rid, "status": 200, "stats": model.stats_item(reader)})
        elif op == "resize":
            model.resize(conn, header)
        else:
            conn.send({"id": rid, "status": 200, "content_type": PROMETHEUS_CONTENT_TYPE}, model.stats.exposition())

    def _select(self, header: dict) -> tuple[ServedModel | None, str | None]:
        """(the model a frame is for, None); (None, why) when it names a model not served here; (None, None)
        when a partition's frame names none. A single-model runtime takes every frame as its model's,
        whatever key or instance it names (as it always has). A partition's frame names its model by "key"
        (the runtime key, `<partition key>/<slot>`), else by "instance" (the fleet instance id; for a model
        whose spec has no instance, any `<host>/<model key>`)."""
        if self.partition is None:
            return self.models[0], None
        key = header.get("key")
        if key:
            model = self._by_key.get(key)
            if model is None:
                return None, f"partition {self.spec.key} serves no model {key!r}; it serves {', '.join(self._by_key)}"
            return model, None
        instance = header.get("instance")
        if instance:
            model = self._by_instance.get(instance)
            if model is None and isinstance(instance, str):
                suffixed = [m for k, m in self._by_key.items() if m.spec.instance is None and instance.endswith("/" + k)]
                model = suffixed[0] if len(suffixed) == 1 else None
            if model is None:
                return None, f"partition {self.spec.key} serves no instance {instance!r}; it serves {', '.join(self._by_instance)}"
            return model, None
        return None, None

    def _error(self, conn: _Connection, rid: Any, status: int, code: str, message: str) -> None:
        """An error frame not about one model (a single-model runtime's names its model, as always)."""
        if self.partition is None:
            self.models[0].error(conn, rid, status, code, message)
            return
        conn.send({"id": rid, "status": status, "code": code, "message": message, "application": None, "variant": None,
                   "simulated": self.simulated, "content_type": JSON_CT}, error_body(status, code, message))

    def _partition_health(self, rid: Any) -> dict:
        """`health` without a key on a partition runtime: the partition, and each model as its keyed health
        answers it (without id and status), with its turns on the partition."""
        assert self.partition is not None and self.turns is not None
        models = []
        for model in self.models:
            item = model.health(None)
            del item["id"], item["status"]
            item["turns"] = self.turns.counters(model.spec.key)
            models.append(item)
        return {
            "id": rid, "status": 200, "state": "draining" if self.draining else "ready", "key": self.partition.key,
            "instance": self.partition.instance or self.partition.key, "partition_percent": self.partition.partition_percent,
            "duty_cycle_ms": self.partition.duty_cycle_ms, "device_uuid": self.partition.device_uuid, "simulated": self.simulated,
            "queue_length": sum(item["queue_length"] for item in models), "in_flight": sum(item["in_flight"] for item in models),
            "running": self.turns.holder, "waiting": self.turns.waiting(), "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started, 3), "models": models,
        }

    def _drain(self, conn: _Connection, header: dict) -> None:
        self.draining = True
        rid = header.get("id")
        if self.in_flight == 0:
            conn.send({"id": rid, "status": 200, "state": "drained"})
            return
        timer = None
        entry: list = []
        timeout_ms = header.get("timeout_ms")
        if isinstance(timeout_ms, (int, float)) and not isinstance(timeout_ms, bool) and timeout_ms >= 0:
            timer = self._loop.call_later(timeout_ms / 1000.0, self._drain_timeout, entry)  # type: ignore[union-attr]
        waiter = (conn, rid, timer)
        entry.append(waiter)
        self._drain_waiters.append(waiter)
        if self.in_flight == 0:  # answered meanwhile (the worker threads)
            self._drained()

    def _drain_timeout(self, entry: list) -> None:
        waiter = entry[0]
        if waiter in self._drain_waiters:
            self._drain_waiters.remove(waiter)
            conn, rid, _ = waiter
            in_flight = self.in_flight
            conn.send({"id": rid, "status": 504, "code": "drain_timeout", "state": "draining", "in_flight": in_flight,
                       "message": f"{in_flight} queries still queued or in flight"})

    def _drained(self) -> None:
        if self.in_flight:
            return
        waiters, self._drain_waiters = self._drain_waiters, []
        for conn, rid, timer in waiters:
            if timer is not None:
                timer.cancel()
            conn.send({"id": rid, "status": 200, "state": "drained"})


_MODEL_OPS = frozenset(("infer", "health", "stats", "metrics", "resize"))


def _host_str(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen_parse(text: str) -> tuple[str, int]:
    host, sep, port = text.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise RuntimeSpecError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


def _served_str(spec: RuntimeSpec | PartitionSpec) -> str:
    if isinstance(spec, PartitionSpec):
        models = ", ".join(f"{m.key} {m.application}/{m.variant}" for m in spec.models)
        return f"MPS partition {spec.partition_percent}%: {models}"
    return f"{spec.application}/{spec.variant}"


async def _serve(server: RuntimeServer, host: str, port: int, ready_file: str | None, drain_timeout_s: float) -> None:
    endpoint = await server.start(host, port)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task] = []

    def stop() -> None:
        if not stopping:
            log.info("signal received: draining, then exiting")
            stopping.append(loop.create_task(server.shutdown(drain_timeout_s)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not on the main thread / platform
            pass
    if ready_file:
        ready_file_write(ready_file, endpoint)
    log.info("runtime %s (%s%s) serving on %s", server.spec.key, _served_str(server.spec), ", simulated" if server.simulated else "", endpoint)
    await server.wait_closed()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.runtime.server", description="A Tessera runtime process (one serving instance).")
    parser.add_argument("--spec", required=True, help="the runtime spec (JSON: RuntimeSpec's fields, or PartitionSpec's with 'models')")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free port)")
    parser.add_argument("--ready-file", default=None, help="where to write tcp://HOST:PORT once serving")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0, help="how long SIGTERM waits for queued queries")
    parser.add_argument("--log-level", default=os.environ.get("TESSERA_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # The event loop and the batcher's thread share the GIL: a short switch interval keeps a batch that
    # just finished from waiting behind the loop for the default 5 ms.
    sys.setswitchinterval(0.0005)
    try:
        spec = spec_load(args.spec)
        host, port = _listen_parse(args.listen)
        models = spec.models if isinstance(spec, PartitionSpec) else [spec]
        log.info("runtime %s starting: %s (%s)", spec.key, _served_str(spec),
                 ", ".join("simulated" if m.simulated else f"model {m.artifact_path}" for m in models))
        server = RuntimeServer(spec)
    except Exception as exc:  # the spec, the artifact (checksum), the model, the policy: the agent reports it
        print(f"tessera-runtime: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    # Everything loaded so far lives as long as the process: keep it out of the collector's way (fewer and
    # shorter full collections on the hot path).
    gc.collect()
    gc.freeze()
    loop = _event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(server, host, port, args.ready_file, args.drain_timeout_s))
    except OSError as exc:
        print(f"tessera-runtime: error: cannot listen on {args.listen}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
