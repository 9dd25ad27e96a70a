"""The fast vertical loop's decision for one CPU instance, once per interval (about a second): Sponge's
scaler (Razavi's thesis P2 §p2.3.1), as the agent runs it next to the data path and the simulator runs it
in `engine/simulation/vertical.py` (one implementation for both).

Each interval the scaler gets the workload the monitoring measured (the arrival rate) and the set of
requests with their remaining budgets, reordered earliest deadline first by the queue, and re-solves P2.3
(`sponge_brute_force`, Algorithm 2); the adapter then sends the processing component the new cores and
the queue the new batch size (§p2.3.1, "Scaler").

Where this departs, and why: beside the requests queued now (Algorithm 2's EDF check), the scaler looks
at those that arrived during the interval, each with what it had left on arrival, as a sample of what the
next ones will bring: each must fit the worst a new request meets, 2 l(b, c) (`sponge_brute_force`'s
`arrival_budgets_ms`). With a fast instance the queue is often empty when the scaler looks, and sizing for
nothing would drop the cores to the minimum just before the next dip's requests arrive. An observation
that does not say which requests are queued (`queued` None) has all of them checked as one EDF queue,
the stricter reading. With no requests and no traffic the instance keeps its size (`idle`): nothing measured
says it should change, and shrinking an idle instance only makes the next burst late. An infeasible
decision (no size meets every budget) takes the size late for the fewest requests, then the fewest cores:
where cores help that is the most there are (thesis P4 §p4.5.1.2: scale the running instance to its
maximum and let horizontal scaling take the rest), and where the model says they do not help (a model
whose latency hardly falls with cores), the instance is not grown for nothing.

Hysteresis (`ShrinkDwell`, issue 44): Sponge resizes whenever its decision changes, so a load near the
boundary between two sizes resizes the instance every interval; the live agent grows at once and shrinks
only after the smaller size has been enough for several intervals in a row (see the class)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from engine.vertical.sponge import VerticalLatency, arrivals_late, edf_late, sponge_brute_force

__all__ = ["SHRINK_AFTER_INTERVALS", "ShrinkDwell", "VerticalAction", "VerticalObservation", "sponge_pressure_step", "sponge_step"]

# How many intervals in a row a smaller size must have been enough before an instance shrinks to it (the live
# agent's default, TESSERA_AGENT_VERTICAL_SHRINK_AFTER: five seconds at its one-second interval). 1 is Sponge as
# published: shrink as soon as the decision says so.
SHRINK_AFTER_INTERVALS = 5


@dataclass(frozen=True)
class VerticalObservation:
    """What the scaler sees of one instance at the end of an interval."""

    cores: int  # the cores it runs with now
    batch: int  # its batch cap now
    rate_rps: float  # arrivals per second over the interval
    budgets_ms: tuple[float, ...]  # remaining budgets (ms) of the requests queued now and of those that arrived in the interval
    queued: int | None = None  # the first `queued` of budgets_ms are queued now, the rest arrivals (None: all queued)


@dataclass(frozen=True)
class VerticalAction:
    cores: int
    batch: int
    changed: bool
    status: str  # "optimal" | "infeasible" | "idle"
    reason: str
    late: int = 0  # requests the chosen size is expected to make late (infeasible only)
    expired: int = 0  # requests that had no budget left when they were seen


def sponge_step(model: VerticalLatency, observation: VerticalObservation, *, min_cores: int = 1, max_cores: int = 16,
                max_batch: int = 16, delta: float = 1e-3) -> VerticalAction:
    """Sponge's decision for the next interval (see the module docstring): the fewest cores in
    [min_cores, max_cores], then the smallest batch in [1, max_batch], that keep every observed request
    within its remaining budget and serve the measured rate."""
    if not (1 <= min_cores <= max_cores) or max_batch < 1:
        raise ValueError(f"need 1 <= min_cores <= max_cores and max_batch >= 1, got {min_cores}, {max_cores}, {max_batch}")
    if not (math.isfinite(observation.rate_rps) and observation.rate_rps >= 0):
        raise ValueError(f"rate_rps must be a finite number >= 0, got {observation.rate_rps!r}")
    current = (observation.cores, observation.batch)
    if not observation.budgets_ms and observation.rate_rps == 0:
        return VerticalAction(observation.cores, observation.batch, False, "idle", "no requests and no traffic in the interval: size kept")
    queued, arrivals = _split(observation)
    decision = sponge_brute_force(model, queued, observation.rate_rps, max_cores=max_cores, max_batch=max_batch, delta=delta,
                                  arrival_budgets_ms=arrivals)
    if decision.status == "optimal":
        cores, batch = max(decision.cores, min_cores), decision.batch
        reason = f"{cores} cores at batch {batch} keep every request within its budget at {observation.rate_rps:.3g} rps"
        return VerticalAction(cores, batch, (cores, batch) != current, "optimal", reason, expired=decision.expired)
    # Infeasible: the size late for the fewest requests (then the fewest cores, the smallest batch), which
    # the model puts at the most cores where cores help at all.
    cores = max(decision.cores, min_cores)
    reason = (f"no size up to {max_cores} cores serves {observation.rate_rps:.3g} rps within every budget: {cores} cores, "
              f"batch {decision.batch} are late for the fewest ({decision.late})")
    return VerticalAction(cores, decision.batch, (cores, decision.batch) != current, "infeasible", reason, late=decision.late,
                          expired=decision.expired)


def sponge_pressure_step(model: VerticalLatency, observation: VerticalObservation, *, max_cores: int = 16, max_batch: int = 16,
                         delta: float = 1e-3) -> VerticalAction | None:
    """Between two intervals, when the queue changes: a grow, or None. Sponge's check (Algorithm 2's EDF check, and
    what the interval's arrivals so far had left, as `sponge_step` reads them) at the instance's size now; where
    that size would make a request late and more cores (or another batch at least as many cores) keep every
    budget or make fewer late, that size at once, without waiting for the next interval. It never shrinks:
    shrinking stays the interval's decision, held by `ShrinkDwell`, so events cannot make the size flap."""
    if not observation.budgets_ms:
        return None
    queued, arrivals = _split(observation)
    cores, batch = observation.cores, observation.batch
    late_now = edf_late(model, sorted(queued), batch, cores) + arrivals_late(model, sorted(arrivals), batch, cores)
    if late_now == 0:
        return None
    action = sponge_step(model, observation, min_cores=cores, max_cores=max(cores, max_cores), max_batch=max_batch, delta=delta)
    if not action.changed or action.cores < cores or (action.status != "optimal" and action.late >= late_now):
        return None  # nothing better than the size it has
    return action


def _split(observation: VerticalObservation) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if observation.queued is None:
        return observation.budgets_ms, ()
    if not 0 <= observation.queued <= len(observation.budgets_ms):
        raise ValueError(f"queued must be within 0..{len(observation.budgets_ms)}, got {observation.queued!r}")
    return observation.budgets_ms[:observation.queued], observation.budgets_ms[observation.queued:]


class ShrinkDwell:
    """Hysteresis on the per-interval decision of one instance: grow at once, shrink only after a dwell.

    What Sponge does: its scaler re-solves the sizing problem every adaptation period (one second in its
    evaluation, thesis P2 §p2.4) with the workload and the queued requests' remaining budgets, and its adapter
    sends the instance whatever size that gives (§p2.3.1, "Scaler"; §p2.3.4, Algorithm 2). It has no
    hysteresis: a load near the boundary between two sizes, one interval just above what one core serves and
    the next just below, resizes the instance every interval, and each shrink leaves it short when the next
    interval's requests come. Biscale (P4 §p4.5.1.2) is careful on the way down only: it gives resources back
    when the configuration for the peak it predicts over the next ten seconds is the current one.

    Where this departs: a decision for more cores than the instance has, and any infeasible one, is taken at
    once (the SLO needs it now: Sponge's rule). A decision for fewer cores is held until `intervals` decisions
    in a row said fewer would do; then the instance shrinks to the most cores any of them wanted (the
    window's peak, as Biscale sizes for a peak), and the count starts again. A decision that keeps or grows the
    cores ends the count. An idle interval (no requests, no traffic: the size is kept) neither counts nor ends
    it. While a shrink is held, the batch is the controller's at the cores kept (`at_cores`), so every request
    is still sized for. So a load oscillating around a boundary resizes at most once per `intervals`
    intervals, and `intervals` = 1 is Sponge as published. One object per instance: the live agent
    (workers/agent/vertical.py) and the simulator (engine/simulation/vertical.py, `SpongePolicy`) both apply
    it after `sponge_step`."""

    def __init__(self, intervals: int = SHRINK_AFTER_INTERVALS) -> None:
        if isinstance(intervals, bool) or not isinstance(intervals, int) or intervals < 1:
            raise ValueError(f"a shrink dwell is a whole number of intervals >= 1, got {intervals!r}")
        self.intervals = intervals
        self.below = 0  # decisions in a row that wanted fewer cores than the instance has
        self.peak = 0  # the most cores those decisions wanted

    def settle(self, action: VerticalAction, cores: int, at_cores: Callable[[int], VerticalAction]) -> VerticalAction:
        """What the instance, which has `cores` now, does this interval, given `action`, this interval's decision:
        `action` itself when it keeps or grows the cores (or is idle), or shrinks once the dwell is over; else the
        decision at the cores kept, `at_cores(cores)` (the controller with exactly those cores), its reason saying
        the shrink is held. After a dwell the shrink goes to the window's peak, `at_cores(peak)` when that is not
        `action`'s own size."""
        if action.status == "idle":
            return action
        if action.cores >= cores:
            self.below = self.peak = 0
            return action
        self.below += 1
        self.peak = max(self.peak, action.cores)
        if self.below >= self.intervals:
            target = self.peak
            self.below = self.peak = 0
            return action if target == action.cores else self._because(at_cores(target), f"shrunk to the most cores the last {self.intervals} "
                                                                                          f"intervals wanted ({target}); {action.reason}")
        return self._because(at_cores(cores), f"shrink to {action.cores} cores held ({self.below} of {self.intervals} intervals "
                                              f"that fewer would do); {action.reason}")

    def reset(self) -> None:
        """A grow happened between intervals (`sponge_pressure_step`): the count of smaller sizes starts again."""
        self.below = self.peak = 0

    @staticmethod
    def _because(action: VerticalAction, reason: str) -> VerticalAction:
        return VerticalAction(action.cores, action.batch, action.changed, action.status, reason, action.late, action.expired)
