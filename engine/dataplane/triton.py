"""A plan's runtime as a Triton Inference Server model configuration (`config.pbtxt`), pure: no I/O.

Tessera plans; a team that serves with Triton runs one `tritonserver` per MIG instance (or whole GPU, MPS
partition, CPU allotment) with the plan's models in its repository. What one runtime of a desired state
becomes (Triton's docs/user_guide/model_configuration.md and batcher.md, the fields of model_config.proto):

- `platform: "onnxruntime_onnx"` and `max_batch_size` = the plan's batch for the instance.
- `input` / `output` from the variant's tensor specs, with Triton's `TYPE_*` data types
  (engine/dataplane/tensors.py). With `max_batch_size` > 0 Triton takes the first dimension to be the
  batch and leaves it out of `dims` ("the full shape is formed as [ -1 ] + dims"); a dimension that varies
  is -1.
- `dynamic_batching`: `preferred_batch_size` [the plan's batch] (the size the plan's throughput assumes)
  and `max_queue_delay_microseconds` = the SLO less the profiled latency of that batch: the longest the
  first request of a batch can be held and still finish in time when the batch runs. The application's
  drop rule becomes the queue policy: `deadline` rejects a request that has waited longer than the SLO
  less the latency of a batch of one (it could no longer finish in time even alone), `slo-1x` / `slo-2x`
  one that has waited longer than one / two SLOs (`timeout_action: REJECT`); `never` sets none.
- `instance_group`: one instance of kind KIND_GPU on device 0 (the server sees only its own MIG device
  or GPU through CUDA_VISIBLE_DEVICES), or KIND_CPU with the ONNX Runtime backend's
  `intra_op_thread_count` set to the allotment's threads (triton-inference-server/onnxruntime_backend
  README, "Model Config Options").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from engine.dataplane.batching import DROP_RULES
from engine.dataplane.tensors import TensorSpecError, oip_shape, triton_datatype

__all__ = [
    "TRITON_PLATFORM",
    "TritonExportError",
    "TritonLoadConfigError",
    "TritonLoadSettings",
    "TritonModelConfig",
    "TritonTensor",
    "triton_config_pbtxt",
    "triton_load_config_parse",
    "triton_model_config",
    "triton_queue_delay_us",
    "triton_queue_timeout_us",
]

TRITON_PLATFORM = "onnxruntime_onnx"


class TritonExportError(ValueError):
    """A runtime that has no faithful Triton configuration (the message says which and why)."""


@dataclass(frozen=True)
class TritonTensor:
    name: str
    data_type: str  # TYPE_FP32, ...
    dims: tuple[int, ...]


@dataclass(frozen=True)
class TritonModelConfig:
    name: str
    max_batch_size: int
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]
    kind: str  # KIND_GPU | KIND_CPU
    queue_delay_us: int
    queue_timeout_us: int | None  # None: no queue policy
    cpu_threads: int | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)


def triton_queue_delay_us(*, slo_ms: float, batch_latency_ms: float) -> int:
    """The longest a request may wait for its batch to fill: the SLO less the batch's latency (0 when
    the batch alone takes the whole SLO), in whole microseconds."""
    return max(0, int((slo_ms - batch_latency_ms) * 1000))


def triton_queue_timeout_us(*, drop_rule: str, slo_ms: float, latency_at_1_ms: float) -> int | None:
    """How long a request may wait in the queue before Triton rejects it, for Tessera's drop rule
    (engine/dataplane/batching.py `QueryQueue.drop_expired`); None for `never`."""
    if drop_rule not in DROP_RULES:
        raise TritonExportError(f"unknown drop rule {drop_rule!r} (known: {', '.join(DROP_RULES)})")
    if drop_rule == "never":
        return None
    if drop_rule == "deadline":
        return max(1, int((slo_ms - latency_at_1_ms) * 1000))
    return int((2.0 if drop_rule == "slo-2x" else 1.0) * slo_ms * 1000)


def _latency_at(profile: Sequence[Mapping[str, Any]], batch: int) -> float:
    """The profiled latency of `batch` (linear between profiled batches; the nearest end outside them)."""
    points = sorted((int(p["batch"]), float(p["latency_ms"])) for p in profile)
    if not points:
        raise TritonExportError("the runtime has no profile to derive its batching delay from")
    if batch <= points[0][0]:
        return points[0][1]
    for (b0, l0), (b1, l1) in zip(points, points[1:]):
        if b0 <= batch <= b1:
            return l0 if b1 == b0 else l0 + (l1 - l0) * (batch - b0) / (b1 - b0)
    return points[-1][1]


def _tensors(specs: Sequence[Mapping[str, Any]], what: str, model: str) -> tuple[TritonTensor, ...]:
    if not specs:
        raise TritonExportError(f"{model}: the variant declares no {what} (Triton needs each one's name, type and shape)")
    out = []
    for spec in specs:
        try:
            shape = oip_shape(spec.get("shape") or [])
            data_type = triton_datatype(spec.get("dtype", ""))
        except TensorSpecError as exc:
            raise TritonExportError(f"{model}: {what} {spec.get('name')!r}: {exc}") from exc
        if not shape or shape[0] != -1:
            raise TritonExportError(
                f"{model}: {what} {spec['name']!r} has shape {spec.get('shape')!r}; Triton batches along a first "
                "dimension that varies, and this one is fixed")
        out.append(TritonTensor(spec["name"], data_type, tuple(shape[1:])))
    return tuple(out)


def triton_model_config(*, name: str, runtime: Mapping[str, Any], inputs: Sequence[Mapping[str, Any]],
                        outputs: Sequence[Mapping[str, Any]]) -> TritonModelConfig:
    """The configuration of one runtime of a validated desired state (`max_batch`, `batching` with its
    `slo_ms` and `drop_rule`, `profile`, `cpu_threads` on CPUs), serving a variant with these tensor
    specs ([{name, dtype, shape}], the registry's)."""
    max_batch = int(runtime["max_batch"])
    batching = runtime["batching"]
    slo_ms = float(batching["slo_ms"])
    profile = runtime.get("profile") or []
    cpu_threads = runtime.get("cpu_threads")
    parameters = {"intra_op_thread_count": str(int(cpu_threads))} if cpu_threads else {}
    return TritonModelConfig(
        name=name, max_batch_size=max_batch,
        inputs=_tensors(inputs, "input", name), outputs=_tensors(outputs, "output", name),
        kind="KIND_CPU" if cpu_threads else "KIND_GPU",
        queue_delay_us=triton_queue_delay_us(slo_ms=slo_ms, batch_latency_ms=_latency_at(profile, max_batch)),
        queue_timeout_us=triton_queue_timeout_us(drop_rule=batching.get("drop_rule", "deadline"), slo_ms=slo_ms,
                                                 latency_at_1_ms=_latency_at(profile, 1)),
        cpu_threads=int(cpu_threads) if cpu_threads else None, parameters=parameters,
    )


def _quoted(text: str) -> str:
    """A protobuf text-format string literal (backslash, quote and line breaks escaped; UTF-8 kept)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _tensor_pbtxt(tensor: TritonTensor) -> str:
    dims = ", ".join(str(d) for d in tensor.dims)
    return f"  {{\n    name: {_quoted(tensor.name)}\n    data_type: {tensor.data_type}\n    dims: [ {dims} ]\n  }}"


def triton_config_pbtxt(config: TritonModelConfig) -> str:
    """The configuration in protobuf text format, as Triton reads `config.pbtxt`."""
    lines = [
        f"name: {_quoted(config.name)}",
        f"platform: {_quoted(TRITON_PLATFORM)}",
        f"max_batch_size: {config.max_batch_size}",
        "input [\n" + ",\n".join(_tensor_pbtxt(t) for t in config.inputs) + "\n]",
        "output [\n" + ",\n".join(_tensor_pbtxt(t) for t in config.outputs) + "\n]",
    ]
    batching = [f"  preferred_batch_size: [ {config.max_batch_size} ]",
                f"  max_queue_delay_microseconds: {config.queue_delay_us}"]
    if config.queue_timeout_us is not None:
        batching.append("  default_queue_policy {\n    timeout_action: REJECT\n"
                        f"    default_timeout_microseconds: {config.queue_timeout_us}\n  }}")
    lines.append("dynamic_batching {\n" + "\n".join(batching) + "\n}")
    group = f"    count: 1\n    kind: {config.kind}" + ("\n    gpus: [ 0 ]" if config.kind == "KIND_GPU" else "")
    lines.append("instance_group [\n  {\n" + group + "\n  }\n]")
    for key, value in sorted(config.parameters.items()):
        lines.append(f"parameters {{\n  key: {_quoted(key)}\n  value: {{ string_value: {_quoted(value)} }}\n}}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- a load's configuration

# The fields of a model configuration (model_config.proto) a load may carry, and what Tessera makes of each.
LOAD_CONFIG_FIELDS = ("name", "platform", "backend", "max_batch_size", "dynamic_batching", "input", "output")
LOAD_MAX_BATCH = 4096  # the largest query size a plan knows (engine.plans.problem.MAX_QUERY_SIZE)
LOAD_MAX_DELAY_US = 10_000_000  # 10 s: a longer batching delay is no serving configuration


class TritonLoadConfigError(ValueError):
    """A load's configuration that Tessera cannot apply: `field` is the configuration's field (dotted)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class TritonLoadSettings:
    """What a load's configuration changes of an application; None: left as it is (a field the configuration
    leaves out changes nothing)."""

    max_batch_size: int | None = None  # the largest batch plans may run (Triton's 0, no batching: 1)
    batching_delay_ms: float | None = None  # Triton's dynamic batching delay, in ms: the runtimes batch with max-delay


def triton_load_config_parse(config: Any, *, model: str, inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> TritonLoadSettings:
    """A model repository load's `parameters.config` (Triton's model configuration as JSON, a string or an
    object; extension_model_repository.md) -> the settings it maps onto, or TritonLoadConfigError naming the
    first field that does not map. Mapped: `max_batch_size` (the plans' batch cap; 0, Triton's "no batching",
    caps it at 1) and `dynamic_batching.max_queue_delay_microseconds` (the application's batching delay).
    Accepted as they are: `name` (the model's own), `platform`/`backend` (ONNX Runtime's), `input`/`output`
    naming tensors the model has. Refused: anything else, `instance_group` included: plans size instances to
    demand, which an SLO policy's expected demand declares."""
    import json

    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise TritonLoadConfigError("config", f"not valid JSON: {exc}") from None
    if not isinstance(config, Mapping):
        raise TritonLoadConfigError("config", "must be a model configuration (a JSON object)")
    for key in config:
        if key not in LOAD_CONFIG_FIELDS:
            why = ("plans decide instance counts from demand: declare the application's expected demand "
                   "(its SLO policy's expected_rps) instead") if key == "instance_group" else \
                  f"not a field Tessera maps (it maps {', '.join(LOAD_CONFIG_FIELDS)})"
            raise TritonLoadConfigError(str(key), why)
    if "name" in config and config["name"] != model:
        raise TritonLoadConfigError("name", f"{config['name']!r} is not the model loaded ({model!r})")
    if config.get("platform", TRITON_PLATFORM) != TRITON_PLATFORM:
        raise TritonLoadConfigError("platform", f"Tessera serves ONNX models ({TRITON_PLATFORM!r}), not {config['platform']!r}")
    if config.get("backend", "onnxruntime") != "onnxruntime":
        raise TritonLoadConfigError("backend", f"Tessera runs ONNX Runtime ('onnxruntime'), not {config['backend']!r}")
    for key, known in (("input", inputs), ("output", outputs)):
        tensors = config.get(key, [])
        if not isinstance(tensors, list) or any(not isinstance(t, Mapping) for t in tensors):
            raise TritonLoadConfigError(key, "must be a list of tensors")
        for i, tensor in enumerate(tensors):
            if tensor.get("name") not in known:
                raise TritonLoadConfigError(f"{key}[{i}].name", f"the model has no {key} tensor {tensor.get('name')!r} "
                                                                f"(its {key}s: {', '.join(known) or 'none'}); upload a new variant to change them")
    max_batch = None
    if "max_batch_size" in config:
        value = config["max_batch_size"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LOAD_MAX_BATCH:
            raise TritonLoadConfigError("max_batch_size", f"must be a whole number 0..{LOAD_MAX_BATCH}, got {value!r}")
        max_batch = max(1, value)
    delay_ms = None
    if "dynamic_batching" in config:
        batching = config["dynamic_batching"]
        if not isinstance(batching, Mapping):
            raise TritonLoadConfigError("dynamic_batching", "must be an object")
        for key in batching:
            if key != "max_queue_delay_microseconds":
                raise TritonLoadConfigError(f"dynamic_batching.{key}", "not mapped: the plan picks the batch sizes "
                                                                      "(cap them with max_batch_size)")
        delay = batching.get("max_queue_delay_microseconds", 0)
        if isinstance(delay, str) and delay.isdigit():  # protobuf's JSON mapping writes 64-bit integers as strings
            delay = int(delay)
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= LOAD_MAX_DELAY_US:
            raise TritonLoadConfigError("dynamic_batching.max_queue_delay_microseconds", f"must be a whole number 0..{LOAD_MAX_DELAY_US}, got {delay!r}")
        delay_ms = delay / 1000.0
    return TritonLoadSettings(max_batch_size=max_batch, batching_delay_ms=delay_ms)
