"""The runtime process (workers/runtime/server.py) as the agent starts it: a real subprocess on a small
ONNX model (JSON and binary inference, errors, deadline drops, health, stats, metrics, drain, SIGTERM), a
simulated runtime, and start-up failures."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import FrameClient, RuntimeProcess, frame_call, runtime_spec, runtime_start
from workers.runtime.server import RuntimeSpec, RuntimeSpecError
from workers.runtime.session import OnnxSession
from workers.runtime.simulated import SimulatedSession
from workers.wire import request_encode, response_decode

pytestmark = pytest.mark.timeout(240)

STATS_FIELDS = {"key", "application", "variant", "arrivals", "served", "late", "dropped", "queue_length", "batches",
                "batch_size_mean", "latency_p50_ms", "latency_p99_ms"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, bytes]:
    data = onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=1)
    path = tmp_path_factory.mktemp("model") / "mlp.onnx"
    path.write_bytes(data)
    return path, data


@pytest.fixture(scope="module")
def runtime(model, tmp_path_factory):
    path, data = model
    spec = runtime_spec(artifact_path=str(path), sha256=hashlib.sha256(data).hexdigest())
    rt = runtime_start(spec, tmp_path_factory.mktemp("rt"))
    yield rt
    assert rt.stop() == 0, rt.log()


def infer_header(i: int, body_header_length, **extra) -> dict:
    header = {"op": "infer", "id": i, "deadline_ms": 30_000.0, "content_type": "application/json", "header_length": body_header_length,
              "instance": "test-host/cpu0/0", "routing_version": 3}
    header.update(extra)
    return header


def reference(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    return OnnxSession(model_bytes).run({"x": x})["logits"]


def test_ready_file_holds_the_endpoint(runtime) -> None:
    assert runtime.endpoint.startswith("tcp://127.0.0.1:")
    assert int(runtime.endpoint.rsplit(":", 1)[1]) > 0
    # Written atomically: no temp file is left beside it.
    assert [p.name for p in runtime.ready_file.parent.iterdir() if p.name.startswith(".")] == []


def test_json_inference(runtime, model) -> None:
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    body, header_length = request_encode({"x": x}, request_id="q1")
    reply, reply_body = frame_call(runtime.endpoint, infer_header(1, header_length), body)
    assert reply["status"] == 200 and reply["id"] == 1, reply_body
    assert reply["variant"] == "mlp-wide" and reply["simulated"] is False
    assert reply["content_type"] == "application/json" and reply["header_length"] is None
    doc, outputs = response_decode(reply_body)
    assert doc["id"] == "q1" and doc["model_name"] == "tabular-cpu" and doc["model_version"] == "mlp-wide"
    assert doc["parameters"] == {"variant": "mlp-wide", "instance": "test-host/cpu0/0", "routing_version": 3, "simulated": False}
    np.testing.assert_allclose(outputs["logits"], reference(model[1], x), atol=1e-5)


def test_binary_inference_many_in_flight(runtime, model) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(12)]
    client = FrameClient(runtime.endpoint)
    try:
        for i, x in enumerate(xs):  # all sent before any answer is read: the batcher may batch them
            body, header_length = request_encode({"x": x}, request_id=f"b{i}", binary=True, binary_outputs=True)
            client.send(infer_header(100 + i, header_length, content_type="application/octet-stream"), body)
        for i, x in enumerate(xs):
            reply, reply_body = client.answer(100 + i)
            assert reply["status"] == 200, reply_body
            assert reply["content_type"] == "application/octet-stream" and reply["header_length"] > 0
            doc, outputs = response_decode(reply_body, reply["header_length"])
            assert doc["id"] == f"b{i}" and doc["outputs"][0]["parameters"]["binary_data_size"] == x.shape[0] * 3 * 4
            np.testing.assert_allclose(outputs["logits"], reference(model[1], x), atol=1e-5)
    finally:
        client.close()


def test_an_unbatched_query_comes_back_unbatched(runtime, model) -> None:
    x = np.arange(4, dtype=np.float32)
    body, header_length = request_encode({"x": x})
    reply, reply_body = frame_call(runtime.endpoint, infer_header(2, header_length), body)
    assert reply["status"] == 200, reply_body
    _, outputs = response_decode(reply_body)
    assert outputs["logits"].shape == (3,)
    np.testing.assert_allclose(outputs["logits"], reference(model[1], x[None])[0], atol=1e-5)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{oops", "not valid JSON"),
        (request_encode({"features": np.zeros((1, 4), np.float32)})[0], "missing inputs ['x']"),
        (request_encode({"x": np.zeros((1, 5), np.float32)})[0], "shape [1, 5] but the model takes"),
        (request_encode({"x": np.zeros((1, 4), np.float64)})[0], "datatype FP64 but the model takes FP32"),
    ],
)
def test_malformed_requests_get_400(runtime, body: bytes, message: str) -> None:
    reply, reply_body = frame_call(runtime.endpoint, infer_header(3, None), body)
    assert reply["status"] == 400 and reply["code"] == "malformed"
    assert message in reply["message"]
    assert json.loads(reply_body)["error"] == {"status": 400, "code": "malformed", "message": reply["message"]}


def test_a_query_that_cannot_meet_its_deadline_gets_504(runtime) -> None:
    # latency(1) is 1 ms in the profile: with 0.01 ms left the "deadline" drop rule gives up on it.
    body, _ = request_encode({"x": np.zeros((1, 4), np.float32)})
    reply, reply_body = frame_call(runtime.endpoint, infer_header(4, None, deadline_ms=0.01), body)
    assert reply["status"] == 504 and reply["code"] == "deadline_exceeded"
    assert json.loads(reply_body)["error"]["code"] == "deadline_exceeded"


def test_health_stats_and_metrics(runtime) -> None:
    body, _ = request_encode({"x": np.zeros((1, 4), np.float32)})
    frame_call(runtime.endpoint, {"op": "stats"})  # start a fresh interval
    for i in range(3):
        assert frame_call(runtime.endpoint, infer_header(10 + i, None), body)[0]["status"] == 200
    assert frame_call(runtime.endpoint, infer_header(13, None, deadline_ms=0.01), body)[0]["status"] == 504

    health, _ = frame_call(runtime.endpoint, {"op": "health", "id": "h"})
    assert health["status"] == 200 and health["id"] == "h" and health["state"] == "ready"
    assert health["key"] == "cpu0/0" and health["simulated"] is False and "CPUExecutionProvider" in health["providers"]
    assert health["counters"]["served"] >= 3 and health["counters"]["dropped"] >= 1

    stats, _ = frame_call(runtime.endpoint, {"op": "stats"})
    item = stats["stats"]
    assert STATS_FIELDS <= set(item)
    assert item["key"] == "cpu0/0" and item["application"] == "tabular-cpu" and item["variant"] == "mlp-wide"
    assert item["arrivals"] == 4 and item["served"] == 3 and item["dropped"] == 1 and item["batches"] >= 1
    assert item["latency_p50_ms"] > 0 and item["latency_p99_ms"] >= item["latency_p50_ms"]
    again, _ = frame_call(runtime.endpoint, {"op": "stats"})
    assert again["stats"]["arrivals"] == 0 and again["stats"]["latency_p50_ms"] is None  # reset per interval

    metrics, text = frame_call(runtime.endpoint, {"op": "metrics"})
    assert metrics["status"] == 200 and metrics["content_type"].startswith("text/plain")
    text = text.decode()
    labels = 'instance="test-host/cpu0/0",model="tabular-cpu",simulated="false",version="mlp-wide"'
    assert f"nv_inference_request_success{{{labels}}}" in text
    assert "# TYPE nv_inference_request_success counter" in text
    for name in ("nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count", "nv_inference_request_duration_us",
                 "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us", "tessera_queries_total",
                 "tessera_queue_length", "tessera_batch_size_bucket", "tessera_query_latency_seconds_bucket"):
        assert name in text, name
    assert 'outcome="dropped"' in text

    unknown, _ = frame_call(runtime.endpoint, {"op": "reboot", "id": 9})
    assert unknown["status"] == 400 and unknown["code"] == "unknown_op"


def test_drain_waits_for_queued_queries_then_refuses_new_ones(tmp_path) -> None:
    # A simulated instance, 300 ms per batch of one: three queries keep it busy for about a second.
    spec = runtime_spec(simulated=True, max_batch=1, batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never",
                                                                 "queue_order": "fifo", "slo_ms": 60_000.0},
                        profile=[{"batch": 1, "latency_ms": 300.0}])
    rt = runtime_start(spec, tmp_path)
    try:
        client = FrameClient(rt.endpoint)
        body, _ = request_encode({"anything": np.zeros(2, np.float32)})
        for i in range(3):
            client.send(infer_header(i, None), body)
        time.sleep(0.1)
        drained: dict = {}

        def drain() -> None:
            drained["reply"], _ = frame_call(rt.endpoint, {"op": "drain", "id": "d", "timeout_ms": 60_000})
            drained["health"], _ = frame_call(rt.endpoint, {"op": "health"})  # right after the drain answer

        thread = threading.Thread(target=drain)
        thread.start()
        time.sleep(0.2)
        health, _ = frame_call(rt.endpoint, {"op": "health"})
        assert health["state"] == "draining"
        refused, refused_body = frame_call(rt.endpoint, infer_header(99, None), body)
        assert refused["status"] == 503 and refused["code"] == "draining"
        for i in range(3):
            reply, reply_body = client.answer(i)
            assert reply["status"] == 200 and reply["simulated"] is True
            doc, outputs = response_decode(reply_body)
            assert outputs == {} and doc["parameters"]["simulated"] is True
        thread.join(60)
        assert drained["reply"] == {"id": "d", "status": 200, "state": "drained"}
        # Not before the last query was answered (each takes 300 ms: an early answer would see some in flight).
        assert drained["health"]["in_flight"] == 0 and drained["health"]["counters"]["served"] == 3
        # Draining an idle runtime answers at once.
        assert frame_call(rt.endpoint, {"op": "drain"})[0]["state"] == "drained"
        client.close()
    finally:
        assert rt.stop() == 0, rt.log()


def test_drain_timeout(tmp_path) -> None:
    spec = runtime_spec(simulated=True, max_batch=1, batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never",
                                                                 "queue_order": "fifo", "slo_ms": 60_000.0},
                        profile=[{"batch": 1, "latency_ms": 2000.0}])
    rt = runtime_start(spec, tmp_path)
    try:
        client = FrameClient(rt.endpoint)
        client.send(infer_header(1, None), request_encode({"x": np.zeros(1, np.float32)})[0])
        time.sleep(0.1)
        reply, _ = frame_call(rt.endpoint, {"op": "drain", "timeout_ms": 50})
        assert reply["status"] == 504 and reply["code"] == "drain_timeout" and reply["in_flight"] == 1
        assert client.answer(1)[0]["status"] == 200
        client.close()
    finally:
        rt.stop()


def test_sigterm_drains_then_exits(tmp_path) -> None:
    spec = runtime_spec(simulated=True, max_batch=1, batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never",
                                                                 "queue_order": "fifo", "slo_ms": 60_000.0},
                        profile=[{"batch": 1, "latency_ms": 400.0}])
    rt = runtime_start(spec, tmp_path)
    client = FrameClient(rt.endpoint)
    client.send(infer_header(1, None), request_encode({"x": np.zeros(1, np.float32)})[0])
    time.sleep(0.1)
    rt.proc.terminate()
    reply, _ = client.answer(1)  # the query in flight is still answered
    assert reply["status"] == 200
    assert rt.proc.wait(60) == 0, rt.log()
    client.close()
    rt.stop()


def test_simulated_runtime_labels_everything_simulated(tmp_path) -> None:
    spec = runtime_spec(simulated=True, key="gpu0/3g.20gb@4", instance="sim-a100-01/gpu0/3g.20gb@4",
                        profile=[{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 4.0}])
    rt = runtime_start(spec, tmp_path)
    try:
        body, header_length = request_encode({"x": np.zeros((1, 4), np.float32)}, binary=True, binary_outputs=True)
        reply, reply_body = frame_call(rt.endpoint, infer_header(1, header_length), body)
        assert reply["status"] == 200 and reply["simulated"] is True
        doc, outputs = response_decode(reply_body, reply["header_length"])
        assert outputs == {} and doc["parameters"]["simulated"] is True
        health, _ = frame_call(rt.endpoint, {"op": "health"})
        assert health["simulated"] is True and health["providers"] == ["simulated"]
        _, text = frame_call(rt.endpoint, {"op": "metrics"})
        samples = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
        assert samples and all('simulated="true"' in line for line in samples)
    finally:
        assert rt.stop() == 0, rt.log()


def test_simulated_session_sleeps_the_profiled_latency() -> None:
    slept: list[float] = []
    session = SimulatedSession([{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 5.0}], max_batch=8, sleep=slept.append)
    assert session.run_batch([{"x": 1}] * 3) == [{}, {}, {}]
    assert session.run_batch([]) == []
    assert slept == [pytest.approx(0.004)]
    with pytest.raises(ValueError, match="needs a latency profile"):
        SimulatedSession([], max_batch=1)


def test_start_up_failures_exit_2_without_a_ready_file(model, tmp_path) -> None:
    path, _ = model
    cases = {
        "checksum": runtime_spec(artifact_path=str(path), sha256="0" * 64),
        "no-artifact": runtime_spec(),
        "policy": runtime_spec(artifact_path=str(path), batching={"policy": "magic", "slo_ms": 10.0}),
    }
    messages = {"checksum": "checksum mismatch", "no-artifact": "needs 'artifact_path'", "policy": "unknown batching policy"}
    for name, spec in cases.items():
        rt = RuntimeProcess(spec, tmp_path, name)
        assert rt.proc.wait(120) == 2
        assert not rt.ready_file.exists()
        assert "tessera-runtime: error:" in rt.log() and messages[name] in rt.log(), rt.log()
        rt.stop()


def test_runtime_spec_parsing(tmp_path) -> None:
    spec = RuntimeSpec.from_dict(runtime_spec(artifact="/m.onnx", cpu_threads=None))
    assert spec.artifact_path == "/m.onnx" and spec.cpu_threads == 1 and spec.batching.policy == "fixed"
    path = spec.dump(tmp_path / "spec.json")
    assert RuntimeSpec.load(path) == spec
    with pytest.raises(RuntimeSpecError, match="'key' must be a non-empty string"):
        RuntimeSpec.from_dict(runtime_spec(key=""))
    with pytest.raises(RuntimeSpecError, match="slo_ms"):
        RuntimeSpec.from_dict(runtime_spec(simulated=True, batching={"slo_ms": -1}))
    with pytest.raises(RuntimeSpecError, match="needs a 'profile'"):
        RuntimeSpec.from_dict(runtime_spec(simulated=True, profile=[]))
    with pytest.raises(RuntimeSpecError, match="latency_ms"):
        RuntimeSpec.from_dict(runtime_spec(simulated=True, profile=[{"batch": 1, "latency_ms": "fast"}]))
    with pytest.raises(RuntimeSpecError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        RuntimeSpec.load(tmp_path / "bad.json")


def test_a_text_model_answers_bytes_in_json_and_binary(tmp_path) -> None:
    """BYTES end to end in a runtime (issue 38): string inputs in JSON and as the binary extension's
    length-prefixed elements, batched with other queries, fed to onnxruntime as text, and a string output
    answered both ways; a query of another datatype is refused naming both."""
    from tests.onnx_builders import TEXT_KINDS, TEXT_LABELS, onnx_text_bytes

    model = tmp_path / "text.onnx"
    model.write_bytes(onnx_text_bytes())
    spec = runtime_spec(application="tags", variant="labels", artifact_path=str(model), sha256=hashlib.sha256(model.read_bytes()).hexdigest(),
                        batching={"policy": "fixed", "params": {"size": 4}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 5000.0})
    rt = runtime_start(spec, tmp_path)
    try:
        words = ["cat", "fish", "bird", "dög"]
        text = np.array([[w.encode()] for w in words], dtype=object)
        expected_labels = [[TEXT_LABELS.get(w, 0)] for w in words]
        expected_kinds = [[TEXT_KINDS.get(TEXT_LABELS.get(w, 0), "unknown").encode()] for w in words]
        client = FrameClient(rt.endpoint)
        try:
            for i, binary in enumerate((False, True)):
                body, header_length = request_encode({"text": text}, request_id=f"t{i}", binary=binary, binary_outputs=binary)
                reply, reply_body = client.call(infer_header(i, header_length), body)
                assert reply["status"] == 200, reply_body
                doc, outputs = response_decode(bytes(reply_body), reply["header_length"])
                assert [o["datatype"] for o in doc["outputs"]] == ["INT64", "BYTES"]
                assert outputs["label"].tolist() == expected_labels and outputs["kind"].tolist() == expected_kinds
                if not binary:
                    assert json.loads(bytes(reply_body))["outputs"][1]["data"] == [k[0].decode() for k in expected_kinds]
            wrong, header_length = request_encode({"text": np.zeros((1, 1), np.float32)})
            reply, reply_body = client.call(infer_header(9, header_length), wrong)
            assert reply["status"] == 400 and b"datatype FP32 but the model takes BYTES" in bytes(reply_body)
        finally:
            client.close()
    finally:
        assert rt.stop() == 0, rt.log()
