"""The load generator (workers/loadgen.py): arrivals burst where asked, budgets are the SLO less the
network, and a run against a real HTTP server counts what came back in time, late and failed, with the
budget each request was sent with in X-Tessera-Deadline-Ms."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from workers.loadgen import LoadTarget, load_budgets, load_run, load_run_targets, load_schedule


def test_the_schedule_bursts_where_asked_and_budgets_are_what_the_network_leaves() -> None:
    arrivals = load_schedule(rate_rps=20, duration_s=30, burst_at_s=10, burst_for_s=10, burst_rps=200, seed=1)
    per_second = np.bincount(arrivals.astype(int), minlength=30)
    assert per_second[10:20].mean() > 5 * per_second[:10].mean() and per_second[20:].mean() < 40
    long = load_schedule(rate_rps=20, duration_s=300, seed=1)
    budgets = load_budgets(long, slo_ms=20, payload_kb=4, rtt_ms=2, seed=1)
    assert len(budgets) == len(long) and budgets.max() < 18  # the round trip and some transfer always
    calm = load_budgets(long, slo_ms=20, payload_kb=4, rtt_ms=2, seed=1, dips=False)
    assert calm.min() > budgets.min()  # dips eat into some budgets
    with pytest.raises(ValueError):
        load_schedule(rate_rps=0, duration_s=1)


# The server answers 504 to a request sent with less than this left of its budget. The budgets below are seconds
# apart from it and from zero: a sender scheduled late on a loaded machine (a 2 ms budget was once gone before it
# was sent, and counted expired instead of late) still sends each as its case needs.
LATE_BELOW_MS = 5_000.0


class _Handler(BaseHTTPRequestHandler):
    seen: list[float] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        budget = float(self.headers["X-Tessera-Deadline-Ms"])
        _Handler.seen.append(budget)
        status = 200 if budget >= LATE_BELOW_MS else 504
        variant = self.path.rsplit("/", 1)[-1]
        body = json.dumps({"outputs": [], "parameters": {"variant": variant, "routing_version": 7}} if status == 200 else {"error": {"status": 504, "code": "deadline_exceeded"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_run_counts_in_time_late_and_expired_against_a_real_server() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        arrivals = np.array([0.05, 0.1, 0.2, 1.1, 1.2])
        budgets = np.array([20_000.0, 2_500.0, -1.0, 20_000.0, 20_000.0])
        result = load_run(f"http://127.0.0.1:{server.server_address[1]}/v1/infer/x", b"{}", arrivals, budgets, concurrency=4)
    finally:
        server.shutdown()
    totals = result.totals
    assert totals == {"sent": 4, "ok": 3, "late": 1, "errors": 0, "expired": 1}
    assert [s.second for s in result.seconds] == [0, 1]
    assert max(_Handler.seen) <= 20_000.0 and min(_Handler.seen) <= 2_500.0  # each sent with what was left of its budget


def test_several_targets_share_one_clock_and_every_request_is_kept_as_the_client_saw_it() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/infer"
    try:
        results = load_run_targets([LoadTarget("a", f"{url}/a", b"{}", [0.05, 0.3], [20_000.0, 2_500.0]),
                                    LoadTarget("b", f"{url}/b", b"{}", [0.1, 0.2], [-1.0, 20_000.0])], concurrency=4, record=True)
    finally:
        server.shutdown()
    a, b = results["a"].queries, results["b"].queries
    assert [(q.status, q.in_time, q.variant, q.routing_version) for q in a] == [(200, True, "a", 7), (504, False, "", None)]
    assert [q.status for q in b] == [-1, 200] and b[1].variant == "b" and not b[0].in_time  # no budget left when due: not sent
    assert all(q.latency_ms > 0 for q in a + b[1:]) and a[0].sent_s >= a[0].arrival_s
    assert results["a"].totals == {"sent": 2, "ok": 1, "late": 1, "errors": 0, "expired": 0}
    with pytest.raises(ValueError):
        load_run_targets([LoadTarget("a", url, b"", [0.1], [1.0]), LoadTarget("a", url, b"", [0.1], [1.0])])
