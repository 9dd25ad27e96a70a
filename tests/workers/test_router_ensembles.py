"""Random ensembles at the router (issue 20; Garrison §3): real runtime processes running four small ONNX
classifiers; the router draws each query's members, sends the query to them at once, and answers with the
weighted vote of those that answered by the deadline, checked against onnxruntime's own numbers; the
frequency table follows the sampling probabilities; a learned policy (ONNX) picks the members; a member
that cannot answer in time is left out, never waited for; and the report carries the counts the planner
and the dashboard read."""
from __future__ import annotations

import copy

import httpx
import numpy as np
import pytest

from engine.ensembles.export import policy_mlp_write
from engine.ensembles.scheduler import SchedulerSpec
from engine.ensembles.vote import ensemble_vote
from tests.onnx_builders import onnx_mlp_bytes
from tests.waiting import wait_for
from tests.workers.dataplane_helpers import runtime_spec, runtime_start
from workers.router import Router, router_start_in_thread
from workers.runtime.session import OnnxSession
from workers.wire import request_encode, response_decode

pytestmark = pytest.mark.timeout(300)

MEMBERS = ("m0", "m1", "m2", "m3")
PROBABILITIES = {"m0": 0.4, "m1": 0.3, "m2": 0.2, "m3": 0.1}
WEIGHTS = {"m0": 2.0, "m1": 1.0, "m2": 1.0, "m3": 0.5}


@pytest.fixture(scope="module")
def models() -> dict[str, bytes]:
    return {m: onnx_mlp_bytes(hidden=8 + 4 * i, seed=10 + i, probabilities=True) for i, m in enumerate(MEMBERS)}


@pytest.fixture(scope="module")
def runtimes(models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ensemble-runtimes")
    started = {}
    try:
        for k, name in enumerate(MEMBERS):
            path = workdir / f"{name}.onnx"
            path.write_bytes(models[name])
            spec = runtime_spec(key=f"cpu0/{k}", application="defend", variant=name, instance=f"host/cpu0/{k}", artifact_path=str(path))
            started[name] = runtime_start(spec, workdir, name)
        yield started
    finally:
        for rt in started.values():
            rt.stop()


def _table(runtimes, ensemble: dict | None, *, slo_ms: float = 5000.0, endpoints: dict | None = None) -> list[dict]:
    endpoints = endpoints or {m: runtimes[m].endpoint for m in MEMBERS}
    return [{"id": 1, "application": "defend", "version": 1, "active": True, "slo_ms": slo_ms, "drop_rule": "deadline",
             "routes": [{"instance": f"host/cpu0/{k}", "variant": m, "weight": 1.0, "endpoint": endpoints[m], "state": "ready"}
                        for k, m in enumerate(MEMBERS)],
             "pipeline": None, "ensemble": copy.deepcopy(ensemble)}]


def _ensemble(**extra) -> dict:
    return {"mode": "random", "members": [{"variant": m, "variant_id": 20 + i, "probability": PROBABILITIES[m], "weight": WEIGHTS[m]}
                                          for i, m in enumerate(MEMBERS)], "min_size": 2, "max_size": 2, "vote": "soft", **extra}


@pytest.fixture
def serve():
    handles = []

    def start(tables):
        reports: list[dict] = []
        router = Router(lambda: copy.deepcopy(tables), reports.append, refresh_s=0.2, report_s=0.2, name="ensemble-router")
        handle = router_start_in_thread(router)
        handles.append(handle)
        return router, handle.url, reports

    yield start
    for handle in handles:
        handle.stop()


def _ask(url: str, x: np.ndarray, *, binary: bool = False, request_id: str | None = None) -> httpx.Response:
    body, header_length = request_encode({"x": x}, binary=binary, binary_outputs=binary, request_id=request_id)
    headers = {"content-type": "application/octet-stream" if binary else "application/json"}
    if header_length is not None:
        headers["inference-header-content-length"] = str(header_length)
    return httpx.post(f"{url}/v2/models/defend/infer", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_each_query_is_answered_by_the_weighted_vote_of_its_drawn_members(runtimes, models, serve, binary) -> None:
    router, url, _ = serve(_table(runtimes, _ensemble()))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    single = {m: OnnxSession(models[m]).run({"x": x}) for m in MEMBERS}
    pairs = set()
    for i in range(20):
        response = _ask(url, x, binary=binary, request_id=f"q{i}")
        assert response.status_code == 200, response.text
        header_length = response.headers.get("inference-header-content-length")
        doc, outputs = response_decode(response.content, int(header_length) if header_length else None)
        assert doc["id"] == f"q{i}" and doc["model_name"] == "defend"
        voted = doc["parameters"]["ensemble"]["voted"]
        assert len(voted) == 2 and response.headers["x-tessera-variant"] == "+".join(voted)
        pairs.add(tuple(voted))
        for name in ("logits", "probabilities"):
            expected = ensemble_vote({m: single[m][name] for m in voted}, WEIGHTS, "soft").scores
            np.testing.assert_allclose(outputs[name], expected, rtol=1e-5, atol=1e-6)
    assert len(pairs) >= 3  # random per query
    # Every member's answers are counted at its own instance (the protocol's statistics).
    stats = httpx.get(f"{url}/v2/models/defend/stats", timeout=10).json()
    assert stats["model_stats"]


def test_the_hard_vote_is_the_weighted_plurality(runtimes, models, serve) -> None:
    router, url, _ = serve(_table(runtimes, _ensemble(vote="hard", min_size=4, max_size=4)))
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    response = _ask(url, x)
    assert response.status_code == 200, response.text
    _doc, outputs = response_decode(response.content)
    single = {m: OnnxSession(models[m]).run({"x": x})["probabilities"] for m in MEMBERS}
    expected = ensemble_vote(single, WEIGHTS, "hard")
    np.testing.assert_allclose(outputs["probabilities"], expected.scores, atol=1e-6)


def test_the_frequency_table_follows_the_probabilities_and_reports_reach_the_control_plane(runtimes, serve) -> None:
    router, url, reports = serve(_table(runtimes, _ensemble(min_size=1, max_size=1)))
    x = np.zeros((2, 4), dtype=np.float32)
    for _ in range(300):
        assert _ask(url, x).status_code == 200
    ensemble = router.tables.apps["defend"].ensemble
    frequencies = ensemble.frequencies.frequencies()
    for m, p in PROBABILITIES.items():
        assert abs(frequencies[m] - p) < 0.08, frequencies
    assert ensemble.frequencies.queries == 300  # kept across the table refreshes

    def defend_entries() -> list[dict]:
        return [a for r in list(reports) for a in r["applications"] if a["application"] == "defend"]

    # The router reports on its own clock: wait for the report that holds the last query (not a fixed sleep).
    wait_for(lambda: sum(e.get("query_sizes", {}).get("2", 0) for e in defend_entries()) >= 300, timeout_s=10, what="the reports of 300 queries")
    entries = defend_entries()
    assert sum(e.get("query_sizes", {}).get("2", 0) for e in entries) == 300
    counted = [block for e in entries for block in e.get("ensembles", ())]
    assert sum(c["queries"] for c in counted) == 300 and counted[0]["scheduler"].startswith("random ensemble")
    assert sum(c["sizes"].get("1", 0) for c in counted) == 300


def test_a_learned_policy_picks_the_members(runtimes, serve, tmp_path, monkeypatch) -> None:
    spec = SchedulerSpec(MEMBERS, (1, 3, 7, 15, 31, 63), 16, 5000.0, 64)
    out = np.zeros((4, 8), dtype=np.float32)
    policy_mlp_write(tmp_path / "favour-m2-m3", [(np.zeros((8, spec.feature_count)), np.zeros(8)), (out, np.array([-9.0, -9.0, 9.0, 9.0]))], spec)
    monkeypatch.setenv("TESSERA_SCHEDULER_DIR", str(tmp_path))
    router, url, _ = serve(_table(runtimes, _ensemble(mode="learned", scheduler="favour-m2-m3")))
    x = np.zeros((1, 4), dtype=np.float32)
    voted = [tuple(_ask(url, x).json()["parameters"]["ensemble"]["voted"]) for _ in range(10)]
    assert all(v == ("m2", "m3") for v in voted), voted
    assert router.tables.apps["defend"].ensemble.scheduler_note == "learned (favour-m2-m3)"


def test_a_missing_learned_policy_falls_back_to_the_random_ensemble_and_says_so(runtimes, serve, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TESSERA_SCHEDULER_DIR", str(tmp_path))
    router, url, _ = serve(_table(runtimes, _ensemble(mode="learned", scheduler="nowhere")))
    assert _ask(url, np.zeros((1, 4), dtype=np.float32)).status_code == 200
    note = router.tables.apps["defend"].ensemble.scheduler_note
    assert note.startswith("random ensemble") and "could not be loaded" in note


def test_a_member_that_cannot_answer_in_time_is_left_out_and_never_delays_the_answer(runtimes, serve) -> None:
    import socket
    import threading

    # m3's route points at a server that accepts and never answers: the ensemble answers at the deadline without it.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted = []
    threading.Thread(target=lambda: [accepted.append(silent.accept()) for _ in range(16)], daemon=True).start()
    endpoints = {m: runtimes[m].endpoint for m in MEMBERS}
    endpoints["m3"] = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    router, url, _ = serve(_table(runtimes, _ensemble(min_size=4, max_size=4), slo_ms=300.0, endpoints=endpoints))
    import time

    started = time.monotonic()
    response = _ask(url, np.zeros((1, 4), dtype=np.float32))
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    ensemble = response.json()["parameters"]["ensemble"]
    assert ensemble["chosen"] == list(MEMBERS) and ensemble["voted"] == ["m0", "m1", "m2"]
    assert elapsed < 1.5  # the SLO (0.3 s) and some slack, never the upstream grace (2 s)
    silent.close()


def test_a_malformed_ensemble_block_keeps_the_previous_table(runtimes, serve) -> None:
    tables = _table(runtimes, _ensemble())
    router, url, _ = serve(tables)
    bad = copy.deepcopy(tables)
    bad[0]["version"] = 2
    bad[0]["ensemble"]["members"][0]["probability"] = 2.0
    router.tables_apply(bad)
    assert router.tables.apps["defend"].version == 1  # the bad table is ignored, the good one kept


def test_a_member_s_instance_is_chosen_by_garrison_s_normalised_usage_time(runtimes, serve) -> None:
    """§5.3 at the router: a member with a GI(1) and a GI(4) instance (their names say so), both idle and
    both within the deadline, has its queries matched to the GI(1): a millisecond there costs a quarter."""
    ensemble = {"mode": "random", "members": [{"variant": "m0", "variant_id": 20, "probability": 1.0, "weight": 1.0},
                                              {"variant": "m1", "variant_id": 21, "probability": 0.0, "weight": 1.0}],
                "min_size": 1, "max_size": 1, "vote": "soft"}
    table = _table(runtimes, ensemble)
    table[0]["routes"] = [{"instance": f"host/gpu0/{slot}", "variant": "m0", "weight": 1.0, "endpoint": runtimes["m0"].endpoint, "state": "ready"}
                          for slot in ("4g.40gb@0", "1g.10gb@4")]
    router, url, _ = serve(table)
    for _ in range(10):
        assert _ask(url, np.zeros((4, 4), dtype=np.float32)).status_code == 200
    counted = {instance: row[0] for (variant, instance, _sim), row in router.stats.application("defend").per_instance.items()}
    assert counted == {"host/gpu0/1g.10gb@4": 10}, counted


def test_the_report_counts_each_draw_under_the_scheduler_that_made_it() -> None:
    """A policy change within an interval: the draws before it stay under the scheduler that made them, one
    block each, and the next interval starts empty (issue 38)."""
    from workers.metrics import ApplicationStats

    stats = ApplicationStats("defend")
    stats.ensemble_answered(("m1", "m2"), ("m1",), "random ensemble (2..2)")
    stats.ensemble_answered(("m2", "m3"), ("m2", "m3"), "random ensemble (2..2)")
    stats.ensemble_answered(("m3",), ("m3",), "learned (favour-m3)")
    blocks = {b["scheduler"]: b for b in stats.snapshot_and_reset(1)["ensembles"]}
    assert blocks["random ensemble (2..2)"] == {"scheduler": "random ensemble (2..2)", "queries": 2, "chosen": {"m1": 1, "m2": 2, "m3": 1},
                                                "voted": {"m1": 1, "m2": 1, "m3": 1}, "sizes": {"2": 2}}
    assert blocks["learned (favour-m3)"]["queries"] == 1 and blocks["learned (favour-m3)"]["sizes"] == {"1": 1}
    assert "ensembles" not in stats.snapshot_and_reset(1)
    stats.ensemble_answered(("m1",), (), "x" * 300)  # a fallback's note may be long: kept to what the control plane takes
    assert [len(b["scheduler"]) for b in stats.snapshot_and_reset(1)["ensembles"]] == [200]
