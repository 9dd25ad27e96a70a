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
    "TritonModelConfig",
    "TritonTensor",
    "triton_config_pbtxt",
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
