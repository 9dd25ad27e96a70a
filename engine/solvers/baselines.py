"""The allocation baselines the simulator compares Tessera's planners against, and the Proteus ablations.

The baselines are the ones Proteus is evaluated against (Ahmad et al., "Proteus: A High-Throughput
Inference-Serving System with Accuracy Scaling", ASPLOS'24, §6.1.1 "Baselines" and Table 2; results in
§6.2, Figure 4), reduced, like Proteus itself here, to one allocation decision for one demand snapshot:

- `clipper-ha` / `clipper-ht`: Clipper (Crankshaw et al., NSDI'17) as Proteus §6.1.1 describes it: no
  accuracy scaling and no dynamic placement, a static allocation loaded at the start (Proteus obtains it
  from its own MILP), with the most accurate variants (HA, high accuracy) or the least accurate ones (HT,
  high throughput); its batching is AIMD (`batching.AimdBatching`, chosen in the simulator, not here).
  Departure: the static allocation is dealt by `_proportional_fill`, not solved by the Proteus MILP, and
  HT takes the fastest variant rather than the least accurate one.
- `sommelier`: Sommelier (Guo, Hu and Hu, SIGMOD'22) as Proteus §6.1.1 describes it: "partially dynamic",
  it swaps a device's variant for another of the same model to meet throughput, but never re-places
  models across devices; Proteus gives it the MILP's initial placement and its own adaptive batching, and
  §6.5 says it is the same as the "Proteus w/o MP" ablation.
  Departure: the placement comes from `current` or else clipper-ha's, not from the MILP, and the variant
  swaps are a greedy heuristic (`proteus_ablation_solve(no_placement=True)` is the MILP form §6.5 equates).
- `infaas`: INFaaS (Romero et al., ATC'21) as Proteus §6.1.1 describes it: "INFaaS-Accuracy", INFaaS's
  greedy allocation with accuracy drop as the objective and the fixed cluster as the cost constraint
  (INFaaS itself minimises cost subject to an accuracy requirement); §6.2 notes its greedy heuristic gets
  stuck in local optima.
  Departure: it decides once per re-plan (INFaaS decides on a query's arrival, §6.2-6.3), and it
  minimises cost first (INFaaS's own rule) where `min_accuracy` leaves a choice, INFaaS-Accuracy only
  when no variant at the floor covers the demand.

Shared ground rules (the same fleet the `proteus` planner sees, see `proteus.py`):

- Slots: a whole GPU is one slot (`full`); a MIG GPU keeps its current layout, one slot per instance (a
  MIG GPU without a layout runs whole as `full`); a CPU host is one slot whose core count is the largest
  profiled one for the variant it runs (`capacity.cpu_slice`). Slots are taken in a fixed order: by
  device name, then MIG start.
- A variant fits a slot when `capacity.capacity_for` gives it a positive capacity (largest batch within
  `latency_budget_fraction` x SLO and the slice's memory).
- `min_accuracy` is a hard constraint, as in the MILP: a baseline only ever uses variants at least that
  accurate, so an application whose variants all fall short is not served (reported as shortfall).
- Traffic: each application's served rate is min(demand, capacity of its instances), split over its
  instances in proportion to their capacity (`routing = capacity share`).
- The plan is assembled by `plan_assemble` with status `feasible` (`infeasible`, with a note, when demand
  is positive and nothing at all can be served), bound and gap None. Its objective is the planners':
  accuracy-weighted served traffic over total demand (max-accuracy) or GPUs used (min-gpus).

Every baseline is deterministic: no randomness, every choice has an explicit tie-break.

The ablations (`proteus_ablation_solve`, Proteus §6.5, Figure 7) reuse the Proteus MILP rather than another
model: without model selection, on a copy of the problem restricted to each application's most accurate
variant; without placement, on a fleet whose every slot is pinned to one application (see the function).
The other two ablations of §6.5, without adaptive batching (batch size 1) and without query assignment
(traffic split uniformly over the instances), are not allocation decisions: `benches/end_to_end.py`
builds them from the simulator's batching policy and the plan's routing weights."""
from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from engine.plans.capacity import InstanceCapacity, capacity_for, cpu_slice
from engine.plans.problem import FULL_SLICE, ApplicationSpec, DeviceSpec, Plan, PlanInstance, Problem, VariantSpec
from engine.solvers.assemble import RPS_EPSILON, Assignment, plan_assemble
from engine.solvers.model import (
    DeviceClass,
    DeviceConfig,
    DeviceSlot,
    Fleet,
    SlotClass,
    SlotKey,
    fleet_solve,
    unused_config,
)
from engine.solvers.proteus import proteus_solve

__all__ = [
    "BASELINE_SOLVERS",
    "Slot",
    "clipper_ha_solve",
    "clipper_ht_solve",
    "fixed_slots",
    "infaas_solve",
    "proteus_ablation_solve",
    "sommelier_solve",
]

# A demand counts as covered when capacity reaches it within this (queries per second, relative floor below).
_COVER_TOL = 1e-9


# --------------------------------------------------------------------------- the fixed fleet


@dataclass(frozen=True)
class Slot:
    """Where one instance can run on the fixed fleet. `slice` None on a CPU host: the core count is then
    the one `cpu_slice` picks for the variant; a CPU slot kept from an existing plan has its core count."""

    device: DeviceSpec
    slice: str | None
    start: int | None

    @property
    def id(self) -> str:
        if self.device.is_cpu:
            return self.device.name
        where = f"{self.slice}@{self.start}" if self.start is not None else str(self.slice)
        return f"{self.device.name}/{where}"

    @property
    def order(self) -> tuple[str, int, str]:
        return (self.device.name, -1 if self.start is None else self.start, self.slice or "")

    def slice_for(self, problem: Problem, variant: str) -> str | None:
        if self.slice is not None:
            return self.slice
        return cpu_slice(problem, variant, self.device)

    def capacity(self, problem: Problem, variant: str) -> InstanceCapacity | None:
        """The variant's capacity here, or None when it does not fit (or serves nothing)."""
        slice_name = self.slice_for(problem, variant)
        if slice_name is None:
            return None
        found = capacity_for(problem, variant, self.device, slice_name)
        return found if found is not None and found.capacity_rps > 0 else None

    def rate(self, problem: Problem, variant: str) -> float:
        found = self.capacity(problem, variant)
        return found.capacity_rps if found is not None else 0.0


def fixed_slots(problem: Problem) -> list[Slot]:
    """Every slot of the fleet as it stands (the proteus planner's fleet), in slot order."""
    slots: list[Slot] = []
    for device in problem.devices:
        if device.is_cpu:
            slots.append(Slot(device, None, None))
        elif device.mig and device.layout is not None:
            slots.extend(Slot(device, p.profile, p.start) for p in sorted(device.layout))
        else:
            slots.append(Slot(device, FULL_SLICE, None))
    return sorted(slots, key=lambda s: s.order)


def _slot_of(problem: Problem, by_id: Mapping[str, Slot], inst: PlanInstance, *, keep_cpu_cores: bool) -> Slot | None:
    """The fleet slot an existing plan's instance occupies, or None when this problem's fleet has no such
    slot (unknown device, a MIG instance outside the current layout, more cores than the host has)."""
    devices = {d.name: d for d in problem.devices}
    device = devices.get(inst.device)
    if device is None:
        return None
    if device.is_cpu:
        if not keep_cpu_cores:
            return by_id.get(device.name)
        if inst.start is not None or not inst.slice.isdigit() or not 1 <= int(inst.slice) <= (device.cores or 0):
            return None
        return Slot(device, inst.slice, None)
    where = f"{inst.slice}@{inst.start}" if inst.start is not None else inst.slice
    return by_id.get(f"{device.name}/{where}")


def _candidates(problem: Problem, app: ApplicationSpec) -> list[VariantSpec]:
    """The application's variants that meet its min_accuracy (all of them without one)."""
    return [v for v in problem.variants_of(app.name) if app.min_accuracy is None or v.accuracy >= app.min_accuracy]


def _fleet_rate(problem: Problem, slots: Sequence[Slot], variant: str) -> float:
    """What the variant would serve on all of `slots` at once: its fleet-wide throughput."""
    return sum(s.rate(problem, variant) for s in slots)


def _unservable_note(solver: str, app: ApplicationSpec) -> str:
    floor = f" at least {app.min_accuracy:g} accurate" if app.min_accuracy is not None else ""
    return f"{solver}: application {app.name} has no variant{floor} that fits any slot (latency budget and memory); it is not served"


# --------------------------------------------------------------------------- assembly


def _routed(problem: Problem, placed: Sequence[tuple[Slot, str]]) -> list[Assignment]:
    """Each application's traffic, min(demand, capacity), split over its instances in proportion to capacity."""
    capacity: dict[str, float] = defaultdict(float)
    for slot, variant in placed:
        capacity[problem.variant(variant).application] += slot.rate(problem, variant)
    out = []
    for slot, variant in placed:
        app = problem.application(problem.variant(variant).application)
        total = capacity[app.name]
        served = min(app.demand_rps, total)
        rate = served * slot.rate(problem, variant) / total if total > 0 else 0.0
        slice_name = slot.slice_for(problem, variant)
        assert slice_name is not None  # placed variants fit their slot
        out.append(Assignment(device=slot.device.name, slice=slice_name, start=slot.start, variant=variant, assigned_rps=rate))
    return out


def _plan(problem: Problem, placed: Sequence[tuple[Slot, str]], *, solver: str, started: float, notes: list[str]) -> Plan:
    seen: set[str] = set()
    for slot, _ in placed:
        assert slot.id not in seen, f"{solver}: two instances on {slot.id}"
        seen.add(slot.id)
    assignments = _routed(problem, placed)
    layouts: dict[str, list[str]] = {}
    used = {slot.device.name for slot, _ in placed}
    for device in sorted(problem.devices, key=lambda d: d.name):
        if not device.mig:
            continue
        if device.layout is not None:
            layouts[device.name] = [str(p) for p in sorted(device.layout)]  # kept as it is
        elif device.name in used:
            layouts[device.name] = []
            notes.append(f"{device.name}: has no MIG layout, so it runs as a whole GPU (slice '{FULL_SLICE}')")
    served = sum(a.assigned_rps for a in assignments)
    total_demand = problem.total_demand_rps
    status = "feasible"
    if total_demand > 0 and served <= RPS_EPSILON:
        status = "infeasible"
        notes.append(f"infeasible: nothing can be served; total demand {total_demand:g} rps")
    if problem.options.objective == "min-gpus":
        objective: float = float(len({a.device for a in assignments if not problem.device(a.device).is_cpu}))
    else:
        weighted = sum(problem.variant(a.variant).accuracy * a.assigned_rps for a in assignments)
        objective = weighted / total_demand if total_demand > 0 else 0.0
    return plan_assemble(
        problem, assignments, status=status, solver=solver, objective=objective, bound=None, gap=None,
        solve_seconds=time.perf_counter() - started, layouts=layouts, notes=notes,
    )


# --------------------------------------------------------------------------- Clipper


def _clipper_variant(problem: Problem, slots: Sequence[Slot], app: ApplicationSpec, *, high_accuracy: bool) -> str | None:
    """Clipper-HA: the most accurate variant that fits some slot (ties: more fleet-wide throughput, then
    name). Clipper-HT: the fastest one, the most fleet-wide throughput (ties: more accurate, then name).
    Proteus describes HT as "the least accurate variants"; across a model family those are the fastest, and
    where a problem's variants disagree throughput decides, since throughput is what HT stands for."""
    options = [(v, _fleet_rate(problem, slots, v.name)) for v in _candidates(problem, app)]
    options = [(v, rate) for v, rate in options if rate > 0]
    if not options:
        return None
    if high_accuracy:
        return min(options, key=lambda o: (-o[0].accuracy, -o[1], o[0].name))[0].name
    return min(options, key=lambda o: (-o[1], -o[0].accuracy, o[0].name))[0].name


def _proportional_fill(problem: Problem, slots: Sequence[Slot], chosen: Mapping[str, str]) -> list[tuple[Slot, str]]:
    """Clipper's static allocation: slots in slot order, each given to the application whose capacity so
    far covers the smallest fraction of its demand (largest unmet share first; ties: larger demand, then
    problem order) among those whose variant fits the slot and whose demand is not yet covered. So every
    application's covered share grows in step, and when slots run out each has capacity in proportion to
    its demand (as far as its variant fits the slots). Slots nobody needs stay idle."""
    order = {a.name: i for i, a in enumerate(problem.applications)}
    given: dict[str, float] = defaultdict(float)
    placed: list[tuple[Slot, str]] = []
    for slot in slots:
        best: tuple[tuple[float, float, int], str] | None = None
        for app in problem.applications:
            variant = chosen.get(app.name)
            if variant is None or app.demand_rps <= 0:
                continue
            if given[app.name] >= app.demand_rps * (1 - _COVER_TOL):
                continue
            rate = slot.rate(problem, variant)
            if rate <= 0:
                continue
            key = (given[app.name] / app.demand_rps, -app.demand_rps, order[app.name])
            if best is None or key < best[0]:
                best = (key, app.name)
        if best is not None:
            variant = chosen[best[1]]
            placed.append((slot, variant))
            given[best[1]] += slot.rate(problem, variant)
    return placed


def _clipper_placement(problem: Problem, *, high_accuracy: bool, solver: str) -> tuple[list[tuple[Slot, str]], list[str]]:
    slots = fixed_slots(problem)
    chosen: dict[str, str] = {}
    notes: list[str] = []
    for app in problem.applications:
        variant = _clipper_variant(problem, slots, app, high_accuracy=high_accuracy)
        if variant is None:
            if app.demand_rps > 0:
                notes.append(_unservable_note(solver, app))
            continue
        chosen[app.name] = variant
    placed = _proportional_fill(problem, slots, chosen)
    counts: dict[str, int] = defaultdict(int)
    for _, variant in placed:
        counts[variant] += 1
    for app in problem.applications:
        if app.name in chosen and app.demand_rps > 0:
            notes.append(f"{solver}: {app.name} runs only {chosen[app.name]}, on {counts[chosen[app.name]]} slot(s)")
    return placed, notes


def clipper_ha_solve(problem: Problem) -> Plan:
    """Clipper-HA (Proteus §6.1.1, after Clipper NSDI'17): every application runs only its most
    accurate variant that fits a slot, on as many slots as its demand needs (as many as there are when the
    fleet is short, shared by `_proportional_fill`); traffic split in proportion to capacity; what does
    not fit is shortfall. No accuracy scaling. Departs from §6.1.1, where the static allocation comes from
    the Proteus MILP: here it is `_proportional_fill`'s."""
    started = time.perf_counter()
    placed, notes = _clipper_placement(problem, high_accuracy=True, solver="clipper-ha")
    return _plan(problem, placed, solver="clipper-ha", started=started, notes=notes)


def clipper_ht_solve(problem: Problem) -> Plan:
    """Clipper-HT (Proteus §6.1.1): as Clipper-HA with each application's fastest variant (§6.1.1: "the
    least accurate model variants"; see `_clipper_variant`)."""
    started = time.perf_counter()
    placed, notes = _clipper_placement(problem, high_accuracy=False, solver="clipper-ht")
    return _plan(problem, placed, solver="clipper-ht", started=started, notes=notes)


# --------------------------------------------------------------------------- Sommelier


def _sommelier_swaps(problem: Problem, app: ApplicationSpec, slots: Sequence[Slot]) -> tuple[list[tuple[Slot, str]], list[str]]:
    """Variants for an application's fixed instances (see `sommelier_solve` for the rule)."""
    options: list[list[tuple[VariantSpec, float]]] = []
    kept: list[Slot] = []
    notes: list[str] = []
    for slot in slots:
        fits = [(v, slot.rate(problem, v.name)) for v in _candidates(problem, app)]
        fits = [(v, rate) for v, rate in fits if rate > 0]
        if not fits:
            notes.append(f"sommelier: no variant of {app.name} fits {slot.id}; the instance is dropped")
            continue
        kept.append(slot)
        options.append(fits)
    # Start every instance on its most accurate variant (ties: more capacity, then name).
    current = [min(fits, key=lambda o: (-o[0].accuracy, -o[1], o[0].name)) for fits in options]
    demand = app.demand_rps
    while True:
        total = sum(rate for _, rate in current)
        if total >= demand * (1 - _COVER_TOL):
            break
        weighted = sum(v.accuracy * rate for v, rate in current)
        finishing: tuple[tuple, int, tuple[VariantSpec, float]] | None = None
        step: tuple[tuple, int, tuple[VariantSpec, float]] | None = None
        for i, fits in enumerate(options):
            now_variant, now_rate = current[i]
            for variant, rate in fits:
                if rate <= now_rate:
                    continue  # a swap must add capacity
                new_total = total - now_rate + rate
                if new_total >= demand * (1 - _COVER_TOL):
                    accuracy = (weighted - now_variant.accuracy * now_rate + variant.accuracy * rate) / new_total
                    key: tuple = (-accuracy, i, variant.name)
                    if finishing is None or key < finishing[0]:
                        finishing = (key, i, (variant, rate))
                else:
                    drop = now_variant.accuracy - variant.accuracy
                    per_point = (rate - now_rate) / drop if drop > 0 else math.inf
                    key = (-per_point, -(rate - now_rate), i, variant.name)
                    if step is None or key < step[0]:
                        step = (key, i, (variant, rate))
        chosen = finishing or step
        if chosen is None:
            break  # every instance runs its highest-capacity variant: demand cannot fit
        current[chosen[1]] = chosen[2]
    return [(slot, v.name) for slot, (v, _) in zip(kept, current)], notes


def sommelier_solve(problem: Problem, current: Plan | None = None) -> Plan:
    """Sommelier as Proteus evaluates it (§6.1.1; its "w/o MP" ablation, §6.5): the placement
    is kept, only variants are swapped in place. Which application runs on which instance (device, slice,
    start; a CPU keeps its core count) comes from `current`, an existing plan (instances of devices or MIG
    slots this fleet lacks are dropped, with a note); without one, from clipper-ha's placement. Free slots
    stay free: nothing is re-placed across instances.

    Per application, on its instances: every instance starts on its most accurate variant (meeting
    min_accuracy) that fits it. While their capacity is below the demand, one instance swaps to another
    variant of the application with more capacity on that same slice: if some swap makes the demand fit,
    the one leaving the highest effective accuracy (capacity-weighted, as traffic is split) is made and the
    search ends (Sommelier's query: the most accurate alternative that meets the throughput); otherwise the
    swap gaining the most capacity per accuracy point lost (no loss first; ties: more capacity, then
    instance order, then name). When no swap adds capacity the shortfall stays. Traffic in proportion to
    capacity. Departs from Proteus §6.1.1, which starts Sommelier from the MILP's placement (pass that plan
    as `current` to get it) and, per §6.5, lets the MILP choose the variants in place."""
    started = time.perf_counter()
    notes: list[str] = []
    if current is None:
        placed, _ = _clipper_placement(problem, high_accuracy=True, solver="clipper-ha")
        notes.append("sommelier: no current plan given; starting from clipper-ha's placement")
    else:
        by_id = {s.id: s for s in fixed_slots(problem)}
        variant_names = {v.name for v in problem.variants}
        placed = []
        taken: set[str] = set()
        for inst in current.instances:
            slot = _slot_of(problem, by_id, inst, keep_cpu_cores=True)
            if slot is None or inst.variant not in variant_names:
                notes.append(f"sommelier: the current instance {inst.id} ({inst.variant}) is not on this fleet; dropped")
                continue
            if slot.id in taken:
                notes.append(f"sommelier: a second current instance on {slot.id} is dropped")
                continue
            taken.add(slot.id)
            placed.append((slot, inst.variant))
    by_app: dict[str, list[Slot]] = defaultdict(list)
    for slot, variant in sorted(placed, key=lambda p: p[0].order):
        by_app[problem.variant(variant).application].append(slot)
    result: list[tuple[Slot, str]] = []
    for app in problem.applications:
        swapped, app_notes = _sommelier_swaps(problem, app, by_app.get(app.name, []))
        notes.extend(app_notes)
        result.extend(swapped)
        if app.demand_rps > 0 and not by_app.get(app.name):
            notes.append(f"sommelier: {app.name} has no instance in the kept placement; it is not served")
    return _plan(problem, result, solver="sommelier", started=started, notes=notes)


# --------------------------------------------------------------------------- INFaaS


@dataclass(frozen=True)
class _ScaleOut:
    variant: VariantSpec
    slots: tuple[Slot, ...]
    capacity: float
    covers: bool


def _scale_out(problem: Problem, variant: VariantSpec, free: Sequence[Slot], demand: float) -> _ScaleOut:
    """Free slots by the variant's capacity there (largest first; ties: slot order), added one at a time
    until the demand is covered or they run out."""
    ranked = sorted(((s, s.rate(problem, variant.name)) for s in free), key=lambda sr: (-sr[1], sr[0].order))
    taken: list[Slot] = []
    total = 0.0
    for slot, rate in ranked:
        if total >= demand * (1 - _COVER_TOL) or rate <= 0:
            break
        taken.append(slot)
        total += rate
    return _ScaleOut(variant, tuple(taken), total, total >= demand * (1 - _COVER_TOL))


def infaas_solve(problem: Problem) -> Plan:
    """INFaaS-like greedy (INFaaS, ATC'21; "INFaaS-Accuracy" in Proteus §6.1.1, its results in §6.2-6.3).

    Applications in descending demand (ties: problem order); those with no demand get nothing. For each:
    1. Accuracy floor: its min_accuracy, or else the accuracy of its most accurate variant that fits some
       slot of the fleet (INFaaS treats accuracy as a requirement; without one, the strictest the fleet
       can meet). Variants below min_accuracy are never used.
    2. Cost of a variant: the free slots `_scale_out` takes for it (best capacity first, until the demand is
       covered). INFaaS picks the cheapest variant meeting the requirement: among variants at or above the
       floor that cover the demand, the fewest slots (ties: more accurate, then name).
    3. None covers: the fleet is the cost constraint and accuracy drop the objective (INFaaS-Accuracy): the
       most accurate variant (meeting min_accuracy) that covers the demand on the free slots (ties: fewest
       slots, then name); and if none does, the one with the most capacity on them (ties: more accurate,
       then name), taking every free slot it fits, the rest being shortfall.
    4. The chosen variant's slots leave the free pool. One variant per application; traffic in proportion
       to capacity. Greedy and in demand order, so an early, large application can take slots a later one
       needed: the local optima Proteus points out (§6.2).
    Departs from Proteus's INFaaS-Accuracy, which always minimises the accuracy drop: step 2 minimises cost
    (plain INFaaS) when `min_accuracy` is set and some variant at or above it covers the demand."""
    started = time.perf_counter()
    solver = "infaas"
    slots = fixed_slots(problem)
    free = list(slots)
    notes: list[str] = []
    placed: list[tuple[Slot, str]] = []
    order = {a.name: i for i, a in enumerate(problem.applications)}
    for app in sorted(problem.applications, key=lambda a: (-a.demand_rps, order[a.name])):
        if app.demand_rps <= 0:
            continue
        candidates = [v for v in _candidates(problem, app) if _fleet_rate(problem, slots, v.name) > 0]
        if not candidates:
            notes.append(_unservable_note(solver, app))
            continue
        floor = app.min_accuracy if app.min_accuracy is not None else max(v.accuracy for v in candidates)
        options = [_scale_out(problem, v, free, app.demand_rps) for v in candidates]
        options = [o for o in options if o.slots]
        if not options:
            notes.append(f"{solver}: no free slot is left that fits a variant of {app.name}; it is not served")
            continue
        cheapest = [o for o in options if o.covers and o.variant.accuracy >= floor]
        covering = [o for o in options if o.covers]
        if cheapest:
            pick = min(cheapest, key=lambda o: (len(o.slots), -o.variant.accuracy, o.variant.name))
            why = "cheapest variant meeting the accuracy floor"
        elif covering:
            pick = min(covering, key=lambda o: (-o.variant.accuracy, len(o.slots), o.variant.name))
            why = "most accurate variant that covers the demand on the free slots (accuracy scaled down)"
        else:
            pick = min(options, key=lambda o: (-o.capacity, -o.variant.accuracy, o.variant.name))
            why = "highest-capacity variant; the free slots cannot cover the demand"
        for slot in pick.slots:
            free.remove(slot)
            placed.append((slot, pick.variant.name))
        notes.append(f"{solver}: {app.name} -> {pick.variant.name} on {len(pick.slots)} slot(s) ({why}; floor {floor:g})")
    return _plan(problem, placed, solver=solver, started=started, notes=notes)


# --------------------------------------------------------------------------- Proteus ablations


def _most_accurate(problem: Problem, slots: Sequence[Slot], app: ApplicationSpec) -> str:
    """The application's most accurate variant that fits a slot, else its most accurate one at all."""
    picked = _clipper_variant(problem, slots, app, high_accuracy=True)
    if picked is not None:
        return picked
    return min(problem.variants_of(app.name), key=lambda v: (-v.accuracy, v.name)).name


def _round_robin(problem: Problem, slots: Sequence[Slot], allowed: Mapping[str, Sequence[str]]) -> list[tuple[Slot, str]]:
    """Slots in slot order dealt to the applications with demand in turn (problem order), skipping one
    none of whose allowed variants fits the slot; a slot none can use stays idle."""
    apps = [a.name for a in problem.applications if a.demand_rps > 0]
    out: list[tuple[Slot, str]] = []
    turn = 0
    for slot in slots:
        for k in range(len(apps)):
            app = apps[(turn + k) % len(apps)]
            if any(slot.rate(problem, v) > 0 for v in allowed[app]):
                out.append((slot, app))
                turn = (turn + k + 1) % len(apps)
                break
    return out


def _pinned_fleet(problem: Problem, pinned: Sequence[tuple[Slot, str]], allowed: Mapping[str, Sequence[str]]) -> Fleet:
    """The Proteus fleet with every slot pinned to one application: each slot is a slot class of its own
    whose variants are that application's allowed ones, so the MILP can only choose variants in place and
    the traffic split. Slots not pinned offer nothing."""
    slot_classes: dict[SlotKey, SlotClass] = {}
    per_device: dict[str, list[DeviceSlot]] = defaultdict(list)
    for slot, app in pinned:
        device = slot.device
        key: SlotKey = (device.type, device.memory_mb, f"{slot.slice or 'cpu'}@{slot.start}#{device.name}")
        capacities = {}
        for variant in allowed[app]:
            found = slot.capacity(problem, variant)
            if found is not None:
                capacities[variant] = found
        slot_classes[key] = SlotClass(key=key, device=device, slice=slot.slice, capacities=capacities)
        per_device[device.name].append(DeviceSlot(key, slot.slice, slot.start))
    classes = []
    for device in sorted(problem.devices, key=lambda d: d.name):
        layout = tuple(sorted(device.layout)) if device.mig and device.layout is not None else None
        config = DeviceConfig(
            name="pinned", slots=tuple(per_device.get(device.name, ())), uses_device=not device.is_cpu, layout=layout,
            mig_off=device.mig and layout is None,
        )
        configs = (config,) if device.is_cpu else (config, unused_config(layout))
        classes.append(DeviceClass((device,), configs, is_gpu=not device.is_cpu))
    return Fleet(problem=problem, device_classes=classes, slot_classes=slot_classes)


def proteus_ablation_solve(
    problem: Problem, *, no_model_selection: bool = False, no_placement: bool = False, current: Plan | None = None
) -> Plan:
    """Proteus with a component switched off (Proteus §6.5, Figure 7), solved by the Proteus MILP itself.

    no_model_selection ("Proteus w/o MS"): each application keeps only its most accurate variant that fits
    a slot; the MILP (`proteus_solve` on that restricted copy of the problem) still places
    instances and splits traffic, so nothing scales accuracy and demand beyond it is shortfall.
    no_placement ("Proteus w/o MP"): which application each slot serves is fixed: from `current` (an
    existing plan's instances; other slots stay idle) or else dealt round-robin (`_round_robin`). The MILP
    (`fleet_solve` on that pinned fleet) chooses only the variant on each pinned slot (in place, among the
    application's variants; its most accurate one alone when no_model_selection is set too) and the traffic
    split, lexicographically as Proteus does (all demand at the best accuracy, else most served first).
    Instances the MILP sends no traffic are left out of the plan, as in every MILP plan. Both off: proteus.
    Departs from §6.5's "w/o MP" (placement from the first MILP solve, then frozen) only when `current` is
    not given: the round-robin deal then stands in for that first placement."""

    slots = fixed_slots(problem)
    if not no_placement:
        if not no_model_selection:
            return proteus_solve(problem)
        keep = {_most_accurate(problem, slots, app) for app in problem.applications}
        restricted = dataclasses.replace(
            problem,
            variants=tuple(v for v in problem.variants if v.name in keep),
            profiles=tuple(p for p in problem.profiles if p.variant in keep),
        )
        plan = proteus_solve(restricted)
        plan.solver = "proteus-no-ms"
        plan.notes.insert(0, f"proteus-no-ms: each application restricted to its most accurate variant ({', '.join(sorted(keep))})")
        return plan

    if no_model_selection:
        allowed = {app.name: [_most_accurate(problem, slots, app)] for app in problem.applications}
    else:
        allowed = {app.name: [v.name for v in problem.variants_of(app.name)] for app in problem.applications}
    notes: list[str] = []
    if current is None:
        pinned = _round_robin(problem, slots, allowed)
        notes.append("placement dealt round-robin over the applications with demand, in slot order")
    else:
        by_id = {s.id: s for s in slots}
        pinned = []
        taken: set[str] = set()
        for inst in current.instances:
            slot = _slot_of(problem, by_id, inst, keep_cpu_cores=False)
            if slot is None or inst.variant not in {v.name for v in problem.variants} or slot.id in taken:
                notes.append(f"the current instance {inst.id} ({inst.variant}) has no free slot on this fleet; dropped")
                continue
            taken.add(slot.id)
            pinned.append((slot, problem.variant(inst.variant).application))
        notes.append("placement kept from the current plan")
    name = "proteus-no-ms-no-mp" if no_model_selection else "proteus-no-mp"
    fleet = _pinned_fleet(problem, sorted(pinned, key=lambda p: p[0].order), allowed)
    fleet.notes.extend(f"{name}: {n}" for n in notes)
    return fleet_solve(fleet, solver_name=name)


# --------------------------------------------------------------------------- dispatch


BASELINE_SOLVERS: dict[str, Callable[[Problem], Plan]] = {
    "clipper-ha": clipper_ha_solve,
    "clipper-ht": clipper_ht_solve,
    "sommelier": sommelier_solve,
    "infaas": infaas_solve,
}
