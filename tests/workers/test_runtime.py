"""The worker runtime (workers/runtime): the ONNX Runtime session on a real model, the instance batcher
serving it, and the batcher making exactly the batch decisions the simulator makes (same dispatch times,
same query ids per batch, same drops) for every batching policy."""
from __future__ import annotations

import hashlib
import math
import threading
import time

import numpy as np
import pytest

from engine.dataplane.batching import batching_policy_make, policy_latency_function
from engine.plans.problem import Plan, Problem, ProfilePoint, problem_from_dict
from engine.simulation.simulator import DROPPED_EXPIRED, LATE, ON_TIME, SimulationConfig, simulate
from engine.simulation.workload import Trace
from engine.solvers.assemble import Assignment, plan_assemble
from tests.gpu import gpu_absent_reason
from tests.onnx_builders import onnx_mlp_bytes
from workers.runtime.batcher import DeadlineExceeded, InstanceBatcher, VirtualClock
from workers.runtime.session import ArtifactChecksumError, OnnxSession

# --------------------------------------------------------------------------- the ONNX session


@pytest.fixture(scope="module")
def mlp() -> bytes:
    return onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=1)


def queries(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 4)).astype(np.float32)} for _ in range(n)]


def test_run_batch_equals_running_each_query_alone(mlp: bytes) -> None:
    session = OnnxSession(mlp, sha256=hashlib.sha256(mlp).hexdigest())
    assert session.input_names == ["x"] and session.output_names == ["logits"]
    assert "CPUExecutionProvider" in session.providers
    session.warmup([1, 4])
    qs = queries(5)
    batched = session.run_batch(qs)
    assert len(batched) == 5
    for query, out in zip(qs, batched):
        (alone,) = session.run_batch([query])
        assert out["logits"].shape == (1, 3)
        assert np.allclose(out["logits"], alone["logits"], atol=1e-6)
    # Queries without their own batch axis come back without one.
    flat = session.run_batch([{"x": q["x"][0]} for q in qs])
    assert flat[2]["logits"].shape == (3,) and np.allclose(flat[2]["logits"], batched[2]["logits"][0], atol=1e-6)


def test_a_checksum_mismatch_is_refused(mlp: bytes, tmp_path) -> None:
    with pytest.raises(ArtifactChecksumError, match="checksum mismatch"):
        OnnxSession(mlp, sha256="0" * 64)
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp)
    assert OnnxSession(path, sha256=hashlib.sha256(mlp).hexdigest().upper()).output_names == ["logits"]


def test_threaded_batcher_serves_a_real_session(mlp: bytes) -> None:
    session = OnnxSession(mlp)
    sizes: list[int] = []

    def execute(payloads: list) -> list:
        sizes.append(len(payloads))
        return session.run_batch(payloads)

    qs = queries(10, seed=3)
    expected = [session.run_batch([q])[0]["logits"] for q in qs]
    batcher = InstanceBatcher(
        batching_policy_make("fixed", size=4), latency_ms=lambda b: 1.0 + 0.1 * b, max_batch=4, execute=execute,
        drop_rule="never", slo_ms=10_000.0, record_batches=True,
    )
    with batcher.start():
        futures = [batcher.submit(q) for q in qs]
        results = [f.result(timeout=30) for f in futures]
    for got, want in zip(results, expected):
        assert np.allclose(got["logits"], want, atol=1e-6)
    assert sum(sizes) == 10 and max(sizes) <= 4
    assert sorted(i for _s, ids, _e in batcher.batches for i in ids) == list(range(10))


def test_threaded_batcher_waits_for_a_policy_timer_and_fails_expired_queries() -> None:
    # max-delay: a lone query waits max_queue_delay_ms, then runs.
    done = threading.Event()
    batcher = InstanceBatcher(
        batching_policy_make("max-delay", max_queue_delay_ms=30.0), latency_ms=lambda b: 1.0, max_batch=8,
        execute=lambda p: [x * 2 for x in p], slo_ms=1000.0, record_batches=True,
    ).start()
    try:
        t0 = time.monotonic()
        future = batcher.submit(21)
        future.add_done_callback(lambda f: done.set())
        assert future.result(timeout=5) == 42
        assert time.monotonic() - t0 >= 0.025
        # A query whose deadline has passed is dropped with a clear error.
        stale = batcher.submit(1, deadline_ms=time.monotonic() * 1000.0 - 5.0)
        with pytest.raises(DeadlineExceeded, match="cannot meet its deadline"):
            stale.result(timeout=5)
    finally:
        batcher.close()


def test_threaded_batcher_calls_done_once_per_query_from_any_thread() -> None:
    """`submit(..., done=...)` (the runtime's hot path, no Future): each query's callback is called exactly
    once, with its result, its DeadlineExceeded, or BatcherClosed for what was queued at close; queries
    submitted from several threads while batches run are all answered (the worker is only woken when it
    sleeps, so none may be stranded)."""
    from workers.runtime.batcher import BatcherClosed

    outcomes: dict[int, list] = {}
    lock = threading.Lock()

    def done_for(x: int):
        def done(result, exc) -> None:
            with lock:
                outcomes.setdefault(x, []).append((result, exc))
        return done

    def execute(payloads: list) -> list:
        time.sleep(0.0005)
        return [p * 2 for p in payloads]

    batcher = InstanceBatcher(batching_policy_make("max-delay", max_queue_delay_ms=0.2), latency_ms=lambda b: 0.5, max_batch=8,
                              execute=execute, drop_rule="deadline", slo_ms=10_000.0).start()

    def client(start: int) -> None:
        for x in range(start, start + 300):
            batcher.submit(x, done=done_for(x))
            if x % 7 == 0:
                time.sleep(0.0002)

    threads = [threading.Thread(target=client, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stale = batcher.submit(-1, deadline_ms=time.monotonic() * 1000.0 - 5.0, done=done_for(-1))
    assert stale.query_id == 900
    deadline = time.monotonic() + 10
    while len(outcomes) < 901 and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.close()
    assert len(outcomes) == 901 and all(len(v) == 1 for v in outcomes.values())
    assert all(outcomes[x] == [(2 * x, None)] for x in outcomes if x >= 0)
    assert outcomes[-1][0][0] is None and isinstance(outcomes[-1][0][1], DeadlineExceeded)
    # A callback that raises is logged; the batch's other queries are still answered and the worker lives on.
    answered: list = []

    def flaky(x: int):
        def done(result, exc) -> None:
            if x == 1:
                raise RuntimeError("a callback bug")
            answered.append(result)
        return done

    batcher = InstanceBatcher(batching_policy_make("fixed", size=4), latency_ms=lambda b: 1.0, max_batch=4, execute=execute,
                              drop_rule="never", slo_ms=10_000.0).start()
    gate_first = [batcher.submit(x, done=flaky(x)) for x in range(4)]
    later = batcher.submit(10, done=flaky(10))
    deadline = time.monotonic() + 5
    while len(answered) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.close()
    assert len(gate_first) == 4 and later.query_id == 4 and sorted(answered) == [0, 4, 6, 20]
    # Closed while a batch runs: that batch is answered, the query queued behind it gets BatcherClosed.
    gate = threading.Event()

    def blocking(payloads: list) -> list:
        gate.wait(5)
        return [p * 2 for p in payloads]

    slow = InstanceBatcher(batching_policy_make("fixed", size=1), latency_ms=lambda b: 1.0, max_batch=1, execute=blocking,
                           drop_rule="never", slo_ms=120_000.0).start()
    slow.submit(10_004, done=done_for(10_004))
    time.sleep(0.05)
    slow.submit(10_005, done=done_for(10_005))
    threading.Timer(0.1, gate.set).start()
    slow.close(timeout=5)
    assert outcomes[10_004] == [(20_008, None)]
    assert outcomes[10_005][0][0] is None and isinstance(outcomes[10_005][0][1], BatcherClosed)


def test_an_idle_instance_runs_a_lone_query_inline_and_batches_the_rest_on_its_worker() -> None:
    """`submit(inline=True)`: a query alone at an idle instance, which the policy runs now, runs on the
    submitting thread (no hand-off); one that finds a batch running, or that the policy holds to grow a
    batch, goes to the worker thread, and the queries queued behind a running batch are batched together."""
    ran_on: list[tuple[str, list]] = []
    gate = threading.Event()

    def execute(payloads: list) -> list:
        ran_on.append((threading.current_thread().name, list(payloads)))
        if payloads[0] == "slow":
            gate.wait(5)
        return [f"{p}!" for p in payloads]

    answers: dict = {}

    def done_for(x):
        return lambda result, exc: answers.__setitem__(x, (result, exc))

    batcher = InstanceBatcher(batching_policy_make("nexus"), latency_ms=lambda b: 0.1, max_batch=8, execute=execute,
                              slo_ms=10_000.0, record_batches=True, inline_max_ms=1.0).start()
    try:
        batcher.submit("a", done=done_for("a"), inline=True)
        assert ran_on == [("MainThread", ["a"])] and answers["a"] == ("a!", None)  # answered before submit returned
        # A batch running on the worker: queries submitted meanwhile wait for it and then go as one batch.
        worker_side = threading.Thread(target=lambda: batcher.submit("slow", done=done_for("slow")), name="client")
        worker_side.start()
        worker_side.join()
        deadline = time.monotonic() + 5
        while len(ran_on) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        for x in ("b", "c", "d"):
            batcher.submit(x, done=done_for(x), inline=True)
        assert "b" not in answers  # not run inline: the instance was busy
        gate.set()
        while len(answers) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [(name, batch) for name, batch in ran_on[1:]] == [("tessera-batcher", ["slow"]), ("tessera-batcher", ["b", "c", "d"])]
        assert all(answers[x] == (f"{x}!", None) for x in ("a", "b", "c", "d", "slow"))
    finally:
        gate.set()
        batcher.close()
    # A policy that holds a lone query to grow its batch (max-delay) decides the same: the worker runs it later.
    ran_on.clear()
    held = InstanceBatcher(batching_policy_make("max-delay", max_queue_delay_ms=20.0), latency_ms=lambda b: 0.1, max_batch=8,
                           execute=execute, slo_ms=10_000.0, inline_max_ms=1.0).start()
    try:
        future = held.submit("e", inline=True)
        assert ran_on == []
        assert future.result(timeout=5) == "e!" and ran_on == [("tessera-batcher", ["e"])]
    finally:
        held.close()


def test_stepped_batcher_on_a_virtual_clock() -> None:
    clock = VirtualClock()
    lat = {1: 10.0, 2: 16.0}.__getitem__
    batcher = InstanceBatcher(
        batching_policy_make("fixed", size=2), latency_ms=lat, max_batch=2, execute=lambda p: p, slo_ms=100.0,
        clock=clock, service_ms=lat, record_batches=True,
    )
    futures = [batcher.submit("q0", arrival_ms=0.0)]
    assert not futures[0].done()  # it ends at 10 ms of virtual time
    futures += [batcher.submit(f"q{i}", arrival_ms=t) for i, t in enumerate([1.0, 2.0, 3.0, 50.0], start=1)]
    batcher.step_until(math.inf)
    assert [f.result() for f in futures] == ["q0", "q1", "q2", "q3", "q4"]
    assert batcher.batches == [(0.0, [0], 10.0), (10.0, [1, 2], 26.0), (26.0, [3], 36.0), (50.0, [4], 60.0)]
    assert clock.now_ms() == 60.0


@pytest.mark.parametrize("policy", ["nexus", "proteus", "fixed"])
@pytest.mark.parametrize("queue_order", ["fifo", "edf"])
def test_a_batch_of_multi_row_queries_holds_max_batch_rows_timed_at_its_rows(policy: str, queue_order: str) -> None:
    """Profiles and max_batch count rows; a query of 8 rows (a client's own batch) counts 8 against them. Sized in
    queries, four 8-row queries at max_batch 16 ran 32 rows together, twice what the plan sized for."""
    clock = VirtualClock()
    per_row_ms = 2.0
    served_rows: list[int] = []

    def execute(payloads: list) -> list:
        served_rows.append(sum(rows for rows, _name in payloads))
        return [name for _rows, name in payloads]

    options = {"size": 4} if policy == "fixed" else {}
    batcher = InstanceBatcher(
        batching_policy_make(policy, **options), latency_ms=lambda b: per_row_ms * b, max_batch=16, execute=execute, slo_ms=500.0,
        queue_order=queue_order, clock=clock, service_ms=lambda b: per_row_ms * b, record_batches=True,
    )
    sizes = [8, 8, 8, 8, 1, 1, 24, 3]
    futures = [batcher.submit((rows, f"q{i}"), arrival_ms=0.1 * i, rows=rows) for i, rows in enumerate(sizes)]
    batcher.step_until(math.inf)
    assert [f.result() for f in futures] == [f"q{i}" for i in range(len(sizes))]  # every query answered, none lost
    assert sum(served_rows) == sum(sizes)
    # No batch of several queries holds more than max_batch rows; the 24-row query, larger than the cap, runs alone.
    for (_start, ids, _end), rows in zip(batcher.batches, served_rows):
        assert rows <= 16 or ids == [6], (batcher.batches, served_rows)
    # Each batch took the service time of its rows (the stepped clock runs service_ms at the batch's rows).
    for (start, _ids, end), rows in zip(batcher.batches, served_rows):
        assert end - start == pytest.approx(per_row_ms * rows)
    assert not batcher._rows  # nothing left behind for queries that are gone


def test_one_row_queries_batch_as_before() -> None:
    """The rows-aware path is taken only for multi-row queries: one-row traffic batches exactly as before."""
    def batches(**rows: int) -> list:
        batcher = InstanceBatcher(batching_policy_make("nexus"), latency_ms=lambda b: 1.0 + b, max_batch=4, execute=lambda p: p,
                                  slo_ms=100.0, clock=VirtualClock(), service_ms=lambda b: 1.0 + b, record_batches=True)
        for i in range(9):
            batcher.submit(i, arrival_ms=0.3 * i, **rows)
        batcher.step_until(math.inf)
        return batcher.batches

    assert batches(rows=1) == batches() and max(len(ids) for _s, ids, _e in batches()) > 1
    batcher = InstanceBatcher(batching_policy_make("nexus"), latency_ms=lambda b: 1.0, max_batch=4, execute=lambda p: p, slo_ms=100.0,
                              clock=VirtualClock())
    with pytest.raises(ValueError, match="rows must be an integer >= 1"):
        batcher.submit(0, arrival_ms=20.0, rows=0)


def test_query_rows_reads_the_batch_axis() -> None:
    from workers.runtime.served import query_rows

    assert query_rows({"input": np.zeros((8, 4), dtype=np.float32)}, True) == 8
    assert query_rows({"input": np.zeros((4,), dtype=np.float32)}, False) == 1
    assert query_rows({}, True) == 1


# --------------------------------------------------------------------------- simulator equivalence

LATENCY = {1: 10.0, 2: 16.0, 4: 28.0, 8: 52.0}  # ms at batch 1, 2, 4, 8
SLO_MS = 60.0
RATE = 140.0  # queries/s: above batch-1 capacity (100/s), below batch-8 capacity (~154/s): batching matters


def one_device_problem() -> Problem:
    return problem_from_dict({
        "applications": [{"name": "app0", "slo_ms": SLO_MS, "demand_rps": RATE}],
        "variants": [{"name": "v0", "application": "app0", "accuracy": 0.9, "memory_mb": 100}],
        "devices": [{"name": "g0", "type": "SIM", "memory_mb": 16000}],
        "profiles": [
            {"variant": "v0", "device_type": "SIM", "slice": "full", "batch": b, "latency_ms": lat} for b, lat in LATENCY.items()
        ],
    })


def one_instance_planner(problem: Problem) -> Plan:
    return plan_assemble(
        problem, [Assignment("g0", "full", None, "v0", RATE)], status="optimal", solver="fixed", objective=None,
        bound=None, gap=None, solve_seconds=0.0,
    )


def poisson_trace(n: int = 200, seed: int = 7) -> Trace:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / RATE, n))
    return Trace(times, np.zeros(n, dtype=np.int32), ("app0",), None)


POLICIES = {
    "proteus": {},
    "aimd": {"slo_ms": SLO_MS},
    "nexus": {},
    "max-delay": {"max_queue_delay_ms": 6.0},
    "fixed": {"size": 4},
}


@pytest.mark.parametrize("queue_order, drop_rule", [("fifo", "deadline"), ("edf", "slo-1x"), ("fifo", "never")])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_live_batcher_makes_the_simulators_batch_decisions(policy: str, queue_order: str, drop_rule: str) -> None:
    problem = one_device_problem()
    trace = poisson_trace()
    config = SimulationConfig(
        batching=policy, batching_params=POLICIES[policy], queue_order=queue_order, drop_rule=drop_rule,
        noise_sigma=0.0, replan_interval_s=None, burst_factor=None, record_batches=True,
    )
    sim = simulate(problem, trace, planner=one_instance_planner, config=config)
    (instance,) = sim.instances
    max_batch = instance["max_batch"]
    assert max_batch > 1  # the plan lets the instance batch

    # The live batcher on a virtual clock, its batch service time the latency the simulator uses.
    latency_ms, _lat1 = policy_latency_function(problem.profiles_for("v0", "SIM", "full"), max_batch)
    clock = VirtualClock()
    batcher = InstanceBatcher(
        batching_policy_make(policy, **POLICIES[policy]), latency_ms=latency_ms, max_batch=max_batch,
        execute=lambda payloads: payloads, drop_rule=drop_rule, slo_ms=SLO_MS, queue_order=queue_order,
        clock=clock, service_ms=latency_ms, record_batches=True,
    )
    arrivals = sim.queries["arrival_ms"].tolist()
    futures = [batcher.submit(qid, arrival_ms=t) for qid, t in enumerate(arrivals)]
    batcher.step_until(math.inf)
    batcher.close()

    sim_batches = [(start, ids, end) for _inst, start, ids, end in sim.batches]
    assert len(sim_batches) > 10
    assert any(len(ids) > 1 for _s, ids, _e in sim_batches)  # batching happened
    assert batcher.batches == sim_batches  # same dispatch times, same query ids per batch, same ends

    outcome = sim.queries["outcome"]
    sim_drops = sorted((qid, sim.queries["done_ms"][qid]) for qid in np.flatnonzero(outcome == DROPPED_EXPIRED).tolist())
    assert sorted(batcher.drops) == sim_drops
    assert np.all((outcome == ON_TIME) | (outcome == LATE) | (outcome == DROPPED_EXPIRED))
    for qid, future in enumerate(futures):
        assert future.done()
        if outcome[qid] == DROPPED_EXPIRED:
            assert isinstance(future.exception(), DeadlineExceeded)
        else:
            assert future.result() == qid


def test_the_equivalence_covers_drops_and_waiting() -> None:
    # The replay is only a strong check if the policies under it drop queries and wait on timers.
    problem, trace = one_device_problem(), poisson_trace()
    results = {
        p: simulate(problem, trace, planner=one_instance_planner, config=SimulationConfig(
            batching=p, batching_params=POLICIES[p], noise_sigma=0.0, replan_interval_s=None, burst_factor=None,
            record_batches=True))
        for p in POLICIES
    }
    assert sum(r.summary["dropped_expired"] for r in results.values()) > 0
    # Proteus and max-delay start some batches later than the arrival that made the instance idle-busy.
    arrivals = set(results["max-delay"].queries["arrival_ms"].tolist())
    starts = [s for _i, s, _ids, _e in results["max-delay"].batches]
    ends = {e for _i, _s, _ids, e in results["max-delay"].batches}
    assert any(s not in arrivals and s not in ends for s in starts)
    # Off by default: no log.
    quiet = simulate(problem, trace, planner=one_instance_planner, config=SimulationConfig(noise_sigma=0.0, replan_interval_s=None, burst_factor=None))
    assert quiet.batches == []


# --------------------------------------------------------------------------- on a real NVIDIA GPU


def test_onnx_session_on_cuda_matches_cpu(mlp: bytes) -> None:
    """On a GPU host the runtime's session runs on the CUDA execution provider and gives the CPU's answers.
    Skipped only where there is no GPU; on a GPU host a missing or broken CUDA path fails (the `gpu` extra,
    onnxruntime-gpu, is what GPU hosts install), as the runtime itself refuses to serve a GPU slice on the CPU."""
    reason = gpu_absent_reason()
    if reason is not None:
        pytest.skip(f"no GPU: {reason}")
    gpu = OnnxSession(mlp, device_uuid="0")
    assert gpu.providers[0] == "CUDAExecutionProvider", gpu.providers
    cpu = OnnxSession(mlp)
    batch = queries(16, seed=5)
    for got, want in zip(gpu.run_batch(batch), cpu.run_batch(batch)):
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-5)


def test_a_runtime_on_a_gpu_refuses_to_run_on_the_cpu_instead(mlp: bytes, monkeypatch) -> None:
    """What a GPU host without onnxruntime-gpu met (issue 45): asked for a GPU, onnxruntime's CPU build has no CUDA
    provider and used to run the session on the CPU under the GPU's name, and the profiler to post the CPU's
    latencies as the GPU's profile. Both refuse now, saying why; a CPU runtime is unaffected."""
    import onnxruntime as ort

    from workers.profiler import ProfilingError, profile_sweep
    from workers.runtime.session import CPU_STANDS_IN_ENV, CudaUnavailableError

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the refusal is for builds without it")
    monkeypatch.delenv(CPU_STANDS_IN_ENV, raising=False)
    with pytest.raises(CudaUnavailableError, match="no CUDA execution provider.*onnxruntime-gpu"):
        OnnxSession(mlp, device_uuid="GPU-0b1e2c3d")
    assert OnnxSession(mlp).providers == ["CPUExecutionProvider"]
    # Tests against a fake NVML declare that the CPU stands in; only then does a GPU runtime run on it.
    monkeypatch.setenv(CPU_STANDS_IN_ENV, "1")
    assert OnnxSession(mlp, device_uuid="GPU-0b1e2c3d").providers == ["CPUExecutionProvider"]
    monkeypatch.delenv(CPU_STANDS_IN_ENV)
    # Naming CPU providers explicitly is a choice, not a fallback: allowed with a device named.
    assert OnnxSession(mlp, device_uuid="0", providers=["CPUExecutionProvider"]).providers == ["CPUExecutionProvider"]
    with pytest.raises(ProfilingError, match="profiling on a GPU: .*no CUDA execution provider"):
        profile_sweep(mlp, batch_sizes=[1], providers=["CUDAExecutionProvider", "CPUExecutionProvider"], min_iterations=1, min_time_s=0)
    assert profile_sweep(mlp, batch_sizes=[1], min_iterations=1, min_time_s=0)[0]["providers"] == ["CPUExecutionProvider"]


# --------------------------------------------------------------------------- the live margin


def test_live_margin_keeps_a_lone_query_that_proteus_holds_to_the_last_moment() -> None:
    """Proteus holds a lone query until deadline - latency(2). With a flat profile (latency(2) == latency(1))
    any wake-up lateness would make the deadline drop rule fire; the live margin plans earlier while the
    drop rule judges the real deadline, so the query is served in time. The margin is wide (50 ms of a 200 ms
    SLO) so that what is tested is the rule, not this machine's wake-up lateness: with 2 ms of 20 ms, a loaded
    two-core CI machine once woke the batcher 2.8 ms late and the query was dropped."""
    points = [ProfilePoint("v", "cpu", "1", 1, 1.0), ProfilePoint("v", "cpu", "1", 2, 1.0)]
    latency_ms, _ = policy_latency_function(points, 2)
    batcher = InstanceBatcher(
        batching_policy_make("proteus"), latency_ms=latency_ms, max_batch=2, execute=lambda p: [len(p)] * len(p),
        drop_rule="deadline", slo_ms=200.0, margin_ms=50.0,
    ).start()
    try:
        for _ in range(3):
            submitted = time.monotonic()
            assert batcher.submit("q").result(timeout=5) == 1
            waited_ms = (time.monotonic() - submitted) * 1000.0
            assert 100.0 < waited_ms < 200.0  # held for a partner (about 200 - 50 - 1 ms), then served alone, in time
    finally:
        batcher.close()
    with pytest.raises(ValueError, match="margin_ms"):
        InstanceBatcher(batching_policy_make("proteus"), latency_ms=latency_ms, max_batch=2, execute=list, slo_ms=20.0, margin_ms=20.0)
