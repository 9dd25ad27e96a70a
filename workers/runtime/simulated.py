"""A runtime session that computes nothing: a simulated GPU instance waits for the profiled latency of the
batch (the service time the simulator uses) and answers every query with no outputs.

`SimulatedSession(profile, max_batch, sleep=time.sleep)` has `OnnxSession`'s serving interface:
`run_batch(list of {name: array}) -> list of {}` (one empty dict per query, after sleeping
`latency_ms(len(batch))` from `policy_latency_function`, the latency the batching policy sees), `warmup()`,
`input_names` / `output_names` (empty: any inputs are accepted) and `simulated = True`, which the runtime
puts on every response and metric it produces for this session. The batch size is the number of queries,
as the batcher counts them.

A simulated CPU runtime whose spec has a `vertical` block (issue 19, Sponge) is given its model
`VerticalLatency(gamma1, eps1, delta1, eta1)` and its current `cores`: its service time is then Sponge's
l(b, c) = gamma1*b/c + eps1/c + delta1*b + eta1 ms at those cores, not the profile (still simulated: it
computes nothing). A resize builds another session at the new cores (they cost nothing to make).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from engine.dataplane.batching import policy_latency_function
from engine.vertical.sponge import VerticalLatency

__all__ = ["ProfilePoint", "SimulatedSession", "profile_points", "vertical_points"]


class ProfilePoint(NamedTuple):
    """One profiled batch latency (what `policy_latency_function` reads: `.batch`, `.latency_ms`)."""

    batch: int
    latency_ms: float


def profile_points(profile: Sequence[Mapping[str, Any] | Sequence[float] | ProfilePoint]) -> list[ProfilePoint]:
    """`[{"batch": 1, "latency_ms": 3.1}, ...]` (or (batch, latency) pairs) -> ProfilePoints, validated."""
    points = []
    for i, entry in enumerate(profile):
        if isinstance(entry, Mapping):
            batch, latency = entry.get("batch"), entry.get("latency_ms")
        else:
            try:
                batch, latency = entry  # type: ignore[misc]
            except (TypeError, ValueError):
                raise ValueError(f"profile[{i}] must be {{batch, latency_ms}}, got {entry!r}") from None
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"profile[{i}]: batch must be an integer >= 1, got {batch!r}")
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not latency >= 0 or latency == float("inf"):
            raise ValueError(f"profile[{i}]: latency_ms must be a finite number >= 0, got {latency!r}")
        points.append(ProfilePoint(batch, float(latency)))
    return points


def vertical_points(model: VerticalLatency, cores: int, max_batch: int) -> list[ProfilePoint]:
    """Sponge's l(b, c) at `cores` for every batch 1..max_batch, as profile points (what the batching policy and
    a simulated session's service time read)."""
    return [ProfilePoint(b, float(model.l(b, cores))) for b in range(1, max(1, int(max_batch)) + 1)]


class SimulatedSession:
    """See the module docstring."""

    simulated = True
    input_names: list[str] = []
    output_names: list[str] = []
    providers: list[str] = ["simulated"]

    def __init__(self, profile: Sequence[Any], max_batch: int, *, sleep: Callable[[float], None] = time.sleep,
                 vertical: VerticalLatency | None = None, cores: int = 1) -> None:
        if vertical is not None:
            if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
                raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
            points = vertical_points(vertical, cores, max_batch)
        else:
            points = profile_points(profile)
        if not points:
            raise ValueError("a simulated session needs a latency profile (at least one {batch, latency_ms} point)")
        self.cores = cores
        self.latency_ms, self.latency_at_1_ms = policy_latency_function(points, max(1, int(max_batch)))
        self._sleep = sleep
        self.input_names = []
        self.output_names = []

    def warmup(self, batch_sizes: Sequence[int] = (1,)) -> None:
        """Nothing to warm."""

    def run_batch(self, inputs: list[Any]) -> list[dict[str, Any]]:
        """Wait for the profiled latency of a batch of len(inputs) queries; one empty output dict per query."""
        if not inputs:
            return []
        seconds = self.latency_ms(len(inputs)) / 1000.0
        if seconds > 0:
            self._sleep(seconds)
        return [{} for _ in inputs]
