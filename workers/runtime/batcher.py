"""One serving instance's batcher: a `QueryQueue` and a batching policy from the planning engine, driven
exactly as the discrete-event simulator drives them (engine/simulation/simulator.py, `_kick`, `_on_batch_end`,
`_on_timer`), so the live fleet makes the decisions the simulator predicted.

The contract (engine/dataplane/batching.py): whenever the instance is idle and (a) a query arrives,
(b) the time the policy last asked for is reached, or (c) a batch completes, first `drop_expired` under
the drop rule, then `decide`, then collect the policy's early drops (Nexus) with
`drop_expired(now, "never", ...)`. `Dispatch(b, at)`: at <= now + 1e-9 ms pops min(b, queued, max_batch)
queries and runs them; a later `at` sets the timer; b == 0 waits for the next arrival. After a batch,
`policy.observe(size, service_ms, late)`. At equal times a completion or a timer goes before an arrival.
Rows: the profiles and `max_batch` count rows, and `execute` stacks the queries' rows into one run. While a
query of several rows (`submit(rows=k)`, a client's own batch) is queued, the policy decides over the
latency of the first b queries' rows and a cap of the queries whose rows fit `max_batch` (`_row_terms`);
one-row traffic takes the simulator's path unchanged.

Two ways to run it:

- Threaded (production): `start()` launches one worker thread that owns the decisions; `submit(payload)`
  returns a `concurrent.futures.Future` resolved with that query's result, or failed with
  `DeadlineExceeded` when the drop rule (or the policy's early drop) gives up on it. `execute(payloads)`
  runs on the worker thread, and the service time is measured on `clock`.
- Stepped (tests, replays): without `start()`, with a `VirtualClock` and `service_ms(b)` (the batch
  service time, e.g. the profiled latency the simulator uses), `submit(payload, arrival_ms=t)` first
  advances virtual time to `t` (processing the completions and timers due by then), then queues the
  query; `step_until(t_ms)` processes every event up to `t_ms` (math.inf: until nothing is left).
  `execute` is called when a batch starts; its futures resolve when the batch ends in virtual time.

Live serving plans with a safety margin (`margin_ms`, 0 in stepped mode so replays match the simulator):
the policy sees every deadline `margin_ms` earlier than it is, while the drop rule and the late count judge
the real deadline. Policies such as Proteus wait until the last moment a batch still fits; a timer that
wakes a little late, or a batch that runs a little slower than its profiled p50, would otherwise turn
every such wait into a drop. The margin covers timer wake-up jitter, run-time variance and the time a
query spends outside the model (decoding, the answer's way back).

Several batchers sharing one device (the models of an MPS partition, time-shared: workers/runtime/
partition.py) pass `turn`, a context-manager factory without arguments (one model's `PartitionTurns.turn`):
a batch is decided and popped as above, then its `execute` runs inside `with turn():`, so that at most one
batch of the partition runs at a time. The service time the policy observes (and `batches` records) runs
from when the turn is granted to when the batch ends: the profile the policy plans with is the model's run
time on the partition, and the wait for the turn is queueing behind the other models' batches, not the
model running slower (an AIMD policy that compares the observed latency with the SLO would otherwise back
off because of a neighbour's batch). Deadlines and the late count still judge the real clock: a batch that
waited for its turn and ends past its deadline is late, and the policy hears it through `late`.

A partition planned in duty-cycle rounds (gpulets §2.2/§4.3, a `duty_cycle_ms`) drives its batchers
instead (`round_driven=True`, workers/runtime/partition.py `PartitionRounds`, on the round of
engine/dataplane/rounds.py that the simulator runs too): the batcher has no worker thread and decides
nothing by itself; a submission only queues the query and calls `arrival_hook`, and at the model's slot
the round calls `turn_take(now, cap)` (the drop rule, then the policy's batch, run now: the round is the
timer; None when there is nothing to run), `turn_run` and `turn_complete`.

A running batcher can be resized in place (issue 19, vertical scaling: workers/runtime/served.py's `resize`):
`reconfigure(max_batch=..., latency_ms=..., apply=...)` takes the lock, runs `apply()` (the caller's own
swap, e.g. the session the next batch runs on), then sets the new batch cap and latency function and
re-plans at once (a timer set under the old latency function may be too late, or too early, now). A batch
in flight finishes as it was decided; every decision after the call sees the new cap and latency, so the
worker never decides with one half of a change. Round-driven batchers are sized by their round
(`turn_take`'s cap) and are not reconfigured.

`clock` returns seconds (`time.monotonic`); a clock with a `now_ms()` method (`VirtualClock`) is read in
milliseconds directly, so replayed times stay exact. With `record_batches=True` the batcher keeps
`batches`, one `(start_ms, [query ids], end_ms)` per batch, and `drops`, one `(query id, time_ms)` per
dropped query. Query ids are 0, 1, 2, ... in submission order (`future.query_id`).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_right
from concurrent.futures import Future
from typing import Any, Callable, ContextManager, Sequence

from engine.dataplane.batching import DEADLINE_TOLERANCE_MS, DROP_RULES, BatchingPolicy, QueryQueue

__all__ = ["AT_EPSILON_MS", "BatcherClosed", "DeadlineExceeded", "InstanceBatcher", "VirtualClock"]

# A policy's `at_ms` this close to now counts as now (the simulator's _AT_EPSILON_MS).
AT_EPSILON_MS = 1e-9
_INF = math.inf
log = logging.getLogger("tessera.runtime")


class DeadlineExceeded(RuntimeError):
    """The query was dropped without being served: it could not meet its deadline (drop rule, or the
    policy's early drop). The router returns this to the client (e.g. HTTP 504 / gRPC DEADLINE_EXCEEDED)."""

    def __init__(self, query_id: int, deadline_ms: float, dropped_at_ms: float, rule: str) -> None:
        self.query_id = query_id
        self.deadline_ms = deadline_ms
        self.dropped_at_ms = dropped_at_ms
        self.rule = rule
        super().__init__(
            f"query {query_id} dropped at {dropped_at_ms:.3f} ms: it cannot meet its deadline "
            f"{deadline_ms:.3f} ms (drop rule {rule!r})"
        )


class BatcherClosed(RuntimeError):
    """The batcher was closed before the query was served."""


class VirtualClock:
    """A clock that moves only when told. `now_ms()` in milliseconds; calling it returns seconds, like
    `time.monotonic`."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self._ms = float(start_ms)

    def now_ms(self) -> float:
        return self._ms

    def __call__(self) -> float:
        return self._ms / 1000.0

    def advance_to(self, t_ms: float) -> None:
        if t_ms < self._ms:
            raise ValueError(f"virtual time cannot go back from {self._ms} ms to {t_ms} ms")
        self._ms = float(t_ms)


class _Completion:
    """What `submit(..., done=...)` returns in place of a Future: resolving it calls `done` once. What
    `done` raises is logged, as a Future logs its callbacks' errors: it must not stop the batch's other
    queries being answered, nor the worker thread."""

    __slots__ = ("query_id", "_done")

    def __init__(self, query_id: int, done: Callable[[Any, BaseException | None], None]) -> None:
        self.query_id = query_id
        self._done = done

    def set_result(self, result: Any) -> None:
        self._call(result, None)

    def set_exception(self, error: BaseException) -> None:
        self._call(None, error)

    def _call(self, result: Any, error: BaseException | None) -> None:
        try:
            self._done(result, error)
        except Exception:
            log.exception("the done callback of query %s failed", self.query_id)


class InstanceBatcher:
    """Serves one instance: queues submitted queries and runs the batches `policy` decides. See the module
    docstring."""

    def __init__(
        self,
        policy: BatchingPolicy,
        *,
        latency_ms: Callable[[int], float],
        max_batch: int,
        execute: Callable[[list], Sequence[Any]],
        drop_rule: str = "deadline",
        slo_ms: float,
        queue_order: str = "fifo",
        clock: Callable[[], float] = time.monotonic,
        service_ms: Callable[[int], float] | None = None,
        record_batches: bool = False,
        margin_ms: float = 0.0,
        turn: Callable[[], ContextManager[Any]] | None = None,
        round_driven: bool = False,
        inline_max_ms: float = 0.0,
    ) -> None:
        if drop_rule not in DROP_RULES:
            raise ValueError(f"drop_rule must be one of {DROP_RULES}, not {drop_rule!r}")
        if not (isinstance(slo_ms, (int, float)) and math.isfinite(slo_ms) and slo_ms > 0):
            raise ValueError(f"slo_ms must be a finite number > 0, not {slo_ms!r}")
        self.policy = policy
        self.latency_ms = latency_ms
        self.max_batch = int(max_batch)
        self.execute = execute
        self.drop_rule = drop_rule
        self.slo_ms = float(slo_ms)
        if not (isinstance(margin_ms, (int, float)) and math.isfinite(margin_ms) and 0 <= margin_ms < slo_ms):
            raise ValueError(f"margin_ms must be >= 0 and below the SLO, not {margin_ms!r}")
        self.margin_ms = float(margin_ms)
        self.inline_max_ms = float(inline_max_ms)  # `submit(inline=True)` only while latency(1) is at most this
        self.queue = QueryQueue(queue_order)  # validates the order
        self.service_ms = service_ms
        self.turn = turn  # shared-device turns around `execute` (see the module docstring)
        if round_driven and turn is not None:
            raise ValueError("a batcher is either round-driven or takes turns, not both")
        self.round_driven = bool(round_driven)
        self.arrival_hook: Callable[[], None] | None = None  # round-driven: told after each queued query
        self._started = False
        self.record_batches = record_batches
        self.batches: list[tuple[float, list[int], float]] = []
        self.drops: list[tuple[int, float]] = []
        self.clock = clock
        now_ms = getattr(clock, "now_ms", None)
        self._now_ms: Callable[[], float] = now_ms if callable(now_ms) else (lambda: clock() * 1000.0)
        self._lat1 = float(latency_ms(1))
        self._cond = threading.Condition(threading.RLock())
        self._next_id = 0
        self._pending: dict[int, tuple[Future, Any, float]] = {}  # query id -> (future, payload, deadline_ms)
        # Rows of the queued queries that carry more than one (a client's own batch); absent: one. Profiles
        # and `max_batch` count rows, the queue counts queries (see `_row_terms`).
        self._rows: dict[int, int] = {}
        self._inflight_rows = 0  # the rows of the batch in flight (its service time in stepped mode)
        self._busy = False
        self._busy_end = _INF  # stepped mode: when the batch in flight ends
        self._inflight: list[tuple[int, float, float]] | None = None
        self._inflight_start = 0.0
        self._outcome: tuple[Sequence[Any] | None, BaseException | None, float] | None = None
        self._timer_at = _INF
        self._kick_needed = False
        self._worker_waiting = False  # the worker thread sleeps on _cond (a submission must notify it)
        self._closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API

    def submit(self, payload: Any, arrival_ms: float | None = None, deadline_ms: float | None = None, *,
               done: Callable[[Any, BaseException | None], None] | None = None, inline: bool = False, rows: int = 1) -> Future:
        """Queue one query; the future resolves with its result or fails with `DeadlineExceeded`.
        `arrival_ms` defaults to now; `deadline_ms` to arrival + slo_ms. Stepped mode: virtual time first
        advances to `arrival_ms`. With `done`, no future is made: `done(result, None)` or `done(None, error)`
        is called once, on the thread that resolves the query, and what is returned only carries `query_id`
        (the runtime's hot path: a `Future` costs a Condition and a lock per query).

        `inline` (threaded mode, a batch of one planned at most `inline_max_ms`): when the instance is idle
        with nothing else queued and the policy runs this query now, alone, run it on the calling thread instead of handing it to the worker (no thread
        hop: the hop, a wake-up and two context switches, costs more than a small model's run). The policy
        decides exactly as on the worker, so batching is untouched: a query that finds another queued or a
        batch running, or that the policy would hold to grow a batch, goes to the worker as always.

        `rows`: how many rows the query carries (its own batch axis). The batch the policy sizes, its latency
        and `max_batch` count rows: a batch of k-row queries holds at most max_batch / k of them (one at
        least), and its latency is the profile's at their rows (`_row_terms`)."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1, not {rows!r}")
        if self.round_driven:
            return self._submit_queued(payload, arrival_ms, deadline_ms, done, rows)
        stepped = self._thread is None
        if inline and not stepped and self.turn is None and rows == 1 and self._lat1 <= self.inline_max_ms:
            return self._submit_inline(payload, arrival_ms, deadline_ms, done)
        if stepped and hasattr(self.clock, "advance_to"):
            # Completions and timers due by the arrival go first (also those due exactly now).
            now = self._now_ms()
            self.step_until(now if arrival_ms is None or arrival_ms < now else arrival_ms)
        with self._cond:
            now = self._now_ms()
            future = self._enqueue(payload, now, arrival_ms, deadline_ms, done, rows)
            if not stepped:
                self._kick_needed = True
                if self._worker_waiting:  # a worker running a batch looks at _kick_needed when it ends
                    self._cond.notify()
                return future
            if self._busy:
                return future
            batch = self._kick(now)
            if batch is not None:
                self._dispatch_stepped(batch, now)
        return future

    def _submit_inline(self, payload: Any, arrival_ms: float | None, deadline_ms: float | None,
                       done: Callable[[Any, BaseException | None], None] | None) -> Future:
        """`submit(inline=True)` in threaded mode (see `submit`)."""
        cond = self._cond
        with cond:
            now = self._now_ms()
            future = self._enqueue(payload, now, arrival_ms, deadline_ms, done)
            batch = None
            decided = not self._busy and len(self.queue) == 1
            if decided:
                # Idle, and this query alone: the worker has nothing of its own to decide (a timer is only
                # ever set for queued queries), so deciding here is deciding as it would.
                batch = self._kick(now)
            if batch is None:
                # Queued behind others: the worker decides, as always. Held by the policy (or dropped): the
                # decision stands, and the worker only needs to see the timer it set (no second decision).
                if not decided:
                    self._kick_needed = True
                if self._worker_waiting:
                    cond.notify()
                return future
            payloads = self._payloads(batch)
        results, error, _measured = self._run(payloads)
        end = self._now_ms()
        with cond:
            self._finish(now, results, error, end)
            if len(self.queue) or self._kick_needed:  # a reconfigure (or anything queued) while it ran
                self._kick_needed = True
                if self._worker_waiting:
                    cond.notify()
        return future

    def _submit_queued(self, payload: Any, arrival_ms: float | None, deadline_ms: float | None,
                       done: Callable[[Any, BaseException | None], None] | None, rows: int = 1) -> Future:
        """Round-driven: queue the query, then tell the round (which owns the clock when stepped)."""
        with self._cond:
            future = self._enqueue(payload, self._now_ms(), arrival_ms, deadline_ms, done, rows)
        hook = self.arrival_hook
        if hook is not None:
            hook()
        return future

    def _enqueue(self, payload: Any, now: float, arrival_ms: float | None, deadline_ms: float | None,
                 done: Callable[[Any, BaseException | None], None] | None = None, rows: int = 1) -> Future:
        """Queue one query (lock held): its id, future (or `_Completion` around `done`) and deadline."""
        if self._closed:
            raise BatcherClosed("the batcher is closed")
        arrival = now if arrival_ms is None else float(arrival_ms)
        deadline = arrival + self.slo_ms if deadline_ms is None else float(deadline_ms)
        deadline -= self.margin_ms  # the policy plans against the earlier deadline (see the module docstring)
        query_id = self._next_id
        self._next_id += 1
        if done is None:
            future: Future = Future()
            future.query_id = query_id  # type: ignore[attr-defined]
        else:
            future = _Completion(query_id, done)  # type: ignore[assignment]
        self._pending[query_id] = (future, payload, deadline)
        if rows > 1:
            self._rows[query_id] = rows
        self.queue.push(query_id, arrival, deadline)
        return future

    # ------------------------------------------------------------------ round-driven turns

    def turn_take(self, now: float, cap: int) -> list[tuple[int, float, float]] | None:
        """The model's slot in the round came at `now`: drop what expired, let the policy size a batch of at
        most `cap` and pop it to run now (None: nothing to run, the turn passes)."""
        with self._cond:
            if self._closed or self._busy:
                return None
            return self._kick(now, max_batch=cap, immediate=True)

    def turn_run(self, batch: list[tuple[int, float, float]], now: float) -> tuple[tuple[Sequence[Any] | None, BaseException | None, float], float]:
        """Run a batch `turn_take` popped, begun at `now`: (outcome, end). The service time is measured on the
        clock, or `service_ms(b)` stepped on a virtual clock (the end is then in the future)."""
        with self._cond:
            payloads = self._payloads(batch)
        results, error, measured = self._run(payloads)
        if self.service_ms is not None and hasattr(self.clock, "advance_to"):
            service = float(self.service_ms(self._inflight_rows))
            end = now + service
        else:
            end = self._now_ms()
            service = end - now
        return (results, error, service), end

    def turn_complete(self, outcome: tuple[Sequence[Any] | None, BaseException | None, float], start: float, end: float) -> None:
        """The batch `turn_run` ran ended at `end`: resolve its futures and tell the policy."""
        with self._cond:
            self._outcome = outcome
            self._inflight_start = start
            self._complete(end)

    def step_until(self, t_ms: float) -> None:
        """Stepped mode: process every completion and timer due at or before `t_ms` in time order, then
        move the virtual clock to `t_ms` (not when it is infinite)."""
        if self._thread is not None:
            raise RuntimeError("step_until is for a batcher that was not started")
        advance = getattr(self.clock, "advance_to", None)
        if advance is None:
            raise TypeError("step_until needs a clock with advance_to (VirtualClock)")
        with self._cond:
            while True:
                nxt = self._busy_end if self._busy else self._timer_at
                if nxt > t_ms or nxt == _INF:
                    break
                advance(nxt)
                if self._busy:
                    self._complete(nxt)
                else:
                    self._timer_at = _INF
                if self._closed:
                    break
                batch = self._kick(nxt)
                if batch is not None:
                    self._dispatch_stepped(batch, nxt)
            if t_ms != _INF and t_ms > self._now_ms():
                advance(t_ms)

    def start(self) -> "InstanceBatcher":
        """Threaded mode: start the worker thread (idempotent). Round-driven: nothing to start (the round
        drives the batcher)."""
        with self._cond:
            if self._closed:
                raise BatcherClosed("the batcher is closed")
            if self.round_driven:
                self._started = True
            elif self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="tessera-batcher", daemon=True)
                self._thread.start()
        return self

    def close(self, timeout: float | None = None) -> None:
        """Stop: the batch in flight finishes; queued queries fail with `BatcherClosed` (early drops with
        `DeadlineExceeded`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            if thread is not threading.current_thread():
                thread.join(timeout)
            return
        with self._cond:
            if self._busy and not self.round_driven:  # round-driven: the round completes its batch in flight
                self._complete(self._busy_end)
            self._fail_queued()

    def __enter__(self) -> "InstanceBatcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now_ms(self) -> float:
        """The batcher's clock, in milliseconds."""
        return self._now_ms()

    def __len__(self) -> int:
        """Queries queued (not counting a batch in flight)."""
        with self._cond:
            return len(self.queue)

    def reconfigure(self, *, max_batch: int | None = None, latency_ms: Callable[[int], float] | None = None,
                    apply: Callable[[], None] | None = None) -> None:
        """Change the batch cap and/or the policy's latency function of a running batcher (see the module
        docstring); `apply` runs first, under the same lock. ValueError (nothing changed) on a cap < 1, a
        latency function that fails at batch 1, or a round-driven batcher."""
        if self.round_driven:
            raise ValueError("a round-driven batcher is sized by its round, not reconfigured")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"max_batch must be an integer >= 1, not {max_batch!r}")
        lat1 = None
        if latency_ms is not None:
            lat1 = float(latency_ms(1))
            if not (math.isfinite(lat1) and lat1 >= 0):
                raise ValueError(f"the latency function gives {lat1!r} ms at batch 1")
        with self._cond:
            if apply is not None:
                apply()
            if max_batch is not None:
                self.max_batch = int(max_batch)
            if latency_ms is not None:
                self.latency_ms = latency_ms
                self._lat1 = lat1  # type: ignore[assignment]
            if self._thread is not None:
                self._kick_needed = True
                if self._worker_waiting:
                    self._cond.notify()

    def queued_deadlines_ms(self) -> list[tuple[float, float]]:
        """(arrival_ms, real deadline_ms) of every query queued now (not those in a batch in flight)."""
        margin = self.margin_ms
        with self._cond:
            return [(arrival, deadline + margin) for _id, arrival, deadline in self.queue.snapshot()]

    # ------------------------------------------------------------------ the contract (lock held)

    def _kick(self, now: float, *, max_batch: int | None = None, immediate: bool = False) -> list[tuple[int, float, float]] | None:
        """The instance is idle: drop what expired, ask the policy, pop a batch (returned) or set the timer.
        A round's turn passes its cap as `max_batch` and runs the batch now (`immediate`: no timer)."""
        cap = cap_rows = self.max_batch if max_batch is None else int(max_batch)
        q = self.queue
        # The drop rule judges the real deadline: shifting now back by the margin undoes the planning shift.
        dropped = q.drop_expired(now - self.margin_ms, self.drop_rule, self.slo_ms, self._lat1)
        if dropped:
            self._fail_dropped(dropped, now)
        if not q:
            self._timer_at = _INF
            return None
        latency_ms = self.latency_ms
        if self._rows:  # some query queued carries several rows: the policy sizes the batch in rows
            latency_ms, cap = self._row_terms(cap_rows)
        b, at = self.policy.decide(now, q, latency_ms, cap)
        early = q.drop_expired(now, "never", 0.0, 0.0)  # the policy's early drops (Nexus), if any
        if early:
            self._fail_dropped(early, now)
            if self._rows and q:  # fewer queries ahead: as many more as their rows leave room for
                _latency, cap = self._row_terms(cap_rows)
        size = len(q)
        if b <= 0 or size == 0:
            self._timer_at = _INF
            return None
        if at > now + AT_EPSILON_MS and not immediate:
            self._timer_at = at
            return None
        if b > size:
            b = size
        if b > cap:
            b = cap
        batch = q.pop(b)
        self._inflight_rows = self._rows_take(batch)
        self._busy = True
        self._inflight = batch
        self._inflight_start = now
        self._timer_at = _INF
        return batch

    def _row_terms(self, cap_rows: int) -> tuple[Callable[[int], float], int]:
        """For queued queries of several rows (lock held): the latency of the first b queries in service order
        (the profile's at their rows; past the queue, queries of the queue's mean rows) and how many of them
        fit `cap_rows` (one at least: a query larger than the cap runs alone, as the client sent it).

        Why: profiles and the plan's `max_batch` count rows, and `execute` stacks the queries' rows into one
        run. Sized in queries, a batch of 8-row queries at max_batch 32 ran 256 rows, 8 times what the plan
        sized for latency and memory."""
        if cap_rows < 1:  # an instance that cannot serve: every policy answers "nothing to do"
            return self.latency_ms, cap_rows
        rows = self._rows
        prefix = [0]
        for query_id, _a, _d in self.queue.snapshot():
            prefix.append(prefix[-1] + rows.get(query_id, 1))
        queued = len(prefix) - 1
        mean = prefix[-1] / queued if queued else 1.0
        base = self.latency_ms

        def rows_of(b: int) -> int:
            return prefix[b] if b <= queued else prefix[-1] + math.ceil((b - queued) * mean)

        fit = bisect_right(prefix, cap_rows) - 1  # queued queries whose rows together fit the cap
        if fit >= queued:
            fit = queued + int((cap_rows - prefix[-1]) // mean)
        return (lambda b: base(rows_of(b))), max(1, fit)

    def _rows_take(self, batch: list[tuple[int, float, float]]) -> int:
        """The rows of a batch leaving the queue (lock held); its queries leave `_rows` with it."""
        rows = self._rows
        return sum(rows.pop(query_id, 1) for query_id, _a, _d in batch) if rows else len(batch)

    def _fail_dropped(self, query_ids: list[int], now: float) -> None:
        for query_id in query_ids:
            self._rows.pop(query_id, None)
            future, _payload, deadline = self._pending.pop(query_id)
            if self.record_batches:
                self.drops.append((query_id, now))
            future.set_exception(DeadlineExceeded(query_id, deadline + self.margin_ms, now, self.drop_rule))

    def _payloads(self, batch: list[tuple[int, float, float]]) -> list[Any]:
        return [self._pending[query_id][1] for query_id, _a, _d in batch]

    def _run(self, payloads: list[Any]) -> tuple[Sequence[Any] | None, BaseException | None, float]:
        """Call `execute` on a batch's payloads: (results, error, measured wall ms)."""
        started = time.perf_counter()
        try:
            results = list(self.execute(payloads))
            if len(results) != len(payloads):
                raise RuntimeError(f"execute returned {len(results)} results for {len(payloads)} queries")
            error = None
        except Exception as exc:  # the batch fails; every query in it gets the error
            results, error = None, exc
        return results, error, (time.perf_counter() - started) * 1000.0

    def _dispatch_stepped(self, batch: list[tuple[int, float, float]], now: float) -> None:
        if self.turn is None:
            results, error, measured = self._run(self._payloads(batch))
        else:
            with self.turn():
                results, error, measured = self._run(self._payloads(batch))
        service = float(self.service_ms(self._inflight_rows)) if self.service_ms is not None else measured
        self._outcome = (results, error, service)
        self._busy_end = now + service

    def _finish(self, start: float, results: Sequence[Any] | None, error: BaseException | None, end: float) -> None:
        """A batch run on this process's clock (started at `start`) ended at `end` (lock held)."""
        self._inflight_start = start
        self._outcome = (results, error, end - start)
        self._complete(end)

    def _complete(self, end: float) -> None:
        """The batch in flight ended at `end`: resolve its futures and tell the policy."""
        batch = self._inflight
        assert batch is not None and self._outcome is not None
        results, error, service = self._outcome
        self._inflight = None
        self._outcome = None
        self._busy = False
        self._busy_end = _INF
        late = 0
        for i, (query_id, _a, deadline) in enumerate(batch):
            future, _payload, _deadline = self._pending.pop(query_id)
            if end - self.margin_ms > deadline + DEADLINE_TOLERANCE_MS:  # the simulator's test, to the bit
                late += 1
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[i])  # type: ignore[index]
        if self.record_batches:
            self.batches.append((self._inflight_start, [query_id for query_id, _a, _d in batch], end))
        if error is None:
            self.policy.observe(len(batch), service, late)

    def _fail_queued(self) -> None:
        now = self._now_ms()
        early = self.queue.drop_expired(now, "never", 0.0, 0.0)
        if early:
            self._fail_dropped(early, now)
        if len(self.queue):
            for query_id, _a, _d in self.queue.pop(len(self.queue)):
                self._rows.pop(query_id, None)
                future, _payload, _deadline = self._pending.pop(query_id)
                future.set_exception(BatcherClosed(f"query {query_id}: the batcher closed before serving it"))
        self._timer_at = _INF

    # ------------------------------------------------------------------ threaded mode

    def _worker(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._closed:
                        self._fail_queued()
                        return
                    now = self._now_ms()
                    if self._busy:  # a batch runs inline on a submitter's thread: its end wakes this one
                        pass
                    elif self._kick_needed or self._timer_at <= now:
                        self._kick_needed = False
                        self._timer_at = _INF
                        batch = self._kick(now)
                        if batch is not None:
                            payloads = self._payloads(batch)
                            break
                        continue
                    timeout = None if self._timer_at == _INF else max(0.0, (self._timer_at - now) / 1000.0)
                    self._worker_waiting = True
                    try:
                        cond.wait(timeout)
                    finally:
                        self._worker_waiting = False
            # Outside the lock: submissions keep coming.
            if self.turn is None:
                results, error, _measured = self._run(payloads)
                end = self._now_ms()
            else:
                with self.turn():  # the device is shared: wait for this batcher's turn, run, give it back
                    now = self._now_ms()
                    results, error, _measured = self._run(payloads)
                    end = self._now_ms()
            with cond:
                self._finish(now, results, error, end)
                self._kick_needed = True
