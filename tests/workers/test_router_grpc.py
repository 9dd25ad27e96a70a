"""The router's Open Inference Protocol over gRPC (workers/router/oip_grpc.py) driven by Triton's own gRPC
client, `tritonclient.grpc`, against the same real onnxruntime runtime processes as the HTTP tests
(tests/workers/test_router_oip.py): every call those make, over gRPC, and what only gRPC has (the call's
deadline, typed contents, streams, grpc.health.v1). perf_analyzer -i grpc runs against it too."""
from __future__ import annotations

import copy
import csv
import os
import queue
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.onnx_builders import TEXT_KINDS, TEXT_LABELS
from tests.workers.oip_helpers import (
    NUMBERS, PERF_ANALYZER, PIPELINE, VARIANTS, oip_expected, oip_tables, repository_recording,
    text_model_served,
)
from workers.router import Router, router_start_in_thread
from workers.runtime.session import OnnxSession

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def serve():
    handles = []

    def start(tables, repository=None):
        router = Router(lambda: copy.deepcopy(tables), None, refresh_s=0.2, report_s=1.0, name="grpc-router", repository=repository,
                        grpc_listen="127.0.0.1:0")
        handle = router_start_in_thread(router)
        handles.append(handle)
        return triton.InferenceServerClient(handle.grpc_url), handle

    yield start
    for handle in handles:
        handle.stop()


def _request(x: np.ndarray, outputs=("logits", "probabilities")):
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp], [triton.InferRequestedOutput(name) for name in outputs]


def _code(caught) -> str:
    return caught.value.status()


def test_health_server_and_model_metadata_and_configuration(runtimes, serve) -> None:
    client, handle = serve(oip_tables(runtimes))
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "tessera-router" and {"binary_tensor_data", "model_repository", "statistics"} <= set(server["extensions"])
    assert client.is_model_ready("tabular") and client.is_model_ready("tabular", "big") and client.is_model_ready("tabular", "12")
    metadata = client.get_model_metadata("tabular", as_json=True)
    assert metadata["name"] == "tabular" and metadata["versions"] == ["11", "12"] and metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]  # int64 as JSON text (protobuf's form)
    assert [o["name"] for o in metadata["outputs"]] == ["logits", "probabilities"]
    assert client.get_model_metadata("tabular", "big").versions == ["12"] == client.get_model_metadata("tabular", "12").versions
    config = client.get_model_config("tabular").config
    assert config.max_batch_size == 0 and [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("x", 11, [-1, 4])]
    assert config.parameters["tessera_slo_ms"].string_value == "5000"
    assert not config.HasField("dynamic_batching")
    # grpc.health.v1, as Kubernetes' gRPC probes and load balancers ask it.
    with grpc.insecure_channel(handle.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_an_unknown_version_is_not_found(runtimes, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("tabular", "huge")
    assert _code(caught) == "StatusCode.NOT_FOUND" and "version 'huge' is not found" in caught.value.message()


def test_the_configuration_shows_the_plans_batching(runtimes, serve) -> None:
    client, _ = serve(oip_tables(runtimes, batches={"big": 8, "small": 4}))
    config = client.get_model_config("tabular", as_json=True)["config"]
    assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]
    assert client.get_model_config("tabular", "12").config.max_batch_size == 8
    assert client.get_model_config("tabular", "small").config.max_batch_size == 4
    assert client.get_model_config("calibrate").config.max_batch_size == 0
    tables = oip_tables(runtimes, batches={"big": 8, "small": 4})
    tables[0]["model"]["batching_delay_ms"] = 1.5
    delayed, _ = serve(tables)
    assert delayed.get_model_config("tabular").config.dynamic_batching.max_queue_delay_microseconds == 1500


def test_inference_answers_as_the_routed_variant(runtimes, models, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    seen = set()
    for i in range(12):
        inputs, outputs = _request(x)
        result = client.infer("tabular", inputs, outputs=outputs, request_id=f"q{i}")
        answer = result.get_response()
        assert answer.id == f"q{i}" and answer.model_name == "tabular"
        variant = answer.parameters["variant"].string_param
        assert answer.model_version == str(NUMBERS[variant]) and answer.parameters["tessera_variant"].string_param == variant
        seen.add(variant)
        expected = oip_expected(models, variant, x)
        np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-5, atol=1e-6)
    assert seen == set(VARIANTS)


def test_outputs_are_selected_and_a_version_pins_the_variant(runtimes, models, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    x = np.ones((2, 4), np.float32)
    inputs, outputs = _request(x, outputs=("probabilities",))
    for _ in range(6):
        result = client.infer("tabular", inputs, model_version="big", outputs=outputs)
        answer = result.get_response()
        assert answer.model_version == "12" and [o.name for o in answer.outputs] == ["probabilities"]
        np.testing.assert_allclose(result.as_numpy("probabilities"), oip_expected(models, "big", x)["probabilities"], rtol=1e-5)
    both = client.infer("tabular", inputs, outputs=[triton.InferRequestedOutput("probabilities"), triton.InferRequestedOutput("logits")])
    assert [o.name for o in both.get_response().outputs] == ["probabilities", "logits"]
    assert client.infer("tabular", inputs, model_version="11").get_response().model_version == "11"


def test_errors_are_grpc_status_codes_with_the_protocols_message(runtimes, serve) -> None:
    client, handle = serve(oip_tables(runtimes, tabular_routes=("small",)))
    x = np.ones((1, 4), np.float32)
    inputs, outputs = _request(x)
    named_y = triton.InferInput("y", [1, 4], "FP32")
    named_y.set_data_from_numpy(x)
    cases = [
        (lambda: client.infer("nope", inputs), "NOT_FOUND", "unknown model: 'nope'"),
        (lambda: client.infer("tabular", inputs, model_version="huge"), "NOT_FOUND", "version 'huge' is not found"),
        (lambda: client.infer("tabular", inputs, model_version="big"), "UNAVAILABLE", "no instance of variant 'big'"),
        (lambda: client.infer("tabular", inputs, outputs=[triton.InferRequestedOutput("nope")]), "INVALID_ARGUMENT",
         "unexpected inference output 'nope'"),
        (lambda: client.infer("tabular", [named_y]), "INVALID_ARGUMENT", "missing inputs ['x']"),
        (lambda: client.infer("tabular", inputs, timeout=0), "DEADLINE_EXCEEDED", "deadline"),
        (lambda: client.get_model_metadata("nope"), "NOT_FOUND", "unknown model"),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert _code(caught) == f"StatusCode.{status}" and message in caught.value.message(), (status, caught.value)
    assert not client.is_model_ready("tabular", "big")
    # Tessera's own code rides in the trailing metadata, as in /v2's X-Tessera-Error-Code header.
    with grpc.insecure_channel(handle.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(service_pb2.ModelInferRequest(model_name="nope"), timeout=10)
        assert dict(caught.value.trailing_metadata())["x-tessera-error-code"] == "unknown_model"
        # raw contents must be one per input; typed contents of the wrong field are named.
        bad = service_pb2.ModelInferRequest(model_name="tabular", raw_input_contents=[b"", b""])
        bad.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(bad, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one per input" in caught.value.details()
        wrong = service_pb2.ModelInferRequest(model_name="tabular")
        wrong.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.int_contents.extend([1, 2, 3, 4])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(wrong, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "contents.fp32_contents" in caught.value.details()


def test_the_calls_deadline_bounds_the_query(runtimes, serve) -> None:
    """gRPC's own deadline is the client's budget, as X-Tessera-Deadline-Ms is over HTTP: a query whose
    deadline has passed is refused, never answered late."""
    client, _ = serve(oip_tables(runtimes))
    inputs, _ = _request(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("tabular", inputs, client_timeout=0.000001)
    assert _code(caught) == "StatusCode.DEADLINE_EXCEEDED"
    assert client.infer("tabular", inputs, client_timeout=30).get_response().model_name == "tabular"


def test_typed_contents_are_taken_as_raw_ones(runtimes, models, serve) -> None:
    """InferTensorContents (KServe's clients send typed values): checked and laid out as raw bytes."""
    _, handle = serve(oip_tables(runtimes, tabular_routes=("small",)))
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    request = service_pb2.ModelInferRequest(model_name="tabular", id="typed")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(handle.grpc_url) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert answer.id == "typed" and [o.name for o in answer.outputs] == ["logits", "probabilities"]
    logits = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(list(answer.outputs[0].shape))
    np.testing.assert_allclose(logits, oip_expected(models, "small", x)["logits"], rtol=1e-5, atol=1e-6)


def test_a_stream_answers_every_request_matched_by_id(runtimes, models, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        xs = {f"s{i}": np.full((1, 4), i, np.float32) for i in range(8)}
        for request_id, x in xs.items():
            inputs, outputs = _request(x)
            client.async_stream_infer("tabular", inputs, outputs=outputs, request_id=request_id)
        inputs, _ = _request(np.ones((1, 4), np.float32))
        client.async_stream_infer("nope", inputs, request_id="bad")
        got = [answers.get(timeout=30) for _ in range(len(xs) + 1)]
    finally:
        client.stop_stream()
    errors = [error for result, error in got if error is not None]
    assert len(errors) == 1 and "unknown model: 'nope'" in errors[0].message()
    for result, error in got:
        if error is None:
            answer = result.get_response()
            variant = answer.parameters["variant"].string_param
            np.testing.assert_allclose(result.as_numpy("logits"), oip_expected(models, variant, xs[answer.id])["logits"], rtol=1e-5, atol=1e-6)
    assert sorted(r.get_response().id for r, e in got if e is None) == sorted(xs)


def test_statistics_count_what_the_router_answered(runtimes, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    inputs, outputs = _request(np.ones((1, 4), np.float32))
    for _ in range(5):
        client.infer("tabular", inputs, model_version="small", outputs=outputs)
    stats = client.get_inference_statistics("tabular").model_stats
    small = next(s for s in stats if s.version == "11")
    inference = small.inference_stats
    assert inference.success.count == 5 and inference.success.ns > 0
    assert inference.compute_infer.count == 5 and 0 < inference.compute_infer.ns < inference.success.ns
    assert small.last_inference > 0
    assert list(client.get_inference_statistics("tabular", "big").model_stats) == []
    assert client.infer("tabular", inputs, model_version="12", outputs=outputs).get_response().model_version == "12"
    assert [s.version for s in client.get_inference_statistics("tabular", "12").model_stats] == ["12"]
    assert {s.name for s in client.get_inference_statistics().model_stats} == {"tabular"}  # every model: those with answers


def test_a_pipeline_is_a_model_whose_versions_are_its_paths(runtimes, models, serve) -> None:
    client, _ = serve(oip_tables(runtimes, tabular_routes=("small",), pipeline=PIPELINE))
    metadata = client.get_model_metadata("chain")
    assert metadata.platform == "tessera_pipeline" and list(metadata.versions) == ["main"]
    assert client.is_model_ready("chain")
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    inputs, _ = _request(x)
    expected = OnnxSession(models["calibrate"]).run({"x": oip_expected(models, "small", x)["logits"]})["logits"]
    for version in ("main", ""):
        result = client.infer("chain", inputs, model_version=version)
        np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
        assert result.get_response().parameters["tessera_variant"].string_param == "tabular=small, calibrate=calibrate"
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("chain", "other")
    assert _code(caught) == "StatusCode.NOT_FOUND"


def test_repository_index_load_and_unload_go_through_the_control_plane(runtimes, serve) -> None:
    calls: list = []
    repository = repository_recording(calls)
    client, _ = serve(oip_tables(runtimes, tabular_routes=("small",)), repository)
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "tabular", "version": "11", "state": "READY"} in index  # protobuf's JSON leaves the empty reason out
    assert any(e["name"] == "calibrate" and e["state"] == "READY" for e in index)
    client.unload_model("tabular")
    client.load_model("tabular")
    config = '{"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}}'
    client.load_model("tabular", config=config)
    assert calls == [("unload", "tabular", None), ("load", "tabular", None), ("load", "tabular", config)]
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("tabular", files={"file:1/model.onnx": b"onnx"})
    assert _code(caught) == "StatusCode.INVALID_ARGUMENT" and "parameters.file:1/model.onnx" in caught.value.message()
    assert len(calls) == 3
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("forbidden")
    assert _code(caught) == "StatusCode.PERMISSION_DENIED" and "may not" in caught.value.message()
    plain, _ = serve(oip_tables(runtimes))
    with pytest.raises(InferenceServerException) as caught:
        plain.unload_model("tabular")
    assert _code(caught) == "StatusCode.UNIMPLEMENTED"


def test_a_text_model_is_served_with_bytes_tensors(serve, tmp_path) -> None:
    """BYTES over gRPC: tritonclient's string tensors (raw contents, length-prefixed) and KServe's typed
    bytes_contents, to a real onnxruntime text model; its string output comes back as raw BYTES."""
    with text_model_served(tmp_path) as table:
        client, handle = serve([table])
        words = np.array([["cat"], ["owl"], ["dog"]], dtype=object)
        x = triton.InferInput("text", [3, 1], "BYTES")
        x.set_data_from_numpy(words)
        result = client.infer("tags", [x])
        assert result.as_numpy("label").tolist() == [[TEXT_LABELS.get(w, 0)] for (w,) in words]
        assert [k.decode() for (k,) in result.as_numpy("kind")] == [TEXT_KINDS.get(TEXT_LABELS.get(w, 0), "unknown") for (w,) in words]
        request = service_pb2.ModelInferRequest(model_name="tags")
        request.inputs.add(name="text", datatype="BYTES", shape=[2, 1]).contents.bytes_contents.extend([b"bird", "\u00e9t\u00e9".encode()])
        not_text = service_pb2.ModelInferRequest(model_name="tags")
        not_text.inputs.add(name="text", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.extend([b"\xff\xfe"])
        with grpc.insecure_channel(handle.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = stub.ModelInfer(request, timeout=30)
            assert np.frombuffer(answer.raw_output_contents[0], np.int64).tolist() == [3, 0]
            assert answer.outputs[1].datatype == "BYTES" and answer.raw_output_contents[1] == b"\x05\x00\x00\x00avian\x07\x00\x00\x00unknown"
            # The model's string inputs are text: bytes that are not UTF-8 are refused, that query alone.
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(not_text, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not UTF-8 text" in caught.value.details()


@pytest.mark.skipif(not PERF_ANALYZER.exists(), reason="perf_analyzer is not installed (make perf-analyzer; .ci/run does)")
def test_perf_analyzer_measures_the_router_over_grpc(runtimes, serve, tmp_path) -> None:
    """NVIDIA's perf_analyzer, unmodified, over gRPC (`-i grpc`): configuration with the plan's batching,
    a version by number, raw tensors and the statistics' server-side breakdown; then over a stream."""
    cudart = next(PERF_ANALYZER.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(cudart)}
    _, handle = serve(oip_tables(runtimes, batches={"big": 8, "small": 4}))
    for extra in ([], ["--streaming"]):
        report = tmp_path / f"pa{len(extra)}.csv"
        cmd = [str(PERF_ANALYZER), "-m", "tabular", "-x", "11", "-u", handle.grpc_url, "-i", "grpc", "--shape", "x:4", "-b", "2", *extra,
               "--concurrency-range", "2", "--measurement-interval", "1000", "--stability-percentage", "50", "-f", str(report)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        row = next(csv.DictReader(report.open()))
        assert float(row["Inferences/Second"]) > 10 and int(row["p99 latency"]) > 0
        if not extra:
            assert int(row["Server Compute Infer"]) > 0


def test_the_committed_messages_are_generated_from_the_proto(tmp_path) -> None:
    """workers/router/proto/oip_pb2.py is what protoc writes from oip.proto (`make proto`)."""
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
                           "workers/router/proto/oip.proto"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for name in ("oip_pb2.py", "oip_pb2.pyi"):
        generated = (tmp_path / "workers" / "router" / "proto" / name).read_text()
        assert generated == (REPO / "workers" / "router" / "proto" / name).read_text(), f"{name} is stale: run make proto"

