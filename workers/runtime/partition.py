"""Temporal sharing inside one MPS partition: the turns the partition's models take on it.

An MPS partition (a percentage of a GPU's SMs, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) may hold several
models, served by one runtime process with one session and one batcher per model (workers/runtime/
server.py, a partition spec). gpulets (Choi et al., "Serving Heterogeneous Machine Learning Models on
Multi-GPU Servers with Spatio-Temporal Sharing", ATC'22) shares a GPU spatially (partitions) and
temporally: §4.2 places up to all M models on one partition, §4.3 ("Temporal scheduling for gpulets")
merges two gpulets into one time-shared gpulet by the rules of §2.2, Nexus's squishy bin packing, whose
execution is round-based (Figure 2): within each round, the duty cycle, every model runs one batch, one
after the other, and each model's batch size is chosen so that building a batch during one round and
running it in the next meets its SLO. The planner writes that round as the partition's `duty_cycle_ms`
(engine/solvers/gpulets.py: "capacity is a batch per round").

Two schedulers, one per kind of partition spec:

- `PartitionRounds`, a partition with a duty cycle: the round of engine/dataplane/rounds.py
  (`DutyCycleRound`), the one the simulator runs, so the live partition makes the simulator's decisions.
  Each model has a fixed slot in the round (the round's start plus the planned turns, `turn_ms`, of the
  models before it); at its slot the model's policy sizes a batch from what is queued, up to the round's
  cap, and it runs at once; a model with nothing queued passes; rounds stop while nothing is queued and
  the next arrival begins one. The batchers are round-driven (no worker thread of their own); one thread
  per partition runs the rounds on the real clock, or, on a `VirtualClock` with the batchers' service
  times, `submit` and `step_until` replay a trace exactly as the simulator would (tests). A turn that
  comes later than its slot (an earlier batch ran longer than planned) is counted (`wait_ms`), and one
  later than a duty cycle is the plan's promise broken (`over_duty_cycle`).
- `PartitionTurns`, a partition written without a duty cycle: work-conserving turns, first come first
  served. A model's batcher asks for the turn (`with turns.turn(key):`) around its batch's run; each
  batcher has one worker thread and so at most one batch waiting, so models with a batch ready run one
  batch each in turn, and the batching policies (the same as on a dedicated instance) decide when.

Why turns and not the models' batches running side by side on the partition's SMs: the latency the plan
holds each model to (its profile L(b, p) on the partition, interference from the GPU's other partitions
included) is one batch at a time on the partition, and so is the paper's temporal sharing.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from engine.dataplane.rounds import END, WAIT, DutyCycleRound
from workers.runtime.batcher import InstanceBatcher

__all__ = ["PartitionRounds", "PartitionTurns", "RoundMember"]


class _TurnCounters:
    __slots__ = ("turns", "wait_ms_total", "wait_ms_max", "run_ms_total", "over_duty_cycle")

    def __init__(self) -> None:
        self.turns = 0
        self.wait_ms_total = 0.0
        self.wait_ms_max = 0.0
        self.run_ms_total = 0.0
        self.over_duty_cycle = 0


class PartitionTurns:
    """One partition's turn scheduler (see the module docstring). `keys` are the models' keys;
    `duty_cycle_ms` the plan's round (None: not checked). With `record=True` it keeps `timeline`, one
    `(key, granted_ms, released_ms)` per turn, on `clock` (seconds, `time.monotonic`)."""

    def __init__(self, keys: Sequence[str], duty_cycle_ms: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 record: bool = False) -> None:
        if not keys:
            raise ValueError("a partition needs at least one model")
        self.duty_cycle_ms = duty_cycle_ms
        self.clock = clock
        self.record = record
        self.timeline: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()
        self._holder: str | None = None
        self._waiting: deque[tuple[str, threading.Event]] = deque()
        self._counters = {key: _TurnCounters() for key in keys}

    @property
    def holder(self) -> str | None:
        """The key of the model whose batch runs now (None: the partition is idle)."""
        return self._holder

    @contextmanager
    def turn(self, key: str) -> Iterator[None]:
        """Wait for `key`'s turn (first come, first served), hold it for the body, hand it to the next."""
        counters = self._counters[key]  # KeyError: not a model of this partition
        asked = self.clock()
        with self._lock:
            if self._holder is None and not self._waiting:
                self._holder = key
                granted_event = None
            else:
                granted_event = threading.Event()
                self._waiting.append((key, granted_event))
        if granted_event is not None:
            try:
                granted_event.wait()
            except BaseException:  # interrupted while waiting: leave the line, or pass on a turn just granted
                with self._lock:
                    entry = (key, granted_event)
                    if entry in self._waiting:
                        self._waiting.remove(entry)
                        raise
                self._release()
                raise
        granted = self.clock()
        try:
            yield
        finally:
            released = self.clock()
            wait_ms = (granted - asked) * 1000.0
            with self._lock:
                counters.turns += 1
                counters.wait_ms_total += wait_ms
                if wait_ms > counters.wait_ms_max:
                    counters.wait_ms_max = wait_ms
                counters.run_ms_total += (released - granted) * 1000.0
                if self.duty_cycle_ms is not None and wait_ms > self.duty_cycle_ms:
                    counters.over_duty_cycle += 1
                if self.record:
                    self.timeline.append((key, granted * 1000.0, released * 1000.0))
            self._release()

    def _release(self) -> None:
        with self._lock:
            if self._waiting:
                key, event = self._waiting.popleft()
                self._holder = key
                event.set()
            else:
                self._holder = None

    def waiting(self) -> list[str]:
        """The keys waiting for the turn, first in line first."""
        with self._lock:
            return [key for key, _ in self._waiting]

    def counters(self, key: str) -> dict[str, float | int]:
        """`key`'s turns since the start: turns, wait_ms_total, wait_ms_max, run_ms_total, over_duty_cycle."""
        with self._lock:
            c = self._counters[key]
            return {"turns": c.turns, "wait_ms_total": round(c.wait_ms_total, 3), "wait_ms_max": round(c.wait_ms_max, 3),
                    "run_ms_total": round(c.run_ms_total, 3), "over_duty_cycle": c.over_duty_cycle}


@dataclass(frozen=True)
class RoundMember:
    """A model of a partition run in rounds: its key, its round-driven batcher, its planned turn (ms, the
    plan's latency of its batch on the partition) and the largest batch a turn may run
    (engine.dataplane.rounds.round_batch_cap)."""

    key: str
    batcher: InstanceBatcher
    turn_ms: float
    cap: int


_BEGIN, _COMPLETE = 1, 2  # what the pending wake-up does besides asking the round (stepped and threaded)


class PartitionRounds:
    """One partition's duty-cycle rounds (see the module docstring). `start()` runs them on a thread (the
    batchers' clock is read, in ms); without it, on a `VirtualClock`, `submit` and `step_until` step them.
    The same interface as `PartitionTurns` for health: `holder`, `waiting()`, `counters(key)`, `timeline`
    (`record=True`: one `(key, begun_ms, ended_ms)` per batch)."""

    def __init__(self, members: Sequence[RoundMember], duty_cycle_ms: float, *, record: bool = False) -> None:
        if not members:
            raise ValueError("a partition needs at least one model")
        for m in members:
            if not m.batcher.round_driven:
                raise ValueError(f"model {m.key}: its batcher must be round-driven")
            if not (math.isfinite(m.turn_ms) and m.turn_ms > 0):
                raise ValueError(f"model {m.key}: turn_ms must be a finite number > 0, not {m.turn_ms!r}")
            if m.cap < 1:
                raise ValueError(f"model {m.key}: cap must be >= 1, not {m.cap!r}")
        self.members = list(members)
        self.round = DutyCycleRound(duty_cycle_ms)
        self.duty_cycle_ms = self.round.duty_cycle_ms
        self.record = record
        self.timeline: list[tuple[str, float, float]] = []
        self._turn_ms = [m.turn_ms for m in self.members]
        self._by_key = {m.key: m for m in self.members}
        self._counters = {m.key: _TurnCounters() for m in self.members}
        self._rounds = 0
        first = self.members[0].batcher
        if any(m.batcher.clock is not first.clock for m in self.members):
            raise ValueError("the batchers of a partition must share one clock")
        self._now_ms = first.now_ms
        self._advance = getattr(first.clock, "advance_to", None)
        self._cond = threading.Condition()
        self._wake_at = math.inf  # when the round is next asked (a slot, the next round, a batch's end)
        self._wake_kind = 0
        self._inflight: tuple[RoundMember, Any, float, float] | None = None  # stepped: member, outcome, begun, ends
        self._holder: str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        for m in self.members:
            m.batcher.arrival_hook = self._arrived

    @property
    def holder(self) -> str | None:
        """The key of the model whose batch runs now (None: none)."""
        return self._holder

    def waiting(self) -> list[str]:
        """The keys with queries queued, in round order."""
        return [m.key for m in self.members if len(m.batcher)]

    def counters(self, key: str) -> dict[str, float | int]:
        """`key`'s turns since the start: turns (batches run), wait_ms_total and wait_ms_max (how much later
        than its slot a turn came), run_ms_total, over_duty_cycle (turns later than a duty cycle)."""
        with self._cond:
            c = self._counters[key]
            return {"turns": c.turns, "wait_ms_total": round(c.wait_ms_total, 3), "wait_ms_max": round(c.wait_ms_max, 3),
                    "run_ms_total": round(c.run_ms_total, 3), "over_duty_cycle": c.over_duty_cycle}

    @property
    def rounds(self) -> int:
        """Rounds begun since the start."""
        return self._rounds

    # ------------------------------------------------------------------ the round (lock held)

    def _begin(self, at: float) -> None:
        self.round.begin(at)
        self._rounds += 1

    def _next_offer(self, now: float) -> RoundMember | None:
        """Ask the round at `now`: the member whose turn it is, or None (the wake-up is set, or the rounds
        stopped)."""
        kind, at, j = self.round.next(now, self._turn_ms)
        if kind == WAIT:
            self._wake_at, self._wake_kind = at, 0
            return None
        if kind == END:
            if any(len(m.batcher) for m in self.members):
                self._wake_at, self._wake_kind = at, _BEGIN
            else:
                self.round.stop()
                self._wake_at, self._wake_kind = math.inf, 0
            return None
        member = self.members[j]
        # How late the turn comes against its slot (an earlier batch ran over its planned turn).
        wait = max(0.0, now - self.round.slot_ms(j, self._turn_ms))
        c = self._counters[member.key]
        c.wait_ms_total += wait
        c.wait_ms_max = max(c.wait_ms_max, wait)
        if wait > self.duty_cycle_ms:
            c.over_duty_cycle += 1
        return member

    def _ran(self, member: RoundMember, begun: float, ended: float) -> None:
        c = self._counters[member.key]
        c.turns += 1
        c.run_ms_total += ended - begun
        if self.record:
            self.timeline.append((member.key, begun, ended))

    def begin(self) -> None:
        """The partition starts serving: a round begins now, as the simulator begins a partition's rounds
        when a plan fills it (its turns pass while nothing is queued, and the rounds stop at its end)."""
        with self._cond:
            if self._closed or self.round.on:
                return
            now = self._now_ms()
            self._begin(now)
            self._wake_at, self._wake_kind = now, 0
            if self._thread is None and self._advance is not None:
                self._pump(now)
            self._cond.notify()

    def _arrived(self) -> None:
        """A batcher queued a query: with the rounds stopped, one begins now."""
        with self._cond:
            if self._closed or self.round.on:
                self._cond.notify()
                return
            now = self._now_ms()
            self._begin(now)
            self._wake_at, self._wake_kind = now, 0
            if self._thread is not None:
                self._cond.notify()
                return
            if self._advance is not None:  # stepped: the round's turns due now run now
                self._pump(now)

    # ------------------------------------------------------------------ stepped (virtual clock)

    def _pump(self, now: float) -> None:
        """Stepped: offer turns at `now` until one runs a batch (its end is the next wake-up) or the round
        waits."""
        while True:
            member = self._next_offer(now)
            if member is None:
                return
            batch = member.batcher.turn_take(now, member.cap)
            if batch is None:
                continue
            self._holder = member.key
            outcome, end = member.batcher.turn_run(batch, now)
            self._inflight = (member, outcome, now, end)
            self._wake_at, self._wake_kind = end, _COMPLETE
            return

    def submit(self, key: str, payload: Any, arrival_ms: float, deadline_ms: float | None = None):
        """Stepped: move to `arrival_ms` (what is due by then goes first), then queue the query on `key`'s
        batcher. Returns its future."""
        if self._advance is None or self._thread is not None:
            raise RuntimeError("submit is for rounds stepped on a VirtualClock")
        self.step_until(arrival_ms)
        return self._by_key[key].batcher.submit(payload, arrival_ms=arrival_ms, deadline_ms=deadline_ms)

    def step_until(self, t_ms: float) -> None:
        """Stepped: process every slot, round and batch end due at or before `t_ms`, then move the clock to
        `t_ms` (not when it is infinite)."""
        if self._advance is None:
            raise TypeError("step_until needs the batchers' clock to be a VirtualClock")
        with self._cond:
            while self._wake_at <= t_ms and self._wake_at != math.inf and not self._closed:
                at, kind = self._wake_at, self._wake_kind
                self._wake_at, self._wake_kind = math.inf, 0
                self._advance(at)
                if kind == _COMPLETE:
                    self._complete_inflight()
                elif kind == _BEGIN:
                    self._begin(at)
                self._pump(at)
            if t_ms != math.inf and t_ms > self._now_ms():
                self._advance(t_ms)

    def _complete_inflight(self) -> None:
        assert self._inflight is not None
        member, outcome, begun, end = self._inflight
        self._inflight = None
        self._holder = None
        member.batcher.turn_complete(outcome, begun, end)
        self._ran(member, begun, end)

    # ------------------------------------------------------------------ threaded (real clock)

    def start(self) -> "PartitionRounds":
        """Run the rounds on a thread, the first beginning now (idempotent); the batchers must be started
        too."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the partition's rounds are closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tessera-partition-rounds", daemon=True)
                self._thread.start()
                self.begin()
        return self

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._closed:
                        return
                    now = self._now_ms()
                    if self._wake_at > now:
                        cond.wait(None if self._wake_at == math.inf else (self._wake_at - now) / 1000.0)
                        continue
                    at, kind = self._wake_at, self._wake_kind
                    self._wake_at, self._wake_kind = math.inf, 0
                    if kind == _BEGIN:
                        self._begin(at)  # on the round's cadence, even if this thread woke a little late
                    member = self._next_offer(now)
                    if member is not None:
                        self._wake_at, self._wake_kind = now, 0  # ask again when the turn is over
                        break
            # Outside the lock: arrivals keep coming (their hook takes it) while the batch runs.
            batch = member.batcher.turn_take(now, member.cap)
            if batch is None:
                continue
            self._holder = member.key
            try:
                outcome, end = member.batcher.turn_run(batch, now)
                member.batcher.turn_complete(outcome, now, end)
            finally:
                self._holder = None
            with cond:
                self._ran(member, now, end)
                self._wake_at = min(self._wake_at, end)

    def close(self, timeout: float | None = None) -> None:
        """Stop the rounds: a batch in flight finishes (stepped: it completes now, at its end); the batchers'
        queued queries are theirs to fail (`InstanceBatcher.close`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
            if thread is None and self._inflight is not None:
                if self._advance is not None and self._inflight[3] > self._now_ms():
                    self._advance(self._inflight[3])
                self._complete_inflight()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
