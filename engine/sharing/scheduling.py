"""Spatio-temporal scheduling of models onto MPS partitions ("gpulets"): the elastic partitioning of gpulets
(Choi et al., ATC'22, §4.3, Algorithm 1), its GPU scaling (§4.5, Algorithm 2) and the three schedulers its
evaluation compares it with (§2.2, §2.3, §5.2): squishy bin packing (SBP, Nexus), greedy best-fit on
partitions, and the exhaustive "ideal" partitioner. Pure: typed problem data in, a `SharingSchedule` out,
and `sharing_schedule_validate` checks any schedule without trusting the scheduler that made it.

Algorithm 1, transcribed (§4.3):

    ELASTICPARTITIONING(L(b,p), intf, SLO):
     1 for each period do  // if rescheduling is required
     2   sort every model by rate_m x SLO_m in ascending order
     3   for each model m do
     4     while ISREMAINRATE() and ISREMAINGPULET() do
     5       rate <- remaining rate of model m
     6       p_eff <- MAXEFFICIENTPARTITION()
     7       p_req <- MINREQUIREDPARTITION(rate)
     8       p_ideal <- MIN(p_eff, p_req)
     9       gpulet <- FINDBESTFIT(p_ideal, SLO_m, intf)
    10       apply gpulet to system
    FINDBESTFIT(p_ideal, SLO_m, intf):
    14   sort every remaining gpulet by size in ascending order
    15   for gpulet in GETREMAINGPULETS() do
    16     if gpulet.size >= p_ideal then
    17       if gpulet is unpartitioned then
    18         split and allocate gpulet to a p_ideal size partition
    20       b <- argmax_k (L(k, gpulet.size) + intf <= SLO)
    21       if b exists then
    22         TEMPORALSCHEDULING(gpulet)
    23         return gpulet

"If the partition of gpulet can be split, which means the chosen gpulet has a size of 100%, the gpulet is
split into two gpulets, each with a size of p_ideal and 100-p_ideal." TEMPORALSCHEDULING "follows the same
rules which is introduced in Section 2.2: 1) adjust the duty cycle and batch size accordingly, and 2) check
whether the SLO can be guaranteed for all models. [...] For every pair of gpulets, the aforementioned rules
are applied [...]. If a pair of gpulets has a different size, the larger size will be chosen to check if
the SLO can be successfully guaranteed or not. If successful, two gpulets are merged to a single gpulet."

Algorithm 2 (§4.5): N <- the GPUs used in the previous period; result <- ELASTICPARTITIONING with N GPUs;
while result fails and N < GPU_LIMIT: N <- N + 1 and again; if it still fails, report an unschedulable event.

The Section 2.2 rules (Nexus's squishy bin packing, as gpulets describes it): a partition runs its models in
rounds of length d, the duty cycle; each round every model runs one batch. "The SLO violation occurs when
the summation of batch building time and batch execution time exceeds the SLOs": a query waits at most one
round, then runs in the next batch, so for every model of the partition d + L_m(b_m) <= SLO_m; the round
must hold every batch, sum_m L_m(b_m) <= d; and each batch covers a round's arrivals, b_m >= rate_m x d.
A model alone picks the batch with the lowest occupancy L(b) / d (its duty cycle the longest the SLO
allows, at most b / rate); two partitions merge at the shorter of their duty cycles, batches scaled to it.

Where this departs from the paper, and why:
- Line 20 is the Nexus rule above (d + L(b) x intf <= SLO, so 2 L <= SLO for a model alone), not the
  literal L + intf <= SLO: a query that arrives just after a batch starts waits for it. The SLO is scaled
  by 2 x `latency_budget_fraction` (1 at the default 1/2), the capacity model the other planners share.
- intf is a factor on L (the fitted model of `engine/sharing/interference.py`, never below a measured co-run
  where one was measured), predicted against every model on the GPU's other partition at its batch (the
  worst of them, since they take turns). The factor is mutual, so placing a model also re-checks the models
  already next to it against it; the paper checks the newcomer only.
- Interference is charged only against what runs beside a partition (issue 39). A model is first sized with
  headroom for whatever may come beside it later (every model of the problem at its largest batch on the
  other partition), so that a later co-runner need not be refused; where that headroom refuses it, it is
  placed against what actually runs there, nothing for an empty neighbour (line 20 with intf = 1). When
  the schedule is done, every factor is re-derived against the co-runners the schedule puts beside it, at
  the same rounds and batches: a partition with nothing beside it carries 1. (Before, a split GPU was
  charged 1.2-1.5x for a co-runner that never came, and a model whose tight SLO could not absorb that was
  refused everywhere.)
- A split or placement whose check fails is undone; the paper's loop leaves the GPU split. Where the split
  to p_ideal cannot take the model, the unsplit GPU (100 %) is tried before the next gpulet: the paper's
  FINDBESTFIT always splits a whole gpulet larger than p_ideal.
- When no remaining gpulet is as large as p_ideal, the paper's loop has no way out; here the model takes
  the largest remaining gpulet that meets its SLO (serving part of its rate). When no free gpulet takes
  it at all, its rest is time-shared on a busy gpulet (TEMPORALSCHEDULING without a new gpulet; grown back
  to the whole GPU when the rest of that GPU is idle), the most of it that fits (`_share_busy`); the
  paper's ISREMAINGPULET stops there with the rest unserved.
- Not in the algorithm functions but offered to planners (`whole_gpu_fallback`, used by
  engine/solvers/gpulets.py): where a scheduler still leaves a rate unserved on its GPUs, the whole-GPU plan
  (`whole_gpu_schedule`: SBP's, or a search over every grouping of what is left once models fill whole
  GPUs) is kept if it serves more, so a planner never leaves unserved what unsplit GPUs would serve.
- A GPU holds at most two partitions, as in the paper (one split of a whole GPU) and as the interference
  data was measured (a pair); partitions that empty are joined back into the whole GPU.
- Merges repeat while the newest gpulet can merge with another, each time with the pair whose merged
  partition is busiest (best fit); a model split over two merged partitions becomes one load."""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from engine.sharing.latency import LatencyUnknown, PartitionLatencyModel
from engine.sharing.partitions import MPS_PARTITIONS_DEFAULT, mps_layout_validate

__all__ = [
    "IDEAL_SPLITS_DEFAULT",
    "SCHEDULERS",
    "InterferenceOracle",
    "ModelDemand",
    "PartitionSchedule",
    "ScheduleEntry",
    "SharingProblem",
    "SharingSchedule",
    "GpuSchedule",
    "best_fit_schedule",
    "elastic_partitioning_schedule",
    "fixed_partitioning_schedule",
    "gpu_scaling_schedule",
    "ideal_partitionings",
    "ideal_schedule",
    "sbp_schedule",
    "sharing_schedule_validate",
    "whole_gpu_fallback",
    "whole_gpu_schedule",
]

# §5.2: "4 GPUs can be partitioned into either (2:8), (4:6), (5:5), or (10:0)".
IDEAL_SPLITS_DEFAULT: tuple[tuple[int, ...], ...] = ((20, 80), (40, 60), (50, 50), (100,))
_RATE_EPS = 1e-6  # req/s: a remaining rate below this is served
_LONE_CACHE_LIMIT = 200_000  # entries of each rate-dependent memo before it is emptied (bounds memory)
_REL = 1e-9
_SHARE_STEPS = 12  # bisection steps on the share of a rate time-shared on a busy gpulet (1/4096 of it)


class InterferenceOracle(Protocol):
    """The predicted slowdown (>= 1) of `model` at `batch` on `percent` % of a GPU while `corunner` runs at
    `corunner_batch` on `corunner_percent` %."""

    def factor(self, model: str, batch: int, percent: int, corunner: str, corunner_batch: int, corunner_percent: int) -> float: ...


@dataclass(frozen=True)
class ModelDemand:
    name: str
    rate_rps: float
    slo_ms: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a model demand needs a name")
        if not (math.isfinite(self.rate_rps) and self.rate_rps >= 0):
            raise ValueError(f"{self.name}: rate must be a number >= 0 req/s, got {self.rate_rps!r}")
        if not (math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise ValueError(f"{self.name}: SLO must be a number > 0 ms, got {self.slo_ms!r}")


@dataclass(frozen=True)
class SharingProblem:
    """What to schedule: the models' rates and SLOs, their profiled L(b, p), the interference predictor
    (None: gpulets without "+int"), the partition sizes allowed and the capacity model's SLO fraction."""

    models: tuple[ModelDemand, ...]
    latency: PartitionLatencyModel
    interference: InterferenceOracle | None = None
    partitions: tuple[int, ...] = MPS_PARTITIONS_DEFAULT
    latency_budget_fraction: float = 0.5
    # MPS partitions share the GPU's memory: a model's footprint (MB, the most it takes at any batch) and
    # the GPU's; a model not listed, or no GPU figure, is not limited.
    memory_mb: dict[str, float] = field(default_factory=dict)
    gpu_memory_mb: float | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models listed twice: {sorted({n for n in names if names.count(n) > 1})}")
        known = set(self.latency.models())
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"no latency profile for {', '.join(missing)}")
        bad = [p for p in self.partitions if isinstance(p, bool) or not isinstance(p, int) or not 0 < p <= 100]
        if bad:
            raise ValueError(f"partition sizes must be whole percents in 1..100, got {bad}")
        if 100 not in self.partitions:
            raise ValueError("the partition sizes must include 100 (the whole GPU)")
        if not 0 < self.latency_budget_fraction <= 0.5:
            raise ValueError(f"latency_budget_fraction must be in (0, 0.5], got {self.latency_budget_fraction!r}")

    def model(self, name: str) -> ModelDemand:
        return self._models_by_name[name]

    @property
    def _models_by_name(self) -> dict[str, ModelDemand]:
        found = self.__dict__.get("_by_name")
        if found is None:
            found = {m.name: m for m in self.models}
            object.__setattr__(self, "_by_name", found)
        return found

    def round_budget_ms(self, model: str) -> float:
        """What d + L(b) may take: the SLO, scaled by 2 x latency_budget_fraction (1 at the default 1/2)."""
        return 2 * self.latency_budget_fraction * self.model(model).slo_ms

    def _sharing_cache(self, other: SharingProblem) -> SharingProblem:
        # Every cached figure (latency tables, capacities, p_eff, factors) is independent of the rates and
        # of whether interference is predicted, so problems derived from this one share the cache.
        object.__setattr__(other, "_cache", self._cache)
        return other

    def with_rates(self, rates: dict[str, float]) -> SharingProblem:
        """The same models, latency and interference (and the same caches) at other rates."""
        return self._sharing_cache(SharingProblem(
            tuple(ModelDemand(m.name, rates.get(m.name, m.rate_rps), m.slo_ms) for m in self.models), self.latency,
            self.interference, self.partitions, self.latency_budget_fraction, self.memory_mb, self.gpu_memory_mb))

    def without_interference(self) -> SharingProblem:
        return self._sharing_cache(SharingProblem(self.models, self.latency, None, self.partitions, self.latency_budget_fraction,
                                                  self.memory_mb, self.gpu_memory_mb))


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ScheduleEntry:
    """A model served by a partition: its share of the rate, its batch, and its batch latency including
    the interference factor."""

    model: str
    rate_rps: float
    batch: int
    latency_ms: float
    interference_factor: float = 1.0


@dataclass(frozen=True)
class PartitionSchedule:
    """One gpulet: `percent` of the GPU, running its entries in rounds of `duty_cycle_ms`."""

    percent: int
    duty_cycle_ms: float
    entries: tuple[ScheduleEntry, ...]

    @property
    def occupancy(self) -> float:
        """The fraction of each round the partition computes."""
        return sum(e.latency_ms for e in self.entries) / self.duty_cycle_ms


@dataclass(frozen=True)
class GpuSchedule:
    index: int
    partitions: tuple[PartitionSchedule, ...]  # largest first; empty: the GPU is unused

    @property
    def layout(self) -> tuple[int, ...]:
        return tuple(p.percent for p in self.partitions)


@dataclass(frozen=True)
class SharingSchedule:
    """A scheduler's answer: `schedulable` when every model's rate is served on at most `gpus_available`
    GPUs; otherwise what could be placed, with the shortfall per model."""

    scheduler: str
    status: Literal["schedulable", "unschedulable"]
    gpus: tuple[GpuSchedule, ...]
    served_rps: dict[str, float]
    shortfall_rps: dict[str, float]
    gpus_available: int
    runtime_s: float
    notes: tuple[str, ...] = ()

    @property
    def schedulable(self) -> bool:
        return self.status == "schedulable"

    @property
    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if any(p.entries for p in g.partitions))

    @property
    def partition_percent_used(self) -> int:
        return sum(p.percent for g in self.gpus for p in g.partitions if p.entries)


# --------------------------------------------------------------------------- the latency and interference tables


def _latency_table(problem: SharingProblem, model: str, percent: int) -> tuple[int, list[float | None]]:
    """L(b, percent) for every whole batch from 1 to the largest profiled (None where unknown), once."""
    key = ("L", model, percent)
    cache = problem._cache
    if key not in cache:
        try:
            first, last = problem.latency.batch_range(model, percent)
        except LatencyUnknown:
            cache[key] = (0, [])
        else:
            cache[key] = (last, [None] * first + [problem.latency.latency_ms(model, b, percent) for b in range(first, last + 1)])
    return cache[key]


def _latency(problem: SharingProblem, model: str, batch: int, percent: int) -> float | None:
    last, table = _latency_table(problem, model, percent)
    return table[batch] if 1 <= batch <= last else None


def _factor(problem: SharingProblem, model: str, batch: int, percent: int, neighbours: Sequence[tuple[str, int, int]]) -> float:
    """The worst predicted factor of `model` against the models on the GPU's other partition."""
    if problem.interference is None or not neighbours:
        return 1.0
    cache = problem._cache.setdefault("factor", {})
    worst = 1.0
    for corunner, corunner_batch, corunner_percent in neighbours:
        key = (model, batch, percent, corunner, corunner_batch, corunner_percent)
        value = cache.get(key)
        if value is None:
            value = cache[key] = max(1.0, problem.interference.factor(model, batch, percent, corunner, corunner_batch, corunner_percent))
        worst = max(worst, value)
    return worst


def _capacity(problem: SharingProblem, model: str, percent: int) -> tuple[int, float] | None:
    """The largest batch with 2 L(b) within the round budget (no interference), and its throughput (req/s)
    run back to back; None when not even the smallest batch fits."""
    key = ("cap", model, percent)
    cache = problem._cache
    if key not in cache:
        budget = problem.round_budget_ms(model) / 2
        last, table = _latency_table(problem, model, percent)
        found = None
        for batch in range(last, 0, -1):
            latency = table[batch]
            if latency is not None and latency <= budget * (1 + _REL):
                found = (batch, batch * 1000.0 / latency)
                break
        cache[key] = found
    return cache[key]


def _capacity_next_to(problem: SharingProblem, model: str, percent: int, neighbours) -> tuple[int, float] | None:
    """`_capacity` with each batch's own interference factor against `neighbours` (the factor depends on
    the batch, so the best batch alone may differ from the best batch next to them)."""
    if problem.interference is None or not neighbours:
        return _capacity(problem, model, percent)
    cache = problem._cache.setdefault("cap next to", {})
    key = (model, percent, tuple(neighbours), problem.round_budget_ms(model))
    if key not in cache:
        if len(cache) > _LONE_CACHE_LIMIT:
            cache.clear()
        cache[key] = _capacity_next_to_search(problem, model, percent, neighbours)
    return cache[key]


def _capacity_next_to_search(problem: SharingProblem, model: str, percent: int, neighbours) -> tuple[int, float] | None:
    budget = problem.round_budget_ms(model) / 2
    last, table = _latency_table(problem, model, percent)
    best = None
    for batch in range(1, last + 1):
        latency = table[batch]
        if latency is None:
            continue
        latency *= _factor(problem, model, batch, percent, neighbours)
        if latency <= budget * (1 + _REL) and (best is None or batch * 1000.0 / latency > best[1]):
            best = (batch, batch * 1000.0 / latency)
    return best


def _anticipated(problem: SharingProblem, percent: int) -> list[tuple[str, int, int]]:
    """The co-runners a partition of `percent` % may get: each model with a rate, at its largest batch there
    (utilisation, and so interference, grows with the batch)."""
    key = ("anticipated", percent, tuple(m.name for m in problem.models if m.rate_rps > 0))
    if key not in problem._cache:
        found = []
        for m in problem.models:
            capacity = _capacity(problem, m.name, percent) if m.rate_rps > 0 else None
            if capacity is not None:
                found.append((m.name, capacity[0], percent))
        problem._cache[key] = found
    return problem._cache[key]


def _partition_efficient(problem: SharingProblem, model: str) -> int:
    """p_eff (line 6), through the knee of `PartitionLatencyModel.partition_efficient`, once per model."""
    key = ("p_eff", model)
    if key not in problem._cache:
        budget = problem.round_budget_ms(model) / 2
        choice = problem.latency.partition_efficient(model, budget, partitions=problem.partitions)
        problem._cache[key] = choice.percent if choice is not None else 100
    return problem._cache[key]


def _partition_required(problem: SharingProblem, model: str, rate: float) -> int | None:
    """p_req (line 7): the smallest partition whose capacity (no interference) serves `rate`."""
    for percent in sorted(problem.partitions):
        cap = _capacity(problem, model, percent)
        if cap is not None and cap[1] >= rate * (1 - _REL):
            return percent
    return None


# --------------------------------------------------------------------------- rounds (the Section 2.2 rules)


@dataclass
class _Load:
    model: str
    rate: float


@dataclass
class _Gpulet:
    gpu: int
    size: int
    loads: list[_Load] = field(default_factory=list)
    schedule: PartitionSchedule | None = None


def _lone_duty_cycle(problem: SharingProblem, load: _Load, size: int, neighbours) -> float | None:
    """The duty cycle of a model alone on a partition: of the rounds d = min(SLO - L(b), b / rate) over every
    batch b, the feasible one (checked as `_round_at` runs it) with the lowest occupancy; ties to the longer d.
    Memoised: the schedulers ask the same question for every partitioning and merge they try."""
    cache = problem._cache.setdefault("lone", {})
    key = (load.model, load.rate, size, tuple(neighbours), problem.interference is not None, problem.round_budget_ms(load.model))
    if key not in cache:
        if len(cache) > _LONE_CACHE_LIMIT:
            cache.clear()
        cache[key] = _lone_duty_cycle_search(problem, load, size, neighbours)
    return cache[key]


def _lone_duty_cycle_search(problem: SharingProblem, load: _Load, size: int, neighbours) -> float | None:
    budget = problem.round_budget_ms(load.model)
    last, table = _latency_table(problem, load.model, size)
    # A batch beyond what a round of the whole budget collects gives the same round as that one (d is then
    # SLO - L(b), shorter as b grows): no need to try it.
    last = min(last, math.ceil(load.rate * budget / 1000.0) + 1)
    best = None
    for batch in range(1, last + 1):
        latency = table[batch]
        if latency is None:
            continue
        latency *= _factor(problem, load.model, batch, size, neighbours)
        duty = min(budget - latency, batch * 1000.0 / load.rate)
        if duty <= 0:
            continue
        # The round runs the smallest batch that covers its arrivals, which a measured (not monotone) curve
        # may make slower than `batch`: judge the round as it will run.
        schedule = _round_at(problem, [load], size, duty, neighbours)
        if schedule is None:
            continue
        occupancy = schedule.occupancy
        if best is None or occupancy < best[0] - _REL or (abs(occupancy - best[0]) <= _REL and duty > best[1]):
            best = (occupancy, duty)
    return None if best is None else best[1]


def _round_at(problem: SharingProblem, loads: Sequence[_Load], size: int, duty: float, neighbours) -> PartitionSchedule | None:
    """The loads run in rounds of `duty` ms: each at the smallest batch covering a round's arrivals; None if
    a batch is beyond the profiles, the round does not hold every batch, or a model misses its SLO."""
    entries = []
    for load in loads:
        batch = max(1, math.ceil(load.rate * duty / 1000.0 - 1e-9))
        latency = _latency(problem, load.model, batch, size)
        if latency is None:
            return None
        factor = _factor(problem, load.model, batch, size, neighbours)
        latency *= factor
        if duty + latency > problem.round_budget_ms(load.model) * (1 + _REL):
            return None
        entries.append(ScheduleEntry(load.model, load.rate, batch, latency, factor))
    if sum(e.latency_ms for e in entries) > duty * (1 + _REL):
        return None
    return PartitionSchedule(size, duty, tuple(sorted(entries, key=lambda e: e.model)))


def _round_fit(problem: SharingProblem, loads: Sequence[_Load], size: int, neighbours) -> PartitionSchedule | None:
    """Nexus's merge rule: the shortest of the loads' own duty cycles, every batch scaled to it."""
    duties = []
    for load in loads:
        duty = _lone_duty_cycle(problem, load, size, neighbours)
        if duty is None:
            return None
        duties.append(duty)
    return _round_at(problem, loads, size, min(duties), neighbours)


# --------------------------------------------------------------------------- the fleet state


class _Fleet:
    """GPUs as lists of gpulets (one whole, or two that add up to 100 %)."""

    def __init__(self, problem: SharingProblem, gpus: int, *, layouts: Sequence[Sequence[int]] | None = None) -> None:
        if gpus < 0:
            raise ValueError(f"the number of GPUs must be >= 0, got {gpus!r}")
        self.problem = problem
        shapes = layouts if layouts is not None else [(100,)] * gpus
        self.gpus: list[list[_Gpulet]] = [[_Gpulet(g, size) for size in shape] for g, shape in enumerate(shapes)]

    def gpulets(self) -> list[_Gpulet]:
        return [g for gpu in self.gpus for g in gpu]

    def free(self) -> list[_Gpulet]:
        return [g for g in self.gpulets() if not g.loads]

    def busy(self) -> list[_Gpulet]:
        return [g for g in self.gpulets() if g.loads]

    def siblings(self, gpulet: _Gpulet) -> list[_Gpulet]:
        return [g for g in self.gpus[gpulet.gpu] if g is not gpulet]

    def neighbours(self, gpulet: _Gpulet, *, leaving: _Gpulet | None = None, anticipate: bool = True) -> list[tuple[str, int, int]]:
        """(model, batch, percent) of everything running on the GPU's other partitions, and, with `anticipate`,
        for another partition that is empty (or `leaving`, whose models are moving away), every model of the
        problem at its largest batch there: headroom so that what comes later need not be refused (interference
        is mutual). Without `anticipate`, only what actually runs there."""
        return [n for sibling in self.siblings(gpulet) for n in self.neighbours_of_partition(sibling, leaving=leaving, anticipate=anticipate)]

    def siblings_recheck(self, gpulet: _Gpulet, schedule: PartitionSchedule, *, leaving: _Gpulet | None = None
                         ) -> list[tuple[_Gpulet, PartitionSchedule]] | None:
        """The GPU's other busy partitions next to `schedule` on `gpulet`: the same rounds and batches with
        their factors against it (to be applied with the change), or None if one of them would miss an SLO.
        Checked against what actually runs beside them (their own sizing allowed for more)."""
        updated = []
        for sibling in self.siblings(gpulet):
            if sibling.schedule is None or sibling is leaving:
                continue
            others = [(e.model, e.batch, gpulet.size) for e in schedule.entries] + [
                n for s in self.siblings(sibling) if s is not gpulet
                for n in self.neighbours_of_partition(s, leaving=leaving, anticipate=False)
            ]
            loads = [_Load(e.model, e.rate_rps) for e in sibling.schedule.entries]
            again = _round_at(self.problem, loads, sibling.size, sibling.schedule.duty_cycle_ms, others)
            if again is None:
                return None
            updated.append((sibling, again))
        return updated

    def neighbours_of_partition(self, partition: _Gpulet, *, leaving: _Gpulet | None = None, anticipate: bool = True
                                ) -> list[tuple[str, int, int]]:
        """What `partition` puts next to the others: its models, or, empty or leaving, anything that may come
        (with `anticipate`) or nothing."""
        if partition.schedule is not None and partition is not leaving:
            return [(e.model, e.batch, partition.size) for e in partition.schedule.entries]
        return _anticipated(self.problem, partition.size) if anticipate and self.problem.interference is not None else []

    def commit(self, gpulet: _Gpulet, loads: list[_Load], schedule: PartitionSchedule,
               siblings: list[tuple[_Gpulet, PartitionSchedule]]) -> None:
        self.assign(gpulet, loads, schedule)
        for sibling, again in siblings:
            sibling.schedule = again

    def memory_fits(self, gpu: int, models: Iterable[str], *, leaving: _Gpulet | None = None) -> bool:
        """The GPU's memory holds its models (one copy per partition a model runs in) plus `models`, less
        those of `leaving` if it is on this GPU."""
        limit = self.problem.gpu_memory_mb
        if limit is None:
            return True
        need = self.problem.memory_mb
        total = sum(need.get(load.model, 0.0) for g in self.gpus[gpu] if g is not leaving for load in g.loads)
        return total + sum(need.get(m, 0.0) for m in models) <= limit * (1 + _REL)

    def split(self, gpulet: _Gpulet, percent: int) -> _Gpulet:
        """Line 18: a whole, free GPU becomes `percent` and 100 - `percent` (the largest allowed size within
        it, where 100 - `percent` is not allowed; none if no size fits); returns the `percent` part."""
        assert gpulet.size == 100 and not gpulet.loads and len(self.gpus[gpulet.gpu]) == 1
        part = _Gpulet(gpulet.gpu, percent)
        rest = max((p for p in self.problem.partitions if p <= 100 - percent), default=None)
        self.gpus[gpulet.gpu] = [part] + ([_Gpulet(gpulet.gpu, rest)] if rest is not None else [])
        return part

    def join_if_free(self, gpu: int) -> None:
        """A split GPU whose partitions are all free is whole again (only while it was split by the
        scheduler; fixed layouts, as the ideal scheduler's, are kept)."""
        if self.splittable and len(self.gpus[gpu]) > 1 and all(not g.loads for g in self.gpus[gpu]):
            self.gpus[gpu] = [_Gpulet(gpu, 100)]

    splittable = True

    def assign(self, gpulet: _Gpulet, loads: list[_Load], schedule: PartitionSchedule) -> None:
        gpulet.loads, gpulet.schedule = loads, schedule

    def release(self, gpulet: _Gpulet) -> None:
        gpulet.loads, gpulet.schedule = [], None
        self.join_if_free(gpulet.gpu)

    def retime(self) -> None:
        """Every busy partition's entries re-timed against what actually runs beside it now, at the same
        rounds and batches: a partition with nothing beside it carries no interference factor, and one whose
        neighbour left (merged away) drops that neighbour's. The factors are those the validator re-derives."""
        if self.problem.interference is None:
            return
        for gpulet in self.busy():
            if gpulet.schedule is None:
                continue
            neighbours = self.neighbours(gpulet, anticipate=False)
            entries = []
            for e in gpulet.schedule.entries:
                solo = _latency(self.problem, e.model, e.batch, gpulet.size)
                factor = _factor(self.problem, e.model, e.batch, gpulet.size, neighbours)
                entries.append(replace(e, latency_ms=solo * factor, interference_factor=factor) if solo is not None else e)
            again = replace(gpulet.schedule, entries=tuple(entries))
            duty = again.duty_cycle_ms
            if sum(e.latency_ms for e in entries) <= duty * (1 + _REL) and \
                    all(duty + e.latency_ms <= self.problem.round_budget_ms(e.model) * (1 + _REL) for e in entries):
                gpulet.schedule = again

    def result(self, scheduler: str, started: float, *, notes: Iterable[str] = ()) -> SharingSchedule:
        self.retime()
        served: dict[str, float] = {m.name: 0.0 for m in self.problem.models}
        gpus = []
        for index, gpu in enumerate(self.gpus):
            parts = tuple(sorted((g.schedule for g in gpu if g.schedule is not None), key=lambda p: -p.percent))
            for part in parts:
                for entry in part.entries:
                    served[entry.model] += entry.rate_rps
            gpus.append(GpuSchedule(index, parts))
        shortfall = {m.name: max(0.0, m.rate_rps - served[m.name]) for m in self.problem.models}
        ok = all(v <= max(_RATE_EPS, 1e-9 * m.rate_rps) for v, m in zip(shortfall.values(), self.problem.models))
        return SharingSchedule(scheduler, "schedulable" if ok else "unschedulable", tuple(gpus), served,
                               {k: (v if v > _RATE_EPS else 0.0) for k, v in shortfall.items()}, len(self.gpus),
                               time.perf_counter() - started, tuple(notes))


def _place(fleet: _Fleet, gpulet: _Gpulet, model: str, rate: float) -> tuple[_Load, PartitionSchedule, list] | None:
    """Line 20: the model alone on `gpulet`, at its capacity there with interference (or at `rate` if that is
    less), checked against its neighbours and they against it; None if no batch meets the SLO."""
    problem = fleet.problem
    if not fleet.memory_fits(gpulet.gpu, [model]):
        return None
    anticipated = fleet.neighbours(gpulet)
    actual = fleet.neighbours(gpulet, anticipate=False)
    # Sized for what may come beside it first (headroom); if that refuses the model, for what is there.
    for neighbours in ([anticipated, actual] if anticipated != actual else [actual]):
        capacity = _capacity_next_to(problem, model, gpulet.size, neighbours)
        if capacity is None:
            continue
        load = _Load(model, min(rate, capacity[1]))
        schedule = _round_fit(problem, [load], gpulet.size, neighbours)
        if schedule is None:
            continue
        siblings = fleet.siblings_recheck(gpulet, schedule)
        if siblings is None:
            continue
        return load, schedule, siblings
    return None


def _merge_loads(a: Sequence[_Load], b: Sequence[_Load]) -> list[_Load]:
    rates: dict[str, float] = {}
    for load in itertools.chain(a, b):
        rates[load.model] = rates.get(load.model, 0.0) + load.rate
    return [_Load(m, r) for m, r in sorted(rates.items())]


def _temporal_schedule(fleet: _Fleet, gpulet: _Gpulet) -> _Gpulet:
    """TEMPORALSCHEDULING (line 22): merge `gpulet` with another busy gpulet whenever the models of both
    meet their SLOs on the larger of the two (the busiest such merge first); returns where the models went."""
    problem = fleet.problem
    while True:
        best = None
        for other in fleet.busy():
            if other is gpulet:
                continue
            target, source = (other, gpulet) if other.size >= gpulet.size else (gpulet, other)
            loads = _merge_loads(target.loads, source.loads)
            new_models = [load.model for load in source.loads if all(t.model != load.model for t in target.loads)]
            if not fleet.memory_fits(target.gpu, new_models, leaving=source if source.gpu == target.gpu else None):
                continue
            # The source's models leave: on the target's GPU, its partition is empty from now on.
            leaving = source if source.gpu == target.gpu else None
            schedule = _round_fit(problem, loads, target.size, fleet.neighbours(target, leaving=leaving))
            if schedule is None:
                continue
            siblings = fleet.siblings_recheck(target, schedule, leaving=leaving)
            if siblings is not None and (best is None or schedule.occupancy > best[0].occupancy + _REL):
                best = (schedule, target, source, loads, siblings)
        if best is None:
            return gpulet
        schedule, target, source, loads, siblings = best
        fleet.release(source)
        fleet.commit(target, loads, schedule, siblings)
        gpulet = target


def _find_best_fit(fleet: _Fleet, model: str, rate: float, p_ideal: int, *, split: bool, merge: bool) -> _Gpulet | None:
    """FINDBESTFIT (lines 14-26), and the fallback to a smaller gpulet (module docstring)."""
    free = sorted(fleet.free(), key=lambda g: (g.size, g.gpu))
    for gpulet in free:
        if gpulet.size < p_ideal:
            continue
        whole = split and gpulet.size == 100 and p_ideal < 100 and len(fleet.gpus[gpulet.gpu]) == 1
        target = fleet.split(gpulet, p_ideal) if whole else gpulet
        placed = _place(fleet, target, model, rate)
        if placed is None and whole:
            # The split does not serve the model: the unsplit GPU (100 %, nothing beside it) is a candidate too.
            fleet.gpus[gpulet.gpu] = [gpulet]
            target = gpulet
            placed = _place(fleet, target, model, rate)
        if placed is None:
            continue
        fleet.commit(target, [placed[0]], placed[1], placed[2])
        return _temporal_schedule(fleet, target) if merge else target
    for gpulet in sorted((g for g in free if g.size < p_ideal), key=lambda g: (-g.size, g.gpu)):
        placed = _place(fleet, gpulet, model, rate)
        if placed is not None:
            fleet.commit(gpulet, [placed[0]], placed[1], placed[2])
            return _temporal_schedule(fleet, gpulet) if merge else gpulet
    return None


def _share_busy(fleet: _Fleet, model: str, rate: float) -> _Gpulet | None:
    """The last resort when no free gpulet takes the model (module docstring): time-share its remaining rate
    on a busy gpulet (TEMPORALSCHEDULING without a new gpulet), first at the gpulet's own size; failing that,
    on a gpulet whose GPU is otherwise idle, grown back to the whole GPU (its models then run at 100 %, with
    nothing beside them). The most of the rate that fits (bisection), the busiest round on a tie."""
    problem = fleet.problem
    can_grow = fleet.splittable
    for grow in (False, True):
        best = None
        for gpulet in fleet.busy():
            siblings = fleet.siblings(gpulet)
            if grow and not (can_grow and siblings and all(not s.loads for s in siblings)):
                continue
            size = 100 if grow else gpulet.size
            if not fleet.memory_fits(gpulet.gpu, [] if any(l.model == model for l in gpulet.loads) else [model]):
                continue

            def attempt(share: float, gpulet=gpulet, size=size):
                loads = _merge_loads(gpulet.loads, [_Load(model, share)])
                if grow:
                    schedule = _round_fit(problem, loads, size, [])
                    return None if schedule is None else (loads, schedule, [])
                schedule = _round_fit(problem, loads, size, fleet.neighbours(gpulet))
                if schedule is None:
                    return None
                again = fleet.siblings_recheck(gpulet, schedule)
                return None if again is None else (loads, schedule, again)

            share, found = rate, attempt(rate)
            if found is None:
                # Full already (the usual case): not even the smallest share fits, so no bisection.
                low, high = rate / 2 ** _SHARE_STEPS, rate
                found = attempt(low)
                if found is None:
                    continue
                for _ in range(_SHARE_STEPS):
                    mid = (low + high) / 2
                    trial = attempt(mid)
                    if trial is None:
                        high = mid
                    else:
                        low, found = mid, trial
                share = low
            if found is None or share <= _RATE_EPS:
                continue
            key = (share, found[1].occupancy)
            if best is None or key[0] > best[0][0] * (1 + _REL) or (key[0] >= best[0][0] * (1 - _REL) and key[1] > best[0][1] + _REL):
                best = (key, gpulet, found)
        if best is not None:
            _, gpulet, (loads, schedule, again) = best
            if grow:
                whole = _Gpulet(gpulet.gpu, 100)
                fleet.gpus[gpulet.gpu] = [whole]
                fleet.assign(whole, loads, schedule)
                return whole
            fleet.commit(gpulet, loads, schedule, again)
            return gpulet
    return None


def _served_on(fleet: _Fleet, model: str) -> float:
    return sum(load.rate for g in fleet.busy() for load in g.loads if load.model == model)


def _allocate(fleet: _Fleet, *, split: bool, merge: bool, partition_choice: Callable[[str, float], int]) -> None:
    """Lines 2-12: models by rate x SLO ascending, each given gpulets until its rate is served or no
    gpulet is left; with `merge` (temporal sharing) on GPUs the scheduler partitions itself, the rest a free
    gpulet cannot take is time-shared on a busy one (`_share_busy`). The ideal's fixed partitionings keep the
    paper's loop: it tries every partitioning anyway, and the search would multiply its cost."""
    problem = fleet.problem
    for demand in sorted(problem.models, key=lambda m: (m.rate_rps * m.slo_ms, m.name)):
        for _ in range(4 * len(fleet.gpus) + 4):  # each pass takes a gpulet or serves the rest; a guard
            remaining = demand.rate_rps - _served_on(fleet, demand.name)
            if remaining <= _RATE_EPS:
                break
            placed = None
            if fleet.free():
                placed = _find_best_fit(fleet, demand.name, remaining, partition_choice(demand.name, remaining), split=split, merge=merge)
            if placed is None and merge and fleet.splittable:  # elastic partitioning; not the ideal's fixed partitionings
                placed = _share_busy(fleet, demand.name, remaining)
            if placed is None:
                break


def _p_ideal(problem: SharingProblem) -> Callable[[str, float], int]:
    def choose(model: str, rate: float) -> int:
        efficient = _partition_efficient(problem, model)
        required = _partition_required(problem, model, rate)
        return efficient if required is None else min(efficient, required)  # line 8

    return choose


# --------------------------------------------------------------------------- the schedulers


def elastic_partitioning_schedule(problem: SharingProblem, gpus: int) -> SharingSchedule:
    """Algorithm 1 on `gpus` whole GPUs (module docstring)."""
    started = time.perf_counter()
    fleet = _Fleet(problem, gpus)
    _allocate(fleet, split=True, merge=True, partition_choice=_p_ideal(problem))
    return fleet.result("gpulets" if problem.interference is not None else "gpulets (no interference)", started)


def gpu_scaling_schedule(problem: SharingProblem, *, gpu_limit: int, gpus_before: int = 1,
                         scheduler: Callable[[SharingProblem, int], SharingSchedule] = elastic_partitioning_schedule) -> SharingSchedule:
    """Algorithm 2: from the GPUs used in the previous period, one more at a time up to `gpu_limit`, until
    `scheduler` serves every rate. Past the limit, the last (unschedulable) attempt, with a note."""
    if gpu_limit < 1:
        raise ValueError(f"gpu_limit must be at least 1, got {gpu_limit!r}")
    n = min(max(1, gpus_before), gpu_limit)
    result = scheduler(problem, n)
    while not result.schedulable and n < gpu_limit:
        n += 1
        result = scheduler(problem, n)
    if not result.schedulable:
        short = ", ".join(f"{k} {v:.6g} req/s" for k, v in result.shortfall_rps.items() if v > 0)
        result = _with_note(result, f"unschedulable on the {gpu_limit} GPU(s) allowed: short of {short}")
    return result


def _with_note(result: SharingSchedule, note: str) -> SharingSchedule:
    return replace(result, notes=result.notes + (note,))


def whole_gpu_fallback(scheduler: Callable[[SharingProblem, int], SharingSchedule]) -> Callable[[SharingProblem, int], SharingSchedule]:
    """`scheduler`, with the planner's safety net: where it leaves a rate unserved on `gpus` GPUs, the
    whole-GPU plan on the same GPUs (`whole_gpu_schedule`: every GPU unsplit, nothing beside any partition,
    its models time-shared by the Section 2.2 rules) is kept instead if it serves more, under the scheduler's
    name and with a note saying so. So a planner wrapped in it never leaves demand unserved that whole GPUs
    would serve. Not in the paper: neither Algorithm 1 nor greedy best-fit falls back to whole GPUs."""

    def schedule(problem: SharingProblem, gpus: int) -> SharingSchedule:
        result = scheduler(problem, gpus)
        if result.schedulable:
            return result
        whole = whole_gpu_schedule(problem, gpus)
        served, whole_served = sum(result.served_rps.values()), sum(whole.served_rps.values())
        if not (whole.schedulable or whole_served > served * (1 + 1e-6) + _RATE_EPS):
            return result
        note = (f"{result.scheduler} left {sum(result.shortfall_rps.values()):.6g} req/s unserved on {gpus} GPU(s); the whole-GPU "
                f"plan (unsplit GPUs, time-shared) serves {'every rate' if whole.schedulable else f'{whole_served:.6g} req/s'} and is kept")
        return replace(whole, scheduler=result.scheduler, runtime_s=result.runtime_s + whole.runtime_s,
                       notes=result.notes + tuple(n for n in whole.notes if n not in result.notes) + (note,))

    schedule.__name__ = f"{getattr(scheduler, '__name__', 'scheduler')}_with_whole_gpu_fallback"
    schedule.__doc__ = scheduler.__doc__
    return schedule


def sbp_schedule(problem: SharingProblem, gpus: int) -> SharingSchedule:
    """Squishy bin packing (Nexus, as gpulets §2.2 ports it): whole GPUs only. Each model takes whole GPUs
    at its saturating batch for as much of its rate as fills them, and a residual one for the rest; then
    "it compares all eligible pairwise combinations. If a pair is eligible for temporal sharing, the pair
    will share one GPU and the batch size is further adjusted [...]. The process continues until no more
    pairs can be temporally shared" (the busiest merged pair first). The first `gpus` GPUs are kept, the
    busiest first; what does not fit is shortfall. Interference does not arise: one partition per GPU."""
    started = time.perf_counter()
    bins: list[tuple[list[_Load], PartitionSchedule]] = []
    unplaceable = []
    for demand in problem.models:
        capacity = _capacity(problem, demand.name, 100)
        if demand.rate_rps <= _RATE_EPS:
            continue
        if capacity is None:
            unplaceable.append(demand.name)
            continue
        remaining = demand.rate_rps
        while remaining > _RATE_EPS:
            load = _Load(demand.name, min(remaining, capacity[1]))
            schedule = _round_fit(problem, [load], 100, [])
            if schedule is None:  # cannot happen at or below capacity; kept as a guard
                break
            bins.append(([load], schedule))
            remaining -= load.rate
    while True:
        best = None
        for i, j in itertools.combinations(range(len(bins)), 2):
            loads = _merge_loads(bins[i][0], bins[j][0])
            if problem.gpu_memory_mb is not None and \
                    sum(problem.memory_mb.get(load.model, 0.0) for load in loads) > problem.gpu_memory_mb * (1 + _REL):
                continue
            schedule = _round_fit(problem, loads, 100, [])
            if schedule is not None and (best is None or schedule.occupancy > best[0].occupancy + _REL):
                best = (schedule, i, j, loads)
        if best is None:
            break
        schedule, i, j, loads = best
        bins = [b for k, b in enumerate(bins) if k not in (i, j)] + [(loads, schedule)]
    bins.sort(key=lambda b: (-sum(load.rate for load in b[0]), b[1].entries[0].model))
    fleet = _Fleet(problem, gpus)
    for index, (loads, schedule) in enumerate(bins[:gpus]):
        fleet.assign(fleet.gpus[index][0], loads, schedule)
    notes = [f"no batch of {', '.join(unplaceable)} meets its SLO on a whole GPU"] if unplaceable else []
    if len(bins) > gpus:
        notes.append(f"needs {len(bins)} GPUs, {gpus} available")
    return fleet.result("sbp", started, notes=notes)


def _round_search(problem: SharingProblem, loads: Sequence[_Load], size: int) -> PartitionSchedule | None:
    """The loads time-share a partition with nothing beside it, by the Section 2.2 rules, with every round
    tried rather than Nexus's merge rule's one: between two round lengths at which some load needs a larger
    batch (d = b / rate) the batches are fixed (each model its fastest batch covering a round's arrivals:
    measured curves are not monotone), and the longest round that keeps every SLO, if it holds the batches,
    is that interval's; the one with the lowest occupancy. None: no round serves them."""
    fastest = {}
    for load in loads:
        key = ("fastest", load.model, size)
        if key not in problem._cache:
            last, table = _latency_table(problem, load.model, size)
            suffix: list[tuple[float, int] | None] = [None] * (last + 2)
            for batch in range(last, 0, -1):
                here = (table[batch], batch) if table[batch] is not None else None
                after = suffix[batch + 1]
                suffix[batch] = here if after is None or (here is not None and here[0] <= after[0]) else after
            problem._cache[key] = (last, suffix)
        fastest[load.model] = problem._cache[key]
    active = [load for load in loads if load.rate > _RATE_EPS]
    if not active:
        return None
    steps = sorted({b * 1000.0 / load.rate for load in active for b in range(1, fastest[load.model][0] + 1)})
    best = None
    low = 0.0
    for high in steps:
        chosen = []
        for load in active:
            last, suffix = fastest[load.model]
            need = max(1, math.ceil(load.rate * high / 1000.0 - 1e-9))
            if need > last or suffix[need] is None:
                return best  # a longer round needs a batch beyond the profiles
            chosen.append((load, suffix[need][1], suffix[need][0]))
        shortest = max(low, sum(ms for _, _, ms in chosen))
        longest = min([high] + [problem.round_budget_ms(load.model) - ms for load, _, ms in chosen])
        if 0 < shortest <= longest * (1 + _REL):
            duty = max(shortest, min(high, longest))
            entries = tuple(sorted((ScheduleEntry(load.model, load.rate, batch, ms, 1.0) for load, batch, ms in chosen), key=lambda e: e.model))
            candidate = PartitionSchedule(size, duty, entries)
            if best is None or candidate.occupancy < best.occupancy - _REL:
                best = candidate
        low = high
    return best


_WHOLE_GPU_SEARCH_LIMIT = 200_000  # groupings tried before the search gives up (it has not on any bench scenario)


def _best_throughput(problem: SharingProblem, model: str, percent: int) -> float | None:
    """The most req/s one model alone serves on `percent` %: b / L(b) over the batches with 2 L(b) within
    the round budget (the best batch, which a measured curve need not make the largest)."""
    budget = problem.round_budget_ms(model) / 2
    last, table = _latency_table(problem, model, percent)
    found = [b * 1000.0 / table[b] for b in range(1, last + 1) if table[b] is not None and table[b] <= budget * (1 + _REL)]
    return max(found) if found else None


def _whole_gpu_search(problem: SharingProblem, gpus: int) -> SharingSchedule | None:
    """A whole-GPU plan that serves every rate on `gpus` GPUs, if one of this form exists: each model fills
    whole GPUs at its best throughput, and the rests are grouped onto the other GPUs, every grouping tried
    (depth first, largest rest first, a group kept only if `_round_search` and the GPU's memory hold it)."""
    started = time.perf_counter()
    full: list[_Load] = []
    rests: list[tuple[_Load, float]] = []
    for demand in problem.models:
        if demand.rate_rps <= _RATE_EPS:
            continue
        throughput = _best_throughput(problem, demand.name, 100)
        if throughput is None:
            return None
        count = math.floor(demand.rate_rps / throughput * (1 + 1e-12))
        full += [_Load(demand.name, throughput)] * count
        rest = demand.rate_rps - count * throughput
        if rest > _RATE_EPS:
            rests.append((_Load(demand.name, rest), rest / throughput))
    if len(full) > gpus:
        return None
    rests.sort(key=lambda r: (-r[1], r[0].model))
    loads = [r[0] for r in rests]
    memory = problem.memory_mb
    limit = problem.gpu_memory_mb
    fits: dict[frozenset[int], PartitionSchedule | None] = {}

    def group_schedule(members: frozenset[int]) -> PartitionSchedule | None:
        if members not in fits:
            group = [loads[i] for i in sorted(members)]
            if limit is not None and sum(memory.get(load.model, 0.0) for load in group) > limit * (1 + _REL):
                fits[members] = None
            else:
                fits[members] = _round_search(problem, group, 100)
        return fits[members]

    tried = 0
    groups: list[frozenset[int]] = []

    def place(i: int) -> bool:
        nonlocal tried
        if i == len(loads):
            return True
        tried += 1
        if tried > _WHOLE_GPU_SEARCH_LIMIT:
            return False
        for k in range(len(groups)):
            grown = groups[k] | {i}
            if group_schedule(grown) is not None:
                previous, groups[k] = groups[k], grown
                if place(i + 1):
                    return True
                groups[k] = previous
        if len(full) + len(groups) < gpus and group_schedule(frozenset({i})) is not None:
            groups.append(frozenset({i}))
            if place(i + 1):
                return True
            groups.pop()
        return False

    if not place(0):
        return None
    fleet = _Fleet(problem, gpus)
    bins = [([load], _round_search(problem, [load], 100)) for load in full] + \
        [([loads[i] for i in sorted(g)], group_schedule(g)) for g in groups]
    for index, (members, schedule) in enumerate(bins):
        if schedule is None:  # a whole GPU at a model's best throughput: cannot happen; kept as a guard
            return None
        fleet.assign(fleet.gpus[index][0], _merge_loads(members, []), schedule)
    return fleet.result("whole-GPU", started, notes=[f"whole-GPU search: {len(bins)} GPU(s), {tried} grouping step(s)"])


def whole_gpu_schedule(problem: SharingProblem, gpus: int) -> SharingSchedule:
    """The whole-GPU plan: every GPU unsplit (100 %, nothing beside it, so no interference), its models
    time-shared by the Section 2.2 rules. SBP's (`sbp_schedule`) where it serves every rate; else the search
    of `_whole_gpu_search`, every grouping of what is left of the rates once models fill whole GPUs, where it
    finds one; else SBP's, short."""
    sbp = sbp_schedule(problem, gpus)
    if sbp.schedulable:
        return sbp
    searched = _whole_gpu_search(problem, gpus)
    return searched if searched is not None and searched.schedulable else sbp


def best_fit_schedule(problem: SharingProblem, gpus: int) -> SharingSchedule:
    """Greedy best-fit (gpulets §2.3): "chooses the minimum required partition size for each model to handle
    a given request rate with SLO constraint. It allocates the partitions of multiple ML models to GPUs
    through best-fit searching." One model per partition (no temporal sharing): p_req, or the whole GPU
    when no partition serves the rate; best fit: the smallest free partition at least that large (a whole
    GPU is split to the size first), the same sweep as Algorithm 1's FINDBESTFIT. Departure: the same interference check as the
    others (placing a model re-checks its neighbour; a partition with nothing beside it carries no factor;
    the unsplit GPU is a candidate when the split does not take the model), so the comparison is of the
    algorithms, not of the safety margin. No temporal sharing, so no `_share_busy`."""
    started = time.perf_counter()
    fleet = _Fleet(problem, gpus)

    def required(model: str, rate: float) -> int:
        p = _partition_required(problem, model, rate)
        return 100 if p is None else p

    for demand in sorted(problem.models, key=lambda m: (m.rate_rps * m.slo_ms, m.name)):
        for _ in range(4 * gpus + 4):
            remaining = demand.rate_rps - _served_on(fleet, demand.name)
            if remaining <= _RATE_EPS or not fleet.free():
                break
            if _find_best_fit(fleet, demand.name, remaining, required(demand.name, remaining), split=True, merge=False) is None:
                break
    return fleet.result("best-fit", started)


def ideal_partitionings(gpus: int, splits: Sequence[Sequence[int]] = IDEAL_SPLITS_DEFAULT) -> list[tuple[tuple[int, ...], ...]]:
    """Every way to split `gpus` interchangeable GPUs by `splits`, as multisets (35 for 4 GPUs and 4 splits;
    the paper counts 4^4 = 256 ordered ones)."""
    return list(itertools.combinations_with_replacement([tuple(s) for s in splits], gpus))


def fixed_partitioning_schedule(problem: SharingProblem, layouts: Sequence[Sequence[int]], *, scheduler: str = "fixed") -> SharingSchedule:
    """Algorithm 1's placement and temporal scheduling on partitions that are given, not split (one layout
    per GPU, e.g. ((40, 60), (100,)))."""
    started = time.perf_counter()
    for layout in layouts:
        problems = mps_layout_validate(list(layout), allowed=problem.partitions)
        if problems:
            raise ValueError(f"layout {layout}: {'; '.join(problems)}")
    fleet = _Fleet(problem, len(layouts), layouts=layouts)
    fleet.splittable = False
    _allocate(fleet, split=False, merge=True, partition_choice=_p_ideal(problem))
    return fleet.result(scheduler, started)


def ideal_schedule(problem: SharingProblem, gpus: int, *, splits: Sequence[Sequence[int]] = IDEAL_SPLITS_DEFAULT) -> SharingSchedule:
    """The ideal scheduler of gpulets §5.2: "exhaustively trying all 4^4 partition combinations, where 4 GPUs
    can be partitioned into either (2:8), (4:6), (5:5), or (10:0). The search continues until all cases are
    searched or a case produces a viable scheduling result"; it "uses the same set of partitions as
    gpulet+int". Each combination is filled by `fixed_partitioning_schedule`. No combination viable: the
    one serving the most. Departure: GPUs are interchangeable, so combinations are multisets."""
    started = time.perf_counter()
    best: SharingSchedule | None = None
    combinations = ideal_partitionings(gpus, splits)
    for tried, combination in enumerate(combinations, start=1):
        result = fixed_partitioning_schedule(problem, combination, scheduler="ideal")
        if result.schedulable:
            return _with_note(replace(result, runtime_s=time.perf_counter() - started), f"partitioning {tried} of {len(combinations)} is viable")
        if best is None or sum(result.served_rps.values()) > sum(best.served_rps.values()) + _RATE_EPS:
            best = result
    assert best is not None
    return _with_note(replace(best, runtime_s=time.perf_counter() - started), f"none of the {len(combinations)} partitionings serves every rate")


SCHEDULERS: dict[str, Callable[[SharingProblem, int], SharingSchedule]] = {
    "gpulets": elastic_partitioning_schedule,
    "sbp": sbp_schedule,
    "best-fit": best_fit_schedule,
    "ideal": ideal_schedule,
}


# --------------------------------------------------------------------------- the validator


def sharing_schedule_validate(problem: SharingProblem, schedule: SharingSchedule) -> list[str]:
    """Every problem with a schedule, in words (empty: valid), re-derived from the profiles and the
    interference predictor rather than read from the schedule: each GPU's layout is legal; each entry's
    latency is L(b, p) times the factor predicted against the other partition's models at their batches;
    each round holds its batches, each batch covers a round's arrivals, every model meets d + L <= SLO;
    served plus shortfall is each model's rate, and `schedulable` means no shortfall."""
    problems: list[str] = []
    served: dict[str, float] = {}
    if len(schedule.gpus) > schedule.gpus_available:
        problems.append(f"{len(schedule.gpus)} GPUs scheduled, {schedule.gpus_available} available")
    known = {m.name for m in problem.models}
    for gpu in schedule.gpus:
        for issue in mps_layout_validate(list(gpu.layout), allowed=problem.partitions):
            problems.append(f"GPU {gpu.index}: {issue}")
        strangers = sorted({e.model for p in gpu.partitions for e in p.entries} - known)
        if strangers:
            problems.append(f"GPU {gpu.index}: models not in the problem: {', '.join(strangers)}")
            continue
        if problem.gpu_memory_mb is not None:
            footprint = sum(problem.memory_mb.get(e.model, 0.0) for p in gpu.partitions for e in p.entries)
            if footprint > problem.gpu_memory_mb * (1 + 1e-9):
                problems.append(f"GPU {gpu.index}: its models need {footprint:.0f} MB, more than the GPU's {problem.gpu_memory_mb:.0f} MB")
        for index, part in enumerate(gpu.partitions):
            where = f"GPU {gpu.index} partition {part.percent} %"
            if not part.entries:
                problems.append(f"{where}: listed but runs nothing")
                continue
            if not (math.isfinite(part.duty_cycle_ms) and part.duty_cycle_ms > 0):
                problems.append(f"{where}: duty cycle must be > 0 ms, got {part.duty_cycle_ms!r}")
                continue
            neighbours = [(e.model, e.batch, other.percent) for j, other in enumerate(gpu.partitions) if j != index for e in other.entries]
            models = [e.model for e in part.entries]
            if len(set(models)) != len(models):
                problems.append(f"{where}: a model listed twice ({', '.join(models)})")
            total = 0.0
            for e in part.entries:
                try:
                    solo = problem.latency.latency_ms(e.model, e.batch, part.percent)
                    budget = problem.round_budget_ms(e.model)
                except (LatencyUnknown, KeyError) as exc:
                    problems.append(f"{where}: {e.model} at batch {e.batch}: {exc}")
                    continue
                factor = 1.0
                if problem.interference is not None:
                    for corunner, batch, percent in neighbours:
                        factor = max(factor, problem.interference.factor(e.model, e.batch, part.percent, corunner, batch, percent))
                # A scheduler may allow for more interference than the neighbours cause (a co-runner yet to
                # come); less is an error.
                latency = max(solo * factor, e.latency_ms)
                if e.latency_ms < solo * factor * (1 - 1e-9) or abs(e.latency_ms - solo * e.interference_factor) > 1e-6 * max(1.0, latency):
                    problems.append(f"{where}: {e.model} at batch {e.batch} takes {solo * factor:.6g} ms (x{factor:.4g} interference), "
                                    f"the schedule says {e.latency_ms:.6g} ms (x{e.interference_factor:.4g})")
                total += latency
                if part.duty_cycle_ms + latency > budget * (1 + 1e-9):
                    problems.append(f"{where}: {e.model} misses its SLO: duty cycle {part.duty_cycle_ms:.4g} + batch "
                                    f"{latency:.4g} ms > {budget:.4g} ms")
                if e.batch * 1000.0 / part.duty_cycle_ms < e.rate_rps * (1 - 1e-9):
                    problems.append(f"{where}: {e.model}'s batch {e.batch} per {part.duty_cycle_ms:.4g} ms round serves "
                                    f"{e.batch * 1000.0 / part.duty_cycle_ms:.6g} req/s, less than its {e.rate_rps:.6g}")
                served[e.model] = served.get(e.model, 0.0) + e.rate_rps
            if total > part.duty_cycle_ms * (1 + 1e-9):
                problems.append(f"{where}: the batches take {total:.4g} ms, longer than the {part.duty_cycle_ms:.4g} ms round")
    for m in problem.models:
        got = served.get(m.name, 0.0)
        if got > m.rate_rps * (1 + 1e-9) + _RATE_EPS:
            problems.append(f"{m.name}: {got:.6g} req/s served, more than its rate {m.rate_rps:.6g}")
        short = schedule.shortfall_rps.get(m.name, 0.0)
        if abs(got + short - m.rate_rps) > max(_RATE_EPS, 1e-6 * m.rate_rps) and got <= m.rate_rps:
            problems.append(f"{m.name}: served {got:.6g} + shortfall {short:.6g} != rate {m.rate_rps:.6g}")
    if schedule.schedulable and any(v > _RATE_EPS for v in schedule.shortfall_rps.values()):
        problems.append("schedulable, but with a shortfall")
    return problems
