"""A discrete-event simulator of CPU instances that change cores in place and in number: one model (Sponge,
thesis P2) or a chain of stages (Biscale, thesis P4), driven by a scaling policy every interval.

What it models, per stage: one central queue, earliest deadline first (Sponge's queue, §p2.3.1; Biscale's
stages have one queue each and hand batches to their instances, §p4.3.2), and instances that each run one
batch at a time: an idle instance takes up to its stage's batch cap of the queued requests at once (work
conserving), and the batch takes l(k, c) of the stage's `VerticalLatency`, k the requests taken and c the
instance's cores when the batch starts. The drop rule is the thesis's "1x SLO" (§p4.6.3): a request whose
deadline has passed is dropped when an instance would take it, and counts as a violation. A request
finished after its deadline is a violation too. Requests carry their own deadlines (arrival plus the
remaining budget), so network-eaten budgets (Sponge) and one SLO for all (Biscale) are the same case.

Every `interval_s` the policy sees each stage (ready and starting instances, cores, batch, the arrival rate
and the remaining budgets of the requests seen in the interval) and answers a `StageTarget` per stage,
which the simulator carries out as the agent does: running instances change cores in place after
`resize_s` (a batch already running keeps its cores), new instances serve after `startup_s` (and hold their
cores while they start), stopped instances leave when their batch is done (starting ones are stopped
first). Cores are counted as allocated: every instance's cores, starting ones included, each second.

A policy whose `reacts` is true is also asked `react(now, view)` on every arrival at a stage, between
intervals, and may answer a grow of that stage at once (Sponge with `events`: `sponge_pressure_step`, as the agent's check
between ticks); not while a resize of the stage is under way.

The policies are thin: each calls the engine's own decision (`sponge_step`, `BiscaleController`,
`biscale_horizontal_solve`, `biscale_vertical_solve`), the same code the agent's fast loop runs."""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol, Sequence

import numpy as np

from engine.forecasting.holt import peak_forecast_estimate
from engine.vertical.biscale import (BiscaleController, BiscaleProblem, BiscaleStage, StageTarget, biscale_horizontal_solve,
                                     biscale_vertical_solve)
from engine.vertical.controller import ShrinkDwell, VerticalAction, VerticalObservation, sponge_pressure_step, sponge_step

__all__ = ["BiscalePolicy", "HorizontalPolicy", "SpongePolicy", "StageView", "StaticPolicy", "VerticalPolicy", "VerticalRun",
           "VerticalRequest", "vertical_simulate"]


@dataclass(frozen=True)
class VerticalRequest:
    arrival_s: float  # when it reaches the first stage's queue
    deadline_s: float  # absolute: arrival plus what is left of its SLO


@dataclass(frozen=True)
class StageView:
    """What a policy sees of one stage at the end of an interval."""

    name: str
    ready: int
    starting: int
    cores: int  # of the ready instances (all alike)
    batch: int
    rate_rps: float  # arrivals at the stage over the interval
    budgets_ms: tuple[float, ...]  # remaining budgets of the requests queued now and of those that arrived in the interval
    rate_history: tuple[float, ...]  # arrivals per interval at the first stage, oldest first
    queued: int = 0  # the first `queued` of budgets_ms are queued now, the rest the interval's arrivals (as the runtimes report them)


class VerticalPolicy(Protocol):
    name: str

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]: ...


@dataclass
class _Instance:
    ident: int
    cores: int
    ready_at: float
    busy: bool = False
    stopping: bool = False
    pending: tuple[float, int] | None = None  # (effective at, cores): an in-place resize under way


@dataclass
class _Stage:
    spec: BiscaleStage
    batch: int
    instances: list[_Instance] = field(default_factory=list)
    queue: list[tuple[float, int, VerticalRequest]] = field(default_factory=list)  # (deadline, seq, request): EDF heap
    arrivals: int = 0
    seen: list[tuple[float, VerticalRequest]] = field(default_factory=list)  # the interval's arrivals: (budget on arrival, request)


@dataclass
class VerticalRun:
    policy: str
    requests: int
    violations: int  # late or dropped
    dropped: int
    latencies_ms: np.ndarray  # end to end, served requests
    per_second: list[dict]  # t, arrivals, violations, cores, instances, p99_ms, and per stage cores
    core_seconds: float
    resizes: int
    starts: int

    @property
    def violation_rate(self) -> float:
        return self.violations / self.requests if self.requests else 0.0

    @property
    def mean_cores(self) -> float:
        return self.core_seconds / max(1, len(self.per_second))


def vertical_simulate(stages: Sequence[BiscaleStage], requests: Sequence[VerticalRequest], policy: VerticalPolicy, *,
                      initial: Mapping[str, tuple[int, int, int]], interval_s: float = 1.0, startup_s: float = 5.0, resize_s: float = 0.05,
                      duration_s: float | None = None) -> VerticalRun:
    """Replay `requests` (sorted by arrival) through the chain `stages` under `policy`. `initial`: per stage
    (instances, cores, batch) running at time 0."""
    if interval_s <= 0 or startup_s < 0 or resize_s < 0:
        raise ValueError("interval_s must be > 0, startup_s and resize_s >= 0")
    order = [s.name for s in stages]
    state = {s.name: _Stage(s, initial[s.name][2]) for s in stages}
    ids = itertools.count()
    for s in stages:
        n, c, _b = initial[s.name]
        state[s.name].instances = [_Instance(next(ids), c, 0.0) for _ in range(n)]
    end = duration_s if duration_s is not None else (max((r.arrival_s for r in requests), default=0.0) + interval_s)
    events: list[tuple[float, int, str, object]] = []
    seq = itertools.count()
    for r in requests:
        heapq.heappush(events, (r.arrival_s, next(seq), "arrive", (0, r)))
    t = interval_s
    while t <= end + 1e-9:
        heapq.heappush(events, (t, next(seq), "tick", None))
        t += interval_s
    latencies: list[float] = []
    violations = dropped = resizes = starts = 0
    reacting = policy if getattr(policy, "reacts", False) else None  # a view per arrival only for a policy that reads it
    second_viol: dict[int, int] = {}
    second_arr: dict[int, int] = {}
    second_lat: dict[int, list[float]] = {}
    per_second: list[dict] = []
    rate_history: list[float] = []
    core_seconds = 0.0

    def cores_of(inst: _Instance, now: float) -> int:
        if inst.pending and now >= inst.pending[0]:
            inst.cores, inst.pending = inst.pending[1], None
        return inst.cores

    def violate(r: VerticalRequest, was_dropped: bool) -> None:
        nonlocal violations, dropped
        violations += 1
        dropped += int(was_dropped)
        second_viol[int(r.arrival_s)] = second_viol.get(int(r.arrival_s), 0) + 1

    def dispatch(k: int, now: float) -> None:
        st = state[order[k]]
        for inst in st.instances:
            if inst.busy or inst.stopping or inst.ready_at > now or not st.queue:
                continue
            taken: list[VerticalRequest] = []
            while st.queue and len(taken) < st.batch:
                _, _, r = heapq.heappop(st.queue)
                if r.deadline_s <= now:
                    violate(r, True)  # the 1x SLO drop rule
                    continue
                taken.append(r)
            if not taken:
                continue
            inst.busy = True
            took = st.spec.latency.l(len(taken), cores_of(inst, now)) / 1000.0
            heapq.heappush(events, (now + took, next(seq), "done", (k, inst, taken)))

    def view_of(name: str, now: float, rate_rps: float) -> StageView:
        st = state[name]
        ready = [i for i in st.instances if i.ready_at <= now and not i.stopping]
        queued = [(d - now) * 1000.0 for d, _, _ in st.queue]
        queued_ids = {id(r) for _, _, r in st.queue}
        arrived = [b for b, r in st.seen if id(r) not in queued_ids]  # still queued: counted above with what it has left now
        return StageView(name, len(ready), sum(1 for i in st.instances if i.ready_at > now and not i.stopping),
                         max((cores_of(i, now) for i in ready), default=1), st.batch, rate_rps,
                         tuple(sorted(queued) + arrived), tuple(rate_history), queued=len(queued))

    def resize(st: _Stage, target: StageTarget, now: float) -> None:
        nonlocal resizes
        st.batch = max(1, min(target.batch, st.spec.max_batch))
        for inst in st.instances:
            if inst.stopping:
                continue
            if inst.ready_at <= now and cores_of(inst, now) != target.cores and (inst.pending is None or inst.pending[1] != target.cores):
                inst.pending = (now + resize_s, min(target.cores, st.spec.max_cores))
                resizes += 1

    def react(k: int, now: float) -> None:
        """Between ticks, a policy that reacts to its queue (`react`) may grow a stage at once; not while a resize
        of it is under way, whose cores the view would not show yet."""
        st = state[order[k]]
        if any(i.pending is not None and i.pending[0] > now for i in st.instances):
            return
        target = reacting.react(now, view_of(order[k], now, rate_history[-1] if rate_history else 0.0))
        if target is not None:
            resize(st, target, now)

    def tick(now: float) -> None:
        nonlocal core_seconds, starts
        arrivals_first = state[order[0]].arrivals
        rate_history.append(arrivals_first / interval_s)
        views = [view_of(name, now, state[name].arrivals / interval_s) for name in order]
        second = int(round(now / interval_s)) - 1
        cores_now = {name: sum(i.cores if i.pending is None else max(i.cores, i.pending[1]) for i in state[name].instances) for name in order}
        core_seconds += sum(cores_now.values()) * interval_s
        lat = second_lat.get(second, [])
        per_second.append({"t": round(now, 6), "arrivals": second_arr.get(second, 0), "violations": second_viol.get(second, 0),
                           "cores": sum(cores_now.values()), "instances": sum(len(state[n].instances) for n in order),
                           "p99_ms": float(np.percentile(lat, 99)) if lat else None,
                           **{f"cores[{n}]": cores_now[n] for n in order}, **{f"instances[{n}]": len(state[n].instances) for n in order}})
        for name in order:
            state[name].arrivals = 0
            state[name].seen = []
        targets = policy.decide(now, views)
        for k, name in enumerate(order):
            target = targets.get(name)
            if target is None:
                continue
            st = state[name]
            resize(st, target, now)
            for _ in range(target.start):
                st.instances.append(_Instance(next(ids), min(target.start_cores, st.spec.max_cores), now + startup_s))
                starts += 1
                heapq.heappush(events, (now + startup_s, next(seq), "ready", k))
            stop = target.stop
            for inst in sorted(st.instances, key=lambda i: (i.ready_at <= now, i.busy)):  # starting, then idle, then busy
                if stop <= 0:
                    break
                if sum(1 for i in st.instances if not i.stopping) <= 1:
                    break  # a stage always keeps one instance
                inst.stopping = True
                stop -= 1
            st.instances = [i for i in st.instances if not (i.stopping and not i.busy)]
            dispatch(k, now)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            k, r = payload
            st = state[order[k]]
            st.arrivals += 1
            st.seen.append(((r.deadline_s - now) * 1000.0, r))
            if k == 0:
                second_arr[int(r.arrival_s)] = second_arr.get(int(r.arrival_s), 0) + 1
            heapq.heappush(st.queue, (r.deadline_s, next(seq), r))
            dispatch(k, now)
            if reacting is not None:
                react(k, now)
        elif kind == "done":
            k, inst, taken = payload
            inst.busy = False
            st = state[order[k]]
            if inst.stopping:
                st.instances = [i for i in st.instances if i is not inst]
            for r in taken:
                if k + 1 < len(order):
                    heapq.heappush(events, (now, next(seq), "arrive", (k + 1, r)))
                elif now > r.deadline_s + 1e-12:
                    violate(r, False)
                else:
                    ms = (now - r.arrival_s) * 1000.0
                    latencies.append(ms)
                    second_lat.setdefault(int(r.arrival_s), []).append(ms)
            dispatch(k, now)
        elif kind == "ready":
            dispatch(payload, now)
        else:
            tick(now)
    # Whatever is still queued at the end was never served.
    for st in state.values():
        for _, _, r in st.queue:
            violate(r, True)
    return VerticalRun(policy.name, len(requests), violations, dropped, np.array(latencies), per_second, core_seconds, resizes, starts)


# --------------------------------------------------------------------------- policies


class StaticPolicy:
    """A fixed size: nothing changes (the thesis's static 8- and 16-core instances, §p2.4)."""

    def __init__(self, cores: int, batch: int, name: str | None = None) -> None:
        self.cores, self.batch = cores, batch
        self.name = name or f"static-{cores}"

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]:
        return {v.name: StageTarget(self.cores, self.batch) for v in views}


class SpongePolicy:
    """One instance resized in place every interval by Sponge's scaler (`sponge_step`), the measured rate
    taken times `headroom` (as the other policies take theirs: an instance sized for exactly the mean rate
    queues past its budgets on every Poisson burst). `shrink_after`: the intervals a smaller size must have been
    enough before the instance shrinks (`ShrinkDwell`, the live agent's hysteresis, whose default is
    `SHRINK_AFTER_INTERVALS`); 1, the default here, is Sponge as published, the baseline the benches compare."""

    name = "sponge"

    def __init__(self, stage: BiscaleStage, *, headroom: float = 1.0, shrink_after: int = 1, events: bool = False) -> None:
        self.stage = stage
        self.headroom = headroom
        self.dwell = ShrinkDwell(shrink_after)
        self.reacts = events
        if events:
            self.name = "sponge-events"

    def react(self, now_s: float, view: StageView) -> StageTarget | None:
        """With `events`, between intervals: `sponge_pressure_step` on the queue as it is now (a grow, or nothing)."""
        observation = VerticalObservation(view.cores, view.batch, view.rate_rps * self.headroom, view.budgets_ms, queued=view.queued)
        action = sponge_pressure_step(self.stage.latency, observation, max_cores=self.stage.max_cores, max_batch=self.stage.max_batch)
        if action is None:
            return None
        self.dwell.reset()
        return StageTarget(action.cores, action.batch)

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]:
        v = views[0]
        observation = VerticalObservation(v.cores, v.batch, v.rate_rps * self.headroom, v.budgets_ms, queued=v.queued)

        def at(min_cores: int, max_cores: int) -> VerticalAction:
            return sponge_step(self.stage.latency, observation, min_cores=min_cores, max_cores=max_cores, max_batch=self.stage.max_batch)

        action = self.dwell.settle(at(1, self.stage.max_cores), max(1, min(v.cores, self.stage.max_cores)), lambda cores: at(cores, cores))
        return {v.name: StageTarget(action.cores, action.batch)}


def _first_rate(views: Sequence[StageView]) -> float:
    return views[0].rate_rps


def _predicted_rps(views: Sequence[StageView], horizon_s: float, window: int) -> float:
    """The largest rate expected over the next `horizon_s`: max(recent peak, Holt's forecast) of the
    first stage's per-interval rates (`peak_forecast_estimate`, the planner's own estimate; the thesis
    uses an LSTM, see engine/forecasting/holt.py)."""
    history = views[0].rate_history[-max(window, 2):]
    return peak_forecast_estimate(list(history), horizon_s)[2] if len(history) >= 2 else _first_rate(views)


class HorizontalPolicy:
    """FA2-style horizontal scaling (the thesis's baseline in §p2.4 and §p4.6): one-core instances, as many
    as Algorithm 4 (FA2's DP) wants at the pipeline's one SLO, started cold. It sizes for the same predicted
    load Biscale does (`_predicted_rps`, times `headroom`), so that the comparison is of the scaling
    mechanism, not of the forecast."""

    name = "horizontal"

    def __init__(self, stages: Sequence[BiscaleStage], slo_ms: float, *, headroom: float = 1.0, horizon_s: float = 10.0, window: int = 10) -> None:
        self.template = BiscaleProblem(tuple(stages), slo_ms, 1.0)
        self.headroom, self.horizon_s, self.window = headroom, horizon_s, window

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]:
        rate = _predicted_rps(views, self.horizon_s, self.window) * self.headroom
        plan = biscale_horizontal_solve(self.template.with_rate(max(rate, 1e-3)))
        if plan.status != "optimal":
            return {}
        out = {}
        for v in views:
            d = plan.decisions[v.name]
            have = v.ready + v.starting
            out[v.name] = StageTarget(1, d.batch, start=max(0, d.instances - have), stop=max(0, have - d.instances))
        return out


class SpongeExtendedPolicy:
    """The thesis's "vertical scaling" baseline for pipelines (§p4.6: Algorithm 3 without its horizontal
    part, one instance per stage)."""

    name = "vertical"

    def __init__(self, stages: Sequence[BiscaleStage], slo_ms: float, *, cores_cap: int | None = None, headroom: float = 1.0) -> None:
        self.template = BiscaleProblem(tuple(stages), slo_ms, 1.0)
        self.cores_cap, self.headroom = cores_cap, headroom

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]:
        plan = biscale_vertical_solve(self.template.with_rate(max(_first_rate(views) * self.headroom, 1e-3)), cores_cap=self.cores_cap)
        if plan.status == "infeasible":
            return {s.name: StageTarget(s.max_cores, 1) for s in self.template.stages}
        return {name: StageTarget(d.cores, d.batch) for name, d in plan.decisions.items()}


class BiscalePolicy:
    """Biscale's controller with the load prediction it needs (`_predicted_rps`); the measured and the
    predicted rate are both taken times `headroom`.

    `shrink_after`: the intervals a stage's smaller core count must have been enough before its instances
    shrink (`ShrinkDwell`, per stage, on the controller's cores; the batch is the controller's, which the
    cores kept only make faster). 1, the default, is Biscale as published (§p4.5: back to one-core
    instances as soon as enough of them are ready). Departure with more: a burst's swings come back within
    a few seconds, and a stage that has just shrunk to one core per instance meets the next swing a whole
    interval late; the bench's `biscale-dwell` row holds the cores as the live agent holds Sponge's."""

    name = "biscale"

    def __init__(self, stages: Sequence[BiscaleStage], slo_ms: float, *, cores_cap: int | None = None, headroom: float = 1.0,
                 horizon_s: float = 10.0, window: int = 10, shrink_after: int = 1) -> None:
        self.controller = BiscaleController(stages, slo_ms, cores_cap=cores_cap)
        self.headroom, self.horizon_s, self.window = headroom, horizon_s, window
        ShrinkDwell(shrink_after)  # refuses a bad value here
        self.shrink_after = shrink_after
        self.dwells: dict[str, ShrinkDwell] = {}
        self.modes: list[str] = []
        if shrink_after > 1:
            self.name = "biscale-dwell"

    def decide(self, now_s: float, views: Sequence[StageView]) -> Mapping[str, StageTarget]:
        predicted = _predicted_rps(views, self.horizon_s, self.window)
        decision = self.controller.decide(rate_rps=_first_rate(views) * self.headroom, predicted_rps=predicted * self.headroom,
                                          ready={v.name: v.ready for v in views}, starting={v.name: v.starting for v in views})
        self.modes.append(decision.mode)
        if self.shrink_after == 1:
            return decision.targets
        targets = dict(decision.targets)
        for v in views:
            target = targets.get(v.name)
            if target is None or v.ready == 0:
                continue
            dwell = self.dwells.setdefault(v.name, ShrinkDwell(self.shrink_after))
            kept = dwell.settle(VerticalAction(target.cores, target.batch, True, "optimal", decision.mode), max(1, v.cores),
                                lambda cores, batch=target.batch: VerticalAction(cores, batch, True, "optimal", "held"))
            if kept.cores != target.cores:
                targets[v.name] = replace(target, cores=kept.cores)
        return targets


def requests_from_rates(rates_rps: Sequence[float], *, slo_ms: float, seed: int = 0) -> list[VerticalRequest]:
    """Poisson arrivals at a per-second rate, each with the whole SLO as its budget (Biscale's uniform SLO)."""
    rng = np.random.default_rng(seed)
    out = []
    for second, rate in enumerate(rates_rps):
        n = rng.poisson(max(0.0, rate))
        for t in np.sort(rng.uniform(second, second + 1, n)):
            out.append(VerticalRequest(float(t), float(t) + slo_ms / 1000.0))
    return out


def bursty_rates(seconds: int, *, base_rps: float, peak_rps: float, seed: int = 0) -> np.ndarray:
    """A synthetic bursty trace in the shape of the thesis's Twitter excerpts (§p4.6.1, Figure P4.7: low and
    steady, a sharp rise, a peak, a slow return, short fluctuations on the way), stated as synthetic:
    base until 15 % of the run, a rise to the peak within 5 % of it, the peak with +-15 % swings until 45 %,
    a linear return to the base by 80 %, and 10 % noise throughout."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds) / max(1, seconds)
    shape = np.where(t < 0.15, 0.0, np.where(t < 0.20, (t - 0.15) / 0.05, np.where(t < 0.45, 1.0, np.clip((0.80 - t) / 0.35, 0.0, 1.0))))
    swings = np.where((t >= 0.2) & (t < 0.8), 0.15 * np.sin(2 * math.pi * np.arange(seconds) / 23.0), 0.0)
    rates = base_rps + (peak_rps - base_rps) * shape
    return np.maximum(0.0, rates * (1 + swings) * rng.lognormal(-0.005, 0.1, seconds))
