"""Telemetry through a control-plane outage (issue 16, finding 3): agents and routers keep the reports the
control plane could not take, in a bounded buffer (`workers.client.ReportBacklog`), and send them with
their original times once it is back; what overflows is counted on /metrics and told to the control
plane in the next report (`dropped_reports`)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.exporter import AgentExporter
from workers.client import (
    REPORT_BACKLOG_S,
    ControlPlaneClient,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
    ReportBacklog,
    report_backlog_capacity,
)


class FlakyControlPlane:
    """`send` for a ReportBacklog: raises what `failure` says (None: accepts and records the report)."""

    def __init__(self) -> None:
        self.failure: Exception | None = None
        self.received: list[dict] = []

    def __call__(self, report: dict) -> None:
        if self.failure is not None:
            raise self.failure
        self.received.append(report)


def test_ten_minutes_of_reports_are_kept() -> None:
    assert REPORT_BACKLOG_S >= 600
    assert report_backlog_capacity(1.0) >= 600 and report_backlog_capacity(0.5) >= 1200


def test_kept_reports_go_out_with_their_times_and_overflow_is_counted_and_told() -> None:
    cp = FlakyControlPlane()
    backlog = ReportBacklog(cp, capacity=5, flush_per_report=100)
    backlog.submit({"at": "t0"})
    cp.failure = ControlPlaneUnavailable("down")
    for i in range(1, 9):  # 8 reports during the outage: 5 kept, the 3 oldest let go
        with pytest.raises(ControlPlaneUnavailable):
            backlog.submit({"at": f"t{i}"})
    assert backlog.pending == 5 and backlog.dropped_total == 3 and cp.received == [{"at": "t0"}]
    cp.failure = None
    backlog.submit({"at": "t9"})
    # The fresh report first (carrying the drops), then the kept ones, oldest first, unchanged.
    assert cp.received[1:] == [{"at": "t9", "dropped_reports": 3}, {"at": "t4"}, {"at": "t5"}, {"at": "t6"}, {"at": "t7"}, {"at": "t8"}]
    assert backlog.pending == 0 and backlog.sent_late_total == 5
    backlog.submit({"at": "t10"})
    assert cp.received[-1] == {"at": "t10"}  # told once


def test_a_flush_is_paced_and_stops_at_the_first_failure() -> None:
    cp = FlakyControlPlane()
    backlog = ReportBacklog(cp, capacity=100, flush_per_report=3)
    cp.failure = ControlPlaneUnavailable("down")
    for i in range(10):
        with pytest.raises(ControlPlaneUnavailable):
            backlog.submit({"at": i})
    cp.failure = None
    backlog.submit({"at": 10})
    assert [r["at"] for r in cp.received] == [10, 0, 1, 2] and backlog.pending == 7
    assert backlog.flush() == 7 and [r["at"] for r in cp.received[4:]] == [3, 4, 5, 6, 7, 8, 9]


def test_refusals_for_good_are_let_go_but_a_refused_credential_keeps_the_reports() -> None:
    cp = FlakyControlPlane()
    backlog = ReportBacklog(cp, capacity=10)
    cp.failure = ControlPlaneRejected(401, "Invalid or revoked router credential.")
    with pytest.raises(ControlPlaneRejected):
        backlog.submit({"at": 1})
    assert backlog.pending == 1  # a credential can be issued again: the report waits
    cp.failure = ControlPlaneRejected(400, "at: is older than the telemetry retention")
    backlog.submit({"at": 2})  # refused for good (both): not kept, not raised, counted
    assert backlog.pending == 0 and backlog.rejected_total == 2


def test_an_agent_keeps_its_metrics_through_an_outage(tmp_path) -> None:
    """The agent's metrics (its heartbeat) during an outage reach the control plane afterwards, each with
    the time it was taken; the overflow shows on the agent's /metrics and in the next report."""
    received: list[dict] = []
    down = threading.Event()

    def control_plane(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/hosts/":
            return httpx.Response(200, json={"count": 1, "next": None, "results": [{"id": 7, "name": "gpu-host"}]})
        if down.is_set():
            raise httpx.ConnectError("connection refused", request=request)
        assert request.url.path == "/api/v1/hosts/7/metrics/"
        received.append(json.loads(request.content))
        return httpx.Response(201, json={"runtime_samples": 0, "gpu_samples": 1})

    client = ControlPlaneClient("http://cp.invalid", "tsa_secret", transport=httpx.MockTransport(control_plane))
    exporter = AgentExporter(hostname="gpu-host")
    backend = SimulatedBackend(gpus="1xA100-SXM4-40GB", state_file=tmp_path / "gpus.json")
    agent = Agent(backend=backend, state_dir=tmp_path / "state", client=client, exporter=exporter, metrics_s=1.0)
    assert agent.metrics_backlog.capacity >= 600
    agent.metrics_backlog.capacity = 4  # a short buffer, to see it overflow
    try:
        agent.metrics_tick(1.0)
        down.set()
        taken = [agent.metrics_tick(1.0)["at"] for _ in range(6)]
        scrape = exporter.scrape().decode()
        assert "tessera_agent_reports_dropped_total 2.0" in scrape and "tessera_agent_reports_pending 4.0" in scrape
        down.clear()
        fresh = agent.metrics_tick(1.0)
    finally:
        agent.stop()
    assert len(received) == 6
    assert received[1]["at"] == fresh["at"] and received[1]["dropped_reports"] == 2
    assert [r["at"] for r in received[2:]] == taken[2:] and all("dropped_reports" not in r for r in received[2:])
    scrape = exporter.scrape().decode()
    assert "tessera_agent_reports_pending 0.0" in scrape and "tessera_agent_reports_sent_late_total 4.0" in scrape
