"""IPA (Razavi's thesis P3 §p3.4): for a linear pipeline, each stage's model variant, replicas and batch
size, trading accuracy against cost: the integer programme P3.10, solved exactly.

Transcribed from §p3.4.3: a stage s runs exactly one variant m (I_{s,m}, P3.3, P3.10d); its replicas each
take the variant's base allocation R_m of CPU cores (P3.4); its latency and throughput are the active
variant's, l_{s,m}(b) = alpha*b^2 + beta*b + gamma and h_{s,m}(b) = b / l_{s,m}(b) (P3.5, P3.6, fitted as in
§p3.4.2); its worst-case queueing delay is q_s(b) = (b - 1) / lambda (P3.7). The pipeline accuracy score is
PAS = prod_s sum_m a_{s,m} I_{s,m} (P3.8), and IPA solves

    max  alpha * PAS - beta * sum_s n_s R_s - delta * sum_s b_s                        (P3.9, P3.10a)
    s.t. sum_s l_s(b_s) + q_s(b_s) <= SLA_p                                             (P3.10b)
         n_s * h_s(b_s) >= lambda_p                                                     (P3.10c)
         one variant per stage, n_s and b_s positive integers                            (P3.10d, e)

with per-pipeline weights alpha, beta (the thesis's Appendix P3.10 sets them per pipeline) and a small
delta. A (variant, batch) choice y_{s,m,b} fixes the fewest replicas, ceil(lambda / h_{s,m}(b)), so replicas
are constants of the choice, and P3.10 is: pick one choice per stage, the times adding up to at most the
SLO, maximising alpha * exp(sum of log accuracies) - (sum of beta * cores + delta * batch).

`ipa_solve` finds that optimum exactly by a dynamic programme over the stages in order: a partial plan of
the first k stages is (time so far, cost so far, log PAS so far), and one that is no faster, no cheaper and
no more accurate than another is dropped (Pareto dominance: whatever completes it completes the other at
least as well, since the objective rises with PAS and falls with cost, and the SLO is on the time); a
partial plan is dropped too when even a relaxed completion of it (the remaining stages' times rounded
down to 1/2048 of the SLO, their least cost and highest PAS bounded apart) cannot reach a complete plan
already found. The plans left after the last stage contain the optimum; it is picked by the objective
itself. 10 stages of 10 variants take a fraction of a second (benches/pipelines.py). `ipa_milp_solve` is the same optimum found with
HiGHS along the cost-accuracy frontier (the previous method, 8-20 s at that size), kept as a cross-check.

Where this departs, and why: the base allocation R_m (P3.1, the fewest cores meeting a throughput
threshold `th` within the stage SLA) is an input per variant (`IpaVariant.cores`), as the thesis's own
Table P3.5 gives it, not searched here; batches run 1..max_batch rather than only powers of two (the
quadratic fit covers the rest, as §p3.4.2 intends); l_{s,m}(b) is the variant's profiled latency, linear
between profiled batches, where its `StageLatency` carries a profile (`profiled_ms`: what the fleet's
validator checks; the fitted quadratic otherwise); the thesis solves P3.10 as one programme with Gurobi
("in less than a second", §p3.4.4), this solves it by the dynamic programme above, with no solver, to meet
the thesis's 2 s at 10 x 10 (Fig. P3.13) on two CPU cores.""" 
from __future__ import annotations

import bisect
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pulp

from engine.pipelines.problem import PipelineProblemError, StageLatency, instances_for, queueing_delay_ms
from engine.plans.problem import SolveOptions
from engine.solvers.milp import milp_solve

__all__ = ["IpaPipeline", "IpaPlan", "IpaStage", "IpaStageChoice", "IpaVariant", "ipa_brute_force", "ipa_fixed_variant_solve",
           "ipa_milp_solve", "ipa_plan_validate", "ipa_solve"]


@dataclass(frozen=True)
class IpaVariant:
    name: str
    accuracy: float  # 0..1 (or any "higher is better" measure scaled to 0..1, §p3.4.1)
    cores: int  # R_m: the base allocation of one replica
    latency: StageLatency


@dataclass(frozen=True)
class IpaStage:
    name: str
    variants: tuple[IpaVariant, ...]
    max_batch: int = 64


@dataclass(frozen=True)
class IpaPipeline:
    """A linear pipeline: stages in order, the end-to-end SLO, the arrival rate and the objective's weights."""

    name: str
    stages: tuple[IpaStage, ...]
    slo_ms: float
    rate_rps: float
    alpha: float = 1.0
    beta: float = 0.01
    delta: float = 1e-6
    # Replicas are sized for this multiple of the rate; queueing delay is the real rate's.
    headroom: float = 1.0
    variant_index: dict[tuple[str, str], IpaVariant] = field(init=False, repr=False, compare=False)  # (stage, variant) -> variant

    def __post_init__(self) -> None:
        if not self.stages:
            raise PipelineProblemError(f"pipeline {self.name!r} has no stages")
        if len({s.name for s in self.stages}) != len(self.stages):
            raise PipelineProblemError(f"pipeline {self.name!r}: stage names must be unique")
        for value, label in ((self.slo_ms, "slo_ms"), (self.rate_rps, "rate_rps")):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise PipelineProblemError(f"pipeline {self.name!r}: {label} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.headroom, (int, float)) and math.isfinite(self.headroom) and self.headroom >= 1):
            raise PipelineProblemError(f"pipeline {self.name!r}: headroom must be a finite number >= 1, got {self.headroom!r}")
        for value, label in ((self.alpha, "alpha"), (self.beta, "beta"), (self.delta, "delta")):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise PipelineProblemError(f"pipeline {self.name!r}: {label} must be a finite number >= 0, got {value!r}")
        for s in self.stages:
            if not s.variants:
                raise PipelineProblemError(f"stage {s.name!r} has no variants")
            if len({v.name for v in s.variants}) != len(s.variants):
                raise PipelineProblemError(f"stage {s.name!r}: variant names must be unique")
            if isinstance(s.max_batch, bool) or not isinstance(s.max_batch, int) or s.max_batch < 1:
                raise PipelineProblemError(f"stage {s.name!r}: max_batch must be an integer >= 1")
            for v in s.variants:
                if not 0 <= v.accuracy <= 1:
                    raise PipelineProblemError(f"stage {s.name!r} variant {v.name!r}: accuracy must lie in [0, 1], got {v.accuracy!r}")
                if isinstance(v.cores, bool) or not isinstance(v.cores, int) or v.cores < 1:
                    raise PipelineProblemError(f"stage {s.name!r} variant {v.name!r}: cores must be an integer >= 1")
        object.__setattr__(self, "variant_index", {(st.name, v.name): v for st in self.stages for v in st.variants})

    def queueing_ms(self, batch: int) -> float:
        return queueing_delay_ms(batch, self.rate_rps)

    def time_ms(self, variant: IpaVariant, batch: int) -> float:
        """l_{s,m}(b) + q_s(b), l on the profiled latency (`StageLatency.profiled_ms`: infinite outside the
        profiled batches)."""
        return variant.latency.profiled_ms(batch) + self.queueing_ms(batch)

    def replicas(self, variant: IpaVariant, batch: int) -> int:
        """The fewest replicas serving headroom x the rate at `batch` (a batch inside the profiled range)."""
        return instances_for(self.headroom * self.rate_rps, variant.latency.profiled_throughput_rps(batch))


@dataclass(frozen=True)
class IpaStageChoice:
    stage: str
    variant: str
    batch: int
    replicas: int
    cores: int  # replicas x the variant's base allocation


@dataclass(frozen=True)
class IpaPlan:
    solver: str
    status: str  # "optimal", "feasible", "infeasible" (proved) or "no-solution" (none found in the time limit)
    choices: tuple[IpaStageChoice, ...]
    pas: float | None
    cores: int | None
    objective: float | None
    bound: float | None = None
    gap: float | None = None
    runtime_s: float = 0.0
    notes: tuple[str, ...] = ()


def _variant(pipeline: IpaPipeline, stage: str, name: str) -> IpaVariant:
    return pipeline.variant_index[(stage, name)]


def _plan_from(pipeline: IpaPipeline, solver: str, status: str, picks: list[tuple[IpaStage, IpaVariant, int]], *, bound=None, gap=None,
               started: float, notes: tuple[str, ...] = ()) -> IpaPlan:
    choices = tuple(IpaStageChoice(s.name, v.name, b, pipeline.replicas(v, b), pipeline.replicas(v, b) * v.cores) for s, v, b in picks)
    pas = math.prod(v.accuracy for _s, v, _b in picks)
    cores = sum(c.cores for c in choices)
    objective = pipeline.alpha * pas - pipeline.beta * cores - pipeline.delta * sum(c.batch for c in choices)
    return IpaPlan(solver, status, choices, pas, cores, objective, bound, gap, time.perf_counter() - started, notes)


def _candidates(pipeline: IpaPipeline, stage: IpaStage, variants: tuple[IpaVariant, ...] | None = None, *,
                dominated: bool = False) -> list[tuple[IpaVariant, int]]:
    """(variant, batch) pairs whose time at the stage fits the SLO on its own. Without `dominated`, a batch
    is left out when a smaller batch of the same variant needs no more replicas and no more time: it costs
    no fewer cores, has the same accuracy and pays more batch penalty, so no optimum needs it (this leaves
    a few batches per variant instead of max_batch). A profile need not grow with the batch, so every
    batch is looked at."""
    out = []
    for v in variants or stage.variants:
        kept: list[tuple[int, float]] = []  # (replicas, time) of the batches kept so far
        for b in range(1, stage.max_batch + 1):
            spent = pipeline.time_ms(v, b)
            if not math.isfinite(spent) or spent > pipeline.slo_ms:
                continue
            replicas = pipeline.replicas(v, b)
            if dominated or not any(r <= replicas and t <= spent for r, t in kept):
                out.append((v, b))
                kept.append((replicas, spent))
    return out


def _infeasible(solver: str, started: float, reason: str, status: str = "infeasible") -> IpaPlan:
    return IpaPlan(solver, status, (), None, None, None, runtime_s=time.perf_counter() - started, notes=(reason,))


def _pas_log(accuracy: float) -> float:
    return math.log(accuracy) if accuracy > 0 else -1e9  # a variant of accuracy 0 makes PAS 0


_PAS_STEP = 1e-6  # log PAS: the next step asks for this much more (HiGHS's tolerances are about 1e-6 too)


def _choice_cores(pipeline: IpaPipeline, y: dict[tuple[int, str, int], pulp.LpVariable]) -> pulp.LpAffineExpression:
    return pulp.lpSum(pipeline.replicas(_variant(pipeline, pipeline.stages[k].name, m), b) * _variant(pipeline, pipeline.stages[k].name, m).cores * var
                      for (k, m, b), var in y.items())


def _choice_log_pas(pipeline: IpaPipeline, y: dict[tuple[int, str, int], pulp.LpVariable]) -> pulp.LpAffineExpression:
    return pulp.lpSum(_pas_log(_variant(pipeline, pipeline.stages[k].name, m).accuracy) * var for (k, m, _b), var in y.items())


def _feasible_configurations(lp: pulp.LpProblem, pipeline: IpaPipeline, y: dict[tuple[int, str, int], pulp.LpVariable]) -> None:
    """One (variant, batch) per stage (P3.10d) and the SLO end to end (P3.10b); the replicas of each choice
    serve the rate by construction (P3.10c)."""
    for k in range(len(pipeline.stages)):
        lp += pulp.lpSum(var for (kk, _m, _b), var in y.items() if kk == k) == 1, f"one_choice_{k}"
    lp += pulp.lpSum(pipeline.time_ms(_variant(pipeline, pipeline.stages[k].name, m), b) * var for (k, m, b), var in y.items()) <= pipeline.slo_ms, "slo"


def _picks(pipeline: IpaPipeline, y: dict[tuple[int, str, int], pulp.LpVariable]) -> list[tuple[IpaStage, IpaVariant, int]]:
    picks = []
    for k, stage in enumerate(pipeline.stages):
        (m, b), = [(m, b) for (kk, m, b), var in y.items() if kk == k and (var.value() or 0) > 0.5]
        picks.append((stage, _variant(pipeline, stage.name, m), b))
    return picks


_GRID = 2048  # time slots of the SLO for the bounds (the bounds only prune; the plan's times are exact)


def _pareto(time_ms: np.ndarray, cost: np.ndarray, log_pas: np.ndarray) -> np.ndarray:
    """Indices of the items that no other beats: none has time <=, cost <= and log PAS >= (of equal ones,
    one). Sorted by time, each is checked against a staircase of the (cost, log PAS) kept so far, costs
    ascending with log PAS rising."""
    order = np.lexsort((-log_pas, cost, time_ms))
    costs: list[float] = []
    accuracies: list[float] = []
    kept = []
    for i, c, a in zip(order.tolist(), cost[order].tolist(), log_pas[order].tolist()):
        j = bisect.bisect_right(costs, c)
        if j > 0 and accuracies[j - 1] >= a:
            continue  # one kept already is as fast, as cheap and as accurate
        kept.append(i)
        end = j
        while end < len(costs) and accuracies[end] <= a:
            end += 1
        costs[j:end] = [c]
        accuracies[j:end] = [a]
    return np.array(kept, dtype=np.int64)


def _completion_tables(stages: list[dict[str, np.ndarray]], step: float) -> tuple[list[np.ndarray], ...]:
    """Per k, over g = 0.._GRID slots left, for the stages from k on: the least cost and the highest log PAS
    with every time rounded down to slots (a relaxation: no completion within g slots does better, so they
    bound), and the least cost with times rounded up (a restriction: a real completion within g slots),
    with that completion's log PAS."""
    size = _GRID + 1
    low_cost, high_pas = [np.zeros(size)], [np.zeros(size)]
    feasible_cost, feasible_pas = [np.zeros(size)], [np.zeros(size)]
    for st in reversed(stages):
        lc, hp = np.full(size, np.inf), np.full(size, -np.inf)
        fc, fp = np.full(size, np.inf), np.full(size, -np.inf)
        down = np.floor(st["time"] / step).astype(np.int64)  # the slack for rounding is on the slots left
        up = np.ceil(st["time"] / step).astype(np.int64)
        for d, u, c, a in zip(down.tolist(), up.tolist(), st["cost"].tolist(), st["log_pas"].tolist()):
            if d <= _GRID:
                np.minimum(lc[d:], c + low_cost[-1][: size - d], out=lc[d:])
                np.maximum(hp[d:], a + high_pas[-1][: size - d], out=hp[d:])
            if u <= _GRID:
                cost = c + feasible_cost[-1][: size - u]
                better = cost < fc[u:]
                fc[u:][better] = cost[better]
                fp[u:][better] = a + feasible_pas[-1][: size - u][better]
        low_cost.append(lc)
        high_pas.append(hp)
        feasible_cost.append(fc)
        feasible_pas.append(fp)
    return low_cost[::-1], high_pas[::-1], feasible_cost[::-1], feasible_pas[::-1]


def ipa_solve(pipeline: IpaPipeline, *, time_limit_s: float = 30.0, options: SolveOptions | None = None,
              variants: dict[str, tuple[IpaVariant, ...]] | None = None, solver_name: str = "ipa") -> IpaPlan:
    """P3.10 solved exactly by the dynamic programme over stages with Pareto dominance (the module
    docstring), with two prunings that keep the optimum: a partial plan goes when even a relaxed completion
    (times rounded down to 1/2048 of the SLO, cost and PAS bounded apart) cannot reach the best complete
    plan found so far, whose completions use times rounded up. `variants` restricts stages to some of their
    variants (FA2-low / FA2-high); `options` is accepted for the solvers' common signature (no MILP is
    solved). Out of `time_limit_s`: "no-solution"."""
    started = time.perf_counter()
    stages: list[dict[str, np.ndarray]] = []
    picks_of: list[list[tuple[str, int]]] = []
    for stage in pipeline.stages:
        choices = [(pipeline.time_ms(v, b), pipeline.beta * pipeline.replicas(v, b) * v.cores + pipeline.delta * b, _pas_log(v.accuracy), (v.name, b))
                   for v, b in _candidates(pipeline, stage, (variants or {}).get(stage.name))]
        if not choices:
            return _infeasible(solver_name, started, f"no variant and batch of stage {stage.name!r} fits the SLO {pipeline.slo_ms:g} ms")
        arrays = {key: np.array([c[i] for c in choices], dtype=float) for i, key in enumerate(("time", "cost", "log_pas"))}
        kept = _pareto(arrays["time"], arrays["cost"], arrays["log_pas"])
        stages.append({key: value[kept] for key, value in arrays.items()})
        picks_of.append([choices[i][3] for i in kept.tolist()])
    step = pipeline.slo_ms / _GRID
    low_cost, high_pas, feasible_cost, feasible_pas = _completion_tables(stages, step)
    alpha, slo = pipeline.alpha, pipeline.slo_ms
    best = -math.inf  # the best complete plan's objective found so far (through a rounded-up completion)
    spent, cost, log_pas = np.zeros(1), np.zeros(1), np.zeros(1)
    trail: list[tuple[np.ndarray, np.ndarray]] = []  # per stage: each partial plan's parent and choice
    largest = 1
    for k, st in enumerate(stages):
        if time.perf_counter() - started > time_limit_s:
            return _infeasible(solver_name, started, f"no configuration found in the time limit ({k} of {len(stages)} stages)",
                               status="no-solution")
        t = (spent[:, None] + st["time"][None, :]).ravel()
        c = (cost[:, None] + st["cost"][None, :]).ravel()
        a = (log_pas[:, None] + st["log_pas"][None, :]).ravel()
        left = slo - t
        fits = left >= 0 if k == len(stages) - 1 else left >= -1e-9
        relaxed = np.clip(np.floor(left / step + 1e-9), -1, _GRID).astype(np.int64)
        fits &= relaxed >= 0
        slots = np.where(fits, relaxed, 0)
        with np.errstate(invalid="ignore", over="ignore"):
            bound = alpha * np.exp(a + high_pas[k + 1][slots]) - (c + low_cost[k + 1][slots])
            sure = np.clip(np.floor(left / step - 1e-6), -1, _GRID).astype(np.int64)
            ok = fits & (sure >= 0)
            reached = alpha * np.exp(a + feasible_pas[k + 1][np.where(ok, sure, 0)]) - (c + feasible_cost[k + 1][np.where(ok, sure, 0)])
        if ok.any():
            best = max(best, float(np.nanmax(np.where(ok, reached, -np.inf))))
        alive = np.flatnonzero(fits & (bound >= best - 1e-9))
        if alive.size == 0:
            return _infeasible(solver_name, started, "no configuration meets the SLO")
        kept = alive[_pareto(t[alive], c[alive], a[alive])]
        spent, cost, log_pas = t[kept], c[kept], a[kept]
        trail.append((kept // len(st["time"]), kept % len(st["time"])))
        largest = max(largest, kept.size)
    values = alpha * np.exp(log_pas) - cost
    index = int(np.argmax(values))
    chosen: list[tuple[str, int]] = []
    for k in range(len(stages) - 1, -1, -1):
        parents, choice = trail[k]
        chosen.append(picks_of[k][int(choice[index])])
        index = int(parents[index])
    picks = [(stage, _variant(pipeline, stage.name, name), b) for stage, (name, b) in zip(pipeline.stages, reversed(chosen))]
    return _plan_from(pipeline, solver_name, "optimal", picks, started=started,
                      notes=(f"dynamic programme over {len(stages)} stages, at most {largest} Pareto-optimal partial plans",))


def ipa_milp_solve(pipeline: IpaPipeline, *, time_limit_s: float = 30.0, options: SolveOptions | None = None,
                   variants: dict[str, tuple[IpaVariant, ...]] | None = None, solver_name: str = "ipa-milp") -> IpaPlan:
    """P3.10 solved exactly (see the module docstring) along the cost-accuracy frontier. PAS is a product, so
    instead of writing it into one programme (McCormick's products: HiGHS could not close a 10-stage,
    10-variant instance's gap in 30 s), each step solves two small programmes with HiGHS: the fewest cores
    C_k whose configurations reach log PAS >= log tau, then the highest PAS among configurations of at most
    C_k cores. Starting from tau = 0 and raising tau just above each step's PAS (or to the PAS that could
    beat the best point so far with more cores, when that is higher) walks the frontier by increasing
    cores; the optimum of alpha * PAS - beta * cores is one of its points, and the walk stops once
    alpha * PAS_max - beta * (C_k + 1) cannot beat the best point (a higher PAS needs more cores). A last
    programme picks, at the best point's cores and PAS, the smallest batches (the delta term, a tie-break
    as the thesis means it). PAS steps of 1e-6 in its logarithm: two configurations closer than that count
    as equally accurate. `variants` restricts stages to some of their variants (FA2-low / FA2-high)."""
    started = time.perf_counter()
    options = options or SolveOptions(time_limit_s=time_limit_s)
    y: dict[tuple[int, str, int], pulp.LpVariable] = {}
    for k, stage in enumerate(pipeline.stages):
        options_k = _candidates(pipeline, stage, (variants or {}).get(stage.name))
        if not options_k:
            return _infeasible(solver_name, started, f"no variant and batch of stage {stage.name!r} fits the SLO {pipeline.slo_ms:g} ms")
        for v, b in options_k:
            y[(k, v.name, b)] = pulp.LpVariable(f"y_{k}_{len(y)}", cat="Binary")
    cores, log_pas = _choice_cores(pipeline, y), _choice_log_pas(pipeline, y)
    fewest_cores = pulp.LpProblem("ipa_fewest_cores", pulp.LpMinimize)
    fewest_cores += cores
    _feasible_configurations(fewest_cores, pipeline, y)
    fewest_cores += log_pas >= 0.0, "pas_floor"
    most_accurate = pulp.LpProblem("ipa_most_accurate", pulp.LpMaximize)
    most_accurate += log_pas
    _feasible_configurations(most_accurate, pipeline, y)
    most_accurate += cores <= 0.0, "cores_cap"
    pas_max = math.prod(max(_variant(pipeline, pipeline.stages[k].name, m).accuracy for (kk, m, _b) in y if kk == k)
                        for k in range(len(pipeline.stages)))

    def solve(lp: pulp.LpProblem) -> str:
        """The solve's state: "optimal", "feasible" (stopped with an incumbent), "infeasible" (proved), or
        "no-solution" (out of time, or the solver gave up)."""
        left = time_limit_s - (time.perf_counter() - started)
        return milp_solve(lp, options, time_limit_s=left).state if left > 0 else "no-solution"

    best: tuple[float, int, float, list] | None = None  # (alpha * PAS - beta * cores, cores, PAS, picks)
    floor = -1e12  # log tau: no accuracy floor at first
    proven, steps = True, 0
    while True:
        fewest_cores.constraints["pas_floor"].constant = -floor
        state = solve(fewest_cores)
        if state in ("infeasible", "no-solution"):
            proven = proven and state == "infeasible"  # proved: no configuration reaches tau, the frontier ends
            break
        level = round(sum(pipeline.replicas(v, b) * v.cores for _s, v, b in _picks(pipeline, y)))
        most_accurate.constraints["cores_cap"].constant = -level
        state_pas = solve(most_accurate)
        if state_pas in ("infeasible", "no-solution"):
            proven = False
            break
        proven = proven and state == "optimal" and state_pas == "optimal"
        steps += 1
        picks = _picks(pipeline, y)
        pas = math.prod(v.accuracy for _s, v, _b in picks)
        value = pipeline.alpha * pas - pipeline.beta * level
        if best is None or value > best[0] + 1e-12:
            best = (value, level, pas, picks)
        if pipeline.alpha * pas_max - pipeline.beta * (level + 1) <= best[0] + 1e-12 or pas >= pas_max * (1 - 1e-9):
            break  # nothing further along the frontier can do better
        floor = max(floor, _pas_log(pas)) + _PAS_STEP
        if pipeline.alpha > 0:
            # Beating the best point with at least level + 1 cores needs alpha * PAS > best + beta * (level + 1).
            needed = (best[0] + pipeline.beta * (level + 1)) / pipeline.alpha
            if needed > 0:
                floor = max(floor, math.log(needed))
    if best is None:
        if proven:
            return _infeasible(solver_name, started, "no configuration meets the SLO")
        return _infeasible(solver_name, started, "no configuration found in the time limit", status="no-solution")
    _value, level, pas, picks = best
    smallest_batches = pulp.LpProblem("ipa_smallest_batches", pulp.LpMinimize)
    smallest_batches += pulp.lpSum(b * var for (_k, _m, b), var in y.items())
    _feasible_configurations(smallest_batches, pipeline, y)
    smallest_batches += cores <= level, "cores_cap"
    smallest_batches += log_pas >= _pas_log(pas) - _PAS_STEP, "pas_floor"
    if solve(smallest_batches) in ("infeasible", "no-solution"):  # out of time: the best point's own batches
        return _plan_from(pipeline, solver_name, "feasible", picks, started=started,
                          notes=(f"{steps} steps along the cost-accuracy frontier; the batches were not minimised in time",))
    return _plan_from(pipeline, solver_name, "optimal" if proven else "feasible", _picks(pipeline, y), started=started,
                      notes=(f"{steps} steps along the cost-accuracy frontier",))


def ipa_fixed_variant_solve(pipeline: IpaPipeline, which: str, *, time_limit_s: float = 30.0) -> IpaPlan:
    """The thesis's FA2-low / FA2-high baselines (§p3.5.1): every stage pinned to its lightest ("low": fewest
    cores, then least accurate) or heaviest ("high": most accurate) variant, batches and replicas then
    chosen for cost alone, as FA2 scales."""
    if which not in ("low", "high"):
        raise ValueError(f"which must be 'low' or 'high', got {which!r}")
    pinned = {}
    for s in pipeline.stages:
        pick = min(s.variants, key=lambda v: (v.cores, v.accuracy)) if which == "low" else max(s.variants, key=lambda v: (v.accuracy, -v.cores))
        pinned[s.name] = (pick,)
    cost_only = IpaPipeline(pipeline.name, pipeline.stages, pipeline.slo_ms, pipeline.rate_rps, alpha=0.0, beta=1.0, delta=pipeline.delta,
                            headroom=pipeline.headroom)
    plan = ipa_solve(cost_only, time_limit_s=time_limit_s, variants=pinned, solver_name=f"fa2-{which}")
    if not plan.choices:
        return plan
    picks = [(s, _variant(pipeline, s.name, c.variant), c.batch) for s, c in zip(pipeline.stages, plan.choices)]
    return _plan_from(pipeline, plan.solver, plan.status, picks, bound=None, gap=None, started=time.perf_counter() - plan.runtime_s)


def ipa_brute_force(pipeline: IpaPipeline) -> IpaPlan:
    """Every combination of (variant, batch) per stage (small pipelines only): the reference the MILP must
    equal."""
    started = time.perf_counter()
    per_stage = [_candidates(pipeline, s, dominated=True) for s in pipeline.stages]
    best: tuple[float, list] | None = None
    for combo in itertools.product(*per_stage):
        if sum(pipeline.time_ms(v, b) for v, b in combo) > pipeline.slo_ms:
            continue
        picks = [(s, v, b) for s, (v, b) in zip(pipeline.stages, combo)]
        value = _plan_from(pipeline, "brute-force", "optimal", picks, started=started).objective
        if best is None or value > best[0] + 1e-12:
            best = (value, picks)
    if best is None:
        return _infeasible("brute-force", started, "no combination fits the SLO")
    return _plan_from(pipeline, "brute-force", "optimal", best[1], started=started)


def ipa_plan_validate(pipeline: IpaPipeline, plan: IpaPlan) -> list[str]:
    """Independent checks: one choice per stage with a variant it has, batch in range, replicas serving the
    rate (P3.10c), end-to-end time within the SLO (P3.10b), PAS and cores as reported."""
    errors: list[str] = []
    if [c.stage for c in plan.choices] != [s.name for s in pipeline.stages]:
        return [f"the plan's stages {[c.stage for c in plan.choices]} are not the pipeline's {[s.name for s in pipeline.stages]}"]
    total = 0.0
    for stage, c in zip(pipeline.stages, plan.choices):
        variant = next((v for v in stage.variants if v.name == c.variant), None)
        if variant is None:
            errors.append(f"stage {stage.name!r} has no variant {c.variant!r}")
            continue
        if not 1 <= c.batch <= stage.max_batch:
            errors.append(f"stage {stage.name!r}: batch {c.batch} outside 1..{stage.max_batch}")
            continue
        if not math.isfinite(variant.latency.profiled_ms(c.batch)):
            errors.append(f"stage {stage.name!r}: batch {c.batch} of {c.variant} is outside its profiled batches")
            continue
        if c.replicas * variant.latency.profiled_throughput_rps(c.batch) < pipeline.rate_rps - 1e-9:
            errors.append(f"stage {stage.name!r}: {c.replicas} replicas of {c.variant} at batch {c.batch} serve less than {pipeline.rate_rps:g} requests/s")
        if c.cores != c.replicas * variant.cores:
            errors.append(f"stage {stage.name!r}: {c.cores} cores reported for {c.replicas} replicas of {variant.cores}")
        total += pipeline.time_ms(variant, c.batch)
    if not errors and total > pipeline.slo_ms + 1e-6:
        errors.append(f"end to end {total:.1f} ms exceeds the SLO {pipeline.slo_ms:g} ms")
    if not errors and plan.pas is not None:
        pas = math.prod(_variant(pipeline, c.stage, c.variant).accuracy for c in plan.choices)
        if abs(pas - plan.pas) > 1e-9:
            errors.append(f"PAS reported {plan.pas} but the choices give {pas}")
    return errors
