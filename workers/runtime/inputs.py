"""A served model's inputs: its signature, read from the ONNX session, and the check of a query's inputs
against it (names, datatypes, shapes with the batch axis optional, BYTES as UTF-8 text), done when the frame
arrives so that a malformed query is refused alone (400 `malformed`) and never fails its batch-mates."""
from __future__ import annotations

from typing import Any

import numpy as np

from workers.wire import WireError, datatype_of

__all__ = ["Signature", "input_signature", "inputs_check"]

Signature = dict[str, tuple[Any, tuple[Any, ...]]]  # input name: (numpy dtype or None: any, dims as the model declares them)


def input_signature(session: Any) -> Signature:
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


def inputs_check(signature: Signature, inputs: dict) -> bool:
    """WireError unless `inputs` are the model's, with its datatypes and shapes (batch axis optional);
    True when every input carries the batch axis (the model can take the arrays as they are)."""
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
            _text_check(name, array)
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


def _datatype_name(dt: np.dtype) -> str:
    """The protocol's name of a numpy dtype (BYTES for object arrays), or numpy's where it has none."""
    try:
        return datatype_of(np.empty(0, dtype=dt))
    except WireError:
        return str(dt)


def _text_check(name: str, array: np.ndarray) -> None:
    """WireError unless every element of a BYTES input is UTF-8 text (onnxruntime's string tensors are text)."""
    for i, value in enumerate(array.reshape(-1).tolist()):
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise WireError(f"input {name!r}: element {i} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                f"the model's string inputs are text") from None
