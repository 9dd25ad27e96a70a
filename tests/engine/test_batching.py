"""Tests for the batching policies and the query queue (engine/dataplane/batching.py).

Each policy is run through a tiny deterministic single-instance driver (arrivals, drop rule, decide, run,
completion) with latency(b) = 5 + 2*b ms, and the batch sizes and completion times are checked against
numbers worked out by hand in the comments. Then: FIFO vs EDF order, every drop rule, the AIMD cap,
max-delay timing, Nexus's early drop, Proteus never letting a servable query time out (hypothesis, against a
brute-force check at every idle decision), and conservation (every pushed query is popped or dropped once).
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.dataplane.batching import (
    BATCHING_POLICIES,
    DROP_RULES,
    AimdBatching,
    Dispatch,
    FixedBatching,
    MaxDelayBatching,
    NexusBatching,
    ProteusBatching,
    QuantileBatching,
    QueryQueue,
    batching_policy_make,
)


def lin(b: int) -> float:
    """latency(b) = 5 + 2b ms: 1→7, 2→9, 3→11, 4→13, 5→15, 8→21."""
    return 5.0 + 2.0 * b


# --------------------------------------------------------------------------- the driver


class Run:
    """What one driven run did."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int], float]] = []  # (start, ids, finish)
        self.finish: dict[int, float] = {}
        self.dropped: list[int] = []
        self.popped: list[int] = []
        # Every idle decision: (now, queue snapshot after the drop rule, Dispatch).
        self.decisions: list[tuple[float, list[tuple[int, float, float]], Dispatch]] = []

    @property
    def sizes(self) -> list[int]:
        return [len(ids) for _, ids, _ in self.batches]


def drive(
    policy,
    arrivals: list[tuple[int, float, float]],
    latency=lin,
    max_batch: int = 4,
    order: str = "fifo",
    rule: str = "never",
    slo_ms: float = 1e9,
    record: bool = False,
) -> Run:
    """Single-instance event loop. `arrivals` are (id, arrival_ms, deadline_ms). At each event time, first the
    completion (if any), then every arrival at that time, then (if idle) the drop rule and `decide`. The actual
    service time equals latency(b)."""
    arrivals = sorted(arrivals, key=lambda a: (a[1], a[0]))
    queue = QueryQueue(order)
    run = Run()
    i = 0
    busy_until = math.inf
    in_flight: list[tuple[int, float, float]] = []
    timer = math.inf
    now = 0.0
    for _ in range(100_000):
        t_arrival = arrivals[i][1] if i < len(arrivals) else math.inf
        now = min(t_arrival, busy_until, timer)
        if now == math.inf:
            break
        if busy_until == now:
            busy_until = math.inf
            start = run.batches[-1][0]
            late = sum(1 for _, _, d in in_flight if now > d)
            policy.observe(len(in_flight), now - start, late)
            in_flight = []
        while i < len(arrivals) and arrivals[i][1] == now:
            queue.push(*arrivals[i])
            i += 1
        if timer <= now:
            timer = math.inf
        if busy_until != math.inf:
            continue
        run.dropped += queue.drop_expired(now, rule, slo_ms, latency(1))
        snapshot = queue.snapshot() if record else []
        decision = policy.decide(now, queue, latency, max_batch)
        if record:
            run.decisions.append((now, snapshot, decision))
        if decision.batch > 0 and decision.at_ms <= now:
            assert decision.batch <= max_batch
            batch = queue.pop(decision.batch)
            assert len(batch) == decision.batch
            in_flight = batch
            finish = now + latency(len(batch))
            busy_until = finish
            ids = [q[0] for q in batch]
            run.popped += ids
            run.batches.append((now, ids, finish))
            for qid in ids:
                run.finish[qid] = finish
            timer = math.inf
        elif decision.batch > 0:
            assert decision.at_ms > now
            timer = decision.at_ms
        else:
            assert decision.at_ms == math.inf
            timer = math.inf
    else:  # pragma: no cover - a policy that never settles
        raise AssertionError("driver did not terminate")
    run.dropped += queue.drop_expired(now, "never", slo_ms, latency(1))  # early drops still pending
    assert len(queue) == 0
    return run


def with_slo(times: list[float], slo: float) -> list[tuple[int, float, float]]:
    return [(k, float(t), float(t) + slo) for k, t in enumerate(times)]


# --------------------------------------------------------------------------- hand-computed runs


def test_proteus_hand_computed():
    # SLO 30, max_batch 4. Arrivals q0@0, q1@5, q2@20, q3@40, q4..q7@41..44 (deadline = arrival + 30).
    # t=0:  q=1, head d=30; wait for a 2nd until 30 - lat(2) = 30 - 9 = 21.
    # t=5:  q1 arrives, q=2; wait for a 3rd until 30 - lat(3) = 30 - 11 = 19.
    # t=19: timer; q=2 and 19 >= 19: run 2 (19 + 9 = 28 <= 30). q0, q1 finish at 28.
    # t=20: q2 arrives while busy.
    # t=28: done; q=1 (q2, d=50): wait until 50 - lat(2) = 41.
    # t=40: q3 arrives, q=2: 50 - lat(3) = 39 <= 40, so run 2 now: 40 + 9 = 49 <= 50. q2, q3 finish at 49.
    # t=41..44: q4..q7 arrive while busy.
    # t=49: q=4 == max_batch: run 4 now: 49 + 13 = 62 <= 71. q4..q7 finish at 62.
    run = drive(ProteusBatching(), with_slo([0, 5, 20, 40, 41, 42, 43, 44], 30), max_batch=4)
    assert run.batches == [(19.0, [0, 1], 28.0), (40.0, [2, 3], 49.0), (49.0, [4, 5, 6, 7], 62.0)]
    assert run.dropped == []
    assert all(run.finish[q] <= q_deadline for q, _, q_deadline in with_slo([0, 5, 20, 40, 41, 42, 43, 44], 30))


def test_proteus_shrinks_the_batch_for_the_head_and_runs_a_late_head_whole():
    # SLO 20, max_batch 4. q0..q3 @0,1,2,3 (d 20..23), q4..q6 @4,5,6 (d 24..26).
    # t=0: wait until 20 - lat(2) = 11; t=1: until 20 - 11 = 9; t=2: until 20 - 13 = 7;
    # t=3: q=4 == max_batch: run 4, 3 + 13 = 16 <= 20. Done at 16.
    # t=16: q=3 (q4 d=24): 24 - lat(4) = 11 <= 16, run now. b=3: 16+11=27 > 24; b=2: 25 > 24; b=1: 23 <= 24.
    #       run q4 alone, done 23.
    # t=23: q=2 (q5 d=25, q6 d=26): 25 - lat(3) = 14 <= 23; b=1: 30 > 25, the head is late even alone:
    #       with rule "never" run both (min(q, max_batch) = 2): done 23 + 9 = 32 (both late).
    arrivals = with_slo([0, 1, 2, 3, 4, 5, 6], 20)
    run = drive(ProteusBatching(), arrivals, max_batch=4)
    assert run.batches == [(3.0, [0, 1, 2, 3], 16.0), (16.0, [4], 23.0), (23.0, [5, 6], 32.0)]
    # With rule "deadline", at t=23 both q5 (23 + 7 = 30 > 25) and q6 (30 > 26) are dropped instead.
    run = drive(ProteusBatching(), arrivals, max_batch=4, rule="deadline")
    assert run.batches == [(3.0, [0, 1, 2, 3], 16.0), (16.0, [4], 23.0)]
    assert run.dropped == [5, 6]


def test_aimd_hand_computed():
    # SLO 20, max_batch 8, cap starts at 1, +1 per on-time batch, x0.9 per late batch.
    # Burst q0..q5 @0 (d 20):
    #   t=0:  cap 1 → run 1, done 7 (on time) → cap 2.
    #   t=7:  cap 2 → run 2, done 7 + 9 = 16 (on time) → cap 3.
    #   t=16: cap 3 → run 3, done 16 + 11 = 27 > 20 (3 late) → cap 3 * 0.9 = 2.7.
    # Burst q6..q8 @30 (d 50):
    #   t=30: cap int(2.7) = 2 → run 2, done 39 (on time) → cap 3.7.
    #   t=39: 1 left → run 1, done 46 (on time) → cap 4.7.
    policy = AimdBatching()
    run = drive(policy, with_slo([0] * 6, 20) + [(6 + k, 30.0, 50.0) for k in range(3)], max_batch=8)
    assert run.batches == [
        (0.0, [0], 7.0),
        (7.0, [1, 2], 16.0),
        (16.0, [3, 4, 5], 27.0),
        (30.0, [6, 7], 39.0),
        (39.0, [8], 46.0),
    ]
    assert policy.cap == pytest.approx(4.7)
    assert policy.batch_cap == 4


def test_nexus_hand_computed_sliding_window():
    # SLO 20, max_batch 4 = the window. q0@0, q1..q5@1..5 (d 21..25), q6..q8@10,11,12 (d 30,31,32).
    # t=0:  1 queued, window min(4, 1) = 1: 0 + 7 <= 20 → run q0, done 7.
    # t=7:  5 queued, window 4: head q1 d=21, 7 + 13 = 20 <= 21 → run q1..q4, done 20.
    # t=20: queued q5..q8 (4). Window 4: q5 d=25, 20 + 13 = 33 > 25 → early drop q5.
    #       3 left, window 3: q6 d=30, 20 + 11 = 31 > 30 → early drop q6 (it could have run alone: 27 <= 30,
    #       but not in a throughput-keeping batch). 2 left, window 2: q7 d=31, 20 + 9 = 29 <= 31 → run q7, q8,
    #       done 29.
    arrivals = [(0, 0.0, 20.0)] + [(k, float(k), 20.0 + k) for k in range(1, 6)]
    arrivals += [(6, 10.0, 30.0), (7, 11.0, 31.0), (8, 12.0, 32.0)]
    run = drive(NexusBatching(), arrivals, max_batch=4)
    assert run.batches == [(0.0, [0], 7.0), (7.0, [1, 2, 3, 4], 20.0), (20.0, [7, 8], 29.0)]
    assert run.dropped == [5, 6]

    # window=1 drops only what cannot make it alone and serves the largest batch the head allows:
    # t=20: q5: 27 > 25 → drop. q6 (d 30) fits alone; largest b <= 3 with 20 + lat(b) <= 30 is 2 (29; 3 → 31).
    #       run q6, q7, done 29. t=29: q8 d=32, 29 + 7 = 36 > 32 → drop.
    run = drive(NexusBatching(window=1), arrivals, max_batch=4)
    assert run.batches == [(0.0, [0], 7.0), (7.0, [1, 2, 3, 4], 20.0), (20.0, [6, 7], 29.0)]
    assert run.dropped == [5, 8]


def test_max_delay_hand_computed():
    # max_queue_delay 10 ms, max_batch 8 → preferred sizes [2, 4, 8].
    # t=0:  q0 arrives, 1 queued, no preferred size <= 1: wait until 0 + 10 = 10.
    # t=3:  q1 arrives, 2 queued = preferred 2: run now, done 3 + 9 = 12.
    # t=4,5,6: q2, q3, q4 arrive while busy.
    # t=12: 3 queued, largest preferred <= 3 is 2: run q2, q3, done 12 + 9 = 21.
    # t=21: q4 (arrived 6) has waited 15 >= 10: run 1, done 28.
    # t=40: q5 arrives alone: wait until 50; nothing comes: run 1 at 50, done 57.
    run = drive(MaxDelayBatching(max_queue_delay_ms=10), with_slo([0, 3, 4, 5, 6, 40], 1e6), max_batch=8)
    assert run.batches == [
        (3.0, [0, 1], 12.0),
        (12.0, [2, 3], 21.0),
        (21.0, [4], 28.0),
        (50.0, [5], 57.0),
    ]


def test_max_delay_dispatch_timing():
    policy = MaxDelayBatching(max_queue_delay_ms=10)
    queue = QueryQueue()
    queue.push(0, 100.0, 1e9)
    # One query (no preferred size <= 1): run it when it has waited 10 ms.
    assert policy.decide(100.0, queue, lin, 8) == Dispatch(1, 110.0)
    assert policy.decide(109.999, queue, lin, 8) == Dispatch(1, 110.0)
    assert policy.decide(110.0, queue, lin, 8) == Dispatch(1, 110.0)
    queue.push(1, 105.0, 1e9)
    assert policy.decide(105.0, queue, lin, 8) == Dispatch(2, 105.0)  # preferred 2 formed: now
    for k in range(2, 7):
        queue.push(k, 106.0, 1e9)
    assert policy.decide(106.0, queue, lin, 8) == Dispatch(4, 106.0)  # 7 queued: largest preferred 4
    assert policy.decide(106.0, queue, lin, 6) == Dispatch(6, 106.0)  # max_batch 6: preferred [2, 4, 6]
    # Explicit preferred sizes; no preferred size fits and the batch can still grow: wait for the head.
    policy = MaxDelayBatching(max_queue_delay_ms=5, preferred_batch_sizes=[3])
    queue = QueryQueue()
    queue.push(0, 0.0, 1e9)
    queue.push(1, 1.0, 1e9)
    assert policy.decide(1.0, queue, lin, 8) == Dispatch(2, 5.0)
    assert policy.decide(5.0, queue, lin, 8) == Dispatch(2, 5.0)
    assert policy.decide(1.0, queue, lin, 2) == Dispatch(2, 1.0)  # the batch cannot grow past max_batch 2
    # Delay 0: Triton's default, no waiting.
    assert MaxDelayBatching().decide(1.0, queue, lin, 8) == Dispatch(2, 1.0)


def test_fixed_hand_computed():
    # size 2, max_batch 4. q0@0, q1..q3@1,2,3.
    # t=0: 1 queued → run 1, done 7. t=7: 3 queued → run 2 (q1, q2), done 16. t=16: run q3, done 23.
    run = drive(FixedBatching(2), with_slo([0, 1, 2, 3], 100), max_batch=4)
    assert run.batches == [(0.0, [0], 7.0), (7.0, [1, 2], 16.0), (16.0, [3], 23.0)]
    # The default size is 1 (no batching) and max_batch caps the size.
    assert drive(FixedBatching(), with_slo([0, 0, 0], 100)).sizes == [1, 1, 1]
    assert drive(FixedBatching(8), with_slo([0] * 5, 100), max_batch=3).sizes == [3, 2]


# --------------------------------------------------------------------------- queue order and drop rules


def test_fifo_vs_edf_order():
    queries = [(1, 0.0, 50.0), (2, 1.0, 20.0), (3, 2.0, 20.0), (4, 3.0, 10.0), (5, 1.0, 20.0)]
    fifo, edf = QueryQueue("fifo"), QueryQueue("edf")
    for q in queries:
        fifo.push(*q)
        edf.push(*q)
    assert fifo.head() == (1, 0.0, 50.0)
    assert edf.head() == (4, 3.0, 10.0)
    assert [q[0] for q in fifo.snapshot()] == [1, 2, 3, 4, 5]
    # EDF: deadline, then arrival (2 and 5 arrived at 1.0, before 3), then id (2 before 5).
    assert [q[0] for q in edf.snapshot()] == [4, 2, 5, 3, 1]
    assert [q[0] for q in fifo.pop(2)] == [1, 2]
    assert [q[0] for q in edf.pop(2)] == [4, 2]
    assert len(fifo) == len(edf) == 3
    assert [q[0] for q in fifo.pop(10)] == [3, 4, 5]  # more than queued: all of them
    assert [q[0] for q in edf.pop(10)] == [5, 3, 1]
    assert len(fifo) == len(edf) == 0 and not fifo and not edf
    with pytest.raises(ValueError):
        QueryQueue("lifo")


@pytest.mark.parametrize("order", ["fifo", "edf"])
def test_drop_rule_deadline(order):
    queue = QueryQueue(order)
    # now = 10, latency(1) = 7: dropped when 10 + 7 = 17 > deadline.
    for qid, arrival, deadline in [(1, 0.0, 16.0), (2, 1.0, 17.0), (3, 2.0, 30.0), (4, 3.0, 12.0)]:
        queue.push(qid, arrival, deadline)
    assert sorted(queue.drop_expired(10.0, "deadline", 20.0, 7.0)) == [1, 4]  # 17 > 16 and 17 > 12
    assert sorted(q[0] for q in queue.snapshot()) == [2, 3]  # 17 <= 17 is on time
    assert queue.drop_expired(10.0, "deadline", 20.0, 7.0) == []
    assert queue.drop_expired(11.0, "deadline", 20.0, 7.0) == [2]
    assert [q[0] for q in queue.pop(5)] == [3]


@pytest.mark.parametrize("order", ["fifo", "edf"])
@pytest.mark.parametrize("rule, factor", [("slo-1x", 1.0), ("slo-2x", 2.0)])
def test_drop_rule_slo(order, rule, factor):
    queue = QueryQueue(order)
    # SLO 10; at now = 25 a query is dropped when it waited longer than 10 * factor. Waits: q1 25, q2 20,
    # q3 10, q4 5. slo-1x (> 10): q1, q2 (q3's 10 is not > 10). slo-2x (> 20): q1 only (q2's 20 is not > 20).
    queries = [(1, 0.0, 100.0), (2, 5.0, 90.0), (3, 15.0, 80.0), (4, 20.0, 70.0)]
    for q in queries:
        queue.push(*q)
    expected = [1, 2] if factor == 1.0 else [1]
    assert sorted(queue.drop_expired(25.0, rule, 10.0, 7.0)) == expected
    assert sorted(q[0] for q in queue.snapshot()) == sorted(set(range(1, 5)) - set(expected))


@pytest.mark.parametrize("order", ["fifo", "edf"])
def test_drop_rule_never_and_unknown(order):
    queue = QueryQueue(order)
    queue.push(1, 0.0, 1.0)
    assert queue.drop_expired(1e6, "never", 1.0, 7.0) == []
    assert len(queue) == 1
    with pytest.raises(ValueError):
        queue.drop_expired(0.0, "sometimes", 1.0, 7.0)


def test_fifo_drop_with_out_of_order_deadlines_and_arrivals():
    # Mixed SLOs in one FIFO queue: deadlines are not in push order, so expired queries are not a prefix.
    queue = QueryQueue("fifo")
    for q in [(1, 0.0, 100.0), (2, 1.0, 12.0), (3, 2.0, 50.0), (4, 3.0, 13.0), (5, 4.0, 200.0)]:
        queue.push(*q)
    assert queue.drop_expired(10.0, "deadline", 0.0, 7.0) == [2, 4]  # 17 > 12, 17 > 13
    assert [q[0] for q in queue.snapshot()] == [1, 3, 5]  # order kept
    assert queue.drop_expired(10.0, "deadline", 0.0, 7.0) == []
    assert queue.drop_expired(44.0, "deadline", 0.0, 7.0) == [3]  # 51 > 50
    # Arrivals pushed out of order (a late-delivered query): the slo rule still finds it.
    queue = QueryQueue("fifo")
    for q in [(1, 10.0, 1e9), (2, 11.0, 1e9), (3, 2.0, 1e9), (4, 12.0, 1e9)]:
        queue.push(*q)
    assert queue.drop_expired(13.0, "slo-1x", 5.0, 7.0) == [3]  # 13 - 2 > 5
    assert queue.drop_expired(16.5, "slo-1x", 5.0, 7.0) == [1, 2]  # 6.5 and 5.5 > 5
    assert [q[0] for q in queue.pop(3)] == [4]


def test_early_drops_are_reported_by_the_next_drop_expired():
    for order in ("fifo", "edf"):
        queue = QueryQueue(order)
        queue.push(1, 0.0, 10.0)
        queue.push(2, 1.0, 30.0)
        assert queue.discard_head() == 1
        assert len(queue) == 1
        assert queue.drop_expired(0.0, "never", 1.0, 1.0) == [1]
        assert queue.drop_expired(0.0, "never", 1.0, 1.0) == []
        assert queue.discard_head() == 2
        assert queue.drop_expired(100.0, "deadline", 1.0, 1.0) == [2]


# --------------------------------------------------------------------------- AIMD cap, policy edges


def test_aimd_cap_moves_as_specified():
    policy = AimdBatching()  # Clipper's defaults: start 1, +1, x0.9
    assert (policy.cap, policy.step, policy.backoff) == (1.0, 1.0, 0.9)
    for expected in (2.0, 3.0, 4.0):
        policy.observe(policy.batch_cap, 10.0, late=0)
        assert policy.cap == expected
    policy.observe(4, 10.0, late=1)
    assert policy.cap == pytest.approx(3.6) and policy.batch_cap == 3
    policy.observe(3, 10.0, late=2)
    assert policy.cap == pytest.approx(3.24)
    for _ in range(50):
        policy.observe(1, 10.0, late=1)
    assert policy.cap == 1.0  # never below 1
    # The cap never exceeds the max_batch last seen by decide.
    queue = QueryQueue()
    for k in range(10):
        queue.push(k, 0.0, 100.0)
    assert policy.decide(0.0, queue, lin, 3) == Dispatch(1, 0.0)
    for _ in range(10):
        policy.observe(1, 10.0, late=0)
    assert policy.cap == 3.0
    assert policy.decide(0.0, queue, lin, 3) == Dispatch(3, 0.0)
    assert policy.decide(0.0, queue, lin, 2) == Dispatch(2, 0.0)
    # With slo_ms, a batch slower than the SLO is a late batch even when no query missed its deadline.
    policy = AimdBatching(initial=5, step=2, backoff=0.5, slo_ms=20.0)
    policy.observe(5, 25.0, late=0)
    assert policy.cap == 2.5
    policy.observe(2, 15.0, late=0)
    assert policy.cap == 4.5


def test_policies_on_empty_queue_and_unservable_instance():
    queue = QueryQueue()
    for name in BATCHING_POLICIES:
        policy = batching_policy_make(name)
        assert policy.name == name
        assert policy.decide(0.0, queue, lin, 4) == Dispatch(0, math.inf)
    queue.push(1, 0.0, 100.0)
    for name in BATCHING_POLICIES:
        assert batching_policy_make(name).decide(0.0, queue, lin, 0) == Dispatch(0, math.inf)


def test_batching_policy_make_parameters():
    assert batching_policy_make("fixed", size=4).size == 4
    assert batching_policy_make("nexus", window=2).window == 2
    assert batching_policy_make("max-delay", max_queue_delay_ms=3, preferred_batch_sizes=[8, 2]).preferred_batch_sizes == (2, 8)
    assert batching_policy_make("aimd", backoff=0.5).backoff == 0.5
    with pytest.raises(ValueError, match="unknown batching policy"):
        batching_policy_make("greedy")
    with pytest.raises(ValueError, match="bad parameters"):
        batching_policy_make("proteus", size=3)
    for name, params in [
        ("fixed", {"size": 0}),
        ("nexus", {"window": 0}),
        ("max-delay", {"max_queue_delay_ms": -1}),
        ("max-delay", {"preferred_batch_sizes": [0]}),
        ("aimd", {"backoff": 1.0}),
        ("aimd", {"initial": 0}),
        ("quantile", {"quantile": 0}),
        ("quantile", {"window": 0}),
        ("quantile", {"initial_scale": 10.0}),
    ]:
        with pytest.raises(ValueError):
            batching_policy_make(name, **params)


def test_proteus_decisions():
    policy = ProteusBatching()
    queue = QueryQueue()
    queue.push(0, 0.0, 30.0)
    assert policy.decide(0.0, queue, lin, 4) == Dispatch(1, 21.0)  # 30 - lat(2)
    assert policy.decide(21.0, queue, lin, 4) == Dispatch(1, 21.0)
    assert policy.decide(0.0, queue, lin, 1) == Dispatch(1, 0.0)  # q == max_batch: now
    # Head late even alone: run what is queued.
    assert policy.decide(25.0, queue, lin, 4) == Dispatch(1, 25.0)


def test_quantile_learns_the_tail_of_measured_service_time():
    """After `refresh` batches whose service took 1.2x the profile, the policy times the batch for 1.2x:
    it waits until 30 - 1.2 lat(2) = 19.2 where Proteus waits until 21."""
    policy = QuantileBatching(refresh=4, window=8)
    queue = QueryQueue()
    queue.push(0, 0.0, 30.0)
    assert policy.decide(0.0, queue, lin, 4) == Dispatch(1, 21.0)  # scale 1 until it has measurements
    for b in (1, 2, 3, 4):
        policy.observe(b, 1.2 * lin(b), 0)
    assert policy.scale == pytest.approx(1.2)
    decision = policy.decide(0.0, queue, lin, 4)
    assert decision.batch == 1 and decision.at_ms == pytest.approx(30.0 - 1.2 * lin(2))
    # The tail, not the mean: one slow batch in eight sets a p99 scale.
    policy = QuantileBatching(quantile=0.99, refresh=8, window=8)
    policy.decide(0.0, queue, lin, 4)
    for k in range(8):
        policy.observe(2, (1.5 if k == 3 else 1.0) * lin(2), 0)
    assert policy.scale == pytest.approx(1.5)
    # Clamped: an absurd measurement cannot stall the instance.
    for _ in range(8):
        policy.observe(2, 100.0 * lin(2), 0)
    assert policy.scale == QuantileBatching.SCALE_MAX


def test_quantile_scales_the_wait_not_the_batch_size():
    """Head at 30, scale 1.2. Waiting: with one query queued the wait ends at 30 - 1.2 lat(2) = 19.2, not
    Proteus's 21. Running now (the queue is full, or the wait is over): the batch size is Proteus's, by the
    profile, so a tail estimate does not shrink batches and cost throughput."""
    policy = QuantileBatching(initial_scale=1.2)
    queue = QueryQueue()
    queue.push(0, 0.0, 30.0)
    decision = policy.decide(0.0, queue, lin, 4)
    assert decision.batch == 1 and decision.at_ms == pytest.approx(19.2)
    for k in range(1, 4):
        queue.push(k, 0.0, 30.0)
    for now in (19.0, 22.0):
        assert policy.decide(now, queue, lin, 4) == ProteusBatching().decide(now, queue, lin, 4)
    assert policy.decide(19.0, queue, lin, 4) == Dispatch(3, 19.0)  # 19 + lat(3) = 30 <= 30 < 19 + lat(4)


# --------------------------------------------------------------------------- properties

latencies = st.builds(
    lambda base, steps: (lambda table: (lambda b: table[b - 1]))([float(base + sum(steps[:k])) for k in range(1, 9)]),
    st.integers(1, 10),
    st.lists(st.integers(0, 4), min_size=8, max_size=8),
)


@st.composite
def workloads(draw):
    latency = draw(latencies)
    max_batch = draw(st.integers(1, 8))
    slo = float(draw(st.integers(int(latency(1)), 80)))  # feasible: a query alone fits in its SLO
    gaps = draw(st.lists(st.integers(0, 15), min_size=1, max_size=40))
    times, t = [], 0
    for g in gaps:
        t += g
        times.append(float(t))
    return latency, max_batch, slo, times


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["fifo", "edf"]), st.sampled_from(["never", "deadline"]))
def test_proteus_never_lets_a_servable_query_time_out(workload, order, rule):
    """Brute force: at every idle decision instant t, for every k <= max_batch such that the first k queued
    queries could start now as one batch and all meet their deadlines (t + latency(k) <= min of their
    deadlines), each of those k queries must end up served on time (never dropped, never late)."""
    latency, max_batch, slo, times = workload
    arrivals = with_slo(times, slo)
    deadline = {qid: d for qid, _, d in arrivals}
    run = drive(ProteusBatching(), arrivals, latency, max_batch, order, rule, slo, record=True)
    must_be_on_time: set[int] = set()
    for now, snapshot, _ in run.decisions:
        earliest = math.inf
        for k, (qid, _, d) in enumerate(snapshot[:max_batch], start=1):
            earliest = min(earliest, d)
            if now + latency(k) <= earliest:
                must_be_on_time.update(q[0] for q in snapshot[:k])
    for qid in must_be_on_time:
        assert qid not in run.dropped, f"query {qid} could have been served but was dropped"
        assert run.finish[qid] <= deadline[qid] + 1e-6, f"query {qid} could have been served but was late"
    # Waiting is always safe: a wait answer leaves the queued batch able to finish by the head's deadline.
    for now, snapshot, decision in run.decisions:
        if decision.batch and decision.at_ms > now:
            assert decision.batch == len(snapshot) < max_batch
            assert decision.at_ms + latency(decision.batch) <= snapshot[0][2] + 1e-6


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads(),
    st.sampled_from(BATCHING_POLICIES),
    st.sampled_from(["fifo", "edf"]),
    st.sampled_from(DROP_RULES),
    st.lists(st.integers(0, 40), min_size=40, max_size=40),
)
def test_conservation_every_query_popped_or_dropped_once(workload, name, order, rule, extra_slo):
    """Every pushed query is popped or dropped exactly once, for every policy, order and rule (with mixed
    SLOs, so FIFO deadlines come out of order)."""
    latency, max_batch, slo, times = workload
    arrivals = [(k, t, t + slo + extra_slo[k]) for k, t in enumerate(times)]
    params = {"max-delay": {"max_queue_delay_ms": 5.0}, "fixed": {"size": 2}}.get(name, {})
    run = drive(batching_policy_make(name, **params), arrivals, latency, max_batch, order, rule, slo)
    outcome = run.popped + run.dropped
    assert sorted(outcome) == [q[0] for q in arrivals]
    assert all(len(ids) <= max_batch for _, ids, _ in run.batches)
    if name == "nexus":
        # Nexus serves nothing late: it early-drops any head that its batch cannot bring in on time.
        assert all(run.finish[q] <= d + 1e-6 for q, _, d in arrivals if q in run.finish)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 100)), min_size=1, max_size=30),
    st.sampled_from(["fifo", "edf"]),
    st.sampled_from(DROP_RULES),
    st.integers(0, 150),
)
def test_drop_expired_matches_brute_force(queries, order, rule, now):
    """drop_expired drops exactly what the rule's definition says, with arbitrary (unsorted) arrivals and
    deadlines, and keeps the remaining queries in service order."""
    slo, lat1 = 10.0, 7.0
    queue = QueryQueue(order)
    items = [(k, float(a), float(a + d)) for k, (a, d) in enumerate(queries)]
    for item in items:
        queue.push(*item)

    def expired(item):
        _, arrival, deadline = item
        if rule == "deadline":
            return now + lat1 > deadline
        if rule == "never":
            return False
        return now - arrival > slo * (1.0 if rule == "slo-1x" else 2.0)

    dropped = queue.drop_expired(float(now), rule, slo, lat1)
    assert sorted(dropped) == sorted(q[0] for q in items if expired(q))
    kept = [q for q in items if not expired(q)]
    if order == "edf":
        kept.sort(key=lambda q: (q[2], q[1], q[0]))
    assert queue.snapshot() == kept
    assert queue.pop(len(kept)) == kept


def test_nexus_fifo_checks_the_earliest_deadline_in_the_batch_not_only_the_heads():
    """Found by the conservation property: in FIFO with mixed SLOs the second query of a batch may be due
    before the head. Deadlines 10, 11, 10 at t=0, latency 7 ms alone and 11 ms for two: checking the head
    alone ran [q1, q2] to finish at 11, q2 late. Now every query served is on time."""
    arrivals = [(0, 0.0, 10.0), (1, 0.0, 11.0), (2, 0.0, 10.0)]
    run = drive(batching_policy_make("nexus"), arrivals, lambda b: 7.0 if b == 1 else 11.0, 2, "fifo", "never", 10.0)
    assert sorted(run.popped + run.dropped) == [0, 1, 2]
    assert run.finish and all(run.finish[q] <= d + 1e-6 for q, _, d in arrivals if q in run.finish)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["fifo", "edf"]), st.sampled_from(["never", "deadline"]))
def test_quantile_with_exact_service_times_decides_as_proteus(workload, order, rule):
    """Service exactly as profiled (scale stays 1): every decision equals Proteus's."""
    latency, max_batch, slo, times = workload
    arrivals = with_slo(times, slo)
    ours = drive(QuantileBatching(refresh=1), arrivals, latency, max_batch, order, rule, slo, record=True)
    theirs = drive(ProteusBatching(), arrivals, latency, max_batch, order, rule, slo, record=True)
    assert ours.batches == theirs.batches and ours.dropped == theirs.dropped


# --------------------------------------------------------------------------- the Proteus artefact's batching


def test_the_proteus_artefacts_batching_as_its_code_reads():
    """ProteusArtefactBatching (issue 41; docs/fidelity-proteus.md, section 3): the Proteus authors' simulator
    times its wait to the batch the queue already fills, T(floor2(q)) with sizes 1, 2, 4, 8, drops the head
    when an arrival makes that batch too slow for it, never starts a batch on an arrival, and after a batch
    runs only what its timer or a full queue asks for. latency(b) = 5 + 2b: T(1)=7, T(2)=9, T(4)=13, T(8)=21."""
    from engine.dataplane.batching import REFERENCE_BATCHING_POLICIES, ProteusArtefactBatching

    assert "proteus-artefact" in REFERENCE_BATCHING_POLICIES and "proteus-artefact" not in BATCHING_POLICIES  # not offered to runtimes
    policy = batching_policy_make("proteus-artefact")
    assert isinstance(policy, ProteusArtefactBatching) and policy is not batching_policy_make("proteus-artefact")
    assert [ProteusArtefactBatching.floor2(n, 8) for n in (1, 2, 3, 4, 7, 8, 20)] == [1, 2, 2, 4, 4, 8, 8]
    assert ProteusArtefactBatching.floor2(20, 6) == 4  # the largest allowed size is capped by the plan's max batch

    queue = QueryQueue()
    queue.push(1, 0.0, 100.0)
    assert policy.decide(0.0, queue, lin, 8) == Dispatch(1, 93.0)  # one timer: deadline - T(1)
    # A second query at 92 ms: floor2(2) = 2 and 92 + T(2) = 101 > 100, so the head is dropped, and the wait
    # is timed again for the new head alone (the paper's rule would have run both by 100).
    queue.push(2, 92.0, 192.0)
    assert policy.decide(92.0, queue, lin, 8) == Dispatch(1, 185.0)
    assert queue.drop_expired(92.0, "never", 0.0, 0.0) == [1] and len(queue) == 1

    # A full queue on arrival still waits for the timer; the timer runs floor2(q).
    policy, queue = batching_policy_make("proteus-artefact"), QueryQueue()
    for k in range(10):
        queue.push(k, 0.0, 100.0)
    assert policy.decide(0.0, queue, lin, 8) == Dispatch(8, 79.0)
    assert policy.decide(79.0, queue, lin, 8) == Dispatch(8, 79.0)  # the timer: run 8 now
    queue.pop(8)
    policy.observe(8, lin(8), 0)  # the batch ends at 100
    # The head timer set when the batch started (100 - T(2) = 91) fired while it ran: the 2 left run at once,
    # late (the paper's rule would have shrunk the first batch instead).
    assert policy.decide(100.0, queue, lin, 8) == Dispatch(2, 100.0)
    queue.pop(2)
    policy.observe(2, lin(2), 0)

    # A batch that ends with more than the largest batch queued runs the largest batch at once.
    policy, queue = batching_policy_make("proteus-artefact"), QueryQueue()
    for k in range(4):
        queue.push(k, 0.0, 1000.0)
    assert policy.decide(0.0, queue, lin, 4) == Dispatch(4, 987.0)
    assert policy.decide(987.0, queue, lin, 4) == Dispatch(4, 987.0)
    queue.pop(4)
    for k in range(4, 9):
        queue.push(k, 990.0, 1990.0)  # while busy: their head timers (1977 and later) are still to come
    policy.observe(4, lin(4), 0)
    assert policy.decide(1000.0, queue, lin, 4) == Dispatch(4, 1000.0)
    queue.pop(4)
    policy.observe(4, lin(4), 0)
    assert policy.decide(1013.0, queue, lin, 4) == Dispatch(1, 1983.0)  # 1 left: its head timer, 1990 - T(1)

    # A replaced timer that fires while the instance is busy makes a later batch end run at once, even one
    # batch later (the flag waits for a batch end with queries queued).
    policy, queue = batching_policy_make("proteus-artefact"), QueryQueue()
    queue.push(1, 0.0, 100.0)
    assert policy.decide(0.0, queue, lin, 8) == Dispatch(1, 93.0)
    assert policy.decide(93.0, queue, lin, 8) == Dispatch(1, 93.0)
    queue.pop(1)
    queue.push(2, 95.0, 110.0)  # arrives while busy: its head timer is 110 - T(1) = 103
    policy.observe(1, lin(1), 0)  # ends at 100
    assert policy.decide(100.0, queue, lin, 8) == Dispatch(1, 103.0)  # nothing fired while busy: wait for 103
    queue.push(3, 101.0, 201.0)  # an arrival first: floor2(2) = 2 ends at 110 = the head's deadline, so no drop,
    assert policy.decide(101.0, queue, lin, 8) == Dispatch(2, 101.0)  # and its timer 110 - 9 = 101 is now: run
    queue.pop(2)
    policy.observe(2, lin(2), 0)  # ends at 110 with nothing queued (no decision); the replaced 103 fired meanwhile
    queue.push(4, 200.0, 300.0)
    assert policy.decide(200.0, queue, lin, 8) == Dispatch(1, 293.0)  # an arrival: as ever
    assert policy.decide(293.0, queue, lin, 8) == Dispatch(1, 293.0)
    queue.pop(1)
    queue.push(5, 295.0, 395.0)
    policy.observe(1, lin(1), 0)
    assert policy.decide(300.0, queue, lin, 8) == Dispatch(1, 300.0)  # the flag from 103: run at once, not at 388


def test_the_proteus_artefacts_batching_in_the_simulator_ends_every_query_once():
    """The simulator drives the artefact's batching per its contract (observe before each batch end's
    decision, early drops collected) and every query ends exactly once, on Poisson load near capacity."""
    from engine.simulation.simulator import SimulationConfig, simulate
    from engine.simulation.workload import arrivals_poisson
    from tests.engine.test_simulator import QUIET, check_conservation, fixed_planner, tiny_problem

    runs = {}
    for rate in (20.0, 140.0):  # light, and near what batches of 4 at 28 ms serve (143/s)
        trace = arrivals_poisson(rate, 20.0, 1, application="app0")
        for policy, rule in (("proteus-artefact", "slo-2x"), ("proteus", "deadline")):
            result = simulate(tiny_problem(demand=rate), trace, planner=fixed_planner(("g0", "full", "v0", None, rate)),
                              config=SimulationConfig(batching=policy, drop_rule=rule, seed=0, **QUIET))
            check_conservation(result)
            runs[rate, policy] = result.summary
    # Its signature: at light load the paper's rule drops nothing and the artefact's drops heads at batch
    # size steps; near capacity it keeps batches large and serves late (under 2x the SLO) where the paper's
    # shrinks them and drops.
    assert runs[20.0, "proteus"]["dropped"] == 0 and runs[20.0, "proteus-artefact"]["dropped"] > 0
    near = runs[140.0, "proteus-artefact"]
    assert near["late"] > near["dropped"] and near["on_time"] + near["late"] > 0.95 * near["queries"]
    assert runs[140.0, "proteus"]["late"] == 0
