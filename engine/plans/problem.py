"""Planning problems and plans: typed values, read from and written to the versioned JSON formats
documented in `schemas/problem.schema.json` and `schemas/plan.schema.json`.

A problem says what must be served (applications with demand and SLO), with what (variants with accuracy
and memory, profiles of latency per batch size on a device type and slice) and where (devices: MIG GPUs,
MPS GPUs, whole GPUs, CPU hosts). An MPS GPU (gpulets, ATC'22) is split into partitions that each get a
percent of its SMs (slice "mps50"), add up to at most 100 % and share its memory; several models may
time-share one partition, each running one batch per round (`PlanInstance.duty_cycle_ms`).

A plan says which variant runs on which instance with which batch size, how each application's traffic is
split, and how good that is (effective accuracy, served throughput, solver status and gap)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Literal, Mapping

from engine.ensembles.policy import EnsembleError, EnsemblePolicy, ensemble_policy_from_dict, ensemble_policy_to_dict
from engine.geometry.catalogue import CatalogueError, GpuModelSpec, gpu_model_from_nvml, mig_catalogue_extended, mig_catalogue_load
from engine.geometry.layout import Placement, layout_parse
from engine.sharing.partitions import (
    MPS_PARTITIONS_DEFAULT,
    mps_layout_format,
    mps_layout_of,
    mps_layout_parse,
    mps_layout_validate,
    mps_slice_percent,
)

PROBLEM_FORMAT_VERSION = 1
PLAN_FORMAT_VERSION = 1

FULL_SLICE = "full"
CPU_DEVICE_TYPE = "cpu"

Objective = Literal["max-accuracy", "min-gpus"]
SolverName = Literal["highs", "cbc"]
PlanStatus = Literal["optimal", "feasible", "infeasible"]
OBJECTIVES: tuple[str, ...] = ("max-accuracy", "min-gpus")
SOLVERS: tuple[str, ...] = ("highs", "cbc")
SpareCapacity = Literal["fill", "artefact", "idle"]
SPARE_CAPACITY: tuple[str, ...] = ("fill", "artefact", "idle")
# The most headroom (a multiple of every demand) the fleet planner's headroom stages plan for, and the
# largest `options.headroom_target`.
HEADROOM_MAX = 10.0


class ProblemError(ValueError):
    """The problem is malformed or inconsistent; the message names the offending item."""


# An SLO policy's priority (0..100, higher is served first when demand exceeds capacity); applications
# without one share the default tier.
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class ApplicationSpec:
    name: str
    slo_ms: float
    demand_rps: float
    min_accuracy: float | None = None
    # None = DEFAULT_PRIORITY. Under overload, higher tiers are served first; within a tier the planners
    # maximise the smallest served fraction (see `engine/solvers/model.py`, "fair shares").
    priority: int | None = None
    # D[b] of Garrison's Algorithm 1 (DAC'24 §4.2): how the sizes of the queries (the rows a client sends in
    # one request) are distributed, as (size, probability) pairs summing to 1; None: every query one row.
    query_sizes: tuple[tuple[int, float], ...] | None = None
    # The application's ensemble policy (engine/ensembles/policy.py); None: one variant per query, as the
    # plan's routing splits the traffic.
    ensemble: EnsemblePolicy | None = None

    @property
    def priority_tier(self) -> int:
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def mean_query_size(self) -> float:
        return sum(b * p for b, p in self.query_sizes) if self.query_sizes else 1.0

    @property
    def load_factor(self) -> float:
        """Rows the instances serve per query: the mean query size times the mean ensemble size (each member
        of a random ensemble serves the whole query). A plan's `assigned_rps` counts rows, its `served_rps`
        queries: served = assigned / load_factor (1 for one-row queries answered by one variant)."""
        members = 1.0 if self.ensemble is None or self.ensemble.mode == "single" else self.ensemble.mean_size
        return self.mean_query_size * members


@dataclass(frozen=True)
class PipelineStageSpec:
    """A stage of a pipeline: an application, its variant pinned (`variant`) or left to the planner (None),
    and the largest batch it may run."""

    application: str
    variant: str | None = None
    max_batch: int = 64
    # How the router builds this stage's request from the previous stage's answer: (input, output) pairs,
    # this stage's input named after the previous stage's output. Empty: each output forwarded under its
    # own name.
    inputs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PipelinePathSpec:
    """An execution path (thesis P1, Table P1.1): the stages a query visits in order, its end-to-end SLO
    and its rate."""

    name: str
    stages: tuple[str, ...]
    slo_ms: float
    demand_rps: float


@dataclass(frozen=True)
class PipelineSpec:
    """A DAG of stages (applications) served as one request path, planned as a whole by the `fa2` and `ipa`
    solvers (engine/solvers/pipelines.py). Every path starts at the same stage, the pipeline's entry; paths
    may share stages and join (fan-in). `alpha`, `beta` and `delta` weigh accuracy, cores and batch in IPA's
    objective (P3.9); `ipa_threshold_rps` is the throughput th one replica must reach at its base allocation
    (P3.1b)."""

    name: str
    stages: tuple[PipelineStageSpec, ...]
    paths: tuple[PipelinePathSpec, ...]
    alpha: float = 1.0
    beta: float = 0.01
    delta: float = 1e-6
    ipa_threshold_rps: float = 0.0

    def stage(self, application: str) -> PipelineStageSpec:
        return next(s for s in self.stages if s.application == application)

    @property
    def entry(self) -> str:
        return self.paths[0].stages[0]

    def stage_rate(self, application: str) -> float:
        """The summed demand of every path through the stage."""
        return sum(p.demand_rps for p in self.paths if application in p.stages)

    @property
    def is_chain(self) -> bool:
        return len(self.paths) == 1 and len(self.paths[0].stages) == len(self.stages)


@dataclass(frozen=True)
class VariantSpec:
    name: str
    application: str
    accuracy: float  # 0..1
    memory_mb: float  # weights and workspace at batch 1


@dataclass(frozen=True)
class DeviceSpec:
    """One device. `type` is a GPU model (a MIG catalogue name for MIG GPUs), any other GPU name, or
    `cpu`. `layout` is the current MIG geometry, `mps_layout` the current MPS partitions (percents, largest
    first) of an MPS GPU; with `fixed_layout` the planner must keep whichever the device has."""

    name: str
    type: str
    mig: bool = False
    layout: tuple[Placement, ...] | None = None
    fixed_layout: bool = False
    memory_mb: float | None = None  # needed for GPUs outside the MIG catalogue
    cores: int | None = None  # CPU devices
    # What runs there now, as (slot, variant) pairs, sorted: slot "3g.20gb@4" on MIG GPUs, "mps60@0" on MPS
    # GPUs (one pair per model time-sharing the partition), "full" on whole GPUs, "cpu" on CPU hosts.
    # Planners prefer keeping it when it costs nothing (see variant_change_penalty).
    running: tuple[tuple[str, str], ...] = ()
    # MPS partitioning (gpulets): the shares (percent of the SMs) allowed on this GPU, and its current
    # layout as percents, largest first (None: unknown or none; () an MPS GPU with no partition yet).
    mps: bool = False
    mps_partitions: tuple[int, ...] = MPS_PARTITIONS_DEFAULT
    mps_layout: tuple[int, ...] | None = None

    @property
    def is_cpu(self) -> bool:
        return self.type == CPU_DEVICE_TYPE

    @property
    def partitioning(self) -> Literal["mig", "mps", "none"]:
        """How the device is split: MIG instances, MPS partitions, or not at all (whole GPUs, CPUs)."""
        if self.mig:
            return "mig"
        return "mps" if self.mps else "none"


@dataclass(frozen=True)
class ProfilePoint:
    """Latency of a whole batch. `slice` is a MIG profile, `full` for a whole GPU, "mpsNN" for an MPS
    partition of NN % of a GPU's SMs, or the number of cores (as text, e.g. "4") on a CPU."""

    variant: str
    device_type: str
    slice: str
    batch: int
    latency_ms: float
    memory_mb: float | None = None
    # MPS partitions: the model's L2 and DRAM bandwidth utilisation (percent) alone at this batch and
    # partition, the features of the interference model (gpulets §4.4; `Problem.interference`).
    l2_util_pct: float | None = None
    dram_util_pct: float | None = None


@dataclass(frozen=True)
class InterferenceSpec:
    """A fitted co-run interference model (engine/sharing/interference.py): its form and coefficients, as
    `InterferenceModel` holds them. The MPS planners predict each co-location's slowdown with it from the
    profiles' utilisations; without it they plan as if partitions did not interfere, and say so."""

    form: str
    coefficients: tuple[float, ...]


@dataclass(frozen=True)
class SolveOptions:
    objective: Objective = "max-accuracy"
    time_limit_s: float = 30.0
    mip_gap: float = 0.0
    solver: SolverName = "highs"
    threads: int | None = None
    # Joint planner: cost per MIG instance destroyed or created, in the objective's units per instance.
    reconfiguration_penalty: float = 0.0
    # Cost per instance whose variant differs from what runs there now, in effective-accuracy units: each
    # change reloads a model, and the instance serves nothing meanwhile, so a re-plan should change a
    # variant only for a real gain. 1e-4 (a hundredth of an accuracy point per change) against 1e-6, on
    # Proteus's bursty trace (benches/proteus_traces.py's setting): 89 models loaded instead of 108 and
    # 0.032 violations instead of 0.037 (medium-normal load: 0.020 instead of 0.030); 1e-3 cost 0.3 points
    # of accuracy there.
    variant_change_penalty: float = 1e-4
    # Capacity model: the largest batch whose latency fits this fraction of the SLO (Proteus, after Nexus).
    latency_budget_fraction: float = 0.5
    # MILP planners, max-accuracy: "fill" gives every device the solver left idle an instance and spreads
    # each application's traffic to keep its busiest instance furthest from full, at the solver's accuracy
    # (engine/solvers/spare.py); "artefact" fills as Proteus's artefact does and spreads traffic evenly
    # over an application's instances, as it does; "idle" leaves them idle (the paper's Eq. (1)).
    spare_capacity: SpareCapacity = "fill"
    # Pipeline planners (fa2, ipa): replicas are sized for this multiple of each stage's rate, so that
    # Poisson bursts above the mean do not queue past the SLO. 1.25 after benches/pipelines.py: plans sized
    # for the exact rate violated 2.3-21.7 % of queries in simulation, with 1.25x headroom at most 0.45 %.
    pipeline_headroom: float = 1.25
    # The fleet planner with spare capacity "fill", max-accuracy: when the most accurate plan could serve less
    # than this multiple of every demand, it plans for accuracy at the largest multiple up to this that the
    # fleet can serve: headroom first, the most accuracy within it (model.py `_headroom_target_stage`).
    # 1 (the default) keeps Proteus's objective: the most accurate plan, with the headroom left at that
    # accuracy. Why an option: at low load the most accurate plan runs slow variants on small slices at
    # the edge of their latency budget, where service-time noise makes queries late (benches/
    # mig_granularity.py, load 0.3: 1.8 % of queries late, against 0.07 % at 1.5).
    headroom_target: float = 1.0


@dataclass(frozen=True)
class Problem:
    applications: tuple[ApplicationSpec, ...]
    variants: tuple[VariantSpec, ...]
    devices: tuple[DeviceSpec, ...]
    profiles: tuple[ProfilePoint, ...]
    options: SolveOptions = field(default_factory=SolveOptions)
    interference: InterferenceSpec | None = None
    pipelines: tuple[PipelineSpec, ...] = ()
    # MIG GPU models the catalogue lacks, described from the NVML profile tables their agents reported
    # (`gpu_models` in the JSON form); plan_solve and plan_validate plan and check with them.
    gpu_models: tuple[GpuModelSpec, ...] = ()

    def pipeline_of(self, application: str) -> PipelineSpec | None:
        """The pipeline the application is a stage of, if any (an application is a stage of at most one)."""
        return next((p for p in self.pipelines if any(s.application == application for s in p.stages)), None)

    def application(self, name: str) -> ApplicationSpec:
        return self._apps[name]

    def variant(self, name: str) -> VariantSpec:
        return self._variants[name]

    def device(self, name: str) -> DeviceSpec:
        return self._devices[name]

    def variants_of(self, application: str) -> tuple[VariantSpec, ...]:
        return tuple(v for v in self.variants if v.application == application)

    def profiles_for(self, variant: str, device_type: str, slice_name: str) -> tuple[ProfilePoint, ...]:
        return self._profile_index.get((variant, device_type, slice_name), ())

    @property
    def total_demand_rps(self) -> float:
        return sum(a.demand_rps for a in self.applications)

    def __post_init__(self) -> None:
        # Lookup tables are derived data; frozen dataclasses need object.__setattr__ for them.
        object.__setattr__(self, "_apps", {a.name: a for a in self.applications})
        object.__setattr__(self, "_variants", {v.name: v for v in self.variants})
        object.__setattr__(self, "_devices", {d.name: d for d in self.devices})
        index: dict[tuple[str, str, str], list[ProfilePoint]] = {}
        for p in self.profiles:
            index.setdefault((p.variant, p.device_type, p.slice), []).append(p)
        object.__setattr__(self, "_profile_index", {k: tuple(sorted(v, key=lambda p: p.batch)) for k, v in index.items()})
        object.__setattr__(self, "capacity_cache", {})  # filled by capacity.capacity_for


@dataclass(frozen=True)
class VerticalScaling:
    """In-place vertical scaling of one CPU instance (thesis P2 Sponge, P4 Biscale; issue 19): the agent's
    fast loop (workers/agent/vertical.py) re-sizes the running instance every second between `min_cores`
    and `max_cores`, batch up to `max_batch`, by Sponge's rule (engine/vertical/controller.py) on the
    latency model l(b, c) = gamma1*b/c + eps1/c + delta1*b + eta1 ms fitted from the variant's CPU profiles.
    A pipeline stage keeps `reserve_ms` of every request's remaining budget for the stages after it (their
    planned time). The plan's own size (the instance's slice and batch) is where it starts."""

    policy: str  # "sponge" (flat applications) or "biscale" (pipeline stages)
    gamma1: float
    eps1: float
    delta1: float
    eta1: float
    min_cores: int
    max_cores: int
    max_batch: int
    reserve_ms: float = 0.0

    def to_desired(self) -> dict[str, Any]:
        """The runtime's `vertical` block in a desired state (what the agent reads)."""
        return {"policy": self.policy, "model": {"gamma1": self.gamma1, "eps1": self.eps1, "delta1": self.delta1, "eta1": self.eta1},
                "min_cores": self.min_cores, "max_cores": self.max_cores, "max_batch": self.max_batch, "reserve_ms": self.reserve_ms}


@dataclass(frozen=True)
class PlanInstance:
    device: str
    slice: str  # MIG profile, "full", "mpsNN" (an MPS partition of NN %), or CPU cores as text
    # MIG placement start; an MPS partition's index in the plan's layout of the device (largest first);
    # None for whole GPUs and CPUs
    start: int | None
    variant: str
    batch: int
    latency_ms: float  # of one batch, interference included
    capacity_rps: float
    assigned_rps: float
    # MPS partitions only. The round length of a partition whose models time-share it (Nexus, gpulets: every
    # round each model runs one batch), so capacity is batch / duty cycle; None: the model runs alone, batches
    # back to back, and capacity is batch / latency.
    duty_cycle_ms: float | None = None
    # The planner's predicted slowdown from the model on the GPU's other partition (>= 1; latency_ms
    # already includes it).
    interference_factor: float = 1.0
    # CPU instances the agent may resize in place (solvers sponge and biscale); None: a fixed size.
    vertical: VerticalScaling | None = None

    @property
    def id(self) -> str:
        if mps_slice_percent(self.slice) is not None:
            # Several models share an MPS partition, so the variant is part of the id.
            return f"{self.device}/{self.slice}@{self.start}/{self.variant}"
        where = f"{self.slice}@{self.start}" if self.start is not None else self.slice
        return f"{self.device}/{where}"


@dataclass(frozen=True)
class RouteEntry:
    instance: str  # PlanInstance.id
    weight: float


@dataclass
class Plan:
    status: PlanStatus
    solver: str
    objective_kind: Objective
    objective: float | None
    bound: float | None
    gap: float | None
    solve_seconds: float
    effective_accuracy: float | None  # over all served traffic
    served_rps: dict[str, float]
    shortfall_rps: dict[str, float]
    instances: list[PlanInstance]
    routing: dict[str, list[RouteEntry]]
    # MIG GPUs: device -> ["3g.20gb@0", ...] the plan wants; MPS GPUs: device -> its partitions as slots,
    # largest first and indexed 0..n-1, e.g. ["mps60@0", "mps40@1"]
    layouts: dict[str, list[str]]
    accuracy_by_application: dict[str, float] = field(default_factory=dict)
    gpus_used: int = 0
    notes: list[str] = field(default_factory=list)
    # Pipeline planners (fa2, ipa): per pipeline, each stage's variant, batch, replicas and latency budget,
    # and each path's predicted end-to-end latency against its SLO (engine/solvers/pipelines.py).
    pipelines: dict[str, Any] = field(default_factory=dict)

    @property
    def total_served_rps(self) -> float:
        return sum(self.served_rps.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format_version"] = PLAN_FORMAT_VERSION
        data["total_served_rps"] = self.total_served_rps
        for inst, raw in zip(self.instances, data["instances"]):
            raw["id"] = inst.id
        return data


# --------------------------------------------------------------------------- JSON reading


def _need(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ProblemError(f"{where}: expected an object")
    if key not in raw:
        raise ProblemError(f"{where}: missing '{key}'")
    return raw[key]


def _number(value: Any, where: str, *, minimum: float | None = None, maximum: float | None = None, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProblemError(f"{where}: expected a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ProblemError(f"{where}: must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise ProblemError(f"{where}: must be <= {maximum:g}, got {value:g}")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProblemError(f"{where}: expected a non-empty string, got {value!r}")
    return value.strip()


def _unique(names: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ProblemError(f"{what} {name!r} is listed twice")
        seen.add(name)


# The largest query (client batch) size a problem may describe: Garrison's evaluation uses 1-64 (§6.1).
MAX_QUERY_SIZE = 4096


def _query_sizes_from_dict(raw: Any, where: str) -> tuple[tuple[int, float], ...] | None:
    """D[b]: {size: probability} (keys may be text, as JSON has it) or [[size, probability], ...]; sizes are
    whole numbers 1..MAX_QUERY_SIZE, probabilities >= 0 summing to 1."""
    if raw is None:
        return None
    where = f"{where}.query_sizes"
    items = list(raw.items()) if isinstance(raw, Mapping) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise ProblemError(f"{where}: expected an object size -> probability (or a list of [size, probability]), not empty")
    out: dict[int, float] = {}
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ProblemError(f"{where}: expected [size, probability] pairs, got {item!r}")
        size_raw, p = item
        try:
            size = int(size_raw) if not isinstance(size_raw, bool) else None
        except (TypeError, ValueError):
            size = None
        if size is None or str(size_raw).strip() != str(size) or not 1 <= size <= MAX_QUERY_SIZE:
            raise ProblemError(f"{where}: sizes are whole numbers 1..{MAX_QUERY_SIZE}, got {size_raw!r}")
        if size in out:
            raise ProblemError(f"{where}: size {size} is given twice")
        out[size] = _number(p, f"{where}[{size}]", minimum=0, maximum=1)
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise ProblemError(f"{where}: the probabilities must sum to 1, they sum to {total:.6g}")
    return tuple(sorted((b, p) for b, p in out.items() if p > 0))


def _options_from_dict(raw: Any) -> SolveOptions:
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ProblemError("options: expected an object")
    unknown = set(raw) - {f for f in SolveOptions.__dataclass_fields__}
    if unknown:
        raise ProblemError(f"options: unknown keys {sorted(unknown)}")
    opts = SolveOptions(**raw)
    if opts.objective not in OBJECTIVES:
        raise ProblemError(f"options.objective: one of {OBJECTIVES}, got {opts.objective!r}")
    if opts.solver not in SOLVERS:
        raise ProblemError(f"options.solver: one of {SOLVERS}, got {opts.solver!r}")
    _number(opts.time_limit_s, "options.time_limit_s", minimum=0, strict=True)
    _number(opts.mip_gap, "options.mip_gap", minimum=0, maximum=1)
    _number(opts.reconfiguration_penalty, "options.reconfiguration_penalty", minimum=0)
    _number(opts.variant_change_penalty, "options.variant_change_penalty", minimum=0)
    _number(opts.latency_budget_fraction, "options.latency_budget_fraction", minimum=0, maximum=1, strict=True)
    _number(opts.pipeline_headroom, "options.pipeline_headroom", minimum=1)
    _number(opts.headroom_target, "options.headroom_target", minimum=1, maximum=HEADROOM_MAX)
    if opts.spare_capacity not in SPARE_CAPACITY:
        raise ProblemError(f"options.spare_capacity: one of {SPARE_CAPACITY}, got {opts.spare_capacity!r}")
    return opts


def device_slot_id(slice_name: str, start: int | None, *, is_cpu: bool) -> str:
    """How `DeviceSpec.running` names a slot: "3g.20gb@4", "mps60@0", "full" or "cpu"."""
    if is_cpu:
        return CPU_DEVICE_TYPE
    return f"{slice_name}@{start}" if start is not None else slice_name


def _running_from_dict(
    raw: Any, where: str, *, mig: bool, layout, is_cpu: bool, mps: bool = False, mps_layout: tuple[int, ...] | None = None
) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ProblemError(f"{where}.running: expected an object of slot -> variant")
    if is_cpu:
        allowed = {CPU_DEVICE_TYPE}
    elif mps:
        allowed = {p.slot for p in mps_layout_of(mps_layout or ())}
    else:
        allowed = {str(p) for p in layout or ()} | ({FULL_SLICE} if not layout else set())
    pairs = []
    for slot, variant in raw.items():
        slot = str(slot).strip()
        if slot not in allowed:
            raise ProblemError(f"{where}.running: slot {slot!r} is not on this device (slots: {', '.join(sorted(allowed)) or 'none'})")
        if mps and isinstance(variant, (list, tuple)):
            # Several models time-share an MPS partition.
            if not variant:
                raise ProblemError(f"{where}.running[{slot!r}]: expected a variant or a non-empty list of variants")
            names = [_text(v, f"{where}.running[{slot!r}][{k}]") for k, v in enumerate(variant)]
            for name in names:
                if names.count(name) > 1:
                    raise ProblemError(f"{where}.running[{slot!r}]: variant {name!r} is listed twice")
            pairs.extend((slot, name) for name in names)
        else:
            pairs.append((slot, _text(variant, f"{where}.running[{slot!r}]")))
    return tuple(sorted(pairs))


def _mps_percent(value: Any) -> int | None:
    """A whole percent 1..100 (40 or 40.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        return None
    return int(value) if 1 <= value <= 100 else None


def _mps_partitions_from_dict(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ProblemError(f"{where}.mps_partitions: expected a non-empty list of whole percents 1..100, got {raw!r}")
    shares = []
    for value in raw:
        percent = _mps_percent(value)
        if percent is None:
            raise ProblemError(f"{where}.mps_partitions: {value!r} is not a whole percent 1..100")
        if percent in shares:
            raise ProblemError(f"{where}.mps_partitions: {percent} % is listed twice")
        shares.append(percent)
    return tuple(sorted(shares))


def _mps_layout_from_dict(raw: Any, where: str, allowed: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(raw, str):
        try:
            percents = [p.percent for p in mps_layout_parse(raw)]
        except ValueError as exc:
            raise ProblemError(f"{where}.mps_layout: {exc}") from exc
    elif isinstance(raw, (list, tuple)):
        percents = []
        for value in raw:
            percent = _mps_percent(value)
            if percent is None:
                raise ProblemError(f"{where}.mps_layout: {value!r} is not a whole percent 1..100")
            percents.append(percent)
    else:
        raise ProblemError(f"{where}.mps_layout: expected text such as '60+40' or a list of percents, got {raw!r}")
    problems = mps_layout_validate(percents, allowed=allowed)
    if problems:
        raise ProblemError(f"{where}.mps_layout: invalid MPS layout {mps_layout_format(percents)!r}: {'; '.join(problems)}")
    return tuple(sorted(percents, reverse=True))


def problem_from_dict(raw: Mapping[str, Any]) -> Problem:
    """Read a problem from its JSON form, refusing anything malformed or inconsistent with a message that
    names the item (e.g. "variants[3] (resnet50): unknown application 'classify'"). Its `gpu_models` (MIG
    GPUs the catalogue lacks, each {"name", "memory_mib", "profiles"} with NVML's profile table as agents
    report it) are known to the devices, profiles and layouts of the problem like catalogue models."""
    if not isinstance(raw, Mapping):
        raise ProblemError("a problem is a JSON object")
    models = _gpu_models_from_dict(raw.get("gpu_models"))
    with mig_catalogue_extended(models):
        problem = _problem_from_dict(raw)
    return replace(problem, gpu_models=models) if models else problem


def _gpu_models_from_dict(raw: Any) -> tuple[GpuModelSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ProblemError("gpu_models: expected a list of {name, memory_mib, profiles}")
    models = []
    for i, item in enumerate(raw):
        where = f"gpu_models[{i}]"
        if not isinstance(item, Mapping):
            raise ProblemError(f"{where}: expected an object")
        name = _text(_need(item, "name", where), f"{where}.name")
        if mig_catalogue_load().gpu_model_find(name) is not None:
            raise ProblemError(f"{where} ({name}): the MIG catalogue has this model; describe only GPUs it lacks")
        try:
            models.append(gpu_model_from_nvml(name, int(_number(_need(item, "memory_mib", where), f"{where}.memory_mib", minimum=1)),
                                              _need(item, "profiles", where)))
        except CatalogueError as exc:
            raise ProblemError(f"{where}: {exc}") from exc
    _unique((m.name for m in models), "GPU model")
    return tuple(models)


def gpu_model_to_dict(model: GpuModelSpec) -> dict[str, Any]:
    """A GPU model described from NVML, in the problem's `gpu_models` form."""
    return {"name": model.name, "memory_mib": model.memory_mib, "profiles": [
        {"name": p.name, "profile_id": p.profile_id, "memory_slices": p.memory_slices, "compute_slices": p.compute_slices,
         "memory_mb": p.memory_gb * 1024, "starts": list(p.starts), "max_count": p.max_count}
        for p in model.profiles
    ]}


def _problem_from_dict(raw: Mapping[str, Any]) -> Problem:
    if not isinstance(raw, Mapping):
        raise ProblemError("a problem is a JSON object")
    version = raw.get("format_version", PROBLEM_FORMAT_VERSION)
    if version != PROBLEM_FORMAT_VERSION:
        raise ProblemError(f"format_version {version!r} is not supported (expected {PROBLEM_FORMAT_VERSION})")
    catalogue = mig_catalogue_load()

    raw_apps = _need(raw, "applications", "problem")
    if not isinstance(raw_apps, (list, tuple)):
        raise ProblemError("applications: expected a list")
    app_names_raw = [_text(_need(a, "name", f"applications[{i}]"), f"applications[{i}].name") for i, a in enumerate(raw_apps)]
    _unique(app_names_raw, "application")
    # Pipelines first: a stage's demand (and, when not given, its SLO) follows from the paths through it.
    pipelines = _pipelines_from_dict(raw.get("pipelines"), set(app_names_raw))
    apps = []
    for i, (a, name) in enumerate(zip(raw_apps, app_names_raw)):
        where = f"applications[{i}] ({name})"
        pipeline = next((p for p in pipelines if any(st.application == name for st in p.stages)), None)
        min_acc = a.get("min_accuracy")
        priority = a.get("priority")
        if priority is not None:
            _number(priority, f"{where}.priority", minimum=0, maximum=100)
            if priority != int(priority):
                raise ProblemError(f"{where}.priority: must be a whole number, got {priority:g}")
        if pipeline is None:
            slo = _number(_need(a, "slo_ms", where), f"{where}.slo_ms", minimum=0, strict=True)
            demand = _number(_need(a, "demand_rps", where), f"{where}.demand_rps", minimum=0)
        else:
            rate = pipeline.stage_rate(name)
            demand = rate if a.get("demand_rps") is None else _number(a["demand_rps"], f"{where}.demand_rps", minimum=0)
            if abs(demand - rate) > 1e-9 * max(1.0, rate):
                raise ProblemError(
                    f"{where}.demand_rps: {demand:g} but it is a stage of pipeline {pipeline.name!r}, whose paths through it "
                    f"bring {rate:g} rps; leave demand_rps out (it follows from the paths) or make them agree"
                )
            through = [p.slo_ms for p in pipeline.paths if name in p.stages]
            slo = min(through) if a.get("slo_ms") is None else _number(a["slo_ms"], f"{where}.slo_ms", minimum=0, strict=True)
        apps.append(
            ApplicationSpec(
                name=name, slo_ms=slo, demand_rps=demand,
                min_accuracy=None if min_acc is None else _number(min_acc, f"{where}.min_accuracy", minimum=0, maximum=1),
                priority=None if priority is None else int(priority),
                query_sizes=_query_sizes_from_dict(a.get("query_sizes"), where),
            )
        )
    if not apps:
        raise ProblemError("applications: at least one is needed")
    app_names = {a.name for a in apps}

    variants = []
    for i, v in enumerate(_need(raw, "variants", "problem")):
        where = f"variants[{i}]"
        name = _text(_need(v, "name", where), f"{where}.name")
        where = f"{where} ({name})"
        app = _text(_need(v, "application", where), f"{where}.application")
        if app not in app_names:
            raise ProblemError(f"{where}: unknown application {app!r}")
        variants.append(
            VariantSpec(
                name=name, application=app,
                accuracy=_number(_need(v, "accuracy", where), f"{where}.accuracy", minimum=0, maximum=1),
                memory_mb=_number(v.get("memory_mb", 0), f"{where}.memory_mb", minimum=0),
            )
        )
    _unique((v.name for v in variants), "variant")
    for a in apps:
        if not any(v.application == a.name for v in variants):
            raise ProblemError(f"application {a.name!r} has no variant")
    for i, (a, raw_app) in enumerate(zip(list(apps), raw_apps)):
        if raw_app.get("ensemble") is not None:
            try:
                ensemble = ensemble_policy_from_dict(raw_app["ensemble"], variants=[v.name for v in variants if v.application == a.name])
            except EnsembleError as exc:
                raise ProblemError(f"applications[{i}] ({a.name}).ensemble: {exc}") from None
            apps[i] = replace(a, ensemble=ensemble)
    variant_app = {v.name: v.application for v in variants}
    for p in pipelines:
        for st in p.stages:
            if st.variant is not None and variant_app.get(st.variant) != st.application:
                owner = variant_app.get(st.variant)
                raise ProblemError(
                    f"pipelines ({p.name}): stage {st.application!r} pins variant {st.variant!r}, "
                    + ("which does not exist" if owner is None else f"a variant of {owner!r}, not of {st.application!r}")
                )

    devices = []
    for i, d in enumerate(_need(raw, "devices", "problem")):
        where = f"devices[{i}]"
        name = _text(_need(d, "name", where), f"{where}.name")
        where = f"{where} ({name})"
        dtype = _text(_need(d, "type", where), f"{where}.type")
        mig = bool(d.get("mig", False))
        mps = bool(d.get("mps", False))
        if mig and mps:
            raise ProblemError(f"{where}: mig and mps are both true; a GPU is partitioned with one or the other")
        if mps and dtype == CPU_DEVICE_TYPE:
            raise ProblemError(f"{where}: a CPU cannot use MPS")
        for key in ("mps_partitions", "mps_layout"):
            if d.get(key) is not None and not mps:
                raise ProblemError(f"{where}: {key} is given but mps is false")
        mps_partitions = MPS_PARTITIONS_DEFAULT
        mps_layout = None
        if mps:
            if d.get("mps_partitions") is not None:
                mps_partitions = _mps_partitions_from_dict(d["mps_partitions"], where)
            if d.get("mps_layout") is not None:
                mps_layout = _mps_layout_from_dict(d["mps_layout"], where, mps_partitions)
        spec = catalogue.gpu_model_find(dtype)
        if spec is not None:
            dtype = spec.name  # one spelling per GPU model
        if mig and spec is None:
            raise ProblemError(f"{where}: MIG requested but {dtype!r} is not in the MIG catalogue ({', '.join(catalogue.gpu_model_names)})")
        layout = None
        if d.get("layout") is not None:
            if not mig:
                raise ProblemError(f"{where}: a layout is given but mig is false")
            try:
                layout = layout_parse(d["layout"])
            except ValueError as exc:
                raise ProblemError(f"{where}.layout: {exc}") from exc
            from engine.geometry.layout import mig_layout_validate

            verdict = mig_layout_validate(spec, layout)
            if not verdict.valid:
                raise ProblemError(f"{where}.layout: {verdict.reason}")
        fixed = bool(d.get("fixed_layout", False))
        if fixed and layout is None and mps_layout is None:
            what = "an mps_layout" if mps else "a layout"
            raise ProblemError(f"{where}: fixed_layout needs {what}")
        cores = d.get("cores")
        if dtype == CPU_DEVICE_TYPE:
            if mig:
                raise ProblemError(f"{where}: a CPU cannot use MIG")
            cores = int(_number(_need(d, "cores", where), f"{where}.cores", minimum=1))
        memory = d.get("memory_mb")
        if memory is not None:
            memory = _number(memory, f"{where}.memory_mb", minimum=0, strict=True)
        elif spec is not None:
            memory = float(spec.memory_mib)
        running = _running_from_dict(
            d.get("running"), where, mig=mig, layout=layout, is_cpu=dtype == CPU_DEVICE_TYPE, mps=mps, mps_layout=mps_layout
        )
        devices.append(DeviceSpec(
            name=name, type=dtype, mig=mig, layout=layout, fixed_layout=fixed, memory_mb=memory, cores=cores, running=running,
            mps=mps, mps_partitions=mps_partitions, mps_layout=mps_layout,
        ))
    if not devices:
        raise ProblemError("devices: at least one is needed")
    _unique((d.name for d in devices), "device")

    variant_names = {v.name for v in variants}
    for d in devices:
        for slot, variant in d.running:
            if variant not in variant_names:
                raise ProblemError(f"device {d.name}: running[{slot!r}] names unknown variant {variant!r}")
    profiles = []
    seen_points: set[tuple[str, str, str, int]] = set()
    for i, p in enumerate(_need(raw, "profiles", "problem")):
        where = f"profiles[{i}]"
        variant = _text(_need(p, "variant", where), f"{where}.variant")
        if variant not in variant_names:
            raise ProblemError(f"{where}: unknown variant {variant!r}")
        dtype = _text(_need(p, "device_type", where), f"{where}.device_type")
        spec = catalogue.gpu_model_find(dtype)
        if spec is not None:
            dtype = spec.name
        slice_raw = _need(p, "slice", where)
        slice_name = str(int(slice_raw)) if isinstance(slice_raw, (int, float)) and not isinstance(slice_raw, bool) else _text(slice_raw, f"{where}.slice")
        if slice_name.lower().startswith("mps"):
            # An MPS partition: valid on any GPU type, catalogue GPU or not.
            if mps_slice_percent(slice_name.lower()) is None:
                raise ProblemError(
                    f"{where} ({variant} on {dtype}): {slice_name!r} is not an MPS slice (expected 'mpsNN', NN a whole percent 1..100)"
                )
            if dtype == CPU_DEVICE_TYPE:
                raise ProblemError(f"{where} ({variant} on {dtype}): a CPU has no MPS partitions, got slice {slice_name!r}")
            slice_name = slice_name.lower()
        elif spec is not None and slice_name != FULL_SLICE:
            profile = spec.profile_find(slice_name)
            if profile is None:
                raise ProblemError(f"{where}: {slice_name!r} is not a MIG profile of {spec.name}")
            slice_name = profile.name
        if dtype == CPU_DEVICE_TYPE and not slice_name.isdigit():
            raise ProblemError(f"{where}: a CPU profile's slice is its number of cores, got {slice_name!r}")
        batch = _number(_need(p, "batch", where), f"{where}.batch", minimum=1)
        if batch != int(batch):
            raise ProblemError(f"{where}.batch: must be a whole number, got {batch:g}")
        key = (variant, dtype, slice_name, int(batch))
        if key in seen_points:
            raise ProblemError(f"{where}: a second profile for {variant} on {dtype}/{slice_name} at batch {int(batch)}")
        seen_points.add(key)
        memory = p.get("memory_mb")
        profiles.append(
            ProfilePoint(
                variant=variant, device_type=dtype, slice=slice_name, batch=int(batch),
                latency_ms=_number(_need(p, "latency_ms", where), f"{where}.latency_ms", minimum=0, strict=True),
                memory_mb=None if memory is None else _number(memory, f"{where}.memory_mb", minimum=0),
                l2_util_pct=_utilisation(p, "l2_util_pct", where),
                dram_util_pct=_utilisation(p, "dram_util_pct", where),
            )
        )
    return Problem(tuple(apps), tuple(variants), tuple(devices), tuple(profiles), _options_from_dict(raw.get("options")),
                   _interference_from_dict(raw.get("interference")), pipelines)


def _pipeline_stage_from_dict(raw: Any, where: str, app_names: set[str]) -> PipelineStageSpec:
    if isinstance(raw, str):
        raw = {"application": raw}
    application = _text(_need(raw, "application", where), f"{where}.application")
    if application not in app_names:
        raise ProblemError(f"{where}: unknown application {application!r}")
    unknown = set(raw) - {"application", "variant", "max_batch", "inputs"}
    if unknown:
        raise ProblemError(f"{where}: unknown keys {sorted(unknown)}")
    variant = raw.get("variant")
    max_batch = _number(raw.get("max_batch", 64), f"{where}.max_batch", minimum=1)
    if max_batch != int(max_batch):
        raise ProblemError(f"{where}.max_batch: must be a whole number, got {max_batch:g}")
    mapping = raw.get("inputs") or {}
    if not isinstance(mapping, Mapping):
        raise ProblemError(f"{where}.inputs: expected an object of this stage's input -> the previous stage's output, got {mapping!r}")
    inputs = tuple(sorted((_text(k, f"{where}.inputs"), _text(v, f"{where}.inputs[{k!r}]")) for k, v in mapping.items()))
    return PipelineStageSpec(application, None if variant is None else _text(variant, f"{where}.variant"), int(max_batch), inputs)


def _pipelines_from_dict(raw: Any, app_names: set[str]) -> tuple[PipelineSpec, ...]:
    """The `pipelines` section (see `pipeline_from_dict`); an application is a stage of one pipeline at most."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise ProblemError("pipelines: expected a list")
    pipelines: list[PipelineSpec] = []
    owner: dict[str, str] = {}
    for i, p in enumerate(raw):
        spec = pipeline_from_dict(p, app_names, where=f"pipelines[{i}]")
        for st in spec.stages:
            if st.application in owner:
                raise ProblemError(f"pipelines[{i}] ({spec.name}): application {st.application!r} is already a stage of pipeline "
                                   f"{owner[st.application]!r}; an application is a stage of at most one pipeline")
            owner[st.application] = spec.name
        pipelines.append(spec)
    _unique((p.name for p in pipelines), "pipeline")
    return tuple(pipelines)


def pipeline_stages_parse(text: str) -> list[str]:
    """A chain written as text, "detect -> classify -> caption", as its stage names in order."""
    names = [part.strip() for part in text.split("->")]
    if any(not n for n in names):
        raise ProblemError(f"stages: {text!r} is not a chain such as 'detect -> classify' (an empty stage name)")
    return names


def pipeline_from_dict(p: Any, app_names: set[str], *, where: str = "pipeline") -> PipelineSpec:
    """One pipeline: a DAG of stages (applications) with its execution paths, or a chain (stages in order,
    one `slo_ms` and `demand_rps`; the stages may be written as text, "detect -> classify"). Refused, with a
    message naming the fault: unknown applications, a stage twice, paths that visit an undeclared stage or
    one stage twice, paths that do not all start at one entry stage, a cycle, a stage on no path."""
    from engine.pipelines.problem import PipelineProblemError, paths_acyclic_check

    name = _text(_need(p, "name", where), f"{where}.name")
    where = f"{where} ({name})"
    unknown = set(p) - {"name", "description", "stages", "paths", "slo_ms", "demand_rps", "alpha", "beta", "delta", "ipa_threshold_rps"}
    if unknown:
        raise ProblemError(f"{where}: unknown keys {sorted(unknown)}")
    raw_stages = _need(p, "stages", where)
    if isinstance(raw_stages, str):
        raw_stages = pipeline_stages_parse(raw_stages)
    if not isinstance(raw_stages, (list, tuple)) or not raw_stages:
        raise ProblemError(f"{where}.stages: expected a non-empty list of applications")
    stages = tuple(_pipeline_stage_from_dict(st, f"{where}.stages[{k}]", app_names) for k, st in enumerate(raw_stages))
    _unique((st.application for st in stages), f"{where}: stage")
    stage_names = [st.application for st in stages]
    if p.get("paths") is None:
        # A chain: one path through the stages in their order.
        if p.get("slo_ms") is None or p.get("demand_rps") is None:
            raise ProblemError(f"{where}: give 'paths', or 'slo_ms' and 'demand_rps' for a chain through the stages in order")
        paths = (PipelinePathSpec(
            name, tuple(stage_names),
            _number(p["slo_ms"], f"{where}.slo_ms", minimum=0, strict=True),
            _number(p["demand_rps"], f"{where}.demand_rps", minimum=0),
        ),)
    else:
        if p.get("slo_ms") is not None or p.get("demand_rps") is not None:
            raise ProblemError(f"{where}: with 'paths', each path has its own slo_ms and demand_rps; remove the pipeline's")
        raw_paths = p["paths"]
        if not isinstance(raw_paths, (list, tuple)) or not raw_paths:
            raise ProblemError(f"{where}.paths: expected a non-empty list")
        built = []
        for k, q in enumerate(raw_paths):
            pwhere = f"{where}.paths[{k}]"
            pname = _text(_need(q, "name", pwhere), f"{pwhere}.name")
            pwhere = f"{pwhere} ({pname})"
            unknown = set(q) - {"name", "stages", "slo_ms", "demand_rps"}
            if unknown:
                raise ProblemError(f"{pwhere}: unknown keys {sorted(unknown)}")
            route = _need(q, "stages", pwhere)
            if isinstance(route, str):
                route = pipeline_stages_parse(route)
            if not isinstance(route, (list, tuple)) or not route:
                raise ProblemError(f"{pwhere}.stages: expected a non-empty list of stage applications")
            route = tuple(_text(s, f"{pwhere}.stages") for s in route)
            missing = [s for s in route if s not in stage_names]
            if missing:
                raise ProblemError(f"{pwhere}: visits {missing}, which are not stages of {name!r} ({', '.join(stage_names)})")
            if len(set(route)) != len(route):
                raise ProblemError(f"{pwhere}: visits a stage twice: {list(route)}")
            built.append(PipelinePathSpec(
                pname, route,
                _number(_need(q, "slo_ms", pwhere), f"{pwhere}.slo_ms", minimum=0, strict=True),
                _number(_need(q, "demand_rps", pwhere), f"{pwhere}.demand_rps", minimum=0),
            ))
        _unique((q.name for q in built), f"{where}: path")
        paths = tuple(built)
    entries = sorted({q.stages[0] for q in paths})
    if len(entries) > 1:
        raise ProblemError(f"{where}: its paths start at {entries}; a pipeline has one entry stage, where every path starts")
    idle = [s for s in stage_names if not any(s in q.stages for q in paths)]
    if idle:
        raise ProblemError(f"{where}: stages on no path: {idle}")
    try:
        paths_acyclic_check({(q.stages[j], q.stages[j + 1]) for q in paths for j in range(len(q.stages) - 1)})
    except PipelineProblemError as exc:
        raise ProblemError(f"{where}: {exc}") from exc
    weights = {key: _number(p.get(key, default), f"{where}.{key}", minimum=0)
               for key, default in (("alpha", 1.0), ("beta", 0.01), ("delta", 1e-6), ("ipa_threshold_rps", 0.0))}
    return PipelineSpec(name, stages, paths, **weights)


def _utilisation(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    value = raw.get(key)
    return None if value is None else _number(value, f"{where}.{key}", minimum=0, maximum=100)


def _interference_from_dict(raw: Any) -> InterferenceSpec | None:
    """{"form": "operating-point-log", "coefficients": [...]}: one coefficient per regressor of the form."""
    if raw is None:
        return None
    from engine.sharing.interference import INTERFERENCE_FORMS

    form = _text(_need(raw, "form", "interference"), "interference.form")
    if form not in INTERFERENCE_FORMS:
        raise ProblemError(f"interference.form: one of {', '.join(INTERFERENCE_FORMS)}, got {form!r}")
    coefficients = _need(raw, "coefficients", "interference")
    expected = len(INTERFERENCE_FORMS[form].regressors)
    if not isinstance(coefficients, (list, tuple)) or len(coefficients) != expected:
        raise ProblemError(f"interference.coefficients: the form {form!r} has {expected} ({', '.join(INTERFERENCE_FORMS[form].regressors)}), "
                           f"got {coefficients!r}")
    return InterferenceSpec(form, tuple(_number(c, f"interference.coefficients[{i}]") for i, c in enumerate(coefficients)))


def _application_to_dict(a: ApplicationSpec) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(a, k) for k in ("name", "slo_ms", "demand_rps", "min_accuracy", "priority") if getattr(a, k) is not None}
    if a.query_sizes is not None:
        out["query_sizes"] = {str(b): p for b, p in a.query_sizes}
    if a.ensemble is not None:
        out["ensemble"] = ensemble_policy_to_dict(a.ensemble)
    return out


def problem_to_dict(problem: Problem) -> dict[str, Any]:
    def device(d: DeviceSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"name": d.name, "type": d.type, "mig": d.mig}
        if d.layout is not None:
            out["layout"] = [str(p) for p in d.layout]
        if d.fixed_layout:
            out["fixed_layout"] = True
        if d.memory_mb is not None:
            out["memory_mb"] = d.memory_mb
        if d.cores is not None:
            out["cores"] = d.cores
        if d.mps:
            out["mps"] = True
            out["mps_partitions"] = list(d.mps_partitions)
            if d.mps_layout is not None:
                out["mps_layout"] = mps_layout_format(d.mps_layout)
        if d.running:
            slots: dict[str, list[str]] = {}
            for slot, variant in d.running:
                slots.setdefault(slot, []).append(variant)
            # A list only where models time-share a slot (MPS partitions).
            out["running"] = {slot: names[0] if len(names) == 1 else names for slot, names in slots.items()}
        return out

    return {
        "format_version": PROBLEM_FORMAT_VERSION,
        "applications": [_application_to_dict(a) for a in problem.applications],
        "variants": [asdict(v) for v in problem.variants],
        "devices": [device(d) for d in problem.devices],
        "profiles": [{k: v for k, v in asdict(p).items() if v is not None} for p in problem.profiles],
        "options": asdict(problem.options),
        **({"interference": {"form": problem.interference.form, "coefficients": list(problem.interference.coefficients)}}
           if problem.interference is not None else {}),
        **({"pipelines": [pipeline_to_dict(p) for p in problem.pipelines]} if problem.pipelines else {}),
        **({"gpu_models": [gpu_model_to_dict(m) for m in problem.gpu_models]} if problem.gpu_models else {}),
    }


def pipeline_to_dict(p: PipelineSpec) -> dict[str, Any]:
    """A pipeline in its normal form: stages as objects, paths written out (a chain's one path too)."""
    stages = [{"application": s.application, **({"variant": s.variant} if s.variant else {}), "max_batch": s.max_batch,
               **({"inputs": dict(s.inputs)} if s.inputs else {})} for s in p.stages]
    return {
        "name": p.name, "stages": stages,
        "paths": [{"name": q.name, "stages": list(q.stages), "slo_ms": q.slo_ms, "demand_rps": q.demand_rps} for q in p.paths],
        "alpha": p.alpha, "beta": p.beta, "delta": p.delta, "ipa_threshold_rps": p.ipa_threshold_rps,
    }


def problem_load(path) -> Problem:
    with open(path) as fh:
        try:
            raw = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ProblemError(f"{path}: not valid JSON: {exc}") from exc
    return problem_from_dict(raw)


def plan_from_dict(raw: Mapping[str, Any]) -> Plan:
    """Read a plan written by `Plan.to_dict` (the validator reads plans from files and other tools)."""
    try:
        instances = [
            PlanInstance(
                device=i["device"], slice=str(i["slice"]), start=i.get("start"), variant=i["variant"], batch=int(i["batch"]),
                latency_ms=float(i["latency_ms"]), capacity_rps=float(i["capacity_rps"]), assigned_rps=float(i["assigned_rps"]),
                duty_cycle_ms=None if i.get("duty_cycle_ms") is None else float(i["duty_cycle_ms"]),
                interference_factor=1.0 if i.get("interference_factor") is None else float(i["interference_factor"]),
                vertical=None if i.get("vertical") is None else VerticalScaling(**i["vertical"]),
            )
            for i in raw["instances"]
        ]
        routing = {app: [RouteEntry(e["instance"], float(e["weight"])) for e in entries] for app, entries in raw["routing"].items()}
        return Plan(
            status=raw["status"], solver=raw.get("solver", ""), objective_kind=raw.get("objective_kind", "max-accuracy"),
            objective=raw.get("objective"), bound=raw.get("bound"), gap=raw.get("gap"), solve_seconds=float(raw.get("solve_seconds", 0)),
            effective_accuracy=raw.get("effective_accuracy"), served_rps=dict(raw.get("served_rps", {})),
            shortfall_rps=dict(raw.get("shortfall_rps", {})), instances=instances, routing=routing,
            layouts={k: list(v) for k, v in raw.get("layouts", {}).items()},
            accuracy_by_application=dict(raw.get("accuracy_by_application", {})), gpus_used=int(raw.get("gpus_used", 0)),
            notes=list(raw.get("notes", [])), pipelines=dict(raw.get("pipelines") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProblemError(f"plan is malformed: {exc!r}") from exc
