"""The fleet model (issue 40): one configuration MILP for every kind of device a fleet has, instead of a
composition of planners each given its own devices first.

What is chosen, in one optimisation (model.py's counted formulation, its lexicographic fairness-first
objective, status, objective, bound and gap for the whole fleet):
- MIG GPUs: their geometry among every candidate layout (joint.py: Garrison's question answered inside
  Proteus's MILP), or their fixed layout;
- whole GPUs: as Proteus's MILP has them (proteus.py, model.py);
- CPU hosts: Proteus's one instance at the largest profiled core count the host holds, or the host split
  into instances of c cores each for every core count c a variant is profiled at (`_cpu_device_class`):
  the issue's "CPU instances with a core count", so that applications and an ensemble's members share a
  host (mixed core counts on one host only beside pipeline replicas, below);
- MPS GPUs: a configuration per GPU among
  * `mps100`: one model on the whole GPU, batches back to back (gpulets §4.3, a 100 % gpulet);
  * every split into two partitions of the allowed sizes (gpulets §4.3: "split into two gpulets, each
    with a size of p_ideal and 100-p_ideal"; the ideal baseline's (2:8), (4:6), (5:5)), one model per
    partition, each admitted at the interference factor of the worst model that could run on the other
    partition at any batch it could use there (`mps_worst_factor`), and with the GPU's memory split in
    proportion to the partitions;
  * time-shared patterns: each GPU's schedule from gpulets' Algorithm 1 with Algorithm 2 (ATC'22 §4.3,
    §4.5; engine/sharing/scheduling.py) and from squishy bin packing (Nexus, gpulets §2.2), on the fleet's
    MPS GPUs at the whole demand (on a fleet of more than 8, on 8 of them at their share of it): several
    models per partition in rounds of a duty cycle. A pattern offers each of its entries' capacity (a
    batch per round), and any number of GPUs of the type may take it;
  * unused;
- pipelines (thesis P1, FA2 §p1.4): per pipeline a ladder of options, FA2's exact plan (P1.3: per stage
  the batch and replicas with every path within its SLO, engine/solvers/pipelines.py) for 100 %, 95 %,
  ... 5 % of its demand (`PIPELINE_FRACTIONS`), each carrying the same share of every stage's rate (what
  its replicas hold with the pipeline's headroom); at most one option runs (binary y), and its replicas of
  c cores take c-core replica instances of CPU hosts beside the other applications' instances. A CPU
  host may then also run k replica instances and its other cores as one instance or split evenly
  (`_cpu_device_class`), so the composition's plan (FA2 first, the rest of the host to the fleet planner)
  is one the model can choose, and whether a pipeline or another application gets the cores under
  overload is the fairness-first objective's decision, not the order of a composition. A host that runs a
  stage now is a class of its own, and replicas elsewhere count as variant changes, so a re-plan keeps a
  pipeline where it runs;
- random ensembles (Garrison's) and query-sized applications: planned in rows, one application per member
  (engine/solvers/ensembles.py), but each ensemble counted whole as the plan counts it (model.py
  `Fleet.counted_as`: one fair share, served fraction and minimum accuracy over its members' rows, accuracy
  per query), so a member no device runs leaves the ensemble partly served, not every fair share at 0.
So the plan gpulets or SBP makes for the MPS GPUs alone at the whole demand (on up to 8 of them) is one
the model can choose, as is any plan the MIG planners make on the other devices, and the trade-off
between the kinds is the solver's. A composition whose MPS stage saw only the demand left over can hold
a time-shared pattern the model lacks (the departures below).

Once solved, each split partition's factor is derived again against the model that the plan actually
puts beside it, at its batch (`_factors_rederive`): never above the one it was admitted at, since the
worst case covers it, so the batch still meets its SLO and the capacity written is what it is.

Departures, stated:
- gpulets' Algorithm 1 decides partitions greedily per model; here the split of every GPU is a decision
  variable of the MILP, with the interference factor taken at its worst over the possible co-runners (the
  MILP cannot see which model the other partition gets without a pair per column). The patterns carry
  the exact factors of their own co-runners.
- The patterns are generated once, at the whole demand; a column-generation loop (pricing patterns
  against the MILP's duals) would add the time-shared patterns this misses. The bound and gap are those of
  the model over these configurations, which the plan's notes say.
- A pipeline is served at one of the ladder's fractions, not any fraction (a column-generation loop
  could price new fractions against the duals); the bound and gap are over the options offered. Its
  stages keep FA2's choices: the most accurate variant with CPU profiles, on one-core (smallest profiled)
  replicas; IPA's accuracy trade-off is not an option here. A re-plan of a fleet with pipelines starts
  from no running plan (`running_start`).
- A split partition runs at a profiled batch (the interference predictor's operating points, on both sides
  of the pair), not at a batch between two profiled ones as the capacity model allows: the validator may
  warn that a slightly larger interpolated batch would fit (capacity left unused).
- Interference is pairwise, as measured: a split has two partitions; a fixed MPS layout of three or more
  is admitted against the worst model on any other partition."""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, defaultdict
from typing import Iterable, Sequence

from engine.plans.capacity import InstanceCapacity, capacity_for, profile_interpolate
from engine.plans.problem import CPU_DEVICE_TYPE, DeviceSpec, Plan, PlanInstance, Problem
from engine.sharing.interference import InterferencePredictor
from engine.sharing.partitions import mps_slice_name, mps_slice_percent
from engine.sharing.scheduling import (
    InterferenceOracle,
    SharingSchedule,
    elastic_partitioning_schedule,
    gpu_scaling_schedule,
    sbp_schedule,
    whole_gpu_fallback,
)
from engine.solvers.ensembles import ensemble_plan_merge, ensemble_problem_split, split_owners
from engine.solvers.gpulets import interference_predictor_for, sharing_problem_from
from engine.solvers.joint import joint_device_class, joint_device_key
from engine.solvers.model import (
    DeviceClass,
    DeviceConfig,
    DeviceSlot,
    MIN_STAGE_SECONDS,
    Fleet,
    PipelineOption,
    PipelineStageRun,
    SlotClass,
    SlotKey,
    cpu_config,
    devices_group,
    fleet_solve,
    mps_partition_slot_key,
    pipeline_home_hosts,
    unused_config,
)

__all__ = ["fleet_model_fleet", "fleet_model_solve", "mps_worst_factor"]

# The time-shared patterns are scheduled on at most this many MPS GPUs, at their share of the demand.
PATTERN_GPUS = 8
# Relative slack on the latency budget, as the MPS schedulers and the validator allow (1e-9).
_REL = 1e-9
# The fractions of a pipeline's demand FA2 plans it for, each an option of the model (1/20 apart: a
# pipeline's served fraction is one of these, so a fair share can fall short of the continuous one by
# less than 0.05; the bound and gap are over these options).
PIPELINE_FRACTIONS: tuple[float, ...] = tuple(k / 20 for k in range(20, 0, -1))
# Share of the time limit the options' FA2 solves may take together, and the least one solve is given.
PIPELINE_BUDGET_SHARE = 0.2
MIN_PIPELINE_SOLVE_S = 0.2


def _is_mps(device: DeviceSpec) -> bool:
    return device.mps and not device.mig and not device.is_cpu


def _splits(allowed: Iterable[int]) -> list[tuple[int, int]]:
    """Two partitions of allowed sizes filling the GPU, the larger first (gpulets' split of a 100 % gpulet
    into p and 100 - p)."""
    sizes = sorted(p for p in set(allowed) if 0 < p < 100)
    return [(100 - p, p) for p in sizes if p <= 100 - p and (100 - p) in sizes]


class _MpsType:
    """What the model needs about the MPS GPUs of one (type, memory): the variants with MPS profiles there,
    their profiled batches per partition, and the interference oracle (None: none is known)."""

    def __init__(self, problem: Problem, device: DeviceSpec, oracle: InterferenceOracle | None) -> None:
        self.problem = problem
        self.device = device
        self.oracle = oracle
        self._points: dict[tuple[str, int], tuple] = {}
        self._factor_cache: dict[tuple, float | None] = {}
        self._corunners: dict[tuple, list[tuple[str, int]]] = {}
        self.worst_cache: dict[tuple, float | None] = {}
        self.variants = sorted({p.variant for p in problem.profiles
                                if p.device_type == device.type and mps_slice_percent(p.slice) is not None
                                and problem.application(problem.variant(p.variant).application).demand_rps > 0})

    def points(self, variant: str, percent: int) -> tuple:
        key = (variant, percent)
        if key not in self._points:
            self._points[key] = tuple(sorted(self.problem.profiles_for(variant, self.device.type, mps_slice_name(percent)),
                                             key=lambda p: p.batch))
        return self._points[key]

    def budget_ms(self, variant: str) -> float:
        app = self.problem.application(self.problem.variant(variant).application)
        return app.slo_ms * self.problem.options.latency_budget_fraction

    def usable_batches(self, variant: str, percent: int, memory_mb: float | None) -> list[tuple[int, float, float]]:
        """(batch, latency, memory) for every profiled batch that meets the latency budget alone and fits."""
        out = []
        variant_memory = self.problem.variant(variant).memory_mb
        for p in self.points(variant, percent):
            memory = max(p.memory_mb or 0.0, variant_memory)
            if p.latency_ms <= self.budget_ms(variant) * (1 + _REL) and (memory_mb is None or memory <= memory_mb * (1 + _REL)):
                out.append((p.batch, p.latency_ms, memory))
        return out

    def point_key(self, variant: str, batch: int, percent: int) -> tuple:
        """What the oracle's factor depends on for this side of a pair. For the fitted predictor with no
        measured co-run to floor it: the utilisations it reads and the batch and partition (the regression's
        features), so that variants with the same utilisation (a quantised copy of a model, profiled with
        its base's utilisation) are one point; otherwise the variant itself."""
        oracle = self.oracle
        if isinstance(oracle, InterferencePredictor) and oracle.measured_count == 0:
            try:
                u = oracle.utilisation(variant, batch, percent)
            except ValueError:
                return (variant, batch, percent)
            return ("util", u.l2_util_pct, u.dram_util_pct, batch, percent)
        return (variant, batch, percent)

    def corunners(self, percent: int, memory_mb: float | None) -> list[tuple[str, int]]:
        """Every (model, batch) that could run on a partition of `percent` % within `memory_mb`, one per
        distinct operating point."""
        key = (percent, memory_mb)
        if key not in self._corunners:
            seen: dict[tuple, tuple[str, int]] = {}
            for corunner in self.variants:
                for corunner_batch, _, _ in self.usable_batches(corunner, percent, memory_mb):
                    seen.setdefault(self.point_key(corunner, corunner_batch, percent), (corunner, corunner_batch))
            self._corunners[key] = list(seen.values())
        return self._corunners[key]

    def factor(self, variant: str, batch: int, percent: int, corunner: str, corunner_batch: int, corunner_percent: int) -> float | None:
        """The oracle's factor (>= 1), or None where it cannot say (no utilisation measured that far)."""
        if self.oracle is None:
            return 1.0
        key = (variant, batch, percent, corunner, corunner_batch, corunner_percent)
        if key not in self._factor_cache:
            try:
                value: float | None = max(1.0, self.oracle.factor(variant, batch, percent, corunner, corunner_batch, corunner_percent))
            except ValueError:
                value = None
            self._factor_cache[key] = None if value is None or not math.isfinite(value) else value
        return self._factor_cache[key]


def mps_worst_factor(kind: _MpsType, variant: str, batch: int, percent: int, others: Sequence[int], memory_share: dict[int, float | None]) -> float | None:
    """The largest factor of `variant` at `batch` on `percent` % next to any model that could run on the other
    partitions (`others`, in percent) at any batch it could use there; None when some co-runner's factor is
    unknown (the partition is then not offered to this variant at this batch). Computed once per distinct
    operating point (`_MpsType.point_key`): variants that load the memory system alike share it."""
    if kind.oracle is None:
        return 1.0
    key = (kind.point_key(variant, batch, percent), tuple(others), tuple(memory_share.get(o) for o in others))
    cache = kind.worst_cache
    if key not in cache:
        worst: float | None = 1.0
        for other in others:
            for corunner, corunner_batch in kind.corunners(other, memory_share.get(other)):
                value = kind.factor(variant, batch, percent, corunner, corunner_batch, other)
                if value is None:
                    worst = None
                    break
                worst = max(worst, value)
            if worst is None:
                break
        cache[key] = worst
    return cache[key]


def _partition_capacities(kind: _MpsType, percent: int, others: Sequence[int], memory_mb: float | None,
                          memory_share: dict[int, float | None]) -> tuple[dict[str, InstanceCapacity], dict[str, float]]:
    """Per variant: the batch with the most throughput on this partition at its worst-case factor, and that factor."""
    capacities: dict[str, InstanceCapacity] = {}
    factors: dict[str, float] = {}
    for variant in kind.variants:
        best: tuple[InstanceCapacity, float] | None = None
        for batch, latency, memory in kind.usable_batches(variant, percent, memory_mb):
            factor = mps_worst_factor(kind, variant, batch, percent, others, memory_share) if others else 1.0
            if factor is None:
                continue
            slowed = latency * factor
            if slowed > kind.budget_ms(variant) * (1 + _REL):
                continue
            capacity = batch * 1000.0 / slowed
            if best is None or capacity > best[0].capacity_rps:
                best = (InstanceCapacity(batch=batch, latency_ms=slowed, capacity_rps=capacity, memory_mb=memory), factor)
        if best is not None:
            capacities[variant], factors[variant] = best
    return capacities, factors


def _split_config(slots: dict[SlotKey, SlotClass], kind: _MpsType, percents: Sequence[int], *, name: str) -> DeviceConfig:
    """One model per partition of `percents` (largest first), each at its worst-case factor, the memory
    split in proportion to the partitions (two models never need more than the GPU has)."""
    device = kind.device
    alone = len(percents) == 1
    share = {p: (device.memory_mb if alone or device.memory_mb is None else device.memory_mb * p / 100.0) for p in percents}
    config_slots = []
    for index, percent in enumerate(percents):
        key = mps_partition_slot_key(device, percent, percents)
        if key not in slots:
            others = [p for i, p in enumerate(percents) if i != index]
            capacities, factors = _partition_capacities(kind, percent, others, share[percent], share)
            slots[key] = SlotClass(key=key, device=device, slice=mps_slice_name(percent), capacities=capacities,
                                   interference_factors=factors)
        config_slots.append(DeviceSlot(key, mps_slice_name(percent), index))
    return DeviceConfig(name=name, slots=tuple(config_slots), uses_device=True,
                        mps_layout=tuple(f"{mps_slice_name(p)}@{i}" for i, p in enumerate(percents)))


def _pattern_configs(slots: dict[SlotKey, SlotClass], device: DeviceSpec, patterns: Sequence[tuple[str, Sequence[PlanInstance]]]) -> list[DeviceConfig]:
    """A configuration per time-shared pattern: each entry its own slot class (its capacity a batch per
    round, its factor against the pattern's own co-runners)."""
    configs = []
    for name, instances in patterns:
        config_slots = []
        for i, inst in enumerate(instances):
            key: SlotKey = (device.type, device.memory_mb, f"{name}#{i}")
            capacity = InstanceCapacity(batch=inst.batch, latency_ms=inst.latency_ms, capacity_rps=inst.capacity_rps, memory_mb=0.0)
            slots[key] = SlotClass(key=key, device=device, slice=inst.slice, capacities={inst.variant: capacity},
                                   interference_factors={inst.variant: inst.interference_factor},
                                   duty_cycles_ms={inst.variant: inst.duty_cycle_ms} if inst.duty_cycle_ms is not None else {})
            config_slots.append(DeviceSlot(key, inst.slice, inst.start))
        busy = sorted({(mps_slice_percent(i.slice), i.start) for i in instances}, key=lambda s: s[1])
        configs.append(DeviceConfig(name=name, slots=tuple(config_slots), uses_device=True,
                                    mps_layout=tuple(f"mps{p}@{index}" for p, index in busy)))
    return configs


def _schedule_patterns(problem: Problem, devices: Sequence[DeviceSpec], notes: list[str]) -> list[tuple[str, list[PlanInstance]]]:
    """Each GPU's schedule (as plan instances) from gpulets (Algorithms 1 and 2, with the whole-GPU fallback)
    and from SBP, on these MPS GPUs at the whole demand; identical GPU schedules once."""
    sub = dataclasses.replace(problem, devices=tuple(devices))
    sharing, mapping = sharing_problem_from(sub)
    if sharing is None:
        return []
    gpus = len(mapping.devices)
    if gpus > PATTERN_GPUS:
        # A proportional sample: PATTERN_GPUS GPUs at that share of the demand give the same per-GPU mixes
        # as the whole fleet would, at a fixed cost (Algorithm 1 on hundreds of GPUs takes minutes).
        share = PATTERN_GPUS / gpus
        sharing, gpus = sharing.with_rates({m.name: m.rate_rps * share for m in sharing.models}), PATTERN_GPUS
    schedules: list[tuple[str, SharingSchedule]] = [
        ("gpulets", gpu_scaling_schedule(sharing, gpu_limit=gpus, gpus_before=1, scheduler=whole_gpu_fallback(elastic_partitioning_schedule))),
        ("sbp", sbp_schedule(sharing, gpus)),
    ]
    patterns: list[tuple[str, list[PlanInstance]]] = []
    seen: set[tuple] = set()
    for scheduler, schedule in schedules:
        for gpu in schedule.gpus:
            busy = [p for p in gpu.partitions if p.entries]
            if not busy:
                continue
            instances = [
                PlanInstance(device="", slice=mps_slice_name(part.percent), start=index, variant=entry.model, batch=entry.batch,
                             latency_ms=entry.latency_ms, capacity_rps=entry.batch * 1000.0 / part.duty_cycle_ms, assigned_rps=0.0,
                             duty_cycle_ms=part.duty_cycle_ms, interference_factor=entry.interference_factor)
                for index, part in enumerate(busy) for entry in part.entries
            ]
            signature = tuple((i.slice, i.start, i.variant, i.batch, round(i.duty_cycle_ms or 0.0, 9)) for i in instances)
            if signature in seen:
                continue
            seen.add(signature)
            patterns.append((f"{scheduler}-{len(patterns)}", instances))
    if patterns:
        notes.append(f"MPS {devices[0].type}: {len(patterns)} time-shared pattern(s) from gpulets and SBP at the whole demand")
    return patterns


def _mps_device_class(slots: dict[SlotKey, SlotClass], kind: _MpsType, devices: tuple[DeviceSpec, ...],
                      patterns: Sequence[tuple[str, Sequence[PlanInstance]]]) -> DeviceClass:
    device = devices[0]
    if device.fixed_layout and device.mps_layout is not None:
        percents = sorted(device.mps_layout, reverse=True)
        configs = [_split_config(slots, kind, percents, name="fixed")] if percents else []
        return DeviceClass(devices, tuple(configs) + (unused_config(),), is_gpu=True)
    configs = []
    if 100 in device.mps_partitions:
        configs.append(_split_config(slots, kind, [100], name="mps100"))
    configs += [_split_config(slots, kind, list(split), name=f"mps{split[0]}+{split[1]}") for split in _splits(device.mps_partitions)]
    configs += _pattern_configs(slots, device, patterns)
    return DeviceClass(devices, tuple(configs) + (unused_config(),), is_gpu=True)


def _cpu_core_slot(slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec, cores: int) -> SlotKey:
    """The slot class of a `cores`-core instance on a CPU host: the variants profiled at exactly that many
    cores, at the capacity their profile gives there (a CPU host has no memory limit per instance)."""
    key: SlotKey = (device.type, device.memory_mb, f"{cores}-core")
    if key not in slots:
        capacities: dict[str, InstanceCapacity] = {}
        for variant in problem.variants:
            if not problem.profiles_for(variant.name, CPU_DEVICE_TYPE, str(cores)):
                continue
            capacity = capacity_for(problem, variant.name, device, str(cores))
            if capacity is not None and capacity.capacity_rps > 0:
                capacities[variant.name] = capacity
        slots[key] = SlotClass(key=key, device=device, slice=str(cores), capacities=capacities)
    return key


def _pipeline_replica_slot(slots: dict[SlotKey, SlotClass], devices: tuple[DeviceSpec, ...], cores: int) -> SlotKey:
    """The slot class of a pipeline replica of `cores` cores on the hosts of one class: a class of its own
    (no other application's variant runs on it), so that the model can tell which hosts its replicas
    take (`model._pipeline_replicas_moved`)."""
    device = devices[0]
    key: SlotKey = (device.type, device.memory_mb, f"{cores}-core pipeline replica on {device.name}'s class")
    if key not in slots:
        slots[key] = SlotClass(key=key, device=device, slice=str(cores), capacities={})
    return key


def _cpu_device_class(slots: dict[SlotKey, SlotClass], problem: Problem, devices: tuple[DeviceSpec, ...],
                      pipeline_cores: Iterable[int] = (), replica_slots: dict[int, list[SlotKey]] | None = None) -> DeviceClass:
    """A CPU host's configurations: Proteus's one instance at the largest profiled core count it holds
    (`cpu_config`), and, for every core count c some variant with demand is profiled at, the host split
    into floor(cores / c) instances of c cores each (numbered 0, 1, ... on the host), so that several
    applications, or an ensemble's members, can share a host. With pipelines in the model (their replicas
    of `pipeline_cores` cores each), also every host with k replica instances of c_p cores (k >= 1) and
    the cores left as one instance or split into equal ones, as above: a composition that gives a
    pipeline its replicas first and the rest of the host to another planner is one of these. Replica
    instances are slots of their own (`_pipeline_replica_slot`, added to `replica_slots` by core count).
    `problem` holds the variants that are not pipeline stages."""
    device = devices[0]
    total = device.cores or 0
    configs = [cpu_config(slots, problem, device)]
    with_demand = {v.name for v in problem.variants if problem.application(v.application).demand_rps > 0}
    counts = sorted({int(p.slice) for p in problem.profiles
                     if p.device_type == CPU_DEVICE_TYPE and p.variant in with_demand and p.slice.isdigit() and 1 <= int(p.slice) <= total})
    for cores in counts:
        n = total // cores
        if n < 2:
            continue  # one instance of the host: the first configuration holds it
        key = _cpu_core_slot(slots, problem, device, cores)
        if slots[key].capacities:
            configs.append(DeviceConfig(name=f"cpu{n}x{cores}", slots=tuple(DeviceSlot(key, str(cores), i) for i in range(n)), uses_device=False))
    seen = {tuple(sorted(Counter(s.key for s in c.slots).items())) for c in configs}
    for replica_cores in sorted(set(pipeline_cores)):
        replica_key = _pipeline_replica_slot(slots, devices, replica_cores)
        if replica_slots is not None and total >= replica_cores:
            replica_slots.setdefault(replica_cores, []).append(replica_key)
        for k in range(1, total // replica_cores + 1):
            left = total - k * replica_cores
            rests: list[tuple[str, list[tuple[SlotKey, str | None]]]] = [("", [])]
            if left > 0:
                rest = cpu_config(slots, problem, dataclasses.replace(device, cores=left))
                if slots[rest.slots[0].key].capacities:
                    rests.append((f"+cpu{left}", [(rest.slots[0].key, None)]))
                for cores in (c for c in counts if c <= left):
                    key = _cpu_core_slot(slots, problem, device, cores)
                    if slots[key].capacities:
                        rests.append((f"+{left // cores}x{cores}", [(key, str(cores))] * (left // cores)))
            for label, rest_slots in rests:
                members = [(replica_key, str(replica_cores))] * k + rest_slots
                shape = tuple(sorted(Counter(key for key, _ in members).items()))
                if shape in seen:
                    continue
                seen.add(shape)
                configs.append(DeviceConfig(name=f"pipe{k}x{replica_cores}{label}", uses_device=False,
                                            slots=tuple(DeviceSlot(key, slice_name, i) for i, (key, slice_name) in enumerate(members))))
    return DeviceClass(devices, tuple(configs), is_gpu=False)


def _mps_oracle(problem: Problem, devices: Sequence[DeviceSpec], notes: list[str]) -> InterferenceOracle | None:
    variants = {p.variant for p in problem.profiles if p.device_type == devices[0].type and mps_slice_percent(p.slice) is not None}
    return interference_predictor_for(problem, devices[0].type, variants, notes) if variants else None


def fleet_model_fleet(problem: Problem) -> Fleet:
    """The fleet's device classes and configurations (see the module docstring)."""
    return _fleet_build(problem)[0]


def _pipeline_options_build(problem: Problem, notes: list[str]) -> dict[str, list[PipelineOption]]:
    """Per pipeline with demand, its options: FA2's plan (P1.3, exact) at each fraction of PIPELINE_FRACTIONS
    of its demand, each carrying the same fraction of every stage's rate (the smallest over its stages of
    capacity / (headroom x rate), at most 1), without repeats and without options another one beats (as
    much traffic or more on no more replicas of any core count)."""
    from engine.solvers.pipelines import pipeline_fa2_at, replica_capacity

    hosts = [d for d in problem.devices if d.is_cpu]
    host_cores = max((d.cores or 0 for d in hosts), default=0)
    pipelines = [p for p in problem.pipelines if any(q.demand_rps > 0 for q in p.paths)]
    out: dict[str, list[PipelineOption]] = {}
    if not pipelines:
        return out
    budget = PIPELINE_BUDGET_SHARE * problem.options.time_limit_s / (len(pipelines) * len(PIPELINE_FRACTIONS))
    # The options together stop at their share of the time limit (the whole demand is always tried).
    deadline = time.perf_counter() + PIPELINE_BUDGET_SHARE * problem.options.time_limit_s
    headroom = problem.options.pipeline_headroom
    for spec in pipelines:
        options: list[PipelineOption] = []
        if host_cores <= 0:
            notes.append(f"pipeline {spec.name}: the fleet has no CPU host; pipelines run on CPU hosts")
            out[spec.name] = options
            continue
        for fraction in PIPELINE_FRACTIONS:
            if fraction < 1.0 and time.perf_counter() > deadline:
                notes.append(f"pipeline {spec.name}: options below {fraction:g} of its demand not made (their share of the time limit is spent)")
                break
            outcome = pipeline_fa2_at(problem, spec, fraction, host_cores=host_cores, time_limit_s=max(MIN_PIPELINE_SOLVE_S, budget))
            if not outcome.picks or outcome.status not in ("optimal", "feasible"):
                if fraction == 1.0:
                    notes.extend(f"pipeline {spec.name}: {n}" for n in outcome.notes)
                continue
            stages = tuple(PipelineStageRun(p.application, p.variant, p.cores, p.batch, p.replicas, replica_capacity(problem, p))
                           for p in outcome.picks)
            carried = min((min(1.0, st.replicas * st.capacity.capacity_rps / (headroom * spec.stage_rate(st.application)))
                           for st in stages if spec.stage_rate(st.application) > 0), default=0.0)
            if carried <= 0:
                continue
            options.append(PipelineOption(spec.name, f"fa2@{fraction:g}", stages,
                                          {st.application: carried * spec.stage_rate(st.application) for st in stages}, source=outcome))
        out[spec.name] = _options_undominated(options)
        notes.append(f"pipeline {spec.name}: {len(out[spec.name])} option(s) from FA2 at fractions of its demand")
    return out


def _options_undominated(options: list[PipelineOption]) -> list[PipelineOption]:
    """Options no other one beats: as much traffic or more on no more replicas of any core count (the
    first of equals kept)."""
    def beats(a: PipelineOption, b: PipelineOption) -> bool:
        served_a, served_b = sum(a.served_rps.values()), sum(b.served_rps.values())
        ra, rb = a.replicas_by_cores(), b.replicas_by_cores()
        return served_a >= served_b - 1e-9 and all(ra[c] <= rb[c] for c in set(ra) | set(rb))

    kept: list[PipelineOption] = []
    for i, option in enumerate(options):
        if not any(beats(other, option) and (j < i or not beats(option, other)) for j, other in enumerate(options) if j != i):
            kept.append(option)
    return kept


def _flat(problem: Problem, staged: set[str]) -> Problem:
    """The problem whose variants are those of applications outside pipelines: what slots may run."""
    return dataclasses.replace(problem, variants=tuple(v for v in problem.variants if v.application not in staged))


def _fleet_build(problem: Problem) -> tuple[Fleet, dict[str, _MpsType]]:
    """The fleet, and per MPS device type one of its `_MpsType`s: the interference oracle and the factors it
    computed, which `_factors_rederive` reads again after the solve."""
    slots: dict[SlotKey, SlotClass] = {}
    classes: list[DeviceClass] = []
    notes: list[str] = []
    pipeline_options = _pipeline_options_build(problem, notes)
    staged = {st.application for p in problem.pipelines if p.name in pipeline_options for st in p.stages}
    full = problem
    problem = _flat(problem, staged) if staged else problem
    pipeline_cores = sorted({st.cores for options in pipeline_options.values() for o in options for st in o.stages})
    pipeline_slots: dict[int, list[SlotKey]] = {}
    # A CPU host that runs a pipeline's stage now is a class of its own, so that the model can keep the
    # pipeline's replicas there (`model._pipeline_replicas_moved`).
    homes = pipeline_home_hosts(full, staged)
    groups = devices_group(problem.devices, lambda d: (*joint_device_key(d), d.name in homes))
    mps_by_type: dict[str, list[DeviceSpec]] = defaultdict(list)
    for devices in groups:
        if _is_mps(devices[0]):
            mps_by_type[devices[0].type].extend(devices)
    oracles = {t: _mps_oracle(problem, devices, notes) for t, devices in mps_by_type.items()}
    patterns = {t: _schedule_patterns(problem, devices, notes) for t, devices in mps_by_type.items()}
    kinds: dict[str, _MpsType] = {}
    for devices in groups:
        device = devices[0]
        if _is_mps(device):
            # Patterns were scheduled within the smallest memory of the type: offered where the partitions are allowed.
            fits = [p for p in patterns[device.type] if all(mps_slice_percent(i.slice) in device.mps_partitions for i in p[1])]
            kind = _MpsType(problem, device, oracles[device.type])
            kinds.setdefault(device.type, kind)
            classes.append(_mps_device_class(slots, kind, devices, fits))
        elif device.is_cpu:
            classes.append(_cpu_device_class(slots, problem, devices, pipeline_cores, pipeline_slots))
        else:
            classes.append(joint_device_class(slots, problem, devices))
    fleet = Fleet(problem=full, device_classes=classes, slot_classes=slots, notes=notes, pipeline_options=pipeline_options,
                  pipeline_slots=dict(pipeline_slots), pipeline_summarise=_pipeline_summarise)
    return fleet, kinds


def _pipeline_summarise(problem: Problem, option: PipelineOption, placed: list[PlanInstance]) -> dict:
    """A chosen option's summary, as FA2's planner writes it, with the share of the demand it carries."""
    from engine.solvers.pipelines import pipeline_summary

    summary = pipeline_summary(problem, option.source, placed)
    spec = next(p for p in problem.pipelines if p.name == option.pipeline)
    rates = [(option.served_rps[st.application], spec.stage_rate(st.application)) for st in option.stages if spec.stage_rate(st.application) > 0]
    summary["option"] = option.label
    summary["served_fraction"] = min((served / rate for served, rate in rates), default=0.0)
    return summary


def _factors_rederive(problem: Problem, plan: Plan, kinds: dict[str, _MpsType]) -> Plan:
    """Each split partition's factor against the model the plan puts beside it, at the batch it runs
    (never above the worst case it was admitted at): its latency and capacity as they will be. `kinds`: the
    `_MpsType` the fleet was built with, per device type (its oracle and factors; neither depends on memory)."""
    by_device: dict[str, list[PlanInstance]] = defaultdict(list)
    for inst in plan.instances:
        if mps_slice_percent(inst.slice) is not None and inst.duty_cycle_ms is None:
            by_device[inst.device].append(inst)
    if not by_device:
        return plan
    changed: dict[int, PlanInstance] = {}
    for device_name, instances in by_device.items():
        kind = kinds[problem.device(device_name).type]
        for inst in instances:
            if inst.interference_factor <= 1.0:
                continue
            neighbours = [o for o in instances if o is not inst and o.start != inst.start]
            factor = 1.0
            for other in neighbours:
                value = kind.factor(inst.variant, inst.batch, mps_slice_percent(inst.slice), other.variant, other.batch,
                                    mps_slice_percent(other.slice))
                factor = max(factor, value if value is not None else inst.interference_factor)
            if factor >= inst.interference_factor:
                continue
            profiled = profile_interpolate(kind.points(inst.variant, mps_slice_percent(inst.slice)), inst.batch, "latency_ms")
            if profiled is None:
                continue
            latency = profiled * factor
            changed[id(inst)] = dataclasses.replace(inst, interference_factor=factor, latency_ms=latency,
                                                    capacity_rps=inst.batch * 1000.0 / latency)
    if changed:
        plan.instances = [changed.get(id(i), i) for i in plan.instances]
    return plan


def fleet_model_solve(problem: Problem) -> Plan:
    """Plan every device of `problem` in one MILP (see the module docstring), within its time limit counted
    from now: building the configurations and the pipelines' options is part of it."""
    started = time.perf_counter()
    original = problem
    # In rows: one application per ensemble member, counted back per ensemble (`Fleet.counted`), so an
    # ensemble's fair share, served traffic and accuracy are the plan's own (engine/solvers/ensembles.py).
    problem = ensemble_problem_split(problem)
    fleet, kinds = _fleet_build(problem)
    left = max(MIN_STAGE_SECONDS, problem.options.time_limit_s - (time.perf_counter() - started))
    fleet.problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, time_limit_s=left))
    if problem is not original:
        fleet.counted, fleet.counted_as = original, split_owners(original)
    # Spare capacity "idle": the fewest GPUs at the plan's accuracy (the autoscaling objective); otherwise
    # the whole fleet is used for headroom (model.py `_headroom_stage`), then the fill spreads the traffic.
    plan = fleet_solve(fleet, solver_name="fleet", fewest_gpus_last=True, headroom_last=problem.options.spare_capacity != "idle")
    plan = _factors_rederive(problem, plan, kinds)
    if problem is not original:
        plan = ensemble_plan_merge(original, plan, whole=True)
    plan.solve_seconds = time.perf_counter() - started
    if any(_is_mps(d) for d in problem.devices) or fleet.pipeline_options:
        plan.notes.append("fleet model: the bound and gap are over the configurations offered (every MIG geometry, whole GPU, "
                          "CPU host whole or split into equal instances of a profiled core count, MPS split with one model per "
                          "partition, and the time-shared MPS patterns listed above) and the pipelines' options (FA2's plans at "
                          "fractions of their demand)")
    return plan
