"""A router serving through a control-plane outage and after it (issue 16, finding 3): a TCP proxy the test
controls stands between the router and a control-plane stand-in and refuses or freezes. Queries keep
meeting their deadlines throughout, and every per-interval report reaches the control plane once it is
back, with its original time: the arrivals reported add up to exactly the queries sent."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from benches.faultproxy import FaultProxy
from tests.onnx_builders import onnx_mlp_bytes
from tests.waiting import wait_for
from tests.workers.dataplane_helpers import runtime_spec, runtime_start
from workers.router.main import router_build
from workers.router.server import router_start_in_thread
from workers.wire import request_encode

pytestmark = pytest.mark.timeout(300)

APP = "tabular-cpu"


class ControlPlaneStandIn:
    """The two endpoints a router uses, and the one that names it: routing tables in, reports out."""

    def __init__(self, tables: list[dict]) -> None:
        self.tables = tables
        self.reports: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/api/v1/router-credentials/"):
                    self._send(200, {"count": 1, "next": None, "results": [{"name": "r1"}]})
                else:
                    self._send(200, {"count": len(stand_in.tables), "next": None, "results": stand_in.tables})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.reports.append(body)
                self._send(201, {"application_samples": len(body["applications"])})

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def arrivals_reported(self) -> int:
        """Arrivals over the distinct reports (a report sent again after a timeout counts once: the real
        control plane stores it once, tests/api/test_telemetry.py)."""
        distinct = {r["at"]: r for r in self.reports if r["router"] == "r1"}
        return sum(a["arrivals"] for r in distinct.values() for a in r["applications"] if a["application"] == APP)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("outage")
    model = workdir / "mlp.onnx"
    model.write_bytes(onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=2))
    rt = runtime_start(runtime_spec(artifact_path=str(model)), workdir)
    yield rt
    rt.stop()


@pytest.mark.parametrize("fault", ["refused", "frozen"])
def test_queries_meet_deadlines_and_reports_survive_an_outage(runtime, fault) -> None:
    tables = [{"id": 1, "application": APP, "version": 1, "active": True, "slo_ms": 2000.0, "drop_rule": "deadline",
               "routes": [{"instance": "test-host/cpu0/0", "variant": "mlp-wide", "weight": 1.0, "endpoint": runtime.endpoint, "state": "ready"}]}]
    control_plane = ControlPlaneStandIn(tables)
    proxy = FaultProxy(control_plane.port).start()
    # httpx's 5 s timeout would make a frozen outage long; the router's own client is what is under test.
    router, client = router_build(control_plane=f"http://127.0.0.1:{proxy.port}", token="tsr_test", report_s=0.2)
    assert router.name == "r1"
    client._http.timeout = httpx.Timeout(1.0)
    handle = router_start_in_thread(router)
    body = request_encode({"x": np.zeros((1, 4), np.float32)}, request_id="q")[0]
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            while not stop.is_set():
                statuses.append(http.post(f"/v1/infer/{APP}", content=body).status_code)
                time.sleep(0.005)

    loader = threading.Thread(target=load)
    try:
        wait_for(lambda: router.refreshes > 0, what="the router's first tables")
        loader.start()
        wait_for(lambda: len(control_plane.reports) >= 3, what="reports before the outage")
        proxy.mode = fault
        time.sleep(3.0)
        assert router.report_backlog.pending > 0  # kept, not dropped
        proxy.mode = "up"
        wait_for(lambda: router.report_backlog.pending == 0, 60, "the kept reports to be sent")
        time.sleep(1.0)
        stop.set()
        loader.join(30)
        wait_for(lambda: control_plane.arrivals_reported() == len(statuses), 30,
                 f"every query in the reports ({control_plane.arrivals_reported()} of {len(statuses)})")
        # Scraped while the control plane is still up: once it is closed below, the router's next periodic
        # report fails and is (rightly) kept as pending.
        wait_for(lambda: router.report_backlog.pending == 0, 30, "no report pending before the scrape")
        scrape = router.stats.exposition().decode()
    finally:
        stop.set()
        handle.stop()
        client.close()
        proxy.stop()
        control_plane.close()
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    assert router.report_backlog.dropped_total == 0 and router.report_backlog.sent_late_total > 0
    times = [r["at"] for r in control_plane.reports]
    # A frozen request may arrive as well as its resend. Refused: the proxy resets the connections open when
    # the outage starts, so a report already forwarded whose answer was cut is sent again: at most that one.
    assert len(times) - len(set(times)) <= 1 or fault == "frozen"
    assert "tessera_router_reports_dropped_total 0.0" in scrape and "tessera_router_reports_pending 0.0" in scrape
