"""The accuracy-scaling MILP the proteus and joint planners share.

A fleet is described as device classes (identical devices: same type, memory, current layout) and the
configurations a device of each class may take (its fixed layout, a candidate MIG geometry, the whole GPU,
or unused). A configuration offers slots; slots are pooled into slot classes keyed by (device type, memory,
slice), because a variant's capacity depends on nothing else. Identical slots are interchangeable, so the
model counts instead of naming them (no symmetric copies for the solver to branch over):

    m[g, c]  integer  devices of class g that take configuration c        sum_c m[g, c] = |g|
    n[s, v]  integer  instances of variant v on slots of class s          sum_v n[s, v] <= sum_{g,c} slots(c, s) m[g, c]
    u[s, v]  >= 0     their load, in instances                            u[s, v] <= n[s, v]
    r[s, v] = capacity(s, v) u[s, v], the queries per second routed to those instances

    one partial:   sum_{s, v of a} (n[s, v] - u[s, v]) <= 1     (less than one instance of a left idle)

    demand:        sum_{s, v of a} r[s, v] = demand(a)      (or <= demand(a) when maximising served traffic)
    min accuracy:  sum_{s, v of a} (accuracy(v) - min_accuracy(a)) r[s, v] >= 0
    accuracy:      sum_{s, v} accuracy(v) r[s, v] / total demand            (Proteus's effective accuracy)

Correspondence with Proteus (ASPLOS'24, §4, Eq. (1)-(7)): n[s, v] counts the x_{d,m} = 1 of one slot
class, so the slot-supply row is Eq. (1) (one variant per slot); r[s, v] is the served rate z_{d,q}
(= y_{d,q} s_q), so the capacity row is Eq. (4)-(5) with P_{d,m,q} = capacity(s, v) from
`engine/plans/capacity.py`; serving demand exactly is Eq. (6), which with r >= 0 implies Eq. (2); Eq. (3)
holds by construction (a variant belongs to one application and only its traffic is routed to it); the
accuracy objective is Eq. (7)'s sum_q a_q divided by the total demand.
Departure: counted slot classes replace per-device booleans (equivalent, identical slots being
interchangeable, and without symmetric copies), and when Eq. (6) cannot hold the model is solved
lexicographically (fair shares: the smallest served fraction of each priority tier, highest tier first;
then most traffic served; then accuracy) instead of lowering s_q and re-solving as Proteus §4 ("Solving
the MILP") does. Most traffic alone would starve the applications that serve the fewest queries per slot. The configurations (MIG geometries chosen per GPU, `joint.py`),
`min-gpus`, `min_accuracy` and the reconfiguration and variant-change penalties are Tessera's additions, and
so are two things that only make it faster: rates as capacity x load (unit coefficients in the capacity
rows) and the one-partial row, which holds at some optimum of every stage (see
`_constrain_one_partial_instance`). A re-plan starts from what runs now (`running_start`).

Pipelines (the fleet planner, engine/solvers/fleet.py) enter as options, columns made by FA2: y[p, k]
(binary) runs option k of pipeline p (sum_k y[p, k] <= 1), whose stage applications then carry
served(p, k, a) rps; its replicas of c cores take w[c, s] c-core CPU slots of class s beside the other
instances (sum_s w[c, s] = sum_{p,k} replicas(p, k, c) y[p, k], and w counts in the slot-supply rows).
A stage application has no n or u of its own: its served traffic, in every row above, is
sum_k served(p, k, a) y[p, k].

Objectives run in lexicographic stages (see `fleet_solve`); the fleet planner's last stage is the fewest
GPUs at the accuracy reached (spare capacity "idle") or the most headroom at it (`_headroom_stage`:
demand(a) x h in the demand rows, h maximised). Afterwards the counts are handed out to concrete devices,
placements and instances, and the plan is assembled by `plan_assemble`."""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import pulp

from engine.geometry.layout import Layout
from engine.plans.capacity import InstanceCapacity, capacity_for, cpu_slice
from engine.plans.problem import FULL_SLICE, HEADROOM_MAX, DeviceSpec, Plan, PlanInstance, Problem, device_slot_id
from engine.sharing.partitions import mps_slice_name
from engine.solvers.assemble import RPS_EPSILON, Assignment, plan_assemble
from engine.solvers.spare import plan_spare_fill
from engine.solvers.milp import SolveOutcome, SolveState, backend_choose, milp_solve, status_combine

# (device type, device memory, slice); CPUs use ("cpu", memory, "<cores>c") and pick the slice per variant.
SlotKey = tuple[str, "float | None", str]

# Served traffic may fall this far below the first stage's optimum in the second stage: solvers satisfy
# constraints to about 1e-7 relative, so demanding the exact optimum could make the second stage infeasible.
SERVED_ABS_TOL = 1e-6
SERVED_REL_TOL = 1e-7
# Smallest time a stage is given, even when earlier stages used up the limit.
MIN_STAGE_SECONDS = 0.5
# `options.headroom_target` is acted on only when it exceeds the headroom left at the most accuracy by more
# than this (relative).
HEADROOM_TARGET_TOL = 1e-3
# Share of the remaining time a stage gets when another stage may follow it (the rest is kept for that one).
FIRST_STAGE_SHARE = 0.6
# A fair-share floor may sit this far (as a fraction of the application's demand) below the served fraction
# the fair-share stage reached, for the same reason as SERVED_REL_TOL.
FAIR_SHARE_TOL = 1e-6
# Share of a fair-share stage's time its first max-z solve gets; probes at a fixed z get the rest
# (`_fair_share_raise`).
FAIR_SHARE_FIRST_SHARE = 0.1
# Share of the stage's time left that one probe may take; one that runs out hands the rest back to max z.
FAIR_SHARE_PROBE_SHARE = 0.3
# Where a probe aims between the incumbent (0) and the bound (1): below the middle, since a target just
# under the optimum is the slowest to find a plan for.
FAIR_SHARE_STEP = 0.3


# --------------------------------------------------------------------------- fleet description


@dataclass(frozen=True)
class SlotClass:
    key: SlotKey
    device: DeviceSpec  # a representative: capacities depend only on the key
    slice: str | None  # None on CPUs, where the core count depends on the variant
    capacities: Mapping[str, InstanceCapacity]  # variant -> capacity, only variants that fit
    # MPS partitions (engine/solvers/fleet.py): per variant, the interference factor its capacity already
    # includes and, on a time-shared partition, the round (duty cycle) its capacity is a batch per.
    interference_factors: Mapping[str, float] = field(default_factory=dict)
    duty_cycles_ms: Mapping[str, float] = field(default_factory=dict)

    def slice_for(self, problem: Problem, variant: str) -> str:
        if self.slice is not None:
            return self.slice
        chosen = cpu_slice(problem, variant, self.device)
        assert chosen is not None  # variants without a CPU profile have no capacity here
        return chosen


@dataclass(frozen=True)
class DeviceSlot:
    """One slot a configuration offers: where an instance may run on the device."""

    key: SlotKey
    slice: str | None  # None on CPUs
    start: int | None  # MIG placement start


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    slots: tuple[DeviceSlot, ...]
    uses_device: bool  # False for "unused": the device runs nothing and does not count as used
    layout: Layout | None = None  # the MIG layout a device in this configuration has
    mig_off: bool = False  # a MIG GPU run whole
    instances_changed: int = 0  # MIG instances destroyed plus created to reach this from the current layout
    mps_layout: tuple[str, ...] | None = None  # an MPS GPU's partitions in this configuration ("mps60@0", ...)


@dataclass(frozen=True)
class DeviceClass:
    devices: tuple[DeviceSpec, ...]  # sorted by name
    configs: tuple[DeviceConfig, ...]
    is_gpu: bool


@dataclass(frozen=True)
class PipelineStageRun:
    """One stage of a pipeline option: every replica runs `variant` at `batch` on a `cores`-core instance."""

    application: str
    variant: str
    cores: int
    batch: int
    replicas: int
    capacity: InstanceCapacity  # one replica's: the profiled latency at `batch` (what the validator reads)


@dataclass(frozen=True)
class PipelineOption:
    """One way to run a whole pipeline, a column of the fleet model (engine/solvers/fleet.py builds them
    with FA2): its stages' replicas, which take CPU instances of their core count, and the traffic each
    stage application then carries (`served_rps`, the same fraction of every stage's rate)."""

    pipeline: str
    label: str
    stages: tuple[PipelineStageRun, ...]
    served_rps: Mapping[str, float]
    source: object = field(default=None, compare=False, repr=False)  # what the planner that made it returned

    def replicas_by_cores(self) -> Counter[int]:
        counts: Counter[int] = Counter()
        for stage in self.stages:
            counts[stage.cores] += stage.replicas
        return counts


@dataclass
class Fleet:
    problem: Problem
    device_classes: list[DeviceClass]
    slot_classes: dict[SlotKey, SlotClass]
    notes: list[str] = field(default_factory=list)
    # Pipelines planned inside the model (engine/solvers/fleet.py): per pipeline its options, at most one
    # chosen; their stage applications have no variable of their own. `pipeline_slots`: per core count,
    # the slot classes of CPU instances of that many cores that replicas may take. `pipeline_summarise`
    # writes a chosen option's summary (Plan.pipelines) from the plan's instances of its stages.
    pipeline_options: dict[str, list[PipelineOption]] = field(default_factory=dict)
    pipeline_slots: dict[int, list[SlotKey]] = field(default_factory=dict)
    pipeline_summarise: Callable[[Problem, PipelineOption, list[PlanInstance]], dict] | None = None
    # Applications as the plan counts them (issue 40: ensembles planned whole). The fleet model plans the
    # problem in rows (engine/solvers/ensembles.py `ensemble_problem_split`: one application per member of a
    # random ensemble, a query-sized application's demand in rows); `counted` is the problem the plan is
    # for, and `counted_as` maps an application of the model's to (the application of `counted` it serves,
    # the queries one of its rows is worth). Fair shares, served traffic, minimum accuracy and accuracy are
    # counted per application of `counted`. None / empty: every application counts as itself, a row a query.
    counted: Problem | None = None
    counted_as: dict[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def plan_problem(self) -> Problem:
        """The problem whose applications fair shares, served traffic and accuracy are counted for."""
        return self.counted if self.counted is not None else self.problem

    def count_of(self, application: str) -> tuple[str, float]:
        """(the application of `plan_problem` that the model's `application` serves, queries per row)."""
        return self.counted_as.get(application, (application, 1.0))

    @property
    def staged(self) -> set[str]:
        """The applications that are stages of a pipeline the model plans (with options or none)."""
        return {st.application for p in self.problem.pipelines if p.name in self.pipeline_options for st in p.stages}


def slot_key(device: DeviceSpec, slice_name: str | None) -> SlotKey:
    if device.is_cpu:
        return (device.type, device.memory_mb, f"{device.cores}c")
    assert slice_name is not None
    return (device.type, device.memory_mb, slice_name)


def mps_partition_slot_key(device: DeviceSpec, percent: int, percents: Sequence[int]) -> SlotKey:
    """The slot class of one partition of `percent` % on an MPS GPU split into `percents` (largest first):
    its capacity depends on the partitions beside it (the interference it is admitted at), so the split is
    part of the key. Shared by the fleet model's configurations and the running state a re-plan reads."""
    return (device.type, device.memory_mb, f"{mps_slice_name(percent)}/{'+'.join(map(str, percents))}")


def _is_mps_gpu(device: DeviceSpec) -> bool:
    return device.mps and not device.mig and not device.is_cpu


def slot_class_register(fleet_slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec, slice_name: str | None) -> SlotKey:
    """The slot class of `slice_name` on `device`, computing its capacities the first time it is seen."""
    key = slot_key(device, slice_name)
    if key not in fleet_slots:
        capacities: dict[str, InstanceCapacity] = {}
        for variant in problem.variants:
            chosen = cpu_slice(problem, variant.name, device) if device.is_cpu else slice_name
            if chosen is None:
                continue
            capacity = capacity_for(problem, variant.name, device, chosen)
            if capacity is not None and capacity.capacity_rps > 0:
                capacities[variant.name] = capacity
        fleet_slots[key] = SlotClass(key=key, device=device, slice=None if device.is_cpu else slice_name, capacities=capacities)
    return key


def unused_config(layout: Layout | None = None) -> DeviceConfig:
    return DeviceConfig(name="unused", slots=(), uses_device=False, layout=layout)


def whole_config(fleet_slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec, *, mig_off: bool = False, instances_changed: int = 0) -> DeviceConfig:
    key = slot_class_register(fleet_slots, problem, device, FULL_SLICE)
    return DeviceConfig(name=FULL_SLICE, slots=(DeviceSlot(key, FULL_SLICE, None),), uses_device=True, mig_off=mig_off, instances_changed=instances_changed)


def cpu_config(fleet_slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec) -> DeviceConfig:
    key = slot_class_register(fleet_slots, problem, device, None)
    # A CPU host is not a GPU: using it costs nothing under min-gpus, so it is simply always available.
    return DeviceConfig(name="cpu", slots=(DeviceSlot(key, None, None),), uses_device=False)


def layout_config(fleet_slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec, layout: Layout, *, name: str | None = None, instances_changed: int = 0) -> DeviceConfig:
    slots = tuple(DeviceSlot(slot_class_register(fleet_slots, problem, device, p.profile), p.profile, p.start) for p in sorted(layout))
    return DeviceConfig(
        name=name or " ".join(map(str, sorted(layout))), slots=slots, uses_device=True, layout=tuple(sorted(layout)), instances_changed=instances_changed
    )


def devices_group(devices: Iterable[DeviceSpec], key: Callable[[DeviceSpec], object]) -> list[tuple[DeviceSpec, ...]]:
    """Devices grouped by `key`, groups in order of first appearance, each sorted by name."""
    groups: dict[object, list[DeviceSpec]] = {}
    for device in devices:
        groups.setdefault(key(device), []).append(device)
    return [tuple(sorted(g, key=lambda d: d.name)) for g in groups.values()]


def unservable_notes(fleet: Fleet) -> list[str]:
    """Applications no slot anywhere can run: the likely reason a plan comes back short or infeasible."""
    runnable = {v for s in fleet.slot_classes.values() for v in s.capacities}
    notes = []
    staged = fleet.staged  # a pipeline's stages: the pipeline's options say what they can serve
    for app in fleet.problem.applications:
        if app.name not in staged and app.demand_rps > 0 and not any(v.name in runnable for v in fleet.problem.variants_of(app.name)):
            budget = app.slo_ms * fleet.problem.options.latency_budget_fraction
            notes.append(
                f"application {app.name}: no variant fits any device's slices within the latency budget "
                f"({budget:g} ms = {fleet.problem.options.latency_budget_fraction:g} x SLO) and memory"
            )
    return notes


# --------------------------------------------------------------------------- the MILP


@dataclass
class FleetModel:
    lp: pulp.LpProblem
    configs_taken: dict[tuple[int, int], pulp.LpVariable]  # m[g, c]
    instances: dict[tuple[SlotKey, str], pulp.LpVariable]  # n[s, v]
    loads: dict[tuple[SlotKey, str], pulp.LpVariable]  # u[s, v], in instances: 0 <= u <= n
    routed: dict[tuple[SlotKey, str], pulp.LpAffineExpression]  # r[s, v] = capacity(s, v) x load u[s, v]
    served_total: pulp.LpAffineExpression
    accuracy_over_demand: pulp.LpAffineExpression
    accuracy_routed: pulp.LpAffineExpression  # its part over the instances' traffic (the rest is pipelines')
    gpus_used: pulp.LpAffineExpression
    instances_changed: pulp.LpAffineExpression
    variants_changed: pulp.LpAffineExpression  # instances no longer running what runs there now, and devices leaving their configuration
    pipelines_chosen: dict[tuple[str, int], pulp.LpVariable] = field(default_factory=dict)  # y[p, k]: option k of pipeline p runs
    replicas_on: dict[tuple[int, SlotKey], pulp.LpVariable] = field(default_factory=dict)  # w[c, s]: c-core replicas on slot class s
    staged_served: dict[str, list[pulp.LpAffineExpression]] = field(default_factory=dict)  # stage application -> its traffic


def _variables_add(fleet: Fleet) -> tuple[dict[tuple[int, int], pulp.LpVariable], dict[tuple[SlotKey, str], pulp.LpVariable], dict[tuple[SlotKey, str], pulp.LpVariable]]:
    configs_taken = {
        (gi, ci): pulp.LpVariable(f"m_{gi}_{ci}", lowBound=0, upBound=len(group.devices), cat=pulp.LpInteger)
        for gi, group in enumerate(fleet.device_classes)
        for ci in range(len(group.configs))
    }
    most_slots = _slot_supply_upper(fleet)
    instances: dict[tuple[SlotKey, str], pulp.LpVariable] = {}
    loads: dict[tuple[SlotKey, str], pulp.LpVariable] = {}
    variant_index = {v.name: i for i, v in enumerate(fleet.problem.variants)}
    running_here: dict[SlotKey, set[str]] = defaultdict(set)
    for key, variant in _running_counts(fleet):
        running_here[key].add(variant)
    for si, (key, slot_class) in enumerate(fleet.slot_classes.items()):
        if most_slots.get(key, 0) == 0:
            continue
        for variant in _undominated_variants(fleet.problem, slot_class.capacities, keep=running_here.get(key, set())):
            vi = variant_index[variant]
            instances[key, variant] = pulp.LpVariable(f"n_{si}_{vi}", lowBound=0, upBound=most_slots[key], cat=pulp.LpInteger)
            loads[key, variant] = pulp.LpVariable(f"u_{si}_{vi}", lowBound=0)
    return configs_taken, instances, loads


def _pipeline_variables_add(fleet: Fleet) -> tuple[dict[tuple[str, int], pulp.LpVariable], dict[tuple[int, SlotKey], pulp.LpVariable]]:
    """y[p, k] (binary): pipeline p runs its option k; w[c, s] (integer): replicas of c cores on instances
    of slot class s (a CPU host class's c-core instances)."""
    chosen = {
        (name, k): pulp.LpVariable(f"y_{pi}_{k}", cat=pulp.LpBinary)
        for pi, (name, options) in enumerate(fleet.pipeline_options.items())
        for k in range(len(options))
    }
    most = _slot_supply_upper(fleet)
    replicas_on = {
        (cores, key): pulp.LpVariable(f"w_{cores}_{i}", lowBound=0, upBound=most[key], cat=pulp.LpInteger)
        for cores, keys in sorted(fleet.pipeline_slots.items())
        for i, key in enumerate(keys) if most.get(key, 0) > 0
    }
    return chosen, replicas_on


def _constrain_pipelines(lp: pulp.LpProblem, fleet: Fleet, chosen: Mapping[tuple[str, int], pulp.LpVariable],
                         replicas_on: Mapping[tuple[int, SlotKey], pulp.LpVariable]) -> None:
    """Each pipeline runs at most one of its options (none: its stages serve nothing), and the chosen
    options' replicas of c cores are exactly the c-core instances given to pipelines (the slot-supply rows
    count them beside the other applications' instances)."""
    needed: dict[int, list] = defaultdict(list)
    for pi, (name, options) in enumerate(fleet.pipeline_options.items()):
        if options:
            lp += pulp.lpSum(chosen[name, k] for k in range(len(options))) <= 1, f"pipeline_{pi}"
        for k, option in enumerate(options):
            for cores, count in option.replicas_by_cores().items():
                needed[cores].append(count * chosen[name, k])
    for cores, terms in sorted(needed.items()):
        given = [var for (c, _), var in replicas_on.items() if c == cores]
        lp += pulp.lpSum(given) == pulp.lpSum(terms), f"pipeline_cores_{cores}"


def _staged_served(fleet: Fleet, chosen: Mapping[tuple[str, int], pulp.LpVariable]) -> dict[str, list[pulp.LpAffineExpression]]:
    """Per stage application, the traffic each option of its pipeline carries if chosen."""
    served: dict[str, list[pulp.LpAffineExpression]] = defaultdict(list)
    for name, options in fleet.pipeline_options.items():
        for k, option in enumerate(options):
            for app, rps in option.served_rps.items():
                served[app].append(rps * chosen[name, k])
    return dict(served)


def _staged_accuracy(fleet: Fleet) -> dict[tuple[str, int, str], float]:
    """(pipeline, option, stage application) -> the accuracy of the variant that option runs there."""
    return {(name, k, st.application): fleet.problem.variant(st.variant).accuracy
            for name, options in fleet.pipeline_options.items() for k, o in enumerate(options) for st in o.stages}


def _undominated_variants(problem: Problem, capacities: Mapping[str, InstanceCapacity], keep: set[str] = frozenset()) -> list[str]:
    """The variants worth a variable on one slot class. If another variant of the same application is at
    least as accurate and serves at least as much on this slot (better in one), swapping it in never makes a
    plan worse under any objective or minimum accuracy, so the dominated one needs no variable. Fewer
    integer columns shrink the branch-and-bound tree. Variants in `keep` (running there now) always stay:
    changing them costs the variant-change penalty, so the swap argument does not hold for them."""
    kept = []
    for name, capacity in capacities.items():
        variant = problem.variant(name)
        if name in keep:
            kept.append(name)
            continue
        dominated = False
        for other_name, other_capacity in capacities.items():
            other = problem.variant(other_name)
            if other_name == name or other.application != variant.application:
                continue
            at_least = other.accuracy >= variant.accuracy and other_capacity.capacity_rps >= capacity.capacity_rps
            better = other.accuracy > variant.accuracy or other_capacity.capacity_rps > capacity.capacity_rps
            # Equal pairs: keep the first by name so exactly one of two identical variants survives.
            if at_least and (better or other_name < name):
                dominated = True
                break
        if not dominated:
            kept.append(name)
    return kept


def _slot_supply_upper(fleet: Fleet) -> dict[SlotKey, int]:
    """The most slots of each class the fleet could offer at once (a bound for the count variables)."""
    most: dict[SlotKey, int] = defaultdict(int)
    for group in fleet.device_classes:
        best: dict[SlotKey, int] = defaultdict(int)
        for config in group.configs:
            for key, count in Counter(s.key for s in config.slots).items():
                best[key] = max(best[key], count)
        for key, count in best.items():
            most[key] += count * len(group.devices)
    return dict(most)


def _constrain_device_configs(lp: pulp.LpProblem, fleet: Fleet, configs_taken: Mapping[tuple[int, int], pulp.LpVariable]) -> None:
    """Every device takes exactly one configuration (possibly `unused`)."""
    for gi, group in enumerate(fleet.device_classes):
        lp += pulp.lpSum(configs_taken[gi, ci] for ci in range(len(group.configs))) == len(group.devices), f"configs_{gi}"


def _constrain_slot_supply(
    lp: pulp.LpProblem, fleet: Fleet, configs_taken: Mapping[tuple[int, int], pulp.LpVariable], instances: Mapping[tuple[SlotKey, str], pulp.LpVariable],
    replicas_on: Mapping[tuple[int, SlotKey], pulp.LpVariable],
) -> None:
    """At most one variant per slot: instances of a slot class, pipeline replicas included, never
    outnumber the slots the chosen configurations offer."""
    supply: dict[SlotKey, list[tuple[int, pulp.LpVariable]]] = defaultdict(list)
    for gi, group in enumerate(fleet.device_classes):
        for ci, config in enumerate(group.configs):
            for key, count in Counter(s.key for s in config.slots).items():
                supply[key].append((count, configs_taken[gi, ci]))
    by_slot: dict[SlotKey, list[pulp.LpVariable]] = defaultdict(list)
    for (key, _), var in instances.items():
        by_slot[key].append(var)
    for (_, key), var in replicas_on.items():
        by_slot[key].append(var)
    for si, (key, used) in enumerate(by_slot.items()):
        lp += pulp.lpSum(used) <= pulp.lpSum(count * var for count, var in supply[key]), f"supply_{si}"


def _constrain_slot_capacity(
    lp: pulp.LpProblem, instances: Mapping[tuple[SlotKey, str], pulp.LpVariable], loads: Mapping[tuple[SlotKey, str], pulp.LpVariable]
) -> None:
    """Traffic to a variant on a slot class stays within its instances' capacity: the load, counted in
    instances (routed rate / one instance's capacity), is at most the number of instances."""
    for i, (key, load) in enumerate(loads.items()):
        lp += load <= instances[key], f"capacity_{i}"


def _constrain_one_partial_instance(
    lp: pulp.LpProblem, fleet: Fleet, instances: Mapping[tuple[SlotKey, str], pulp.LpVariable], loads: Mapping[tuple[SlotKey, str], pulp.LpVariable],
    *, demand_factor: float = 1.0,
) -> None:
    """Each application leaves less than one instance's worth of capacity idle (written <= 1).

    Valid for every stage without loss: routing an application's traffic to its most accurate instances
    first fills all of them but the last group used, and once that group has a whole instance idle the
    instance can go (realisation drops it anyway, see `fleet_realise`); neither step lowers served traffic
    or accuracy, or adds a GPU. Why state it: after a branch raises an instance count, the relaxation can
    no longer park the extra capacity unused, which prunes branch-and-bound nodes (issue 22 section 4).
    Loads are in instances at `model_capacity_rps`; idle capacity is measured at the real capacity (a load
    of 1 at a capacity capped to the demand may still leave most of the instance idle), else the row would
    let the model keep an idle instance, that realisation drops, to dodge the variant-change penalty."""
    idle: dict[str, list] = defaultdict(list)
    for key, load in loads.items():
        slot, variant = key
        real = fleet.slot_classes[slot].capacities[variant].capacity_rps
        idle[fleet.problem.variant(variant).application].append(
            instances[key] - load * (model_capacity_rps(fleet, slot, variant, demand_factor=demand_factor) / real))
    for ai, app in enumerate(fleet.problem.applications):
        if idle.get(app.name):
            lp += pulp.lpSum(idle[app.name]) <= 1, f"one_partial_{ai}"


def _served_by_application(fleet: Fleet, routed: Mapping[tuple[SlotKey, str], pulp.LpVariable],
                           staged: Mapping[str, list[pulp.LpAffineExpression]]) -> dict[str, list[pulp.LpVariable]]:
    by_app: dict[str, list[pulp.LpVariable]] = {a.name: [] for a in fleet.problem.applications}
    for (_, variant), rate in routed.items():
        by_app[fleet.problem.variant(variant).application].append(rate)
    for app, terms in staged.items():
        by_app[app].extend(terms)
    return by_app


def _constrain_demand(lp: pulp.LpProblem, fleet: Fleet, routed: Mapping[tuple[SlotKey, str], pulp.LpVariable],
                      staged: Mapping[str, list[pulp.LpAffineExpression]], *, full: bool,
                      demand_scale: pulp.LpVariable | float | None = None) -> None:
    """Serve each application's demand exactly (full) or at most (when maximising served traffic); with
    `demand_scale` (the headroom stage), exactly that multiple of it, but a pipeline's stages their own
    demand (their options carry fixed rates, and their replicas are sized with the pipeline's headroom)."""
    for ai, (app, rates) in enumerate(_served_by_application(fleet, routed, staged).items()):
        demand = fleet.problem.application(app).demand_rps
        if not rates:
            continue  # nothing can serve it: `_full_demand_possible` keeps full-demand stages from running
        if full and demand_scale is not None and app not in staged:
            lp += pulp.lpSum(rates) == demand * demand_scale, f"demand_{ai}"
        elif full:
            lp += pulp.lpSum(rates) == demand, f"demand_{ai}"
        else:
            lp += pulp.lpSum(rates) <= demand, f"demand_{ai}"


def model_capacity_rps(fleet: Fleet, key: SlotKey, variant: str, *, demand_factor: float = 1.0) -> float:
    """An instance's capacity as the model's rows read it: its real capacity, but never more than its
    application's demand (one instance cannot be routed more than that, so every plan stays the same;
    `demand_factor` times the demand in the headroom stage, whose demand rows are scaled). Why:
    a CPU model that answers 64 rows in 13 us has a capacity of 4.8 million rps, so the load serving a
    4 rps application is about 1e-6 instances, within the solver's feasibility tolerance of zero: HiGHS
    once routed that traffic to a slot class with no instance, and the plan dropped it."""
    capacity = fleet.slot_classes[key].capacities[variant].capacity_rps
    demand = fleet.problem.application(fleet.problem.variant(variant).application).demand_rps
    return min(capacity, demand_factor * demand) if demand > 0 else capacity


def _constrain_capacity_covers_demand(lp: pulp.LpProblem, fleet: Fleet, instances: Mapping[tuple[SlotKey, str], pulp.LpVariable],
                                      *, demand_scale: pulp.LpVariable | float | None = None, demand_factor: float = 1.0) -> None:
    """Implied by routing within capacity, but stated over the integer counts alone it is a knapsack row the
    solver derives cover cuts from, which closes the last fraction of the gap much faster. (A pipeline's
    stages have no counts: their demand row is already over the options' binaries.)"""
    by_app: dict[str, list] = defaultdict(list)
    for (key, variant), count in instances.items():
        by_app[fleet.problem.variant(variant).application].append(model_capacity_rps(fleet, key, variant, demand_factor=demand_factor) * count)
    for ai, app in enumerate(fleet.problem.applications):
        if app.demand_rps > 0 and by_app.get(app.name):
            lp += pulp.lpSum(by_app[app.name]) >= app.demand_rps * (1 if demand_scale is None else demand_scale), f"cover_{ai}"


def _constrain_min_accuracy(lp: pulp.LpProblem, fleet: Fleet, routed: Mapping[tuple[SlotKey, str], pulp.LpVariable],
                            chosen: Mapping[tuple[str, int], pulp.LpVariable], staged_accuracy: Mapping[tuple[str, int, str], float]) -> None:
    """Effective accuracy of an application over its served traffic >= its min_accuracy, written linearly as
    sum (accuracy - min) * rate >= 0 so that it holds whether demand is fixed or a variable (a pipeline's
    stages: `staged_accuracy`, per option, from `_staged_accuracy`). Over an application of `plan_problem`,
    so an ensemble's accuracy is over all its members' rows, as the plan reports it."""
    owner = {a.name: fleet.count_of(a.name)[0] for a in fleet.problem.applications}
    for ai, app in enumerate(fleet.plan_problem.applications):
        if app.min_accuracy is None:
            continue
        terms = [(fleet.problem.variant(v).accuracy - app.min_accuracy, rate) for (_, v), rate in routed.items()
                 if owner[fleet.problem.variant(v).application] == app.name]
        terms += [(accuracy - app.min_accuracy, fleet.pipeline_options[name][k].served_rps[stage] * chosen[name, k])
                  for (name, k, stage), accuracy in staged_accuracy.items() if owner[stage] == app.name]
        if terms:
            lp += pulp.lpSum(coef * rate for coef, rate in terms) >= 0, f"min_accuracy_{ai}"


def _served_counted(model: FleetModel, fleet: Fleet) -> dict[str, pulp.LpAffineExpression]:
    """Per application of `plan_problem`, the queries per second it is served (its rows x queries per row)."""
    terms: dict[str, list] = defaultdict(list)
    for app, rates in _served_by_application(fleet, model.routed, model.staged_served).items():
        owner, per_row = fleet.count_of(app)
        terms[owner].extend(per_row * rate for rate in rates)
    return {a.name: pulp.lpSum(terms.get(a.name, [])) for a in fleet.plan_problem.applications}


def _constrain_served_floors(model: FleetModel, fleet: Fleet, floors: Mapping[str, float]) -> None:
    """Each application keeps at least the traffic (queries per second) an earlier fair-share stage gave it."""
    served = _served_counted(model, fleet)
    capacity = _capacity_counted(model, fleet)
    for ai, app in enumerate(fleet.plan_problem.applications):
        if floors.get(app.name, 0.0) > 0:
            model.lp += served[app.name] >= floors[app.name], f"floor_{ai}"
            model.lp += pulp.lpSum(capacity[app.name]) >= floors[app.name], f"floor_cover_{ai}"


def _capacity_counted(model: FleetModel, fleet: Fleet) -> dict[str, list]:
    """Per application of `plan_problem`, its instances' capacity over the integer counts (queries per
    second): the terms of the knapsack rows HiGHS derives cover cuts from."""
    capacity: dict[str, list] = defaultdict(list)
    for (key, variant), count in model.instances.items():
        owner, per_row = fleet.count_of(fleet.problem.variant(variant).application)
        capacity[owner].append(per_row * model_capacity_rps(fleet, key, variant) * count)
    for app, terms in model.staged_served.items():
        owner, per_row = fleet.count_of(app)
        capacity[owner].extend(per_row * t for t in terms)
    return capacity


def _constrain_fair_share(model: FleetModel, fleet: Fleet, tier: Sequence[str], share: pulp.LpVariable) -> None:
    """Every application of `tier` is served at least `share` of its demand. The second row per application
    is implied (routing stays within capacity) but, over the integer counts alone, it is the knapsack row
    HiGHS derives cover cuts from, as in `_constrain_capacity_covers_demand`. `tier` names applications of
    `plan_problem`: an ensemble's share is over all its members' rows."""
    served = _served_counted(model, fleet)
    capacity = _capacity_counted(model, fleet)
    counted = fleet.plan_problem
    for app_name in tier:
        ai = next(i for i, a in enumerate(counted.applications) if a.name == app_name)
        demand = counted.application(app_name).demand_rps
        model.lp += served[app_name] >= demand * share, f"fair_share_{ai}"
        model.lp += pulp.lpSum(capacity[app_name]) >= demand * share, f"fair_cover_{ai}"


def _fastest_variants_only(model: FleetModel, fleet: Fleet) -> int:
    """For a stage whose objective and rows count served traffic alone (the fair shares, max served): on
    each slot class keep, per application, only the variants of the largest capacity there; the others'
    instance and load columns are fixed at 0 (same names, so a plan moves between stages as a MIP start;
    presolve drops them). Returns how many instance columns were fixed.

    Exact for those stages: any plan maps to one that serves as much with the kept variants alone. Swap
    each instance for the fastest variant on its slot (same slot, at least the capacity, so the routed
    traffic still fits and every floor and fair-share row still holds); then route the application's
    traffic group by group, filling each, and drop the whole instances left idle, which restores the one
    partial instance row. Not for an application whose minimum accuracy (its own or its ensemble's) a
    slower, more accurate variant may be needed for, nor for the accuracy stage: there every variant counts.
    Why: accuracy breaks the ties among a slot's variants, not capacity, so the served stages' branch-and-
    bound searched several interchangeable columns per (slot, application) (issue 40, item 2)."""
    owner_floor = {a.name: fleet.plan_problem.application(fleet.count_of(a.name)[0]).min_accuracy for a in fleet.problem.applications}
    top: dict[tuple[SlotKey, str], tuple[float, str]] = {}  # (slot, application) -> (-capacity, variant) of the one kept
    for key, variant in model.instances:
        rank = (-model_capacity_rps(fleet, key, variant), variant)
        slot_app = (key, fleet.problem.variant(variant).application)
        top[slot_app] = min(top.get(slot_app, rank), rank)
    fixed = 0
    for (key, variant), count in model.instances.items():
        app = fleet.problem.variant(variant).application
        if owner_floor[app] is None and top[key, app][1] != variant:
            count.upBound = 0
            model.loads[key, variant].upBound = 0
            fixed += 1
    return fixed


def fair_share_tiers(fleet: Fleet) -> list[list[str]]:
    """Applications that have demand and some slot to run on, grouped by priority, highest first: the order
    in which fair-share stages raise their smallest served fraction. Applications of `plan_problem`: an
    ensemble is one, servable when one of its members is."""
    tiers: dict[int, list[str]] = defaultdict(list)
    servable = {fleet.count_of(a)[0] for a in _servable_applications(fleet, full=False)}
    for app in fleet.plan_problem.applications:
        if app.demand_rps > 0 and app.name in servable:
            tiers[app.priority_tier].append(app.name)
    return [tiers[p] for p in sorted(tiers, reverse=True)]


def _servable_applications(fleet: Fleet, *, full: bool) -> set[str]:
    """Applications some slot the fleet offers can run a variant of; a pipeline's stages when one of its
    options carries some of their traffic (`full`: all of it)."""
    supplied = set(_slot_supply_upper(fleet))
    runnable = {v for key, s in fleet.slot_classes.items() if key in supplied for v in s.capacities}
    staged = fleet.staged
    servable = {a.name for a in fleet.problem.applications
                if a.name not in staged and any(v.name in runnable for v in fleet.problem.variants_of(a.name))}
    for options in fleet.pipeline_options.values():
        for option in options:
            servable |= {app for app, rps in option.served_rps.items()
                         if rps > RPS_EPSILON and (not full or rps >= fleet.problem.application(app).demand_rps - RPS_EPSILON)}
    return servable


def _full_demand_possible(fleet: Fleet) -> bool:
    """False when some application with demand has no variant that fits any slot (or a pipeline no option
    that carries all of it): then serving all demand is infeasible without asking a solver."""
    servable = _servable_applications(fleet, full=True)
    return all(app.demand_rps <= 0 or app.name in servable for app in fleet.problem.applications)


def fleet_model_build(fleet: Fleet, *, full_demand: bool, name: str, demand_scale: pulp.LpVariable | float | None = None) -> FleetModel:
    """The constraints every stage shares; stages add their objective and stage constraints.
    `demand_scale` (with `full_demand`, the headroom stages): every application but a pipeline's stages is
    served that multiple of its demand (a variable or a number), up to HEADROOM_MAX. Loads read the same in
    every such model (capacities capped at HEADROOM_MAX x the demand), so one stage's values start the next."""
    lp = pulp.LpProblem(name, pulp.LpMaximize)
    configs_taken, instances, loads = _variables_add(fleet)
    chosen, replicas_on = _pipeline_variables_add(fleet)
    staged = _staged_served(fleet, chosen)
    factor = HEADROOM_MAX if demand_scale is not None else 1.0
    # Rates are capacity x load (load in instances), so capacity rows have unit coefficients instead of
    # capacities up to 4e4 rps; HiGHS needed 2,952 nodes instead of 14,711 (24 s -> 11 s) on the slowest
    # 450-variant instance of benches/planning.py (issue 22 section 4).
    routed = {key: model_capacity_rps(fleet, key[0], key[1], demand_factor=factor) * load for key, load in loads.items()}
    _constrain_device_configs(lp, fleet, configs_taken)
    _constrain_slot_supply(lp, fleet, configs_taken, instances, replicas_on)
    _constrain_pipelines(lp, fleet, chosen, replicas_on)
    _constrain_slot_capacity(lp, instances, loads)
    _constrain_one_partial_instance(lp, fleet, instances, loads, demand_factor=factor)
    _constrain_demand(lp, fleet, routed, staged, full=full_demand, demand_scale=demand_scale)
    if full_demand:
        _constrain_capacity_covers_demand(lp, fleet, instances, demand_scale=demand_scale, demand_factor=factor)
    staged_accuracy = _staged_accuracy(fleet)
    _constrain_min_accuracy(lp, fleet, routed, chosen, staged_accuracy)
    # Accuracy x queries served over the demand in queries (Proteus's effective accuracy; an ensemble's rows
    # count at queries per row, `Fleet.count_of`), as `plan_objective` measures a plan.
    total_demand = fleet.plan_problem.total_demand_rps
    per_demand = 1.0 / total_demand if total_demand > 0 else 0.0
    per_row = {a.name: fleet.count_of(a.name)[1] for a in fleet.problem.applications}
    accuracy_routed = pulp.lpSum(fleet.problem.variant(v).accuracy * per_demand * per_row[fleet.problem.variant(v).application] * rate
                                 for (_, v), rate in routed.items())
    accuracy = accuracy_routed + pulp.lpSum(acc * per_demand * per_row[stage] * fleet.pipeline_options[name][k].served_rps[stage] * chosen[name, k]
                           for (name, k, stage), acc in staged_accuracy.items())
    gpus = pulp.lpSum(
        configs_taken[gi, ci]
        for gi, group in enumerate(fleet.device_classes) if group.is_gpu
        for ci, config in enumerate(group.configs) if config.uses_device
    )
    changed = pulp.lpSum(
        config.instances_changed * configs_taken[gi, ci]
        for gi, group in enumerate(fleet.device_classes)
        for ci, config in enumerate(group.configs) if config.instances_changed
    )
    return FleetModel(
        lp=lp, configs_taken=configs_taken, instances=instances, loads=loads, routed=routed,
        served_total=(pulp.lpSum(per_row[fleet.problem.variant(v).application] * rate for (_, v), rate in routed.items())
                      + pulp.lpSum(per_row[app] * t for app, terms in staged.items() for t in terms)),
        accuracy_over_demand=accuracy, accuracy_routed=accuracy_routed, gpus_used=gpus, instances_changed=changed,
        variants_changed=(_variants_changed(lp, fleet, instances) + _configurations_left(lp, fleet, configs_taken)
                          + _pipeline_replicas_moved(fleet, replicas_on)),
        pipelines_chosen=chosen, replicas_on=replicas_on, staged_served=staged,
    )


def _running_counts(fleet: Fleet) -> dict[tuple[SlotKey, str], int]:
    """How many instances of each (slot class, variant) run now, from the devices' `running`. On an MPS GPU
    whose partitions match a configuration of the model (`_mps_running_slots`), that configuration's slot
    classes: their capacity depends on what runs beside them."""
    counts: dict[tuple[SlotKey, str], int] = defaultdict(int)
    mps_keys: dict[str, list[SlotKey]] = {}
    for group in fleet.device_classes:
        for device in group.devices:
            if device.running and _is_mps_gpu(device):
                ci = _current_config(fleet, group, device)
                keys = _mps_running_slots(fleet, group.configs[ci], device) if ci is not None else None
                if keys is not None:
                    mps_keys[device.name] = keys
    for device in fleet.problem.devices:
        for i, (slot, variant) in enumerate(device.running):
            if device.name in mps_keys:
                key = mps_keys[device.name][i]
            else:
                key = slot_key(device, None if device.is_cpu else slot.split("@", 1)[0])
            counts[key, variant] += 1
    return counts


def _mps_running_slots(fleet: Fleet, config: DeviceConfig, device: DeviceSpec) -> list[SlotKey] | None:
    """The slot class of each of the device's running (slot, variant) pairs in `config`, an MPS configuration
    of the fleet model with the device's partitions: each pair on a slot of its own with the same partition
    and index that can run the variant (a split's partition takes one model, a time-shared pattern's entry
    is one model's); None when the pairs do not all fit so."""
    if config.mps_layout is None or not device.mps_layout:
        return None
    if config.mps_layout != tuple(f"{mps_slice_name(p)}@{i}" for i, p in enumerate(device.mps_layout)):
        return None
    free = list(config.slots)
    keys: list[SlotKey] = []
    for slot_id, variant in device.running:
        match = next((s for s in free if device_slot_id(s.slice or FULL_SLICE, s.start, is_cpu=False) == slot_id
                      and variant in fleet.slot_classes[s.key].capacities), None)
        if match is None:
            return None
        free.remove(match)
        keys.append(match.key)
    return keys


def _variants_changed(lp: pulp.LpProblem, fleet: Fleet, instances: Mapping[tuple[SlotKey, str], pulp.LpVariable]) -> pulp.LpAffineExpression:
    """Instances of what runs now that the plan no longer keeps: sum over (slot class, variant) of
    max(0, running now - planned), through one non-negative variable each."""
    terms = []
    for i, ((key, variant), running) in enumerate(sorted(_running_counts(fleet).items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))):
        planned = instances.get((key, variant))
        if planned is None:
            continue  # cannot run there any more (SLO, memory or the slot is gone): a change whatever the plan
        lost = pulp.LpVariable(f"lost_{i}", lowBound=0)
        lp += lost >= running - planned, f"lost_{i}"
        terms.append(lost)
    return pulp.lpSum(terms)


def pipeline_home_hosts(problem: Problem, staged: set[str]) -> set[str]:
    """The CPU hosts that run now a variant of one of the `staged` applications (pipeline stages)."""
    variants = {v.name: v.application for v in problem.variants}
    return {d.name for d in problem.devices if d.is_cpu and any(variants.get(v) in staged for _, v in d.running)}


def _pipeline_homes(fleet: Fleet) -> set[str]:
    """The CPU hosts that run a stage of a pipeline the model plans now."""
    return pipeline_home_hosts(fleet.problem, fleet.staged)


def _pipeline_replicas_moved(fleet: Fleet, replicas_on: Mapping[tuple[int, SlotKey], pulp.LpVariable]) -> pulp.LpAffineExpression:
    """Pipeline replicas on CPU slot classes of which no host runs a pipeline's stage now, while some host
    does: counted with the variant changes, so that a re-plan keeps a pipeline on the hosts it runs on
    (realisation then puts its replicas on those very hosts first) instead of moving stages elsewhere
    for nothing."""
    homes = _pipeline_homes(fleet)
    if not homes:
        return pulp.lpSum([])
    home_keys = {slot.key for group in fleet.device_classes if any(d.name in homes for d in group.devices)
                 for config in group.configs for slot in config.slots}
    return pulp.lpSum(var for (_, key), var in replicas_on.items() if key not in home_keys)


def _configurations_left(lp: pulp.LpProblem, fleet: Fleet, configs_taken: Mapping[tuple[int, int], pulp.LpVariable]) -> pulp.LpAffineExpression:
    """Running MPS GPUs moved to another configuration that uses them (their partitions rebuilt, every
    instance on them restarted), counted per device class. A class's devices share their current layout,
    so the running ones are in one configuration c0 now and the others idle; devices in some other used
    configuration, less the idle ones that may have taken it, were moved: moved >= |g| - m[g, c0] -
    m[g, unused] - idle. Why: the variant-change count is per slot class, which identical slots on two
    devices share, so without this a re-plan at the same demand could swap two devices' configurations at
    no cost. A device let go (unused) is not counted here: its instances are, as variant changes. A MIG
    layout change keeps the instances it does not destroy, and `instances_changed` counts those it does."""
    terms = []
    for gi, group in enumerate(fleet.device_classes):
        if not any(c.mps_layout is not None for c in group.configs):
            continue
        unused = [ci for ci, c in enumerate(group.configs) if not c.uses_device]
        current = {_current_config(fleet, group, d) for d in group.devices if d.running}
        if len(current) != 1 or None in current or len(group.configs) - len(unused) < 2:
            continue
        (c0,) = current
        idle = sum(1 for d in group.devices if not d.running)
        moved = pulp.LpVariable(f"moved_{gi}", lowBound=0)
        lp += moved >= len(group.devices) - configs_taken[gi, c0] - pulp.lpSum(configs_taken[gi, ci] for ci in unused) - idle, f"moved_{gi}"
        terms.append(moved)
    return pulp.lpSum(terms)


def _current_config(fleet: Fleet, group: DeviceClass, device: DeviceSpec) -> int | None:
    """The index of the configuration `device` is in now: unused when nothing runs on it (if the class can
    be unused), else the one with its current MIG layout, or the MPS configuration its partitions and
    running models fit (a split, one model per partition, before a time-shared pattern), or the whole GPU,
    or a CPU host's only one."""
    if not device.running:
        idle = next((ci for ci, c in enumerate(group.configs) if not c.uses_device and not c.slots), None)
        if idle is not None:
            return idle
    if device.is_cpu:
        return next((ci for ci, c in enumerate(group.configs) if c.slots), None)
    if _is_mps_gpu(device) and any(c.mps_layout is not None for c in group.configs):
        return next((ci for ci, c in enumerate(group.configs) if c.slots and _mps_running_slots(fleet, c, device) is not None), None)
    if device.mig and device.layout:
        layout = tuple(sorted(device.layout))
        return next((ci for ci, c in enumerate(group.configs) if c.layout == layout and c.slots), None)
    return next((ci for ci, c in enumerate(group.configs) if c.name == FULL_SLICE), None)


def running_start(fleet: Fleet, model: FleetModel) -> dict[str, float] | None:
    """A MIP start for a full-demand stage from what runs now (issue 22 section 4: warm-start re-planning
    from the current plan): every device keeps its configuration and its instances, each application's
    demand goes to its most accurate running instances first, instances left without traffic are let go
    (as `fleet_realise` would), and demand the rest cannot carry gets new instances on free slots (the
    largest capacity first) or, with none free, swaps one of the application's instances for a variant
    that serves more on the same slot. None when nothing runs, a device's state matches none of its
    configurations, no swap is left, or the model plans pipelines: the solver then starts on its own.
    The start fixes the integers; HiGHS completes the rest (the variant-change counts) itself."""
    problem = fleet.problem
    if not any(d.running for d in problem.devices):
        return None
    if any(problem.application(a).demand_rps > 0 for a in fleet.staged):
        return None  # which pipeline option matches what runs is not worked out: the solver starts on its own
    values: dict[str, float] = {}
    free: dict[SlotKey, int] = defaultdict(int)
    for gi, group in enumerate(fleet.device_classes):
        taken: Counter[int] = Counter()
        for device in group.devices:
            ci = _current_config(fleet, group, device)
            if ci is None:
                return None
            taken[ci] += 1
            for key, count in Counter(slot.key for slot in group.configs[ci].slots).items():
                free[key] += count
        for ci in range(len(group.configs)):
            values[model.configs_taken[gi, ci].name] = float(taken[ci])
    running = {k: c for k, c in _running_counts(fleet).items() if k in model.instances}
    for (key, _), count in running.items():
        free[key] -= count
    if any(n < 0 for n in free.values()):
        return None
    capacity = {k: model_capacity_rps(fleet, k[0], k[1]) for k in model.instances}
    by_app: dict[str, list[tuple[SlotKey, str]]] = defaultdict(list)
    for k in sorted(model.instances, key=lambda k: (-problem.variant(k[1]).accuracy, str(k))):
        by_app[problem.variant(k[1]).application].append(k)
    counts: dict[tuple[SlotKey, str], int] = dict(running)
    loads: dict[tuple[SlotKey, str], float] = {}

    def fill(app: str) -> float:
        """Route the application's demand to its instances, most accurate first; the demand left over."""
        remaining = problem.application(app).demand_rps
        for k in by_app[app]:
            loads[k] = min(float(counts.get(k, 0)), max(0.0, remaining) / capacity[k])
            remaining -= loads[k] * capacity[k]
        return remaining

    # Instances left without traffic free their slots: a fleet whose spare capacity is filled runs
    # something everywhere, so an application that grew must take those.
    for app in by_app:
        fill(app)
        for k in by_app[app]:
            needed = math.ceil(loads[k] - 1e-9) if loads[k] > 0 else 0
            free[k[0]] += counts.get(k, 0) - needed
            counts[k] = needed
    for app in by_app:
        while fill(app) > RPS_EPSILON:
            options = [k for k in by_app[app] if free[k[0]] > 0]
            if options:  # a free slot: its largest-capacity variant
                k = max(options, key=lambda k: capacity[k])
                free[k[0]] -= 1
                counts[k] = counts.get(k, 0) + 1
                continue
            # No free slot: swap one of the application's instances for a variant that serves more there.
            swaps = [(capacity[k2] - capacity[k], k, k2) for k in by_app[app] if counts.get(k, 0) > 0
                     for k2 in by_app[app] if k2[0] == k[0] and capacity[k2] > capacity[k]]
            if not swaps:
                return None
            _, k, k2 = max(swaps, key=lambda swap: swap[0])
            counts[k] -= 1
            counts[k2] = counts.get(k2, 0) + 1
    for app in by_app:  # growth may have left a less accurate group without traffic: let it go too
        fill(app)
        for k in by_app[app]:
            counts[k] = min(counts.get(k, 0), math.ceil(loads[k] - 1e-9) if loads[k] > 0 else 0)
    for k, var in model.instances.items():
        load = loads.get(k, 0.0)
        values[var.name] = float(counts.get(k, 0))
        values[model.loads[k].name] = load
    return values


# --------------------------------------------------------------------------- staged solving


@dataclass(frozen=True)
class FleetSolution:
    """Variable values of one solved stage, detached from PuLP."""

    configs_taken: dict[tuple[int, int], int]
    instances: dict[tuple[SlotKey, str], int]
    routed: dict[tuple[SlotKey, str], float]
    values: dict[str, float]  # by variable name: a MIP start for the next stage, which it satisfies
    pipelines: dict[str, int] = field(default_factory=dict)  # pipeline -> the option chosen (none: not run)
    replicas_on: dict[tuple[int, SlotKey], int] = field(default_factory=dict)
    staged_served: dict[str, float] = field(default_factory=dict)  # stage application -> rps
    staged_accuracy: dict[str, float] = field(default_factory=dict)  # stage application -> its variant's accuracy

    def gpus_used(self, fleet: Fleet) -> int:
        return sum(
            count for (gi, ci), count in self.configs_taken.items()
            if fleet.device_classes[gi].is_gpu and fleet.device_classes[gi].configs[ci].uses_device
        )

    def instances_changed(self, fleet: Fleet) -> int:
        return sum(count * fleet.device_classes[gi].configs[ci].instances_changed for (gi, ci), count in self.configs_taken.items())

    def served_counted(self, fleet: Fleet) -> dict[str, float]:
        """Queries per second served, per application of the fleet's `plan_problem` (`Fleet.count_of`)."""
        served: dict[str, float] = defaultdict(float)
        for app, rps in self.staged_served.items():
            owner, per_row = fleet.count_of(app)
            served[owner] += per_row * rps
        for (_, variant), rate in self.routed.items():
            owner, per_row = fleet.count_of(fleet.problem.variant(variant).application)
            served[owner] += per_row * rate
        return served

    def served_total(self, fleet: Fleet) -> float:
        return sum(self.served_counted(fleet).values())

    def accuracy_over_demand(self, fleet: Fleet) -> float:
        problem = fleet.problem
        total = fleet.plan_problem.total_demand_rps
        traffic = sum(problem.variant(v).accuracy * fleet.count_of(problem.variant(v).application)[1] * rate for (_, v), rate in self.routed.items())
        traffic += sum(self.staged_accuracy[app] * fleet.count_of(app)[1] * rps for app, rps in self.staged_served.items())
        return traffic / total if total > 0 else 0.0


def _solution_read(model: FleetModel, fleet: Fleet) -> FleetSolution:
    def whole(var: pulp.LpVariable) -> int:
        return int(round(var.value() or 0.0))

    pipelines = {name: k for (name, k), var in model.pipelines_chosen.items() if whole(var) == 1}
    staged_served: dict[str, float] = {}
    staged_accuracy: dict[str, float] = {}
    for name, k in pipelines.items():
        option = fleet.pipeline_options[name][k]
        staged_served.update(option.served_rps)
        staged_accuracy.update({st.application: fleet.problem.variant(st.variant).accuracy for st in option.stages})
    return FleetSolution(
        configs_taken={k: whole(v) for k, v in model.configs_taken.items()},
        instances={k: whole(v) for k, v in model.instances.items()},
        routed={k: max(0.0, v.value() or 0.0) for k, v in model.routed.items()},
        values={v.name: (round(v.value() or 0.0) if v.cat in (pulp.LpInteger, pulp.LpBinary) else (v.value() or 0.0)) for v in model.lp.variables()},
        pipelines=pipelines, replicas_on={k: whole(v) for k, v in model.replicas_on.items()},
        staged_served=staged_served, staged_accuracy=staged_accuracy,
    )


@dataclass
class _Stages:
    """Runs the stages of one solve within the overall time limit and remembers what each returned."""

    fleet: Fleet
    backend: str
    deadline: float
    outcomes: list[SolveOutcome] = field(default_factory=list)

    def run(
        self, model: FleetModel, *, share: float = 1.0, start: FleetSolution | Mapping[str, float] | None = None,
        cap_s: float | None = None,
    ) -> tuple[SolveOutcome, FleetSolution | None]:
        """Solve one stage with `share` of the time left (at most `cap_s`), starting from an earlier stage's
        solution (or from values by variable name, such as `running_start`'s)."""
        limit = max(MIN_STAGE_SECONDS, share * (self.deadline - time.perf_counter()))
        if cap_s is not None:
            limit = max(MIN_STAGE_SECONDS, min(limit, cap_s))
        values = start.values if isinstance(start, FleetSolution) else start
        outcome = milp_solve(model.lp, self.fleet.problem.options, time_limit_s=limit, backend=self.backend, start=values or None)
        self.outcomes.append(outcome)
        return outcome, (_solution_read(model, self.fleet) if outcome.has_solution else None)


def _unscale(value: float | None, scale: float) -> float | None:
    return None if value is None else value / scale


def _served_tolerance(served: float) -> float:
    return SERVED_ABS_TOL + SERVED_REL_TOL * abs(served)


def fleet_solve(fleet: Fleet, *, solver_name: str, fewest_gpus_last: bool = False, headroom_last: bool = False) -> Plan:
    """Solve the fleet's MILP for the problem's objective and assemble the plan.

    max-accuracy: maximise accuracy over total demand (minus reconfiguration penalty) serving all demand.
    min-gpus: minimise GPUs used (plus penalty) serving all demand with every min_accuracy met, then, at
    that value, maximise accuracy.
    Either way, when all demand cannot be served: raise the smallest served fraction of each priority tier
    (`_fair_shares_solve`; skipped for a lone application), then maximise served traffic, then accuracy at
    that traffic, each stage keeping what the earlier ones reached (where Proteus §4, "Solving the MILP",
    lowers the demand s_q a little and solves again).

    `fewest_gpus_last`: for max-accuracy, one stage more at the end, the fewest GPUs that keep the accuracy
    stage's objective (to solver tolerance); the objective, bound and gap reported stay the accuracy
    stage's. Without it, GPUs the accuracy does not depend on are used or not as the solver happens to
    leave them. `headroom_last`: instead, when all demand is served, the most headroom at that accuracy
    (`_headroom_stage`), every instance it runs kept in the plan."""
    started = time.perf_counter()
    problem = fleet.problem
    options = problem.options
    backend, notes = backend_choose(options)
    notes = list(fleet.notes) + notes + unservable_notes(fleet)
    stages = _Stages(fleet, backend, started + options.time_limit_s)
    penalty = options.reconfiguration_penalty
    objective_kind = options.objective
    # Accuracy over total demand has coefficients of about 1e-6 per rps at fleet scale, which HiGHS flags
    # as badly scaled and branches on slowly; the solver sees accuracy x rps and we report it per demand.
    demand_total = fleet.plan_problem.total_demand_rps  # queries per second, as the plan counts them
    scale = demand_total if demand_total > 0 else 1.0
    keep = options.variant_change_penalty

    solution: FleetSolution | None = None
    keep_every_instance = False
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    states: list[SolveState] = []

    full_possible = _full_demand_possible(fleet)
    if objective_kind == "min-gpus" and full_possible:
        model = fleet_model_build(fleet, full_demand=True, name="min_gpus")
        model.lp.sense = pulp.LpMinimize
        model.lp.setObjective(model.gpus_used + penalty * model.instances_changed)
        first, first_solution = stages.run(model, share=FIRST_STAGE_SHARE, start=running_start(fleet, model))
        if first_solution is not None:
            # GPUs and changes are whole numbers: report them exactly, not with the solver's rounding noise.
            objective = first_solution.gpus_used(fleet) + penalty * first_solution.instances_changed(fleet)
            bound, gap = first.bound, first.gap
            model = fleet_model_build(fleet, full_demand=True, name="min_gpus_then_accuracy")
            cap = (first.objective or 0.0) + 1e-6 * max(1.0, abs(first.objective or 0.0))
            model.lp += model.gpus_used + penalty * model.instances_changed <= cap, "stage_gpus"
            model.lp.setObjective(scale * (model.accuracy_over_demand - keep * model.variants_changed))
            second, second_solution = stages.run(model, start=first_solution)
            solution = second_solution or first_solution
            states = [first.state, second.state] if second_solution is not None else [first.state, "feasible"]
            if second_solution is None:
                notes.append("the accuracy tie-break stage found no solution in time; the plan is the fewest-GPU stage's")
    elif full_possible:
        model = fleet_model_build(fleet, full_demand=True, name="max_accuracy")
        model.lp.setObjective(scale * (model.accuracy_over_demand - penalty * model.instances_changed - keep * model.variants_changed))
        # Most of the time: this is the last stage unless demand turns out not to fit.
        first, first_solution = stages.run(model, share=0.8, start=running_start(fleet, model))
        if first_solution is not None:
            solution, objective, bound, gap, states = first_solution, _unscale(first.objective, scale), _unscale(first.bound, scale), first.gap, [first.state]
            if headroom_last:
                solution, gained = _headroom_stage(stages, fleet, model, first, first_solution, notes)
                keep_every_instance = True
                if options.headroom_target > gained * (1 + HEADROOM_TARGET_TOL):
                    targeted = _headroom_target_stage(stages, fleet, solution, gained, notes, scale=scale)
                    if targeted is not None:
                        outcome, solution = targeted
                        objective, bound, gap = _unscale(outcome.objective, scale), _unscale(outcome.bound, scale), outcome.gap
                        states = [outcome.state]
            elif fewest_gpus_last:
                solution = _fewest_gpus_stage(stages, model, first, first_solution, notes)

    if solution is None:
        # Demand cannot be served in full (or no full plan was found in time): lexicographic fallback.
        proven = not full_possible or stages.outcomes[-1].state == "infeasible"
        tiers = fair_share_tiers(fleet)
        if len(tiers) == 1 and len(tiers[0]) == 1:
            tiers = []  # one application: its fair share is simply the most traffic servable
        floors, fair_states, fair_solution, fair_notes = _fair_shares_solve(stages, fleet, tiers)
        notes.extend(fair_notes)
        model = fleet_model_build(fleet, full_demand=False, name="max_served")
        _fastest_variants_only(model, fleet)
        _constrain_served_floors(model, fleet, floors)
        model.lp.setObjective(model.served_total)
        served_outcome, served_solution = stages.run(model, share=FIRST_STAGE_SHARE, start=fair_solution)
        if served_solution is None and fair_solution is not None:
            # The fair shares already form a plan: better than none when the served stage runs out of time.
            served_outcome = dataclasses.replace(served_outcome, state="feasible", objective=fair_solution.served_total(fleet))
            served_solution = fair_solution
        best_served = served_outcome.objective or 0.0
        if served_solution is None or best_served <= RPS_EPSILON:
            reason = "nothing can be served" if served_solution is not None else "no solution was found in the time limit"
            notes.append(f"infeasible: {reason}; total demand {demand_total:g} rps")
            return plan_assemble(
                problem, [], status="infeasible", solver=solver_name, objective=None, bound=None, gap=None,
                solve_seconds=time.perf_counter() - started, layouts=_idle_layouts(fleet), notes=notes,
            )
        model = fleet_model_build(fleet, full_demand=False, name="max_served_then_accuracy")
        _constrain_served_floors(model, fleet, floors)
        model.lp += model.served_total >= best_served - _served_tolerance(best_served), "stage_served"
        model.lp.setObjective(scale * (model.accuracy_over_demand - penalty * model.instances_changed - keep * model.variants_changed))
        accuracy_outcome, accuracy_solution = stages.run(model, start=served_solution)
        solution = accuracy_solution or served_solution
        if (fewest_gpus_last or headroom_last) and accuracy_solution is not None and objective_kind == "max-accuracy":
            solution = _fewest_gpus_stage(stages, model, accuracy_outcome, accuracy_solution, notes)
        states = ([] if proven else ["feasible"]) + fair_states + [served_outcome.state, accuracy_outcome.state if accuracy_solution else "feasible"]
        why = "cannot be served in full" if proven else "could not be served in full by any plan found within the time limit"
        first = "the smallest served fraction of each priority tier (fair shares), then " if fair_states else ""
        notes.append(
            f"demand {why}: solved lexicographically, first maximising {first}served throughput "
            f"({best_served:.6g} of {demand_total:.6g} rps), then accuracy at that throughput"
        )
        if objective_kind == "min-gpus":
            # Served traffic and accuracy come first here, so the GPU count is what that plan uses.
            objective = float(solution.gpus_used(fleet)) + penalty * solution.instances_changed(fleet)
            bound = gap = None
            notes.append("min-gpus: fell back to the max-served, max-accuracy plan; objective is its GPU count, not minimised")
        elif accuracy_solution is not None:
            objective, bound, gap = _unscale(accuracy_outcome.objective, scale), _unscale(accuracy_outcome.bound, scale), accuracy_outcome.gap
        else:
            objective = solution.accuracy_over_demand(fleet) - penalty * solution.instances_changed(fleet)
            bound = gap = None

    assignments, layouts, realise_notes = fleet_realise(fleet, solution, keep_every_instance=keep_every_instance)
    notes.extend(realise_notes)
    if penalty > 0:
        notes.append(f"reconfiguration: {solution.instances_changed(fleet)} MIG instances destroyed or created, penalty {penalty:g} each in the objective")
    plan = plan_assemble(
        problem, assignments, status=status_combine(*states), solver=solver_name, objective=objective, bound=bound, gap=gap,
        solve_seconds=time.perf_counter() - started, layouts=layouts, notes=notes,
    )
    _pipelines_summarise(fleet, solution, plan)
    if options.spare_capacity != "idle" and objective_kind == "max-accuracy":
        plan = plan_spare_fill(problem, plan, even=options.spare_capacity == "artefact")
        plan.solve_seconds = time.perf_counter() - started
    return plan


def _pipelines_summarise(fleet: Fleet, solution: FleetSolution, plan: Plan) -> None:
    """Each chosen pipeline option's summary on the plan (what the validator and the dashboard read), and a
    note for each pipeline the plan does not run."""
    if not fleet.pipeline_options:
        return
    for name, options in fleet.pipeline_options.items():
        k = solution.pipelines.get(name)
        if k is None:
            plan.notes.append(f"pipeline {name}: not run ({'no option fits the fleet' if options else 'no plan meets its SLOs'})")
            continue
        option = options[k]
        stages = {st.application for st in option.stages}
        placed = [i for i in plan.instances if fleet.problem.variant(i.variant).application in stages]
        if fleet.pipeline_summarise is not None:
            plan.pipelines[name] = fleet.pipeline_summarise(fleet.problem, option, placed)
        plan.notes.append(f"pipeline {name}: option {option.label} chosen, {sum(st.replicas for st in option.stages)} replicas")


def _fewest_gpus_stage(stages: _Stages, model: FleetModel, outcome: SolveOutcome, solution: FleetSolution, notes: list[str]) -> FleetSolution:
    """The fewest GPUs at the accuracy stage's objective (to solver tolerance), from its solution, in at most
    the time that stage took; its solution when this stage finds nothing better in time."""
    reached = outcome.objective if outcome.objective is not None else 0.0
    used = solution.gpus_used(stages.fleet)
    model.lp += model.lp.objective >= reached - _served_tolerance(reached), "stage_accuracy"
    model.lp.sense = pulp.LpMinimize
    model.lp.setObjective(model.gpus_used)
    # A tie-break: it gets no more time than the accuracy stage took.
    last, fewer = stages.run(model, start=solution, cap_s=outcome.seconds)
    if fewer is None or fewer.gpus_used(stages.fleet) >= used:
        if last.state != "optimal":
            notes.append(f"fewest GPUs at that accuracy: not proved in time; the plan keeps {used} GPUs")
        return solution
    notes.append(f"fewest GPUs at that accuracy: {fewer.gpus_used(stages.fleet)} instead of {used}"
                 + ("" if last.state == "optimal" else " (not proved the fewest in time)"))
    return fewer


def _scaled_loads(model: FleetModel, fleet: Fleet, routed: Mapping[tuple[SlotKey, str], float], factor: float) -> dict[str, float]:
    """A MIP start's load values for a model with `demand_scale` (capacities read at HEADROOM_MAX x the
    demand): `routed` times `factor`, by variable name."""
    return {load.name: factor * routed.get((key, variant), 0.0) / model_capacity_rps(fleet, key, variant, demand_factor=HEADROOM_MAX)
            for (key, variant), load in model.loads.items()}


def _pipelines_pin(model: FleetModel, solution: FleetSolution) -> None:
    """Fix the model's pipeline options and replica placements to the solution's."""
    for (name, k), chosen in model.pipelines_chosen.items():
        chosen.lowBound = chosen.upBound = 1 if solution.pipelines.get(name) == k else 0
    for key, replicas in model.replicas_on.items():
        replicas.lowBound = replicas.upBound = solution.replicas_on.get(key, 0)


def _headroom_stage(stages: _Stages, fleet: Fleet, accuracy_model: FleetModel, outcome: SolveOutcome, solution: FleetSolution,
                    notes: list[str]) -> tuple[FleetSolution, float]:
    """Spare capacity put where it buys the most headroom (options.spare_capacity "fill" or "artefact"):
    the largest common multiple h of every application's demand (1 <= h <= HEADROOM_MAX; a pipeline's
    stages keep their own rates, their replicas sized with the pipeline's headroom) that the plan's
    instances could serve at the accuracy stage's accuracy, with no more MIG instances rebuilt and no more
    running instances dropped than it; the plan then routes the demand itself, h times below what that
    serves, and the spread (spare.py) evens it out. In at most the time the accuracy stage took; the
    accuracy stage's plan when this finds nothing better. The objective, bound and gap stay that stage's.
    Returns the solution and h (1 when the accuracy stage's plan is kept).

    Why: the accuracy MILP serves the demand exactly and leaves what it does not need idle, and the fill
    that follows (spare.py) gives an instance only to whole devices left empty; MIG slices and MPS
    partitions stayed empty, and an MPS plan kept its tightest partitions (duty cycle + latency = SLO,
    capacity = the planned rate), which miss first under Poisson arrivals (issue 42, item 1: gpulets
    Fig. 13 by analogy). Here every slot kind is chosen for headroom, in the same model. Departure from
    gpulets (Algorithm 2 packs the fewest GPUs): fewest GPUs is spare capacity "idle", the autoscaling
    objective; serving, the whole fleet is used."""
    problem = fleet.problem
    penalty, keep = problem.options.reconfiguration_penalty, problem.options.variant_change_penalty
    # The accuracy model's variables hold that stage's plan: its accuracy over the instances' traffic, and
    # the running instances it dropped.
    reached = pulp.value(accuracy_model.accuracy_routed) or 0.0
    variants_reached = pulp.value(accuracy_model.variants_changed) or 0.0
    headroom = pulp.LpVariable("headroom", lowBound=1.0, upBound=HEADROOM_MAX)
    model = fleet_model_build(fleet, full_demand=True, name="headroom", demand_scale=headroom)
    _pipelines_pin(model, solution)  # pipelines run as the accuracy stage planned them
    model.lp += model.accuracy_routed >= headroom * (reached - _served_tolerance(reached)), "stage_accuracy"
    if penalty > 0:
        model.lp += model.instances_changed <= solution.instances_changed(fleet), "stage_instances_changed"
    if keep > 0:
        model.lp += model.variants_changed <= variants_reached + 1e-6, "stage_variants_changed"
    model.lp.setObjective(headroom)
    # The accuracy stage's plan at h = 1, its loads re-read at this model's capacities (capped at
    # HEADROOM_MAX x the demand, not at the demand).
    start = dict(solution.values)
    start[headroom.name] = 1.0
    start.update(_scaled_loads(model, fleet, solution.routed, 1.0))
    last, found = stages.run(model, start=start, cap_s=max(MIN_STAGE_SECONDS, outcome.seconds))
    gained = found.values.get(headroom.name, 1.0) if found is not None else 1.0
    if found is None or gained <= 1.0 + 1e-6:
        notes.append("headroom: the accuracy stage's plan kept (no plan found in time that could serve more of every demand)")
        return solution, 1.0
    notes.append(f"headroom: spare slots run instances too; every application but pipelines' stages could be served "
                 f"{gained:.3g}x its demand at the planned accuracy" + ("" if last.state == "optimal" else " (not proved the most in time)"))
    return dataclasses.replace(found, routed={k: r / gained for k, r in found.routed.items()}), gained


def _headroom_target_stage(stages: _Stages, fleet: Fleet, solution: FleetSolution, gained: float, notes: list[str], *,
                           scale: float) -> tuple[SolveOutcome, FleetSolution] | None:
    """`options.headroom_target` h_t above the headroom h_a the most accurate plan leaves: two stages more.
    (1) The largest multiple h* <= h_t of every demand the fleet can serve in full, whatever the accuracy
    (pipelines as the accuracy stage chose them); (2) the most accuracy serving h* x every demand, with the
    accuracy stage's objective (penalties included) measured on the demand itself, its traffic h* times below
    what the instances serve. Returns that stage's outcome (its objective, bound and gap are the plan's) and
    solution, routed at the demand; None when neither stage finds more than h_a in time (the most accurate
    plan is kept).

    Why: the accuracy MILP spends spare capacity on accuracy, down to fractions of a point, and leaves the
    queues at the edge of their latency budget, where service-time noise makes queries late (issue 42,
    item 2: benches/mig_granularity.py at load 0.3, 1.8 % late at h_a = 1.0). Departure from Proteus (§4:
    accuracy is the objective, throughput a constraint): the operator may ask for throughput headroom
    before accuracy; 1 (the default) is Proteus's objective."""
    problem = fleet.problem
    options = problem.options
    target = options.headroom_target
    penalty, keep = options.reconfiguration_penalty, options.variant_change_penalty
    headroom = pulp.LpVariable("headroom", lowBound=gained, upBound=target)
    model = fleet_model_build(fleet, full_demand=True, name="headroom_target", demand_scale=headroom)
    _pipelines_pin(model, solution)
    model.lp.setObjective(headroom)
    start = dict(solution.values)
    start[headroom.name] = gained
    start.update(_scaled_loads(model, fleet, solution.routed, gained))
    most, found = stages.run(model, share=0.5, start=start)
    reached = found.values.get(headroom.name, gained) if found is not None else gained
    if found is None or reached <= gained * (1 + HEADROOM_TARGET_TOL):
        notes.append(f"headroom target {target:g}x: no plan found in time that could serve more than {gained:.3g}x every demand; "
                     "the most accurate plan kept")
        return None
    # A hair below h*, so the accuracy stage is feasible within the solver's tolerances.
    planned = reached * (1 - SERVED_REL_TOL) - SERVED_ABS_TOL
    model = fleet_model_build(fleet, full_demand=True, name="max_accuracy_at_headroom", demand_scale=planned)
    model.lp.setObjective(scale * (model.accuracy_routed * (1 / planned) + (model.accuracy_over_demand - model.accuracy_routed)
                                   - penalty * model.instances_changed - keep * model.variants_changed))
    _pipelines_pin(model, solution)
    start = {name: value for name, value in found.values.items() if name != headroom.name}
    start.update(_scaled_loads(model, fleet, found.routed, planned / reached))
    outcome, accurate = stages.run(model, start=start)
    if accurate is None:
        notes.append(f"headroom target {target:g}x: no plan found in time for the accuracy at {reached:.3g}x every demand; "
                     "the most accurate plan kept")
        return None
    notes.append(f"headroom target {target:g}x: the most accurate plan could serve {gained:.3g}x every demand (pipelines' stages "
                 f"aside); planned for the most accuracy at {reached:.3g}x" + ("" if most.state == "optimal" else " (not proved the most in time)")
                 + "; objective, bound and gap are that stage's, on the demand itself")
    return outcome, dataclasses.replace(accurate, routed={k: r / planned for k, r in accurate.routed.items()})


def _fair_shares_solve(stages: _Stages, fleet: Fleet, tiers: Sequence[Sequence[str]]) -> tuple[dict[str, float], list[SolveState], FleetSolution | None, list[str]]:
    """Max-min fair shares, one priority tier after another (highest first): maximise the smallest served
    fraction z of the tier's applications, then hold each of them at z of its demand (less FAIR_SHARE_TOL)
    while later tiers and stages run. Returns those floors (application -> rps), the stages' states, the
    last stage's solution (a MIP start that satisfies every floor) and notes.

    Why: the served-throughput stage alone maximises the sum over applications, so under overload it
    gives everything to the applications that serve the most queries per slot and can starve another one
    entirely. Proteus (ASPLOS'24, §4 "Solving the MILP") lowers the demand s_q and re-solves; its artifact
    (UMass-LIDS/Proteus, algorithms/ilp.py) keeps Eq. (2) as an equality, so every query type is routed in
    full to devices hosting one of its variants, and relaxes a served-throughput floor `beta` step by
    step until the MILP solves: no query type is left without a device. Departure: an explicit max-min
    stage (exact, no step size) instead of lowering demand, with SLO-policy priorities as strict tiers."""
    floors: dict[str, float] = {}
    states: list[SolveState] = []
    start: FleetSolution | None = None
    notes: list[str] = []
    problem = fleet.plan_problem
    for ti, tier in enumerate(tiers):
        model = fleet_model_build(fleet, full_demand=False, name=f"fair_share_{ti}")
        _fastest_variants_only(model, fleet)
        _constrain_served_floors(model, fleet, floors)
        share = pulp.LpVariable(f"fair_share_{ti}", lowBound=0, upBound=1)
        _constrain_fair_share(model, fleet, tier, share)
        model.lp.setObjective(share)
        # Later stages: the other tiers, max served, accuracy. The last two split their time as before.
        state, solution = _fair_share_raise(stages, fleet, model, share, tier, share_of_time=1.0 / (len(tiers) - ti + 2), start=start)
        if solution is None:
            notes.append(f"fair shares: no solution in time for priority tier {ti + 1} of {len(tiers)}; later tiers get no floor")
            break
        states.append(state)
        reached = _smallest_share(fleet, solution, tier)
        for app_name in tier:
            demand = problem.application(app_name).demand_rps
            floors[app_name] = max(0.0, reached * demand - SERVED_ABS_TOL - FAIR_SHARE_TOL * demand)
        priority = problem.application(tier[0]).priority_tier
        notes.append(f"fair shares: priority {priority} ({', '.join(tier)}): each served at least {reached:.6g} of its demand")
        start = solution
    return floors, states, start, notes


def _smallest_share(fleet: Fleet, solution: FleetSolution, tier: Sequence[str]) -> float:
    """The smallest served fraction of the tier's applications in `solution`."""
    served = solution.served_counted(fleet)
    problem = fleet.plan_problem
    return min(served.get(a, 0.0) / problem.application(a).demand_rps for a in tier)


def _fair_share_raise(stages: _Stages, fleet: Fleet, model: FleetModel, share: pulp.LpVariable, tier: Sequence[str], *,
                      share_of_time: float, start: FleetSolution | None) -> tuple[SolveState, FleetSolution | None]:
    """The largest smallest served fraction z of `tier` (`model` maximises `share`), to the problem's
    mip_gap: a short max-z solve gives an incumbent (lo) and a bound (hi); then, while they are further
    apart than the gap, a probe asks for any plan with z >= max(lo x (1 + gap), lo + FAIR_SHARE_STEP x
    (hi - lo)): found, lo becomes the smallest share it serves; proved infeasible, hi becomes the target;
    no answer in its time (large fleets), max z resumes from the best plan for the rest of the time.

    Why: the max-z objective puts a continuous z on the right of every application's knapsack row (its
    instances' capacity >= z x demand), which HiGHS derives weak cover cuts from, and it closed the last
    few per cent of the gap slowly (small flat 1.3 of benches/planning.py: 19.8 s to a 0.1 % gap, root
    gap 5 %). With z fixed the rows are knapsacks with a constant right-hand side: above the optimum a
    probe is proved infeasible at the root (0.05-0.95 s there), and just below it one is found in 1.4 s;
    that seed's plan now takes 14 s instead of 60. On the 1,000-GPU fleet at load 1.2 probes find plans
    fast but the last ones run out of time, and the stage ends below max z alone (0.872 and 0.896 in
    two runs, against 0.909; a max-z solve resumed after a first one found less, 0.844). Returns the stage's state (optimal when lo and hi meet within the gap) and the best plan found."""
    gap = max(fleet.problem.options.mip_gap, 1e-6)
    deadline = time.perf_counter() + max(MIN_STAGE_SECONDS, share_of_time * (stages.deadline - time.perf_counter()))
    outcome, best = stages.run(model, share=share_of_time * FAIR_SHARE_FIRST_SHARE, start=start)
    if best is None or outcome.state == "optimal":
        return (outcome.state if best is not None else "no-solution"), best
    lo = _smallest_share(fleet, best, tier)
    hi = min(1.0, outcome.bound) if outcome.bound is not None else 1.0
    model.lp.setObjective(pulp.LpAffineExpression() + 0 * share)  # any plan at the target will do
    while hi - lo > gap * max(lo, 1e-9) and time.perf_counter() + MIN_STAGE_SECONDS < deadline:
        target = min(hi, max(lo * (1 + gap), lo + FAIR_SHARE_STEP * (hi - lo)))
        share.lowBound = target
        probe, found = stages.run(model, share=1.0, cap_s=FAIR_SHARE_PROBE_SHARE * (deadline - time.perf_counter()))
        if found is not None:
            lo, best = max(target, _smallest_share(fleet, found, tier)), found
        elif probe.state == "infeasible":
            hi = target
        else:
            # No answer in time (large fleets, a target just below the optimum): max z again, from the
            # best plan, for the rest of the stage's time, as without probes.
            share.lowBound = 0  # the best plan's own z is the probe's target: a valid start
            model.lp.setObjective(share)
            last, found = stages.run(model, share=1.0, start=best, cap_s=deadline - time.perf_counter())
            reached = _smallest_share(fleet, found, tier) if found is not None else lo
            if reached > lo:
                lo, best = reached, found
            if last.bound is not None:
                hi = max(lo, min(hi, last.bound))
            break
    share.lowBound = 0
    return ("optimal" if hi - lo <= gap * max(lo, 1e-9) else "feasible"), best


# --------------------------------------------------------------------------- realisation


def _idle_layouts(fleet: Fleet) -> dict[str, list[str]]:
    """Layouts of MIG GPUs left as they are."""
    return {d.name: [str(p) for p in sorted(d.layout)] for g in fleet.device_classes for d in g.devices if d.mig and d.layout is not None}


def fleet_realise(fleet: Fleet, solution: FleetSolution, *, keep_every_instance: bool = False) -> tuple[list[Assignment], dict[str, list[str]], list[str]]:
    """Hand the counts out to concrete devices and slots: each device class's devices keep their current
    configuration where the counts allow, a CPU host running a pipeline's stage takes the one with the most
    room for replicas, and the others take what is left in name order; instances fill devices one after
    another (so the GPUs used are as few as the counts allow), pipeline replicas on the hosts running the
    pipeline first; and each (slot class, variant)'s traffic is spread evenly over as few instances as
    carry it (`keep_every_instance`, after the headroom stage: over all of them)."""
    problem = fleet.problem
    device_config: list[tuple[DeviceSpec, DeviceConfig]] = []
    homes = _pipeline_homes(fleet)
    replica_keys = {key for keys in fleet.pipeline_slots.values() for key in keys}
    for gi, group in enumerate(fleet.device_classes):
        # Configurations that use the device first, so the same devices are picked run after run.
        order = sorted(range(len(group.configs)), key=lambda ci: (not group.configs[ci].uses_device, ci))
        queue = [ci for ci in order for _ in range(solution.configs_taken.get((gi, ci), 0))]
        unused = next((c for c in group.configs if not c.uses_device), None)
        given: dict[str, DeviceConfig] = {}
        # A CPU host that runs a pipeline's stage now takes the configuration with the most room for
        # replicas, so that the pipeline stays where it runs (a CPU host's running state names one
        # variant, so which configuration it is in now is not known).
        for device in group.devices:
            if device.name in homes and queue:
                ci = max(queue, key=lambda c: sum(1 for slot in group.configs[c].slots if slot.key in replica_keys))
                queue.remove(ci)
                given[device.name] = group.configs[ci]
        # A device whose configuration the plan keeps stays in it (the running ones first): only the rest
        # are handed out in name order.
        for device in sorted(group.devices, key=lambda d: not d.running):
            now = _current_config(fleet, group, device)
            if device.name not in given and now is not None and now in queue:
                queue.remove(now)
                given[device.name] = group.configs[now]
        rest = iter(queue)
        for device in group.devices:
            config = given.get(device.name)
            if config is None:
                ci = next(rest, None)
                config = group.configs[ci] if ci is not None else (unused or group.configs[0])
            device_config.append((device, config))

    # Per slot class, what its slots run: (variant, rate, a pipeline replica's capacity at its batch or None).
    pending: dict[SlotKey, list[tuple[str, float, InstanceCapacity | None]]] = defaultdict(list)
    for (key, variant), count in sorted(solution.instances.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        rate = solution.routed.get((key, variant), 0.0)
        if count <= 0 or rate <= RPS_EPSILON:
            continue
        capacity = fleet.slot_classes[key].capacities[variant].capacity_rps
        needed = count if keep_every_instance else min(count, max(1, math.ceil(rate / capacity - 1e-9)))
        pending[key].extend([(variant, rate / needed, None)] * needed)
    _pipeline_replicas_pend(fleet, solution, pending)

    # First put back what runs now where the plan keeps it (same slot, same variant), and a pipeline's
    # replicas on the hosts that run one of its stages now; then fill the rest: an instance that keeps its
    # variant keeps serving through the rollout, and a pipeline's stages stay side by side.
    chosen: dict[tuple[str, int], tuple[str, float, InstanceCapacity | None]] = {}
    for device, config in device_config:
        running = dict(device.running)
        home = device.name in homes
        for si, slot in enumerate(config.slots):
            current = running.get(device_slot_id(slot.slice or FULL_SLICE, slot.start, is_cpu=device.is_cpu))
            entries = pending.get(slot.key, [])
            match = next((k for k, (variant, _, _) in enumerate(entries) if variant == current), None)
            if match is None and home:
                match = next((k for k, (_, _, replica) in enumerate(entries) if replica is not None), None)
            if match is not None:
                chosen[device.name, si] = entries.pop(match)
    assignments: list[Assignment] = []
    layouts: dict[str, list[str]] = {}
    notes: list[str] = []
    for device, config in device_config:
        placed = 0
        for si, slot in enumerate(config.slots):
            pick = chosen.get((device.name, si)) or (pending[slot.key].pop() if pending.get(slot.key) else None)
            if pick is not None:
                variant, rate, replica = pick
                slot_class = fleet.slot_classes[slot.key]
                slice_name = slot_class.slice_for(problem, variant) if replica is None else str(slot.slice)
                # A CPU host's instances are numbered 0, 1, ... in the order they run, whichever slots they took.
                start = placed if device.is_cpu and slot.start is not None else slot.start
                if replica is not None:
                    # A pipeline replica: at the batch its pipeline's option chose, not the capacity model's.
                    assignments.append(Assignment(device=device.name, slice=slice_name, start=start, variant=variant,
                                                  assigned_rps=rate, capacity=replica))
                elif variant in slot_class.interference_factors or variant in slot_class.duty_cycles_ms:
                    # An MPS partition: its capacity is the configuration's (interference, time-sharing), not the
                    # capacity model's alone on the slice.
                    assignments.append(Assignment(
                        device=device.name, slice=slice_name, start=start, variant=variant, assigned_rps=rate,
                        capacity=slot_class.capacities[variant], duty_cycle_ms=slot_class.duty_cycles_ms.get(variant),
                        interference_factor=slot_class.interference_factors.get(variant, 1.0)))
                else:
                    assignments.append(Assignment(device=device.name, slice=slice_name, start=start, variant=variant, assigned_rps=rate))
                placed += 1
        if config.mps_layout is not None:
            if placed:
                layouts[device.name] = list(config.mps_layout)
            continue
        if not device.mig:
            continue
        if placed and config.mig_off:
            layouts[device.name] = []
            notes.append(f"{device.name}: runs as a whole GPU (slice '{FULL_SLICE}'), MIG disabled")
        elif placed and config.layout is not None:
            layouts[device.name] = [str(p) for p in config.layout]
            if device.layout is not None and tuple(sorted(device.layout)) != tuple(config.layout):
                notes.append(f"{device.name}: layout {' '.join(map(str, sorted(device.layout)))} -> {' '.join(map(str, config.layout))}")
        elif device.layout is not None:
            layouts[device.name] = [str(p) for p in sorted(device.layout)]  # idle: left as it is
    left = sum(len(v) for v in pending.values())
    if left:
        notes.append(f"{left} instance(s) found no slot while realising the solution (solver tolerance); their traffic is dropped")
    return assignments, layouts, notes


def _pipeline_replicas_pend(fleet: Fleet, solution: FleetSolution, pending: dict[SlotKey, list]) -> None:
    """The chosen pipeline options' replicas, each on a slot class of its core count as the solution gives
    them out (`replicas_on`), with an equal share of its stage's traffic."""
    quota = {key: count for key, count in solution.replicas_on.items() if count > 0}
    for name, k in sorted(solution.pipelines.items()):
        option = fleet.pipeline_options[name][k]
        for stage in option.stages:
            rate = option.served_rps.get(stage.application, 0.0) / stage.replicas if stage.replicas else 0.0
            for _ in range(stage.replicas):
                key = next(((c, s) for (c, s), n in quota.items() if c == stage.cores and n > 0), None)
                if key is None:
                    break  # cannot happen in a solution of the model (its pipeline_cores rows); counted as left below
                quota[key] -= 1
                pending[key[1]].append((stage.variant, rate, stage.capacity))


def realisation_pick(candidates: Sequence[Layout], current: Layout | None, diff: Callable[[Layout, Layout], int]) -> tuple[Layout, int]:
    """Among layouts with the same instance counts, the one closest to the current layout (fewest instances
    destroyed plus created), and that distance; the first candidate when there is no current layout."""
    if current is None:
        return candidates[0], 0
    best = min(candidates, key=lambda c: diff(current, c))
    return best, diff(current, best)
