"""The fleet machinery both Garrison planners share (`garrison.py`, Algorithm 1 as the paper writes it, and
`garrison_demand.py`, the demand-sized variant): the granularities a fleet offers (`SlotKind`), the fleet
being filled (`GarrisonFleet`: which MIG placements, whole GPUs and CPUs are taken, MIG fits decided by
`mig_counts_to_layout`), first-fit-decreasing packing of instance requests, scaling requests to the fleet,
greedy re-homing of load nothing placed, and turning the filled fleet into assignments and layouts.

None of this is in the paper: Algorithm 1 (Garrison, DAC'24, §4.2) outputs instance counts N[m, b] and
leaves how they are laid out on GPUs unsaid; see each planner's docstring for where it is used.
"""
from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_load
from engine.geometry.layout import Placement, mig_counts_to_layout, mig_counts_to_layout_keeping
from engine.plans.capacity import capacity_for, cpu_slice
from engine.plans.problem import FULL_SLICE, DeviceSpec, Problem, VariantSpec
from engine.solvers.assemble import RPS_EPSILON, Assignment

__all__ = [
    "FleetSlotKinds", "GarrisonFleet", "InstanceRequest", "MigGpu", "PlacedInstance", "SlotCandidate", "SlotKind",
    "capacity_by_variant", "fleet_finish", "fleet_rehome", "fleet_slot_kinds", "requests_fit_to_fleet", "requests_pack",
    "slot_candidates", "slot_pick", "slot_take",
]


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




# --------------------------------------------------------------------------- fleet and profiling


@dataclass
class FleetSlotKinds:
    kinds: list[SlotKind]
    representative: dict[SlotKind, DeviceSpec]  # capacity_for needs a device; all of a kind answer alike


def fleet_slot_kinds(problem: Problem) -> FleetSlotKinds:
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
    return FleetSlotKinds(sorted(representative), representative)



# --------------------------------------------------------------------------- the fleet being filled


@dataclass
class PlacedInstance:
    variant: str
    device: str
    slice: str
    start: int | None  # known at once on fixed layouts; set at the end elsewhere
    capacity_rps: float
    assigned_rps: float = 0.0


@dataclass
class MigGpu:
    device: DeviceSpec
    spec: GpuModelSpec
    counts: Counter = field(default_factory=Counter)  # profile -> instances (non-fixed GPUs)
    free_fixed: list[Placement] = field(default_factory=list)  # unused placements of a fixed layout
    instances: list[PlacedInstance] = field(default_factory=list)


class GarrisonFleet:
    """Which slots are taken. MIG fits are decided by `mig_counts_to_layout`, cached by counts."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        catalogue = mig_catalogue_load()
        devices = sorted(problem.devices, key=lambda d: d.name)
        # Fixed-layout GPUs first: their instances exist whether used or not.
        self.mig_gpus = [
            MigGpu(d, catalogue.gpu_model_get(d.type), free_fixed=sorted(d.layout or ()) if d.fixed_layout else [])
            for d in sorted((d for d in devices if d.mig), key=lambda d: (not d.fixed_layout, d.name))
        ]
        self.whole_gpus: dict[str, PlacedInstance | None] = {d.name: None for d in devices if not d.mig and not d.is_cpu}
        self.cpus: dict[str, PlacedInstance | None] = {d.name: None for d in devices if d.is_cpu}
        self._layouts: dict[tuple, tuple[Placement, ...] | None] = {}
        self._addable: dict[tuple, frozenset[str]] = {}

    def layout_for(self, spec: GpuModelSpec, counts: Mapping[str, int], keep: tuple[Placement, ...] = ()) -> tuple[Placement, ...] | None:
        """A layout with `counts` (holding the placements of `keep`, instances that stay where they run)."""
        key = (spec.name, tuple(sorted((p, n) for p, n in counts.items() if n)), tuple(sorted(keep)))
        if key not in self._layouts:
            self._layouts[key] = (mig_counts_to_layout_keeping(spec, dict(key[1]), keep) if keep else mig_counts_to_layout(spec, dict(key[1])))
        return self._layouts[key]

    @staticmethod
    def kept_placements(gpu: MigGpu) -> tuple[Placement, ...]:
        return tuple(sorted(Placement(i.slice, i.start) for i in gpu.instances if i.start is not None))

    def mig_fits(self, gpu: MigGpu, profile: str) -> bool:
        return profile in self.addable_profiles(gpu)

    def addable_profiles(self, gpu: MigGpu) -> frozenset[str]:
        """Profiles one more instance of which the GPU can still take."""
        if gpu.device.fixed_layout:
            return frozenset(p.profile for p in gpu.free_fixed)
        keep = self.kept_placements(gpu)
        key = (gpu.spec.name, tuple(sorted((p, n) for p, n in gpu.counts.items() if n)), keep)
        if key not in self._addable:
            addable = set()
            for profile in gpu.spec.profile_names:
                counts = Counter(gpu.counts)
                counts[profile] += 1
                if self.layout_for(gpu.spec, counts, keep) is not None:
                    addable.add(profile)
            self._addable[key] = frozenset(addable)
        return self._addable[key]

    def mig_place(self, gpu: MigGpu, variant: str, profile: str, start: int | None = None) -> PlacedInstance:
        """One more instance of `profile` on `gpu`; on a GPU that is re-partitioned, `start` keeps an instance
        that runs now where it is (`fleet_finish` lays the GPU out around it)."""
        capacity = capacity_for(self.problem, variant, gpu.device, profile)
        assert capacity is not None
        if gpu.device.fixed_layout:
            slot = next(p for p in gpu.free_fixed if p.profile == profile)
            gpu.free_fixed.remove(slot)
            start = slot.start
        else:
            gpu.counts[profile] += 1
        instance = PlacedInstance(variant, gpu.device.name, profile, start, capacity.capacity_rps)
        gpu.instances.append(instance)
        return instance

    def instances(self) -> list[PlacedInstance]:
        found = [i for gpu in self.mig_gpus for i in gpu.instances]
        found += [i for i in self.whole_gpus.values() if i is not None]
        found += [i for i in self.cpus.values() if i is not None]
        return found


@dataclass(frozen=True, order=True)
class SlotCandidate:
    """A free slot a variant could take, ordered cheapest first (see `slot_pick`)."""

    gpu_share: float
    fresh_device: bool  # False sorts first: fill GPUs already in use before opening another
    device: str
    slice: str
    variant: str
    capacity_rps: float


def slot_candidates(fleet: GarrisonFleet, variant: VariantSpec) -> list[SlotCandidate]:
    """Every free slot that can run `variant`. Empty devices that look alike offer the same slots, so only
    the first of each look (by name) is listed: the others could only lose the tie-break on name."""
    problem = fleet.problem
    found: list[SlotCandidate] = []
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
            found.append(SlotCandidate(share, fresh, gpu.device.name, profile_name, variant.name, capacity.capacity_rps))
    for name, taken in fleet.whole_gpus.items():
        device = problem.device(name)
        look = ("gpu", device.type, device.memory_mb)
        if taken is not None or look in seen_empty:
            continue
        seen_empty.add(look)
        capacity = capacity_for(problem, variant.name, device, FULL_SLICE)
        if capacity is not None:
            found.append(SlotCandidate(1.0, True, name, FULL_SLICE, variant.name, capacity.capacity_rps))
    for name, taken in fleet.cpus.items():
        device = problem.device(name)
        look = ("cpu", device.cores)
        if taken is not None or look in seen_empty:
            continue
        seen_empty.add(look)
        cores = cpu_slice(problem, variant.name, device)
        capacity = None if cores is None else capacity_for(problem, variant.name, device, cores)
        if cores is not None and capacity is not None:
            found.append(SlotCandidate(0.0, True, name, cores, variant.name, capacity.capacity_rps))
    return found


def slot_pick(candidates: Sequence[SlotCandidate], missing_rps: float, accuracy: Mapping[str, float]) -> SlotCandidate | None:
    """The cheapest slot that covers what is missing, else the one that serves the most of it."""
    if not candidates:
        return None
    covering = [c for c in candidates if c.capacity_rps >= missing_rps * (1 - 1e-9)]
    if covering:
        return min(covering, key=lambda c: (c.gpu_share, c.fresh_device, -accuracy[c.variant], c.device, c.slice, c.variant))
    return min(candidates, key=lambda c: (-c.capacity_rps, c.gpu_share, c.fresh_device, -accuracy[c.variant], c.device, c.slice, c.variant))


def slot_take(fleet: GarrisonFleet, candidate: SlotCandidate) -> PlacedInstance:
    problem = fleet.problem
    for gpu in fleet.mig_gpus:
        if gpu.device.name == candidate.device:
            return fleet.mig_place(gpu, candidate.variant, candidate.slice)
    instance = PlacedInstance(candidate.variant, candidate.device, candidate.slice, None, candidate.capacity_rps)
    if problem.device(candidate.device).is_cpu:
        fleet.cpus[candidate.device] = instance
    else:
        fleet.whole_gpus[candidate.device] = instance
    return instance




@dataclass(frozen=True)
class InstanceRequest:
    """One instance step 4 (the demand-driven stand-in for Algorithm 1) asks for."""

    variant: str
    kind: SlotKind
    rank: int  # its position among the variant's instances of this kind (round-robin when packing)



def requests_fit_to_fleet(fleet: GarrisonFleet, requests: Sequence[InstanceRequest], *, solver: str) -> tuple[list[InstanceRequest], list[str]]:
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
        f"{solver}: the allocation needs more of {pool[1]} than the fleet has; counts scaled by {f:.3g}"
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
    scaled: list[InstanceRequest] = []
    for (variant, kind), n in sorted(keep.items(), key=lambda item: (item[0][0], item[0][1])):
        scaled.extend(InstanceRequest(variant, kind, rank) for rank in range(n))
    return scaled, notes


def requests_pack(fleet: GarrisonFleet, requests: Sequence[InstanceRequest]) -> int:
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
                    fleet.whole_gpus[name] = PlacedInstance(request.variant, name, FULL_SLICE, None, capacity.capacity_rps)
                    placed = True
                    break
        unplaced += not placed
    return unplaced


def capacity_by_variant(fleet: GarrisonFleet) -> dict[str, float]:
    capacity: dict[str, float] = defaultdict(float)
    for instance in fleet.instances():
        capacity[instance.variant] += instance.capacity_rps
    return capacity



def fleet_rehome(fleet: GarrisonFleet, problem: Problem, loads: Mapping[str, float], eligible: Mapping[str, list[VariantSpec]]) -> int:
    """Add slots until every variant reaches its target load, then every application its demand, or the
    fleet has nothing left that helps. Returns the number of instances added."""
    accuracy = {v.name: v.accuracy for v in problem.variants}
    added = 0
    # Per variant: keep the ensemble's split where the fleet allows it.
    stuck: set[str] = set()
    while True:
        capacity = capacity_by_variant(fleet)
        missing = {v: loads[v] - capacity.get(v, 0.0) for v in loads if v not in stuck and loads[v] - capacity.get(v, 0.0) > RPS_EPSILON}
        if not missing:
            break
        name = min(missing, key=lambda v: (-missing[v], v))
        choice = slot_pick(slot_candidates(fleet, problem.variant(name)), missing[name], accuracy)
        if choice is None:
            stuck.add(name)
            continue
        slot_take(fleet, choice)
        added += 1
    # Per application: traffic no member can take any more, on whichever member fits.
    stuck_apps: set[str] = set()
    while True:
        capacity = capacity_by_variant(fleet)
        missing_apps = {}
        for app in problem.applications:
            short = app.demand_rps - sum(capacity.get(v.name, 0.0) for v in eligible.get(app.name, []))
            if app.name not in stuck_apps and short > RPS_EPSILON:
                missing_apps[app.name] = short
        if not missing_apps:
            break
        app_name = min(missing_apps, key=lambda a: (-missing_apps[a], a))
        candidates = [c for v in eligible.get(app_name, []) for c in slot_candidates(fleet, v)]
        choice = slot_pick(candidates, missing_apps[app_name], accuracy)
        if choice is None:
            stuck_apps.add(app_name)
            continue
        slot_take(fleet, choice)
        added += 1
    return added



def fleet_finish(fleet: GarrisonFleet) -> tuple[list[Assignment], dict[str, list[str]]]:
    """Drop idle instances, lay out each MIG GPU and give its instances their starts."""
    assignments: list[Assignment] = []
    layouts: dict[str, list[str]] = {}
    for gpu in fleet.mig_gpus:
        busy = [i for i in gpu.instances if i.assigned_rps >= RPS_EPSILON]
        if gpu.device.fixed_layout:
            layouts[gpu.device.name] = [str(p) for p in sorted(gpu.device.layout or ())]
        else:
            counts = Counter(i.slice for i in busy)
            kept = [i for i in busy if i.start is not None]  # running now and staying where they are
            layout = fleet.layout_for(gpu.spec, counts, tuple(sorted(Placement(i.slice, i.start) for i in kept))) if kept else None
            if layout is None:
                # A subset of a valid layout is valid, so the search finds one; instances take starts in order.
                layout = fleet.layout_for(gpu.spec, counts)
                assert layout is not None, f"{gpu.device.name}: packed counts lost their layout"
                for instance in kept:
                    instance.start = None  # no layout keeps them: they move with the rest
            free_starts: dict[str, list[int]] = defaultdict(list)
            taken = {(i.slice, i.start) for i in busy if i.start is not None}
            for placement in layout:
                if (placement.profile, placement.start) not in taken:
                    free_starts[placement.profile].append(placement.start)
            for instance in sorted(busy, key=lambda i: (i.slice, i.variant)):
                if instance.start is None:
                    instance.start = free_starts[instance.slice].pop(0)
            layouts[gpu.device.name] = [str(p) for p in layout]
        assignments += [Assignment(i.device, i.slice, i.start, i.variant, i.assigned_rps) for i in busy]
    for instance in list(fleet.whole_gpus.values()) + list(fleet.cpus.values()):
        if instance is not None and instance.assigned_rps >= RPS_EPSILON:
            assignments.append(Assignment(instance.device, instance.slice, None, instance.variant, instance.assigned_rps))
    return assignments, layouts


