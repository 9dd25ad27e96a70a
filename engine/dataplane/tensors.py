"""Tensor descriptions in the three spellings Tessera meets: ONNX Runtime's type strings (what the registry
stores from an artifact: ``tensor(float)``), the Open Inference Protocol's datatypes (KServe v2 / Triton
HTTP: ``FP32``) and Triton's model configuration enum (``TYPE_FP32``).

Sources: the Open Inference Protocol's "Tensor Data Types" table (kserve/open-inference-protocol,
specification/protocol/inference_rest.md), Triton's model_config.proto ``DataType`` enum and its
docs/user_guide/model_configuration.md "Datatypes" table, and ONNX's ``TensorProto.DataType`` names as
ONNX Runtime prints them (``NodeArg.type``). Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ORT_TO_OIP_DATATYPE",
    "OIP_TO_TRITON_DATATYPE",
    "TensorSpecError",
    "oip_datatype",
    "oip_shape",
    "oip_tensor_metadata",
    "triton_datatype",
]

# ONNX Runtime's type string -> the Open Inference Protocol's datatype (same table as Triton's
# "Datatypes" mapping for the ONNX Runtime backend).
ORT_TO_OIP_DATATYPE: Mapping[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

# The protocol's datatype -> Triton's model configuration enum name.
OIP_TO_TRITON_DATATYPE: Mapping[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}


class TensorSpecError(ValueError):
    """A tensor description whose type or shape has no spelling in the protocol."""


def oip_datatype(dtype: str) -> str:
    """``tensor(float)`` (or an already protocol-spelled ``FP32``, or numpy's ``float32``) -> ``FP32``."""
    if not isinstance(dtype, str):
        raise TensorSpecError(f"a tensor type must be a string, got {dtype!r}")
    if dtype in OIP_TO_TRITON_DATATYPE:
        return dtype
    found = ORT_TO_OIP_DATATYPE.get(dtype) or ORT_TO_OIP_DATATYPE.get(f"tensor({_NUMPY_TO_ONNX.get(dtype, dtype)})")
    if found is None:
        raise TensorSpecError(f"tensor type {dtype!r} has no Open Inference Protocol datatype")
    return found


def triton_datatype(dtype: str) -> str:
    """Any spelling ``oip_datatype`` takes -> Triton's ``TYPE_*`` name."""
    return OIP_TO_TRITON_DATATYPE[oip_datatype(dtype)]


def oip_shape(shape: Sequence[Any]) -> list[int]:
    """A registry shape (``["batch", 8]``: ints, symbolic names or null) -> the protocol's (``[-1, 8]``:
    a dimension that varies is -1, as Triton's model metadata writes it)."""
    if not isinstance(shape, (list, tuple)):
        raise TensorSpecError(f"a shape must be a list, got {shape!r}")
    out: list[int] = []
    for d in shape:
        if isinstance(d, bool):
            raise TensorSpecError(f"shape {list(shape)!r}: {d!r} is not a dimension")
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif d is None or isinstance(d, str) or (isinstance(d, int) and d < 0):
            out.append(-1)
        else:
            raise TensorSpecError(f"shape {list(shape)!r}: {d!r} is not a dimension")
    return out


def oip_tensor_metadata(specs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Registry tensor specs ``[{name, dtype, shape}]`` -> the protocol's ``[{name, datatype, shape}]``."""
    return [{"name": s["name"], "datatype": oip_datatype(s.get("dtype", "")), "shape": oip_shape(s.get("shape") or [])}
            for s in specs]


_NUMPY_TO_ONNX = {"float32": "float", "float64": "double", "str": "string", "object": "string"}
