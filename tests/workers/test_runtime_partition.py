"""The runtime process serving an MPS partition (issue 17; gpulets ATC'22 §4.2-4.3, temporal sharing): a
partition spec's parsing and its errors, the turn scheduler between the partition's batchers (at most one
batch at a time, round-robin, the service time the policies observe without the wait for the turn), and a
real partition process on two ONNX models built here (each model answers its own queries with its own
outputs; wrong model, unknown instance, per-key health, stats and metrics; drain)."""
from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import FrameClient, RuntimeProcess, frame_call, runtime_spec, runtime_start
from tests.workers.test_router import TableSource, serve, table  # noqa: F401 (serve is a fixture)
from tests.workers.test_router import query as router_query
from workers.runtime.partition import PartitionRounds, PartitionTurns
from workers.runtime.server import PartitionSpec, RuntimeServer, RuntimeSpec, RuntimeSpecError, spec_from_dict, spec_load
from workers.runtime.session import OnnxSession
from workers.runtime.simulated import SimulatedSession
from engine.simulation.simulator import DROPPED_EXPIRED
from workers.wire import request_encode, response_decode

pytestmark = pytest.mark.timeout(240)

PARTITION = "gpu0/mps60@0"
HOST_PARTITION = f"test-host/{PARTITION}"
A, B = f"{PARTITION}/0", f"{PARTITION}/1"
# What a single-model runtime's health answers (tests/workers/test_runtime_server.py): a partition's keyed
# health answers exactly these.
HEALTH_FIELDS = {"id", "status", "state", "key", "application", "variant", "instance", "simulated", "providers", "max_batch",
                 "queue_length", "in_flight", "pid", "uptime_s", "counters"}


def model_spec(slot: int, **overrides: Any) -> dict[str, Any]:
    spec = runtime_spec(key=f"{PARTITION}/{slot}", instance=f"{HOST_PARTITION}/{slot}", application=f"app-{slot}", variant=f"variant-{slot}")
    spec.update(overrides)
    return spec


def partition_spec(models: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"key": PARTITION, "partition_percent": 60, "duty_cycle_ms": 40.0, "device_uuid": None,
                            "instance": HOST_PARTITION, "models": models}
    spec.update(overrides)
    return spec


def simulated_model(slot: int, latency_ms: float, **overrides: Any) -> dict[str, Any]:
    return model_spec(slot, simulated=True, max_batch=1, profile=[{"batch": 1, "latency_ms": latency_ms}],
                      batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never", "queue_order": "fifo",
                                "slo_ms": 60_000.0, "margin_ms": 1.0}, **overrides)


def infer(i: Any, **extra: Any) -> dict:
    return {"op": "infer", "id": i, "deadline_ms": 30_000.0, "content_type": "application/json", "header_length": None,
            "routing_version": 3, **extra}


def reference(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    return OnnxSession(model_bytes).run({"x": x})["logits"]


# --------------------------------------------------------------------------- the spec


def test_partition_spec_parsing(tmp_path: Path) -> None:
    raw = partition_spec([model_spec(0, artifact_path="/a.onnx"), model_spec(1, artifact_path="/b.onnx", instance=None, device_uuid="GPU-1")])
    spec = spec_from_dict(raw)
    assert isinstance(spec, PartitionSpec)
    assert spec.key == PARTITION and spec.partition_percent == 60 and spec.duty_cycle_ms == 40.0 and spec.instance == HOST_PARTITION
    assert [m.key for m in spec.models] == [A, B] and all(isinstance(m, RuntimeSpec) for m in spec.models)
    # A model without an instance is the partition's instance and its slot; the models run on one GPU.
    assert [m.instance for m in spec.models] == [f"{HOST_PARTITION}/0", f"{HOST_PARTITION}/1"]
    assert spec.device_uuid == "GPU-1" and {m.device_uuid for m in spec.models} == {"GPU-1"}
    assert spec_load(spec.dump(tmp_path / "partition.json")) == spec
    # Without "models": the single-model spec, unchanged.
    (tmp_path / "single.json").write_text(json.dumps(model_spec(0, artifact_path="/a.onnx")))
    assert spec_load(tmp_path / "single.json") == RuntimeSpec.from_dict(model_spec(0, artifact_path="/a.onnx"))
    # The desired state's per-model fields, when passed on, agree with the partition.
    assert spec_from_dict(partition_spec([model_spec(0, artifact="/a", mps_percent=60, duty_cycle_ms=40.0)])).models[0].key == A


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (partition_spec([]), "'models' must be a non-empty list"),
        (partition_spec({"key": A}), "'models' must be a non-empty list"),
        (partition_spec([model_spec(0, artifact="/a"), model_spec(1, artifact="/b", key=A, instance="x")]),
         "models[0] and models[1] have the same key 'gpu0/mps60@0/0'"),
        (partition_spec([model_spec(0, artifact="/a", key="gpu0/mps40@1/0")]), "key 'gpu0/mps40@1/0' is not 'gpu0/mps60@0/<slot>'"),
        (partition_spec([model_spec(0, artifact="/a", key=PARTITION)]), "key 'gpu0/mps60@0' is not 'gpu0/mps60@0/<slot>'"),
        (partition_spec([model_spec(0, artifact="/a", key=f"{PARTITION}/01")]), "is not 'gpu0/mps60@0/<slot>' (slot 0, 1, 2, ...)"),
        (partition_spec([model_spec(0, artifact="/a", key=f"{PARTITION}/first")]), "is not 'gpu0/mps60@0/<slot>'"),
        (partition_spec([model_spec(0, artifact="/a")], partition_percent=0), "'partition_percent' must be an integer in 1..100, got 0"),
        (partition_spec([model_spec(0, artifact="/a")], partition_percent=101), "in 1..100, got 101"),
        (partition_spec([model_spec(0, artifact="/a")], partition_percent=True), "in 1..100, got True"),
        (partition_spec([model_spec(0, artifact="/a")], partition_percent="60"), "in 1..100, got '60'"),
        (partition_spec([model_spec(0, artifact="/a")], partition_percent=40), "key 'gpu0/mps60@0' names mps60 but 'partition_percent' is 40"),
        (partition_spec([model_spec(0, artifact="/a", device_uuid="GPU-1"), model_spec(1, artifact="/b", device_uuid="GPU-2")]),
         "the models of a partition run on one GPU, but they name 2 (gpu0/mps60@0/0: GPU-1, gpu0/mps60@0/1: GPU-2)"),
        (partition_spec([model_spec(0, artifact="/a", device_uuid="GPU-1")], device_uuid="GPU-9"), "partition: GPU-9, gpu0/mps60@0/0: GPU-1"),
        (partition_spec([model_spec(0, artifact="/a")], duty_cycle_ms=-5), "'duty_cycle_ms' must be a finite number > 0 or null"),
        (partition_spec([model_spec(0, artifact="/a"), model_spec(1)]), "partition spec models[1]: spec: a runtime that is not simulated needs"),
        (partition_spec([model_spec(0, artifact="/a", mps_percent=40)]), "models[0] (gpu0/mps60@0/0): mps_percent 40 is not the partition's 60"),
        (partition_spec([model_spec(0, artifact="/a", instance="h/x"), model_spec(1, artifact="/b", instance="h/x")]),
         "gpu0/mps60@0/0 and gpu0/mps60@0/1 have the same instance 'h/x'"),
        (partition_spec([model_spec(0, artifact="/a")], key=""), "'key' must be a non-empty string"),
    ],
)
def test_partition_spec_errors(raw: dict, message: str) -> None:
    with pytest.raises(RuntimeSpecError) as err:
        spec_from_dict(raw)
    assert message in str(err.value)


def test_a_spec_without_models_is_not_a_partition() -> None:
    with pytest.raises(RuntimeSpecError, match="'models' must be a non-empty list"):
        PartitionSpec.from_dict({"key": PARTITION, "partition_percent": 60})


# --------------------------------------------------------------------------- the turns


def test_turns_are_granted_first_come_first_served() -> None:
    turns = PartitionTurns(["a", "b", "c"], duty_cycle_ms=1.0, record=True)
    granted: list[str] = []

    def take(key: str) -> None:
        with turns.turn(key):
            granted.append(key)
            time.sleep(0.002)

    threads = []
    with turns.turn("a"):
        assert turns.holder == "a"
        for key in ("c", "b", "a"):  # asked in this order while "a" runs
            thread = threading.Thread(target=take, args=(key,))
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 10
            while key not in turns.waiting() and time.monotonic() < deadline:
                time.sleep(0.001)
        assert turns.waiting() == ["c", "b", "a"]
        time.sleep(0.01)
    for thread in threads:
        thread.join(10)
    assert granted == ["c", "b", "a"] and turns.holder is None and turns.waiting() == []
    assert [k for k, _g, _r in turns.timeline] == ["a", "c", "b", "a"]
    # "c" waited the 10 ms of the first turn, more than the 1 ms duty cycle: the plan's promise, broken, counted.
    assert turns.counters("c")["over_duty_cycle"] == 1 and turns.counters("c")["wait_ms_max"] >= 9.0
    assert turns.counters("a")["turns"] == 2 and turns.counters("a")["run_ms_total"] >= 10.0
    with pytest.raises(KeyError):
        with turns.turn("z"):
            pass


def _until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.0005)


def test_two_busy_batchers_take_turns_one_batch_at_a_time() -> None:
    # Two threads that always have a batch ready: each turn lasts until the other is in line (or done), so
    # the order is the scheduler's, not the threads' timing. A lock without a line (threading.Lock) would
    # let the thread that just released take the turn straight back.
    turns = PartitionTurns(["a", "b"], duty_cycle_ms=100.0, record=True)
    done = {"a": 0, "b": 0}

    def busy(key: str, other: str) -> None:
        for _ in range(8):
            with turns.turn(key):
                _until(lambda: other in turns.waiting() or done[other] == 8)
                time.sleep(0.002)
                done[key] += 1

    threads = [threading.Thread(target=busy, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    keys = [k for k, _g, _r in turns.timeline]
    assert sorted(keys) == ["a"] * 8 + ["b"] * 8
    assert all(x != y for x, y in zip(keys, keys[1:])), keys  # round-robin
    assert all(g2 >= r1 for (_k1, _g1, r1), (_k2, g2, _r2) in zip(turns.timeline, turns.timeline[1:]))  # one at a time
    assert turns.counters("a")["turns"] == 8 and turns.counters("b")["wait_ms_max"] >= 1.5


class _EventLoopThread:
    """An event loop on its own thread, for a RuntimeServer started in this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class _ObservingPolicy:
    """A batching policy's stand-in that records what the batcher tells `observe` (and decides as the policy)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.observed: list[tuple[int, float, int]] = []

    def decide(self, *args: Any) -> Any:
        return self.policy.decide(*args)

    def observe(self, batch: int, latency_ms: float, late: int) -> None:
        self.observed.append((batch, latency_ms, late))
        self.policy.observe(batch, latency_ms, late)


@pytest.mark.parametrize("rounds", [True, False], ids=["duty-cycle-rounds", "work-conserving-turns"])
def test_a_partition_runs_one_batch_at_a_time_round_robin_and_observes_run_times(rounds: bool) -> None:
    """Two simulated models, 30 ms per batch of one, five queries each, A's first, B's once A runs: the runs
    never overlap and alternate A, B, A, B; the policies observe each run's time, not the wait for the turn
    (about as long again) on top; B's queries, given 45 ms, wait for A's batches and are late on the real
    clock. A run starts only once the other model is in line (or has nothing left), so the order is the
    scheduler's, not the worker threads' timing. With a duty cycle (60 ms) the plan's rounds drive the
    batchers: A's batches start a round apart, B's at its slot 30 ms (A's planned turn) into each round;
    without one the turns are work-conserving, and a model waits for the other's batch."""
    run_ms, n = 30.0, 5
    spec = PartitionSpec.from_dict(partition_spec([simulated_model(0, run_ms), simulated_model(1, run_ms)],
                                                  duty_cycle_ms=2 * run_ms if rounds else None))
    runs: list[tuple[str, float, float]] = []  # (key, called, ended) per batch, in the order they ran
    ran = {A: 0, B: 0}

    def sleeper(key: str, other: str):
        def sleep(seconds: float) -> None:
            called = time.monotonic()
            _until(lambda: other in server.turns.waiting() or ran[other] == n)  # type: ignore[union-attr]
            time.sleep(seconds)
            runs.append((key, called, time.monotonic()))
            ran[key] += 1
        return sleep

    sessions = {A: SimulatedSession(spec.models[0].profile, 1, sleep=sleeper(A, B)),
                B: SimulatedSession(spec.models[1].profile, 1, sleep=sleeper(B, A))}
    server = RuntimeServer(spec, sessions=sessions, record_turns=True)
    policies = {}
    for model in server.models:
        policies[model.spec.key] = model.batcher.policy = _ObservingPolicy(model.batcher.policy)
    loops = _EventLoopThread()
    try:
        endpoint = loops.run(server.start("127.0.0.1", 0))
        client = FrameClient(endpoint)
        body, _ = request_encode({"anything": np.zeros(2, np.float32)})
        for i in range(n):
            client.send({"op": "infer", "id": f"a{i}", "key": A, "deadline_ms": 60_000.0}, body)
        _until(lambda: server.turns.holder == A)  # type: ignore[union-attr]
        for i in range(n):
            client.send({"op": "infer", "id": f"b{i}", "instance": f"{HOST_PARTITION}/1", "deadline_ms": 45.0}, body)
        answers = {rid: client.answer(rid)[0] for rid in [f"a{i}" for i in range(n)] + [f"b{i}" for i in range(n)]}
        assert all(a["status"] == 200 for a in answers.values()), answers
        assert {answers[f"a{i}"]["application"] for i in range(n)} == {"app-0"}
        assert {answers[f"b{i}"]["application"] for i in range(n)} == {"app-1"}
        health, _ = client.call({"op": "health", "id": "h"})
        client.close()
    finally:
        loops.run(server.shutdown(5.0))
        loops.stop()
    keys = [k for k, _c, _e in runs]
    assert keys == [A, B] * n, keys  # round-robin
    assert all(c2 >= e1 for (_k, _c1, e1), (_k2, c2, _e2) in zip(runs, runs[1:])), runs  # never two batches at once
    assert [k for k, _g, _r in server.turns.timeline] == keys  # type: ignore[union-attr]
    turns = {m["key"]: m["turns"] for m in health["models"]}
    for key in (A, B):
        observed = policies[key].observed
        assert len(observed) == n and all(b == 1 for b, _l, _late in observed)
        # The policy observed each batch's run, not the wait for the turn before it (>= most of a batch).
        run_times = [(e - c) * 1000.0 for k, c, e in runs if k == key]
        assert all(latency < run + 0.5 * run_ms for (_b, latency, _late), run in zip(observed, run_times)), (observed, run_times)
        assert turns[key]["turns"] == n
        if not rounds:  # work-conserving: the turn waited for the other model's batch
            assert turns[key]["wait_ms_max"] >= 0.8 * run_ms
    if rounds:
        assert isinstance(server.turns, PartitionRounds) and server.turns.rounds >= n
        starts = {key: [c for k, c, _e in runs if k == key] for key in (A, B)}
        # Slots are lower bounds on a loaded machine: a turn never comes before its slot (it may come late).
        assert all(b - a >= run_ms / 1000.0 - 0.002 for a, b in zip(starts[A], starts[B])), starts
        assert all(a2 - a1 >= 2 * run_ms / 1000.0 - 0.002 for a1, a2 in zip(starts[A], starts[A][1:])), starts
    else:
        assert isinstance(server.turns, PartitionTurns)
    # Deadlines on the real clock: B waited for A's batches and missed its 45 ms; A had a minute.
    assert sum(late for _b, _l, late in policies[A].observed) == 0
    assert sum(late for _b, _l, late in policies[B].observed) == n
    counters = {m["key"]: m["counters"] for m in health["models"]}
    assert counters[A]["late"] == 0 and counters[B]["late"] == n and counters[B]["served"] == n
    assert health["running"] is None and health["waiting"] == []


def test_a_partition_without_instances_resolves_any_hosts_instance_id_by_its_key() -> None:
    # No instance in the spec (a partition started by hand): the router's `<host>/<model key>` finds the model.
    raw = partition_spec([simulated_model(0, 1.0, instance=None), simulated_model(1, 1.0, instance=None)], instance=None)
    server = RuntimeServer(PartitionSpec.from_dict(raw))
    assert [m.instance for m in server.models] == [A, B]
    loops = _EventLoopThread()
    try:
        endpoint = loops.run(server.start("127.0.0.1", 0))
        body, _ = request_encode({"anything": np.zeros(2, np.float32)})
        reply, _ = frame_call(endpoint, infer(1, instance=f"some-host/{B}"), body)
        assert reply["status"] == 200 and reply["application"] == "app-1"
        reply, _ = frame_call(endpoint, infer(2, instance=f"some-host/{PARTITION}/2"), body)
        assert reply["status"] == 404 and reply["code"] == "unknown_instance"
        health, _ = frame_call(endpoint, {"op": "health"})
        assert health["instance"] == PARTITION and [m["counters"]["served"] for m in health["models"]] == [0, 1]
    finally:
        loops.run(server.shutdown(5.0))
        loops.stop()


# --------------------------------------------------------------------------- a partition process on two ONNX models


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, bytes]]:
    folder = tmp_path_factory.mktemp("partition-models")
    out = {}
    for key, (n_in, n_out, seed) in {A: (4, 3, 1), B: (6, 2, 2)}.items():
        data = onnx_mlp_bytes(n_in=n_in, hidden=8, n_out=n_out, seed=seed)
        path = folder / f"slot{key[-1]}.onnx"
        path.write_bytes(data)
        out[key] = (path, data)
    return out


@pytest.fixture(scope="module")
def partition(models, tmp_path_factory):
    spec = partition_spec([model_spec(0, artifact_path=str(models[A][0])), model_spec(1, artifact_path=str(models[B][0]))])
    rt = runtime_start(spec, tmp_path_factory.mktemp("partition"))
    yield rt
    assert rt.stop() == 0, rt.log()


def test_each_model_answers_its_own_queries_with_its_own_outputs(partition, models) -> None:
    rng = np.random.default_rng(5)
    client = FrameClient(partition.endpoint)
    try:
        sent = []
        for i in range(8):  # interleaved on one connection, all in flight at once
            key = A if i % 2 == 0 else B
            x = rng.normal(size=(1 + i % 3, 4 if key == A else 6)).astype(np.float32)
            body, _ = request_encode({"x": x}, request_id=f"q{i}")
            slot = key[-1]
            # The router names the fleet instance; a frame may name the runtime key instead.
            selector = {"instance": f"{HOST_PARTITION}/{slot}"} if i % 4 < 2 else {"key": key}
            client.send(infer(i, application=f"app-{slot}", variant=f"variant-{slot}", **selector), body)
            sent.append((key, x))
        for i, (key, x) in enumerate(sent):
            reply, reply_body = client.answer(i)
            slot = key[-1]
            assert reply["status"] == 200, reply_body
            assert reply["application"] == f"app-{slot}" and reply["variant"] == f"variant-{slot}" and reply["simulated"] is False
            doc, outputs = response_decode(reply_body)
            assert doc["model_name"] == f"app-{slot}" and doc["id"] == f"q{i}"
            assert doc["parameters"]["instance"] == f"{HOST_PARTITION}/{slot}"  # the frame's, else the model's own
            assert outputs["logits"].shape == (x.shape[0], 3 if key == A else 2)
            np.testing.assert_allclose(outputs["logits"], reference(models[key][1], x), atol=1e-5)
    finally:
        client.close()
    # Model B's inputs sent to model A are A's problem: 400, as on a single-model runtime.
    reply, _ = frame_call(partition.endpoint, infer("m", key=A), request_encode({"x": np.zeros((1, 6), np.float32)})[0])
    assert reply["status"] == 400 and reply["code"] == "malformed" and reply["application"] == "app-0"


def test_a_query_for_one_model_with_anothers_variant_is_refused_and_not_run(partition) -> None:
    before = {key: frame_call(partition.endpoint, {"op": "health", "key": key})[0]["counters"] for key in (A, B)}
    body, _ = request_encode({"x": np.zeros((1, 4), np.float32)})
    for expects in ({"application": "app-0", "variant": "variant-1"}, {"application": "app-1", "variant": "variant-1"}):
        reply, reply_body = frame_call(partition.endpoint, infer(1, instance=f"{HOST_PARTITION}/0", **expects), body)
        assert reply["status"] == 409 and reply["code"] == "wrong_model", reply
        assert reply["application"] == "app-0" and reply["variant"] == "variant-0"
        assert b"serves app-0/variant-0" in reply_body and b"outputs" not in reply_body
    after = {key: frame_call(partition.endpoint, {"op": "health", "key": key})[0]["counters"] for key in (A, B)}
    assert after == before  # nothing ran, on either model


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"key": f"{PARTITION}/7"}, "serves no model 'gpu0/mps60@0/7'; it serves gpu0/mps60@0/0, gpu0/mps60@0/1"),
        ({"instance": "other-host/gpu0/mps60@0/3"}, "serves no instance 'other-host/gpu0/mps60@0/3'"),
        # The models' instances are named in the spec: another host's id for the same key is not theirs.
        ({"instance": "other-host/gpu0/mps60@0/1"}, "serves no instance 'other-host/gpu0/mps60@0/1'; it serves test-host/"),
        ({}, "an infer frame names one by 'key'"),
    ],
)
def test_a_query_for_a_model_the_partition_does_not_serve_is_404(partition, selector: dict, message: str) -> None:
    before = frame_call(partition.endpoint, {"op": "health"})[0]["models"]
    reply, reply_body = frame_call(partition.endpoint, infer(2, **selector), request_encode({"x": np.zeros((1, 4), np.float32)})[0])
    assert reply["status"] == 404 and reply["code"] == "unknown_instance" and message in reply["message"], reply
    assert reply["application"] is None and reply["variant"] is None
    assert json.loads(reply_body)["error"]["code"] == "unknown_instance"
    after = frame_call(partition.endpoint, {"op": "health"})[0]["models"]
    assert [m["counters"] for m in after] == [m["counters"] for m in before]
    if selector:
        health, _ = frame_call(partition.endpoint, {"op": "health", **selector})
        assert health["status"] == 404 and health["code"] == "unknown_instance"


def test_health_stats_and_metrics_per_key_and_for_the_partition(partition) -> None:
    endpoint = partition.endpoint
    for key in (A, B):
        frame_call(endpoint, {"op": "stats", "key": key})  # start a fresh interval
    body_a, _ = request_encode({"x": np.zeros((1, 4), np.float32)})
    for i in range(3):
        assert frame_call(endpoint, infer(i, key=A), body_a)[0]["status"] == 200
    assert frame_call(endpoint, infer(9, key=B), request_encode({"x": np.zeros((1, 6), np.float32)})[0])[0]["status"] == 200

    for key, slot in ((A, "0"), (B, "1")):
        health, _ = frame_call(endpoint, {"op": "health", "id": "h", "key": key})
        assert set(health) == HEALTH_FIELDS, set(health) ^ HEALTH_FIELDS
        assert health["key"] == key and health["instance"] == f"{HOST_PARTITION}/{slot}" and health["application"] == f"app-{slot}"
        assert health["state"] == "ready" and health["id"] == "h" and "CPUExecutionProvider" in health["providers"]
    by_instance, _ = frame_call(endpoint, {"op": "health", "instance": f"{HOST_PARTITION}/1"})
    assert by_instance["key"] == B

    whole, _ = frame_call(endpoint, {"op": "health", "id": 0})
    assert whole["status"] == 200 and whole["key"] == PARTITION and whole["instance"] == HOST_PARTITION
    assert whole["partition_percent"] == 60 and whole["duty_cycle_ms"] == 40.0 and whole["simulated"] is False
    assert [m["key"] for m in whole["models"]] == [A, B]
    assert set(whole["models"][0]) == HEALTH_FIELDS - {"id", "status"} | {"turns"}
    assert whole["models"][0]["turns"]["turns"] >= 3 and whole["in_flight"] == 0

    stats_a, _ = frame_call(endpoint, {"op": "stats", "key": A})
    assert stats_a["stats"]["key"] == A and stats_a["stats"]["arrivals"] == 3 and stats_a["stats"]["served"] == 3
    stats_b, _ = frame_call(endpoint, {"op": "stats", "key": B})
    assert stats_b["stats"]["application"] == "app-1" and stats_b["stats"]["arrivals"] == 1
    both, _ = frame_call(endpoint, {"op": "stats"})
    assert [item["key"] for item in both["models"]] == [A, B] and both["models"][0]["arrivals"] == 0  # reset per interval

    _, text_a = frame_call(endpoint, {"op": "metrics", "key": A})
    text_a = text_a.decode()
    assert f'instance="{HOST_PARTITION}/0",model="app-0",simulated="false",version="variant-0"' in text_a
    assert f'instance="{HOST_PARTITION}/1"' not in text_a
    _, text = frame_call(endpoint, {"op": "metrics"})
    text = text.decode()
    for slot in ("0", "1"):
        assert f'nv_inference_request_success{{instance="{HOST_PARTITION}/{slot}",model="app-{slot}"' in text
    assert text.count("# TYPE nv_inference_request_success counter") == 1


def test_drain_drains_every_model_of_the_partition(tmp_path: Path) -> None:
    # Two simulated models, 150 ms per batch, taking turns: two queries each keep the partition busy ~600 ms.
    rt = runtime_start(partition_spec([simulated_model(0, 150.0), simulated_model(1, 150.0)]), tmp_path)
    try:
        client = FrameClient(rt.endpoint)
        body, _ = request_encode({"anything": np.zeros(2, np.float32)})
        t0 = time.monotonic()
        for i in range(4):
            client.send(infer(i, key=A if i % 2 == 0 else B), body)
        time.sleep(0.05)
        drained, _ = frame_call(rt.endpoint, {"op": "drain", "id": "d", "timeout_ms": 60_000})
        assert drained == {"id": "d", "status": 200, "state": "drained"}
        assert time.monotonic() - t0 >= 0.55  # one batch at a time: 4 x 150 ms
        health, _ = frame_call(rt.endpoint, {"op": "health"})
        assert health["state"] == "draining" and health["in_flight"] == 0 and health["simulated"] is True
        assert [m["counters"]["served"] for m in health["models"]] == [2, 2]
        assert all(m["state"] == "draining" for m in health["models"])
        refused, _ = frame_call(rt.endpoint, infer(9, key=B), body)
        assert refused["status"] == 503 and refused["code"] == "draining" and refused["application"] == "app-1"
        for i in range(4):
            assert client.answer(i)[0]["status"] == 200
        client.close()
    finally:
        assert rt.stop() == 0, rt.log()


def test_a_partition_that_cannot_start_exits_2_naming_the_model(models, tmp_path: Path) -> None:
    cases = {
        "checksum": (partition_spec([model_spec(0, artifact_path=str(models[A][0])),
                                     model_spec(1, artifact_path=str(models[B][0]), sha256="0" * 64)]), "checksum mismatch"),
        "policy": (partition_spec([model_spec(0, artifact_path=str(models[A][0]), batching={"policy": "magic", "slo_ms": 10.0})]),
                   "spec field 'models[0].batching': unknown batching policy"),
        "slot": (partition_spec([model_spec(0, artifact_path=str(models[A][0]), key="gpu0/mps60@0")]), "is not 'gpu0/mps60@0/<slot>'"),
    }
    for name, (spec, message) in cases.items():
        rt = RuntimeProcess(spec, tmp_path, name)
        assert rt.proc.wait(120) == 2
        assert not rt.ready_file.exists()
        assert "tessera-runtime: error:" in rt.log() and message in rt.log(), rt.log()
        rt.stop()


# --------------------------------------------------------------------------- through a router


def partition_route(partition, slot: int, weight: float = 1.0, instance: str | None = None) -> dict:
    return {"instance": instance or f"{HOST_PARTITION}/{slot}", "variant": f"variant-{slot}", "weight": weight,
            "endpoint": partition.endpoint, "state": "ready"}


def test_a_router_reaches_each_model_of_a_partition_by_its_instance(partition, models, serve) -> None:
    # One endpoint, two instances: the router routes to each exactly as to any other instance.
    _, client = serve(TableSource([table([partition_route(partition, 0)], version=1, application="app-0"),
                                   table([partition_route(partition, 1)], version=1, application="app-1")]))
    for slot, key, n_in in (("0", A, 4), ("1", B, 6)):
        x = np.random.default_rng(int(slot)).normal(size=(1, n_in)).astype(np.float32)
        response = client.post(f"/v1/infer/app-{slot}", content=router_query(x), headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        assert response.json()["model_name"] == f"app-{slot}" and response.headers["x-tessera-variant"] == f"variant-{slot}"
        np.testing.assert_allclose(np.array(response.json()["outputs"][0]["data"]).reshape(1, -1), reference(models[key][1], x), atol=1e-5)


def test_a_route_to_an_instance_the_partition_does_not_serve_is_left_out_like_a_stale_one(partition, serve) -> None:
    stale = partition_route(partition, 0, weight=10, instance=f"{PARTITION}-gone/0")
    _, client = serve(TableSource([table([stale, partition_route(partition, 0)], version=4, application="app-0")]))
    for _ in range(10):
        response = client.post("/v1/infer/app-0", content=router_query(), headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text




# --------------------------------------------------------------------------- the simulator's rounds, live


def _rounds_replay(rates: dict[str, float], instances: list, seconds: float, seed: int = 3):
    """One 3-model partition, simulated, and served by the live rounds stepped on a virtual clock (each
    batch taking the latency the simulator uses). Returns (simulator result, live batches as (instance,
    start, global query ids, end) in start order, live drops as (global query id, time), rounds)."""
    from engine.dataplane.batching import batching_policy_make, policy_latency_function
    from engine.dataplane.rounds import round_batch_cap
    from engine.reference.gpulet_problem import gpulet_mps_problem
    from engine.simulation.simulator import SimulationConfig, simulate
    from engine.simulation.workload import arrivals_poisson
    from tests.engine.test_simulator_mps import _plan
    from workers.runtime.batcher import InstanceBatcher, VirtualClock
    from workers.runtime.partition import RoundMember

    problem = gpulet_mps_problem(rates, gpus=1)
    plan = _plan(problem, instances)
    trace = None
    for i, (model, rate) in enumerate(rates.items()):
        t = arrivals_poisson(rate, seconds, seed=seed + i, application=model)
        trace = t if trace is None else trace.merge(t)
    config = SimulationConfig(batching="nexus", replan_interval_s=None, burst_factor=None, initial_demand="problem",
                              noise_sigma=0.0, record_batches=True)
    sim = simulate(problem, trace, planner=lambda p: plan, config=config, interference=None)
    assert np.array_equal(sim.queries["arrival_ms"], trace.time_s * 1000.0)

    clock = VirtualClock()
    dtype = problem.devices[0].type
    members, member_of = [], {}
    for inst in plan.instances:
        points = problem.profiles_for(inst.variant, dtype, inst.slice)
        latency, _ = policy_latency_function(points, inst.batch)
        application = problem.variant(inst.variant).application
        batcher = InstanceBatcher(
            batching_policy_make("nexus"), latency_ms=latency, max_batch=inst.batch, execute=lambda payloads: payloads,
            drop_rule=config.drop_rule_for(application), slo_ms=problem.application(application).slo_ms,
            queue_order=config.queue_order, clock=clock, service_ms=latency, record_batches=True, round_driven=True)
        members.append(RoundMember(inst.id, batcher, inst.latency_ms, round_batch_cap(inst.batch, (p.batch for p in points))))
        member_of[application] = members[-1]
    rounds = PartitionRounds(members, instances[0].duty_cycle_ms, record=True)
    rounds.begin()  # at 0, when the simulator applies the plan
    global_ids: dict[str, list[int]] = {m.key: [] for m in members}  # per model: local query id -> global id
    futures = []
    for qid, (t, app) in enumerate(zip(sim.queries["arrival_ms"].tolist(), trace.application.tolist())):
        member = member_of[trace.applications[app]]
        global_ids[member.key].append(qid)
        futures.append(rounds.submit(member.key, qid, t))
    rounds.step_until(math.inf)
    rounds.close()
    batches, drops = [], []
    for m in members:
        m.batcher.close()
        ids = global_ids[m.key]
        batches += [(m.key, start, [ids[q] for q in local], end) for start, local, end in m.batcher.batches]
        drops += [(ids[q], t) for q, t in m.batcher.drops]
    assert all(f.done() for f in futures)
    batches.sort(key=lambda b: (b[1], b[0]))
    return sim, batches, sorted(drops), rounds


def test_the_live_rounds_make_the_simulators_decisions() -> None:
    """One implementation of the round (engine/dataplane/rounds.py): the live partition's rounds, stepped on
    a virtual clock, start the same batches of the same queries at the same times as the simulator, and
    drop the same queries, on three models time-sharing one partition at a load that makes Nexus drop."""
    from engine.plans.problem import PlanInstance

    rates = {"resnet50": 150.0, "mobilenet": 250.0, "vgg19": 60.0}
    duty = 80.0  # longer than the SLOs allow for some of the queries: Nexus drops those it cannot serve
    instances = [
        PlanInstance("gpu0", "mps100", 0, "resnet50", 8, 14.0, 160.0, rates["resnet50"], duty_cycle_ms=duty),
        PlanInstance("gpu0", "mps100", 0, "mobilenet", 16, 12.0, 320.0, rates["mobilenet"], duty_cycle_ms=duty),
        PlanInstance("gpu0", "mps100", 0, "vgg19", 4, 20.0, 80.0, rates["vgg19"], duty_cycle_ms=duty),
    ]
    sim, live, drops, rounds = _rounds_replay(rates, instances, seconds=4.0)
    sim_batches = sorted(((i, s, list(q), e) for i, s, q, e in sim.batches), key=lambda b: (b[1], b[0]))
    assert len(sim_batches) > 100 and rounds.rounds > 40
    assert live == sim_batches
    outcome = sim.queries["outcome"]
    sim_drops = sorted((q, sim.queries["done_ms"][q]) for q in np.flatnonzero(outcome == DROPPED_EXPIRED).tolist())
    assert sim_drops and drops == sim_drops  # the replay is only a strong check if some queries are dropped
    # One batch at a time on the partition.
    assert all(s2 >= e1 - 1e-9 for (_i, _s, _q, e1), (_i2, s2, _q2, _e2) in zip(live, live[1:]))
