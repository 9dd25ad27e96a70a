"""The integer programme P1.3 of Razavi's thesis (P1 §p1.4.3), solved exactly with PuLP and HiGHS: the
optimum FA2's dynamic programme is measured against (the paper uses Gurobi for it).

    min  sum_s n_s + delta * sum_s b_s
    s.t. sum_{s in S_p} d_s(b_s) + q_s(b_s) <= SLA_p     for every path p
         h_s(b_s) * n_s >= lambda_s                       for every stage s
         b_s, n_s positive integers

Batch sizes are binary choices x[s, b]; for a chosen b the fewest instances are ceil(lambda_s / h_s(b)),
so n_s is that constant times x[s, b] and the programme is a multiple-choice knapsack with one knapsack
per path. It works on the original paths (no graph transformation) and with no time slots.

Where this departs, and why: d_s(b) is the *profiled* latency, linear between profiled batches
(`StageLatency.profiled_ms`), the one the validators check, not the fitted quadratic the thesis writes
(that one, raised to lie above the profile, is what FA2's DP plans with; sizing replicas from it cost up to
a third more instances than the optimum on the profile, docs/benchmarks.md "Pipelines"). A stage without a
profile reads its quadratic. Every batch from 1 to max_batch is a choice (a profile need not grow with the
batch, so no larger batch is ruled out by a smaller one). A plan is `optimal` only when HiGHS proved it
with no gap left (at most 1e-6 relative) and it passes
`pipeline_plan_validate` on that same model; a solve stopped early, or at a `mip_gap`, is `feasible`
with its bound and gap."""
from __future__ import annotations

import math
import time

import pulp

from engine.pipelines.problem import PipelinePlan, PipelineProblem, StageDecision, plan_objective
from engine.pipelines.validate import pipeline_plan_validate
from engine.plans.problem import SolveOptions
from engine.solvers.milp import milp_solve

__all__ = ["pipeline_milp_solve"]

Choices = dict[tuple[str, int], pulp.LpVariable]
_MAX_CUTS = 20  # re-solves after an incumbent that HiGHS's tolerances let past an SLO (never seen; a guard)


def _batch_choices(problem: PipelineProblem) -> Choices:
    """x[s, b] for every batch size whose profiled time at the stage is finite and fits the tightest path
    through it on its own."""
    x: Choices = {}
    for stage in problem.stages:
        slo = min(p.slo_ms for p in problem.paths if stage.name in p.stages)
        for b in range(1, stage.max_batch + 1):
            spent = problem.profiled_time_at_stage_ms(stage.name, b)
            if math.isfinite(spent) and spent <= slo:
                x[(stage.name, b)] = pulp.LpVariable(f"x_{len(x)}", cat="Binary")
    return x


def _one_batch_per_stage(lp: pulp.LpProblem, problem: PipelineProblem, x: Choices) -> None:
    for stage in problem.stages:
        lp += pulp.lpSum(v for (s, _b), v in x.items() if s == stage.name) == 1, f"one_batch_{stage.name}"


def _path_within_slo(lp: pulp.LpProblem, problem: PipelineProblem, x: Choices) -> None:
    for i, path in enumerate(problem.paths):
        lp += pulp.lpSum(problem.profiled_time_at_stage_ms(s, b) * v for (s, b), v in x.items() if s in path.stages) <= path.slo_ms, f"slo_{i}"


def _objective(problem: PipelineProblem, x: Choices) -> pulp.LpAffineExpression:
    delta = problem.batch_penalty()
    return pulp.lpSum((problem.profiled_instances_needed(s, b) + delta * b) * v for (s, b), v in x.items())


def pipeline_milp_solve(problem: PipelineProblem, *, time_limit_s: float = 30.0, options: SolveOptions | None = None) -> PipelinePlan:
    """P1.3 solved exactly on the profiled latencies (HiGHS, else CBC; `options` for the gap and threads)."""
    started = time.perf_counter()
    options = options or SolveOptions(time_limit_s=time_limit_s)
    x = _batch_choices(problem)
    missing = sorted({s.name for s in problem.stages} - {s for s, _b in x})
    if missing:
        return PipelinePlan(solver="milp", status="infeasible", decisions={}, objective=None, runtime_s=time.perf_counter() - started,
                            notes=(f"no batch size of {', '.join(missing)} fits the SLO of the paths through it",))
    lp = pulp.LpProblem("pipeline", pulp.LpMinimize)
    lp += _objective(problem, x)
    _one_batch_per_stage(lp, problem, x)
    _path_within_slo(lp, problem, x)
    notes: list[str] = []
    for cut in range(_MAX_CUTS + 1):
        left = time_limit_s - (time.perf_counter() - started)
        outcome = milp_solve(lp, options, time_limit_s=left) if left > 0 else None
        if outcome is None or not outcome.has_solution:
            status = "infeasible" if outcome is not None and outcome.state == "infeasible" else "no-solution"
            reason = outcome.state if outcome is not None else "out of time"
            return PipelinePlan(solver="milp", status=status, decisions={}, objective=None, runtime_s=time.perf_counter() - started,
                                notes=tuple(notes) + (f"the solver found no plan: {reason}",))
        chosen = [(s, b) for (s, b), v in x.items() if (v.value() or 0) > 0.5]
        decisions = {s: StageDecision(s, b, problem.profiled_instances_needed(s, b)) for s, b in chosen}
        plan = PipelinePlan(solver="milp", status="feasible", decisions=decisions, objective=plan_objective(problem, decisions))
        errors = pipeline_plan_validate(problem, plan)
        if not errors:
            break
        # HiGHS's feasibility tolerances let this choice past an SLO by a hair: cut it off, solve again.
        notes.append(f"cut off a choice HiGHS accepted within its tolerances: {errors[0]}")
        lp += pulp.lpSum(x[c] for c in chosen) <= len(chosen) - 1, f"cut_{cut}"
    else:
        return PipelinePlan(solver="milp", status="no-solution", decisions={}, objective=None, runtime_s=time.perf_counter() - started,
                            notes=tuple(notes) + (f"{_MAX_CUTS} incumbents in a row missed an SLO on the profiled latencies",))
    proved = outcome.state == "optimal" and outcome.gap is not None and outcome.gap <= 1e-6
    if not proved:
        notes.append(f"not proved optimal: bound {outcome.bound}, gap {outcome.gap}")
    return PipelinePlan(solver="milp", status="optimal" if proved else "feasible", decisions=decisions, objective=plan.objective,
                        bound=outcome.bound, gap=outcome.gap, runtime_s=time.perf_counter() - started, notes=tuple(notes))
