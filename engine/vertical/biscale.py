"""Biscale (Razavi's thesis P4 §p4.4-p4.5): cores, batch and instances for every stage of a CPU pipeline,
by in-place vertical scaling when load jumps and horizontal scaling when it is stable.

Transcribed:
- the model (P4.1): l_s(b, c) = gamma*b/c + eps/c + delta*b + eta (`VerticalLatency`, the same as
  Sponge's P2.2), h_s(b, c) = b / l_s(b, c), and the queueing time q_s(b) = (b - 1) / lambda (P4.4: once
  the instances together serve the rate, the first request of a batch waits for the last);
- the integer programme P4.6: minimise sum_s n_s * c_s subject to sum_s l_s(b_s, c_s) + q_s(b_s) <= SLO
  and lambda <= h_s(b_s, c_s) * n_s for every stage, b, c, n positive integers (`biscale_ip_solve`, HiGHS:
  one binary per stage and (c, b), n the fewest instances for that (c, b); `mode` restricts it to the
  vertical case, n_s fixed, or to the horizontal one, c_s = 1);
- Algorithm 3, vertical scaling (`biscale_vertical_solve`): a dynamic programme over the stages and the
  time budget 1..SLO, each stage taking (c, b) with c in 1..c_max, b in 1..b_max, the pipeline's cores the
  objective; when no configuration serves the rate, a binary search on the rate finds the most that
  vertical scaling serves, and horizontal scaling serves the rest "with the same CPU as vertical scaling"
  (more instances of the same (c, b));
- Algorithm 4, horizontal scaling (`biscale_horizontal_solve`): the same programme over one-core
  instances, the cost the instances ins = ceil(lambda / h_s(b, 1)); this is FA2's dynamic programme on a
  chain (thesis P1 §p1.4.5), so it is solved by `fa2_solve` on the pipeline at one core per instance;
- the switching rules (§p4.5, `BiscaleController`): each interval, horizontal scaling for the predicted
  load; if the running instances already serve it, stay horizontal (one core each); otherwise scale the
  running instances vertically, all of a stage to the same cores (§p4.5.2.2: an even split has the
  higher throughput); when that cannot serve the load either (§p4.5.1.2, the hardware limit), every
  running instance at its most and new instances for the rest; and once the load is stable (§p4.5.1.3:
  horizontal scaling gives the same configuration for the current and the predicted load), bring up the
  one-core instances horizontal scaling wants; when they are up the next interval finds horizontal
  enough and shrinks the vertical instances back to one core.

Where this departs, and why:
- Algorithm 3 as printed bisects with mid = (right - left) // 2, which never moves right of the middle of
  [0, right - left]; this bisects on (left + right) / 2, as the text describes, over whole requests per
  second;
- q_s(b) and every stage's time are rounded up to whole slots of `slot_ms`, as FA2's DP does, so the DP's
  plans meet the SLO on the continuous model; the IP takes the same rounding when given `slot_ms`, which is
  how the tests check that the DPs are exact;
- the vertical DP takes the stage's running instance count n_s (default 1, the thesis's case), its cores
  then cost n_s * c_s: §p4.5.2.2 scales every instance of a stage alike;
- the objective adds a batch penalty below one core (as P2.3 and P1.3 do) so that equal-core plans prefer
  smaller batches;
- the thesis predicts the next 10 s's largest load with an LSTM; the controller takes the prediction as an
  input (the simulator and the agent give it max(recent peak, Holt's forecast), `engine/forecasting`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Sequence

import numpy as np

from engine.pipelines.fa2 import fa2_solve
from engine.pipelines.problem import ExecutionPath, PipelineProblem, PipelineStage, StageLatency, queueing_delay_ms
from engine.vertical.sponge import CORES_MAX, BATCH_MAX, VerticalLatency

__all__ = ["BiscaleController", "BiscalePlan", "BiscaleProblem", "BiscaleStage", "BiscaleStageDecision", "StageTarget",
           "biscale_horizontal_solve", "biscale_ip_solve", "biscale_plan_validate", "biscale_vertical_solve"]

BiscaleMode = Literal["joint", "vertical", "horizontal"]


@dataclass(frozen=True)
class BiscaleStage:
    """A stage: its latency model (anything with `l(b, c)` and `throughput_rps(b, c)`: the fitted P4.1, or
    a plan's measured profile table), its largest batch and cores, and, where only some core counts may be
    chosen (a plan sticks to profiled counts), those."""

    name: str
    latency: VerticalLatency
    max_batch: int = BATCH_MAX
    max_cores: int = CORES_MAX
    core_counts: tuple[int, ...] | None = None

    def cores_allowed(self) -> tuple[int, ...]:
        if self.core_counts is None:
            return tuple(range(1, self.max_cores + 1))
        return tuple(c for c in sorted(set(self.core_counts)) if 1 <= c <= self.max_cores)


@dataclass(frozen=True)
class BiscaleProblem:
    """A chain of stages (Biscale's pipelines are chains with one end-to-end SLO, §p4.3.3), the SLO (ms) and
    the arrival rate (requests per second)."""

    stages: tuple[BiscaleStage, ...]
    slo_ms: float
    rate_rps: float
    by_name: Mapping[str, BiscaleStage] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique: {names}")
        for s in self.stages:
            if s.max_batch < 1 or s.max_cores < 1:
                raise ValueError(f"stage {s.name}: max_batch and max_cores must be >= 1")
        if not (math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise ValueError(f"slo_ms must be a finite number > 0, got {self.slo_ms!r}")
        if not (math.isfinite(self.rate_rps) and self.rate_rps > 0):
            raise ValueError(f"rate_rps must be a finite number > 0, got {self.rate_rps!r}")
        object.__setattr__(self, "by_name", {s.name: s for s in self.stages})

    def with_rate(self, rate_rps: float) -> "BiscaleProblem":
        return replace(self, rate_rps=rate_rps)

    def stage_time_ms(self, stage: BiscaleStage, batch: int, cores: int) -> float:
        """l_s(b, c) + q_s(b) (P4.5's summand)."""
        return stage.latency.l(batch, cores) + queueing_delay_ms(batch, self.rate_rps)

    def batch_penalty(self) -> float:
        return 1.0 / (1.0 + sum(s.max_batch for s in self.stages))


@dataclass(frozen=True)
class BiscaleStageDecision:
    stage: str
    cores: int  # per instance
    batch: int
    instances: int


@dataclass(frozen=True)
class BiscalePlan:
    solver: str
    status: str  # "optimal" | "feasible" | "infeasible"
    decisions: Mapping[str, BiscaleStageDecision]
    objective: float | None  # sum of instances * cores
    runtime_s: float
    vertical_rate_rps: float | None = None  # Algorithm 3 with too much load: the rate the vertical part serves
    bound: float | None = None
    gap: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def cores(self) -> int:
        return sum(d.cores * d.instances for d in self.decisions.values())


def _slots(ms: float, slot_ms: float) -> int:
    return math.ceil(ms / slot_ms - 1e-9)


def _check_slot(slot_ms: float) -> None:
    if not (math.isfinite(slot_ms) and slot_ms > 0):
        raise ValueError(f"slot_ms must be a finite number > 0, got {slot_ms!r}")


def _vertical_dp(problem: BiscaleProblem, instances: Mapping[str, int], slot_ms: float, cores_cap: int | None) -> dict[str, BiscaleStageDecision] | None:
    """Algorithm 3's table: opt_s[t], the fewest cores stages s.. need within t slots (plus the batch
    penalty), filled from the last stage back (the recursion is the same read either way on a chain)."""
    horizon = math.floor(problem.slo_ms / slot_ms + 1e-9)
    delta = problem.batch_penalty()
    after = np.zeros(horizon + 1)  # nothing after the last stage costs nothing
    choices: list[np.ndarray] = []
    for stage in reversed(problem.stages):
        n = instances.get(stage.name, 1)
        best = np.full(horizon + 1, np.inf)
        chosen = np.full((horizon + 1, 2), -1, dtype=np.int32)
        for c in stage.cores_allowed():
            for b in range(1, stage.max_batch + 1):
                if n * stage.latency.throughput_rps(b, c) < problem.rate_rps - 1e-9:
                    continue  # the stage's instances must serve the rate
                used = _slots(problem.stage_time_ms(stage, b, c), slot_ms)
                if used > horizon:
                    continue
                value = n * c + delta * b + after[: horizon + 1 - used]
                better = value < best[used:] - 1e-12
                best[used:][better] = value[better]
                chosen[used:][better] = (c, b)
        after = best
        choices.append(chosen)
    if not math.isfinite(after[horizon]):
        return None
    decisions = {}
    budget = horizon
    for stage, chosen in zip(problem.stages, reversed(choices)):
        c, b = (int(x) for x in chosen[budget])
        decisions[stage.name] = BiscaleStageDecision(stage.name, c, b, instances.get(stage.name, 1))
        budget -= _slots(problem.stage_time_ms(stage, b, c), slot_ms)
    if cores_cap is not None and sum(d.cores * d.instances for d in decisions.values()) > cores_cap:
        return None
    return decisions


def _objective(problem: BiscaleProblem, decisions: Mapping[str, BiscaleStageDecision]) -> float:
    return float(sum(d.cores * d.instances for d in decisions.values()))


def biscale_vertical_solve(problem: BiscaleProblem, *, instances: Mapping[str, int] | None = None, slot_ms: float = 1.0,
                           cores_cap: int | None = None) -> BiscalePlan:
    """Algorithm 3 (see the module docstring). `instances`: the running instances per stage (default 1);
    `cores_cap`: the cores the host(s) can give the pipeline in all (the hardware limit, §p4.3.1 [HL]).
    When vertical scaling alone cannot serve the rate, status "feasible", `vertical_rate_rps` the rate it
    serves, and each stage more instances of its vertical (c, b) for the rest; "infeasible" when not even
    one request per second fits the SLO."""
    _check_slot(slot_ms)
    started = time.perf_counter()
    running = {s.name: max(1, int((instances or {}).get(s.name, 1))) for s in problem.stages}
    decisions = _vertical_dp(problem, running, slot_ms, cores_cap)
    if decisions is not None:
        return BiscalePlan("biscale-vertical", "optimal", decisions, _objective(problem, decisions), time.perf_counter() - started)
    # Lines 22-30: the most load vertical scaling serves, by bisection on whole requests per second.
    left, right = 0, math.ceil(problem.rate_rps)
    best = None
    while right - left > 1:
        mid = (left + right) // 2
        found = _vertical_dp(problem.with_rate(mid), running, slot_ms, cores_cap)
        if found is not None:
            left, best = mid, found
        else:
            right = mid
    if best is None:
        best = _vertical_dp(problem.with_rate(1), running, slot_ms, cores_cap) if problem.rate_rps > 1 else None
        left = 1 if best is not None else 0
    if best is None:
        return BiscalePlan("biscale-vertical", "infeasible", {}, None, time.perf_counter() - started,
                           notes=(f"no cores up to each stage's maximum keep the pipeline within {problem.slo_ms:g} ms",))
    rest = problem.rate_rps - left
    decisions = {}
    for stage in problem.stages:
        d = best[stage.name]
        extra = math.ceil(rest / stage.latency.throughput_rps(d.batch, d.cores) - 1e-9)
        decisions[stage.name] = replace(d, instances=d.instances + extra)
    return BiscalePlan("biscale-vertical", "feasible", decisions, _objective(problem, decisions), time.perf_counter() - started,
                       vertical_rate_rps=float(left),
                       notes=(f"vertical scaling serves {left} of {problem.rate_rps:g} rps; more instances of the same size serve the rest",))


def horizontal_pipeline_problem(problem: BiscaleProblem) -> PipelineProblem:
    """The pipeline at one core per instance, as FA2's problem: d_s(b) = l_s(b, 1) is linear in b."""
    stages = []
    for s in problem.stages:
        m = s.latency
        stages.append(PipelineStage(s.name, StageLatency(0.0, m.gamma1 + m.delta1, m.eps1 + m.eta1), max_batch=s.max_batch))
    path = ExecutionPath("chain", tuple(s.name for s in problem.stages), problem.slo_ms, problem.rate_rps)
    return PipelineProblem(tuple(stages), (path,))


def biscale_horizontal_solve(problem: BiscaleProblem, *, slot_ms: float = 1.0) -> BiscalePlan:
    """Algorithm 4: one-core instances, each stage's batch and instance count, by FA2's DP."""
    _check_slot(slot_ms)
    started = time.perf_counter()
    plan = fa2_solve(horizontal_pipeline_problem(problem), slot_ms=slot_ms)
    if plan.status == "infeasible":
        return BiscalePlan("biscale-horizontal", "infeasible", {}, None, time.perf_counter() - started, notes=plan.notes)
    decisions = {name: BiscaleStageDecision(name, 1, d.batch, d.instances) for name, d in plan.decisions.items()}
    decisions = {s.name: decisions[s.name] for s in problem.stages}
    return BiscalePlan("biscale-horizontal", "optimal", decisions, _objective(problem, decisions), time.perf_counter() - started)


def biscale_ip_solve(problem: BiscaleProblem, *, mode: BiscaleMode = "joint", instances: Mapping[str, int] | None = None,
                     slot_ms: float | None = None, time_limit_s: float = 30.0) -> BiscalePlan:
    """P4.6 for HiGHS (see the module docstring). `mode`: "joint" (c, b and n free), "vertical" (n_s fixed
    to `instances`, default 1) or "horizontal" (c_s = 1). `slot_ms`: round every stage's time up to whole
    slots and the SLO down, as the DPs do (None: the continuous model)."""
    import pulp

    from engine.plans.problem import SolveOptions
    from engine.solvers.milp import milp_solve

    started = time.perf_counter()
    if mode not in ("joint", "vertical", "horizontal"):
        raise ValueError(f"mode must be joint, vertical or horizontal, got {mode!r}")
    fixed = {s.name: max(1, int((instances or {}).get(s.name, 1))) for s in problem.stages}
    delta = problem.batch_penalty()

    def time_of(stage: BiscaleStage, b: int, c: int) -> float:
        ms = problem.stage_time_ms(stage, b, c)
        return float(_slots(ms, slot_ms)) if slot_ms else ms

    slo = float(math.floor(problem.slo_ms / slot_ms + 1e-9)) if slot_ms else problem.slo_ms
    options: dict[tuple[str, int, int], int] = {}  # (stage, c, b) -> n
    for s in problem.stages:
        for c in ((1,) if mode == "horizontal" else s.cores_allowed()):
            for b in range(1, s.max_batch + 1):
                h = s.latency.throughput_rps(b, c)
                if mode == "vertical":
                    if fixed[s.name] * h < problem.rate_rps - 1e-9:
                        continue
                    n = fixed[s.name]
                else:
                    n = max(1, math.ceil(problem.rate_rps / h - 1e-9))
                if time_of(s, b, c) <= slo + 1e-9:
                    options[(s.name, c, b)] = n
    lp = pulp.LpProblem("biscale", pulp.LpMinimize)
    x = {key: pulp.LpVariable(f"x_{i}", cat="Binary") for i, key in enumerate(options)}
    lp += pulp.lpSum((n * key[1] + delta * key[2]) * x[key] for key, n in options.items())
    for s in problem.stages:
        lp += pulp.lpSum(x[k] for k in options if k[0] == s.name) == 1, f"one_configuration_{s.name}"
    lp += pulp.lpSum(time_of(problem.by_name[k[0]], k[2], k[1]) * x[k] for k in options) <= slo, "end_to_end_within_slo"
    if any(not any(k[0] == s.name for k in options) for s in problem.stages):
        return BiscalePlan(f"biscale-ip-{mode}", "infeasible", {}, None, time.perf_counter() - started,
                           notes=("a stage has no configuration within the SLO that serves the rate",))
    result = milp_solve(lp, SolveOptions(threads=1), time_limit_s=time_limit_s)
    if not result.has_solution:
        status = "infeasible" if result.state == "infeasible" else "no-solution"
        return BiscalePlan(f"biscale-ip-{mode}", status, {}, None, time.perf_counter() - started, notes=(f"{result.backend}: {result.state}",))
    decisions = {}
    for key, var in x.items():
        if (var.value() or 0) > 0.5:
            name, c, b = key
            decisions[name] = BiscaleStageDecision(name, c, b, options[key])
    decisions = {s.name: decisions[s.name] for s in problem.stages}
    return BiscalePlan(f"biscale-ip-{mode}", "optimal" if result.state == "optimal" else "feasible", decisions, _objective(problem, decisions),
                       time.perf_counter() - started, bound=result.bound, gap=result.gap)


def biscale_plan_validate(problem: BiscaleProblem, plan: BiscalePlan) -> list[str]:
    """Independent check of a plan with decisions: every stage decided, within its limits, the instances
    together serve the rate and the stages' times sum within the SLO (P4.6's constraints)."""
    errors: list[str] = []
    if not plan.decisions:
        return errors if plan.status in ("infeasible", "no-solution") else ["a plan that claims a solution decides no stage"]
    total = 0.0
    for s in problem.stages:
        d = plan.decisions.get(s.name)
        if d is None:
            errors.append(f"stage {s.name} is not decided")
            continue
        if not (1 <= d.cores <= s.max_cores and 1 <= d.batch <= s.max_batch and d.instances >= 1):
            errors.append(f"stage {s.name}: {d.cores} cores, batch {d.batch}, {d.instances} instances is outside 1..{s.max_cores} cores, 1..{s.max_batch} batch")
            continue
        served = d.instances * s.latency.throughput_rps(d.batch, d.cores)
        if served < problem.rate_rps - 1e-6:
            errors.append(f"stage {s.name}: {d.instances} x h({d.batch}, {d.cores}) = {served:.4g} rps < {problem.rate_rps:g}")
        total += problem.stage_time_ms(s, d.batch, d.cores)
    if total > problem.slo_ms + 1e-6:
        errors.append(f"the stages take {total:.4g} ms end to end, over the SLO of {problem.slo_ms:g} ms")
    extra = [name for name in plan.decisions if name not in problem.by_name]
    if extra:
        errors.append(f"decisions for stages not in the pipeline: {extra}")
    return errors


# --------------------------------------------------------------------------- switching (§p4.5)


@dataclass(frozen=True)
class StageTarget:
    """What one stage should run from now: its running instances resized to `cores` (in place), batch cap
    `batch`, `start` new instances of `start_cores` each, `stop` instances stopped (starting ones first)."""

    cores: int
    batch: int
    start: int = 0
    start_cores: int = 1
    stop: int = 0


@dataclass(frozen=True)
class BiscaleDecision:
    mode: str  # "horizontal" | "vertical" | "vertical-to-horizontal" | "hardware-limit" | "unservable"
    targets: Mapping[str, StageTarget]
    reason: str


class BiscaleController:
    """Biscale's optimizer with its switching rules (§p4.3.2 "optimizer", §p4.5; see the module docstring).
    Stateless between calls: everything it needs is in the arguments, so the agent's fast loop and the
    simulator call it alike. `stages` and `slo_ms` are the pipeline; `cores_cap` the cores the pipeline's
    host gives it in all (None: no limit beyond each stage's max_cores)."""

    def __init__(self, stages: Sequence[BiscaleStage], slo_ms: float, *, cores_cap: int | None = None, slot_ms: float = 1.0) -> None:
        self.template = BiscaleProblem(tuple(stages), slo_ms, 1.0)
        self.cores_cap = cores_cap
        self.slot_ms = slot_ms

    def _horizontal(self, rate: float) -> BiscalePlan:
        return biscale_horizontal_solve(self.template.with_rate(max(rate, 1e-3)), slot_ms=self.slot_ms)

    def decide(self, *, rate_rps: float, predicted_rps: float, ready: Mapping[str, int], starting: Mapping[str, int]) -> BiscaleDecision:
        """`rate_rps`: the arrival rate measured over the last interval; `predicted_rps`: the largest rate
        expected over the next ones; `ready` / `starting`: each stage's instances serving / still starting."""
        names = [s.name for s in self.template.stages]
        ready = {n: max(0, int(ready.get(n, 0))) for n in names}
        starting = {n: max(0, int(starting.get(n, 0))) for n in names}
        rate = max(rate_rps, 1e-3)
        wanted = self._horizontal(max(rate_rps, predicted_rps))
        if wanted.status == "optimal" and all(ready[n] >= wanted.decisions[n].instances for n in names):
            targets = {n: StageTarget(1, wanted.decisions[n].batch, stop=starting[n] + ready[n] - wanted.decisions[n].instances) for n in names}
            return BiscaleDecision("horizontal", targets, f"one-core instances serve {max(rate_rps, predicted_rps):.3g} rps")
        running = {n: max(1, ready[n]) for n in names}
        vertical = biscale_vertical_solve(self.template.with_rate(rate), instances=running, slot_ms=self.slot_ms, cores_cap=self.cores_cap)
        if vertical.status == "optimal":
            now = self._horizontal(rate_rps)
            stable = wanted.status == "optimal" and now.status == "optimal" and all(
                now.decisions[n].instances == wanted.decisions[n].instances for n in names)
            targets = {}
            for n in names:
                d = vertical.decisions[n]
                start = max(0, wanted.decisions[n].instances - ready[n] - starting[n]) if stable else 0
                targets[n] = StageTarget(d.cores, d.batch, start=start, start_cores=1)
            mode = "vertical-to-horizontal" if stable and any(t.start for t in targets.values()) else "vertical"
            return BiscaleDecision(mode, targets, f"in-place vertical scaling serves {rate_rps:.3g} rps on the running instances"
                                   + ("; the load is stable: one-core instances start" if mode != "vertical" else ""))
        if vertical.status == "feasible":
            targets = {}
            for n in names:
                d = vertical.decisions[n]
                targets[n] = StageTarget(d.cores, d.batch, start=max(0, d.instances - running[n] - starting[n]), start_cores=d.cores)
            return BiscaleDecision("hardware-limit", targets, f"vertical scaling serves {vertical.vertical_rate_rps:g} of {rate_rps:.3g} rps; "
                                   "new instances of the same size start for the rest")
        # Not even vertical scaling keeps one request per second within the SLO: every core there is, and
        # one-core instances for the rest if horizontal scaling can serve at all.
        targets = {}
        for s in self.template.stages:
            more = wanted.decisions[s.name].instances - ready[s.name] - starting[s.name] if wanted.status == "optimal" else 0
            targets[s.name] = StageTarget(s.max_cores, 1, start=max(0, more))
        return BiscaleDecision("unservable", targets, f"no configuration keeps {self.template.slo_ms:g} ms at {rate_rps:.3g} rps")
