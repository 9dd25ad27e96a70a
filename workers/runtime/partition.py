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

`PartitionTurns` is that rule at run time, work-conserving: at most one batch runs on the partition at a
time, and a model's batcher asks for the turn (`with turns.turn(key):`) around its batch's run. Turns are
granted in the order they were asked for (first come, first served, handed over directly to the next in
line). Each batcher has one worker thread and so at most one batch waiting for the turn: when several
models have a batch ready they run one batch each in turn, round-robin, and a model's wait for the turn
is bounded by one batch of each other model, which the plan keeps within the duty cycle. Nothing idles
to fill a round: a model alone with work runs back to back, and the batching policies (the same as on a
dedicated instance) decide the batch sizes. The duty cycle is checked, not imposed: a wait longer than
it (the plan's promise broken, e.g. a model running slower than profiled) is counted per model
(`over_duty_cycle`).

Why turns and not the models' batches running side by side on the partition's SMs: the latency the plan
holds each model to (its profile L(b, p) on the partition, interference from the GPU's other partitions
included) is one batch at a time on the partition, and so is the paper's temporal sharing.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

__all__ = ["PartitionTurns"]


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
