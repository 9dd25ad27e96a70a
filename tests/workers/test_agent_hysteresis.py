"""Resize hysteresis of the fast vertical loop (issue 44): a load near the boundary between one and two cores
made Sponge's per-interval decision, and so the runtime, flap every interval. `ShrinkDwell`
(engine/vertical/controller.py) grows at once and shrinks only after the smaller size was enough for
`shrink_after` intervals in a row; the live agent (workers/agent/vertical.py) and the simulator
(engine/simulation/vertical.py) apply the same object after the same decision.

The load: arrivals at 5 a second, each with 100 ms or 130 ms left. With l(b, c) = 60 b / c + 1 ms, a new
request must fit the worst it meets, 2 l(b, c) (a batch in service, then its own): 122 ms on one core, 62 ms
on two. So the 100 ms seconds need two cores and the 130 ms seconds one."""
from __future__ import annotations

from typing import Any

import pytest

from engine.simulation.vertical import SpongePolicy, VerticalRequest, vertical_simulate
from engine.vertical.biscale import BiscaleStage
from engine.vertical.controller import SHRINK_AFTER_INTERVALS, ShrinkDwell, VerticalAction, VerticalObservation, sponge_step
from engine.vertical.sponge import VerticalLatency
from workers.agent.desired import desired_state_parse
from workers.agent.main import VERTICAL_SHRINK_AFTER_ENV, agent_build
from workers.agent.supervisor import RuntimeProcess
from workers.agent.vertical import VerticalScaler

MODEL = {"gamma1": 60.0, "eps1": 0.0, "delta1": 0.0, "eta1": 1.0}
LATENCY = VerticalLatency(**MODEL)
TIGHT_MS, LOOSE_MS, RATE = 100.0, 130.0, 5.0


def observation(cores: int, budget_ms: float) -> VerticalObservation:
    """A second of arrivals, none queued when the loop looks (as a fast runtime usually is)."""
    return VerticalObservation(cores=cores, batch=1, rate_rps=RATE, budgets_ms=(budget_ms,) * int(RATE), queued=0)


def test_the_boundary_is_where_the_module_docstring_says() -> None:
    assert sponge_step(LATENCY, observation(1, TIGHT_MS), max_cores=2, max_batch=4).cores == 2
    assert sponge_step(LATENCY, observation(2, LOOSE_MS), max_cores=2, max_batch=4).cores == 1


def test_shrink_dwell_grows_at_once_shrinks_to_the_windows_peak_and_ignores_idle_intervals() -> None:
    def decision(cores: int, status: str = "optimal") -> VerticalAction:
        return VerticalAction(cores, 1, True, status, f"wants {cores}")

    at_cores = lambda cores: VerticalAction(cores, 2, False, "optimal", f"at {cores}")  # noqa: E731
    dwell = ShrinkDwell(3)
    assert dwell.settle(decision(6), 4, at_cores).cores == 6  # more: at once
    assert [dwell.settle(decision(c), 6, at_cores).cores for c in (2, 3)] == [6, 6]  # fewer would do: held...
    assert dwell.settle(decision(0, "idle"), 6, at_cores).cores == 0  # (idle keeps the size: neither counts nor resets)
    shrunk = dwell.settle(decision(2), 6, at_cores)  # ...until the third in a row, then to the most they wanted
    assert (shrunk.cores, shrunk.batch) == (3, 2) and "most cores the last 3 intervals wanted (3)" in shrunk.reason
    held = dwell.settle(decision(1), 3, at_cores)
    assert (held.cores, held.batch) == (3, 2) and "shrink to 1 cores held (1 of 3" in held.reason
    assert dwell.settle(decision(3), 3, at_cores).cores == 3  # enough again: the count starts over
    assert [dwell.settle(decision(1), 3, at_cores).cores for _ in range(3)] == [3, 3, 1]
    assert [ShrinkDwell(1).settle(decision(1), 3, at_cores).cores] == [1]  # 1: Sponge as published
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number of intervals"):
            ShrinkDwell(bad)  # type: ignore[arg-type]


def oscillating(seconds: int) -> list[VerticalRequest]:
    """RATE arrivals a second, with TIGHT_MS left in even seconds and LOOSE_MS in odd ones."""
    out = []
    for second in range(seconds):
        budget = TIGHT_MS if second % 2 == 0 else LOOSE_MS
        arrivals = [second + (k + 0.5) / RATE for k in range(int(RATE))]  # within the second, none on its boundary
        out.extend(VerticalRequest(t, t + budget / 1000.0) for t in arrivals)
    return out


def test_the_simulator_runs_the_same_hysteresis() -> None:
    stage = BiscaleStage("m", LATENCY, max_batch=4, max_cores=2)
    requests = oscillating(40)
    runs = {n: vertical_simulate((stage,), requests, SpongePolicy(stage, shrink_after=n), initial={"m": (1, 1, 1)}, duration_s=40)
            for n in (1, SHRINK_AFTER_INTERVALS)}
    assert runs[1].resizes >= 30  # Sponge as published: a resize nearly every second
    assert runs[SHRINK_AFTER_INTERVALS].resizes <= 40 // SHRINK_AFTER_INTERVALS  # at most one per dwell window (here: the first grow)
    assert runs[SHRINK_AFTER_INTERVALS].violations <= runs[1].violations


# --------------------------------------------------------------------------- the live agent's fast loop


def vertical_desired() -> Any:
    runtime = {
        "key": "cpu0/0", "device": "cpu0", "placement": None, "cpu_threads": 1, "application": "tabular",
        "variant": {"id": 2, "name": "mlp", "artifact": {"id": 1, "sha256": "0" * 64, "size_bytes": 1, "download": "/nowhere"}},
        "max_batch": 4, "profile": [{"batch": 1, "latency_ms": 61.0}, {"batch": 4, "latency_ms": 241.0}],
        "batching": {"policy": "proteus", "params": {}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 200.0},
        "vertical": {"policy": "sponge", "model": MODEL, "min_cores": 1, "max_cores": 2},
    }
    return desired_state_parse({"host": "h", "version": 1, "gpus": [], "runtimes": [runtime]})


class OneRuntime:
    """A CPU runtime answering the loop's `stats` with the budgets the test sets for each tick, and its resizes."""

    def __init__(self, fingerprint: str) -> None:
        self.record = RuntimeProcess("cpu0/0", fingerprint, "s", "r", "l", pid=1, endpoint="tcp://x:1")
        self.size = {"cores": 1, "max_batch": 4, "cpus": None}
        self.budget_ms = TIGHT_MS
        self.resizes: list[int] = []

    def running(self) -> dict[str, RuntimeProcess]:
        return {"cpu0/0": self.record}

    def call(self, record: RuntimeProcess, header: dict, timeout_s: float) -> dict:
        if header["op"] == "stats":
            return {"status": 200, "stats": {**self.size, "rate_rps": RATE, "budgets_ms": [self.budget_ms] * int(RATE), "queued_budgets": 0}}
        self.resizes.append(header["cores"])
        self.size.update(cores=header["cores"], max_batch=header["max_batch"], cpus=header.get("cpus"))
        return {"status": 200, "cores": header["cores"], "max_batch": header["max_batch"], "cpus": header.get("cpus"), "resize_ms": 0.1,
                "prepared": True}


def fast_loop(**options: Any) -> tuple[VerticalScaler, OneRuntime]:
    desired = vertical_desired()
    runtime = OneRuntime(desired.runtime("cpu0/0").fingerprint)
    supervisor = type("S", (), {"running": runtime.running})()
    options = {"host_cores": 4, "host_cpus": [0, 1, 2, 3], **options}
    scaler = VerticalScaler(supervisor=supervisor, desired=lambda: desired, call=runtime.call, **options)
    return scaler, runtime


def ticks(scaler: VerticalScaler, runtime: OneRuntime, budgets: list[float]) -> list[int]:
    """The cores after each tick, each with its budgets."""
    out = []
    for budget in budgets:
        runtime.budget_ms = budget
        scaler.tick()
        out.append(runtime.size["cores"])
    return out


def test_a_load_at_the_boundary_resizes_at_most_once_per_dwell_and_a_real_increase_at_once() -> None:
    scaler, runtime = fast_loop()  # the agent's default hysteresis
    assert scaler.shrink_after == SHRINK_AFTER_INTERVALS == 5
    flapping = [TIGHT_MS, LOOSE_MS] * 10
    assert ticks(scaler, runtime, flapping) == [2] * 20
    assert runtime.resizes == [2]  # the first tight second grows it at once; no shrink the next second needs undone
    assert "shrink to 1 cores held (1 of 5" in scaler.last_actions["cpu0/0"].reason
    # Loose seconds in a row (the last flapping one was loose: four more make five): it shrinks at the fifth, once.
    assert ticks(scaler, runtime, [LOOSE_MS] * 4) == [2, 2, 2, 1] and runtime.resizes == [2, 1]
    # A real increase resizes at once, in the very tick that sees it.
    assert ticks(scaler, runtime, [TIGHT_MS]) == [2] and runtime.resizes == [2, 1, 2]
    # Over the whole run: never more than one resize in any window of five ticks but for the first grow.
    assert len(runtime.resizes) <= 1 + len(flapping + [LOOSE_MS] * 4 + [TIGHT_MS]) // SHRINK_AFTER_INTERVALS


def test_without_the_dwell_the_same_load_resizes_every_interval() -> None:
    scaler, runtime = fast_loop(shrink_after=1)  # Sponge as published
    assert ticks(scaler, runtime, [TIGHT_MS, LOOSE_MS] * 10) == [2, 1] * 10
    assert len(runtime.resizes) == 20


def test_the_dwell_is_an_agent_setting(tmp_path, monkeypatch) -> None:
    desired = tmp_path / "desired.json"
    desired.write_text('{"host": "h", "version": 1, "gpus": [], "runtimes": []}')

    def build() -> Any:
        return agent_build(control_plane=None, token=None, backend="simulated", state_dir=tmp_path / "state", desired_file=desired, vertical_s=0)

    agent = build()
    assert agent.vertical.shrink_after == SHRINK_AFTER_INTERVALS
    agent.backend.close()
    monkeypatch.setenv(VERTICAL_SHRINK_AFTER_ENV, "10")
    agent = build()
    assert agent.vertical.shrink_after == 10
    agent.backend.close()
    for bad in ("0", "two", "1.5"):
        monkeypatch.setenv(VERTICAL_SHRINK_AFTER_ENV, bad)
        with pytest.raises(ValueError, match=f"{VERTICAL_SHRINK_AFTER_ENV} must be a whole number of intervals >= 1"):
            build()


# --------------------------------------------------------------------------- between ticks (issue 42, item 4)


def test_between_ticks_a_queue_that_would_be_late_grows_the_runtime_at_once_and_never_shrinks_it() -> None:
    """What the fast loop's tick would have done a second later is done at the check between ticks: a request that
    arrived with TIGHT_MS left is late on one core (2 l(1, 1) = 122 ms) and in time on two, so the runtime grows
    there and then; loose budgets change nothing, and the check never shrinks (the tick does, after its dwell)."""
    scaler, runtime = fast_loop()
    runtime.budget_ms = LOOSE_MS
    scaler.tick()  # (its batch cap set to what one core needs)
    before = list(runtime.resizes)
    assert runtime.size["cores"] == 1 and scaler.pressure() == [] and runtime.resizes == before
    runtime.budget_ms = TIGHT_MS
    (grown,) = scaler.pressure()
    assert grown["cores"] == 2 and runtime.resizes == before + [2] and "between ticks" in scaler.last_actions["cpu0/0"].reason
    assert scaler.pressure() == []  # in time at two cores: nothing more
    runtime.budget_ms = LOOSE_MS
    assert scaler.pressure() == [] and runtime.size["cores"] == 2  # never a shrink between ticks
    # The tick's dwell started again with the grow: one loose tick does not shrink it.
    assert ticks(scaler, runtime, [LOOSE_MS]) == [2]


def test_between_ticks_a_grow_takes_only_the_cores_the_host_has_spare() -> None:
    scaler, runtime = fast_loop(host_cores=1)  # the host has no core to spare
    runtime.budget_ms = TIGHT_MS
    assert scaler.pressure() == [] and runtime.resizes == []


def test_the_simulator_grows_between_ticks_too_and_is_late_less() -> None:
    """The same check on every arrival in the simulator (`SpongePolicy(events=True)`): a burst that one core cannot
    keep in time (12 requests 33 ms apart, 250 ms each, against 61 ms a request on one core and 31 on two) is
    grown into at its first requests instead of at the next tick, so fewer are late; and the dwell still holds
    the shrinks afterwards."""
    stage = BiscaleStage("m", LATENCY, max_batch=1, max_cores=2)
    steady = [VerticalRequest(t, t + 1.0) for t in (0.1 + 0.2 * k for k in range(50))]
    burst = [VerticalRequest(t, t + 0.25) for t in (5.21 + 0.033 * k for k in range(12))]
    requests = sorted(steady + burst, key=lambda r: r.arrival_s)
    runs = {events: vertical_simulate((stage,), requests, SpongePolicy(stage, shrink_after=SHRINK_AFTER_INTERVALS, events=events),
                                      initial={"m": (1, 1, 1)}, duration_s=10) for events in (False, True)}
    assert runs[True].violations < runs[False].violations, (runs[True].violations, runs[False].violations)
    assert runs[True].resizes <= runs[False].resizes + 1
