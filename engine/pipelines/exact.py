"""The integer programme P1.3 of Razavi's thesis (P1 §p1.4.3), solved exactly with PuLP and HiGHS: the
optimum FA2's dynamic programme is measured against (the paper uses Gurobi for it).

    min  sum_s n_s + delta * sum_s b_s
    s.t. sum_{s in S_p} d_s(b_s) + q_s(b_s) <= SLA_p     for every path p
         h_s(b_s) * n_s >= lambda_s                       for every stage s
         b_s, n_s positive integers

Batch sizes are binary choices x[s, b]; for a chosen b the fewest instances are ceil(lambda_s / h_s(b)),
so n_s is that constant times x[s, b] and the programme is a multiple-choice knapsack with one knapsack
per path. It works on the original paths (no graph transformation) and on the continuous latency model
(no time slots), so its optimum is a lower bound for every other plan of the same problem."""
from __future__ import annotations

import math
import time

import pulp

from engine.pipelines.problem import PipelinePlan, PipelineProblem, StageDecision, plan_objective
from engine.plans.problem import SolveOptions
from engine.solvers.milp import milp_solve

__all__ = ["pipeline_milp_solve"]

Choices = dict[tuple[str, int], pulp.LpVariable]


def _batch_choices(problem: PipelineProblem) -> Choices:
    """x[s, b] for every batch size whose time at the stage is finite and fits the tightest path through it."""
    x: Choices = {}
    for stage in problem.stages:
        slo = min(p.slo_ms for p in problem.paths if stage.name in p.stages)
        for b in range(1, stage.max_batch + 1):
            spent = problem.time_at_stage_ms(stage.name, b)
            if not math.isfinite(spent) or spent > slo:
                break
            x[(stage.name, b)] = pulp.LpVariable(f"x_{len(x)}", cat="Binary")
    return x


def _one_batch_per_stage(lp: pulp.LpProblem, problem: PipelineProblem, x: Choices) -> None:
    for stage in problem.stages:
        lp += pulp.lpSum(v for (s, _b), v in x.items() if s == stage.name) == 1, f"one_batch_{stage.name}"


def _path_within_slo(lp: pulp.LpProblem, problem: PipelineProblem, x: Choices) -> None:
    for i, path in enumerate(problem.paths):
        lp += pulp.lpSum(problem.time_at_stage_ms(s, b) * v for (s, b), v in x.items() if s in path.stages) <= path.slo_ms, f"slo_{i}"


def _objective(problem: PipelineProblem, x: Choices) -> pulp.LpAffineExpression:
    delta = problem.batch_penalty()
    return pulp.lpSum((problem.instances_needed(s, b) + delta * b) * v for (s, b), v in x.items())


def pipeline_milp_solve(problem: PipelineProblem, *, time_limit_s: float = 30.0, options: SolveOptions | None = None) -> PipelinePlan:
    """P1.3 solved exactly (HiGHS, else CBC; `options` for the gap and threads)."""
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
    outcome = milp_solve(lp, options, time_limit_s=time_limit_s)
    if not outcome.has_solution:
        status = "infeasible" if outcome.state == "infeasible" else "no-solution"
        return PipelinePlan(solver="milp", status=status, decisions={}, objective=None, runtime_s=time.perf_counter() - started,
                            notes=(f"the solver ({outcome.backend}) found no plan: {outcome.state}",))
    batches = {s: b for (s, b), v in x.items() if (v.value() or 0) > 0.5}
    decisions = {s: StageDecision(s, b, problem.instances_needed(s, b)) for s, b in batches.items()}
    return PipelinePlan(solver="milp", status="optimal" if outcome.state == "optimal" else "feasible", decisions=decisions,
                        objective=plan_objective(problem, decisions), bound=outcome.bound, gap=outcome.gap,
                        runtime_s=time.perf_counter() - started)
