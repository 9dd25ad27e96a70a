"""Discrete-event simulation of a pipeline plan: queries follow their execution paths stage by stage, each
stage a central queue in front of its instances (FA2's implementation, Razavi's thesis P1 §p1.5: "a
central queue in front of all the instances for the DNN [...] composes batches [...] according to the
batch size configuration"), with end-to-end deadlines and the thesis's drop rule (P3 §p3.4.5: a request
already past its SLO at a stage is dropped there).

Each stage's queue is a `QueryQueue` driven by a batching policy from engine/dataplane/batching.py, the
code the live runtime and the single-stage simulator run: whenever an instance of the stage is idle and a
query arrives, a timer the policy asked for fires, or a batch completes, the expired queries are dropped
and the policy decides. The default policy is `fixed` at the plan's batch size b_s (work-conserving: a
batch of min(queued, b_s) starts as soon as an instance is free); `nexus` takes the plan's batch as its
window, and any other policy its defaults. A batch of b runs d_s(b) times a log-normal noise factor
(`service_noise`, 0: exact). Arrivals are Poisson per path at the problem's rates, times `rate_scale(t)`
for a varying trace. A query's deadline is its arrival plus its path's SLO; it counts as on time, late
(answered after the deadline) or dropped.

Where this departs: a query's path is known when it arrives (FA2's requests reveal their next DNN only
after each one; the queues here do not look at it, so the behaviour is the same), and moving between
stages takes no time (the thesis also leaves the network out)."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.dataplane.batching import DEADLINE_TOLERANCE_MS, QueryQueue, batching_policy_make
from engine.pipelines.problem import PipelinePlan, PipelineProblem

__all__ = ["PathOutcome", "PipelineSimulationConfig", "PipelineSimulationResult", "fleet_pipeline_simulate", "pipeline_simulate"]


@dataclass(frozen=True)
class PipelineSimulationConfig:
    duration_s: float = 60.0
    seed: int = 0
    batching: str = "fixed"
    service_noise: float = 0.05
    rate_scale: Callable[[float], float] | None = None  # t (s) -> multiplier of every path's rate


@dataclass
class PathOutcome:
    path: str
    arrivals: int = 0
    on_time: int = 0
    late: int = 0
    dropped: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def violation_ratio(self) -> float:
        """(late + dropped) / arrivals, 0 without arrivals."""
        return (self.late + self.dropped) / self.arrivals if self.arrivals else 0.0

    @property
    def p99_ms(self) -> float | None:
        return float(np.percentile(self.latencies_ms, 99)) if self.latencies_ms else None


@dataclass
class PipelineSimulationResult:
    paths: dict[str, PathOutcome]
    instances: int
    batches: int

    @property
    def violation_ratio(self) -> float:
        arrivals = sum(p.arrivals for p in self.paths.values())
        return sum(p.late + p.dropped for p in self.paths.values()) / arrivals if arrivals else 0.0


_ARRIVE, _DONE, _TIMER = 0, 1, 2


def pipeline_simulate(problem: PipelineProblem, plan: PipelinePlan, config: PipelineSimulationConfig | None = None) -> PipelineSimulationResult:
    """Serve Poisson arrivals on every path of `problem` with `plan`'s batches and instances (see the module
    docstring)."""
    config = config or PipelineSimulationConfig()
    if not plan.decisions:
        raise ValueError(f"plan {plan.solver!r} has no decisions to simulate (status {plan.status})")
    missing = [s.name for s in problem.stages if s.name not in plan.decisions]
    if missing:
        raise ValueError(f"plan {plan.solver!r} decides nothing for stages {missing}")
    if not (math.isfinite(config.duration_s) and config.duration_s > 0) or config.service_noise < 0:
        raise ValueError("duration_s must be a finite number > 0 and service_noise >= 0")
    rng = np.random.default_rng(config.seed)
    stages = {s.name: s for s in problem.stages}
    queue = {name: QueryQueue("fifo") for name in stages}
    policy = {}
    for name in stages:
        b = plan.decisions[name].batch
        params = {"size": b} if config.batching == "fixed" else {"window": b} if config.batching == "nexus" else {}
        policy[name] = batching_policy_make(config.batching, **params)
    idle = {name: plan.decisions[name].instances for name in stages}
    timer_at = {name: math.inf for name in stages}
    latency = {name: stages[name].latency.d for name in stages}
    outcomes = {p.name: PathOutcome(p.name) for p in problem.paths}
    # query id -> (path, position on it, arrival ms, deadline ms)
    queries: dict[int, tuple[int, int, float, float]] = {}
    events: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(time_ms: float, kind: int, data: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time_ms, kind, seq, data))

    # Arrivals: Poisson per path (thinned by rate_scale for a varying trace).
    horizon_ms = config.duration_s * 1000.0
    # The largest multiplier over the run (sampled every 0.1 s): arrivals are drawn at the peak and thinned.
    scale_peak = 1.0 if config.rate_scale is None else max(config.rate_scale(t / 10.0) for t in range(int(config.duration_s * 10) + 1))
    next_id = 0
    for index, path in enumerate(problem.paths):
        if path.rate_rps <= 0:
            continue
        peak = path.rate_rps * scale_peak
        t = 0.0
        while True:
            t += rng.exponential(1000.0 / peak)
            if t >= horizon_ms:
                break
            if config.rate_scale is not None and rng.random() * peak > path.rate_rps * config.rate_scale(t / 1000.0):
                continue
            queries[next_id] = (index, 0, t, t + path.slo_ms)
            outcomes[path.name].arrivals += 1
            push(t, _ARRIVE, next_id)
            next_id += 1
    noise = config.service_noise
    batches = 0

    def drop(ids: list[int], now: float) -> None:
        for qid in ids:
            index, _pos, _arr, _dl = queries.pop(qid)
            outcomes[problem.paths[index].name].dropped += 1

    def kick(name: str, now: float) -> None:
        nonlocal batches
        q = queue[name]
        while idle[name] > 0:
            # The drop rule of IPA §p3.4.5: a query already past its end-to-end deadline goes no further.
            dropped = q.drop_expired(now, "deadline", 0.0, 0.0)
            if dropped:
                drop(dropped, now)
            if not q:
                return
            b, at = policy[name].decide(now, q, latency[name], plan.decisions[name].batch)
            early = q.drop_expired(now, "never", 0.0, 0.0)
            if early:
                drop(early, now)
            if b <= 0 or not q:
                return
            if at > now + 1e-9:
                if at < timer_at[name]:
                    timer_at[name] = at
                    push(at, _TIMER, name)
                return
            batch = q.pop(min(b, len(q)))
            service = latency[name](len(batch))
            if noise:
                service *= float(rng.lognormal(0.0, noise))
            idle[name] -= 1
            batches += 1
            push(now + service, _DONE, (name, [entry[0] for entry in batch], service))

    while events:
        now, kind, _seq, data = heapq.heappop(events)
        if kind == _ARRIVE:
            qid = data
            index, pos, arrival, deadline = queries[qid]
            name = problem.paths[index].stages[pos]
            queue[name].push(qid, now, deadline)  # its arrival at this stage, its end-to-end deadline
            kick(name, now)
        elif kind == _TIMER:
            name = data
            if timer_at[name] <= now + 1e-9:
                timer_at[name] = math.inf
                kick(name, now)
        else:
            name, ids, service = data
            idle[name] += 1
            late = 0
            onward: set[str] = set()
            for qid in ids:
                index, pos, arrival, deadline = queries[qid]
                path = problem.paths[index]
                if now > deadline + DEADLINE_TOLERANCE_MS:
                    late += 1
                if pos + 1 < len(path.stages):
                    queries[qid] = (index, pos + 1, arrival, deadline)
                    nxt = path.stages[pos + 1]
                    queue[nxt].push(qid, now, deadline)
                    onward.add(nxt)
                else:
                    del queries[qid]
                    outcome = outcomes[path.name]
                    outcome.latencies_ms.append(now - arrival)
                    if now > deadline + DEADLINE_TOLERANCE_MS:
                        outcome.late += 1
                    else:
                        outcome.on_time += 1
            policy[name].observe(len(ids), service, late)
            for nxt in sorted(onward):
                kick(nxt, now)
            kick(name, now)
    for name, q in queue.items():  # what a policy early-dropped last
        leftover = q.drop_expired(math.inf, "never", 0.0, 0.0)
        if leftover:
            drop(leftover, math.inf)
    return PipelineSimulationResult(paths=outcomes, instances=plan.instances, batches=batches)


class _ProfiledLatency:
    """d(b) read from a profile by linear interpolation between profiled batches (the planners' and the
    validator's reading), for simulating a placed plan on what was measured rather than on a fit."""

    def __init__(self, batches: list[int], latencies_ms: list[float]) -> None:
        self.batches, self.latencies_ms = batches, latencies_ms

    def d(self, batch: int) -> float:
        return float(np.interp(batch, self.batches, self.latencies_ms))

    def throughput_rps(self, batch: int) -> float:
        return 1000.0 * batch / self.d(batch)


def fleet_pipeline_simulate(problem, plan, pipeline: str, config: PipelineSimulationConfig | None = None) -> PipelineSimulationResult:
    """Simulate one pipeline of a fleet plan (`plan_solve(problem, "fa2" | "ipa")`): each stage with the
    replicas the plan placed, at their batch, served in the profiled latency of their variant on their
    cores; every path at its demand. `problem` and `plan` are engine.plans values."""
    from engine.pipelines.problem import ExecutionPath, PipelineStage, StageDecision
    from engine.plans.problem import CPU_DEVICE_TYPE

    spec = next((p for p in problem.pipelines if p.name == pipeline), None)
    summary = (plan.pipelines or {}).get(pipeline)
    if spec is None or summary is None:
        raise ValueError(f"the plan has no pipeline {pipeline!r} (it has: {', '.join(plan.pipelines or {}) or 'none'})")
    stages, decisions = [], {}
    for st in spec.stages:
        chosen = summary["stages"].get(st.application)
        if not chosen or not chosen.get("replicas_placed"):
            raise ValueError(f"pipeline {pipeline!r}: stage {st.application} has no replica placed; nothing to simulate")
        points = problem.profiles_for(chosen["variant"], CPU_DEVICE_TYPE, str(chosen["cores_per_replica"]))
        latency = _ProfiledLatency([p.batch for p in points], [p.latency_ms for p in points])
        stages.append(PipelineStage(st.application, latency, max(1, int(chosen["batch"]))))  # type: ignore[arg-type]
        decisions[st.application] = StageDecision(st.application, int(chosen["batch"]), int(chosen["replicas_placed"]))
    paths = tuple(ExecutionPath(q.name, q.stages, q.slo_ms, q.demand_rps) for q in spec.paths)
    engine_problem = PipelineProblem(tuple(stages), paths)
    return pipeline_simulate(engine_problem, PipelinePlan(summary["solver"], "feasible", decisions, None), config)
