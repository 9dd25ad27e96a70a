"""Garrison's multi-granularity MIG allocation (Wang et al., "Garrison: A High-Performance GPU-Accelerated
Inference System for Adversarial Ensemble Defense", DAC'24, §4 "Multi-Granularity GI Allocation"), mapped
onto Tessera's planning problem, plus the packing step the paper leaves out.

What the paper does (text in shared/papers/garrison-dac24.txt):

- §4.1 "Profiling the Sweet Intervals": for each model, offline profiling finds, per query-size (batch
  size) range b, the GPU-instance size GS[m, b] at which the instance is well used: past a "sweet
  interval" of batch sizes a bigger batch adds hardly any throughput while latency grows about linearly
  (Figure 5: batches 16-32 of VGG11 belong on a GI(4)). L[m, b] is the latency there.
- §4.2 "Allocating GPU Instances", Algorithm 1: with sampling probabilities SP[m], the probability D[b]
  that a query falls in size range b and M GPU slices in all,
      IR[m, b] = GS[m, b] * L[m, b] * SP[m]            intermediate ratio
      RR[m, b] = IR[m, b] / sum_m' IR[m', b]            relative ratio, normalised per size range
      AR[m, b] = RR[m, b] * D[b]                        absolute ratio
      P[m, b]  = AR[m, b] * M                           slices for (m, b)
      N[m, b]  = P[m, b] / GS[m, b]                     instances of size GS[m, b]
  so ALL M slices are divided among (model, size range) in proportion to size x latency x sampling
  probability; demand (queries per second) and the SLO do not enter. The GPUs are then re-partitioned
  to these counts (§3, item 7 of Figure 4: only the instances that change; the others keep serving).
- §5.1-5.2 choose each query's ensemble with a PPO agent; §5.3 routes queued queries to instances by a
  min-cost matching (that part is `routing.queries_match_instances`, not this module).

Departure, plainly: this solver sizes instances TO DEMAND (n = ceil(load / capacity) per sweet interval)
instead of dividing all M slices by IR as Algorithm 1 does, and its sweet interval is an argmax of
throughput per GPU share rather than the §4.1 saturation knee; a later issue is to make it match the paper.

Algorithm as implemented (`garrison_solve`):

1. Ensemble. Each application is one random ensemble; its members are its *eligible* variants (accuracy at
   least the application's `min_accuracy`, runnable within the SLO on some device of the fleet). Sampling
   probabilities (SP) default to uniform over the members; callers may pass their own
   (`sampling_probabilities`, per variant, renormalised per application). Variant v's load is
   lambda_v = p_v * demand_rps.
2. Sweet intervals (`garrison_sweet_intervals`; stands in for §4.1's GS[m, b]). For every slot kind k (a
   MIG profile of a GPU model in the fleet, or a whole non-MIG GPU) and batch size b, the profile gives
   latency(b) and memory(b), interpolated exactly as the capacity model does. b is feasible on k when
   latency(b) fits the latency budget (`latency_budget_fraction` x SLO) and memory(b) fits k. The
   efficiency of k at b is its throughput b / latency(b) per share of a GPU (compute slices / the GPU's
   compute slices; 1 for a whole GPU). The sweet interval of k is the set of batch sizes at which k is the
   most efficient feasible kind (ties: the smaller kind). Batch sizes run from 1 to B_v, the largest
   batch any kind can serve.
3. Batch-size distribution (stands in for §4.2's D[b]). The fraction of variant v's *queries* that fall in
   k's sweet interval is share_k = sum_{b in I_k} b P(b) / sum_b b P(b) (P is over batches; queries are
   counted one per item). A batch size outside every interval goes to the interval nearest to it.
4. Instance counts (replaces Algorithm 1, lines 1-13). n(v, k) = ceil(lambda_v * share_k / capacity(v, k)),
   where capacity is the shared capacity model's `capacity_for` (largest batch within the latency
   budget, b / latency(b)). Latency L enters only through that capacity, and the fleet size M only
   through the scaling below.

Scaling to the fleet (ours). Where the counts need more compute or memory slices of a GPU model (or more
whole GPUs of a type) than the fleet has, every count of that pool is scaled by the same factor (rounded
down, but at least one instance per variant, on the kind it was given most of, so every ensemble member
stays servable). Without this, first-fit-decreasing would hand a shortage to whichever variant's
instances are largest.

Packing (ours; Algorithm 1 outputs counts N[m, b] and the paper does not say how they are laid out).
Instances of MIG kinds are packed per GPU model by first-fit-decreasing on memory slices (then compute
slices), round-robin across variants within one size so that a shortage is shared: each goes to the first
GPU (fixed-layout GPUs first, then by name) whose instance counts plus this one still admit a valid
placement, as decided by `mig_counts_to_layout` (an exact backtracking search over the catalogue's legal
starts, cached by counts). A fixed-layout GPU only offers its free, existing placements of the same
profile. Whole-GPU kinds take free non-MIG GPUs of that type and memory by name. When every instance is
placed, each non-fixed GPU's counts are turned into a layout by `mig_counts_to_layout` and the instances
take its placements in start order.

Re-homing (ours). Load the packing could not place, and load of variants whose kinds are missing (CPU-only
variants), is re-homed greedily: while a variant's capacity is below its target load lambda_v, add the
cheapest free slot (smallest GPU share, a CPU counting as 0; an already-used GPU before a fresh one) that
covers the remainder, or else the largest one; a slot is any profile a non-fixed MIG GPU can still take, a
free placement of a fixed layout, a free whole GPU or a free CPU (`cpu_slice` cores). Then the same per
application, with any eligible variant (more accurate first on ties), for traffic no variant can take.

Traffic. Variant v gets min(lambda_v, its capacity); what an application still lacks spills onto the spare
capacity of its other members, most accurate first. Within a variant, traffic is spread in proportion to
instance capacity (equal utilisation). Instances left without traffic are dropped (a subset of a valid
layout is valid). The plan goes through `plan_assemble` with the layout of every MIG GPU (empty for unused
ones, the given one for fixed ones); status `feasible` (a heuristic proves no bound: bound and gap are
None), or `infeasible` when demand is positive and nothing can be served. The objective reported is the
accuracy-weighted served traffic (max-accuracy) or the number of GPUs used (min-gpus).

Departures from the paper, and why:
- Sizing (Algorithm 1): demand-driven ceil(lambda * share / capacity) per (variant, kind), then scaled
  down to the fleet, instead of AR[m, b] * M / GS[m, b] over all M slices; so a lightly loaded fleet is
  left partly empty (the paper hands out every slice) and SP enters as load, not as a weight on GS x L.
- Sweet interval (§4.1): the kind with the best throughput per GPU share at each batch size, within the
  latency budget, not the profiled batch range where a given instance's throughput saturates.
- Ensembles (§5.1-5.2): Tessera serves each query with one variant, so an application is a randomized
  ensemble that samples exactly one member per query; the paper's multi-model ensembles chosen by a PPO
  agent, and their weighted vote, have no counterpart here.
- Batch-size distribution (D[b], monitored online per §3, item 4 of Figure 4): Tessera's demand is in
  single queries and its capacity model batches them on the server, so there is no measured client
  batch-size distribution. Without one
  (`batch_distribution`) we take P uniform over 1..B_v (no batch size favoured); a measured distribution
  can be passed per application. Queries are weighted by batch size (b P(b)), where D[b] counts queries.
- Efficiency is compared per share of a GPU across GPU models and whole GPUs (the paper has one GPU model,
  the A100, §6.1).
- The latency bound is the capacity model's budget (a fraction of the SLO), not the SLO itself (the paper
  applies the SLO only when routing, §5.3 Eq. 2), so that every planner in Tessera sizes instances the
  same way.
- Fleet limits (scaling, packing), fixed layouts, CPUs and whole GPUs, re-homing and spill are ours: the
  paper's Algorithm 1 divides MIG slices only.
- The current layout of a non-fixed GPU is not preserved: the paper re-partitions only the instances that
  change (§3, item 7 of Figure 4), which this solver does not attempt.
- Garrison routes each query at run time by matching queued queries to free instances (§5.3); that part
  is `routing.queries_match_instances`. Here the plan's routing weights are the instances' traffic shares.
"""
from __future__ import annotations

import bisect
import functools
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_load
from engine.geometry.layout import Placement, mig_counts_to_layout
from engine.plans.capacity import InstanceCapacity, capacity_for, cpu_slice, profile_interpolate, slice_memory_mb
from engine.plans.problem import FULL_SLICE, DeviceSpec, Plan, Problem, VariantSpec
from engine.solvers.assemble import RPS_EPSILON, Assignment, plan_assemble

__all__ = ["SOLVER_NAME", "SlotKind", "SweetInterval", "garrison_solve", "garrison_sweet_intervals"]

SOLVER_NAME = "garrison"
# Load below this share of an instance is rounding noise, not a reason to start one more instance.
_CEIL_SLACK = 1e-9


@functools.total_ordering
@dataclass(frozen=True)
class SlotKind:
    """One granularity Garrison allocates: a MIG profile of a GPU model, or a whole non-MIG GPU (of one
    type and memory size)."""

    device_type: str
    slice: str  # MIG profile name, or "full"
    gpu_share: float  # compute slices / the GPU's compute slices; 1 for a whole GPU
    memory_slices: int  # MIG placement size; 0 for a whole GPU
    device_memory_mb: float | None = None  # whole GPUs only: tells apart GPUs of one type with other memory

    @property
    def is_mig(self) -> bool:
        return self.slice != FULL_SLICE

    def __str__(self) -> str:
        return f"{self.device_type}/{self.slice}"

    def __lt__(self, other: object) -> bool:
        # Explicit key: a whole GPU of unknown memory (None) must still sort against one of known memory.
        if not isinstance(other, SlotKind):
            return NotImplemented
        return self._sort_key() < other._sort_key()

    def _sort_key(self) -> tuple[str, str, float, int, float]:
        memory = -1.0 if self.device_memory_mb is None else self.device_memory_mb
        return (self.device_type, self.slice, self.gpu_share, self.memory_slices, memory)


@dataclass(frozen=True)
class SweetInterval:
    """The batch sizes at which `kind` is the most efficient feasible kind for a variant."""

    kind: SlotKind
    low_batch: int
    high_batch: int
    batch_count: int  # how many batch sizes in [low_batch, high_batch] it owns (normally all of them)
    capacity: InstanceCapacity  # what one instance of the kind serves under the capacity model


# --------------------------------------------------------------------------- fleet and profiling


@dataclass
class _FleetKinds:
    kinds: list[SlotKind]
    representative: dict[SlotKind, DeviceSpec]  # capacity_for needs a device; all of a kind answer alike


def _fleet_kinds(problem: Problem) -> _FleetKinds:
    catalogue = mig_catalogue_load()
    representative: dict[SlotKind, DeviceSpec] = {}
    mig_devices: dict[str, list[DeviceSpec]] = defaultdict(list)
    for device in sorted(problem.devices, key=lambda d: d.name):
        if device.is_cpu:
            continue
        if device.mig:
            mig_devices[device.type].append(device)
        else:
            kind = SlotKind(device.type, FULL_SLICE, 1.0, 0, device.memory_mb)
            representative.setdefault(kind, device)
    for gpu_type, devices in mig_devices.items():
        spec = catalogue.gpu_model_get(gpu_type)
        # A model whose GPUs all have fixed layouts only ever offers the profiles in those layouts.
        if all(d.fixed_layout for d in devices):
            offered = {p.profile for d in devices for p in (d.layout or ())}
        else:
            offered = set(spec.profile_names)
        for profile in spec.profiles:
            if profile.name in offered:
                kind = SlotKind(gpu_type, profile.name, profile.compute_slices / spec.compute_slices, profile.memory_slices)
                representative[kind] = devices[0]
    return _FleetKinds(sorted(representative), representative)


@dataclass
class _VariantProfile:
    variant: VariantSpec
    capacities: dict[SlotKind, InstanceCapacity]  # kinds that can run the variant at all
    owner_by_batch: dict[int, SlotKind]  # batch size -> the kind whose sweet interval holds it
    max_batch: int  # B_v: the largest batch any kind serves within the budget

    def owner_of(self, batch: int) -> SlotKind | None:
        """The kind a query batch of this size goes to: its sweet interval, else the nearest one."""
        if batch in self.owner_by_batch:
            return self.owner_by_batch[batch]
        owned = sorted(self.owner_by_batch)
        if not owned:
            return None
        i = bisect.bisect_left(owned, batch)
        candidates = [owned[j] for j in (i - 1, i) if 0 <= j < len(owned)]
        nearest = min(candidates, key=lambda b: (abs(b - batch), b))
        return self.owner_by_batch[nearest]


def _feasible_throughput(problem: Problem, variant: VariantSpec, kind: SlotKind, device: DeviceSpec, batch: int) -> float | None:
    """Throughput of one instance of `kind` at `batch`, or None where the batch misses the latency budget or
    the slice's memory. Same interpolation and rules as `capacity.instance_capacity`, one batch at a time."""
    points = problem.profiles_for(variant.name, kind.device_type, kind.slice)
    latency = profile_interpolate(points, batch, "latency_ms")
    budget = problem.application(variant.application).slo_ms * problem.options.latency_budget_fraction
    if latency is None or latency <= 0 or latency > budget:
        return None
    with_memory = all(p.memory_mb is not None for p in points)
    memory = max((profile_interpolate(points, batch, "memory_mb") if with_memory else None) or 0.0, variant.memory_mb)
    limit = slice_memory_mb(device, kind.slice)
    if limit is not None and memory > limit:
        return None
    return batch * 1000.0 / latency


def _variant_profile(problem: Problem, variant: VariantSpec, fleet: _FleetKinds) -> _VariantProfile:
    capacities: dict[SlotKind, InstanceCapacity] = {}
    for kind in fleet.kinds:
        capacity = capacity_for(problem, variant.name, fleet.representative[kind], kind.slice)
        if capacity is not None:
            capacities[kind] = capacity
    max_batch = max((c.batch for c in capacities.values()), default=0)
    owner_by_batch: dict[int, SlotKind] = {}
    for batch in range(1, max_batch + 1):
        best: tuple[float, float, int, SlotKind] | None = None
        for kind in capacities:
            throughput = _feasible_throughput(problem, variant, kind, fleet.representative[kind], batch)
            if throughput is None:
                continue
            # Highest throughput per GPU share wins; on a tie the smaller kind (compute, then memory).
            key = (-throughput / kind.gpu_share, kind.gpu_share, kind.memory_slices, kind)
            if best is None or key < best:
                best = key
        if best is not None:
            owner_by_batch[batch] = best[-1]
    return _VariantProfile(variant, capacities, owner_by_batch, max_batch)


def _sweet_intervals(profile: _VariantProfile) -> tuple[SweetInterval, ...]:
    batches_by_kind: dict[SlotKind, list[int]] = defaultdict(list)
    for batch, kind in sorted(profile.owner_by_batch.items()):
        batches_by_kind[kind].append(batch)
    intervals = [
        SweetInterval(kind, batches[0], batches[-1], len(batches), profile.capacities[kind])
        for kind, batches in batches_by_kind.items()
    ]
    return tuple(sorted(intervals, key=lambda s: (s.low_batch, s.kind)))


def garrison_sweet_intervals(problem: Problem, variant: str) -> tuple[SweetInterval, ...]:
    """Step 2 (in place of Garrison §4.1's profiled GS[m, b]) for one variant on the problem's fleet: each
    kind's sweet interval of batch sizes, ordered by batch size. Kinds that are never the most efficient
    have none."""
    return _sweet_intervals(_variant_profile(problem, problem.variant(variant), _fleet_kinds(problem)))


# --------------------------------------------------------------------------- ensembles and distributions


def _runnable_anywhere(problem: Problem, variant: VariantSpec, profile: _VariantProfile) -> bool:
    if profile.capacities:
        return True
    return any(
        (s := cpu_slice(problem, variant.name, d)) is not None and capacity_for(problem, variant.name, d, s) is not None
        for d in problem.devices
        if d.is_cpu
    )


def _sampling_probabilities(
    problem: Problem, eligible: Mapping[str, list[VariantSpec]], given: Mapping[str, float] | None
) -> dict[str, float]:
    """p_v per variant, summing to 1 over each application's eligible members (uniform unless given)."""
    if given is not None:
        for name, p in given.items():
            problem.variant(name)  # KeyError for an unknown variant
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
                raise ValueError(f"sampling probability of {name!r} must be a finite number >= 0, got {p!r}")
    probabilities: dict[str, float] = {}
    for app, members in eligible.items():
        weights = {v.name: float(given.get(v.name, 0.0)) for v in members} if given is not None else {}
        total = sum(weights.values())
        if total <= 0:  # nothing given for this application's eligible members: the uniform ensemble
            weights = {v.name: 1.0 for v in members}
            total = float(len(members))
        for name, w in weights.items():
            probabilities[name] = w / total
    return probabilities


def _batch_shares(profile: _VariantProfile, distribution: Mapping[int, float] | None) -> dict[SlotKind, float]:
    """Step 3: the share of the variant's queries whose batch falls in each kind's sweet interval."""
    if distribution is None:
        distribution = {b: 1.0 for b in range(1, profile.max_batch + 1)}  # uniform over 1..B_v
    weighted: dict[SlotKind, float] = defaultdict(float)
    for batch, probability in distribution.items():
        kind = profile.owner_of(batch)
        if kind is not None and probability > 0:
            weighted[kind] += batch * probability  # a batch of b carries b queries
    total = sum(weighted.values())
    return {k: w / total for k, w in weighted.items()} if total > 0 else {}


def _check_distributions(problem: Problem, given: Mapping[str, Mapping[int, float]] | None) -> None:
    for app, distribution in (given or {}).items():
        problem.application(app)  # KeyError for an unknown application
        for batch, p in distribution.items():
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError(f"batch_distribution[{app!r}]: batch sizes are integers >= 1, got {batch!r}")
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
                raise ValueError(f"batch_distribution[{app!r}][{batch}]: must be a finite number >= 0, got {p!r}")
        if sum(distribution.values()) <= 0:
            raise ValueError(f"batch_distribution[{app!r}]: the probabilities sum to zero")


# --------------------------------------------------------------------------- the fleet being filled


@dataclass
class _PlacedInstance:
    variant: str
    device: str
    slice: str
    start: int | None  # known at once on fixed layouts; set at the end elsewhere
    capacity_rps: float
    assigned_rps: float = 0.0


@dataclass
class _MigGpu:
    device: DeviceSpec
    spec: GpuModelSpec
    counts: Counter = field(default_factory=Counter)  # profile -> instances (non-fixed GPUs)
    free_fixed: list[Placement] = field(default_factory=list)  # unused placements of a fixed layout
    instances: list[_PlacedInstance] = field(default_factory=list)


class _Fleet:
    """Which slots are taken. MIG fits are decided by `mig_counts_to_layout`, cached by counts."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        catalogue = mig_catalogue_load()
        devices = sorted(problem.devices, key=lambda d: d.name)
        # Fixed-layout GPUs first: their instances exist whether used or not.
        self.mig_gpus = [
            _MigGpu(d, catalogue.gpu_model_get(d.type), free_fixed=sorted(d.layout or ()) if d.fixed_layout else [])
            for d in sorted((d for d in devices if d.mig), key=lambda d: (not d.fixed_layout, d.name))
        ]
        self.whole_gpus: dict[str, _PlacedInstance | None] = {d.name: None for d in devices if not d.mig and not d.is_cpu}
        self.cpus: dict[str, _PlacedInstance | None] = {d.name: None for d in devices if d.is_cpu}
        self._layouts: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[Placement, ...] | None] = {}
        self._addable: dict[tuple[str, tuple[tuple[str, int], ...]], frozenset[str]] = {}

    def layout_for(self, spec: GpuModelSpec, counts: Mapping[str, int]) -> tuple[Placement, ...] | None:
        key = (spec.name, tuple(sorted((p, n) for p, n in counts.items() if n)))
        if key not in self._layouts:
            self._layouts[key] = mig_counts_to_layout(spec, dict(key[1]))
        return self._layouts[key]

    def mig_fits(self, gpu: _MigGpu, profile: str) -> bool:
        return profile in self.addable_profiles(gpu)

    def addable_profiles(self, gpu: _MigGpu) -> frozenset[str]:
        """Profiles one more instance of which the GPU can still take."""
        if gpu.device.fixed_layout:
            return frozenset(p.profile for p in gpu.free_fixed)
        key = (gpu.spec.name, tuple(sorted((p, n) for p, n in gpu.counts.items() if n)))
        if key not in self._addable:
            addable = set()
            for profile in gpu.spec.profile_names:
                counts = Counter(gpu.counts)
                counts[profile] += 1
                if self.layout_for(gpu.spec, counts) is not None:
                    addable.add(profile)
            self._addable[key] = frozenset(addable)
        return self._addable[key]

    def mig_place(self, gpu: _MigGpu, variant: str, profile: str) -> _PlacedInstance:
        capacity = capacity_for(self.problem, variant, gpu.device, profile)
        assert capacity is not None
        start = None
        if gpu.device.fixed_layout:
            slot = next(p for p in gpu.free_fixed if p.profile == profile)
            gpu.free_fixed.remove(slot)
            start = slot.start
        else:
            gpu.counts[profile] += 1
        instance = _PlacedInstance(variant, gpu.device.name, profile, start, capacity.capacity_rps)
        gpu.instances.append(instance)
        return instance

    def instances(self) -> list[_PlacedInstance]:
        found = [i for gpu in self.mig_gpus for i in gpu.instances]
        found += [i for i in self.whole_gpus.values() if i is not None]
        found += [i for i in self.cpus.values() if i is not None]
        return found


@dataclass(frozen=True, order=True)
class _Candidate:
    """A free slot a variant could take, ordered cheapest first (see `_pick`)."""

    gpu_share: float
    fresh_device: bool  # False sorts first: fill GPUs already in use before opening another
    device: str
    slice: str
    variant: str
    capacity_rps: float


def _candidates(fleet: _Fleet, variant: VariantSpec) -> list[_Candidate]:
    """Every free slot that can run `variant`. Empty devices that look alike offer the same slots, so only
    the first of each look (by name) is listed: the others could only lose the tie-break on name."""
    problem = fleet.problem
    found: list[_Candidate] = []
    seen_empty: set[tuple] = set()
    for gpu in fleet.mig_gpus:
        fresh = not gpu.instances
        if fresh and not gpu.device.fixed_layout:
            look = ("mig", gpu.device.type, gpu.device.memory_mb)
            if look in seen_empty:
                continue
            seen_empty.add(look)
        for profile_name in sorted(fleet.addable_profiles(gpu)):
            capacity = capacity_for(problem, variant.name, gpu.device, profile_name)
            if capacity is None:
                continue
            share = gpu.spec.profile_get(profile_name).compute_slices / gpu.spec.compute_slices
            found.append(_Candidate(share, fresh, gpu.device.name, profile_name, variant.name, capacity.capacity_rps))
    for name, taken in fleet.whole_gpus.items():
        device = problem.device(name)
        look = ("gpu", device.type, device.memory_mb)
        if taken is not None or look in seen_empty:
            continue
        seen_empty.add(look)
        capacity = capacity_for(problem, variant.name, device, FULL_SLICE)
        if capacity is not None:
            found.append(_Candidate(1.0, True, name, FULL_SLICE, variant.name, capacity.capacity_rps))
    for name, taken in fleet.cpus.items():
        device = problem.device(name)
        look = ("cpu", device.cores)
        if taken is not None or look in seen_empty:
            continue
        seen_empty.add(look)
        cores = cpu_slice(problem, variant.name, device)
        capacity = None if cores is None else capacity_for(problem, variant.name, device, cores)
        if cores is not None and capacity is not None:
            found.append(_Candidate(0.0, True, name, cores, variant.name, capacity.capacity_rps))
    return found


def _pick(candidates: Sequence[_Candidate], missing_rps: float, accuracy: Mapping[str, float]) -> _Candidate | None:
    """The cheapest slot that covers what is missing, else the one that serves the most of it."""
    if not candidates:
        return None
    covering = [c for c in candidates if c.capacity_rps >= missing_rps * (1 - 1e-9)]
    if covering:
        return min(covering, key=lambda c: (c.gpu_share, c.fresh_device, -accuracy[c.variant], c.device, c.slice, c.variant))
    return min(candidates, key=lambda c: (-c.capacity_rps, c.gpu_share, c.fresh_device, -accuracy[c.variant], c.device, c.slice, c.variant))


def _take(fleet: _Fleet, candidate: _Candidate) -> _PlacedInstance:
    problem = fleet.problem
    for gpu in fleet.mig_gpus:
        if gpu.device.name == candidate.device:
            return fleet.mig_place(gpu, candidate.variant, candidate.slice)
    instance = _PlacedInstance(candidate.variant, candidate.device, candidate.slice, None, candidate.capacity_rps)
    if problem.device(candidate.device).is_cpu:
        fleet.cpus[candidate.device] = instance
    else:
        fleet.whole_gpus[candidate.device] = instance
    return instance


# --------------------------------------------------------------------------- the algorithm


@dataclass(frozen=True)
class _Request:
    """One instance step 4 (the demand-driven stand-in for Algorithm 1) asks for."""

    variant: str
    kind: SlotKind
    rank: int  # its position among the variant's instances of this kind (round-robin when packing)


def _allocate(
    profiles: Mapping[str, _VariantProfile],
    loads: Mapping[str, float],
    distributions: Mapping[str, Mapping[int, float]],
) -> list[_Request]:
    """Step 4: n(v, k) = ceil(lambda_v * share_k / capacity(v, k)). Sized to demand, unlike Algorithm 1
    (Garrison §4.2), which divides all M slices as N[m, b] = RR[m, b] * D[b] * M / GS[m, b]."""
    requests: list[_Request] = []
    for name in sorted(loads):
        load = loads[name]
        if load <= 0:
            continue
        profile = profiles[name]
        shares = _batch_shares(profile, distributions.get(profile.variant.application))
        for kind in sorted(shares):
            count = math.ceil(load * shares[kind] / profile.capacities[kind].capacity_rps - _CEIL_SLACK)
            requests.extend(_Request(name, kind, rank) for rank in range(max(count, 0)))
    return requests


def _fit_to_fleet(fleet: _Fleet, requests: Sequence[_Request]) -> tuple[list[_Request], list[str]]:
    """Scale instance counts down, proportionally per GPU model (or whole-GPU kind), where step 4 asks
    for more compute or memory slices (or whole GPUs) than the fleet has, so that a shortage is shared
    the way the ensemble splits traffic, not decided by packing order. Every variant keeps at least one
    instance (on the kind step 4 gave it most of) so every ensemble member stays servable. Returns the
    requests and notes."""
    available: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])  # pool -> [compute, memory]
    for gpu in fleet.mig_gpus:
        if gpu.device.fixed_layout:
            profiles = [gpu.spec.profile_get(p.profile) for p in gpu.free_fixed]
            available[("mig", gpu.spec.name)][0] += sum(p.compute_slices for p in profiles)
            available[("mig", gpu.spec.name)][1] += sum(p.memory_slices for p in profiles)
        else:
            available[("mig", gpu.spec.name)][0] += gpu.spec.compute_slices
            available[("mig", gpu.spec.name)][1] += gpu.spec.memory_slices
    for name in fleet.whole_gpus:
        device = fleet.problem.device(name)
        available[("gpu", device.type, device.memory_mb)][0] += 1
        available[("gpu", device.type, device.memory_mb)][1] += 1

    def pool_of(kind: SlotKind) -> tuple:
        return ("mig", kind.device_type) if kind.is_mig else ("gpu", kind.device_type, kind.device_memory_mb)

    def cost_of(kind: SlotKind) -> tuple[float, float]:
        if not kind.is_mig:
            return (1.0, 1.0)
        spec = mig_catalogue_load().gpu_model_get(kind.device_type)
        return (float(spec.profile_get(kind.slice).compute_slices), float(kind.memory_slices))

    counts: Counter = Counter((r.variant, r.kind) for r in requests)
    wanted: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (variant, kind), n in counts.items():
        compute, memory = cost_of(kind)
        wanted[pool_of(kind)][0] += n * compute
        wanted[pool_of(kind)][1] += n * memory
    factor = {
        pool: min(1.0, *(have / want for have, want in zip(available[pool], need) if want > 0))
        for pool, need in wanted.items()
    }
    notes = [
        f"garrison: the allocation needs more of {pool[1]} than the fleet has; counts scaled by {f:.3g}"
        for pool, f in sorted(factor.items()) if f < 1.0
    ]
    keep: dict[tuple, int] = {}
    for (variant, kind), n in counts.items():
        keep[variant, kind] = n if factor[pool_of(kind)] >= 1.0 else math.floor(n * factor[pool_of(kind)])
    # Every ensemble member keeps one instance, on the kind step 4 gave it most of. A floor per
    # (variant, kind) instead would ask for one instance of every variant on every slice size, which on a
    # short fleet fills it with the first variants packed and starves whole applications.
    by_variant: dict[str, list[tuple]] = defaultdict(list)
    for (variant, kind), n in counts.items():
        by_variant[variant].append((n, kind))
    for variant, options in by_variant.items():
        if not any(keep[variant, kind] for _, kind in options):
            _, kind = max(options, key=lambda o: (o[0], -o[1].memory_slices))
            keep[variant, kind] = 1
    scaled: list[_Request] = []
    for (variant, kind), n in sorted(keep.items(), key=lambda item: (item[0][0], item[0][1])):
        scaled.extend(_Request(variant, kind, rank) for rank in range(n))
    return scaled, notes


def _pack(fleet: _Fleet, requests: Sequence[_Request]) -> int:
    """First-fit-decreasing by memory slices; returns how many requests found no room."""
    unplaced = 0
    ordered = sorted(requests, key=lambda r: (-r.kind.memory_slices, -r.kind.gpu_share, r.rank, r.kind, r.variant))
    for request in ordered:
        kind = request.kind
        placed = False
        if kind.is_mig:
            for gpu in fleet.mig_gpus:
                if gpu.device.type == kind.device_type and fleet.mig_fits(gpu, kind.slice):
                    fleet.mig_place(gpu, request.variant, kind.slice)
                    placed = True
                    break
        else:
            for name, taken in fleet.whole_gpus.items():
                device = fleet.problem.device(name)
                if taken is None and device.type == kind.device_type and device.memory_mb == kind.device_memory_mb:
                    capacity = capacity_for(fleet.problem, request.variant, device, FULL_SLICE)
                    assert capacity is not None
                    fleet.whole_gpus[name] = _PlacedInstance(request.variant, name, FULL_SLICE, None, capacity.capacity_rps)
                    placed = True
                    break
        unplaced += not placed
    return unplaced


def _capacity_by_variant(fleet: _Fleet) -> dict[str, float]:
    capacity: dict[str, float] = defaultdict(float)
    for instance in fleet.instances():
        capacity[instance.variant] += instance.capacity_rps
    return capacity


def _rehome(fleet: _Fleet, problem: Problem, loads: Mapping[str, float], eligible: Mapping[str, list[VariantSpec]]) -> int:
    """Add slots until every variant reaches its target load, then every application its demand, or the
    fleet has nothing left that helps. Returns the number of instances added."""
    accuracy = {v.name: v.accuracy for v in problem.variants}
    added = 0
    # Per variant: keep the ensemble's split where the fleet allows it.
    stuck: set[str] = set()
    while True:
        capacity = _capacity_by_variant(fleet)
        missing = {v: loads[v] - capacity.get(v, 0.0) for v in loads if v not in stuck and loads[v] - capacity.get(v, 0.0) > RPS_EPSILON}
        if not missing:
            break
        name = min(missing, key=lambda v: (-missing[v], v))
        choice = _pick(_candidates(fleet, problem.variant(name)), missing[name], accuracy)
        if choice is None:
            stuck.add(name)
            continue
        _take(fleet, choice)
        added += 1
    # Per application: traffic no member can take any more, on whichever member fits.
    stuck_apps: set[str] = set()
    while True:
        capacity = _capacity_by_variant(fleet)
        missing_apps = {}
        for app in problem.applications:
            short = app.demand_rps - sum(capacity.get(v.name, 0.0) for v in eligible.get(app.name, []))
            if app.name not in stuck_apps and short > RPS_EPSILON:
                missing_apps[app.name] = short
        if not missing_apps:
            break
        app_name = min(missing_apps, key=lambda a: (-missing_apps[a], a))
        candidates = [c for v in eligible.get(app_name, []) for c in _candidates(fleet, v)]
        choice = _pick(candidates, missing_apps[app_name], accuracy)
        if choice is None:
            stuck_apps.add(app_name)
            continue
        _take(fleet, choice)
        added += 1
    return added


def _assign_traffic(fleet: _Fleet, problem: Problem, loads: Mapping[str, float], eligible: Mapping[str, list[VariantSpec]]) -> None:
    """Each member its sampled share up to its capacity; the rest spills onto members with room, most
    accurate first; within a member, in proportion to instance capacity."""
    by_variant: dict[str, list[_PlacedInstance]] = defaultdict(list)
    for instance in fleet.instances():
        by_variant[instance.variant].append(instance)
    for app in problem.applications:
        members = sorted(eligible.get(app.name, []), key=lambda v: (-v.accuracy, v.name))
        capacity = {v.name: sum(i.capacity_rps for i in by_variant.get(v.name, [])) for v in members}
        assigned = {v.name: min(loads.get(v.name, 0.0), capacity[v.name]) for v in members}
        leftover = app.demand_rps - sum(assigned.values())
        for v in members:
            if leftover <= 0:
                break
            extra = min(leftover, capacity[v.name] - assigned[v.name])
            if extra > 0:
                assigned[v.name] += extra
                leftover -= extra
        for v in members:
            if capacity[v.name] > 0:
                utilisation = assigned[v.name] / capacity[v.name]
                for instance in by_variant.get(v.name, []):
                    instance.assigned_rps = instance.capacity_rps * utilisation


def _finish(fleet: _Fleet) -> tuple[list[Assignment], dict[str, list[str]]]:
    """Drop idle instances, lay out each MIG GPU and give its instances their starts."""
    assignments: list[Assignment] = []
    layouts: dict[str, list[str]] = {}
    for gpu in fleet.mig_gpus:
        busy = [i for i in gpu.instances if i.assigned_rps >= RPS_EPSILON]
        if gpu.device.fixed_layout:
            layouts[gpu.device.name] = [str(p) for p in sorted(gpu.device.layout or ())]
        else:
            layout = fleet.layout_for(gpu.spec, Counter(i.slice for i in busy))
            # A subset of a valid layout is valid, so the search finds one; instances take starts in order.
            assert layout is not None, f"{gpu.device.name}: packed counts lost their layout"
            free_starts: dict[str, list[int]] = defaultdict(list)
            for placement in layout:
                free_starts[placement.profile].append(placement.start)
            for instance in sorted(busy, key=lambda i: (i.slice, i.variant)):
                instance.start = free_starts[instance.slice].pop(0)
            layouts[gpu.device.name] = [str(p) for p in layout]
        assignments += [Assignment(i.device, i.slice, i.start, i.variant, i.assigned_rps) for i in busy]
    for instance in list(fleet.whole_gpus.values()) + list(fleet.cpus.values()):
        if instance is not None and instance.assigned_rps >= RPS_EPSILON:
            assignments.append(Assignment(instance.device, instance.slice, None, instance.variant, instance.assigned_rps))
    return assignments, layouts


def garrison_solve(
    problem: Problem,
    *,
    sampling_probabilities: Mapping[str, float] | None = None,
    batch_distribution: Mapping[str, Mapping[int, float]] | None = None,
) -> Plan:
    """Plan with a demand-driven version of Garrison's multi-granularity allocation (§4; it departs from
    Algorithm 1, see the module docstring) and first-fit-decreasing MIG packing.

    `sampling_probabilities`: variant -> p_v, renormalised over each application's eligible variants
    (uniform where absent). `batch_distribution`: application -> {batch size: probability} of the batches
    its queries arrive in (uniform over 1..B_v where absent). Deterministic: same problem, same plan."""
    started = time.perf_counter()
    _check_distributions(problem, batch_distribution)
    fleet_kinds = _fleet_kinds(problem)
    profiles = {v.name: _variant_profile(problem, v, fleet_kinds) for v in problem.variants}

    eligible: dict[str, list[VariantSpec]] = {}
    for app in problem.applications:
        eligible[app.name] = [
            v for v in problem.variants_of(app.name)
            if (app.min_accuracy is None or v.accuracy >= app.min_accuracy) and _runnable_anywhere(problem, v, profiles[v.name])
        ]
    probabilities = _sampling_probabilities(problem, eligible, sampling_probabilities)
    loads = {
        v.name: probabilities[v.name] * problem.application(app).demand_rps
        for app, members in eligible.items() for v in members
    }

    fleet = _Fleet(problem)
    requests = _allocate(profiles, loads, batch_distribution or {})
    fitted, scaling_notes = _fit_to_fleet(fleet, requests)
    unplaced = _pack(fleet, fitted)
    added = _rehome(fleet, problem, loads, eligible)
    _assign_traffic(fleet, problem, loads, eligible)
    assignments, layouts = _finish(fleet)

    served = sum(a.assigned_rps for a in assignments)
    status = "infeasible" if problem.total_demand_rps > 0 and served < RPS_EPSILON else "feasible"
    if problem.options.objective == "min-gpus":
        objective = float(len({a.device for a in assignments if not problem.device(a.device).is_cpu}))
    else:
        objective = sum(a.assigned_rps * problem.variant(a.variant).accuracy for a in assignments)

    notes = [
        "garrison: sampling probabilities "
        + "; ".join(f"{app}: " + ", ".join(f"{v.name}={probabilities[v.name]:.3g}" for v in members) for app, members in eligible.items() if members),
        "garrison: batch-size distribution "
        + ("as given for " + ", ".join(sorted(batch_distribution)) + ", " if batch_distribution else "")
        + "uniform over 1..B_v" + (" elsewhere" if batch_distribution else " (none given)"),
    ]
    for name in sorted(loads):
        intervals = _sweet_intervals(profiles[name])
        if loads[name] > 0 and intervals:
            notes.append(f"garrison: {name} sweet intervals " + ", ".join(f"{s.kind} [{s.low_batch},{s.high_batch}]" for s in intervals))
    notes += scaling_notes
    notes.append(
        f"garrison: allocation asked for {len(requests)} instance(s), {len(fitted)} after scaling to the fleet, "
        f"{unplaced} did not fit; re-homing added {added}"
    )
    for app, members in eligible.items():
        if not members and problem.application(app).demand_rps > 0:
            notes.append(
                f"garrison: {app} has no variant that meets its min_accuracy and fits its latency budget and memory "
                "on any device of this fleet"
            )

    return plan_assemble(
        problem, assignments, status=status, solver=SOLVER_NAME, objective=objective, bound=None, gap=None,
        solve_seconds=time.perf_counter() - started, layouts=layouts, notes=notes,
    )
