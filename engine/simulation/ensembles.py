"""Serving random ensembles, simulated (Garrison, DAC'24, §3 and §5; cited
in docs/references.md): each query of s rows (a client batch) is answered by the members a
scheduler chooses; each chosen member's query goes to one of its instances, chosen by a routing rule;
instances run one query at a time in arrival order (Garrison batches no queries together: a query is its
own batch); the answer is the weighted vote of the members that answer by the deadline.

What it shares with the live system: the schedulers, the draw and the frequency table
(engine/ensembles), the vote (`ensemble_vote`, when outputs are given) and Garrison's instance routing
(`queries_match_instances` with the normalised usage time, §5.3). `EnsembleServing` is stepwise, so the
learned scheduler's Gymnasium environment (engine/ensembles/environment.py) drives the same code.

Measured per query: the ensemble latency, the slowest chosen member's completion (the paper's latency: "the
overall inference time of the ensemble"); whether it met the SLO; the members chosen and those that
answered in time (the router leaves a late member out of the vote rather than answer after the SLO, so
`voted` is the ensemble that decided). A member whose instance cannot start it before the deadline is
not sent (the router's drop rule).

Routing rules (the instance of a chosen member):
- `garrison`: least normalised usage time U = L_k x D within the deadline (§5.3; one query at a time, so
  the matching is over this query and the member's instances, D counting the instance's queue);
- `earliest`: earliest predicted completion (Clockwork's predictable-latency choice, OSDI'20 §4);
- `least-loaded`: fewest queued queries (the least-outstanding rule common to model-serving balancers; the
  paper names Cocktail's scheduling but gives no rule, so this stands in for it);
- `size-threshold`: queries above the median query size to the member's largest instances, the rest to
  its smallest (DeepRecSys's size-aware split of large and small queries, ISCA'20 §4, as the paper
  describes it: "identifying the heterogeneity of GPU instances").
Departure: service times are the profiles' latencies times log-normal noise (sigma `noise_sigma`); the
paper's testbed measured them.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from engine.dataplane.routing import queries_match_instances
from engine.ensembles.policy import EnsemblePolicy
from engine.ensembles.sampling import SamplingFrequencies, randomness_bias
from engine.ensembles.scheduler import EnsembleScheduler, SchedulerSpec, SchedulerView
from engine.ensembles.sizes import query_size_ranges
from engine.plans.problem import Plan, Problem

__all__ = [
    "ROUTING_RULES",
    "EnsembleInstance",
    "EnsembleOutcome",
    "EnsembleRun",
    "EnsembleScenario",
    "EnsembleServing",
    "ensemble_scenario_from_plan",
    "ensemble_simulate",
    "instances_from_profiles",
    "query_sizes_draw",
]

ROUTING_RULES: tuple[str, ...] = ("garrison", "earliest", "least-loaded", "size-threshold")


@dataclass(frozen=True)
class EnsembleInstance:
    """One instance of a member: its granularity L_k (compute slices) and its latency per query size."""

    id: str
    variant: str
    level: float
    sizes: tuple[int, ...]  # profiled query sizes, ascending
    latency_ms: tuple[float, ...]  # latency of a query of each size

    def service_ms(self, size: int) -> float:
        return float(np.interp(size, self.sizes, self.latency_ms))


@dataclass(frozen=True)
class EnsembleScenario:
    """An ensemble application on its instances: the policy, the SLO, Poisson arrivals at `rate_rps` for
    `duration_s`, query sizes drawn from `query_sizes` ((size, probability) pairs)."""

    name: str
    policy: EnsemblePolicy
    instances: tuple[EnsembleInstance, ...]
    slo_ms: float
    rate_rps: float
    duration_s: float
    query_sizes: tuple[tuple[int, float], ...]
    history: int = 16  # T: the query sizes the learned scheduler sees

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m.variant for m in self.policy.members if m.probability > 0)

    @property
    def range_sizes(self) -> tuple[int, ...]:
        """The largest size of each query-size range queries take (the learned scheduler's S_p columns)."""
        return tuple(r.size for r in query_size_ranges(self.query_sizes))

    def spec(self) -> SchedulerSpec:
        return SchedulerSpec(self.members, self.range_sizes, self.history, self.slo_ms, max(s for s, _ in self.query_sizes))


def query_sizes_draw(query_sizes: Sequence[tuple[int, float]], n: int, rng: np.random.Generator) -> np.ndarray:
    sizes = np.array([s for s, _ in query_sizes])
    p = np.array([p for _, p in query_sizes], dtype=float)
    return rng.choice(sizes, size=n, p=p / p.sum())


@dataclass(frozen=True)
class EnsembleOutcome:
    arrival_ms: float
    size: int
    chosen: tuple[str, ...]
    voted: tuple[str, ...]  # answered by the deadline
    latency_ms: float  # the slowest chosen member's completion, from arrival (inf: none was sent)
    met_slo: bool


@dataclass
class EnsembleRun:
    scheduler: str
    routing: str
    outcomes: list[EnsembleOutcome]
    frequencies: dict[str, float]
    probabilities: dict[str, float]
    bias: float
    instance_busy_ms: dict[str, float] = field(default_factory=dict)

    def latency_percentile(self, q: float) -> float:
        values = [o.latency_ms for o in self.outcomes]  # inf where a chosen member was never sent
        return float(np.percentile(values, q, method="higher")) if values else float("nan")

    @property
    def violation_ratio(self) -> float:
        return sum(not o.met_slo for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    @property
    def mean_chosen(self) -> float:
        return float(np.mean([len(o.chosen) for o in self.outcomes])) if self.outcomes else 0.0

    @property
    def mean_voted(self) -> float:
        return float(np.mean([len(o.voted) for o in self.outcomes])) if self.outcomes else 0.0

    def summary(self) -> dict:
        return {"scheduler": self.scheduler, "routing": self.routing, "queries": len(self.outcomes),
                "p50_ms": self.latency_percentile(50), "p99_ms": self.latency_percentile(99), "violation_ratio": self.violation_ratio,
                "mean_ensemble": self.mean_chosen, "mean_voted": self.mean_voted, "bias": self.bias}


class EnsembleServing:
    """The serving state, one query at a time: `view(size)` for the scheduler, then `serve(members)`."""

    def __init__(self, scenario: EnsembleScenario, *, routing: str = "garrison", noise_sigma: float = 0.05,
                 rng: np.random.Generator | None = None, window: int = 1000, spec: SchedulerSpec | None = None) -> None:
        """`spec`: the state's shape the scheduler reads (a learned policy's own; default the scenario's)."""
        if routing not in ROUTING_RULES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_RULES)}, got {routing!r}")
        self.scenario = scenario
        self.spec = spec or scenario.spec()
        self.routing = routing
        self.noise_sigma = noise_sigma
        self.rng = rng or np.random.default_rng(0)
        self.by_member: dict[str, list[EnsembleInstance]] = {m: [] for m in scenario.members}
        for instance in scenario.instances:
            if instance.variant in self.by_member:
                self.by_member[instance.variant].append(instance)
        self.free_at: dict[str, float] = {i.id: 0.0 for i in scenario.instances}
        self.queued: dict[str, deque[float]] = {i.id: deque() for i in scenario.instances}  # completion times
        self.busy_ms: dict[str, float] = {i.id: 0.0 for i in scenario.instances}
        self.frequencies = SamplingFrequencies(scenario.members, window=window)
        self.recent_sizes: deque[int] = deque(maxlen=scenario.history)
        self.recent_missed: deque[bool] = deque(maxlen=scenario.history)
        sizes = sorted(s for s, _ in scenario.query_sizes)
        self.median_size = sizes[len(sizes) // 2]
        self.now_ms = 0.0
        # Latencies at every size queries take, looked up rather than interpolated per query.
        known = set(sizes) | set(self.spec.range_sizes)
        self._service = {i.id: {size: i.service_ms(size) for size in known} for i in scenario.instances}
        self._latency_table = tuple(
            tuple(min((self._service[i.id][s] for i in self.by_member.get(m) or []), default=10 * self.spec.slo_ms) for s in self.spec.range_sizes)
            for m in self.spec.members)

    def service_ms(self, instance: EnsembleInstance, size: int) -> float:
        known = self._service[instance.id].get(size)
        return known if known is not None else instance.service_ms(size)

    def view(self, now_ms: float, size: int) -> SchedulerView:
        self.now_ms = now_ms
        remaining = []
        for member in self.spec.members:
            instances = self.by_member.get(member) or []
            remaining.append(min((max(0.0, self.free_at[i.id] - now_ms) for i in instances), default=10 * self.spec.slo_ms))
        probabilities = self.scenario.policy.probabilities
        frequencies = self.frequencies.frequencies()
        bias = tuple(frequencies.get(m, 0.0) - probabilities.get(m, 0.0) for m in self.spec.members)
        return SchedulerView(size, tuple(remaining), self._latency_table, tuple(self.recent_sizes), bias)

    def _instance_for(self, member: str, size: int, deadline_ms: float) -> EnsembleInstance | None:
        instances = self.by_member.get(member) or []
        if not instances:
            return None
        now = self.now_ms
        for i in instances:  # forget completed queries (least-loaded reads the queue length)
            queue = self.queued[i.id]
            while queue and queue[0] <= now:
                queue.popleft()
        if self.routing == "garrison":
            ((_, k),) = queries_match_instances([deadline_ms], [self.free_at[i.id] for i in instances], [self.service_ms(i, size) for i in instances],
                                               levels=[i.level for i in instances], now_ms=now)
            return instances[k]
        if self.routing == "earliest":
            return min(instances, key=lambda i: (max(self.free_at[i.id], now) + self.service_ms(i, size), i.id))
        if self.routing == "least-loaded":
            return min(instances, key=lambda i: (len(self.queued[i.id]), self.free_at[i.id], i.id))
        ordered = sorted(instances, key=lambda i: (i.level, i.id))  # size-threshold
        pool = ordered[len(ordered) // 2:] if size > self.median_size else ordered[: max(1, len(ordered) // 2)]
        return min(pool, key=lambda i: (max(self.free_at[i.id], now) + self.service_ms(i, size), i.id))

    def serve(self, members: Sequence[str], size: int) -> EnsembleOutcome:
        """Send the query (arrived at the last `view`'s time) to `members`; returns its outcome."""
        now = self.now_ms
        deadline = now + self.scenario.slo_ms
        voted, completions = [], []
        for member in members:
            instance = self._instance_for(member, size, deadline)
            if instance is None:
                continue
            start = max(self.free_at[instance.id], now)
            if start >= deadline:  # cannot start in time: not sent
                completions.append(math.inf)
                continue
            service = self.service_ms(instance, size) * float(np.exp(self.rng.normal(0.0, self.noise_sigma)))
            done = start + service
            self.free_at[instance.id] = done
            self.queued[instance.id].append(done)
            self.busy_ms[instance.id] += service
            completions.append(done)
            if done <= deadline:
                voted.append(member)
        latency = (max(completions) - now) if completions else math.inf
        met = bool(completions) and latency <= self.scenario.slo_ms
        self.frequencies.record(members)
        self.recent_sizes.append(int(size))
        self.recent_missed.append(not met)
        return EnsembleOutcome(now, int(size), tuple(members), tuple(voted), latency, met)


def ensemble_simulate(scenario: EnsembleScenario, scheduler: EnsembleScheduler, *, routing: str = "garrison", seed: int = 0,
                      noise_sigma: float = 0.05) -> EnsembleRun:
    """Poisson arrivals of the scenario, each scheduled by `scheduler` and routed by `routing`."""
    rng = np.random.default_rng(seed)
    count = int(rng.poisson(scenario.rate_rps * scenario.duration_s))
    arrivals = np.sort(rng.uniform(0.0, scenario.duration_s * 1000.0, count))
    sizes = query_sizes_draw(scenario.query_sizes, count, rng)
    serving = EnsembleServing(scenario, routing=routing, noise_sigma=noise_sigma, rng=np.random.default_rng(seed + 1),
                              spec=getattr(scheduler, "spec", None))
    decide = np.random.default_rng(seed + 2)
    outcomes = []
    for t, size in zip(arrivals, sizes):
        view = serving.view(float(t), int(size))
        outcomes.append(serving.serve(scheduler.choose(view, decide), int(size)))
    probabilities = {m: p for m, p in scenario.policy.probabilities.items() if m in scenario.members}
    frequencies = {m: serving.frequencies.totals[m] / max(1, sum(serving.frequencies.totals.values())) for m in scenario.members}
    return EnsembleRun(scheduler.name, routing, outcomes, frequencies, probabilities, randomness_bias(frequencies, probabilities),
                       dict(serving.busy_ms))


def ensemble_scenario_from_plan(problem: Problem, plan: Plan, application: str, *, rate_rps: float, duration_s: float,
                                history: int = 16, name: str | None = None) -> EnsembleScenario:
    """The scenario a plan serves: the application's ensemble policy, SLO and query sizes from the problem,
    one `EnsembleInstance` per plan instance of its members (its granularity L_k the slice's compute slices,
    a whole GPU its GPU's, a CPU 1; its latency per size from the problem's profile points)."""
    from engine.geometry.catalogue import mig_catalogue_load

    app = problem.application(application)
    if app.ensemble is None:
        raise ValueError(f"{application} has no ensemble policy")
    catalogue = mig_catalogue_load()
    instances = []
    for inst in plan.instances:
        if inst.variant not in app.ensemble.variants:
            continue
        device = problem.device(inst.device)
        if device.mig:
            level = float(catalogue.gpu_model_get(device.type).profile_get(inst.slice).compute_slices)
        elif device.is_cpu:
            level = 1.0
        else:
            spec = catalogue.gpu_model_find(device.type)
            level = float(spec.compute_slices) if spec is not None else 1.0
        points = problem.profiles_for(inst.variant, device.type, inst.slice)
        if not points:
            continue
        instances.append(EnsembleInstance(inst.id, inst.variant, level, tuple(p.batch for p in points), tuple(p.latency_ms for p in points)))
    return EnsembleScenario(name or application, app.ensemble, tuple(instances), slo_ms=app.slo_ms, rate_rps=rate_rps,
                            duration_s=duration_s, query_sizes=app.query_sizes or ((1, 1.0),), history=history)


def instances_from_profiles(variant: str, profiles: Mapping[float, Sequence[tuple[int, float]]], prefix: str = "") -> list[EnsembleInstance]:
    """Helper for scenarios: one instance per (level, profile points) of `variant`."""
    out = []
    for n, (level, points) in enumerate(sorted(profiles.items())):
        points = sorted(points)
        out.append(EnsembleInstance(f"{prefix}{variant}/{n}", variant, float(level), tuple(s for s, _ in points), tuple(l for _, l in points)))
    return out
