"""Duty-cycle rounds of a time-shared partition: the one round the simulator and the live runtime both run.

gpulets (Choi et al., ATC'22) shares a GPU partition temporally by the rules of its §2.2, Nexus's squishy
bin packing (SBP), whose execution is round-based (Figure 2, "Round-based execution of SBP for two models
consolidated on a GPU. Duty cycle is the interval for a round"): the models' batches are built during one
round and executed in the next, one model after the other, and "the SBP algorithm heuristically finds a
maximum possible duration for batch building, called duty cycle, and the corresponding batch sizes in such
a way that all the consolidated models would not violate the SLOs. The SBP algorithm repeats the duty
cycles in a pipelined fashion." §4.3 ("Temporal scheduling for gpulets") merges gpulets by the same rules,
and the planner writes the round as the partition's `duty_cycle_ms` (engine/solvers/gpulets.py).

`DutyCycleRound` is that round as a state machine with no clock of its own (time is passed in):

- A round begins (`begin(t)`), at the latest a duty cycle after the previous one began.
- Each model has a fixed slot in it: the round's start plus the planned turn lengths (`turn_ms`, the
  plan's latency of each model's batch on the partition, interference included) of the models before it.
  `next(now, turn_ms)` answers `(WAIT, t, -1)` until the next model's slot, then `(OFFER, now, j)`: model j
  may run one batch now (the turn moves on whether it runs one or not). The driver runs the batch and asks
  again when it ends; a batch that overran pushes the later turns back (they come at once), it never moves
  their slots forward.
- When every model had its turn: `(END, t, -1)`, the next round begins at t = the round's start plus the
  duty cycle (or now, if this round overran). A driver with nothing queued stops instead (`on` False) and
  begins a round when a query arrives.

Departure from the paper, and why: Figure 2 has every model run once per round whether or not its batch is
full; here a model with nothing queued passes its turn, and rounds stop while nothing is queued (an idle
partition does not tick). The slots stay fixed, so a model's batches start a duty cycle apart whatever
the others ran (Nexus's bound, wait <= duty cycle); with work-conserving turns a model's place in the round
shifted with what the others ran, and a 3-model partition at 50 req/s dropped 1.4 % of its requests in
simulation, against none with fixed slots.

`round_batch_cap(planned, profiled)` is how large a batch a turn may run: the plan's batch is what a round
collects on average (rate x duty cycle), and a round that collected more runs it, up to the largest
profiled batch, while the earliest deadline allows (the batching policy decides), rather than carry it over.

Drivers: the simulator (engine/simulation/simulator.py, events `_ROUND` and `_TURN`) and the live partition
runtime (workers/runtime/partition.py, `PartitionRounds`, threaded on the real clock or stepped on a
virtual one).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

__all__ = ["END", "OFFER", "ROUND_BATCHING_POLICY", "ROUND_EPSILON_MS", "WAIT", "DutyCycleRound", "round_batch_cap"]

# A slot this close to now counts as now (the batching contract's at-epsilon).
ROUND_EPSILON_MS = 1e-9
# The batching policy of a round's models: Nexus's (a turn sizes its batch from what is queued and drops
# from the head what cannot make it), as plans translate it and the simulator predicts it.
ROUND_BATCHING_POLICY = "nexus"
WAIT, OFFER, END = 0, 1, 2


def round_batch_cap(planned_batch: int, profiled_batches: Iterable[int]) -> int:
    """The largest batch a model's turn may run: the plan's batch or the largest profiled one, whichever
    is larger (see the module docstring)."""
    return max(max(1, int(planned_batch)), max((int(b) for b in profiled_batches), default=1))


class DutyCycleRound:
    """One partition's round (see the module docstring). `duty_cycle_ms` may change between rounds (a new
    plan); the turn lengths are passed to every `next` call, so members may change too (a model removed
    mid-round shifts the later turns by one: one turn may be skipped or repeated, once)."""

    __slots__ = ("duty_cycle_ms", "start_ms", "turn", "on")

    def __init__(self, duty_cycle_ms: float) -> None:
        self.duty_cycle_ms = self._checked(duty_cycle_ms)
        self.start_ms = 0.0
        self.turn = 0
        self.on = False

    @staticmethod
    def _checked(duty_cycle_ms: float) -> float:
        if isinstance(duty_cycle_ms, bool) or not isinstance(duty_cycle_ms, (int, float)) or not (
                math.isfinite(duty_cycle_ms) and duty_cycle_ms > 0):
            raise ValueError(f"duty_cycle_ms must be a finite number > 0, not {duty_cycle_ms!r}")
        return float(duty_cycle_ms)

    def duty_cycle_set(self, duty_cycle_ms: float) -> None:
        """A new plan's round length; it applies from the next round's start."""
        self.duty_cycle_ms = self._checked(duty_cycle_ms)

    def begin(self, now_ms: float) -> None:
        """A round begins at `now_ms`: the first model's slot is now."""
        self.start_ms = float(now_ms)
        self.turn = 0
        self.on = True

    def stop(self) -> None:
        """Nothing is queued: no rounds until `begin` (the next arrival)."""
        self.on = False

    def slot_ms(self, turn: int, turn_ms: Sequence[float]) -> float:
        """When turn `turn` of this round comes: the round's start plus the turns before it."""
        return self.start_ms + math.fsum(turn_ms[:turn])

    def next(self, now_ms: float, turn_ms: Sequence[float]) -> tuple[int, float, int]:
        """What the driver does at `now_ms` (no batch of the partition running): `(WAIT, t, -1)` ask again
        at t; `(OFFER, now, j)` model j's turn (taken by this call); `(END, t, -1)` every model had its
        turn, the next round begins at t."""
        if self.turn < len(turn_ms):
            slot = self.slot_ms(self.turn, turn_ms)
            if slot > now_ms + ROUND_EPSILON_MS:
                return WAIT, slot, -1
            j = self.turn
            self.turn += 1
            return OFFER, now_ms, j
        return END, max(self.start_ms + self.duty_cycle_ms, now_ms), -1
