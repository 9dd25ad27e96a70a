"""Checks an ONNX file the way a runtime will use it: the ONNX checker, then an onnxruntime session on the
CPU provider. Pure functions over bytes or a path; no Django."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnxruntime as ort


class InvalidOnnxModel(ValueError):
    """The file is not a model onnxruntime can serve; the message says why."""


@dataclass(frozen=True)
class OnnxModelInfo:
    sha256: str
    size_bytes: int
    ir_version: int
    opset: int
    producer: str
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)


def _tensor_specs(values) -> list[dict]:
    # onnxruntime reports symbolic dimensions as strings and unknown ones as None: keep both as they are.
    return [{"name": v.name, "dtype": v.type, "shape": list(v.shape)} for v in values]


# The input types a runtime can feed from a request: tensors of the protocol's datatypes that numpy holds
# (workers/wire.py: BOOL, the integers, FP16/32/64, and BYTES as strings).
FEEDABLE_INPUT_TYPES = frozenset({
    "tensor(bool)", "tensor(uint8)", "tensor(uint16)", "tensor(uint32)", "tensor(uint64)", "tensor(int8)", "tensor(int16)",
    "tensor(int32)", "tensor(int64)", "tensor(float16)", "tensor(float)", "tensor(double)", "tensor(string)",
})


def onnx_model_inspect(source: Path | bytes) -> OnnxModelInfo:
    data = source.read_bytes() if isinstance(source, Path) else source
    digest = hashlib.sha256(data).hexdigest()
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for garbage input
        raise InvalidOnnxModel(f"Not an ONNX model: {exc}") from exc
    if any(
        init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer
    ):
        raise InvalidOnnxModel("Models with external tensor data are not supported; upload a single self-contained file.")
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - checker and shape inference raise different types
        raise InvalidOnnxModel(f"ONNX checker: {exc}") from exc
    try:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception classes
        raise InvalidOnnxModel(f"onnxruntime cannot load the model: {exc}") from exc
    unfed = [f"{i.name} ({i.type})" for i in session.get_inputs() if i.type not in FEEDABLE_INPUT_TYPES]
    if unfed:
        raise InvalidOnnxModel(
            f"Tessera cannot feed input {', '.join(unfed)}: the Open Inference Protocol carries tensors of "
            f"{', '.join(sorted(t.removeprefix('tensor(').rstrip(')') for t in FEEDABLE_INPUT_TYPES))} only "
            "(no sequences, maps, optionals, bfloat16 or complex numbers)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxModelInfo(
        sha256=digest,
        size_bytes=len(data),
        ir_version=model.ir_version,
        opset=opset,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        inputs=_tensor_specs(session.get_inputs()),
        outputs=_tensor_specs(session.get_outputs()),
    )
