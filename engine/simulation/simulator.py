"""Discrete-event simulator of a planned inference fleet, closing the loop with the planner.

What Proteus evaluates with its simulator (Proteus §6.1.5: an event queue, profiled latencies as
processing times) with the control loop of its §3 and §4 (periodic re-allocation, bursts reported by the
load balancers), the adaptive batching of its §5 and, as the alternative router, Garrison's instance
routing (Garrison §5.3). Departs from Proteus's simulator, which serves a batch in its mean profiled
latency: here the latency is noisy (below), because Proteus attributes the gap between its simulator and
its testbed mainly to that variance (§6.1.5, §6.2).

`simulate(problem, trace, planner=..., config=...)` replays a request trace against the instances of a plan:

- Planning. The first plan comes from `planner` on the trace's demand over the first re-planning interval
  (or on the problem's own demand). Then, every `replan_interval_s` (Proteus re-plans every 30 s, §6.1.5)
  and when the observed demand of an application over the last second exceeds what the current plan
  assumed by `burst_factor` (debounced; Proteus §3: the load balancer calls the controller on a burst),
  the planner runs again on the demand observed over the last window (the problem with `demand_rps`
  replaced; MIG GPUs carry the layout the previous plan left them in, so a planner that minimises
  reconfiguration sees the current state). A new plan applies at once: instances it keeps (same instance
  id and variant; on MIG GPUs the placement also survives `mig_layout_diff`) keep their queue and keep
  serving; instances it drops stop (a batch in flight finishes; queued queries are routed again under the
  new plan); instances it creates serve nothing for `reconfiguration_delay_s` (routing leaves them out, as
  the data plane leaves out instances that are not ready).
- Routing. `weights` (Proteus's query assignment, §3-§4): each application's table from
  `routing.routing_tables_from_plan`, the same derivation the live system publishes to its routers, drawn
  with the alias tables of `routing.py` (the data plane's `WeightedRouter`, including its renormalisation
  over the instances that are available); the weights do not depend on the state, so all arrivals between
  two control events are routed at once, vectorised. `matching`: Garrison's instance routing (§5.3),
  `routing.queries_match_instances`, once every `matching_interval_ms` over the queries that arrived since
  (a query waits at most that long; §5.3 matches the queries waiting in a model's queue, not saying when).
  `even`: the Proteus artefact's routing, for comparisons (docs/fidelity-proteus.md, section 4): each query
  to one of its application's routed instances chosen uniformly, whatever their weights and capacities
  (UMass-LIDS/Proteus `core/executor.py` replaces the capacity weights by ones; the paper's "w/o QA").
- Serving (Proteus §5 for the `proteus` policy). Each instance has a `batching.QueryQueue` and a policy
  from `batching.batching_policy_make`, driven exactly per the batching contract: whenever the instance is
  idle, on an arrival, at the time the policy asked for and when a batch completes, first `drop_expired`
  then `decide`. A batch of b takes the profiled latency at b (interpolated, `capacity.profile_interpolate`)
  times a mean-preserving log-normal noise exp(sigma z - sigma^2 / 2). A variant named in
  `service_by_variant` takes the service model measured on its runtimes instead (benches/fidelity.py):
  profile(b) x scale + per-batch ms, times the same kind of factor with its own sigma; its batching policy
  and drop rule still see the profile, as the runtime's do.
- MPS partitions (gpulets, ATC'22 §4.2-§4.4). Instances on one MPS partition (same device and `mpsNN@k`
  slot) time-share it, one batch at a time, in the plan's duty-cycle rounds (engine/dataplane/rounds.py,
  `DutyCycleRound`, the round the live partition runtime runs too): each model has a fixed slot in the
  round, and at its slot its policy sizes a batch from what it has queued and it runs at once (the round
  is the timer), up to `round_batch_cap`; a model with nothing queued passes. A partition written without
  a duty cycle takes work-conserving turns instead: when a batch ends the next model round-robin that
  starts one runs. A batch on one partition runs slower while a
  batch runs on another partition of the same GPU: its remaining work is re-timed whenever the co-runner
  starts or ends, at the factor `interference.factor(model, batch, percent, co-runner, its batch, its
  percent)` (1 with nothing co-running), so a batch is slowed only for the part of it that overlapped.
  `interference` is the problem's fitted model (with its profiles' utilisations) unless the caller passes
  another oracle (benches pass the measured co-runs) or None (partitions that do not interfere). Where the
  oracle knows nothing of a co-location, the plan's own predicted factor of that instance applies.
- Outcomes. Every query ends exactly once: on time (completed by its deadline), late, or dropped (no
  capacity for its application at arrival, expired under the drop rule, or still queued when the
  simulation ends). The deadline is arrival + the application's SLO, or arrival + the trace's per-request
  `deadline_ms` where it gives one (Sponge).

Code: `_Simulation.run` takes the control events in turn; each event kind has its handler (`_on_*`), per
instance state is a `SimInstance` record (`SimPartition` for an MPS partition), and a batch's service time
comes from `_service_time_draw` alone.

Speed: events are plain tuples in a heap, per-query state lives in flat lists indexed by query id, and
arrivals are merged with the heap instead of being pushed into it. Planner calls are timed apart.

Simplifications (stated): planning takes no simulated time (a plan applies at the instant it is asked
for); destroying an instance is immediate (on MPS GPUs too: the overlap of old and new partitions of
gpulets §4.6 is the agent's, not modelled here); the network adds nothing; the initial plan is in place at
time 0 with every instance ready."""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Callable, Iterator, Literal, Mapping, Protocol, Sequence

import numpy as np

from engine.dataplane.batching import (
    DEADLINE_TOLERANCE_MS,
    DEFAULT_BATCHING_POLICY,
    DROP_RULES,
    QUEUE_ORDERS,
    QueryQueue,
    batching_policy_make,
    policy_latency_function,
)
from engine.dataplane.rounds import END as ROUND_END, WAIT as ROUND_WAIT, DutyCycleRound, round_batch_cap
from engine.dataplane.routing import alias_table_build, queries_match_instances, routing_tables_from_plan
from engine.forecasting.holt import peak_forecast_estimate
from engine.geometry.layout import layout_parse, mig_layout_diff
from engine.plans.problem import Plan, PlanInstance, Problem, device_slot_id
from engine.sharing.partitions import mps_slice_percent
from engine.sharing.scheduling import InterferenceOracle

__all__ = [
    "DROP_RULES",
    "ROUTING_MODES",
    "FlatAliasRouter",
    "SimulationConfig",
    "SimulationResult",
    "TraceLike",
    "simulate",
]

RoutingMode = Literal["weights", "matching"]
ROUTING_MODES: tuple[str, ...] = ("weights", "matching", "even")
INITIAL_DEMANDS: tuple[str, ...] = ("trace", "problem")
DEMAND_ESTIMATES: tuple[str, ...] = ("mean", "peak")
PEAK_WINDOW_S = 60.0  # the live ReplanPolicy's demand_window_seconds default
DEFAULT_DEMAND_HEADROOM = 1.2

# Query outcomes (per query id).
PENDING, ON_TIME, LATE, DROPPED_EXPIRED, DROPPED_NO_CAPACITY, DROPPED_UNFINISHED = 0, 1, 2, 3, 4, 5
OUTCOME_NAMES = {ON_TIME: "on_time", LATE: "late", DROPPED_EXPIRED: "dropped_expired",
                 DROPPED_NO_CAPACITY: "dropped_no_capacity", DROPPED_UNFINISHED: "dropped_unfinished"}
# Heap event kinds; at equal times a completion goes before a timer (tuples compare kind second).
# _ROUND: an MPS partition's duty cycle starts; _TURN: a model's slot in it comes (the key is the partition).
_COMPLETE, _TIMER, _ROUND, _TURN = 0, 1, 2, 3
_INF = math.inf
# A policy's `at_ms` this close to now counts as now (it is recomputed from the same numbers).
_AT_EPSILON_MS = 1e-9
_NOISE_CHUNK = 1 << 16
# Policies that may drop queries from the head inside `decide` (batching.py: Nexus, and the Proteus artefact's).
EARLY_DROP_POLICIES = frozenset({"nexus", "proteus-artefact"})


class TraceLike(Protocol):
    """What the simulator reads from a trace (`workload.Trace`): arrival times in seconds, sorted; the
    index of each request's application in `applications`; optionally a per-request deadline in ms after
    arrival (NaN where the application's SLO applies)."""

    time_s: np.ndarray
    application: np.ndarray
    applications: tuple[str, ...]


@dataclass(frozen=True)
class SimulationConfig:
    """How the simulated fleet behaves. Times in seconds unless the name says `_ms`.

    `drop_rule` is one rule for every application or a mapping application -> rule (the default,
    "deadline", for applications not named): never | deadline | slo-1x | slo-2x (see batching.py).
    `replan_interval_s` None or 0 turns periodic re-planning off, `burst_factor` None turns the burst
    trigger off. A burst re-plan needs the last second's demand of an application above `burst_factor`
    times the plan's assumption and at least `burst_min_rps`, and at least `burst_debounce_s` since the
    last re-plan; it plans on max(window mean, last second) per application. `demand_headroom` scales the
    demand handed to the planner. `carry_layouts`: re-planning starts from the MIG layouts the current
    plan left (the joint planner then counts reconfiguration from there). `record_batches`: keep a log of
    every batch (`SimulationResult.batches`); off by default (costs nothing then)."""

    batching: str = DEFAULT_BATCHING_POLICY
    batching_params: Mapping[str, Any] = field(default_factory=dict)
    queue_order: str = "fifo"
    drop_rule: str | Mapping[str, str] = "deadline"
    noise_sigma: float = 0.05
    seed: int = 0
    replan_interval_s: float | None = 30.0
    demand_window_s: float | None = None  # None: PEAK_WINDOW_S for "peak", the re-planning interval for "mean"
    burst_factor: float | None = 1.5
    burst_min_rps: float = 5.0
    burst_debounce_s: float = 5.0
    reconfiguration_delay_s: float = 5.0
    routing: str = "weights"
    matching_interval_ms: float = 2.0
    initial_demand: str = "trace"
    demand_headroom: float = DEFAULT_DEMAND_HEADROOM
    # What a re-plan sizes each application for: "mean" (its arrival rate over the demand window, Proteus's
    # observed demand) or "peak" (max of the window's busiest second and a Holt forecast
    # `forecast_horizon_s` ahead: engine.forecasting.holt.peak_forecast_estimate, the live control loop's
    # estimate). Either is then scaled by `demand_headroom`. The defaults (peak of 60 s, no forecast, 1.2x)
    # had the fewest violations at Proteus's accuracy on its own traces (benches/proteus_traces.py); the
    # mean of the last interval, as Proteus plans, overflows in every burst between two re-plans.
    demand_estimate: str = "peak"
    forecast_horizon_s: float = 0.0
    carry_layouts: bool = True
    record_batches: bool = False  # opt-in: SimulationResult.batches lists every batch started
    # The batching policy of instances on MPS partitions (None: `batching`, with its params); the live
    # fleet's is engine.dataplane.rounds.ROUND_BATCHING_POLICY (what plans translate to).
    mps_batching: str | None = None
    # Applications whose own configuration picks their batching (engine.dataplane.batching.application_batching):
    # {application: (policy, params)}, as plans translate it for their runtimes (not on MPS partitions).
    batching_by_application: Mapping[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    # Per variant (the problem's name): (scale, per_batch_ms, sigma), a service model measured on its
    # runtimes. A batch of b then takes profile(b) x scale + per_batch_ms, times a mean-preserving log-normal
    # factor of spread sigma (instead of `noise_sigma`); variants not named keep the profile and noise_sigma.
    service_by_variant: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order must be one of {QUEUE_ORDERS}, got {self.queue_order!r}")
        rules = self.drop_rule.values() if isinstance(self.drop_rule, Mapping) else [self.drop_rule]
        for rule in rules:
            if rule not in DROP_RULES:
                raise ValueError(f"drop_rule must be one of {DROP_RULES}, got {rule!r}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}, got {self.routing!r}")
        if self.initial_demand not in INITIAL_DEMANDS:
            raise ValueError(f"initial_demand must be one of {INITIAL_DEMANDS}, got {self.initial_demand!r}")
        for name in ("noise_sigma", "reconfiguration_delay_s", "burst_min_rps", "burst_debounce_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("replan_interval_s", "demand_window_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be None or a finite number >= 0, got {value!r}")
        if self.burst_factor is not None and not (math.isfinite(self.burst_factor) and self.burst_factor > 0):
            raise ValueError(f"burst_factor must be None or > 0, got {self.burst_factor!r}")
        if not (math.isfinite(self.matching_interval_ms) and self.matching_interval_ms > 0):
            raise ValueError(f"matching_interval_ms must be > 0, got {self.matching_interval_ms!r}")
        if not (math.isfinite(self.demand_headroom) and self.demand_headroom > 0):
            raise ValueError(f"demand_headroom must be > 0, got {self.demand_headroom!r}")
        if self.demand_estimate not in DEMAND_ESTIMATES:
            raise ValueError(f"demand_estimate must be one of {DEMAND_ESTIMATES}, got {self.demand_estimate!r}")
        if not (isinstance(self.forecast_horizon_s, (int, float)) and math.isfinite(self.forecast_horizon_s) and self.forecast_horizon_s >= 0):
            raise ValueError(f"forecast_horizon_s must be a finite number >= 0, got {self.forecast_horizon_s!r}")
        for variant, model in self.service_by_variant.items():
            if not (isinstance(model, (tuple, list)) and len(model) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                                              and math.isfinite(x) for x in model)
                    and model[0] > 0 and model[1] >= 0 and model[2] >= 0):
                raise ValueError(f"service_by_variant[{variant!r}] must be (scale > 0, per_batch_ms >= 0, sigma >= 0), got {model!r}")

    def drop_rule_for(self, application: str) -> str:
        if isinstance(self.drop_rule, Mapping):
            return self.drop_rule.get(application, "deadline")
        return self.drop_rule

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["batching_params"] = dict(self.batching_params)
        out["batching_by_application"] = {name: [policy, dict(params)] for name, (policy, params) in self.batching_by_application.items()}
        out["service_by_variant"] = {name: list(model) for name, model in self.service_by_variant.items()}
        if isinstance(self.drop_rule, Mapping):
            out["drop_rule"] = dict(self.drop_rule)
        return out


# --------------------------------------------------------------------------- result


PER_SECOND_FIELDS: tuple[str, ...] = (
    "second", "demand", "on_time", "late", "dropped", "throughput", "effective_accuracy", "best_accuracy",
    "accuracy_drop", "slo_violation_ratio", "p50_ms", "p99_ms",
)


@dataclass
class SimulationResult:
    """What a simulation measured.

    `summary`: totals (JSON-ready). `per_second`: one array per field of PER_SECOND_FIELDS; queries are
    counted in the second they arrived, except `throughput` (completions in that second). `instances`:
    per instance (every instance any plan ran): id, variant, when it was ready and stopped, batches,
    queries served, mean batch size, utilisation (busy time over the time it was up). `plans`: (time in
    seconds, Plan) for every plan applied, `replans`: one record per planner call. `queries`: per query
    id, arrival/deadline/done times (ms), outcome code (OUTCOME_NAMES) and the instance that served it.
    `batches` (only with `SimulationConfig.record_batches`): (instance id, start ms, query ids, end ms) per
    batch, in start order."""

    summary: dict[str, Any]
    per_second: dict[str, np.ndarray]
    instances: list[dict[str, Any]]
    plans: list[tuple[float, Plan]]
    replans: list[dict[str, Any]]
    queries: dict[str, np.ndarray]
    config: SimulationConfig
    batches: list[tuple[str, float, list[int], float]] = field(default_factory=list)

    def to_dict(self, *, per_second: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary, "config": self.config.to_dict(), "replans": self.replans, "instances": self.instances}
        if per_second:
            out["per_second"] = {k: [_json_number(x) for x in v.tolist()] for k, v in self.per_second.items()}
        return out

    def to_json(self, *, per_second: bool = False, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(per_second=per_second), indent=indent, allow_nan=False, default=_json_default)

    def write_csv(self, path) -> None:
        """Per-second metrics, one row per second."""
        import csv

        columns = [self.per_second[name] for name in PER_SECOND_FIELDS]
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(PER_SECOND_FIELDS)
            for row in zip(*(c.tolist() for c in columns)):
                writer.writerow(["" if isinstance(x, float) and math.isnan(x) else (round(x, 6) if isinstance(x, float) else x) for x in row])

    def plot(self, path) -> None:
        """Demand, served and dropped per second; SLO violation ratio; effective accuracy; p50/p99 latency;
        vertical lines where a plan was applied. Needs matplotlib (imported here, not at module load)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ps = self.per_second
        x = ps["second"]
        fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
        ax = axes[0]
        ax.plot(x, ps["demand"], label="demand", color="black", lw=1)
        ax.plot(x, ps["throughput"], label="throughput", lw=1)
        ax.plot(x, ps["on_time"], label="on time", lw=1)
        ax.plot(x, ps["late"] + ps["dropped"], label="late + dropped", lw=1)
        ax.set_ylabel("queries / s")
        ax.legend(loc="upper right", fontsize=8)
        axes[1].plot(x, ps["slo_violation_ratio"], color="tab:red", lw=1)
        axes[1].set_ylabel("SLO violation ratio")
        axes[1].set_ylim(bottom=0)
        axes[2].plot(x, ps["effective_accuracy"], label="effective", lw=1)
        axes[2].plot(x, ps["best_accuracy"], label="best variant", lw=1, ls="--")
        axes[2].set_ylabel("accuracy")
        axes[2].legend(loc="lower right", fontsize=8)
        axes[3].plot(x, ps["p50_ms"], label="p50", lw=1)
        axes[3].plot(x, ps["p99_ms"], label="p99", lw=1)
        axes[3].set_ylabel("latency (ms)")
        axes[3].set_xlabel("time (s)")
        axes[3].legend(loc="upper right", fontsize=8)
        for when, _ in self.plans[1:]:
            for a in axes:
                a.axvline(when, color="grey", lw=0.6, ls=":")
        s = self.summary
        fig.suptitle(
            f"{s['planner']} + {s['batching']} ({s['routing']}): {s['queries']} queries, SLO violations {s['slo_violation_ratio']:.2%}, "
            f"accuracy {_fmt(s['effective_accuracy'])}", fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _json_number(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# --------------------------------------------------------------------------- helpers


def _noise_stream(rng: np.random.Generator, sigma: float) -> Iterator[float]:
    """Mean-preserving log-normal factors exp(sigma z - sigma^2 / 2), drawn in chunks."""
    if sigma <= 0:
        return itertools.repeat(1.0)

    def chunks() -> Iterator[float]:
        shift = -0.5 * sigma * sigma
        while True:
            yield from np.exp(sigma * rng.standard_normal(_NOISE_CHUNK) + shift).tolist()

    return chunks()


def _plan_layouts(problem: Problem, plan: Plan) -> dict[str, tuple]:
    """device -> layout (placements) of every MIG GPU the plan uses: its `layouts`, else what its instances
    sit on."""
    out: dict[str, tuple] = {}
    whole = {inst.device for inst in plan.instances if inst.start is None}
    for device, placements in plan.layouts.items():
        try:
            if problem.device(device).mig:
                # An empty layout with a whole-GPU instance means MIG is off there (no layout), not a MIG
                # GPU with no instances: carrying () into the next problem would make the GPU vanish.
                out[device] = None if not placements and device in whole else layout_parse(list(placements))
        except KeyError:
            continue
    derived: dict[str, list[str]] = {}
    for inst in plan.instances:
        if inst.start is not None and inst.device not in out:
            derived.setdefault(inst.device, []).append(f"{inst.slice}@{inst.start}")
    for device, placements in derived.items():
        try:
            out[device] = layout_parse(placements)
        except ValueError:
            continue
    return out


class FlatAliasRouter:
    """The data plane's weighted routing (`routing.WeightedRouter`), for many queries of many applications
    at once: one Walker alias table per application, built by routing.py's own Vose construction, laid end
    to end in flat arrays, and drawn exactly as `WeightedRouter._draw` draws (from the same uniforms, the
    same picks; a test holds them to that).

    `tables[j]` is application j's list of (instance key, weight); keys are ints (the simulator's instance
    indices). `draw(apps, u)` returns the key per query, -1 for an application without an instance."""

    def __init__(self, n_applications: int, tables: Mapping[int, Sequence[tuple[int, float]]]) -> None:
        n_cols = np.zeros(n_applications, dtype=np.int64)
        offsets = np.zeros(n_applications, dtype=np.int64)
        keep: list[float] = []
        inst: list[int] = []
        alias_inst: list[int] = []
        self.members: list[list[int]] = [[] for _ in range(n_applications)]
        for j, entries in sorted(tables.items()):
            positive = [(str(key), float(w)) for key, w in entries if w > 0]
            if not positive:
                continue
            alias = alias_table_build(positive)
            offsets[j] = len(keep)
            n_cols[j] = len(alias.instances)
            keys = [int(i) for i in alias.instances]
            keep.extend(alias.keep)
            inst.extend(keys)
            alias_inst.extend(keys[a] for a in alias.alias)
            self.members[j] = keys
        keep.append(0.0)  # one dummy column for every application without a table
        inst.append(-1)
        alias_inst.append(-1)
        self.n_cols = n_cols
        self.offsets = np.where(n_cols > 0, offsets, len(keep) - 1)
        self.keep = np.array(keep)
        self.inst = np.array(inst, dtype=np.int64)
        self.alias = np.array(alias_inst, dtype=np.int64)

    def draw(self, apps: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Per query: column = int(u n) (n - 1 where that rounds up to n), kept if the fraction left is
        below keep[column], else its alias; -1 where the application has no table."""
        n = self.n_cols[apps]
        x = u * n
        col = x.astype(np.int64)
        np.minimum(col, np.maximum(n - 1, 0), out=col)
        g = self.offsets[apps] + col
        return np.where(x - col < self.keep[g], self.inst[g], self.alias[g])


@dataclass
class _PlanState:
    time_s: float
    plan: Plan
    assumed_rps: np.ndarray  # per application index (problem order)


@dataclass(slots=True, eq=False)
class SimPartition:
    """An MPS partition (one device's `mpsNN@k` slot): its models time-share it, one batch at a time."""

    index: int  # its position in `_Simulation.partitions` (the key of its heap events)
    device: str
    oracle: InterferenceOracle | None  # co-run slowdowns on its GPU; None: its partitions do not interfere
    members: list[SimInstance] = field(default_factory=list)  # the models it serves now (stopped ones leave)
    running: SimInstance | None = None  # the model whose batch holds it
    duty_cycle_ms: float | None = None  # None: work-conserving turns instead of duty-cycle rounds
    round: DutyCycleRound | None = None

    def duty_cycle_set(self, duty_cycle_ms: float | None) -> None:
        """A plan gives the partition its round (None: work-conserving turns, no rounds)."""
        self.duty_cycle_ms = duty_cycle_ms
        if duty_cycle_ms is None:
            return
        if self.round is None:
            self.round = DutyCycleRound(duty_cycle_ms)
        else:
            self.round.duty_cycle_set(duty_cycle_ms)


@dataclass(slots=True, eq=False)
class SimInstance:
    """One instance that some plan ran: what the plan made it, then what it is doing and has done. Held in
    `_Simulation.instances` at `index`, the number heap events, routing and `SimulationResult.queries`
    name it by."""

    index: int
    id: str
    variant: str
    device_type: str
    slice: str
    app: int  # application index (problem order)
    accuracy: float
    queue: QueryQueue
    policy: Any  # batching.BatchingPolicy
    early_drop: bool  # the policy drops from the head inside `decide` (EARLY_DROP_POLICIES)
    latency: Callable[[int], float]  # batch size -> profiled latency, as the policy sees it
    latency1_ms: float  # batch-1 latency (the drop rule's and the matching's per-query time)
    max_batch: int
    drop_rule: str
    slo_ms: float
    ready_ms: float  # routing leaves it out before then (the reconfiguration delay)
    # MPS: its partition (None: none), slice percent, the plan's predicted co-run factor and batch
    # latency (its slot in the round), the largest batch a round lets it run.
    partition: SimPartition | None
    percent: int
    plan_factor: float
    plan_latency_ms: float
    round_cap: int
    alive: bool = True  # False once a plan stopped it (a batch in flight still finishes)
    stopped_ms: float | None = None
    busy: bool = False
    busy_end: float = 0.0  # when the running batch ends (interference re-timing moves it)
    timer_at: float = _INF  # when its policy asked to decide again
    inflight: list | None = None  # the running batch's (query id, arrival, deadline)
    service_ms: float = 0.0  # the running batch's service time
    work_ms: float = 0.0  # MPS: solo work left in the running batch, as of t_last
    factor: float = 1.0  # MPS: the running batch's current co-run slowdown
    t_last: float = 0.0
    batches: int = 0
    served: int = 0
    busy_ms: float = 0.0
    solo_ms: float = 0.0  # MPS: busy time had nothing co-run


# --------------------------------------------------------------------------- the simulator


INTERFERENCE_FROM_PROBLEM = "problem"


def simulate(
    problem: Problem,
    trace: TraceLike,
    *,
    planner: str | Callable[[Problem], Plan],
    config: SimulationConfig | None = None,
    interference: InterferenceOracle | str | None = INTERFERENCE_FROM_PROBLEM,
) -> SimulationResult:
    """Simulate `trace` on the fleet of `problem`, planned (and re-planned) by `planner`: a name for
    `solve.plan_solve` (proteus, joint, garrison, clipper-ha, clipper-ht, sommelier, infaas, gpulets, sbp,
    best-fit, ideal) or a function Problem -> Plan. `interference`: the slowdown co-running MPS partitions
    cause each other ("problem": the problem's fitted model; None: none; or any `InterferenceOracle`). See
    the module docstring."""
    return _Simulation(problem, trace, planner, config or SimulationConfig(), interference).run()


def _interference_oracles(problem: Problem, interference: InterferenceOracle | str | None) -> tuple[dict[str, InterferenceOracle], str]:
    """Device type -> the oracle its MPS GPUs use, and a label for the summary."""
    mps_types = sorted({d.type for d in problem.devices if d.mps and not d.mig and not d.is_cpu})
    if interference is None or not mps_types:
        return {}, "none"
    if isinstance(interference, str):
        if interference != INTERFERENCE_FROM_PROBLEM:
            raise ValueError(f"interference must be {INTERFERENCE_FROM_PROBLEM!r}, None or an oracle, got {interference!r}")
        from engine.solvers.gpulets import interference_predictor_for

        oracles: dict[str, InterferenceOracle] = {}
        for device_type in mps_types:
            variants = {p.variant for p in problem.profiles if p.device_type == device_type and mps_slice_percent(p.slice) is not None
                        and p.l2_util_pct is not None and p.dram_util_pct is not None}
            predictor = interference_predictor_for(problem, device_type, variants, []) if variants else None
            if predictor is not None:
                oracles[device_type] = predictor
        return oracles, "problem model" if oracles else "none"
    if not callable(getattr(interference, "factor", None)):
        raise ValueError("interference must have a factor(model, batch, percent, corunner, corunner_batch, corunner_percent) method")
    return {t: interference for t in mps_types}, type(interference).__name__


class _Simulation:
    def __init__(self, problem: Problem, trace: TraceLike, planner: str | Callable[[Problem], Plan], config: SimulationConfig,
                 interference: InterferenceOracle | str | None = INTERFERENCE_FROM_PROBLEM) -> None:
        batching_policy_make(config.batching, **dict(config.batching_params))  # fail early on a bad name or parameter
        for policy, params in config.batching_by_application.values():
            batching_policy_make(policy, **dict(params))
        if config.mps_batching is not None:
            batching_policy_make(config.mps_batching)
        self.problem = problem
        self.config = config
        self.oracles, self.interference_label = _interference_oracles(problem, interference)
        if isinstance(planner, str):
            from engine.solvers.solve import plan_solve

            name = planner
            self.planner: Callable[[Problem], Plan] = lambda p: plan_solve(p, name)
            self.planner_name = name
        else:
            self.planner = planner
            self.planner_name = getattr(planner, "__name__", "custom")
        self.apps = [a.name for a in problem.applications]
        self.app_index = {name: i for i, name in enumerate(self.apps)}
        self.slo_ms = [a.slo_ms for a in problem.applications]
        self.best_accuracy = np.array([max((v.accuracy for v in problem.variants_of(a)), default=0.0) for a in self.apps])

        # Queries.
        time_s = np.asarray(trace.time_s, dtype=np.float64)
        if time_s.ndim != 1:
            raise ValueError("trace.time_s must be one-dimensional")
        if time_s.size and (not np.all(np.isfinite(time_s)) or np.any(np.diff(time_s) < 0) or time_s[0] < 0):
            raise ValueError("trace.time_s must be finite, >= 0 and sorted")
        trace_apps = list(trace.applications)
        unknown = [a for a in trace_apps if a not in self.app_index]
        if unknown:
            raise ValueError(f"the trace has applications the problem does not: {', '.join(map(str, unknown))}")
        mapping = np.array([self.app_index[a] for a in trace_apps] or [0], dtype=np.int64)
        raw_app = np.asarray(trace.application, dtype=np.int64)
        if raw_app.shape != time_s.shape:
            raise ValueError("trace.application must have one entry per request")
        if raw_app.size and (raw_app.min() < 0 or raw_app.max() >= len(trace_apps)):
            raise ValueError("trace.application indexes outside trace.applications")
        self.n = int(time_s.size)
        self.app_np = mapping[raw_app] if self.n else np.zeros(0, dtype=np.int64)
        self.arr_np = time_s * 1000.0
        slo = np.array(self.slo_ms, dtype=np.float64)
        deadline = self.arr_np + slo[self.app_np] if self.n else np.zeros(0)
        per_request = getattr(trace, "deadline_ms", None)
        if per_request is not None:
            per_request = np.asarray(per_request, dtype=np.float64)
            if per_request.shape != time_s.shape:
                raise ValueError("trace.deadline_ms must have one entry per request")
            given = np.isfinite(per_request)
            deadline = np.where(given, self.arr_np + np.where(given, per_request, 0.0), deadline)
        self.dl_np = deadline
        duration = getattr(trace, "duration_s", None)
        last = float(time_s[-1]) if self.n else 0.0
        self.duration_s = float(duration) if duration is not None and duration >= last else last

        # Per-second arrivals per application (what the control loop observes, one second after the fact).
        self.n_seconds_trace = int(math.floor(self.duration_s)) + 1
        sec = np.minimum((time_s // 1.0).astype(np.int64), self.n_seconds_trace - 1) if self.n else np.zeros(0, dtype=np.int64)
        self.counts = np.bincount(sec * len(self.apps) + self.app_np, minlength=self.n_seconds_trace * len(self.apps)).reshape(
            self.n_seconds_trace, len(self.apps)
        ) if self.n else np.zeros((self.n_seconds_trace, len(self.apps)), dtype=np.int64)

        rng = np.random.default_rng(config.seed)
        self.rng_route = np.random.default_rng(rng.integers(2**63))
        self.noise = _noise_stream(np.random.default_rng(rng.integers(2**63)), config.noise_sigma)
        # Measured service models draw from a stream of their own, seeded apart from `rng`, so that a
        # simulation without one is the same to the bit.
        self.service_model = {name: tuple(float(x) for x in model) for name, model in config.service_by_variant.items()}
        self.service_rng = np.random.default_rng([config.seed, 0x5E41]) if self.service_model else None

    # ----------------------------------------------------------------------- planning

    def _demand_problem(self, demand: np.ndarray) -> Problem:
        apps = tuple(dataclasses.replace(a, demand_rps=float(demand[i])) for i, a in enumerate(self.problem.applications))
        devices = self.problem.devices
        if self.config.carry_layouts and self.layouts:
            devices = tuple(
                dataclasses.replace(d, layout=self.layouts[d.name]) if d.mig and not d.fixed_layout and d.name in self.layouts else d
                for d in devices
            )
        # What runs now, so the planner keeps it where that costs nothing instead of reshuffling variants.
        devices = tuple(dataclasses.replace(d, running=self.running.get(d.name, ())) for d in devices)
        return dataclasses.replace(self.problem, applications=apps, devices=devices)

    def _observed_demand(self, now_s: float, burst: bool) -> np.ndarray:
        if self.config.demand_estimate == "peak":
            window = self.config.demand_window_s or PEAK_WINDOW_S
            # The whole seconds of the window that have ended, as the live loop's per-second series.
            end = min(int(math.floor(now_s + 1e-9)), self.n_seconds_trace)
            first = max(0, end - int(math.ceil(window)))
            series = self.counts[first:end].astype(float)
            horizon = self.config.forecast_horizon_s
            demand = np.array([peak_forecast_estimate(series[:, j].tolist(), horizon)[2] for j in range(len(self.apps))])
            return demand * self.config.demand_headroom
        window = self.config.demand_window_s or self.config.replan_interval_s or 1.0
        start = max(0.0, now_s - window)
        i0 = int(np.searchsorted(self.arr_np, start * 1000.0, side="left"))
        i1 = int(np.searchsorted(self.arr_np, now_s * 1000.0, side="left"))
        counts = np.bincount(self.app_np[i0:i1], minlength=len(self.apps)).astype(float)
        demand = counts / max(now_s - start, 1e-9)
        if burst:
            second = int(round(now_s)) - 1
            if 0 <= second < self.n_seconds_trace:
                demand = np.maximum(demand, self.counts[second].astype(float))
        return demand * self.config.demand_headroom

    def _initial_demand(self) -> np.ndarray:
        """The problem's demand, or the trace's mean rate over its first re-planning interval (the whole
        trace when that is shorter or re-planning is off)."""
        if self.config.initial_demand == "problem" or self.n == 0:
            return np.array([a.demand_rps for a in self.problem.applications], dtype=float)
        window = self.config.replan_interval_s or 0.0
        if window <= 0 or window > self.duration_s:
            window = self.duration_s
        if window <= 0:
            window = 1.0
        i1 = int(np.searchsorted(self.arr_np, window * 1000.0, side="right"))
        counts = np.bincount(self.app_np[:i1], minlength=len(self.apps)).astype(float)
        return counts / window * self.config.demand_headroom

    def _plan(self, demand: np.ndarray, now_s: float, reason: str) -> tuple[Plan | None, dict[str, Any]]:
        record: dict[str, Any] = {
            "time_s": now_s, "reason": reason, "demand_rps": {a: round(float(demand[i]), 6) for i, a in enumerate(self.apps)},
        }
        started = time.perf_counter()
        try:
            plan = self.planner(self._demand_problem(demand))
        except Exception as exc:  # a planner failure keeps the current plan; the record says why
            record.update(status="error", error=f"{type(exc).__name__}: {exc}", applied=False)
            plan = None
        elapsed = time.perf_counter() - started
        self.planner_seconds += elapsed
        record["planner_wall_s"] = round(elapsed, 6)
        if plan is not None:
            record["status"] = plan.status
        return plan, record

    # ----------------------------------------------------------------------- instances and routing

    def _instance_make(self, inst: PlanInstance, ready_ms: float) -> int:
        """A new record for a plan's instance (on its MPS partition, made on first use); returns its index."""
        problem = self.problem
        cfg = self.config
        variant = problem.variant(inst.variant)
        app = self.app_index[variant.application]
        dtype = problem.device(inst.device).type
        key = (inst.variant, dtype, inst.slice, inst.batch)
        cached = self._latency_cache.get(key)
        if cached is None:
            points = problem.profiles_for(inst.variant, dtype, inst.slice)
            if not points:
                raise ValueError(f"no profile for {inst.variant} on {dtype}/{inst.slice} (instance {inst.id})")
            cached = self._latency_cache[key] = policy_latency_function(points, max(1, inst.batch))
        percent = mps_slice_percent(inst.slice)
        policy = cfg.mps_batching if percent is not None and cfg.mps_batching else cfg.batching
        params = dict(cfg.batching_params) if policy == cfg.batching else {}
        own = cfg.batching_by_application.get(variant.application) if percent is None else None
        if own is not None:
            policy, params = own[0], dict(own[1])
        partition = None
        if percent is not None:  # the partition this instance time-shares
            slot = (inst.device, f"{inst.slice}@{inst.start}")
            partition = self.part_of.get(slot)
            if partition is None:
                partition = self.part_of[slot] = SimPartition(len(self.partitions), inst.device, self.oracles.get(dtype))
                self.partitions.append(partition)
                self.gpu_parts.setdefault(inst.device, []).append(partition)
        record = SimInstance(
            index=len(self.instances), id=inst.id, variant=inst.variant, device_type=dtype, slice=inst.slice, app=app,
            accuracy=variant.accuracy, queue=QueryQueue(cfg.queue_order), policy=batching_policy_make(policy, **params),
            early_drop=policy in EARLY_DROP_POLICIES, latency=cached[0], latency1_ms=cached[1], max_batch=max(1, int(inst.batch)),
            drop_rule=cfg.drop_rule_for(variant.application), slo_ms=self.slo_ms[app], ready_ms=ready_ms,
            partition=partition, percent=percent or 100, plan_factor=float(inst.interference_factor),
            plan_latency_ms=float(inst.latency_ms),
            round_cap=round_batch_cap(inst.batch, (p.batch for p in problem.profiles_for(inst.variant, dtype, inst.slice))),
        )
        self.instances.append(record)
        if partition is not None:
            partition.members.append(record)
            partition.duty_cycle_set(inst.duty_cycle_ms)
            self.rounds_pending.append(partition)
        return record.index

    def _routing_build(self, now_ms: float) -> None:
        """Alias tables of every application over its available instances (alive and ready), with the
        renormalisation `WeightedRouter.choose_excluding` does for instances that are not available."""
        per_app: dict[int, list[tuple[int, float]]] = {}
        even = self.config.routing == "even"  # the artefact's: every routed instance alike
        for app, table in self.tables.items():
            j = self.app_index.get(app)
            if j is None:
                continue
            available = []
            for instance_id, weight in table.entries:
                k = self.current.get(instance_id)
                if k is not None and weight > 0 and self.instances[k].alive and self.instances[k].ready_ms <= now_ms:
                    available.append((k, 1.0 if even else weight))
            per_app[j] = available
        self.router = FlatAliasRouter(len(self.apps), per_app)

    def _route_weights(self, apps: np.ndarray, u: np.ndarray) -> np.ndarray:
        return self.router.draw(apps, u)

    def _route_matching(self, app: int, qids: list[int], now_ms: float) -> list[int]:
        """Garrison: match the queries to the application's available instances at least predicted
        completion time (deadline misses first). An instance offers as many slots as needed, slot s free
        at max(now, busy until) + (queued + s) x its per-query time at full batch; a query's service there
        is the batch-1 latency."""
        members = self.router.members[app]
        if not members:
            return [-1] * len(qids)
        slots = -(-len(qids) // len(members))
        per_query = np.empty(len(members))
        start = np.empty(len(members))
        lat1 = np.empty(len(members))
        for m, k in enumerate(members):
            inst = self.instances[k]
            per_query[m] = inst.latency(inst.max_batch) / inst.max_batch
            start[m] = max(now_ms, inst.busy_end if inst.busy else now_ms) + len(inst.queue) * per_query[m]
            lat1[m] = inst.latency1_ms
        free = (start[:, None] + per_query[:, None] * np.arange(slots)[None, :]).ravel()
        owner = np.repeat(np.asarray(members, dtype=np.int64), slots)
        out = [-1] * len(qids)
        for q, column in queries_match_instances(self.dl_np[qids], free, np.repeat(lat1, slots)):
            out[q] = int(owner[column])
        return out

    # ----------------------------------------------------------------------- plan application

    def _plan_apply(self, plan: Plan, now_ms: float, record: dict[str, Any], initial: bool) -> list[tuple[int, float, float]]:
        """Make `plan` current: keep what it keeps, stop the rest, create the new instances (ready after
        the reconfiguration delay, or at once for the initial plan). Returns the queries that were queued
        on stopped instances, to route again."""
        old_layouts = self.layouts
        new_layouts = _plan_layouts(self.problem, plan)
        # MIG placements that survive on each GPU (mig_layout_diff's `keep`); elsewhere the instance id decides.
        surviving: dict[str, set[str]] = {}
        mig_created = mig_destroyed = 0
        for device in sorted(new_layouts):
            spec = self.problem.device(device)
            before, after = old_layouts.get(device) or (), new_layouts[device] or ()
            try:
                diff = mig_layout_diff(spec.type, before, after)
            except ValueError:
                surviving[device] = set()
                mig_created += len(after)
                mig_destroyed += len(before)
                continue
            surviving[device] = {str(p) for p in diff.keep}
            mig_created += len(diff.create)
            mig_destroyed += len(diff.destroy)

        def survives(inst: PlanInstance) -> bool:
            if inst.start is None or inst.device not in surviving:
                return True
            return f"{inst.slice}@{inst.start}" in surviving[inst.device]

        ready = now_ms if initial else now_ms + self.config.reconfiguration_delay_s * 1000.0
        new_current: dict[str, int] = {}
        kept = created = 0
        for inst in plan.instances:
            k = self.current.get(inst.id)
            if k is not None and self.instances[k].variant == inst.variant and survives(inst):
                new_current[inst.id] = k
                old = self.instances[k]
                old.max_batch = max(1, int(inst.batch))
                if old.partition is not None:  # the partition's round may have changed with the plan
                    old.partition.duty_cycle_set(inst.duty_cycle_ms)
                    old.plan_latency_ms = float(inst.latency_ms)
                    old.round_cap = max(old.round_cap, old.max_batch)  # (round_batch_cap's rule)
                    self.rounds_pending.append(old.partition)
                kept += 1
            else:
                new_current[inst.id] = self._instance_make(inst, ready)
                created += 1
                if ready > now_ms:
                    self.ready_times.add(ready)
        orphans: list[tuple[int, float, float]] = []
        destroyed = 0
        for inst_id, k in self.current.items():
            if new_current.get(inst_id) == k:
                continue
            destroyed += 1
            gone = self.instances[k]
            gone.alive = False
            gone.stopped_ms = now_ms
            gone.timer_at = _INF
            if gone.partition is not None:  # a batch in flight still finishes (and holds the partition until then)
                gone.partition.members.remove(gone)
            if len(gone.queue):
                orphans.extend(gone.queue.pop(len(gone.queue)))
        self.current = new_current
        running: dict[str, list[tuple[str, str]]] = {}
        for inst in plan.instances:
            device = self.problem.device(inst.device)
            running.setdefault(inst.device, []).append((device_slot_id(inst.slice, inst.start, is_cpu=device.is_cpu), inst.variant))
        self.running = {name: tuple(sorted(pairs)) for name, pairs in running.items()}
        self.layouts = {**old_layouts, **new_layouts}
        self.version += 1
        self.tables = routing_tables_from_plan(plan, self.version)
        record.update(applied=True, instances=len(plan.instances), kept=kept, created=created, destroyed=destroyed,
                      mig_created=mig_created, mig_destroyed=mig_destroyed, rerouted=len(orphans))
        return orphans

    # ----------------------------------------------------------------------- the run

    def run(self) -> SimulationResult:
        """Apply the first plan at time 0, then take the control events in turn (a re-plan interval, each
        whole second for the burst check, created instances becoming ready): first serve every arrival and
        every heap event before it, then handle it. Whatever is left when the arrivals end is served too."""
        wall_start = time.perf_counter()
        self._state_reset()
        self._plan_initial()
        end_ms = self.duration_s * 1000.0
        while self.next_query < self.n:
            t = min(self.next_replan, self.next_second, min(self.ready_times, default=_INF))
            if t > end_ms:
                break
            self._advance(t)
            self._control(t)
        self._advance(_INF)
        if self.next_query < self.n:  # cannot happen (_advance(inf) delivers everything); kept as a guard
            raise RuntimeError("arrivals left undelivered")
        end_time = self._unfinished_drop()
        wall = time.perf_counter() - wall_start
        result = self._result(self.outcome, self.done, self.where, self.plans, self.replans, end_time, wall)
        result.batches = self.batch_log
        return result

    def _state_reset(self) -> None:
        """Empty fleet, empty heap, no query answered."""
        cfg = self.config
        self.planner_seconds = 0.0
        self._latency_cache: dict[tuple, tuple[Callable[[int], float], float]] = {}
        self.instances: list[SimInstance] = []
        self.partitions: list[SimPartition] = []
        self.part_of: dict[tuple[str, str], SimPartition] = {}  # (device, "mpsNN@k") -> its partition
        self.gpu_parts: dict[str, list[SimPartition]] = {}  # device -> its partitions
        self.rounds_pending: list[SimPartition] = []  # partitions a plan (re)filled: their rounds may start
        self._factor_cache: dict[tuple, float] = {}
        self.current: dict[str, int] = {}  # instance id -> index, under the current plan
        self.running: dict[str, tuple[tuple[str, str], ...]] = {d.name: d.running for d in self.problem.devices if d.running}
        self.layouts: dict[str, tuple] = {d.name: d.layout for d in self.problem.devices if d.mig and d.layout is not None}
        self.version = 0
        self.tables = {}
        self.ready_times: set[float] = set()
        self.plans: list[tuple[float, Plan]] = []
        self.replans: list[dict[str, Any]] = []
        # Per query id (flat lists: the hot loops index them).
        self.arr = self.arr_np.tolist()
        self.dl = self.dl_np.tolist()
        self.outcome = bytearray(self.n)
        self.done = [math.nan] * self.n
        self.where = [-1] * self.n
        self.next_query = 0  # the first arrival not yet routed
        self.heap: list[tuple[float, int, int]] = []  # (time, event kind, instance or partition index)
        self.record_batches = cfg.record_batches
        self.batch_log: list[tuple[str, float, list[int], float]] = []
        self.log_at: dict[int, int] = {}  # instance -> its running batch's entry in batch_log (re-timed batches end later)
        self.matching = cfg.routing == "matching"
        self.next_round = cfg.matching_interval_ms
        self.interval_ms = (cfg.replan_interval_s or 0.0) * 1000.0
        self.next_replan = self.interval_ms if self.interval_ms > 0 else _INF
        self.next_second = 1000.0 if cfg.burst_factor is not None else _INF  # the burst check's

    def _plan_initial(self) -> None:
        """The planner's plan for the initial demand, every instance ready at time 0."""
        demand = self._initial_demand()
        plan, record = self._plan(demand, 0.0, "initial")
        if plan is None:
            raise RuntimeError(f"the planner failed on the initial demand: {record.get('error')}")
        self._plan_apply(plan, 0.0, record, initial=True)
        self.plans.append((0.0, plan))
        self.replans.append(record)
        self.state = _PlanState(0.0, plan, demand)
        self.last_replan_s = 0.0
        self._routing_build(0.0)
        self._rounds_start(0.0)

    # ----------------------------------------------------------------------- control events

    def _control(self, t: float) -> None:
        """The control events at `t`, in this order: created instances becoming ready, then at most one
        re-plan (the interval's, else a burst's)."""
        if any(r <= t for r in self.ready_times):
            self._on_instances_ready(t)
        reason = None
        if t == self.next_replan:
            reason = "interval"
            self.next_replan += self.interval_ms
        if t == self.next_second:
            if reason is None and self._burst_seen(t):
                reason = "burst"
            self.next_second += 1000.0
        if reason is not None:
            self._on_replan(t, reason)

    def _on_instances_ready(self, t: float) -> None:
        """Instances past their reconfiguration delay: routing takes them in from now."""
        self.ready_times = {r for r in self.ready_times if r > t}
        self._routing_build(t)

    def _burst_seen(self, t: float) -> bool:
        """The second that just ended brought some application more than `burst_factor` times what the
        current plan assumed (Proteus §3: the load balancer reports a burst), debounced since the last re-plan."""
        cfg = self.config
        second = int(round(t / 1000.0)) - 1
        if 0 <= second < self.n_seconds_trace and t / 1000.0 - self.last_replan_s >= cfg.burst_debounce_s - 1e-9:
            observed = self.counts[second]
            threshold = np.maximum(self.state.assumed_rps * cfg.burst_factor, cfg.burst_min_rps)
            return bool(np.any(observed > threshold))
        return False

    def _on_replan(self, t: float, reason: str) -> None:
        """Plan again on the observed demand and apply the plan at once: queries queued on stopped
        instances are routed again, and an instance whose batch size changed may dispatch now. A failed
        or infeasible plan leaves the current one in place."""
        now_s = t / 1000.0
        demand = self._observed_demand(now_s, burst=reason == "burst")
        plan, record = self._plan(demand, now_s, reason)
        self.replans.append(record)
        self.last_replan_s = now_s
        if plan is None:
            return
        if plan.status == "infeasible" and self.state.plan.instances:
            record.update(applied=False, error="infeasible; the current plan stays")
            return
        orphans = self._plan_apply(plan, t, record, initial=False)
        self._rounds_start(t)
        self.plans.append((now_s, plan))
        self.state = _PlanState(now_s, plan, demand)
        self._routing_build(t)
        self._reroute([qid for qid, _a, _d in orphans], t)
        for k in self.current.values():
            inst = self.instances[k]
            if inst.alive and not inst.busy and len(inst.queue):
                self._kick(inst, t)

    def _rounds_start(self, now: float) -> None:
        """Partitions with a duty cycle that a plan just filled start their rounds."""
        for part in self.rounds_pending:
            if part.round is not None and not part.round.on and part.members:
                part.round.on = True
                heappush(self.heap, (now, _ROUND, part.index))
        self.rounds_pending.clear()

    # ----------------------------------------------------------------------- arrivals

    def _advance(self, t_end: float) -> None:
        """Serve everything before `t_end`: the arrivals, merged in time order with the heap's events
        (arrivals are not pushed into the heap: that is the simulator's speed)."""
        if self.matching:
            self._on_arrivals_matched(t_end)
        else:
            self._on_arrivals_weighted(t_end)
        heap, handlers = self.heap, self._HANDLERS
        while heap and heap[0][0] < t_end:
            t, kind, key = heappop(heap)
            handlers[kind](self, t, key)

    def _on_arrivals_weighted(self, t_end: float) -> None:
        """The arrivals before `t_end`, under weighted (or even) routing. The weights do not depend on the
        state, so they are all routed at once (vectorised); then each arrives in time order, after the
        heap's events before it: its instance queues it and, if idle, decides at once; a query whose
        application has no capacity is dropped."""
        i = self.next_query
        j = bisect.bisect_left(self.arr, t_end, i)
        if j <= i:
            return
        dest = self._route_weights(self.app_np[i:j], self.rng_route.random(j - i)).tolist()
        # The simulator's hottest loop: names bound here, the arrival written inline (a call per query
        # costs ~5 %).
        arr, dl, heap, handlers, instances, kick = self.arr, self.dl, self.heap, self._HANDLERS, self.instances, self._kick
        for qid, k in zip(range(i, j), dest):
            t = arr[qid]
            while heap and heap[0][0] <= t:
                te, kind, key = heappop(heap)
                handlers[kind](self, te, key)
            if k < 0:
                self.outcome[qid] = DROPPED_NO_CAPACITY
                self.done[qid] = t
                continue
            inst = instances[k]
            inst.queue.push(qid, t, dl[qid])
            if not inst.busy:
                kick(inst, t)
        self.next_query = j

    def _on_arrivals_matched(self, t_end: float) -> None:
        """Garrison's routing: every `matching_interval_ms`, the queries that arrived since are matched to
        instances on the state at that instant (rounds without arrivals are skipped)."""
        arr, n, round_ms = self.arr, self.n, self.config.matching_interval_ms
        heap, handlers = self.heap, self._HANDLERS
        while self.next_query < n:
            i = self.next_query
            if arr[i] >= self.next_round:  # skip the empty rounds up to the next arrival
                self.next_round = (math.floor(arr[i] / round_ms) + 1) * round_ms
            t_round = self.next_round
            if t_round >= t_end:
                break
            while heap and heap[0][0] <= t_round:
                t, kind, key = heappop(heap)
                handlers[kind](self, t, key)
            j = bisect.bisect_left(arr, t_round, i)
            if j > i:
                self._reroute(list(range(i, j)), t_round)
                self.next_query = j
            self.next_round = t_round + round_ms

    def _reroute(self, qids: list[int], now: float) -> None:
        """Route queries at `now` under the current routing (arrivals of a matching round, or queries
        queued on an instance that a new plan stopped)."""
        if not qids:
            return
        apps = self.app_np[qids]
        if self.matching:
            dest = [-1] * len(qids)
            for j in np.unique(apps).tolist():
                positions = np.flatnonzero(apps == j).tolist()
                for pos, k in zip(positions, self._route_matching(j, [qids[p] for p in positions], now)):
                    dest[pos] = k
        else:
            dest = self._route_weights(apps, self.rng_route.random(len(qids))).tolist()
        self._deliver(qids, dest, now)

    def _deliver(self, qids: Sequence[int], dest: Sequence[int], now: float) -> None:
        """Queries routed at `now` (matched, or routed again): push them, then ask each idle instance once."""
        instances, arr, dl = self.instances, self.arr, self.dl
        touched = []
        for qid, k in zip(qids, dest):
            if k < 0:
                self.outcome[qid] = DROPPED_NO_CAPACITY
                self.done[qid] = now
                continue
            instances[k].queue.push(qid, arr[qid], dl[qid])
            touched.append(k)
        for k in dict.fromkeys(touched):
            if not instances[k].busy:
                self._kick(instances[k], now)

    # ----------------------------------------------------------------------- serving

    def _kick(self, inst: SimInstance, now: float) -> None:
        """The instance is idle: drop what expired, ask the policy, start a batch or set its timer (the
        batching contract, batching.py). On a partition with rounds, the round decides instead."""
        part = inst.partition
        if part is not None and part.duty_cycle_ms is not None:
            if not part.round.on and len(inst.queue):  # rounds stopped while nothing was queued: restart
                part.round.on = True  # (the round begins at the event)
                heappush(self.heap, (now, _ROUND, part.index))
            return
        self._expire(inst, now)
        q = inst.queue
        if not q:
            inst.timer_at = _INF
            return
        if part is not None and part.running is not None:  # another model's batch holds the partition: wait for the turn
            return
        b, at = inst.policy.decide(now, q, inst.latency, inst.max_batch)
        if inst.early_drop:
            self._expire(inst, now, early_only=True)
        if b <= 0:
            inst.timer_at = _INF
            return
        if at > now + _AT_EPSILON_MS:
            if inst.timer_at != at:
                inst.timer_at = at
                heappush(self.heap, (at, _TIMER, inst.index))
            return
        self._batch_start(inst, min(b, len(q), inst.max_batch), now)

    def _expire(self, inst: SimInstance, now: float, early_only: bool = False) -> None:
        """Drop the queries the instance's drop rule gives up at `now`; `early_only`: only those its policy
        already dropped from the head inside `decide` (Nexus), which the queue reports on the next call."""
        if early_only:
            dropped = inst.queue.drop_expired(now, "never", 0.0, 0.0)
        else:
            dropped = inst.queue.drop_expired(now, inst.drop_rule, inst.slo_ms, inst.latency1_ms)
        k = inst.index
        for qid in dropped:
            self.outcome[qid] = DROPPED_EXPIRED
            self.done[qid] = now
            self.where[qid] = k

    def _service_time_draw(self, inst: SimInstance, batch_size: int) -> float:
        """How long a batch of `batch_size` takes on `inst` run alone (ms): its profiled latency times a
        mean-preserving log-normal factor, or its variant's measured service model (see the module
        docstring). The one place service times come from."""
        model = self.service_model.get(inst.variant)
        if model is None:
            return inst.latency(batch_size) * next(self.noise)
        scale, per_batch_ms, sigma = model
        return (inst.latency(batch_size) * scale + per_batch_ms) * math.exp(sigma * float(self.service_rng.standard_normal()) - sigma * sigma / 2.0)

    def _batch_start(self, inst: SimInstance, b: int, now: float) -> None:
        """Take the first b queued queries and serve them; on a partition, at the co-run slowdown."""
        part = inst.partition
        inst.inflight = inst.queue.pop(b)
        svc = self._service_time_draw(inst, b)
        if part is not None:
            part.running = inst
            inst.solo_ms += svc
            inst.work_ms = svc
            inst.t_last = now
            inst.factor = self._corun_factor(inst)
            svc *= inst.factor
        end = now + svc
        inst.busy = True
        inst.busy_end = end
        inst.service_ms = svc
        inst.timer_at = _INF
        inst.busy_ms += svc
        heappush(self.heap, (end, _COMPLETE, inst.index))
        if self.record_batches:
            self.log_at[inst.index] = len(self.batch_log)
            self.batch_log.append((inst.id, now, [qid for qid, _a, _d in inst.inflight], end))
        if part is not None:
            self._corunners_retime(part, now)

    def _on_batch_end(self, t: float, k: int) -> None:
        """A batch completes (unless interference re-timed it, and a later event ends it): its queries are
        on time or late, the policy observes it, then the instance, or on a partition the next model,
        starts what it can."""
        inst = self.instances[k]
        batch = inst.inflight
        if batch is None or t != inst.busy_end:
            return
        inst.inflight = None
        inst.busy = False
        done, outcome, where = self.done, self.outcome, self.where
        tolerance = DEADLINE_TOLERANCE_MS  # the batching module's slack in every "finishes by its deadline" test
        late = 0
        for qid, _a, d in batch:
            done[qid] = t
            where[qid] = k
            if t <= d + tolerance:
                outcome[qid] = ON_TIME
            else:
                outcome[qid] = LATE
                late += 1
        size = len(batch)
        inst.batches += 1
        inst.served += size
        inst.policy.observe(size, inst.service_ms, late)
        part = inst.partition
        if part is None:
            if inst.alive:
                self._kick(inst, t)
            return
        part.running = None
        self._corunners_retime(part, t)
        if part.duty_cycle_ms is not None:
            self._partition_turn(part, t)
            return
        # No duty cycle (a model alone, or a partition written without one): work-conserving turns,
        # from the model after this one, the first that starts a batch.
        members = part.members
        if members:
            first = members.index(inst) + 1 if inst in members else 0
            for j in range(len(members)):
                m = members[(first + j) % len(members)]
                if not m.busy and len(m.queue):
                    self._kick(m, t)
                    if part.running is not None:
                        break

    def _on_timer(self, t: float, k: int) -> None:
        """The time an idle instance's policy asked to decide again (unless superseded since)."""
        inst = self.instances[k]
        if inst.timer_at == t and not inst.busy and inst.alive:
            inst.timer_at = _INF
            self._kick(inst, t)

    # ----------------------------------------------------------------------- MPS partitions

    def _on_round_start(self, t: float, p: int) -> None:
        """A partition's duty cycle begins; its first model's turn comes once no batch holds it."""
        part = self.partitions[p]
        if part.duty_cycle_ms is None:  # a plan took the partition's round away since
            return
        part.round.begin(t)
        if part.running is None:  # else a batch of the last round (or of a stopped model) ends first
            self._partition_turn(part, t)

    def _on_turn(self, t: float, p: int) -> None:
        """The next model's slot in the partition's round comes (if no batch holds the partition)."""
        part = self.partitions[p]
        if part.running is None:
            self._partition_turn(part, t)

    # Heap event kind (_COMPLETE, _TIMER, _ROUND, _TURN) -> its handler (functions, not bound methods on self:
    # those would make a reference cycle that keeps the per-query lists alive until a full collection).
    _HANDLERS = (_on_batch_end, _on_timer, _on_round_start, _on_turn)

    def _partition_turn(self, part: SimPartition, now: float) -> None:
        """The partition's round (engine/dataplane/rounds.py, the live runtime's too) offers the next
        model its slot: it runs what it has queued (its policy sizes the batch, up to its round cap, after
        the drop rule), or passes. When every model had its turn the next round begins a duty cycle after
        this one began (at once if this one overran), or, with nothing queued, when a query arrives."""
        members = part.members
        rnd = part.round
        while True:
            kind, at, j = rnd.next(now, [m.plan_latency_ms for m in members])
            if kind == ROUND_WAIT:
                heappush(self.heap, (at, _TURN, part.index))
                return
            if kind == ROUND_END:
                if any(len(m.queue) for m in members if m.alive):
                    heappush(self.heap, (at, _ROUND, part.index))
                else:
                    rnd.stop()
                return
            m = members[j]
            if m.busy or not m.alive:
                continue
            self._expire(m, now)
            q = m.queue
            if not q:
                continue
            # The round is the timer: the policy's batch runs now (its `at` is not waited for).
            b, _at = m.policy.decide(now, q, m.latency, m.round_cap)
            if m.early_drop:
                self._expire(m, now, early_only=True)
            if b > 0 and len(q):
                self._batch_start(m, min(b, len(q)), now)
                return

    def _pair_factor(self, inst: SimInstance, other: SimInstance) -> float:
        """The slowdown of inst's running batch while other's runs on another partition of the GPU."""
        oracle = inst.partition.oracle
        if oracle is None:
            return 1.0
        key = (inst.variant, len(inst.inflight), inst.percent, other.variant, len(other.inflight), other.percent)
        f = self._factor_cache.get(key)
        if f is None:
            try:
                f = max(1.0, float(oracle.factor(*key)))
            except ValueError:  # a co-location the oracle knows nothing of: the plan's own prediction
                f = max(1.0, inst.plan_factor)
            self._factor_cache[key] = f
        return f

    def _corun_factor(self, inst: SimInstance) -> float:
        """The slowdown of inst's running batch from the batches running on its GPU's other partitions."""
        part = inst.partition
        f = 1.0
        for p2 in self.gpu_parts[part.device]:
            other = p2.running
            if p2 is not part and other is not None:
                f = max(f, self._pair_factor(inst, other))
        return f

    def _retime(self, inst: SimInstance, now: float) -> None:
        """The co-runners of inst's batch changed at `now`: the work left (in solo ms) runs at the new factor."""
        f_old = inst.factor
        inst.work_ms = max(0.0, inst.work_ms - (now - inst.t_last) / f_old)
        inst.t_last = now
        f = self._corun_factor(inst)
        if f == f_old:
            return
        inst.factor = f
        end = now + inst.work_ms * f
        delta = end - inst.busy_end
        inst.busy_end = end
        inst.service_ms += delta
        inst.busy_ms += delta
        heappush(self.heap, (end, _COMPLETE, inst.index))  # the earlier completion event goes stale (busy_end moved)
        if self.record_batches and inst.index in self.log_at:
            at = self.log_at[inst.index]
            entry = self.batch_log[at]
            self.batch_log[at] = (entry[0], entry[1], entry[2], end)

    def _corunners_retime(self, part: SimPartition, now: float) -> None:
        for p2 in self.gpu_parts[part.device]:
            if p2 is not part and p2.running is not None:
                self._retime(p2.running, now)

    def _unfinished_drop(self) -> float:
        """The end of the run: whatever is still queued (a policy waiting for arrivals that never come)
        ends unfinished. Returns the end time."""
        end_time = max([self.duration_s * 1000.0] + [t for t in self.done if t == t]) if self.n else self.duration_s * 1000.0
        for inst in self.instances:
            self._expire(inst, end_time, early_only=True)  # early drops not yet collected
            q = inst.queue
            if len(q):
                for qid, _a, _d in q.pop(len(q)):
                    self.outcome[qid] = DROPPED_UNFINISHED
                    self.done[qid] = end_time
                    self.where[qid] = inst.index
        return end_time


    # ----------------------------------------------------------------------- metrics

    def _result(self, outcome_b: bytearray, done_l: list[float], where_l: list[int], plans, replans, end_time: float, wall: float) -> SimulationResult:
        cfg = self.config
        n = self.n
        outcome = np.frombuffer(bytes(outcome_b), dtype=np.uint8).copy() if n else np.zeros(0, dtype=np.uint8)
        if n and np.any(outcome == PENDING):
            raise RuntimeError(f"{int(np.sum(outcome == PENDING))} queries have no outcome")
        done = np.array(done_l, dtype=np.float64)
        where = np.array(where_l, dtype=np.int64)
        arr, dl, app = self.arr_np, self.dl_np, self.app_np
        n_seconds = max(self.n_seconds_trace, int(math.floor(end_time / 1000.0)) + 1)
        sec = np.minimum((arr // 1000.0).astype(np.int64), n_seconds - 1)
        served_mask = (outcome == ON_TIME) | (outcome == LATE)
        dropped_mask = ~served_mask
        i_acc = np.array([x.accuracy for x in self.instances] + [math.nan])
        accuracy = np.where(served_mask, i_acc[np.where(served_mask, where, -1)], np.nan)
        latency = np.where(served_mask, done - arr, np.nan)

        def count(mask: np.ndarray, index: np.ndarray = sec) -> np.ndarray:
            return np.bincount(index[mask], minlength=n_seconds).astype(np.int64)

        demand = np.bincount(sec, minlength=n_seconds).astype(np.int64)
        on_time = count(outcome == ON_TIME)
        late = count(outcome == LATE)
        dropped = count(dropped_mask)
        done_sec = np.minimum((np.nan_to_num(done, nan=0.0) // 1000.0).astype(np.int64), n_seconds - 1)
        throughput = count(served_mask, done_sec)
        served_n = on_time + late
        with np.errstate(invalid="ignore", divide="ignore"):
            eff = np.bincount(sec[served_mask], weights=accuracy[served_mask], minlength=n_seconds) / served_n
            best = np.bincount(sec[served_mask], weights=self.best_accuracy[app[served_mask]], minlength=n_seconds) / served_n
            violation = (late + dropped) / demand
        eff = np.where(served_n > 0, eff, np.nan)
        best = np.where(served_n > 0, best, np.nan)
        violation = np.where(demand > 0, violation, np.nan)
        p50 = np.full(n_seconds, np.nan)
        p99 = np.full(n_seconds, np.nan)
        if served_mask.any():
            s_sec = sec[served_mask]
            s_lat = latency[served_mask]
            order = np.lexsort((s_lat, s_sec))
            s_sec, s_lat = s_sec[order], s_lat[order]
            bounds = np.searchsorted(s_sec, np.arange(n_seconds + 1))
            for s in np.flatnonzero(served_n):
                chunk = s_lat[bounds[s]:bounds[s + 1]]
                p50[s], p99[s] = np.percentile(chunk, [50, 99])
        per_second = {
            "second": np.arange(n_seconds, dtype=np.int64), "demand": demand, "on_time": on_time, "late": late,
            "dropped": dropped, "throughput": throughput, "effective_accuracy": eff, "best_accuracy": best,
            "accuracy_drop": best - eff, "slo_violation_ratio": violation, "p50_ms": p50, "p99_ms": p99,
        }

        instances = []
        for x in self.instances:
            up_from = x.ready_ms
            up_to = x.stopped_ms if x.stopped_ms is not None else end_time
            up = max(0.0, up_to - up_from)
            instances.append({
                "index": x.index, "id": x.id, "variant": x.variant, "application": self.apps[x.app],
                "ready_s": round(up_from / 1000.0, 6), "stopped_s": None if x.stopped_ms is None else round(x.stopped_ms / 1000.0, 6),
                "max_batch": x.max_batch, "batches": x.batches, "served": x.served,
                "mean_batch": x.served / x.batches if x.batches else None,
                "busy_s": round(x.busy_ms / 1000.0, 6),
                "utilisation": min(1.0, x.busy_ms / up) if up > 0 else None,
                # MPS: the partition it time-shared, and its batches' mean slowdown from co-running partitions.
                "partition": x.id.rsplit("/", 1)[0] if x.partition is not None else None,
                "mean_interference": x.busy_ms / x.solo_ms if x.partition is not None and x.solo_ms > 0 else None,
            })

        total = int(n)
        n_served = int(served_mask.sum())
        n_late = int((outcome == LATE).sum())
        n_dropped = int(dropped_mask.sum())
        eff_total = float(np.nanmean(accuracy[served_mask])) if n_served else None
        drops = per_second["accuracy_drop"]
        drop_max = float(np.nanmax(drops)) if np.any(np.isfinite(drops)) else None
        lat_served = latency[served_mask]
        per_app = {}
        for j, name in enumerate(self.apps):
            mask = app == j
            m_served = mask & served_mask
            a_total = int(mask.sum())
            per_app[name] = {
                "queries": a_total, "on_time": int((mask & (outcome == ON_TIME)).sum()), "late": int((mask & (outcome == LATE)).sum()),
                "dropped": int((mask & dropped_mask).sum()),
                "slo_violation_ratio": float((mask & (outcome != ON_TIME)).sum() / a_total) if a_total else None,
                "effective_accuracy": float(accuracy[m_served].mean()) if m_served.any() else None,
                "latency_p99_ms": float(np.percentile(latency[m_served], 99)) if m_served.any() else None,
            }
        utilisations = [x["utilisation"] for x in instances if x["utilisation"] is not None and x["batches"]]
        sim_wall = max(wall - self.planner_seconds, 1e-9)
        summary: dict[str, Any] = {
            "planner": self.planner_name, "batching": cfg.batching, "routing": cfg.routing, "queue_order": cfg.queue_order,
            "interference": self.interference_label,
            "seed": cfg.seed, "duration_s": round(end_time / 1000.0, 6), "queries": total,
            "on_time": int((outcome == ON_TIME).sum()), "late": n_late, "dropped": n_dropped,
            **{f"{OUTCOME_NAMES[c]}": int((outcome == c).sum()) for c in (DROPPED_EXPIRED, DROPPED_NO_CAPACITY, DROPPED_UNFINISHED)},
            "throughput_qps": n_served / (end_time / 1000.0) if end_time > 0 else 0.0,
            "slo_violation_ratio": (n_late + n_dropped) / total if total else 0.0,
            "effective_accuracy": eff_total,
            "max_accuracy_drop": drop_max,
            "latency_p50_ms": float(np.percentile(lat_served, 50)) if n_served else None,
            "latency_p99_ms": float(np.percentile(lat_served, 99)) if n_served else None,
            "plans_applied": len(plans), "replans": len(replans) - 1,
            "replans_interval": sum(1 for r in replans if r["reason"] == "interval"),
            "replans_burst": sum(1 for r in replans if r["reason"] == "burst"),
            "instances_created": len(instances),
            "mean_utilisation": float(np.mean(utilisations)) if utilisations else None,
            "mean_batch": n_served / max(1, sum(x.batches for x in self.instances)) if n_served else None,
            "applications": per_app,
            "wall_s": round(wall, 6), "planner_wall_s": round(self.planner_seconds, 6),
            "simulated_queries_per_wall_s": total / sim_wall,
        }
        queries = {"arrival_ms": arr, "deadline_ms": dl, "done_ms": done, "outcome": outcome, "instance": where, "application": app}
        return SimulationResult(summary=summary, per_second=per_second, instances=instances, plans=plans, replans=replans, queries=queries, config=cfg)
