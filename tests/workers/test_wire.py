"""workers/wire.py: the KServe v2 codec (JSON and binary tensors, every datatype, clear errors) and the
router <-> runtime frames (incremental parser, asyncio helpers, size limits)."""
from __future__ import annotations

import asyncio
import re
import json

import numpy as np
import pytest

from workers.wire import (
    DATATYPES,
    error_body,
    frame_pack,
    FRAME_PREFIX,
    frame_read,
    frame_write,
    FrameError,
    FrameParser,
    request_decode,
    request_encode,
    request_inputs_json,
    RequestedOutputs,
    response_decode,
    response_encode,
    response_raw_outputs,
    tensor_raw,
    values_raw,
    WireError,
)


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    dt = DATATYPES[datatype]
    rng = np.random.default_rng(0)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dt)
    if dt.kind == "O":  # BYTES: words of varied lengths, the empty one among them
        words = np.empty(int(np.prod(shape)), dtype=object)
        words[:] = [("w" * int(n)).encode() for n in rng.integers(0, 9, size=words.size)]
        return words.reshape(shape)
    return rng.normal(size=shape).astype(dt)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips(datatype: str, binary: bool) -> None:
    x = sample(datatype)
    body, header_length = request_encode({"x": x, "y": x[:1]}, request_id="q1", binary=binary)
    assert (header_length is not None) == binary
    request_id, inputs, wants_binary = request_decode(body, header_length)
    assert request_id == "q1" and not wants_binary
    assert list(inputs) == ["x", "y"]
    assert inputs["x"].dtype == x.dtype and inputs["x"].shape == x.shape
    np.testing.assert_array_equal(inputs["x"], x)
    np.testing.assert_array_equal(inputs["y"], x[:1])


def test_a_json_request_as_the_doc_writes_it() -> None:
    body = json.dumps({"id": "q1", "inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]})
    request_id, inputs, wants_binary = request_decode(body.encode())
    assert request_id == "q1" and not wants_binary
    assert inputs["features"].dtype == np.float32 and inputs["features"].shape == (1, 4)
    # Nested data is accepted too, and the id is optional.
    body = json.dumps({"inputs": [{"name": "m", "shape": [2, 2], "datatype": "INT64", "data": [[1, 2], [3, 4]]}]})
    request_id, inputs, _ = request_decode(body.encode())
    assert request_id is None and inputs["m"].tolist() == [[1, 2], [3, 4]]


def test_binary_inputs_alias_the_body_and_mix_with_json() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = json.dumps({"inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
        {"name": "k", "shape": [1], "datatype": "INT32", "data": [7]},
    ], "parameters": {"binary_data_output": True}}).encode()
    body = header + x.tobytes()
    _, inputs, wants_binary = request_decode(body, len(header))
    assert wants_binary
    np.testing.assert_array_equal(inputs["x"], x)
    assert inputs["k"].tolist() == [7]
    assert not inputs["x"].flags.owndata  # a view on the body, no copy


def test_binary_outputs_asked_per_output_the_triton_way() -> None:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    requested = request_decode(body)[2]
    assert requested and requested.names == ("y",) and requested.binary_for("y") and not requested.binary_default


def test_outputs_selected_and_binary_per_output_as_triton_asks() -> None:
    from workers.wire import response_decode
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                       "outputs": [{"name": "b", "parameters": {"binary_data": True}}, {"name": "a"}]}).encode()
    _, _, requested = request_decode(body)
    outputs = requested.select({"a": np.array([1.5], np.float32), "b": np.array([2, 3], np.int64), "c": np.zeros(1, np.float32)})
    assert list(outputs) == ["b", "a"]  # in the order asked; "c" left out
    answer, header_length = response_encode("q", outputs, model_name="m", binary=requested)
    doc, decoded = response_decode(answer, header_length)
    assert [o["name"] for o in doc["outputs"]] == ["b", "a"]
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 16} and doc["outputs"][1]["data"] == [1.5]
    assert decoded["b"].tolist() == [2, 3]
    with pytest.raises(WireError, match="unexpected inference output 'z'"):
        request_decode(body.replace(b'"a"', b'"z"'))[2].select(outputs)
    for bad, message in (({"outputs": {"a": 1}}, "'outputs' must be a list"), ({"outputs": [{"name": "a"}, {"name": "a"}]}, "asked for twice"),
                         ({"outputs": [{"name": "a", "parameters": {"binary_data": "yes"}}]}, "binary_data must be true or false"),
                         ({"parameters": {"binary_data_output": 1}}, "binary_data_output must be true or false")):
        doc = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}], **bad}
        with pytest.raises(WireError, match=message):
            request_decode(json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("doc", "header_length", "message"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be an object"),
        (json.dumps({"inputs": []}).encode(), None, "non-empty list"),
        (json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP8", "data": [1, 2]}]}).encode(), None, "unsupported datatype 'FP8'"),
        (json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "BF16", "data": [1, 2]}]}).encode(), None, "unsupported datatype"),
        (json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]}).encode(), None, r"3 elements but shape \[2, 2\] needs 4"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["a"]}]}).encode(), None, "does not hold numbers"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]}).encode(), None, "must be integers"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [3]}]}).encode(), None, "true/false"),
        (json.dumps({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}).encode(), None, "non-negative integers"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}).encode(), None, "no 'data'"),
        (json.dumps({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}).encode(), None, "'name'"),
        (json.dumps({"id": 5, "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode(), None, "'id' must be a string"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
                                {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode(), None, "given twice"),
    ],
)
def test_malformed_requests_say_what_is_wrong(doc: bytes, header_length, message: str) -> None:
    with pytest.raises(WireError, match=message):
        request_decode(doc, header_length)


def test_malformed_binary_requests() -> None:
    header = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}).encode()
    with pytest.raises(WireError, match="needs the Inference-Header-Content-Length"):
        request_decode(header, None)
    with pytest.raises(WireError, match="runs past the end"):
        request_decode(header + b"\0" * 4, len(header))
    with pytest.raises(WireError, match="4 bytes after the binary inputs"):
        request_decode(header + b"\0" * 12, len(header))
    with pytest.raises(WireError, match="must be an integer in 1.."):
        request_decode(header, len(header) + 1)
    wrong = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 7}}]}).encode()
    with pytest.raises(WireError, match="binary_data_size 7 does not match shape"):
        request_decode(wrong + b"\0" * 7, len(wrong))
    both = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"binary_data_size": 4}}]}).encode()
    with pytest.raises(WireError, match="not both"):
        request_decode(both + b"\0" * 4, len(both))


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize("binary", [False, True])
def test_responses_round_trip(binary: bool) -> None:
    outputs = {"probabilities": np.array([[0.2, 0.7, 0.1]], dtype=np.float32), "label": np.array([1], dtype=np.int64),
               "ok": np.array([True, False])}
    params = {"variant": "mlp-wide", "instance": "h/cpu0/0", "routing_version": 2, "simulated": False}
    body, header_length = response_encode("q1", outputs, model_name="tabular-cpu", model_version="mlp-wide", parameters=params, binary=binary)
    assert (header_length is not None) == binary
    doc, decoded = response_decode(body, header_length)
    assert doc["id"] == "q1" and doc["model_name"] == "tabular-cpu" and doc["model_version"] == "mlp-wide"
    assert doc["parameters"] == params
    for name, array in outputs.items():
        assert decoded[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded[name], array)
    if binary:
        assert doc["outputs"][0]["parameters"] == {"binary_data_size": 12}
    else:
        assert doc["outputs"][0]["data"] == pytest.approx([0.2, 0.7, 0.1])


def test_empty_outputs_and_unsupported_dtypes() -> None:
    body, header_length = response_encode(None, {}, model_name="m", parameters={"simulated": True})
    assert header_length is None and json.loads(body) == {"model_name": "m", "outputs": [], "parameters": {"simulated": True}}
    with pytest.raises(WireError, match="no KServe v2 datatype"):
        response_encode(None, {"c": np.array([1 + 2j])}, model_name="m")  # complex numbers: the protocol has none
    # numpy text arrays are BYTES (UTF-8), as object arrays of str are.
    assert json.loads(response_encode(None, {"s": np.array(["a"])}, model_name="m")[0])["outputs"][0]["datatype"] == "BYTES"


def test_error_body_has_the_control_plane_shape() -> None:
    assert json.loads(error_body(504, "deadline_exceeded", "late")) == {"error": {"status": 504, "code": "deadline_exceeded", "message": "late"}}


# --------------------------------------------------------------------------- frames


def test_frame_layout_is_big_endian_lengths_then_json_then_body() -> None:
    frame = frame_pack({"op": "infer", "id": 7}, b"abc")
    header_len, body_len = FRAME_PREFIX.unpack(frame[:8])
    assert frame[:4] == header_len.to_bytes(4, "big") and body_len == 3
    assert json.loads(frame[8:8 + header_len]) == {"op": "infer", "id": 7}
    assert frame[8 + header_len:] == b"abc"


def test_frame_parser_handles_any_split() -> None:
    frames = [({"id": i, "op": "infer"}, bytes([i]) * (i * 37)) for i in range(6)]
    stream = b"".join(frame_pack(h, b) for h, b in frames)
    for chunk in (1, 3, 8, 50, 1000, len(stream)):
        parser = FrameParser()
        got = []
        for start in range(0, len(stream), chunk):
            got.extend(parser.feed(stream[start:start + chunk]))
        assert [(h, bytes(b)) for h, b in got] == frames


def test_frame_limits_and_bad_headers() -> None:
    parser = FrameParser(max_body=100)
    with pytest.raises(FrameError, match="exceeds the limit of 100"):
        parser.feed(FRAME_PREFIX.pack(2, 101) + b"{}")
    with pytest.raises(FrameError, match="header of"):
        FrameParser().feed(FRAME_PREFIX.pack(1 << 30, 0))
    with pytest.raises(FrameError, match="not valid JSON"):
        FrameParser().feed(FRAME_PREFIX.pack(3, 0) + b"{x}")
    with pytest.raises(FrameError, match="JSON object"):
        FrameParser().feed(FRAME_PREFIX.pack(2, 0) + b"[]")


def test_asyncio_frame_helpers() -> None:
    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (frame := await frame_read(reader)) is not None:
                header, body = frame
                await frame_write(writer, {"id": header["id"], "status": 200}, body[::-1])
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(3):
            await frame_write(writer, {"op": "echo", "id": i}, b"hello" * i)
        for i in range(3):
            header, body = await frame_read(reader)
            assert header == {"id": i, "status": 200} and body == (b"hello" * i)[::-1]
        writer.close()
        await writer.wait_closed()
        # A stream cut inside a frame is an error; a clean end between frames is None.
        truncated = asyncio.StreamReader()
        truncated.feed_data(frame_pack({"id": 1}, b"xyz")[:-1])
        truncated.feed_eof()
        with pytest.raises(FrameError, match="ended inside a frame"):
            await frame_read(truncated)
        empty = asyncio.StreamReader()
        empty.feed_eof()
        assert await frame_read(empty) is None
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())


def test_json_bodies_keep_non_finite_numbers_as_the_standard_library_did() -> None:
    """orjson writes the JSON (fast), but a NaN or an infinity would come out as null there: a different
    answer. Such tensors are written by the standard library (NaN, Infinity), and read back, as before."""
    from workers.wire import request_decode, request_encode, response_decode, response_encode

    odd = np.array([[1.5, np.nan, np.inf, -np.inf]], dtype=np.float32)
    body, _ = response_encode("r1", {"y": odd}, model_name="m")
    assert b"NaN" in body and b"Infinity" in body and b"null" not in body
    _, outputs = response_decode(body)
    np.testing.assert_array_equal(outputs["y"], odd)
    body, _ = request_encode({"x": odd})
    _, inputs, _ = request_decode(body)
    np.testing.assert_array_equal(inputs["x"], odd)
    plain, _ = response_encode("r2", {"y": np.array([[0.25, -2.0]], dtype=np.float32)}, model_name="m")
    assert plain == b'{"id":"r2","model_name":"m","outputs":[{"name":"y","shape":[1,2],"datatype":"FP32","data":[0.25,-2.0]}]}'


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint16", "int32", "uint64", "int64", "bool"])
def test_json_tensors_are_written_as_their_own_datatype_and_read_back_equal(dtype: str) -> None:
    """A JSON tensor's numbers are the shortest text that reads back as the same value of its datatype (an
    FP32 0.1 is written `0.1`, not the Python float `0.10000000149011612`): every value, including the
    extremes of the type, comes back bit for bit, big-endian and strided arrays too."""
    from workers.wire import request_decode, request_encode, response_decode, response_encode

    rng = np.random.default_rng(7)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        info = np.finfo(dt)
        values = np.concatenate([rng.standard_normal(200).astype(dt), np.array([0.1, -0.0, info.max, info.min, info.tiny, info.eps], dtype=dt)])
    elif dt.kind == "b":
        values = rng.integers(0, 2, 200).astype(bool)
    else:
        info = np.iinfo(dt)
        values = np.concatenate([rng.integers(info.min, info.max, 200, dtype=dt, endpoint=True), np.array([info.min, info.max], dtype=dt)])
    array = values.reshape(-1, 2)
    body, _ = response_encode(None, {"y": array}, model_name="m")
    _, outputs = response_decode(body)
    assert outputs["y"].dtype == dt and outputs["y"].tobytes() == array.tobytes()
    for odd in (array.astype(dt.newbyteorder(">")), array[::2]):
        body, _ = request_encode({"x": odd})
        _, inputs, _ = request_decode(body)
        assert inputs["x"].tobytes() == np.ascontiguousarray(odd, dtype=dt).tobytes()
    if dtype == "float32":
        assert b"0.1," in body or b"0.1]" in body or b"[0.1" in request_encode({"x": np.array([0.1], dtype=dt)})[0]
        assert request_encode({"x": np.array([0.1], dtype=dt)})[0].count(b"0.1") == 1
        assert b"0.10000000149011612" not in request_encode({"x": np.array([0.1], dtype=dt)})[0]


@pytest.mark.parametrize(("datatype", "data", "accepted"), [
    ("UINT8", [0, 255], True), ("UINT8", [0, 256], False), ("UINT8", [-1, 3], False), ("INT8", [-128, 127], True),
    ("INT8", [[1], [128]], False), ("UINT64", [18446744073709551615, 1], True), ("UINT64", [-1, 1], False),
    ("UINT64", [18446744073709551615, 1.5], False), ("INT32", [2147483648, 0], False), ("INT64", [9223372036854775807, -1], True),
])
def test_json_integers_outside_their_datatype_are_refused_not_wrapped(datatype: str, data: list, accepted: bool) -> None:
    """300 given as UINT8 would be 44 after a cast: a different input. It is a 400 instead."""
    import json as stdjson

    from workers.wire import WireError, request_decode

    flat = np.array(data, dtype=object).reshape(-1) if accepted else None
    body = stdjson.dumps({"inputs": [{"name": "x", "shape": [2] if not isinstance(data[0], list) else [2, 1], "datatype": datatype,
                                      "data": data}]}).encode()
    if accepted:
        _, inputs, _ = request_decode(body)
        assert [int(v) for v in inputs["x"].reshape(-1)] == [int(v) for v in flat]
    else:
        with pytest.raises(WireError, match="must lie in|must be integers|does not hold"):
            request_decode(body)


def test_frame_parser_returns_every_frame_whole_however_the_stream_is_cut() -> None:
    """Frames of every size (empty, small, just around LARGE_FRAME_BYTES, several hundred KB) cut into
    reads of 1 byte to 1 MB, as bytes or bytearrays: the same headers and bodies come out, in order. A large
    body gathered over several reads is a view of its own buffer, which later reads never touch."""
    import random

    rng = random.Random(1)
    limit = FrameParser.LARGE_FRAME_BYTES
    frames = []
    for i in range(200):
        size = rng.choice([0, 3, 100, limit - 40, limit, limit + 1, 70_000, 300_000])
        frames.append(({"id": i, "pad": "y" * rng.randint(0, 50)}, rng.randbytes(size)))
    stream = b"".join(frame_pack(h, b) for h, b in frames)
    for trial in range(20):
        parser = FrameParser()
        got = []
        pos = 0
        while pos < len(stream):
            n = rng.choice([1, 7, 8, 9, 100, 4096, 65_536, 262_144, 1_000_000])
            chunk = stream[pos:pos + n]
            got += parser.feed(chunk if trial % 2 else bytearray(chunk))
            pos += n
        assert [h for h, _ in got] == [h for h, _ in frames]
        assert all(bytes(b) == want for (_, b), (_, want) in zip(got, frames))


def test_a_large_binary_frame_gathered_over_reads_decodes_to_read_only_arrays() -> None:
    """The arrays of a binary request alias the frame's body, read-only, whether the frame came in one
    read or was gathered over many."""
    from workers.wire import request_decode, request_encode

    x = np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)
    body, header_length = request_encode({"x": x}, binary=True)
    stream = frame_pack({"op": "infer"}, body)
    for step in (len(stream), 4096):
        parser = FrameParser()
        frames = []
        for k in range(0, len(stream), step):
            frames += parser.feed(stream[k:k + step])
        _, inputs, _ = request_decode(frames[0][1], header_length)
        assert np.array_equal(inputs["x"], x) and not inputs["x"].flags.writeable


# --------------------------------------------------------------------------- BYTES

def test_bytes_tensors_in_json_and_binary_round_trip() -> None:
    """The protocol's BYTES (issue 38): strings in JSON, 4-byte little-endian length-prefixed elements as
    binary data; numpy object arrays of bytes either way; str elements (onnxruntime's string outputs) as UTF-8."""
    import struct

    text = np.array([[b"cat"], ["d\u00f6g".encode()], [b""]], dtype=object)
    for binary in (False, True):
        body, header_length = request_encode({"text": text}, request_id="b", binary=binary)
        _, inputs, _ = request_decode(body, header_length)
        assert inputs["text"].dtype == object and inputs["text"].tolist() == text.tolist()
    body, header_length = request_encode({"text": text}, binary=True)
    assert body[header_length:] == b"".join(struct.pack("<I", len(v[0])) + v[0] for v in text.tolist())
    doc = json.loads(request_encode({"text": text})[0])
    assert doc["inputs"][0] == {"name": "text", "shape": [3, 1], "datatype": "BYTES", "data": ["cat", "d\u00f6g", ""]}
    kinds = np.array([["feline"], ["unknown"]], dtype=object)  # str elements, as onnxruntime answers
    for binary in (False, True):
        body, header_length = response_encode("r", {"kind": kinds, "n": np.array([1, 2])}, model_name="m", binary=binary)
        head, outputs = response_decode(body, header_length)
        assert outputs["kind"].tolist() == [[b"feline"], [b"unknown"]] and outputs["n"].tolist() == [1, 2]
        assert head["outputs"][0]["datatype"] == "BYTES"


@pytest.mark.parametrize("doc, header_tail, text", [
    ({"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a", 3]}, None, "BYTES data must be strings"),
    ({"name": "t", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}, None, "has 2 elements but shape [3] needs 3"),
    ({"name": "t", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}, b"\x05\x00\x00\x00ab", "past the end of its data"),
    ({"name": "t", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 2}}, b"\x01\x00", "ends inside element 0"),
    ({"name": "t", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}, b"\x01\x00\x00\x00abc", "2 bytes after its 1 elements"),
])
def test_malformed_bytes_are_refused_naming_the_input(doc, header_tail, text) -> None:
    header = json.dumps({"inputs": [doc]}).encode()
    body = header + (header_tail or b"")
    with pytest.raises(WireError, match=re.escape(text)):
        request_decode(body, len(header) if header_tail is not None else None)


def test_bytes_that_are_not_utf8_go_binary_not_json() -> None:
    raw = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(WireError, match="not UTF-8 cannot be sent as JSON"):
        response_encode(None, {"blob": raw}, model_name="m")
    body, header_length = response_encode(None, {"blob": raw}, model_name="m", binary=True)
    assert response_decode(body, header_length)[1]["blob"].tolist() == [b"\xff\xfe"]


def test_raw_contents_are_the_binary_extensions_layout() -> None:
    """The gRPC protocol's raw contents (workers/router/oip_grpc.py): the binary extension's bytes, from typed
    values checked as JSON data is, and back out of an answer whatever form its outputs took."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert tensor_raw(x) == ("FP32", x.tobytes())
    assert tensor_raw(np.array([b"ab", "\u00e9"], dtype=object)) == ("BYTES", b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9")
    assert values_raw("FP32", (2, 3), x.reshape(-1).tolist(), "input 'x'") == x.tobytes()
    assert values_raw("BYTES", (1,), [b"\xff"], "input 't'") == b"\x01\x00\x00\x00\xff"
    with pytest.raises(WireError, match=re.escape("has 5 elements but shape [2, 3] needs 6")):
        values_raw("FP32", (2, 3), [0.0] * 5, "input 'x'")
    with pytest.raises(WireError, match=re.escape("uint8 data must lie in [0, 255], got 300")):
        values_raw("UINT8", (1,), [300], "input 'x'")
    with pytest.raises(WireError, match="BYTES contents must be bytes"):
        values_raw("BYTES", (1,), ["text"], "input 't'")
    mixed = RequestedOutputs(None, False, {"b": True})
    body, header_length = response_encode("q", {"a": x, "b": x + 1}, model_name="m", binary=mixed)
    doc, raws = response_raw_outputs(body, header_length)
    assert [o["name"] for o in doc["outputs"]] == ["a", "b"] and raws == [x.tobytes(), (x + 1).tobytes()]


def test_binary_inputs_rewritten_as_json_keep_the_rest_of_the_request() -> None:
    x = np.ones((1, 2), np.float32)
    body, header_length = request_encode({"x": x, "t": np.array([b"hi"], dtype=object)}, request_id="r", binary=True)
    rewritten = json.loads(request_inputs_json(body, header_length))
    assert rewritten["id"] == "r" and [i["data"] for i in rewritten["inputs"]] == [[1.0, 1.0], ["hi"]]
    assert request_inputs_json(b'{"inputs": []}', None) == b'{"inputs": []}'
    not_text, length = request_encode({"t": np.array([b"\xff"], dtype=object)}, binary=True)
    with pytest.raises(WireError, match="not UTF-8 cannot be sent as JSON"):
        request_inputs_json(not_text, length)
