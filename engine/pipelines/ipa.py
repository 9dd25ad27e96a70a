"""IPA (Razavi's thesis P3 §p3.4): for a linear pipeline, each stage's model variant, replicas and batch
size, trading accuracy against cost, solved as an integer programme with PuLP and HiGHS.

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
are constants of the choice. PAS, a product, enters through its logarithm, a sum, as a constraint
log PAS >= log tau moved along the cost-accuracy frontier (`ipa_solve`), which finds P3.9's exact optimum.

Where this departs, and why: the base allocation R_m (P3.1, the fewest cores meeting a throughput
threshold `th` within the stage SLA) is an input per variant (`IpaVariant.cores`), as the thesis's own
Table P3.5 gives it, not searched here; batches run 1..max_batch rather than only powers of two (the
quadratic fit covers the rest, as §p3.4.2 intends); the thesis solves P3.10 as one programme with Gurobi,
this solves a short series of linear ones with HiGHS (the product in one programme needed a
linearisation whose relaxation HiGHS could not close on 10 stages of 10 variants in 30 s).""" 
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import pulp

from engine.pipelines.problem import PipelineProblemError, StageLatency, instances_for, queueing_delay_ms
from engine.plans.problem import SolveOptions
from engine.solvers.milp import milp_solve

__all__ = ["IpaPipeline", "IpaPlan", "IpaStage", "IpaStageChoice", "IpaVariant", "ipa_brute_force", "ipa_fixed_variant_solve",
           "ipa_plan_validate", "ipa_solve"]


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
        """l_{s,m}(b) + q_s(b)."""
        return variant.latency.d(batch) + self.queueing_ms(batch)

    def replicas(self, variant: IpaVariant, batch: int) -> int:
        return instances_for(self.headroom * self.rate_rps, variant.latency.throughput_rps(batch))


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
    """(variant, batch) pairs whose time at the stage fits the SLO on its own. Without `dominated`, only the
    smallest batch for each replica count: a larger batch with as many replicas costs the same cores, has
    the same accuracy, takes longer and pays more batch penalty, so no optimum needs it (this leaves a few
    batches per variant instead of max_batch)."""
    out = []
    for v in variants or stage.variants:
        fewest = math.inf
        for b in range(1, stage.max_batch + 1):
            if pipeline.time_ms(v, b) > pipeline.slo_ms:
                break  # l grows with b
            replicas = pipeline.replicas(v, b)
            if dominated or replicas < fewest:
                out.append((v, b))
                fewest = min(fewest, replicas)
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


def ipa_solve(pipeline: IpaPipeline, *, time_limit_s: float = 30.0, options: SolveOptions | None = None,
              variants: dict[str, tuple[IpaVariant, ...]] | None = None, solver_name: str = "ipa") -> IpaPlan:
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
        if c.replicas * variant.latency.throughput_rps(c.batch) < pipeline.rate_rps - 1e-9:
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
