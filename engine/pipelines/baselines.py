"""The baselines FA2 is compared with in Razavi's thesis (P1 §p1.6.1), on the same latency and queueing
models (`engine/pipelines/problem.py`):

- DS2 (Kalavri et al.): scales each operator to its true processing rate and does not batch, so b = 1
  everywhere and n_s = ceil(lambda_s / h_s(1));
- InferLine-style (Crankshaw et al.), as the thesis describes it: "maximizing local batch sizes one by one
  until there is no room to increase the batch size of any DNN", without coordinating the DNNs of a path:
  from b = 1 everywhere, each DNN in topological order takes the largest batch that keeps every path
  through it within its SLO given the others' current batches.

Where this departs: InferLine's own planner also chooses hardware per model; here every instance is the
same size (the thesis's setting), so only the batch sizes are searched. Either baseline returns status
"infeasible" when even batch 1 everywhere misses an SLO."""
from __future__ import annotations

import time

from engine.pipelines.problem import PipelinePlan, PipelineProblem, decisions_from_batches, plan_objective

__all__ = ["ds2_solve", "inferline_solve"]


def _paths_fit(problem: PipelineProblem, batches: dict[str, int], stages: tuple[str, ...] | None = None) -> bool:
    for path in problem.paths:
        if stages is not None and not set(stages) & set(path.stages):
            continue
        if sum(problem.time_at_stage_ms(s, batches[s]) for s in path.stages) > path.slo_ms:
            return False
    return True


def ds2_solve(problem: PipelineProblem) -> PipelinePlan:
    started = time.perf_counter()
    batches = {s.name: 1 for s in problem.stages}
    decisions = decisions_from_batches(problem, batches)
    status = "feasible" if _paths_fit(problem, batches) else "infeasible"
    return PipelinePlan(solver="ds2", status=status, decisions=decisions if status == "feasible" else {},
                        objective=plan_objective(problem, decisions) if status == "feasible" else None,
                        runtime_s=time.perf_counter() - started,
                        notes=() if status == "feasible" else ("batch 1 everywhere misses an SLO",))


def inferline_solve(problem: PipelineProblem) -> PipelinePlan:
    started = time.perf_counter()
    batches = {s.name: 1 for s in problem.stages}
    if not _paths_fit(problem, batches):
        return PipelinePlan(solver="inferline", status="infeasible", decisions={}, objective=None, runtime_s=time.perf_counter() - started,
                            notes=("batch 1 everywhere misses an SLO",))
    for name in problem.stage_order():
        for b in range(batches[name] + 1, problem.by_name[name].max_batch + 1):
            trial = {**batches, name: b}
            if not _paths_fit(problem, trial, (name,)):
                break  # l_s grows with b: no larger batch fits either
            batches = trial
    decisions = decisions_from_batches(problem, batches)
    return PipelinePlan(solver="inferline", status="feasible", decisions=decisions, objective=plan_objective(problem, decisions),
                        runtime_s=time.perf_counter() - started)
