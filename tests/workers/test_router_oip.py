"""The router's Open Inference Protocol (workers/router/oip.py) driven by Triton's own Python client,
`tritonclient.http`, against real runtime processes running onnxruntime: health, server and model metadata,
model configuration, readiness, inference with JSON and with binary tensors, output selection, a version
(variant) named explicitly, the `timeout` parameter, Triton-shaped errors with their status codes, the
statistics extension and the model repository extension's index, load and unload."""
from __future__ import annotations

import copy

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.workers.oip_helpers import (
    NUMBERS, PERF_ANALYZER, PIPELINE, VARIANTS, oip_expected, oip_tables, repository_recording,
    text_model_served,
)
from workers.router import Router, router_start_in_thread
from workers.runtime.session import OnnxSession

pytestmark = pytest.mark.timeout(300)

@pytest.fixture
def serve():
    handles = []

    def start(tables, repository=None):
        router = Router(lambda: copy.deepcopy(tables), None, refresh_s=0.2, report_s=1.0, name="oip-router", repository=repository)
        handle = router_start_in_thread(router)
        handles.append(handle)
        url = handle.url.removeprefix("http://")
        return triton.InferenceServerClient(url, network_timeout=60.0, connection_timeout=10.0), handle.url

    yield start
    for handle in handles:
        handle.stop()


def _request(x: np.ndarray, *, binary: bool, outputs=("logits", "probabilities")):
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return [inp], [triton.InferRequestedOutput(name, binary_data=binary) for name in outputs]


def test_health_server_and_model_metadata_and_configuration(runtimes, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "tessera-router" and {"binary_tensor_data", "model_repository", "statistics"} <= set(server["extensions"])
    assert client.is_model_ready("tabular") and client.is_model_ready("tabular", "big")
    metadata = client.get_model_metadata("tabular")
    # One version numbering: a version is its variant's number wherever the protocol shows one.
    assert metadata["name"] == "tabular" and metadata["versions"] == ["11", "12"] and metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in metadata["outputs"]] == ["logits", "probabilities"]
    assert client.get_model_metadata("tabular", "big")["versions"] == ["12"] == client.get_model_metadata("tabular", "12")["versions"]
    config = client.get_model_config("tabular")
    assert config["max_batch_size"] == 0 and config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert config["parameters"]["tessera_slo_ms"] == {"string_value": "5000"}
    assert "dynamic_batching" not in config  # the tables give no planned batch


def test_the_configuration_shows_the_plans_batching(runtimes, serve) -> None:
    """Issue 38: `max_batch_size` was always 0. From a plan's tables: the largest planned batch of the routed
    instances, their sizes as preferred batch sizes, the tensors' dims without the batch axis (Triton's form)."""
    client, _ = serve(oip_tables(runtimes, batches={"big": 8, "small": 4}))
    config = client.get_model_config("tabular")
    assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert [o["dims"] for o in config["output"]] == [[3], [3]]
    assert client.get_model_config("tabular", "12")["max_batch_size"] == 8  # version 12: big, by its number
    assert client.get_model_config("tabular", "small")["max_batch_size"] == 4
    assert client.get_model_config("calibrate")["max_batch_size"] == 0  # no batch in its table: whole shapes
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    tables = oip_tables(runtimes, batches={"big": 8, "small": 4})
    tables[0]["model"]["batching_delay_ms"] = 1.5  # the application's own delay (a load's configuration set it)
    delayed, _ = serve(tables)
    assert delayed.get_model_config("tabular")["dynamic_batching"]["max_queue_delay_microseconds"] == 1500


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_inference_with_json_and_binary_tensors_answers_as_the_routed_variant(runtimes, models, serve, binary) -> None:
    client, _ = serve(oip_tables(runtimes))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    seen = set()
    for i in range(12):
        inputs, outputs = _request(x, binary=binary)
        result = client.infer("tabular", inputs, outputs=outputs, request_id=f"q{i}")
        answer = result.get_response()
        assert answer["id"] == f"q{i}" and answer["model_name"] == "tabular"
        variant = answer["parameters"]["variant"]
        assert answer["model_version"] == str(NUMBERS[variant])  # the number, as in metadata and statistics
        seen.add(variant)
        expected = oip_expected(models, variant, x)
        np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-5, atol=1e-6)
        assert all(("binary_data_size" in o.get("parameters", {})) == binary for o in answer["outputs"])
    assert seen == set(VARIANTS)  # both routes draw queries; each answer is its own variant's computation


def test_outputs_are_selected_and_a_version_pins_the_variant(runtimes, models, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    x = np.ones((2, 4), np.float32)
    inputs, outputs = _request(x, binary=True, outputs=("probabilities",))
    for _ in range(6):
        result = client.infer("tabular", inputs, model_version="big", outputs=outputs)
        answer = result.get_response()
        assert answer["model_version"] == "12" and [o["name"] for o in answer["outputs"]] == ["probabilities"]
        np.testing.assert_allclose(result.as_numpy("probabilities"), oip_expected(models, "big", x)["probabilities"], rtol=1e-5)
    # Mixed: one output binary, the other JSON, in the order asked.
    mixed = [triton.InferRequestedOutput("probabilities", binary_data=False), triton.InferRequestedOutput("logits", binary_data=True)]
    answer = client.infer("tabular", inputs, outputs=mixed).get_response()
    assert [o["name"] for o in answer["outputs"]] == ["probabilities", "logits"]
    assert "data" in answer["outputs"][0] and "binary_data_size" in answer["outputs"][1]["parameters"]


def test_errors_have_triton_s_shape_and_status(runtimes, serve) -> None:
    client, url = serve(oip_tables(runtimes, tabular_routes=("small",)))
    x = np.ones((1, 4), np.float32)
    inputs, outputs = _request(x, binary=False)
    cases = [
        (lambda: client.infer("nope", inputs), "404", "unknown model: 'nope'"),
        (lambda: client.infer("tabular", inputs, model_version="huge"), "404", "version 'huge' is not found"),
        (lambda: client.infer("tabular", inputs, model_version="big"), "503", "no instance of variant 'big'"),
        (lambda: client.infer("tabular", inputs, outputs=[triton.InferRequestedOutput("nope")]), "400", "unexpected inference output 'nope'"),
        (lambda: client.infer("tabular", [_named("y", x)]), "400", "missing inputs ['x']"),
        (lambda: client.infer("tabular", inputs, timeout=0), "504", "deadline"),
        (lambda: client.get_model_metadata("nope"), "404", "unknown model"),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert caught.value.status() == status and message in caught.value.message(), (status, caught.value)
    assert not client.is_model_ready("tabular", "big")  # known, not routed: not ready (400), not unknown
    raw = httpx.post(f"{url}/v2/models/nope/infer", content=b"{}")
    assert raw.status_code == 404 and set(raw.json()) == {"error"} and raw.headers["x-tessera-error-code"] == "unknown_model"
    bad = httpx.post(f"{url}/v2/models/tabular/infer", content=b'{"inputs": [], "parameters": {"timeout": "soon"}}')
    assert bad.status_code == 400 and "parameters.timeout" in bad.json()["error"]
    assert httpx.get(f"{url}/v2/models/tabular/infer").status_code == 405


def _named(name: str, x: np.ndarray):
    inp = triton.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    return inp


def test_statistics_count_what_the_router_answered(runtimes, serve) -> None:
    client, _ = serve(oip_tables(runtimes))
    inputs, outputs = _request(np.ones((1, 4), np.float32), binary=True)
    for _ in range(5):
        client.infer("tabular", inputs, model_version="small", outputs=outputs)
    stats = client.get_inference_statistics("tabular")["model_stats"]
    small = next(s for s in stats if s["version"] == "11")  # by number: perf_analyzer reads versions as integers
    inference = small["inference_stats"]
    assert inference["success"]["count"] == 5 and inference["success"]["ns"] > 0
    # Queue and compute as the runtime measured them: parts of the whole, the rest is the router and the wire.
    assert inference["compute_infer"]["count"] == 5 and 0 < inference["compute_infer"]["ns"] < inference["success"]["ns"]
    assert 0 <= inference["queue"]["ns"] + inference["compute_infer"]["ns"] < inference["success"]["ns"]
    assert small["last_inference"] > 0
    assert client.get_inference_statistics("tabular", "big")["model_stats"] == []
    # A number names the variant too, for inference as for statistics.
    assert client.infer("tabular", inputs, model_version="12", outputs=outputs).get_response()["model_version"] == "12"
    assert [s["version"] for s in client.get_inference_statistics("tabular", "12")["model_stats"]] == ["12"]


def test_a_pipeline_is_a_model_whose_versions_are_its_paths(runtimes, models, serve) -> None:
    client, url = serve(oip_tables(runtimes, tabular_routes=("small",), pipeline=PIPELINE))
    metadata = client.get_model_metadata("chain")
    assert metadata["platform"] == "tessera_pipeline" and metadata["versions"] == ["main"]
    assert metadata["inputs"][0]["name"] == "x" and metadata["outputs"][0]["name"] == "logits"
    assert client.is_model_ready("chain")
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    inputs = [_named("x", x)]
    middle = oip_expected(models, "small", x)["logits"]
    expected = OnnxSession(models["calibrate"]).run({"x": middle})["logits"]
    # tritonclient asks for binary outputs by default: the last stage answers so, the stage between in JSON.
    result = client.infer("chain", inputs, model_version="main")
    assert "binary_data_size" in result.get_response()["outputs"][0]["parameters"]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
    as_json = client.infer("chain", inputs, outputs=[triton.InferRequestedOutput("logits", binary_data=False)])
    np.testing.assert_allclose(as_json.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("chain", _request(x, binary=True)[0])
    assert caught.value.status() == "400" and "binary" in caught.value.message()
    assert httpx.get(f"{url}/v2/models/chain/versions/other").status_code == 404


def test_repository_index_load_and_unload_go_through_the_control_plane(runtimes, serve) -> None:
    calls: list = []
    repository = repository_recording(calls)
    client, _ = serve(oip_tables(runtimes, tabular_routes=("small",)), repository)
    index = client.get_model_repository_index()
    assert {"name": "tabular", "version": "11", "state": "READY", "reason": ""} in index
    assert any(e["name"] == "calibrate" and e["state"] == "READY" for e in index)
    client.unload_model("tabular")
    client.load_model("tabular")
    config = '{"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}}'
    client.load_model("tabular", config=config)  # relayed for the control plane to apply or refuse
    assert calls == [("unload", "tabular", None), ("load", "tabular", None), ("load", "tabular", config)]
    with pytest.raises(InferenceServerException) as caught:  # model files: Tessera loads from its registry
        client.load_model("tabular", files={"file:1/model.onnx": b"onnx"})
    assert caught.value.status() == "400" and "parameters.file:1/model.onnx" in caught.value.message()
    assert len(calls) == 3  # refused at the router: nothing relayed
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("forbidden")
    assert caught.value.status() == "403" and "may not" in caught.value.message()
    plain, _ = serve(oip_tables(runtimes))  # a router with no control plane behind it
    with pytest.raises(InferenceServerException) as caught:
        plain.unload_model("tabular")
    assert caught.value.status() == "501"




@pytest.mark.skipif(not PERF_ANALYZER.exists(), reason="perf_analyzer is not installed (make perf-analyzer; .ci/run does)")
@pytest.mark.parametrize("batches, shape", [(None, ["--shape", "x:1,4"]), ({"big": 8, "small": 4}, ["--shape", "x:4", "-b", "2"])],
                         ids=["whole-shapes", "batching-configuration"])
def test_perf_analyzer_measures_the_router_with_server_statistics(runtimes, serve, tmp_path, batches, shape) -> None:
    """NVIDIA's perf_analyzer, unmodified, against the router: model configuration (without and with the
    plan's batching: then perf_analyzer adds the batch axis, `-b`), a version by number, binary tensors, and
    the statistics extension's server-side breakdown (benches/oip.py runs it on the demo)."""
    import csv
    import subprocess

    import os

    # perf_analyzer links libcudart.so.12 even without a GPU: the nvidia-cuda-runtime-cu12 wheel's, in its venv.
    cudart = next(PERF_ANALYZER.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(cudart)}
    _, url = serve(oip_tables(runtimes, batches=batches))
    report = tmp_path / "pa.csv"
    cmd = [str(PERF_ANALYZER), "-m", "tabular", "-x", "11", "-u", url.removeprefix("http://"), "-i", "http", *shape,
           "--concurrency-range", "2", "--measurement-interval", "1000", "--stability-percentage", "50", "-f", str(report)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    row = next(csv.DictReader(report.open()))
    assert float(row["Inferences/Second"]) > 10 and int(row["p99 latency"]) > 0
    assert int(row["Server Compute Infer"]) > 0  # from the runtime's own measurement, through /v2/models/tabular/stats
    assert "Successful request count" in done.stdout


def test_a_text_model_is_served_with_bytes_tensors_through_tritons_client(serve, tmp_path) -> None:
    """BYTES through the router (issue 38): tritonclient's string tensors (numpy object arrays), as JSON and
    as binary data, to a real onnxruntime text model; its string output comes back both ways."""
    from tests.onnx_builders import TEXT_KINDS, TEXT_LABELS

    with text_model_served(tmp_path) as table:
        client, _ = serve([table])
        assert client.get_model_metadata("tags")["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
        words = np.array([["cat"], ["owl"], ["dog"]], dtype=object)
        for binary in (False, True):
            x = triton.InferInput("text", [3, 1], "BYTES")
            x.set_data_from_numpy(words, binary_data=binary)
            outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "kind")]
            result = client.infer("tags", [x], outputs=outputs)
            assert result.as_numpy("label").tolist() == [[TEXT_LABELS.get(w, 0)] for (w,) in words]
            assert [k.decode() if isinstance(k, bytes) else k for (k,) in result.as_numpy("kind")] == \
                [TEXT_KINDS.get(TEXT_LABELS.get(w, 0), "unknown") for (w,) in words]
            assert result.get_response()["model_version"] == "31"
