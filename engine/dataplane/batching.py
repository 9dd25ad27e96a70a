"""Batching policies for one serving instance: ONE implementation shared by the discrete-event simulator
and the live worker runtime (pure Python, no Django).

A `QueryQueue` holds an instance's queued queries in FIFO (arrival) or EDF (deadline) order. A
`BatchingPolicy` looks at the queue when the instance is idle and answers with a `Dispatch`: how many
queries to take from the head, and when.

Caller contract (simulator or runtime):

- Call `decide` whenever the instance is idle and (a) a query arrives, (b) the `at_ms` it last returned is
  reached, or (c) a batch completes. Apply `queue.drop_expired(...)` before each `decide`.
- `Dispatch(b, at)` with `b > 0` and `at <= now`: pop `b` queries now and run them. With `at > now`: run
  `b` at `at` unless something arrives first, in which case ask again (the answer may change). `b == 0`:
  nothing to do until the next arrival (`at` is then infinite).
- `latency_ms(b)` is the profiled latency of a batch of `b`; the policies assume it is non-decreasing in
  `b`. `max_batch` is the largest batch the plan allows on the instance; `max_batch < 1` means the
  instance cannot serve, and every policy then answers "nothing to do".
- After each batch, call `policy.observe(batch, latency_ms, late)` (only AIMD uses it).

One addition to the interface: a policy may *early-drop* queries from the head of the queue inside
`decide` (Nexus does, and the Proteus artefact's batching, kept for comparisons; no other policy does). Their ids are kept by the queue and returned, first, by the
next `drop_expired` call, whatever its rule, so every pushed query is still popped or dropped exactly
once. A caller that stops should call `drop_expired(now, "never", ...)` once more to collect them.

Deadline comparisons allow `DEADLINE_TOLERANCE_MS` (1 ns) of floating-point rounding, so that a batch
planned to end exactly at a deadline (Proteus waits until `T_exp - T_process(q+1)`) counts as on time.

Speed: the simulator must reach 200,000 simulated queries per second on one core, so the queue stores
ready-made `(id, arrival_ms, deadline_ms)` tuples (`head()` allocates nothing), the classes use
`__slots__`, the drop rules look only at the head of the queue when the queue order allows it (and
otherwise keep lower bounds that make a full scan rare), and nothing here logs.
"""
from __future__ import annotations

import abc
import math
from bisect import bisect_right
from collections import deque
from heapq import heapify, heappop, heappush
from itertools import islice
from typing import Any, Callable, Literal, NamedTuple, Protocol, Sequence

from engine.plans.capacity import profile_interpolate

__all__ = [
    "BATCHING_POLICIES",
    "DEFAULT_BATCHING_POLICY",
    "DEADLINE_TOLERANCE_MS",
    "DROP_RULES",
    "QUEUE_ORDERS",
    "AimdBatching",
    "BatchingPolicy",
    "Dispatch",
    "DropRule",
    "FixedBatching",
    "MaxDelayBatching",
    "NexusBatching",
    "ProteusArtefactBatching",
    "ProteusBatching",
    "QuantileBatching",
    "QueryQueue",
    "QueueOrder",
    "REFERENCE_BATCHING_POLICIES",
    "batching_policy_make",
]

QueueOrder = Literal["fifo", "edf"]
DropRule = Literal["never", "deadline", "slo-1x", "slo-2x"]

QUEUE_ORDERS: tuple[str, ...] = ("fifo", "edf")
DROP_RULES: tuple[str, ...] = ("never", "deadline", "slo-1x", "slo-2x")
BATCHING_POLICIES: tuple[str, ...] = ("proteus", "quantile", "aimd", "nexus", "max-delay", "fixed")
# What plans translate to and the simulator runs unless told otherwise: Nexus's work-conserving batching
# with early drop, which had the fewest SLO violations of every policy here in each bench that compares
# them (benches/batching.py: 9x fewer than Proteus's on Poisson arrivals at 5 % noise; end_to_end.py:
# 0.019 against 0.079; proteus_traces.py: 0.31-0.43x Proteus's recorded violations against 0.40-0.59x
# with `quantile`). `proteus` stays the faithful paper policy.
DEFAULT_BATCHING_POLICY = "nexus"
# Policies that reproduce another system's simulator rather than a paper's rule, for comparisons only: the
# simulator and `batching_policy_make` know them, runtimes are not offered them.
REFERENCE_BATCHING_POLICIES: tuple[str, ...] = ("proteus-artefact",)

# Floating-point slack in every "finishes by its deadline" test (1 ns, in milliseconds).
DEADLINE_TOLERANCE_MS = 1e-6

_INF = math.inf
_SLO_FACTOR = {"slo-1x": 1.0, "slo-2x": 2.0}

Query = tuple[int, float, float]  # (id, arrival_ms, deadline_ms)


class Dispatch(NamedTuple):
    """A policy's answer: take `batch` queries from the head at `at_ms` (<= now means now).
    `batch == 0` means nothing to do until the next arrival."""

    batch: int
    at_ms: float


_IDLE = Dispatch(0, _INF)


# --------------------------------------------------------------------------- the queue


class QueryQueue:
    """Queued queries of one instance, in FIFO (arrival) or EDF (deadline) order.

    FIFO is a `collections.deque` of `(id, arrival_ms, deadline_ms)` tuples in push order. EDF is a binary
    heap of `(deadline_ms, arrival_ms, id, item)` entries, so ties on the deadline go to the earlier
    arrival, then to the smaller id (ids are unique, so `item` is never compared).

    The drop rules must not scan the whole queue on every call. For each of the two times (arrival,
    deadline) the queue tracks whether pushes came in non-decreasing order (FIFO: then the earliest is at
    the head, and expired queries are a prefix) and otherwise a lower bound of the earliest queued value
    (a scan happens only when the bound says something may have expired, and it recomputes the bound).
    """

    __slots__ = (
        "order",
        "_edf",
        "_dq",
        "_heap",
        "_early",
        "_dl_sorted",
        "_dl_max",
        "_dl_lb",
        "_ar_sorted",
        "_ar_max",
        "_ar_lb",
    )

    def __init__(self, order: QueueOrder = "fifo") -> None:
        if order not in QUEUE_ORDERS:
            raise ValueError(f"queue order must be one of {QUEUE_ORDERS}, not {order!r}")
        self.order = order
        self._edf = order == "edf"
        self._dq: deque[Query] = deque()
        self._heap: list[tuple[float, float, int, Query]] = []
        # Ids a policy dropped from the head (Nexus early drop), reported by the next drop_expired.
        self._early: list[int] = []
        self._reset_stats()

    def _reset_stats(self) -> None:
        # Valid for an empty queue: any next push keeps both orders sorted.
        self._dl_sorted = True
        self._dl_max = -_INF
        self._dl_lb = _INF
        self._ar_sorted = True
        self._ar_max = -_INF
        self._ar_lb = _INF

    # ------------------------------------------------------------------ basic operations

    def push(self, query_id: int, arrival_ms: float, deadline_ms: float) -> None:
        """Queue a query. Deadlines and arrivals may come in any order; FIFO serves in push order."""
        item = (query_id, arrival_ms, deadline_ms)
        if self._edf:
            heap = self._heap
            heappush(heap, (deadline_ms, arrival_ms, query_id, item))
            # EDF needs only the lower bound of the arrivals (the deadline minimum is the heap's head).
            if arrival_ms < self._ar_lb:
                self._ar_lb = arrival_ms
            return
        dq = self._dq
        if deadline_ms < self._dl_max:  # out of order: the earliest deadline may no longer be at the head
            if self._dl_sorted:
                self._dl_sorted = False
                head = dq[0][2]  # the queue is not empty here: _dl_max is finite only then
                self._dl_lb = head if head < deadline_ms else deadline_ms
            elif deadline_ms < self._dl_lb:
                self._dl_lb = deadline_ms
        else:
            self._dl_max = deadline_ms
        if arrival_ms < self._ar_max:
            if self._ar_sorted:
                self._ar_sorted = False
                head = dq[0][1]
                self._ar_lb = head if head < arrival_ms else arrival_ms
            elif arrival_ms < self._ar_lb:
                self._ar_lb = arrival_ms
        else:
            self._ar_max = arrival_ms
        dq.append(item)

    def __len__(self) -> int:
        return len(self._heap) if self._edf else len(self._dq)

    def __bool__(self) -> bool:
        return bool(self._heap) if self._edf else bool(self._dq)

    def head(self) -> Query:
        """(id, arrival_ms, deadline_ms) of the query served next. IndexError if the queue is empty."""
        if self._edf:
            return self._heap[0][3]
        return self._dq[0]

    def deadline_earliest(self, n: int) -> float:
        """The earliest deadline of the next `n` queries: the head's in EDF and while FIFO deadlines are in
        order (one SLO per queue, the hot path); a scan of the first `n` only when they are not."""
        if self._edf or self._dl_sorted:
            return self.head()[2]
        return min(q[2] for q in islice(self._dq, n))

    def pop(self, n: int) -> list[Query]:
        """Remove and return the next `n` queries in service order (all of them if fewer are queued)."""
        if self._edf:
            heap = self._heap
            if n >= len(heap):
                out = [entry[3] for entry in sorted(heap)]
                heap.clear()
                self._reset_stats()
                return out
            return [heappop(heap)[3] for _ in range(n)]
        dq = self._dq
        if n >= len(dq):
            out = list(dq)
            dq.clear()
            self._reset_stats()
            return out
        popleft = dq.popleft
        return [popleft() for _ in range(n)]

    def snapshot(self) -> list[Query]:
        """All queued queries in service order, without removing them (O(n log n) for EDF; not for hot paths)."""
        if self._edf:
            return [entry[3] for entry in sorted(self._heap)]
        return list(self._dq)

    def discard_head(self) -> int:
        """Early drop: remove the head query without serving it and return its id. The id is reported by
        the next `drop_expired` call (whatever its rule), so the caller accounts for it."""
        if self._edf:
            heap = self._heap
            query_id = heappop(heap)[2]
            if not heap:
                self._reset_stats()
        else:
            dq = self._dq
            query_id = dq.popleft()[0]
            if not dq:
                self._reset_stats()
        self._early.append(query_id)
        return query_id

    # ------------------------------------------------------------------ drop rules

    def drop_expired(self, now_ms: float, rule: DropRule, slo_ms: float, latency_ms_at_1: float) -> list[int]:
        """Remove and return the ids of queries the rule drops, after the ids a policy early-dropped since
        the last call.

        - "never": nothing (beyond the early drops);
        - "deadline": the query cannot finish by its deadline even alone: now + latency(1) > deadline;
        - "slo-1x" / "slo-2x": the query has waited longer than 1x / 2x the SLO: now - arrival > k * slo.

        Sources (Razavi thesis, docs/references.md): IPA §P3.4.5
        "Dropping" drops a request that has already passed its SLO and one whose latency exceeds 2x the SLO;
        Biscale §P4.6.3 "Request Dropping Effect" compares dropping at 1x the SLO, at 3x, and never (1x
        fewest violations). "deadline" is the Nexus-style early test (Proteus §2.2, §6.4), which drops
        sooner than "slo-1x". Departure: there is no 3x rule (FA2 §P1.6.4 and Biscale §P4.6.3 use one).
        """
        early = self._early
        if early:
            dropped = early
            self._early = []
        else:
            dropped = []
        if rule == "deadline":
            # Expired: deadline + tolerance < now + latency(1).
            threshold = now_ms + latency_ms_at_1 - DEADLINE_TOLERANCE_MS
            if self._edf:
                heap = self._heap
                if heap and heap[0][0] < threshold:
                    append = dropped.append
                    while heap and heap[0][0] < threshold:
                        append(heappop(heap)[2])
                    if not heap:
                        self._reset_stats()
                return dropped
            self._fifo_drop(2, threshold, dropped)
            return dropped
        if rule == "never":
            return dropped
        factor = _SLO_FACTOR.get(rule)
        if factor is None:
            raise ValueError(f"drop rule must be one of {DROP_RULES}, not {rule!r}")
        # Expired: arrival < now - k * slo (waited strictly longer than k * slo).
        threshold = now_ms - factor * slo_ms
        if self._edf:
            heap = self._heap
            if heap and self._ar_lb < threshold:
                keep = []
                append = dropped.append
                lowest = _INF
                for entry in heap:
                    arrival = entry[1]
                    if arrival < threshold:
                        append(entry[2])
                    else:
                        keep.append(entry)
                        if arrival < lowest:
                            lowest = arrival
                heapify(keep)
                self._heap = keep
                if keep:
                    self._ar_lb = lowest
                else:
                    self._reset_stats()
            return dropped
        self._fifo_drop(1, threshold, dropped)
        return dropped

    def _fifo_drop(self, field: int, threshold: float, dropped: list[int]) -> None:
        """Drop every FIFO query whose `field` (1 arrival, 2 deadline) is below `threshold`. When that field
        is still in queue order the expired ones are a prefix and are popped; otherwise the queue is
        filtered, and only when its lower bound says something is below the threshold."""
        dq = self._dq
        if not dq:
            return
        if self._dl_sorted if field == 2 else self._ar_sorted:
            if dq[0][field] < threshold:
                append = dropped.append
                popleft = dq.popleft
                while dq and dq[0][field] < threshold:
                    append(popleft()[0])
                if not dq:
                    self._reset_stats()
        elif (self._dl_lb if field == 2 else self._ar_lb) < threshold:
            self._fifo_filter(field, threshold, dropped)

    def _fifo_filter(self, field: int, threshold: float, dropped: list[int]) -> None:
        """Drop every FIFO query whose `field` (1 arrival, 2 deadline) is below `threshold`, keep the rest in
        order, and recompute the order statistics from what is left."""
        keep: deque[Query] = deque()
        append = dropped.append
        for item in self._dq:
            if item[field] < threshold:
                append(item[0])
            else:
                keep.append(item)
        self._dq = keep
        self._reset_stats()
        if not keep:
            return
        dl_sorted = ar_sorted = True
        dl_max = ar_max = -_INF
        dl_min = ar_min = _INF
        for _, arrival, deadline in keep:
            if deadline < dl_max:
                dl_sorted = False
            else:
                dl_max = deadline
            if deadline < dl_min:
                dl_min = deadline
            if arrival < ar_max:
                ar_sorted = False
            else:
                ar_max = arrival
            if arrival < ar_min:
                ar_min = arrival
        self._dl_sorted, self._dl_max, self._dl_lb = dl_sorted, dl_max, dl_min
        self._ar_sorted, self._ar_max, self._ar_lb = ar_sorted, ar_max, ar_min


# --------------------------------------------------------------------------- policies


class BatchingPolicy(Protocol):
    name: str

    def decide(
        self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int
    ) -> Dispatch: ...

    def observe(self, batch: int, latency_ms: float, late: int) -> None: ...


class _Policy(abc.ABC):
    """What the policies share: `decide` answers "nothing to do" (`_IDLE`) on an empty queue or a zero cap
    and otherwise asks the policy's `_decide` with the queue's length `n` (>= 1); `observe` does nothing
    unless the policy learns from its batches (AIMD, quantile)."""

    __slots__ = ()
    name = ""

    def decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int) -> Dispatch:
        n = len(queue)
        if n == 0 or max_batch < 1:
            return _IDLE
        return self._decide(now_ms, queue, latency_ms, max_batch, n)

    @abc.abstractmethod
    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        """The policy's answer for `n` >= 1 queued queries and a cap >= 1."""

    def observe(self, batch: int, latency_ms: float, late: int) -> None:
        return None


def _clamp(b: int, max_batch: int, n: int) -> int:
    """`b` capped by the batch cap and the queries queued."""
    if b > max_batch:
        b = max_batch
    return b if b < n else n


def _positive_int(policy: str, name: str, value: Any, *, optional: bool = False) -> None:
    """ValueError unless `value` is an integer >= 1 (or None, when `optional`)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{policy}: {name} must be a positive integer{' or None' if optional else ''}, not {value!r}")


def _largest_feasible(latency_ms: Callable[[int], float], lo: int, hi: int, budget: float) -> int:
    """Largest b in [lo, hi] with latency_ms(b) <= budget, given latency_ms(lo) <= budget < latency_ms(hi)
    and latency non-decreasing (binary search)."""
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if latency_ms(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _proactive_dispatch(now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, q: int, scale: float) -> Dispatch:
    """Proteus's rule (see ProteusBatching), waiting until T_exp - T_process(q+1) x `scale`
    (QuantileBatching's tail scale; 1 for Proteus). Only the wait is scaled: the batch size when running
    now is Proteus's, by the profile (scaling it too shrank batches at high load, losing throughput:
    3x Proteus's violations on benches/batching.py's Poisson case at 0.8 load). `q` >= 1 queued."""
    deadline = queue.head()[2]
    if q < max_batch:
        wait_until = deadline - latency_ms(q + 1) * scale
        if now_ms < wait_until:
            return Dispatch(q, wait_until)
        b = q
    else:
        b = max_batch
    budget = deadline + DEADLINE_TOLERANCE_MS - now_ms
    if latency_ms(b) > budget and b > 1:
        if latency_ms(1) <= budget:
            b = _largest_feasible(latency_ms, 1, b, budget)
        # else: the head is late even alone; run the whole batch (see ProteusBatching's docstring).
    return Dispatch(b, now_ms)


class ProteusBatching(_Policy):
    """Proteus's adaptive batching (Ahmad et al., "Proteus: A High-Throughput Inference-Serving System with
    Accuracy Scaling", ASPLOS'24, §5 "Adaptive Batching", Figure 3; evaluated in §6.4, Figure 6).
    Proactive and NOT work-conserving.

    The paper's rule: with q queries queued, the first expiring at T_exp(1), wait for the (q+1)-th query
    until T_max_wait(q+1) = T_exp(1) - T_process(q+1). Case 1: nothing arrives by then, run the q queued
    at T_max_wait(q+1). Case 2: the (q+1)-th arrives first; if T_max_wait(q+2) is already past, run q+1
    now, else wait again with q' = q+1. The authors' simulator does the same (UMass-LIDS/Proteus
    `core/predictor.py`: `max_waiting_time = first_request_expiration -
    batch_processing_latency(batch_size)`, `batch_size` counting the newly arrived query).

    As implemented, with q queries queued (head deadline T_exp, T_process(b) = latency_ms(b)):

    - q >= max_batch: run max_batch now (the batch cannot grow).
    - otherwise wait for the (q+1)-th query until t_w = T_exp - T_process(q+1): answer Dispatch(q, t_w);
      an arrival before t_w re-asks with q+1 (Case 2). When t_w is reached (Case 1), or already past,
      run now.
    - running now takes the largest b <= min(q, max_batch) with now + T_process(b) <= T_exp, so the head
      never times out when some batch could still serve it in time (§5's proactive idea: no queued query
      should time out needlessly). Waiting never costs a query its deadline: at t_w a batch of q ends by
      T_exp - T_process(q+1) + T_process(q) <= T_exp.
    - if the head cannot meet its deadline even alone, it is late whatever happens (dropping it is the drop
      rule's business); the policy then runs min(q, max_batch) now, clearing the backlog fastest.

    Departure: §5 has no batch cap and assumes the device idle while the queue fills; here the batch is
    capped at `max_batch` (§4's "maximum allowed batch size") and, when the device was busy past t_w, shrunk
    to what still meets the head's deadline (the artefact drops heads instead, keeping the batch large).

    Only the head's deadline is checked, as in the paper: in FIFO with one SLO per instance (and in EDF) it
    is the earliest deadline of the batch.
    """

    __slots__ = ()
    name = "proteus"

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        return _proactive_dispatch(now_ms, queue, latency_ms, max_batch, n, 1.0)


class QuantileBatching(_Policy):
    """Proteus's proactive, non-work-conserving rule (`ProteusBatching`, §5 of the Proteus paper) timed
    against a tail quantile of the instance's measured service time instead of the profiled latency.

    Why: Proteus waits until T_exp - T_process(q+1) and so plans each batch to end exactly at the head's
    deadline; with any noise in service time about half of those batches end late (benches/batching.py:
    9x Nexus's violations on Poisson arrivals at 5 % noise). Here the wait ends at T_exp - T_process(q+1)
    x `scale`, `scale` being the `quantile` (default p99) of measured / profiled latency over the last
    `window` batches, re-read every `refresh` batches (`observe` feeds it; until `refresh` batches have
    been seen the scale is `initial_scale`). The batch size is Proteus's choice, so with exact service
    times (scale 1) the two policies decide alike. The scale is clamped to [SCALE_MIN, SCALE_MAX] so that
    one absurd measurement cannot stall or flood the instance.

    Measured (benches/batching.py, one static plan on Proteus's fleet size): as many violations as Proteus
    or fewer in every case, e.g. at 0.8 load 0.017 / 0.096 on Poisson / Gamma(0.05) at 5 % noise against
    Proteus's 0.031 / 0.113; Nexus's work-conserving batching with early drop has fewer still (0.0034 /
    0.051), and far fewer at 0.95 load. On the bench's --quick fleet at 0.9 load it has more than Proteus
    on uniform arrivals (0.032 against 0.007): waiting less builds smaller batches. A first step towards a
    policy that plans against the latency distribution, not the answer."""

    SCALE_MIN = 0.5
    SCALE_MAX = 4.0
    __slots__ = ("quantile", "window", "refresh", "scale", "_ratios", "_seen", "_latency")
    name = "quantile"

    def __init__(self, quantile: float = 0.99, window: int = 256, refresh: int = 16, initial_scale: float = 1.0) -> None:
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile: quantile must be in (0, 1], not {quantile!r}")
        _positive_int("quantile", "window", window)
        _positive_int("quantile", "refresh", refresh)
        if not self.SCALE_MIN <= initial_scale <= self.SCALE_MAX:
            raise ValueError(f"quantile: initial_scale must be in [{self.SCALE_MIN}, {self.SCALE_MAX}], not {initial_scale!r}")
        self.quantile = float(quantile)
        self.window = window
        self.refresh = refresh
        self.scale = float(initial_scale)
        self._ratios: deque[float] = deque(maxlen=window)
        self._seen = 0
        self._latency: Callable[[int], float] | None = None

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        self._latency = latency_ms
        return _proactive_dispatch(now_ms, queue, latency_ms, max_batch, n, self.scale)

    def observe(self, batch: int, latency_ms: float, late: int) -> None:
        profiled = self._latency(batch) if self._latency is not None and batch > 0 else 0.0
        if not profiled > 0:
            return
        self._ratios.append(latency_ms / profiled)
        self._seen += 1
        if self._seen % self.refresh == 0:
            ordered = sorted(self._ratios)
            value = ordered[min(len(ordered) - 1, int(math.ceil(self.quantile * len(ordered))) - 1)]
            self.scale = min(self.SCALE_MAX, max(self.SCALE_MIN, value))


class AimdBatching(_Policy):
    """Clipper's AIMD batching as the Proteus paper uses it as a baseline (Ahmad et al., ASPLOS'24: §2.2
    "Challenge 2", §6.1.1 "Clipper", §6.4, Figure 6), after Clipper itself (Crankshaw et al., "Clipper: A
    Low-Latency Online Prediction Serving System", NSDI'17, §4.3, "Dynamic Batch Size").

    The rule: an additive-increase, multiplicative-decrease (AIMD) cap on the batch size. Proteus describes
    it as reactive: it raises the batch size step by step until batches time out, then backs off
    multiplicatively, without looking at the queue or at when queued queries expire (§6.4). Clipper's own
    paper tests the batch's latency against the latency objective and backs off by 10% (`backoff=0.9`);
    that paper is not among the works in docs/references.md, so the 10% is taken from it as
    cited, not re-checked here. The open-source Clipper has no AIMD code (it sizes batches from a
    throughput estimate). Work-conserving: when idle, take min(len(queue), cap, max_batch) now.

    `observe(batch, latency_ms, late)`: the batch is late if any of its queries missed its deadline
    (`late > 0`, Proteus's "latency timeouts") or, when `slo_ms` is given, its latency exceeded `slo_ms`
    (Clipper's own test). A late batch multiplies the cap by `backoff` (never below 1); an on-time batch
    adds `step` (never above the last `max_batch` seen). The cap is kept as a float so that repeated 10%
    cuts accumulate; the batch size used is its integer part. Defaults: start at `initial=1`, `step=1`
    (neither paper gives a step size; the Proteus artefact's Clipper baseline also moves one batch size at
    a time).

    Departure: work-conserving, where the Proteus artefact's AIMD waits until the queue holds a full batch
    of the cap (see benches/batching.py's notes); the papers do not say when a batch is dispatched.
    """

    __slots__ = ("cap", "step", "backoff", "slo_ms", "_limit")
    name = "aimd"

    def __init__(
        self, initial: float = 1.0, step: float = 1.0, backoff: float = 0.9, slo_ms: float | None = None
    ) -> None:
        if not initial >= 1:
            raise ValueError(f"aimd: initial cap must be >= 1, not {initial!r}")
        if not step > 0:
            raise ValueError(f"aimd: step must be > 0, not {step!r}")
        if not 0 < backoff < 1:
            raise ValueError(f"aimd: backoff must be in (0, 1), not {backoff!r}")
        if slo_ms is not None and not slo_ms > 0:
            raise ValueError(f"aimd: slo_ms must be > 0, not {slo_ms!r}")
        self.cap = float(initial)
        self.step = float(step)
        self.backoff = float(backoff)
        self.slo_ms = slo_ms
        self._limit = _INF  # the last max_batch seen by decide

    @property
    def batch_cap(self) -> int:
        """The batch size the cap allows now (its integer part, at least 1)."""
        return int(self.cap)

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        self._limit = max_batch
        return Dispatch(_clamp(int(self.cap), max_batch, n), now_ms)

    def observe(self, batch: int, latency_ms: float, late: int) -> None:
        slo = self.slo_ms
        if late > 0 or (slo is not None and latency_ms > slo):
            cap = self.cap * self.backoff
            self.cap = cap if cap > 1.0 else 1.0
        else:
            cap = self.cap + self.step
            limit = self._limit
            self.cap = cap if cap < limit else float(max(limit, 1))


class NexusBatching(_Policy):
    """Nexus's early-drop batching as the Proteus paper uses it as a baseline (Ahmad et al., ASPLOS'24:
    §2.2 "Challenge 2": proactive early dropping, work-conserving; §6.4, Figure 6: Nexus sends a device its
    next batch as soon as the previous one finishes), after Nexus itself (Shen et al., "Nexus: A GPU
    Cluster Engine for Accelerating DNN-Based Video Analysis", SOSP'19, the early-drop dispatch of its
    backend; that paper is not among the works in docs/references.md, so its section is not
    cited). The rule was checked against the authors' code: uwsampl/nexus
    `src/nexus/backend/model_exec.cpp`, `ModelExecutor::GetBatchTask` (pops in deadline order, drops
    inputs whose deadline is before now + latency(batch), shrinks the batch to the inputs left), and the
    later dispatcher's `DropPolicy::kWindowDrop`, "allow dropping head of queue so that the system can keep
    big batch size". Work-conserving, as Proteus §6.4 describes it.

    Sliding window: the window is the batch size that keeps the planned throughput, `window` (default: the
    plan's `max_batch`, which the capacity model sized for the instance's share of the load), never more
    than the queries left. Scanning from the head, a head query whose deadline cannot be met by a batch of
    the window, now + latency(min(window, queued)) > deadline, is dropped early (`queue.discard_head()`;
    the id is reported by the next `drop_expired`), and the window slides to the next query, shrinking
    when fewer queries remain (as `GetBatchTask` re-estimates the batch from what is left). The scan stops
    at the first query that fits; the batch is then the largest b <= min(max_batch, queued) with
    now + latency(b) <= head deadline, run now. With the default window this is min(max_batch, queued)
    (Nexus's behaviour); `window=1` keeps only the "cannot make it even alone" drop and serves the largest
    batch the head allows.

    Deadlines are those of the batch's earliest query: the head's, as in the authors' code (its queue is in
    deadline order), except in a FIFO queue whose deadlines came out of order (mixed SLOs), where a query
    behind the head may be due first (`QueryQueue.deadline_earliest`).

    Queries that cannot meet their deadline even at b = 1 are also what `drop_expired(..., "deadline")`
    removes; Nexus drops them itself whatever the caller's rule.

    Departure: none from Proteus's description; the Proteus artefact's Nexus baseline, though, waits for a
    full batch (a timer at head deadline - latency(max batch)), which this policy does not.
    """

    __slots__ = ("window",)
    name = "nexus"

    def __init__(self, window: int | None = None) -> None:
        _positive_int("nexus", "window", window, optional=True)
        self.window = window

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        w = self.window
        if w is None or w > max_batch:
            w = max_batch
        b = w if w < n else n
        lat_b = latency_ms(b)
        # The earliest deadline in the batch: the head's, except in a FIFO queue whose deadlines came out of
        # order (mixed SLOs), where a query behind the head may be due first.
        deadline = queue.deadline_earliest(b)
        while now_ms + lat_b > deadline + DEADLINE_TOLERANCE_MS:
            queue.discard_head()
            n -= 1
            if n == 0:
                return _IDLE
            if n < b:
                b = n
                lat_b = latency_ms(b)
            deadline = queue.deadline_earliest(b)
        top = max_batch if max_batch < n else n
        if top > b:
            if queue.deadline_earliest(top) == deadline:
                budget = deadline + DEADLINE_TOLERANCE_MS - now_ms
                if latency_ms(top) <= budget:
                    b = top
                else:
                    b = _largest_feasible(latency_ms, b, top, budget)
            else:  # out-of-order deadlines: grow one query at a time while the batch's earliest still fits
                while b < top and now_ms + latency_ms(b + 1) <= queue.deadline_earliest(b + 1) + DEADLINE_TOLERANCE_MS:
                    b += 1
        return Dispatch(b, now_ms)


class MaxDelayBatching(_Policy):
    """Triton-style dynamic batching (NVIDIA Triton Inference Server user guide, "Batchers: Dynamic Batcher",
    `preferred_batch_size` and `max_queue_delay_microseconds`, here in milliseconds). Not work-conserving
    when a delay is set. None of the papers defines it (Proteus §6.1.1 names Triton only as a static
    system that its Clipper baseline stands for); it is here as the production default to compare with.

    - If a preferred batch size can be formed, run the largest preferred size <= min(queued, max_batch) now.
    - Else, if the batch cannot grow (queued >= max_batch), run max_batch now.
    - Else, if the head has waited `max_queue_delay_ms`, run min(queued, max_batch) now;
      otherwise answer Dispatch(min(queued, max_batch), head arrival + max_queue_delay_ms).

    Default preferred sizes: the powers of two from 2 up to max_batch, plus max_batch itself (the largest
    batch, which Triton always sends at once). 1 is left out: with it every query could form a
    "preferred" batch at once and the delay would never apply.
    """

    __slots__ = ("max_queue_delay_ms", "preferred_batch_sizes", "_pref_for", "_pref")
    name = "max-delay"

    def __init__(
        self, max_queue_delay_ms: float = 0.0, preferred_batch_sizes: list[int] | tuple[int, ...] | None = None
    ) -> None:
        if not max_queue_delay_ms >= 0:
            raise ValueError(f"max-delay: max_queue_delay_ms must be >= 0, not {max_queue_delay_ms!r}")
        if preferred_batch_sizes is not None:
            sizes = tuple(sorted(set(preferred_batch_sizes)))
            if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError(
                    f"max-delay: preferred_batch_sizes must be positive integers, not {preferred_batch_sizes!r}"
                )
            preferred_batch_sizes = sizes
        self.max_queue_delay_ms = float(max_queue_delay_ms)
        self.preferred_batch_sizes: tuple[int, ...] | None = preferred_batch_sizes
        self._pref_for = -1  # max_batch the cached list was built for
        self._pref: list[int] = []

    def _preferred(self, max_batch: int) -> list[int]:
        if max_batch != self._pref_for:
            if self.preferred_batch_sizes is None:
                sizes = []
                p = 2
                while p <= max_batch:
                    sizes.append(p)
                    p *= 2
                if not sizes or sizes[-1] != max_batch:
                    sizes.append(max_batch)
            else:
                sizes = [s for s in self.preferred_batch_sizes if s <= max_batch]
            self._pref = sizes
            self._pref_for = max_batch
        return self._pref

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        top = max_batch if max_batch < n else n
        pref = self._pref if max_batch == self._pref_for else self._preferred(max_batch)
        i = bisect_right(pref, top)
        if i:
            return Dispatch(pref[i - 1], now_ms)
        if top == max_batch:
            return Dispatch(top, now_ms)
        due = queue.head()[1] + self.max_queue_delay_ms
        if now_ms >= due:
            return Dispatch(top, now_ms)
        return Dispatch(top, due)


class FixedBatching(_Policy):
    """A fixed batch size (default 1, i.e. no batching), work-conserving: when idle take
    min(queued, size, max_batch) now. The baseline every other policy is compared with; with size 1 it is
    Proteus's "w/o AB" ablation (ASPLOS'24 §6.5, Figure 7: batch size set statically to 1)."""

    __slots__ = ("size",)
    name = "fixed"

    def __init__(self, size: int = 1) -> None:
        _positive_int("fixed", "size", size)
        self.size = size

    def _decide(self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int, n: int) -> Dispatch:
        return Dispatch(_clamp(self.size, max_batch, n), now_ms)


class ProteusArtefactBatching:
    """The batching of the Proteus authors' simulator ("accscale", UMass-LIDS/Proteus at 6967c93,
    `core/predictor.py`), NOT the paper's rule (that is `ProteusBatching`): for comparing Tessera's simulator
    with the artefact's on identical inputs (issue 41; docs/fidelity-proteus.md, section 3, where every step
    below is cited to the artefact's lines). Read from the artefact's code; none of it is copied.

    Per instance, with batch sizes restricted to the artefact's {1, 2, 4, 8} (at most `max_batch`) and
    floor2(n) the largest of them <= n:

    - A query arriving at an idle instance: while now + T(floor2(q)) passes the head's deadline (q counting
      the new query), the head is dropped (early drop). Then ONE timer is set for head deadline -
      T(floor2(q)), and nothing runs now, even with a full queue.
    - The timer, reached while idle: run floor2(q). Reached while busy: run floor2(q) as soon as the batch
      ends, without the drop test.
    - A batch ends with no timer passed: with more than `max_batch` queued, run `max_batch` now; with a timer
      pending, wait for it; otherwise wait for the next arrival (which drops and sets a timer as above).
    - Queries older than twice the SLO are dropped at every launch: the caller's `slo-2x` drop rule.

    Departs from the paper (§5, Figure 3) as the artefact does: its wait is timed to the batch the queue
    already fills, T(floor2(q)), rather than the next, T(q+1), so an arrival that raises floor2(q) late in
    that wait costs the head its place; the paper promises no query "times out unnecessarily". Departs from
    the artefact in one detail: a batch takes the latency of the queries it holds, not of the size asked
    for (the artefact charges the asked size when its 2x-SLO drop shrank the batch).

    The artefact's timers are never cancelled, and the head's timer is set again whenever the queue changes
    (at every arrival, busy or not, and after every batch starts): a replaced timer still fires, and one that
    fires while the instance is busy, even a replaced one, makes the next batch end with queries queued run
    floor2(q) at once (a flag that waits for such a batch end). The policy is only asked while idle, so it
    keeps that state: the timers set and not yet passed, the current one, the flag, and the batch in flight
    (its end from `observe`, which the caller calls at every batch end before asking again; the timers set
    while it ran are worked out then: the head is the same throughout, and the queue grew one query at a
    time). So each instance needs its own; `batching_policy_make` makes one per call."""

    __slots__ = ("_current", "_pending", "_expiring", "_launched_at", "_end_at", "_left_at_launch")
    name = "proteus-artefact"
    SIZES = (1, 2, 4, 8)

    def __init__(self) -> None:
        self._current = _INF  # the timer the artefact would act on while idle (infinite: none)
        self._pending: list[float] = []  # every timer set and not yet passed, replaced ones included
        self._expiring = False  # a timer fired while busy: the next batch end with queries runs floor2(q)
        self._launched_at: float | None = None
        self._end_at: float | None = None
        self._left_at_launch = 0  # queries left queued when the batch in flight started

    @classmethod
    def floor2(cls, n: int, max_batch: int) -> int:
        best = 0
        for size in cls.SIZES:
            if size <= n and size <= max_batch:
                best = size
        return best

    def _launch(self, b: int, q: int, now_ms: float) -> Dispatch:
        self._current = _INF
        self._pending = [t for t in self._pending if t > now_ms + _AT_TOLERANCE_MS]
        self._launched_at = now_ms
        self._left_at_launch = max(0, q - b)
        return Dispatch(b, now_ms)

    def _busy_timers(self, queue: QueryQueue, latency_ms: Callable[[int], float], top: int) -> list[float]:
        """The head timers set while the batch ran: one per queue length from what the launch left (or 1) to
        now, i.e. one per distinct floor2 of those lengths."""
        q, low = len(queue), max(1, self._left_at_launch)
        if q < low:  # the drop rule took some since: the head and lengths are what is left
            low = q
        deadline = queue.head()[2]
        sizes = {self.floor2(low, top)} | {size for size in self.SIZES if low < size <= q and size <= top}
        return [deadline - latency_ms(size) for size in sizes if size >= 1]

    def decide(
        self, now_ms: float, queue: QueryQueue, latency_ms: Callable[[int], float], max_batch: int
    ) -> Dispatch:
        q = len(queue)
        top = self.floor2(max_batch, max_batch)
        batch_end = False
        if self._end_at is not None:  # a batch ended (observe): what fired while it ran
            end = self._end_at + _AT_TOLERANCE_MS
            self._end_at = None
            batch_end = now_ms <= end  # else it ended earlier with nothing queued, and this is an arrival
            if batch_end and q and top >= 1:
                self._pending += self._busy_timers(queue, latency_ms, top)
            if any(t <= end for t in self._pending):
                self._expiring = True
            self._pending = [t for t in self._pending if t > end]
            # The current timer is the head's latest, for the queue as it is: already counted in the flag if it
            # fell within the batch, else the one to wait for.
            self._current = _INF
            if batch_end and q and top >= 1:
                latest = queue.head()[2] - latency_ms(self.floor2(q, top))
                if latest > end:
                    self._current = latest
        if q == 0 or top < 1:
            return _IDLE
        if batch_end:
            if self._expiring:
                self._expiring = False
                return self._launch(self.floor2(q, top), q, now_ms)
            if q > top:
                return self._launch(top, q, now_ms)
            return Dispatch(self.floor2(q, top), self._current) if self._current < _INF else _IDLE
        if self._current <= now_ms + _AT_TOLERANCE_MS:  # the current timer, reached while idle
            return self._launch(self.floor2(q, top), q, now_ms)
        # An arrival at an idle instance. Timers that passed while idle were ignored. Drop heads that the
        # batch the queue fills would make late, then time the wait to that batch.
        self._pending = [t for t in self._pending if t > now_ms + _AT_TOLERANCE_MS]
        while q and now_ms + latency_ms(self.floor2(q, top)) > queue.head()[2] + DEADLINE_TOLERANCE_MS:
            queue.discard_head()
            q -= 1
        if q == 0:
            self._current = _INF
            return _IDLE
        b = self.floor2(q, top)
        timer = queue.head()[2] - latency_ms(b)
        if timer <= now_ms + _AT_TOLERANCE_MS:  # exactly at the limit: the artefact's "already past" branch runs it
            return self._launch(b, q, now_ms)
        self._current = timer
        self._pending.append(timer)
        return Dispatch(b, timer)

    def observe(self, batch: int, latency_ms: float, late: int) -> None:
        if self._launched_at is not None:
            self._end_at = self._launched_at + latency_ms
            self._launched_at = None


# A returned `at` this close to now is now (the simulator's own tolerance for timers).
_AT_TOLERANCE_MS = 1e-9


_POLICIES: dict[str, type] = {
    "proteus": ProteusBatching,
    "quantile": QuantileBatching,
    "aimd": AimdBatching,
    "nexus": NexusBatching,
    "max-delay": MaxDelayBatching,
    "fixed": FixedBatching,
    "proteus-artefact": ProteusArtefactBatching,
}


def application_batching(delay_ms: float | None) -> tuple[str, dict[str, Any]] | None:
    """The batching an application's own configuration asks for, as (policy, params); None (no delay set):
    the plan's deadline-aware policy. A Triton-style delay (`max_queue_delay_microseconds` of a model
    configuration, here in ms) asks for Triton's dynamic batcher, `max-delay`, with its default preferred
    sizes: 0 runs what is queued at once (work-conserving), a longer delay waits that long for a fuller batch
    whatever the deadlines say."""
    if delay_ms is None:
        return None
    return "max-delay", {"max_queue_delay_ms": float(delay_ms)}


def batching_policy_make(name: str, **params) -> BatchingPolicy:
    """A new policy instance (policies with state, AIMD, need one per instance).

    "proteus" (no parameters) | "aimd" (initial, step, backoff, slo_ms) | "nexus" (window) |
    "max-delay" (max_queue_delay_ms, preferred_batch_sizes) | "fixed" (size) | "proteus-artefact" (none; the
    authors' simulator's batching, for comparisons only).
    """
    cls = _POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown batching policy {name!r}; known: {BATCHING_POLICIES + REFERENCE_BATCHING_POLICIES}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"batching policy {name!r}: bad parameters {sorted(params)}: {exc}") from None


def policy_latency_function(points: Sequence[Any], max_batch: int) -> tuple[Callable[[int], float], float]:
    """The latency the batching policies see, shared by the simulator and the live runtime: latency_ms(b) for one variant on one slice, from its profile: interpolated inside the profiled
    range, the smallest profiled batch's latency below it, extrapolated linearly from the last two points
    above it (a policy should never ask beyond `max_batch`, which is inside). Returns (function, latency(1))."""
    points = sorted(points, key=lambda p: p.batch)
    if not points:
        raise ValueError("no profile")
    top = max(max_batch, points[-1].batch, 1)
    table = [0.0] * (top + 1)
    for b in range(1, top + 1):
        value = profile_interpolate(points, b, "latency_ms")
        if value is None:
            if b < points[0].batch:
                value = points[0].latency_ms
            elif len(points) >= 2:
                p, q = points[-2], points[-1]
                value = q.latency_ms + (q.latency_ms - p.latency_ms) / (q.batch - p.batch) * (b - q.batch)
            else:
                value = points[-1].latency_ms * b / points[-1].batch
        table[b] = float(value)
    # A bigger batch never finishes sooner than a smaller one could (it could run the smaller batch and
    # wait): measured dips are noise, and a policy that trusted them would wait past the point where the
    # head can still be served alone, which the deadline drop rule then punishes.
    for b in range(2, top + 1):
        table[b] = max(table[b], table[b - 1])
    n = len(table)
    last = table[-1]
    slope = (table[-1] - table[-2]) if n >= 3 else table[-1]

    def latency_ms(b: int, table: list[float] = table, n: int = n) -> float:
        if 0 < b < n:
            return table[b]
        if b <= 0:
            return 0.0
        return last + slope * (b - (n - 1))

    return latency_ms, table[1]
