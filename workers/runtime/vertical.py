"""In-place vertical scaling of a CPU runtime (issue 19; Sponge and Biscale, Razavi's thesis P2/P4): what the
runtime needs besides its sessions, kept apart from the frame server.

- `vertical_parse(raw, where)`: a runtime's optional `vertical` block, `{"policy": "sponge"|"biscale",
  "model": {"gamma1", "eps1", "delta1", "eta1"}, "min_cores", "max_cores", "max_batch", "reserve_ms"}`
  (engine.plans.problem.VerticalScaling.to_desired; the same in the agent's desired state and in the
  runtime's spec); ValueError naming the field. The model is Sponge's l(b, c) = gamma1*b/c + eps1/c +
  delta1*b + eta1 ms (engine/vertical/sponge.py), every coefficient finite and >= 0, positive at batch 1 on
  max_cores (a model fitted by `vertical_latency_fit` always is). `max_batch` (optional) is the largest
  batch cap the fast loop may set (at most `VERTICAL_BATCH_MAX`, 4096; a larger one is taken as that);
  `reserve_ms` (default 0) the part of every request's remaining budget a pipeline stage keeps for the
  stages after it (Biscale). Both policies are sized by Sponge's rule every interval
  (engine/vertical/controller.py); they differ in how the plan set the bounds and the reserve.
- `process_cpus()`: the CPUs the process may run on now (None where the platform does not say).
- `affinity_apply(cpus)`: pin every thread of the process (each task under /proc/self/task) to `cpus`.
  onnxruntime pins nothing when `intra_op_num_threads` is explicit (it pins only at the default of 0, or
  with the `session.intra_op_thread_affinities` session option), and the threads of a new session's pool
  inherit the mask of the thread that creates the session, so after a resize every thread, those of the
  cached sessions too, follows the new set. We do not use `session.intra_op_thread_affinities`: it pins a
  session's pool once, at creation (a cached session would keep a stale set after a later resize to other
  CPUs), not the thread that calls `run` (the batcher's, which takes part in the work), and its ids are not
  the kernel's (1-based on Linux). Returns None, or why the platform refused (the resize still stands).
- `ArrivalLog`: the arrivals Sponge sizes the instance with: the rate over an interval and the remaining
  budgets of the requests that arrived in it, per reader (the agent's metrics loop and its fast vertical
  loop each read their own interval: reading does not disturb the other's).
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from engine.vertical.sponge import VerticalLatency

__all__ = ["BUDGETS_MAX", "VERTICAL_BATCH_MAX", "VERTICAL_POLICIES", "ArrivalLog", "VerticalSpec", "affinity_apply", "process_cpus", "vertical_model_parse",
           "vertical_parse"]

VERTICAL_POLICIES = ("sponge", "biscale")
# The budgets a `stats` answer carries at most: the queued requests first (tightest first), then the
# interval's arrivals, newest first. Sponge's solver is linear in them; 512 is ample at the rates one CPU
# instance serves in a second, and keeps the answer small.
BUDGETS_MAX = 512
# The largest batch cap a vertical block's max_batch can open (a larger one is taken as this): the latency
# function is tabulated, and a new session warmed, up to the cap; profiles go up to 4096 too.
VERTICAL_BATCH_MAX = 4096
_MODEL_FIELDS = ("gamma1", "eps1", "delta1", "eta1")
_VERTICAL_FIELDS = frozenset(("model", "min_cores", "max_cores", "policy", "max_batch", "reserve_ms"))


@dataclass(frozen=True)
class VerticalSpec:
    """A validated `vertical` block."""

    model: VerticalLatency
    min_cores: int
    max_cores: int
    policy: str = "sponge"
    max_batch: int | None = None  # the largest batch cap the fast loop may set (None: the runtime's own limit)
    reserve_ms: float = 0.0  # of every request's remaining budget, kept for the pipeline's later stages

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "model": {name: getattr(self.model, name) for name in _MODEL_FIELDS}, "min_cores": self.min_cores,
                "max_cores": self.max_cores, "max_batch": self.max_batch, "reserve_ms": self.reserve_ms}


def vertical_model_parse(raw: Any, where: str) -> VerticalLatency:
    """`{"gamma1", "eps1", "delta1", "eta1"}` -> VerticalLatency; ValueError naming the field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected {{gamma1, eps1, delta1, eta1}} (ms), got {raw!r}")
    unknown = sorted(set(raw) - set(_MODEL_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; a model has {', '.join(_MODEL_FIELDS)}")
    values = []
    for name in _MODEL_FIELDS:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}.{name}: expected a finite number >= 0 (ms), got {value!r}")
        values.append(float(value))
    return VerticalLatency(*values)


def vertical_parse(raw: Any, where: str = "vertical") -> VerticalSpec:
    """A `vertical` block (see the module docstring); ValueError naming the field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected {{policy, model, min_cores, max_cores, max_batch, reserve_ms}}, got {raw!r}")
    unknown = sorted(set(raw) - _VERTICAL_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_VERTICAL_FIELDS))}")
    model = vertical_model_parse(raw.get("model"), f"{where}.model")
    bounds = {}
    for name in ("min_cores", "max_cores"):
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}.{name}: expected an integer >= 1, got {value!r}")
        bounds[name] = value
    if bounds["min_cores"] > bounds["max_cores"]:
        raise ValueError(f"{where}: min_cores {bounds['min_cores']} is above max_cores {bounds['max_cores']}")
    policy = raw.get("policy", "sponge")
    if policy not in VERTICAL_POLICIES:
        raise ValueError(f"{where}.policy: expected one of {', '.join(VERTICAL_POLICIES)}, got {policy!r}")
    if not model.l(1, bounds["max_cores"]) > 0:
        raise ValueError(f"{where}.model: l(1, {bounds['max_cores']}) is 0 ms; a latency model must be positive")
    max_batch = raw.get("max_batch")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ValueError(f"{where}.max_batch: expected an integer >= 1 or null, got {max_batch!r}")
    reserve = raw.get("reserve_ms", 0.0)
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not math.isfinite(reserve) or reserve < 0:
        raise ValueError(f"{where}.reserve_ms: expected a finite number >= 0 (ms), got {reserve!r}")
    return VerticalSpec(model, bounds["min_cores"], bounds["max_cores"], policy,
                        None if max_batch is None else min(max_batch, VERTICAL_BATCH_MAX), float(reserve))


def process_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity mask); None where the platform has no such call."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def affinity_apply(cpus: Iterable[int]) -> str | None:
    """Pin every thread of the process to `cpus` (see the module docstring). None when done; else why not
    (no such call on this platform, or the kernel refused a thread: the others keep the new set)."""
    wanted = set(cpus)
    setaffinity = getattr(os, "sched_setaffinity", None)
    if setaffinity is None:
        return "this platform cannot pin threads (no sched_setaffinity)"
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]  # no /proc: the calling thread at least; the others keep their masks
    refused = []
    for tid in tids:
        try:
            setaffinity(tid, wanted)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError as exc:
            refused.append(f"thread {tid}: {exc.strerror or exc}")
    if refused:
        return f"the kernel refused to pin {len(refused)} of {len(tids)} threads to {sorted(wanted)}: {refused[0]}"
    if tids == [0]:
        return "no /proc/self/task: only the resizing thread was pinned"
    return None


class ArrivalLog:
    """The newest `BUDGETS_MAX` arrivals (arrival ms, deadline ms) and how many arrived in all. `add` runs on
    the event loop thread (the runtime's hot path: one append), and so does `read`: no lock."""

    __slots__ = ("_log", "_count", "_marks", "_started_ms")

    def __init__(self, now_ms: float) -> None:
        self._log: deque[tuple[float, float]] = deque(maxlen=BUDGETS_MAX)
        self._count = 0
        self._marks: dict[str, tuple[int, float]] = {}
        self._started_ms = now_ms

    def add(self, arrival_ms: float, deadline_ms: float) -> None:
        self._log.append((arrival_ms, deadline_ms))
        self._count += 1

    def read(self, reader: str, now_ms: float, queued: list[tuple[float, float]]) -> tuple[float, list[float], float, int, int]:
        """(rate_rps, budgets_ms, interval_s, arrivals, queued_count) over `reader`'s interval (since its previous
        read, or the start), which then begins again. `queued` is (arrival, deadline) of the queries queued
        now; their budget is what is left now (deadline - now), that of the interval's other arrivals what
        they had on arrival (deadline - arrival); at most BUDGETS_MAX in all, the queued ones first, tightest
        first; `queued_count` says how many of the budgets are the queued ones (Sponge checks those as an EDF
        queue and the others as a sample of what the next requests bring)."""
        count, since = self._marks.get(reader, (0, self._started_ms))
        self._marks[reader] = (self._count, now_ms)
        arrivals = self._count - count
        interval_ms = max(now_ms - since, 1e-3)
        budgets = sorted(round(deadline - now_ms, 3) for _arrival, deadline in queued)[:BUDGETS_MAX]
        queued_count = len(budgets)
        if arrivals and len(budgets) < BUDGETS_MAX:
            queued_at = {arrival for arrival, _deadline in queued}
            log = self._log
            for i in range(len(log) - 1, max(len(log) - arrivals, 0) - 1, -1):  # newest first
                arrival, deadline = log[i]
                if arrival in queued_at:
                    continue  # still queued: counted above with what it has left now
                budgets.append(round(deadline - arrival, 3))
                if len(budgets) >= BUDGETS_MAX:
                    break
        return arrivals * 1000.0 / interval_ms, budgets, interval_ms / 1000.0, arrivals, queued_count
