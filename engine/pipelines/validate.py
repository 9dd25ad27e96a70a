"""Checks a pipeline plan against its problem, whatever solver made it: every stage decided once with a
batch in 1..max_batch (and in the profiled range) and at least one instance, every stage's instances serve
the rate of every path through it (n_s * h_s(b_s) >= lambda_s), and every execution path's stages fit its
SLO end to end (sum of d_s(b_s) + q_s(b_s) <= SLA_p, P1.3). d_s is the profiled latency, linear between
profiled batches, as engine/plans/validate.py reads a fleet plan (`StageLatency.profiled_ms`; the stated
quadratic for a stage without a profile), never a solver's own model or slots."""
from __future__ import annotations

import math

from engine.pipelines.problem import PipelinePlan, PipelineProblem

_TOLERANCE_MS = 1e-6


def pipeline_plan_validate(problem: PipelineProblem, plan: PipelinePlan) -> list[str]:
    """What is wrong with `plan`, one sentence per violation (empty: valid)."""
    errors: list[str] = []
    decisions = plan.decisions
    for name in sorted(set(decisions) - set(problem.by_name)):
        errors.append(f"the plan decides stage {name!r}, which the problem does not have")
    for stage in problem.stages:
        d = decisions.get(stage.name)
        if d is None:
            errors.append(f"stage {stage.name!r} has no decision")
            continue
        if not 1 <= d.batch <= stage.max_batch:
            errors.append(f"stage {stage.name!r}: batch {d.batch} outside 1..{stage.max_batch}")
            continue
        if d.instances < 1:
            errors.append(f"stage {stage.name!r}: {d.instances} instances (at least 1)")
        if not math.isfinite(stage.latency.profiled_ms(d.batch)):
            errors.append(f"stage {stage.name!r}: batch {d.batch} is outside its profiled batches "
                          f"{stage.latency.profile[0][0]}..{stage.latency.profile[-1][0]}")
            continue
        rate = problem.stage_rate(stage.name)
        capacity = d.instances * stage.latency.profiled_throughput_rps(d.batch)
        if capacity < rate - 1e-9:
            errors.append(f"stage {stage.name!r}: {d.instances} instances at batch {d.batch} serve {capacity:.2f} requests/s, "
                          f"below its rate {rate:.2f}")
    if errors:
        return errors
    for path in problem.paths:
        total = sum(problem.profiled_time_at_stage_ms(s, decisions[s].batch) for s in path.stages)
        if total > path.slo_ms + _TOLERANCE_MS:
            parts = ", ".join(f"{s} b={decisions[s].batch} {problem.profiled_time_at_stage_ms(s, decisions[s].batch):.1f} ms" for s in path.stages)
            errors.append(f"path {path.name!r}: {total:.1f} ms end to end ({parts}) exceeds its SLO {path.slo_ms:g} ms")
    return errors
