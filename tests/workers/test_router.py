"""The router (workers/router/) in a thread, on tables that point to real runtime processes: the
weighted split, draining and unreachable instances, the control plane going away, the error shapes,
binary pass-through, /metrics and the per-second reports."""
from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.waiting import wait_for
from tests.workers.dataplane_helpers import frame_call, runtime_spec, runtime_start
from workers.router import Router, router_start_in_thread
from workers.runtime.session import OnnxSession
from workers.wire import request_encode, response_decode

pytestmark = pytest.mark.timeout(300)

APP = "tabular-cpu"


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=2)


@pytest.fixture(scope="module")
def runtimes(model_bytes, tmp_path_factory):
    """Two real runtimes of one application, variants mlp-a and mlp-b."""
    workdir = tmp_path_factory.mktemp("runtimes")
    model = workdir / "mlp.onnx"
    model.write_bytes(model_bytes)
    started = []
    try:
        for name in ("a", "b"):
            spec = runtime_spec(key=f"cpu0/{name}", variant=f"mlp-{name}", instance=f"host/cpu0/{name}", artifact_path=str(model))
            started.append(runtime_start(spec, workdir, name))
        yield {"a": started[0], "b": started[1]}
    finally:
        for rt in started:
            rt.stop()


def route(rt, name: str, weight: float, state: str = "ready") -> dict:
    return {"instance": f"host/cpu0/{name}", "variant": f"mlp-{name}", "weight": weight, "endpoint": rt.endpoint, "state": state}


def table(routes: list[dict], version: int = 1, slo_ms: float = 5000.0, application: str = APP) -> dict:
    return {"id": version, "application": application, "version": version, "active": True, "slo_ms": slo_ms,
            "drop_rule": "deadline", "routes": routes}


class TableSource:
    """A control plane stand-in: `tables` (replaceable), `down` makes the fetch raise."""

    def __init__(self, tables: list[dict]) -> None:
        self.tables = tables
        self.down = False
        self.fetches = 0

    def __call__(self) -> list[dict]:
        self.fetches += 1
        if self.down:
            raise ConnectionError("control plane unreachable")
        return copy.deepcopy(self.tables)


@pytest.fixture
def serve():
    handles = []

    def start(source, report=None, **kwargs: Any):
        kwargs.setdefault("refresh_s", 0.1)
        router = Router(source, report, name="test-router", **kwargs)
        handle = router_start_in_thread(router)
        handles.append(handle)
        return handle, httpx.Client(base_url=handle.url, timeout=60.0)

    yield start
    for handle in handles:
        handle.stop()


def query(x: np.ndarray | None = None) -> bytes:
    x = np.zeros((1, 4), np.float32) if x is None else x
    return request_encode({"x": x}, request_id="q")[0]


def test_weighted_split_follows_the_weights(runtimes, serve, model_bytes) -> None:
    source = TableSource([table([route(runtimes["a"], "a", 0.75), route(runtimes["b"], "b", 0.25)], version=2)])
    handle, client = serve(source)
    x = np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32)
    expected = OnnxSession(model_bytes).run({"x": x})["logits"]
    variants: Counter = Counter()
    for _ in range(400):
        response = client.post(f"/v1/infer/{APP}", content=query(x), headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        variants[response.headers["x-tessera-variant"]] += 1
    share = variants["mlp-a"] / 400
    assert 0.6 <= share <= 0.9, variants  # 0.75 expected; the binomial sd over 400 draws is 0.022
    doc, outputs = response_decode(response.content)
    assert doc["model_name"] == APP and doc["parameters"]["routing_version"] == 2
    assert doc["parameters"]["instance"] in ("host/cpu0/a", "host/cpu0/b")
    np.testing.assert_allclose(outputs["logits"], expected, atol=1e-5)


def test_binary_bodies_pass_through(runtimes, serve, model_bytes) -> None:
    handle, client = serve(TableSource([table([route(runtimes["a"], "a", 1.0)])]))
    x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    body, header_length = request_encode({"x": x}, request_id="bin", binary=True, binary_outputs=True)
    response = client.post(f"/v1/infer/{APP}", content=body, headers={
        "content-type": "application/octet-stream", "inference-header-content-length": str(header_length)})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    doc, outputs = response_decode(response.content, int(response.headers["inference-header-content-length"]))
    assert doc["id"] == "bin"
    np.testing.assert_allclose(outputs["logits"], OnnxSession(model_bytes).run({"x": x})["logits"], atol=1e-5)


def test_draining_instances_are_left_out(runtimes, serve) -> None:
    source = TableSource([table([route(runtimes["a"], "a", 0.5), route(runtimes["b"], "b", 0.5, state="draining")])])
    handle, client = serve(source)
    seen = Counter(client.post(f"/v1/infer/{APP}", content=query()).headers["x-tessera-variant"] for _ in range(60))
    assert seen == {"mlp-a": 60}
    # Everything draining (or starting): no route.
    source.tables = [table([route(runtimes["a"], "a", 0.5, state="draining"), route(runtimes["b"], "b", 0.5, state="starting")], version=2)]
    wait_for(lambda: client.get("/v1/routing-tables").json()["tables"][0]["version"] == 2)
    response = client.post(f"/v1/infer/{APP}", content=query())
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_route"


def test_an_instance_that_answers_draining_is_retried_elsewhere(model_bytes, serve, tmp_path) -> None:
    model = tmp_path / "mlp.onnx"
    model.write_bytes(model_bytes)
    a = runtime_start(runtime_spec(key="cpu0/a", variant="mlp-a", artifact_path=str(model)), tmp_path, "a")
    b = runtime_start(runtime_spec(key="cpu0/b", variant="mlp-b", artifact_path=str(model)), tmp_path, "b")
    try:
        handle, client = serve(TableSource([table([route(a, "a", 0.5), route(b, "b", 0.5)])]))
        assert frame_call(b.endpoint, {"op": "drain"})[0]["state"] == "drained"  # the table still says ready
        seen = Counter()
        for _ in range(40):
            response = client.post(f"/v1/infer/{APP}", content=query())
            assert response.status_code == 200, response.text
            seen[response.headers["x-tessera-variant"]] += 1
        assert seen == {"mlp-a": 40}
    finally:
        a.stop()
        b.stop()


def test_an_unreachable_instance_is_left_out(runtimes, serve) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    routes = [route(runtimes["a"], "a", 0.5), {"instance": "host/cpu0/dead", "variant": "mlp-dead", "weight": 0.5, "endpoint": dead, "state": "ready"}]
    handle, client = serve(TableSource([table(routes)]))
    for _ in range(20):
        response = client.post(f"/v1/infer/{APP}", content=query())
        assert response.status_code == 200, response.text
        assert response.headers["x-tessera-variant"] == "mlp-a"


def test_control_plane_down_keeps_the_last_good_tables(runtimes, serve) -> None:
    source = TableSource([table([route(runtimes["a"], "a", 1.0)], version=7)])
    handle, client = serve(source)
    assert client.post(f"/v1/infer/{APP}", content=query()).status_code == 200
    source.down = True
    fetches = source.fetches
    wait_for(lambda: source.fetches >= fetches + 3)
    wait_for(lambda: "tessera_router_control_plane_up 0.0" in client.get("/metrics").text)
    for _ in range(10):
        assert client.post(f"/v1/infer/{APP}", content=query()).status_code == 200
    held = client.get("/v1/routing-tables").json()
    assert held["control_plane_up"] is False and [t["version"] for t in held["tables"]] == [7]
    assert client.get("/healthz").json()["control_plane_up"] is False
    # Back: a new version replaces the old one.
    source.tables = [table([route(runtimes["b"], "b", 1.0)], version=8)]
    source.down = False
    wait_for(lambda: client.get("/v1/routing-tables").json()["tables"][0]["version"] == 8)
    response = client.post(f"/v1/infer/{APP}", content=query())
    assert response.headers["x-tessera-variant"] == "mlp-b"
    assert response.json()["parameters"]["routing_version"] == 8
    assert "tessera_router_control_plane_up 1.0" in client.get("/metrics").text


def test_a_router_that_never_fetched_knows_no_application(serve) -> None:
    source = TableSource([])
    source.down = True
    handle, client = serve(source)
    response = client.post(f"/v1/infer/{APP}", content=query())
    assert response.status_code == 404
    assert client.get("/healthz").status_code == 200


def test_error_shapes(runtimes, serve) -> None:
    source = TableSource([table([route(runtimes["a"], "a", 1.0)]), table([], application="empty-app")])
    handle, client = serve(source)
    unknown = client.post("/v1/infer/no-such-app", content=query())
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"status": 404, "code": "unknown_application", "message": "no routing table for application 'no-such-app'"}}
    no_route = client.post("/v1/infer/empty-app", content=query())
    assert no_route.status_code == 503 and no_route.json()["error"]["code"] == "no_route"
    late = client.post(f"/v1/infer/{APP}", content=query(), headers={"x-tessera-deadline-ms": "0.001"})
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    bad_header = client.post(f"/v1/infer/{APP}", content=query(), headers={"x-tessera-deadline-ms": "soon"})
    assert bad_header.status_code == 400 and bad_header.json()["error"]["code"] == "malformed"
    bad_body = client.post(f"/v1/infer/{APP}", content=b'{"inputs": 3}')
    assert bad_body.status_code == 400 and bad_body.json()["error"]["code"] == "malformed"
    assert bad_body.headers["x-tessera-variant"] == "mlp-a"
    assert client.get(f"/v1/infer/{APP}").status_code == 405
    assert client.get("/nowhere").status_code == 404


def test_metrics_and_reports(runtimes, serve) -> None:
    reports: list[dict] = []
    lock = threading.Lock()

    def report(payload: dict) -> None:
        with lock:
            reports.append(payload)

    source = TableSource([table([route(runtimes["a"], "a", 0.5), route(runtimes["b"], "b", 0.5)], version=4)])
    handle, client = serve(source, report, report_s=0.2)
    for _ in range(20):
        assert client.post(f"/v1/infer/{APP}", content=query()).status_code == 200
    assert client.post(f"/v1/infer/{APP}", content=query(), headers={"x-tessera-deadline-ms": "0.001"}).status_code == 504
    assert client.post("/v1/infer/nobody", content=query()).status_code == 404

    text = client.get("/metrics").text
    assert f'tessera_router_queries_total{{application="{APP}",outcome="served"}}' in text
    assert f'tessera_router_queries_total{{application="{APP}",outcome="dropped"}} 1.0' in text
    assert f'tessera_routing_table_version{{application="{APP}"}} 4.0' in text
    assert "tessera_router_latency_seconds_bucket" in text and "tessera_router_control_plane_up 1.0" in text
    assert "# TYPE nv_inference_request_success counter" in text
    assert f'nv_inference_request_success{{instance="host/cpu0/a",model="{APP}",simulated="false",version="mlp-a"}}' in text

    def totals() -> dict:
        with lock:
            items = [a for r in reports for a in r["applications"] if a["application"] == APP]
        return {k: sum(a[k] for a in items) for k in ("arrivals", "served", "dropped", "late", "no_route")}

    wait_for(lambda: totals()["arrivals"] >= 21)
    assert totals()["served"] == 20 and totals()["dropped"] == 1
    with lock:
        sample = reports[-1]
    assert sample["router"] == "test-router" and sample["interval_s"] > 0 and sample["at"].endswith("Z")
    item = next(a for a in sample["applications"] if a["application"] == APP)
    assert set(item) == {"application", "routing_version", "arrivals", "served", "late", "dropped", "no_route",
                         "latency_p50_ms", "latency_p99_ms"}
    assert item["routing_version"] == 4
    with lock:
        busy = [a for r in reports for a in r["applications"] if a["application"] == APP and a["served"]]
    assert busy and all(a["latency_p50_ms"] > 0 and a["latency_p99_ms"] >= a["latency_p50_ms"] for a in busy)


def test_a_failing_report_does_not_stop_serving(runtimes, serve) -> None:
    calls = []

    def report(payload: dict) -> None:
        calls.append(payload)
        raise ConnectionError("control plane unreachable")

    handle, client = serve(TableSource([table([route(runtimes["a"], "a", 1.0)])]), report, report_s=0.1)
    wait_for(lambda: len(calls) >= 3)
    assert client.post(f"/v1/infer/{APP}", content=query()).status_code == 200


def test_tables_file_router_cli(runtimes, tmp_path) -> None:
    """`python -m workers.router --tables FILE` (the benches' router) serves HTTP and gRPC and writes its ready
    file (the HTTP URL, then the gRPC address)."""
    import subprocess
    import sys

    from tests.workers.dataplane_helpers import REPO

    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([table([route(runtimes["a"], "a", 1.0)])]))
    ready = tmp_path / "router.ready"
    proc = subprocess.Popen([sys.executable, "-m", "workers.router", "--tables", str(tables), "--listen", "127.0.0.1:0",
                             "--grpc-listen", "127.0.0.1:0", "--ready-file", str(ready)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 90)
        assert proc.poll() is None, proc.stderr.read()
        url, grpc_url = ready.read_text().split()
        response = httpx.post(f"{url}/v1/infer/{APP}", content=query(), timeout=60)
        assert response.status_code == 200 and response.headers["x-tessera-variant"] == "mlp-a"
        import tritonclient.grpc

        client = tritonclient.grpc.InferenceServerClient(grpc_url.removeprefix("grpc://"))
        assert client.is_server_live() and client.is_model_ready(APP)
    finally:
        proc.terminate()
        proc.wait(30)
    assert Path(tables).exists()


def test_head_and_keep_alive_responses_are_complete(runtimes, serve) -> None:
    """The router writes each response head with its body; a HEAD response (no body) still goes out."""
    handle, client = serve(TableSource([table([route(runtimes["a"], "a", 1.0)])]))
    for _ in range(3):  # one keep-alive connection
        assert client.head("/healthz").status_code == 405
        assert client.get("/healthz").json()["status"] == "ok"
        response = client.post(f"/v1/infer/{APP}", content=query())
        assert response.status_code == 200 and response.json()["outputs"]
