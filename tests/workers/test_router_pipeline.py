"""Pipelines in the router (workers/router/pipelines.py) on two real runtime processes: a query goes stage to
stage with the previous answer's outputs mapped to the next stage's inputs, the answer is the composition
of the two ONNX models, the deadline is carried and a query past it is dropped at the stage it reached,
errors name the stage, and /metrics counts each path end to end."""
from __future__ import annotations

import copy

import httpx
import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.waiting import wait_for
from tests.workers.dataplane_helpers import runtime_spec, runtime_start
from workers.router import Router, router_start_in_thread
from workers.runtime.session import OnnxSession
from workers.wire import request_encode, response_decode

pytestmark = pytest.mark.timeout(300)

PIPELINE = {"name": "video", "stages": [{"application": "detect", "max_batch": 4},
                                        {"application": "classify", "max_batch": 4, "inputs": {"x": "logits"}}],
            "paths": [{"name": "main", "stages": ["detect", "classify"], "slo_ms": 5000.0, "demand_rps": 10.0}]}


@pytest.fixture(scope="module")
def models() -> dict[str, bytes]:
    # detect: 4 features -> 3 ("logits"); classify: 3 -> 2, its input "x" made from detect's "logits".
    return {"detect": onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=5), "classify": onnx_mlp_bytes(n_in=3, hidden=6, n_out=2, seed=6)}


@pytest.fixture(scope="module")
def stages(models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pipeline-runtimes")
    started = {}
    try:
        for k, (app, data) in enumerate(models.items()):
            path = workdir / f"{app}.onnx"
            path.write_bytes(data)
            spec = runtime_spec(key=f"cpu0/{k}", application=app, variant=f"{app}-v1", instance=f"host/cpu0/{k}", artifact_path=str(path))
            started[app] = runtime_start(spec, workdir, app)
        yield started
    finally:
        for rt in started.values():
            rt.stop()


def _tables(stages, pipeline=PIPELINE) -> list[dict]:
    return [
        {"id": k + 1, "application": app, "version": 1, "active": True, "slo_ms": 5000.0, "drop_rule": "deadline",
         "routes": [{"instance": f"host/cpu0/{k}", "variant": f"{app}-v1", "weight": 1.0, "endpoint": stages[app].endpoint, "state": "ready"}],
         "pipeline": copy.deepcopy(pipeline)}
        for k, app in enumerate(("detect", "classify"))
    ]


@pytest.fixture
def serve():
    handles = []

    def start(tables):
        reports: list[dict] = []
        router = Router(lambda: copy.deepcopy(tables), reports.append, refresh_s=0.1, report_s=0.2, name="pipeline-router")
        handle = router_start_in_thread(router)
        handles.append(handle)
        client = httpx.Client(base_url=handle.url, timeout=60.0)
        client.reports = reports  # what the router reported, every 0.2 s
        return client

    yield start
    for handle in handles:
        handle.stop()


def _query(x: np.ndarray) -> bytes:
    return request_encode({"x": x}, request_id="q")[0]


def test_a_query_runs_stage_to_stage_and_answers_with_the_composition(stages, models, serve) -> None:
    client = serve(_tables(stages))
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    response = client.post("/v1/pipelines/video/infer", content=_query(x), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.headers["x-tessera-variant"] == "detect=detect-v1, classify=classify-v1"
    assert response.headers["x-tessera-path"] == "main"
    doc, outputs = response_decode(response.content)
    assert doc["model_name"] == "classify"
    middle = OnnxSession(models["detect"]).run({"x": x})["logits"]
    expected = OnnxSession(models["classify"]).run({"x": middle})["logits"]
    np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-5, atol=1e-5)
    metrics = client.get("/metrics").text
    assert 'tessera_router_pipeline_queries_total{outcome="served",path="main",pipeline="video"} 1.0' in metrics
    # Each stage is also counted as its own application.
    assert 'tessera_router_queries_total{application="classify",outcome="served"} 1.0' in metrics
    # The per-second report to the control plane carries the path's end-to-end counts.
    path = wait_for(lambda: next((p for r in client.reports for p in r.get("pipelines", [])), None), 10, "a report with the path")
    assert path["pipeline"] == "video" and path["path"] == "main" and path["arrivals"] == 1 and path["served"] == 1
    assert path["latency_p99_ms"] > 0


def test_a_query_past_its_deadline_is_dropped_at_the_stage_it_reached(stages, serve) -> None:
    client = serve(_tables(stages))
    response = client.post("/v1/pipelines/video/infer", content=_query(np.zeros((1, 4), np.float32)),
                           headers={"content-type": "application/json", "x-tessera-deadline-ms": "0"})
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded" and "before stage detect" in error["message"]
    metrics = client.get("/metrics").text
    assert 'tessera_router_pipeline_stage_drops_total{path="main",pipeline="video",stage="detect"} 1.0' in metrics
    assert 'tessera_router_queries_total{application="classify"' not in metrics  # it never reached the second stage


def test_unknown_pipelines_paths_and_binary_requests_are_refused(stages, serve) -> None:
    client = serve(_tables(stages))
    body = _query(np.zeros((1, 4), np.float32))
    assert client.post("/v1/pipelines/nope/infer", content=body).json()["error"]["code"] == "unknown_pipeline"
    missing = client.post("/v1/pipelines/video/infer", content=body, headers={"x-tessera-path": "other"})
    assert missing.status_code == 404 and "its paths: main" in missing.json()["error"]["message"]
    binary, length = request_encode({"x": np.zeros((1, 4), np.float32)}, request_id="b", binary=True)
    refused = client.post("/v1/pipelines/video/infer", content=binary, headers={"inference-header-content-length": str(length)})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "malformed"
    assert client.get("/v1/pipelines/video/infer").status_code == 405


def test_a_wrong_mapping_names_the_stage_and_what_the_answer_had(stages, serve) -> None:
    bad = copy.deepcopy(PIPELINE)
    bad["stages"][1]["inputs"] = {"x": "boxes"}
    client = serve(_tables(stages, bad))
    response = client.post("/v1/pipelines/video/infer", content=_query(np.zeros((1, 4), np.float32)))
    assert response.status_code == 502
    assert "stage classify takes ['boxes'] from detect, whose answer has only ['logits']" in response.json()["error"]["message"]
    # Without a mapping the output goes under its own name, which the second model does not take: its
    # runtime refuses the request, relayed with the stage named.
    unmapped = copy.deepcopy(PIPELINE)
    del unmapped["stages"][1]["inputs"]
    client = serve(_tables(stages, unmapped))
    response = client.post("/v1/pipelines/video/infer", content=_query(np.zeros((1, 4), np.float32)))
    assert response.status_code == 400 and response.headers["x-tessera-failed-stage"] == "classify"
