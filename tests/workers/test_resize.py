"""In-place vertical scaling of CPU runtimes (issue 19; Sponge, Razavi's thesis P2): the runtime's `resize`
frame on real onnxruntime sessions (nothing lost under load, bad input refused with nothing changed, health
and stats reporting the new size, GPU runtimes and MPS partitions refusing), the Sponge signals in `stats`,
a simulated CPU runtime serving l(b, c); the agent resizing instead of restarting when only `cpu_threads` or
`vertical` change, and its fast loop (the controller called on what the runtimes measured, the host's core
budget kept)."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.vertical.controller import VerticalAction
from engine.vertical.sponge import VerticalLatency
from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import FrameClient, frame_call, runtime_spec, runtime_start
from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.desired import DesiredStateError, desired_state_parse
from workers.agent.supervisor import RuntimeProcess, RuntimeSupervisor
from workers.agent.vertical import RATE_HEADROOM, VerticalScaler, cores_share, cpus_assign
from workers.runtime.simulated import SimulatedSession
from workers.runtime.vertical import process_cpus
from workers.wire import request_encode

pytestmark = pytest.mark.timeout(240)

CPUS = sorted(process_cpus() or {0})
MODEL = {"gamma1": 8.0, "eps1": 2.0, "delta1": 0.5, "eta1": 1.0}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> tuple[Path, str]:
    data = onnx_mlp_bytes(n_in=16, hidden=64, n_out=3, seed=5)
    path = tmp_path_factory.mktemp("model") / "mlp.onnx"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def cpu_spec(model_file, **overrides: Any) -> dict[str, Any]:
    path, sha = model_file
    return runtime_spec(artifact_path=str(path), sha256=sha, max_batch=4, **overrides)


def infer(i: int, **extra: Any) -> dict:
    return {"op": "infer", "id": i, "deadline_ms": 30_000.0, "content_type": "application/json", "header_length": None, **extra}


BODY = request_encode({"x": np.zeros((1, 16), np.float32)})[0]


# --------------------------------------------------------------------------- the runtime


def test_resize_under_load_loses_nothing(model_file, tmp_path) -> None:
    rt = runtime_start(cpu_spec(model_file), tmp_path)
    try:
        statuses: list[int] = []
        stop = threading.Event()
        lock = threading.Lock()

        def client(n: int) -> None:  # closed loop: one query in flight per client
            conn = FrameClient(rt.endpoint)
            try:
                i = n * 1_000_000
                while not stop.is_set():
                    reply, _ = conn.call(infer(i), BODY)
                    with lock:
                        statuses.append(reply["status"])
                    i += 1
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        sizes = [(2, None), (1, [CPUS[-1]]), (len(CPUS), None), (1, None), (2, None), (1, [CPUS[0]])]
        replies = []
        for cores, cpus in sizes:
            cores = min(cores, len(CPUS))
            time.sleep(0.15)
            frame = {"op": "resize", "id": f"r{cores}", "cores": cores, "max_batch": 1 + cores}
            if cpus is not None:
                frame["cpus"] = cpus
            replies.append(frame_call(rt.endpoint, frame)[0])
        time.sleep(0.15)
        stop.set()
        for t in threads:
            t.join(30)
        assert all(r["status"] == 200 for r in replies), replies
        assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        health = frame_call(rt.endpoint, {"op": "health"})[0]
        assert health["counters"]["failed"] == 0 and health["counters"]["dropped"] == 0
        assert health["counters"]["served"] == len(statuses)
        assert health["cores"] == 1 and health["max_batch"] == 2 and health["resizes"] == len(sizes)
    finally:
        assert rt.stop() == 0, rt.log()


def test_health_and_stats_report_the_new_size_and_a_resize_back_is_prepared(model_file, tmp_path) -> None:
    rt = runtime_start(cpu_spec(model_file), tmp_path)
    try:
        health = frame_call(rt.endpoint, {"op": "health"})[0]
        assert health["cores"] == 1 and health["max_batch"] == 4 and health["max_batch_limit"] == 4 and health["vertical"] is None
        assert health["cpus"] == CPUS  # not pinned: the CPUs it was started with

        grow, _ = frame_call(rt.endpoint, {"op": "resize", "id": 1, "cores": 2, "max_batch": 2, "cpus": CPUS[:2]} if len(CPUS) >= 2
                             else {"op": "resize", "id": 1, "cores": 1, "max_batch": 2})
        want = min(2, len(CPUS))
        assert grow["status"] == 200 and grow["id"] == 1, grow
        assert grow["cores"] == want and grow["max_batch"] == 2 and grow["resize_ms"] > 0
        assert grow["prepared"] is (want == 1) and grow["affinity_error"] is None
        assert grow["cpus"] == CPUS[:want]
        health = frame_call(rt.endpoint, {"op": "health"})[0]
        assert health["cores"] == want and health["max_batch"] == 2 and health["cpus"] == CPUS[:want]
        stats = frame_call(rt.endpoint, {"op": "stats"})[0]["stats"]
        assert stats["cores"] == want and stats["max_batch"] == 2 and stats["cpus"] == CPUS[:want]
        assert frame_call(rt.endpoint, infer(5), BODY)[0]["status"] == 200

        back, _ = frame_call(rt.endpoint, {"op": "resize", "id": 2, "cores": 1})
        assert back["status"] == 200 and back["prepared"] is True and back["max_batch"] == 2  # unchanged when left out
        assert back["cpus"] == CPUS  # no cpus: back to the CPUs it was started with
        if len(CPUS) >= 2:  # every thread of the process follows the new set
            frame_call(rt.endpoint, {"op": "resize", "id": 3, "cores": 1, "cpus": [CPUS[1]]})
            status = Path(f"/proc/{rt.proc.pid}/task").iterdir()
            masks = {(task / "status").read_text().split("Cpus_allowed_list:")[1].split()[0] for task in status}
            assert masks == {str(CPUS[1])}
    finally:
        assert rt.stop() == 0, rt.log()


@pytest.mark.parametrize(("frame", "message"), [
    ({"cores": 0}, "'cores' must be an integer in 1.."),
    ({"cores": "2"}, "'cores' must be an integer"),
    ({"cores": True}, "'cores' must be an integer"),
    ({"cores": len(CPUS) + 1}, "cpu_oversubscribe"),
    ({"cores": 1, "max_batch": 0}, "'max_batch' must be an integer in 1..4"),
    ({"cores": 1, "max_batch": 5}, "'max_batch' must be an integer in 1..4"),
    ({"cores": 1, "cpus": []}, "non-empty list of distinct CPU ids"),
    ({"cores": 1, "cpus": [CPUS[0], CPUS[0]]}, "distinct"),
    ({"cores": 1, "cpus": [4096]}, "not among the CPUs"),
    ({"cores": 1, "cpus": CPUS + [4096]}, "not among the CPUs"),
    ({"cores": 1, "model": {"gamma1": -1.0, "eps1": 0, "delta1": 0, "eta1": 1}}, "'model'.gamma1"),
])
def test_bad_resize_answers_400_and_changes_nothing(runtime_shared, frame: dict, message: str) -> None:
    before = frame_call(runtime_shared.endpoint, {"op": "health"})[0]
    reply, body = frame_call(runtime_shared.endpoint, {"op": "resize", "id": 7, **frame})
    assert reply["status"] == 400 and reply["code"] == "bad_resize" and message in reply["message"], reply
    assert json.loads(body)["error"]["code"] == "bad_resize"
    after = frame_call(runtime_shared.endpoint, {"op": "health"})[0]
    for name in ("cores", "max_batch", "cpus", "resizes"):
        assert after[name] == before[name], name


@pytest.fixture(scope="module")
def runtime_shared(model_file, tmp_path_factory):
    rt = runtime_start(cpu_spec(model_file), tmp_path_factory.mktemp("shared"))
    yield rt
    assert rt.stop() == 0, rt.log()


def test_cpus_must_match_the_cores_unless_oversubscribed(model_file, tmp_path) -> None:
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    rt = runtime_start(cpu_spec(model_file), tmp_path / "a")
    try:
        reply = frame_call(rt.endpoint, {"op": "resize", "cores": 1, "cpus": CPUS[:2]})[0]
        assert reply["status"] == 400 and "one CPU per core" in reply["message"]
    finally:
        rt.stop()
    over = runtime_start(cpu_spec(model_file, cpu_oversubscribe=True), tmp_path / "b")
    try:
        reply = frame_call(over.endpoint, {"op": "resize", "cores": len(CPUS) + 2, "cpus": [CPUS[0]]})[0]
        assert reply["status"] == 200 and reply["cores"] == len(CPUS) + 2 and reply["cpus"] == [CPUS[0]], reply
        assert frame_call(over.endpoint, infer(1), BODY)[0]["status"] == 200
    finally:
        assert over.stop() == 0, over.log()


def test_gpu_runtimes_and_mps_partitions_refuse_to_resize(tmp_path) -> None:
    simulated = dict(simulated=True, profile=[{"batch": 1, "latency_ms": 1.0}], max_batch=1)
    gpu = runtime_start(runtime_spec(key="gpu0/3g.20gb@4", instance="h/gpu0/3g.20gb@4", **simulated), tmp_path / "gpu")
    part_key = "gpu0/mps60@0"
    partition = {"key": part_key, "partition_percent": 60, "duty_cycle_ms": None, "instance": f"h/{part_key}",
                 "models": [runtime_spec(key=f"{part_key}/0", instance=f"h/{part_key}/0", **simulated)]}
    mps = runtime_start(partition, tmp_path / "mps")
    try:
        reply = frame_call(gpu.endpoint, {"op": "resize", "id": 1, "cores": 1})[0]
        assert reply["status"] == 409 and reply["code"] == "not_cpu_runtime" and "GPU" in reply["message"], reply
        assert "cores" not in frame_call(gpu.endpoint, {"op": "health"})[0]  # a GPU runtime's health keeps its shape
        for frame in ({"key": f"{part_key}/0"}, {}):
            reply = frame_call(mps.endpoint, {"op": "resize", "id": 2, "cores": 1, **frame})[0]
            assert reply["status"] == 409 and reply["code"] == "not_cpu_runtime" and "partition" in reply["message"], reply
        reply = frame_call(mps.endpoint, {"op": "resize", "id": 3, "cores": 1, "key": f"{part_key}/9"})[0]
        assert reply["status"] == 404 and reply["code"] == "unknown_instance"
    finally:
        gpu.stop()
        mps.stop()


def test_stats_carry_the_rate_and_budgets_per_reader(tmp_path) -> None:
    # A simulated CPU instance, 200 ms per batch of one: queries queue behind each other.
    spec = runtime_spec(simulated=True, max_batch=1, profile=[{"batch": 1, "latency_ms": 200.0}],
                        batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never", "queue_order": "fifo", "slo_ms": 60_000.0})
    rt = runtime_start(spec, tmp_path)
    try:
        frame_call(rt.endpoint, {"op": "stats"})
        frame_call(rt.endpoint, {"op": "stats", "reader": "vertical"})
        conn = FrameClient(rt.endpoint)
        for i in range(4):
            conn.send(infer(i, deadline_ms=5000.0 + 1000.0 * i), BODY)
        time.sleep(0.1)
        vertical = frame_call(rt.endpoint, {"op": "stats", "reader": "vertical"})[0]["stats"]
        assert vertical["arrivals"] == 4 and vertical["rate_rps"] > 0 and vertical["cores"] == 1 and vertical["max_batch"] == 1
        budgets = vertical["budgets_ms"]
        # Three queued (what they have left now, tightest first), the one in the batch at its arrival budget.
        assert len(budgets) == 4, budgets
        assert budgets[:3] == sorted(budgets[:3]) and 5800 < budgets[0] < 6000 and 7800 < budgets[2] < 8000
        assert budgets[3] == 5000.0
        again = frame_call(rt.endpoint, {"op": "stats", "reader": "vertical"})[0]["stats"]
        assert again["arrivals"] == 0 and again["rate_rps"] == 0 and len(again["budgets_ms"]) <= 3  # a new interval; queued still count
        report = frame_call(rt.endpoint, {"op": "stats"})[0]["stats"]
        assert report["arrivals"] == 4 and report["rate_rps"] > 0  # the metrics interval was not disturbed by the other reader
        for i in range(4):
            assert conn.answer(i)[0]["status"] == 200
        conn.close()
    finally:
        assert rt.stop() == 0, rt.log()


def test_a_simulated_cpu_runtime_serves_sponge_latency(tmp_path) -> None:
    model = VerticalLatency(**MODEL)
    session = SimulatedSession([], 4, vertical=model, cores=2, sleep=lambda s: None)
    assert session.latency_ms(3) == pytest.approx(model.l(3, 2))
    vertical = {"model": {"gamma1": 200.0, "eps1": 0.0, "delta1": 0.0, "eta1": 1.0}, "min_cores": 1, "max_cores": 8, "policy": "sponge"}
    spec = runtime_spec(simulated=True, max_batch=1, profile=[], vertical=vertical, cpu_oversubscribe=True,
                        batching={"policy": "fixed", "params": {"size": 1}, "drop_rule": "never", "queue_order": "fifo", "slo_ms": 60_000.0})
    rt = runtime_start(spec, tmp_path)
    try:
        health = frame_call(rt.endpoint, {"op": "health"})[0]
        assert health["simulated"] is True and health["cores"] == 1
        assert health["vertical"] == {**vertical, "max_batch": None, "reserve_ms": 0.0}

        def served_ms() -> float:
            started = time.perf_counter()
            assert frame_call(rt.endpoint, infer(1), BODY)[0]["status"] == 200
            return (time.perf_counter() - started) * 1000.0

        assert served_ms() >= 195.0  # l(1, 1) = 201 ms
        reply = frame_call(rt.endpoint, {"op": "resize", "cores": 8})[0]
        assert reply["status"] == 200 and reply["vertical_model"] is True
        assert 20.0 <= served_ms() < 150.0  # l(1, 8) = 26 ms
    finally:
        assert rt.stop() == 0, rt.log()


# --------------------------------------------------------------------------- the agent: resize instead of restart

BATCHING = {"policy": "fixed", "params": {"size": 1}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 50.0}


def cpu_runtime(model_file, key: str = "cpu0/0", threads: int = 1, **extra: Any) -> dict:
    path, sha = model_file
    doc = {"key": key, "device": "cpu0", "placement": None, "cpu_threads": threads, "application": "tabular",
           "variant": {"id": 2, "name": "mlp", "artifact": {"id": 1, "sha256": sha, "size_bytes": path.stat().st_size, "download": str(path)}},
           "max_batch": 4, "batching": BATCHING, "profile": [{"batch": 1, "latency_ms": 1.0}, {"batch": 4, "latency_ms": 2.0}]}
    doc.update(extra)
    return doc


def desired_doc(version: int, *runtimes: dict) -> dict:
    return {"host": "test", "version": version, "gpus": [], "runtimes": list(runtimes)}


VERTICAL = {"model": {"gamma1": 60.0, "eps1": 0.0, "delta1": 0.0, "eta1": 1.0}, "min_cores": 1, "max_cores": 2, "policy": "sponge"}


def test_desired_vertical_block_is_checked(model_file) -> None:
    good = desired_doc(1, cpu_runtime(model_file, vertical=VERTICAL))
    runtime = desired_state_parse(json.loads(json.dumps(good))).runtimes[0]
    assert runtime.vertical.max_cores == 2 and runtime.batch_limit == 4
    # The block the control plane writes (engine.plans.problem.VerticalScaling.to_desired): a pipeline stage's.
    stage = {**VERTICAL, "policy": "biscale", "max_batch": 16, "reserve_ms": 12.5}
    runtime = desired_state_parse(desired_doc(1, cpu_runtime(model_file, vertical=stage))).runtimes[0]
    assert runtime.vertical.policy == "biscale" and runtime.vertical.reserve_ms == 12.5 and runtime.batch_limit == 16
    cases = [
        ({"vertical": {**VERTICAL, "min_cores": 3}}, "min_cores 3 is above max_cores 2"),
        ({"vertical": {**VERTICAL, "policy": "hpa"}}, "vertical.policy"),
        ({"vertical": {**VERTICAL, "model": {"gamma1": 1.0}}}, "vertical.model.eps1"),
        ({"vertical": {**VERTICAL, "extra": 1}}, "unknown field(s) extra"),
        ({"vertical": {**VERTICAL, "max_batch": 0}}, "vertical.max_batch"),
        ({"vertical": {**VERTICAL, "reserve_ms": -1}}, "vertical.reserve_ms"),
        ({"vertical": VERTICAL, "cpu_threads": 4}, "cpu_threads 4 is outside vertical min_cores..max_cores (1..2)"),
    ]
    for change, message in cases:
        bad = json.loads(json.dumps(good))
        bad["runtimes"][0].update(change)
        with pytest.raises(DesiredStateError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            desired_state_parse(bad)
    gpu = {**json.loads(json.dumps(good))["runtimes"][0], "key": "gpu0", "device": "gpu0", "cpu_threads": None}
    with pytest.raises(DesiredStateError, match="vertical is for CPU runtimes only"):
        desired_state_parse(desired_doc(1, gpu))


def test_fingerprints_leave_cpu_threads_and_vertical_to_resizes(model_file) -> None:
    one = desired_state_parse(desired_doc(1, cpu_runtime(model_file, threads=1))).runtimes[0]
    two = desired_state_parse(desired_doc(2, cpu_runtime(model_file, threads=2, vertical=VERTICAL))).runtimes[0]
    bigger = desired_state_parse(desired_doc(3, cpu_runtime(model_file, threads=2, max_batch=8))).runtimes[0]
    assert one.fingerprint == two.fingerprint and one.resize_fingerprint != two.resize_fingerprint
    assert bigger.fingerprint != one.fingerprint


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def agent_factory(tmp_path):
    made: list[Agent] = []

    def make(desired: Path, **kwargs: Any) -> Agent:
        backend = SimulatedBackend(gpus="", state_file=tmp_path / "state" / "simulated-gpus.json")
        agent = Agent(backend=backend, state_dir=tmp_path / "state", desired_file=desired, drain_timeout_s=2.0, **kwargs)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.vertical.stop()
    RuntimeSupervisor(tmp_path / "state").stop_all()


def test_reconcile_resizes_instead_of_restarting(tmp_path, agent_factory, model_file) -> None:
    desired = write(tmp_path / "desired.json", desired_doc(1, cpu_runtime(model_file, threads=1)))
    agent = agent_factory(desired, vertical_s=0)
    assert agent.step().converged
    record = agent.supervisor.observe()["cpu0/0"]
    pid = record.pid

    two = len(CPUS) >= 2
    write(desired, desired_doc(2, cpu_runtime(model_file, threads=2 if two else 1, vertical=VERTICAL)))
    seen = len(agent._operations)
    result = agent.step()
    assert result is not None and result.converged, result.errors
    running = agent.supervisor.observe()
    assert running["cpu0/0"].pid == pid  # the same process, resized in place
    ops = [(op.action, op.target, op.outcome) for op in agent._operations[seen:]]
    assert ops == [("runtime.resize", "cpu0/0", "ok")], ops
    assert "ms" in agent._operations[-1].detail
    health = agent.supervisor.call(running["cpu0/0"], "health")
    assert health["cores"] == (2 if two else 1) and health["vertical_model"] == VERTICAL["model"] and health["vertical"] is None
    # The record remembers the resize: the next pass (and a restarted agent) does nothing.
    assert agent.step() is None
    restarted = agent_factory(desired, vertical_s=0)
    result = restarted.step()
    assert result is not None and result.converged and not [op for op in restarted._operations if op.action.startswith("runtime.")]

    # The metrics report carries the runtime's size and the resize, without Sponge's signals.
    report = agent.metrics_tick(1.0)["runtimes"][0]
    assert report["cores"] == (2 if two else 1) and report["max_batch"] == 4
    assert [r["by"] for r in report["resizes"]] == ["desired"] and report["resizes"][0]["resize_ms"] > 0
    assert "budgets_ms" not in report and "rate_rps" not in report
    assert agent.metrics_tick(1.0)["runtimes"][0]["resizes"] == []

    # Anything else that changes still restarts.
    write(desired, desired_doc(3, cpu_runtime(model_file, threads=1, max_batch=2)))
    assert agent.step().converged
    assert agent.supervisor.observe()["cpu0/0"].pid != pid


def test_the_fast_loop_grows_a_vertical_runtime_from_what_it_measured(tmp_path, agent_factory, model_file) -> None:
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    # Five queries with 100 ms each arrived in the interval (answered by the tick: none queued). Each new one
    # must fit the worst it meets, a batch in service and then its own, 2 l(b, c): on one core l(1, 1) = 61 ms
    # makes that 122 ms, over its 100; on two, 2 x 31 = 62 ms fits.
    desired = write(tmp_path / "desired.json", desired_doc(1, cpu_runtime(model_file, threads=1, vertical=VERTICAL)))
    agent = agent_factory(desired, vertical_s=0)  # ticked by hand; no control plane at all: local state only
    assert agent.step().converged
    record = agent.supervisor.observe()["cpu0/0"]
    agent.vertical.tick()  # idle: nothing measured, the size is kept (it is pinned to CPUs of its own)
    assert agent.supervisor.call(record, "health")["cores"] == 1
    conn = FrameClient(record.endpoint)
    for i in range(5):
        conn.call(infer(i, deadline_ms=100.0), BODY)
    conn.close()
    time.sleep(1.0)  # the loop's interval: the rate is 5 queries over about a second
    resized = agent.vertical.tick()
    assert [r["cores"] for r in resized] == [2], resized
    assert agent.vertical.last_actions["cpu0/0"].status == "optimal"
    health = agent.supervisor.call(record, "health")
    assert health["cores"] == 2 and health["cpus"] == CPUS[:2]
    ops = [op for op in agent._operations if op.action == "runtime.resize"]
    assert ops and ops[-1].outcome == "ok" and "(vertical) optimal" in ops[-1].detail


# --------------------------------------------------------------------------- the fast loop, with fakes


class FakeRuntimes:
    """Runtimes answering `stats` and `resize` from a table, and the supervisor the scaler reads them from."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = {k: {"cores": v, "max_batch": 4, "cpus": None} for k, v in sizes.items()}
        self.frames: list[tuple[str, dict]] = []
        self.budget_seen: list[int] = []

    def running(self) -> dict[str, RuntimeProcess]:
        return {k: RuntimeProcess(k, FINGERPRINTS[k], "s", "r", "l", pid=1, endpoint="tcp://x:1") for k in self.sizes}

    def call(self, record: RuntimeProcess, header: dict, timeout_s: float) -> dict:
        self.frames.append((record.key, header))
        size = self.sizes[record.key]
        if header["op"] == "stats":
            return {"status": 200, "stats": {**size, "rate_rps": 100.0, "budgets_ms": [40.0, 45.0]}}
        if header["op"] == "health":
            return {"status": 200, **size}
        size.update(cores=header["cores"], max_batch=header["max_batch"], cpus=header.get("cpus"))
        self.budget_seen.append(sum(s["cores"] for s in self.sizes.values()))
        return {"status": 200, "cores": header["cores"], "max_batch": header["max_batch"], "cpus": header.get("cpus"),
                "resize_ms": 1.0, "prepared": True}


FINGERPRINTS: dict[str, str] = {}


def fake_desired(model_file) -> Any:
    runtimes = [cpu_runtime(model_file, key=f"cpu0/{i}", threads=1, vertical={**VERTICAL, "max_cores": 4, "reserve_ms": 10.0})
                for i in range(3)]
    runtimes.append(cpu_runtime(model_file, key="cpu0/3", threads=2))
    desired = desired_state_parse(desired_doc(1, *runtimes))
    FINGERPRINTS.update({r.key: r.fingerprint for r in desired.runtimes})
    return desired


def test_fast_loop_calls_the_controller_and_keeps_the_host_budget(model_file) -> None:
    desired = fake_desired(model_file)
    runtimes = FakeRuntimes({"cpu0/0": 1, "cpu0/1": 1, "cpu0/2": 1, "cpu0/3": 2})
    seen: list[tuple[str, Any, dict]] = []

    def controller(model, observation, *, min_cores, max_cores, max_batch):
        seen.append((model, observation, {"min_cores": min_cores, "max_cores": max_cores, "max_batch": max_batch}))
        return VerticalAction(max_cores, 2, True, "infeasible", "wants all it may have")  # greedy: every runtime wants more

    ops = []
    supervisor = type("S", (), {"running": runtimes.running})()
    scaler = VerticalScaler(supervisor=supervisor, desired=lambda: desired, host_cores=7, host_cpus=list(range(7)),
                            call=runtimes.call, controller=controller, on_operation=ops.append)
    scaler.tick()
    first = seen[0]
    assert first[0] == VerticalLatency(**VERTICAL["model"]) and first[1].rate_rps == 100.0 * RATE_HEADROOM  # sized with the planners' headroom
    assert first[1].budgets_ms == (30.0, 35.0)  # what the requests have left less the stage's reserve for later stages
    assert first[1].cores == 1 and first[1].batch == 4 and first[2]["max_batch"] == 4
    assert first[2]["max_cores"] == 4  # min(max_cores 4, the 5 cores the runtime without a vertical block leaves)
    # 7 cores, 2 of them the fixed runtime's: 5 shared max-min fairly among three that want 4 each.
    cores = {k: v["cores"] for k, v in runtimes.sizes.items()}
    assert cores == {"cpu0/0": 2, "cpu0/1": 2, "cpu0/2": 1, "cpu0/3": 2}
    assert sum(cores.values()) <= 7 and max(runtimes.budget_seen) <= 7
    pins = [set(runtimes.sizes[k]["cpus"]) for k in ("cpu0/0", "cpu0/1", "cpu0/2")]
    assert sum(len(p) for p in pins) == 5 and len(set().union(*pins)) == 5  # disjoint CPUs
    assert runtimes.sizes["cpu0/3"]["cpus"] is None  # runtimes without a vertical block are not pinned
    assert [op.action for op in ops] == ["runtime.resize"] * 3 and all("infeasible" in op.detail for op in ops)
    assert [r["by"] for r in scaler.resizes_take("cpu0/0")] == ["vertical"]

    # The fixed runtime grows by the desired state (3 cores): the vertical ones make room first, the host never over 7.
    record = runtimes.running()["cpu0/3"]
    grown = desired_state_parse(desired_doc(2, *[r.document for r in desired.runtimes[:3]], cpu_runtime(model_file, key="cpu0/3", threads=3)))
    desired = grown
    reply = scaler.desired_resize(record, grown.runtime("cpu0/3"))
    assert reply["status"] == 200 and reply["cores"] == 3 and reply["before"]["cores"] == 2
    assert max(runtimes.budget_seen) <= 7 and sum(v["cores"] for v in runtimes.sizes.values()) == 7

    # A tick later nothing is over the budget; shrinking before growing keeps it so at every step.
    scaler.tick()
    assert max(runtimes.budget_seen) <= 7


def test_fast_loop_skips_a_runtime_that_does_not_answer(model_file) -> None:
    desired = fake_desired(model_file)
    runtimes = FakeRuntimes({"cpu0/0": 1, "cpu0/1": 1, "cpu0/2": 1, "cpu0/3": 2})
    real_call = runtimes.call

    def call(record, header, timeout_s):
        if record.key == "cpu0/1":
            raise ConnectionRefusedError("gone")
        return real_call(record, header, timeout_s)

    calls = []
    supervisor = type("S", (), {"running": runtimes.running})()
    scaler = VerticalScaler(supervisor=supervisor, desired=lambda: desired, host_cores=7, host_cpus=list(range(7)), call=call,
                            controller=lambda *a, **k: (calls.append(a[1]) or VerticalAction(1, 1, False, "idle", "")))
    scaler.tick()
    assert len(calls) == 2  # cpu0/1 did not answer: not decided, not resized


def test_cores_share_and_cpus_assign() -> None:
    assert cores_share({"a": (1, 4), "b": (1, 1), "c": (2, 8)}, 8) == {"a": 4, "b": 1, "c": 3}  # 7 for a and c: 4 and 3, the tie to a
    assert cores_share({"a": (1, 2), "b": (1, 2)}, 16) == {"a": 2, "b": 2}  # never more than wanted
    assert cores_share({"a": (2, 4), "b": (2, 4)}, 3) == {"a": 2, "b": 1}  # mins do not fit: one each, then fairly
    assert cpus_assign({}, {"a": 2, "b": 1}, [0, 1, 2, 3]) == {"a": (0, 1), "b": (2,)}
    # Stable: a runtime that shrinks keeps its lowest CPUs, one that grows takes the lowest free ones.
    assert cpus_assign({"a": (0, 1), "b": (2,)}, {"a": 1, "b": 3}, [0, 1, 2, 3]) == {"a": (0,), "b": (1, 2, 3)}
    assert cpus_assign({}, {"a": 3, "b": 2}, [0, 1, 2, 3]) is None  # does not fit: nothing pinned
