"""What travels on the data plane's wires (docs/dataplane.md).

1. The inference API's bodies: the KServe v2 / Triton inference protocol, JSON tensors and the binary
   tensor extension.

   - `request_decode(body, header_length) -> (request id, {input name: ndarray}, RequestedOutputs)`: the
     outputs asked for and which of them as binary data (truthy when any).
     `header_length` is the `Inference-Header-Content-Length` HTTP header (None: the whole body is JSON).
     An input with `"parameters": {"binary_data_size": N}` takes its N raw little-endian bytes from the
     bytes after the JSON header, inputs in order; the arrays alias the body (no copy) and are read-only.
   - `response_encode(request_id, outputs, model_name=..., model_version=..., parameters=..., binary=...)
     -> (body, header_length or None)`: JSON `data`, or the binary extension when `binary` is true (then
     `header_length` is the value of the response's `Inference-Header-Content-Length`).
   - `error_body(status, code, message) -> bytes`: the control plane's error shape
     `{"error": {"status", "code", "message"}}`.
   - Malformed input raises `WireError` (a `ValueError`) whose message says what is wrong and where.

   Datatypes: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64 and BYTES.
   BYTES tensors are numpy object arrays of `bytes`: in JSON each element is a string (UTF-8; Triton's
   clients send bytes that are not UTF-8 as binary data), as binary data each element is a 4-byte
   little-endian length and its bytes, one after another (the binary tensor data extension's BYTES layout).
   An output of `str` elements (onnxruntime's string tensors) is written as UTF-8.

2. The router <-> runtime frames: `u32 header length | u32 body length | header (UTF-8 JSON) | body`,
   lengths big-endian. `frame_pack(header, body) -> bytes` (`frame_head_pack(header, body length)`: all
   but the body, for a writer that gathers the body after it); asyncio streams: `await frame_read(reader)`
   (None at a clean end of stream) and `await frame_write(writer, header, body)`; protocols (the hot path):
   `FrameParser().feed(data) -> [(header, body), ...]`. Frames larger than the limits (`MAX_HEADER_BYTES`,
   `MAX_BODY_BYTES`, or the `max_body` given) raise `FrameError`; the connection should then be closed.
   An infer frame names the application and variant its route expects; a runtime that serves another model
   answers 409 `WRONG_MODEL` and runs nothing (workers/runtime/served.py).
"""
from __future__ import annotations

import asyncio
import json
import math
import struct
from typing import Any, Mapping

import numpy as np
import orjson

__all__ = [
    "BINARY_CONTENT_TYPE",
    "DATATYPES",
    "FRAME_PREFIX",
    "FrameError",
    "FrameParser",
    "HEADER_LENGTH_HEADER",
    "JSON_CONTENT_TYPE",
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "RequestedOutputs",
    "WRONG_MODEL",
    "WireError",
    "datatype_of",
    "error_body",
    "frame_head_pack",
    "frame_pack",
    "frame_read",
    "frame_write",
    "request_decode",
    "request_encode",
    "request_inputs_json",
    "response_decode",
    "response_encode",
    "response_raw_outputs",
    "tensor_raw",
    "values_raw",
]

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"

# KServe v2 datatype <-> numpy dtype (little-endian on the wire).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_KIND_SIZE_TO_DATATYPE = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()}
# BYTES: variable-length elements, numpy object arrays of bytes (not a fixed-size dtype like the others).
BYTES = "BYTES"
OBJECT = np.dtype(object)
DATATYPES[BYTES] = OBJECT
_LENGTH = struct.Struct("<I")

# Frames: a JSON header this large is a bug or an attack; bodies are tensors.
MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 256 << 20
FRAME_PREFIX = struct.Struct(">II")
# The error code of a runtime asked for a model it does not serve (a stale route): the router tries another instance.
WRONG_MODEL = "wrong_model"
UNKNOWN_INSTANCE = "unknown_instance"  # a partition runtime asked for a model (key or instance) it does not serve


class WireError(ValueError):
    """A malformed inference request or response (HTTP 400 `malformed`); the message says what and where."""

    status = 400
    code = "malformed"


class FrameError(WireError):
    """A malformed or oversized router <-> runtime frame; the connection cannot be trusted after it."""

    code = "bad_frame"


# --------------------------------------------------------------------------- tensors


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype name of a numpy array's dtype (WireError for dtypes the protocol lacks here)."""
    dt = array.dtype
    if dt.kind in "OSU":  # object arrays (bytes or str elements), and fixed-width byte or text strings
        return BYTES
    name = _KIND_SIZE_TO_DATATYPE.get((dt.kind, dt.itemsize))
    if name is None:
        raise WireError(f"dtype {dt} has no KServe v2 datatype supported here ({', '.join(DATATYPES)})")
    return name


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: 'shape' must be a list of non-negative integers, got {value!r}")
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise WireError(f"{where}: 'shape' must be a list of non-negative integers, got {value!r}")
    return tuple(value)


def _dtype(value: Any, where: str) -> np.dtype:
    dt = DATATYPES.get(value) if isinstance(value, str) else None
    if dt is None:
        raise WireError(f"{where}: unsupported datatype {value!r}; supported: {', '.join(DATATYPES)}")
    return dt


def _json_tensor(data: Any, dt: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
    if not isinstance(data, list):
        raise WireError(f"{where}: 'data' must be a list (flat or nested), got {type(data).__name__}")
    if dt is OBJECT:
        return _json_bytes_tensor(data, shape, where)
    try:
        if dt.kind == "b":
            array = np.asarray(data)
            if array.size and array.dtype.kind != "b":
                raise WireError(f"{where}: BOOL data must be true/false values")
            array = array.astype(np.bool_, copy=False)
        elif dt.kind in "iu":
            array = np.asarray(data)
            if array.size and array.dtype.kind not in "iu":
                # numpy reads integers above INT64's range beside smaller ones as float64: UINT64 data that
                # holds only integers is read as UINT64 (out-of-range values still fail, below).
                if not (dt.kind == "u" and array.dtype.kind in "fO" and _only_integers(data)):
                    raise WireError(f"{where}: {dt.name} data must be integers, got {array.dtype.kind!r}-kind values")
                array = np.asarray(data, dtype=dt)
            if array.size and array.dtype != dt:  # a cast would wrap what the datatype cannot hold (300 in UINT8 -> 44)
                info = np.iinfo(dt)
                low, high = array.min(), array.max()
                if low < info.min or high > info.max:
                    raise WireError(f"{where}: {dt.name} data must lie in [{info.min}, {info.max}], got {low if low < info.min else high}")
            array = array.astype(dt, copy=False)
        else:
            array = np.asarray(data, dtype=dt)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise WireError(f"{where}: 'data' does not hold numbers of its datatype: {exc}") from None
    expected = math.prod(shape)
    if array.size != expected:
        raise WireError(f"{where}: 'data' has {array.size} elements but shape {list(shape)} needs {expected}")
    return array.reshape(shape)


def _json_bytes_tensor(data: list, shape: tuple[int, ...], where: str) -> np.ndarray:
    """BYTES in JSON: (nested lists of) strings, each element's UTF-8 bytes."""
    flat: list[bytes] = []

    def walk(value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            flat.append(value.encode("utf-8", "surrogatepass"))
        else:
            raise WireError(f"{where}: BYTES data must be strings, got {type(value).__name__}")

    walk(data)
    expected = math.prod(shape)
    if len(flat) != expected:
        raise WireError(f"{where}: 'data' has {len(flat)} elements but shape {list(shape)} needs {expected}")
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(shape)


def _binary_bytes_tensor(raw: memoryview, shape: tuple[int, ...], where: str) -> np.ndarray:
    """BYTES as binary data: each element a 4-byte little-endian length and its bytes, exactly filling `raw`."""
    count = math.prod(shape)
    out = np.empty(count, dtype=object)
    offset, n = 0, len(raw)
    for i in range(count):
        if offset + 4 > n:
            raise WireError(f"{where}: binary BYTES data ends inside element {i} of {count} (its length prefix)")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > n:
            raise WireError(f"{where}: binary BYTES element {i} says {length} bytes, past the end of its data")
        out[i] = bytes(raw[offset:offset + length])
        offset += length
    if offset != n:
        raise WireError(f"{where}: binary BYTES data has {n - offset} bytes after its {count} elements")
    return out.reshape(shape)


def _bytes_elements(array: np.ndarray, where: str) -> list[bytes]:
    """A BYTES tensor's elements as bytes (str as UTF-8); WireError for anything else."""
    out = []
    for value in array.reshape(-1).tolist():
        if isinstance(value, bytes):
            out.append(value)
        elif isinstance(value, str):
            out.append(value.encode("utf-8", "surrogatepass"))
        else:
            raise WireError(f"{where}: a BYTES element must be bytes or text, got {type(value).__name__}")
    return out


def _bytes_raw(elements: list[bytes]) -> bytes:
    """BYTES elements as binary data: each a 4-byte little-endian length and its bytes (what
    `_binary_bytes_tensor` reads back)."""
    return b"".join(_LENGTH.pack(len(e)) + e for e in elements)


def _only_integers(data: list) -> bool:
    """Whether a (nested) list holds Python integers only (not booleans, not floats)."""
    return all(_only_integers(v) if isinstance(v, list) else type(v) is int for v in data)


def _parameters(entry: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = entry.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise WireError(f"{where}: 'parameters' must be an object")
    return params


def _json_header(body: bytes | bytearray | memoryview, header_length: int | None) -> tuple[dict, int]:
    n = len(body)
    if header_length is None:
        end = n
    else:
        if isinstance(header_length, bool) or not isinstance(header_length, int) or not 0 < header_length <= n:
            raise WireError(f"{HEADER_LENGTH_HEADER} {header_length!r} must be an integer in 1..{n} (the body's length)")
        end = header_length
    raw = body if end == n and isinstance(body, (bytes, memoryview)) else memoryview(body)[:end]
    try:
        doc = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"the JSON header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(f"the JSON header must be an object, got {type(doc).__name__}")
    return doc, end


def request_decode(body: bytes | bytearray | memoryview, header_length: int | None = None) -> tuple[str | None, dict[str, np.ndarray], bool]:
    """A KServe v2 inference request -> (request id or None, {input name: array}, wants binary outputs).
    See the module docstring. Raises WireError."""
    doc, offset = _json_header(body, header_length)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise WireError(f"'id' must be a string, got {request_id!r}")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise WireError("'inputs' must be a non-empty list of tensors")
    tensors: dict[str, np.ndarray] = {}
    end = len(body)
    view: memoryview | None = None
    for i, entry in enumerate(inputs):
        if not isinstance(entry, dict):
            raise WireError(f"inputs[{i}] must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise WireError(f"inputs[{i}]: 'name' must be a non-empty string")
        where = f"input {name!r}"
        if name in tensors:
            raise WireError(f"{where} is given twice")
        shape = _shape(entry.get("shape"), where)
        dt = _dtype(entry.get("datatype"), where)
        size = _parameters(entry, where).get("binary_data_size")
        if size is not None:
            if "data" in entry:
                raise WireError(f"{where}: give either 'data' or parameters.binary_data_size, not both")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise WireError(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
            expected = math.prod(shape) * dt.itemsize
            if dt is not OBJECT and size != expected:
                raise WireError(f"{where}: binary_data_size {size} does not match shape {list(shape)} of {entry['datatype']} ({expected} bytes)")
            if header_length is None:
                raise WireError(f"{where}: binary data needs the {HEADER_LENGTH_HEADER} header")
            if offset + size > end:
                raise WireError(f"{where}: binary data runs past the end of the body ({offset + size} > {end} bytes)")
            if view is None:
                view = memoryview(body)
            if dt is OBJECT:
                tensors[name] = _binary_bytes_tensor(view[offset:offset + size], shape, where)
            else:
                tensors[name] = np.frombuffer(view[offset:offset + size], dtype=dt).reshape(shape)
            offset += size
        else:
            if "data" not in entry:
                raise WireError(f"{where}: no 'data' and no parameters.binary_data_size")
            tensors[name] = _json_tensor(entry["data"], dt, shape, where)
    if header_length is not None and offset != end:
        raise WireError(f"the body has {end - offset} bytes after the binary inputs that no input claims")
    return request_id, tensors, _requested_outputs(doc)


class RequestedOutputs:
    """What a request's `outputs` and `parameters.binary_data_output` ask of the answer (the protocol's
    "Inference Request JSON Object" and the binary tensor data extension): which outputs, in the order asked
    (`names`; None: every output the model has), and which of them as binary data (an output's own
    `parameters.binary_data` wins over the request's `binary_data_output`). Truthy when any output is to be
    binary, so `if requested:` reads as before this class."""

    __slots__ = ("names", "binary_default", "binary")

    def __init__(self, names: tuple[str, ...] | None = None, binary_default: bool = False, binary: Mapping[str, bool] | None = None) -> None:
        self.names = names
        self.binary_default = binary_default
        self.binary = dict(binary or {})

    def __bool__(self) -> bool:
        return self.binary_default or any(self.binary.values())

    def __repr__(self) -> str:
        return f"RequestedOutputs(names={self.names!r}, binary_default={self.binary_default!r}, binary={self.binary!r})"

    def select(self, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs asked for, in the order asked; WireError names one the model does not have."""
        if self.names is None:
            return dict(outputs)
        unknown = [n for n in self.names if n not in outputs]
        if unknown:
            raise WireError(f"unexpected inference output {unknown[0]!r}: the model's outputs are {list(outputs)}")
        return {n: outputs[n] for n in self.names}

    def binary_for(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def _requested_outputs(doc: Mapping[str, Any]) -> RequestedOutputs:
    binary_default = _parameters(doc, "the request").get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise WireError(f"parameters.binary_data_output must be true or false, got {binary_default!r}")
    outputs = doc.get("outputs")
    if outputs is None:
        return RequestedOutputs(None, binary_default)
    if not isinstance(outputs, list):
        raise WireError("'outputs' must be a list of {name, parameters}")
    names: list[str] = []
    binary: dict[str, bool] = {}
    for i, entry in enumerate(outputs):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise WireError(f"outputs[{i}] must be an object with a non-empty 'name'")
        name = entry["name"]
        if name in names:
            raise WireError(f"output {name!r} is asked for twice")
        names.append(name)
        flag = _parameters(entry, f"output {name!r}").get("binary_data")
        if flag is not None:
            if not isinstance(flag, bool):
                raise WireError(f"output {name!r}: parameters.binary_data must be true or false, got {flag!r}")
            binary[name] = flag
    # An empty list asks for every output, as an absent one does (Triton reads it so).
    return RequestedOutputs(tuple(names) or None, binary_default, binary)


def _loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """JSON by orjson (7x the standard library's speed on a tensor's numbers); what only the standard
    library takes (NaN and Infinity, which JSON itself has not) is still taken, as before."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)


def _dumps(doc: Any, *, finite: bool = True) -> bytes:
    """Compact JSON by orjson (20x the standard library's speed on a tensor's numbers); a tensor's `data`
    may be its flat numpy array, which orjson writes itself, each number as the shortest text that reads
    back as the same value of the tensor's datatype (an FP32 0.1 is `0.1`, where a Python float of it would
    be `0.10000000149011612`: half the bytes, the same FP32 answer). `finite=False` (a tensor holds NaN or
    an infinity): the standard library's, which writes them as NaN and Infinity where orjson would write
    null, a different answer."""
    if finite:
        try:
            return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # something orjson does not write: the standard library decides, as before
            pass
    return json.dumps(doc, separators=(",", ":"), default=_json_default).encode()


def _json_default(value: Any) -> Any:
    """The standard library's fallback for what it cannot write: a numpy array or scalar as Python values."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _contiguous_le(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    dt = array.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian):
        array = array.astype(dt.newbyteorder("<"))
    return np.ascontiguousarray(array)


def _tensor_entries(tensors: Mapping[str, np.ndarray], binary: bool | RequestedOutputs) -> tuple[list[dict[str, Any]], list[Any], bool]:
    """KServe v2 tensor entries of a request or response, with the raw buffers of those sent as binary
    (`binary`: all or none, or per output as `RequestedOutputs` says) that follow the JSON header in the
    same order, and whether every number in JSON is finite (see `_dumps`)."""
    entries: list[dict[str, Any]] = []
    buffers: list[Any] = []
    finite = True
    per_output = isinstance(binary, RequestedOutputs)
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "OSU":  # BYTES: length-prefixed elements as binary, strings in JSON
            elements = _bytes_elements(array, f"tensor {name!r}")
            entry = {"name": name, "shape": list(array.shape), "datatype": BYTES}
            if binary.binary_for(name) if per_output else binary:  # type: ignore[union-attr]
                raw = _bytes_raw(elements)
                entry["parameters"] = {"binary_data_size": len(raw)}
                buffers.append(raw)
            else:
                try:
                    entry["data"] = [e.decode("utf-8") for e in elements]
                except UnicodeDecodeError:
                    raise WireError(f"tensor {name!r}: BYTES that are not UTF-8 cannot be sent as JSON; ask for binary data") from None
            entries.append(entry)
            continue
        array = _contiguous_le(value)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype_of(array)}
        if binary.binary_for(name) if per_output else binary:  # type: ignore[union-attr]
            entry["parameters"] = {"binary_data_size": array.nbytes}
            buffers.append(memoryview(array).cast("B") if array.size else b"")
        else:
            entry["data"] = array.reshape(-1)  # flat and contiguous: orjson writes it as it is (see `_dumps`)
            finite = finite and (array.dtype.kind != "f" or bool(np.isfinite(array).all()))
        entries.append(entry)
    return entries, buffers, finite


def response_encode(
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    *,
    model_name: str,
    model_version: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    binary: bool | RequestedOutputs = False,
) -> tuple[bytes, int | None]:
    """A KServe v2 inference response -> (body, header length for `Inference-Header-Content-Length` or
    None for a JSON-only body). `binary` as the request asked (`RequestedOutputs`: per output; the caller
    has already `select`ed the outputs)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    doc["model_name"] = model_name
    if model_version is not None:
        doc["model_version"] = model_version
    doc["outputs"], buffers, finite = _tensor_entries(outputs, binary)
    if parameters:
        doc["parameters"] = dict(parameters)
    header = _dumps(doc, finite=finite)
    if not buffers and not binary:
        return header, None
    return b"".join([header, *buffers]), len(header)


def request_encode(
    inputs: Mapping[str, np.ndarray],
    *,
    request_id: str | None = None,
    binary: bool = False,
    binary_outputs: bool = False,
) -> tuple[bytes, int | None]:
    """A KServe v2 inference request (clients, tests, benches) -> (body, header length or None)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    doc["inputs"], buffers, finite = _tensor_entries(inputs, binary)
    if binary_outputs:
        doc["parameters"] = {"binary_data_output": True}
    header = _dumps(doc, finite=finite)
    if not binary:
        return header, None
    return b"".join([header, *buffers]), len(header)


def request_inputs_json(body: bytes, header_length: int | None) -> bytes:
    """A request whose inputs are binary data -> the same request with every input as JSON `data` (what a
    pipeline's stages take); the rest of its header is kept. WireError for what JSON cannot hold (BYTES that
    are not UTF-8)."""
    if header_length is None:
        return body
    doc, _offset = _json_header(body, header_length)
    _request_id, tensors, _requested = request_decode(body, header_length)
    entries, _buffers, finite = _tensor_entries(tensors, False)
    doc["inputs"] = entries
    return _dumps(doc, finite=finite)


def _response_outputs(body: bytes, header_length: int | None) -> tuple[dict[str, Any], list[tuple[str, str, np.dtype, tuple[int, ...], Any]]]:
    """A KServe v2 response's JSON header and, per output in order: (name, where, dtype, shape, its binary
    bytes as a memoryview or its JSON `data`), checked."""
    doc, offset = _json_header(body, header_length)
    parts = []
    for i, entry in enumerate(doc.get("outputs") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise WireError(f"outputs[{i}] must be an object with a 'name'")
        where = f"output {entry['name']!r}"
        shape = _shape(entry.get("shape"), where)
        dt = _dtype(entry.get("datatype"), where)
        size = _parameters(entry, where).get("binary_data_size")
        if size is not None:
            if header_length is None or isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(body):
                raise WireError(f"{where}: binary data missing")
            parts.append((entry["name"], where, dt, shape, memoryview(body)[offset:offset + size]))
            offset += size
        else:
            parts.append((entry["name"], where, dt, shape, entry.get("data")))
    return doc, parts


def response_decode(body: bytes, header_length: int | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A KServe v2 inference response (clients, tests) -> (its JSON header, {output name: array})."""
    doc, parts = _response_outputs(body, header_length)
    outputs: dict[str, np.ndarray] = {}
    for name, where, dt, shape, value in parts:
        if not isinstance(value, memoryview):
            outputs[name] = _json_tensor(value, dt, shape, where)
        elif dt is OBJECT:
            outputs[name] = _binary_bytes_tensor(value, shape, where)
        elif len(value) != math.prod(shape) * dt.itemsize:
            raise WireError(f"{where}: binary_data_size {len(value)} does not match shape {list(shape)} ({math.prod(shape) * dt.itemsize} bytes)")
        else:
            outputs[name] = np.frombuffer(value, dtype=dt).reshape(shape)
    return doc, outputs


def tensor_raw(array: np.ndarray, where: str = "tensor") -> tuple[str, bytes]:
    """A tensor's datatype and its raw bytes as the binary tensor data extension (and the protocol's gRPC
    `raw_*_contents`) lay them out: little-endian, row-major; BYTES elements each a 4-byte length and its bytes."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        return BYTES, _bytes_raw(_bytes_elements(array, where))
    array = _contiguous_le(array)
    return datatype_of(array), array.tobytes()


def values_raw(datatype: str, shape: tuple[int, ...], values: list, where: str) -> bytes:
    """Typed element values (the gRPC protocol's `InferTensorContents`, one list per datatype: numbers, or
    bytes for BYTES) -> the raw bytes `tensor_raw` gives, checked against the datatype and the shape as JSON
    `data` is (WireError)."""
    dt = _dtype(datatype, where)
    if dt is OBJECT:
        expected = math.prod(shape)
        if len(values) != expected:
            raise WireError(f"{where}: the contents have {len(values)} elements but shape {list(shape)} needs {expected}")
        if not all(isinstance(v, bytes) for v in values):
            raise WireError(f"{where}: BYTES contents must be bytes")
        return _bytes_raw(values)
    return _contiguous_le(_json_tensor(list(values), dt, shape, where)).tobytes()


def response_raw_outputs(body: bytes, header_length: int | None = None) -> tuple[dict[str, Any], list[bytes]]:
    """A KServe v2 inference response -> (its JSON header, each output's raw bytes in order, as `tensor_raw`
    lays them out): binary outputs are sliced from the body as they are, JSON ones encoded (the gRPC
    protocol's `raw_output_contents`)."""
    doc, parts = _response_outputs(body, header_length)
    return doc, [bytes(value) if isinstance(value, memoryview) else tensor_raw(_json_tensor(value, dt, shape, where), where)[1]
                 for _name, where, dt, shape, value in parts]


def error_body(status: int, code: str, message: str) -> bytes:
    """The control plane's error shape, `{"error": {"status", "code", "message"}}`, as JSON bytes."""
    return _dumps({"error": {"status": status, "code": code, "message": message}})


# --------------------------------------------------------------------------- frames


def frame_pack(header: Mapping[str, Any], body: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame: `u32 header length | u32 body length | header JSON | body` (big-endian lengths)."""
    head = _dumps(header)
    return b"".join((FRAME_PREFIX.pack(len(head), len(body)), head, body))


def frame_head_pack(header: Mapping[str, Any], body_length: int) -> bytes:
    """A frame without its body (`u32 | u32 | header JSON`), for a writer that sends the body after it
    without copying it in (`transport.writelines([head, body])`)."""
    head = _dumps(header)
    return FRAME_PREFIX.pack(len(head), body_length) + head


def _frame_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        header = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"frame header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError(f"frame header must be a JSON object, got {type(header).__name__}")
    return header


def _frame_check(header_len: int, body_len: int, max_body: int) -> None:
    if header_len > MAX_HEADER_BYTES:
        raise FrameError(f"frame header of {header_len} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if body_len > max_body:
        raise FrameError(f"frame body of {body_len} bytes exceeds the limit of {max_body}")


async def frame_read(reader: asyncio.StreamReader, max_body: int = MAX_BODY_BYTES) -> tuple[dict[str, Any], bytes] | None:
    """The next frame from a stream as (header, body); None when the stream ends cleanly between frames.
    Raises FrameError on a truncated, malformed or oversized frame."""
    try:
        prefix = await reader.readexactly(8)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("the stream ended inside a frame's length prefix") from None
    header_len, body_len = FRAME_PREFIX.unpack(prefix)
    _frame_check(header_len, body_len, max_body)
    try:
        head = await reader.readexactly(header_len)
        body = await reader.readexactly(body_len) if body_len else b""
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None
    return _frame_header(head), body


async def frame_write(writer: asyncio.StreamWriter, header: Mapping[str, Any], body: bytes | bytearray | memoryview = b"") -> None:
    """Write one frame to a stream and wait until the transport's buffer has room again."""
    writer.write(frame_pack(header, body))
    await writer.drain()


class FrameParser:
    """Incremental frame parser for asyncio protocols: `feed(data)` returns the frames `data` completes, as
    (header dict, body). Raises FrameError (the connection should be closed).

    A body is bytes-like: bytes, or a memoryview of a buffer nothing writes again. A frame larger than
    `LARGE_FRAME_BYTES` that does not arrive in one read is gathered in a buffer of its own exact size, so
    each of its bytes is copied once on its way from the socket (growing a buffer and slicing the body out
    of it copied a 350 KB JSON tensor three times)."""

    LARGE_FRAME_BYTES = 1 << 16

    __slots__ = ("_buf", "_max_body", "_need", "_large", "_filled")

    def __init__(self, max_body: int = MAX_BODY_BYTES) -> None:
        self._buf = bytearray()
        self._max_body = max_body
        self._need = 8  # bytes needed before the next parse step can make progress
        self._large: bytearray | None = None  # a large frame being gathered, in a buffer of its exact size
        self._filled = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[dict[str, Any], bytes | memoryview]]:
        frames: list[tuple[dict[str, Any], bytes | memoryview]] = []
        large = self._large
        if large is not None:
            filled = self._filled
            take = min(len(large) - filled, len(data))
            large[filled:filled + take] = data if take == len(data) else memoryview(data)[:take]
            self._filled = filled + take
            if self._filled < len(large):
                return frames
            self._large = None
            header_len = FRAME_PREFIX.unpack_from(large)[0]
            view = memoryview(large).toreadonly()  # as a body in bytes is: arrays decoded from it stay read-only
            frames.append((_frame_header(view[8:8 + header_len]), view[8 + header_len:]))
            if take == len(data):
                return frames
            data = memoryview(data)[take:]
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return frames
            data = bytes(buf)
            buf.clear()
        elif len(data) < 8:
            buf += data
            return frames
        found, used = self._parse(data)
        frames += found
        rest = len(data) - used
        if rest:
            if self._need > self.LARGE_FRAME_BYTES:  # the start of a large frame: gather it in its own buffer
                self._large = large = bytearray(self._need)
                large[:rest] = memoryview(data)[used:]
                self._filled = rest
                self._need = 8
            else:
                buf += memoryview(data)[used:]
        return frames

    def _parse(self, data: bytes | bytearray | memoryview) -> tuple[list[tuple[dict[str, Any], bytes | memoryview]], int]:
        frames = []
        pos = 0
        n = len(data)
        unpack = FRAME_PREFIX.unpack_from
        view = None
        while n - pos >= 8:
            header_len, body_len = unpack(data, pos)
            _frame_check(header_len, body_len, self._max_body)
            end = pos + 8 + header_len + body_len
            if end > n:
                self._need = end - pos
                return frames, pos
            start = pos + 8
            if view is None:
                view = memoryview(data)
            header = _frame_header(view[start:start + header_len])
            if not body_len:
                body: bytes | memoryview = b""
            elif body_len > self.LARGE_FRAME_BYTES and isinstance(data, bytes):
                body = view[start + header_len:end]  # immutable bytes: a view, no copy
            else:
                body = bytes(view[start + header_len:end])
            frames.append((header, body))
            pos = end
        self._need = 8
        return frames, pos

