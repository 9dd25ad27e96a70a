"""Pipelines in the engine (FA2, Razavi's thesis P1): the latency model's fit, the problem's checks, the
graph transformation, FA2's dynamic programme against the exact integer programme, the baselines, and the
validator that judges every plan independently of the solver that made it."""
from __future__ import annotations

import math
import random

import pytest

from engine.pipelines.baselines import ds2_solve, inferline_solve
from engine.pipelines.exact import pipeline_milp_solve
from engine.pipelines.fa2 import fa2_solve
from engine.pipelines.problem import (
    ExecutionPath,
    PipelinePlan,
    PipelineProblem,
    PipelineProblemError,
    PipelineStage,
    StageDecision,
    StageLatency,
    stage_latency_fit,
)
from engine.pipelines.transform import fa2_graph_transform, stage_intensity
from engine.pipelines.validate import pipeline_plan_validate
from engine.reference.pipelines import fa2_table_p13_problem

def table_p13_problem(rate_rps: float, max_batch: int = 32) -> PipelineProblem:
    return fa2_table_p13_problem(rate_rps, max_batch=max_batch)


def test_the_latency_fit_recovers_a_quadratic_and_shrugs_off_one_stray_point() -> None:
    truth = StageLatency(0.02, 1.5, 4.0)
    points = [(b, truth.d(b)) for b in (1, 2, 4, 8, 16, 32)]
    fit = stage_latency_fit(points)
    assert all(abs(fit.d(b) - truth.d(b)) < 1e-6 for b in range(1, 33))
    noisy = points + [(8, truth.d(8) * 3)]  # one measurement hit by a neighbour
    robust = stage_latency_fit(noisy)
    assert abs(robust.d(8) - truth.d(8)) / truth.d(8) < 0.05
    assert stage_latency_fit([(1, 5.0)]).d(7) == 5.0
    line = stage_latency_fit([(1, 5.0), (4, 11.0)])
    assert line.alpha == 0 and abs(line.d(2) - 7.0) < 1e-9
    with pytest.raises(PipelineProblemError, match="batch must be >= 1"):
        stage_latency_fit([(0, 5.0)])
    with pytest.raises(PipelineProblemError, match="at least one"):
        stage_latency_fit([])


@pytest.mark.parametrize(("paths", "message"), [
    ([ExecutionPath("p", ("a", "b"), 100, 1), ExecutionPath("q", ("b", "a"), 100, 1)], "cycle"),
    ([ExecutionPath("p", ("a", "x"), 100, 1)], "not declared"),
    ([ExecutionPath("p", ("a", "b", "a"), 100, 1)], "visits a stage twice"),
    ([ExecutionPath("p", ("a", "b"), 0, 1)], "slo_ms"),
    ([ExecutionPath("p", ("a", "b"), 100, -1)], "rate_rps"),
    ([ExecutionPath("p", ("a",), 100, 1)], "on no execution path"),
    ([ExecutionPath("p", ("a", "b"), 100, 1), ExecutionPath("p", ("a",), 100, 1)], "unique"),
    ([], "at least one"),
])
def test_a_malformed_pipeline_is_refused_with_its_reason(paths, message) -> None:
    stages = (PipelineStage("a", StageLatency(0, 1, 1)), PipelineStage("b", StageLatency(0, 1, 1)))
    with pytest.raises(PipelineProblemError, match=message):
        PipelineProblem(stages, tuple(paths))


def test_the_transformation_removes_every_ingress_aggregator_and_splits_slos_by_intensity() -> None:
    problem = table_p13_problem(30)
    graph = fa2_graph_transform(problem)
    # QUAN receives from ALPR, SUMR and AUTT: two of those edges go (sharing degree 1 each; ties by name).
    assert graph.removed == (("ALPR", "QUAN"), ("AUTT", "QUAN"))
    assert graph.roots() == ["AUTT", "OBJD"] and graph.parent["QUAN"] == "SUMR" and graph.parent["SUMR"] == "AUTT"
    predecessors: dict[str, set[str]] = {}
    for seg in graph.segments:
        for u, v in zip(seg.stages, seg.stages[1:]):
            predecessors.setdefault(v, set()).add(u)
    assert all(len(p) == 1 for p in predecessors.values())
    for path in problem.paths:  # each path's segments cover it in order and share its SLO exactly
        parts = [s for s in graph.segments if s.path == path.name]
        assert sum((s.stages for s in parts), ()) == path.stages
        assert math.isclose(sum(s.slo_ms for s in parts), path.slo_ms)
    first = next(s for s in graph.segments if s.path == "p1" and s.stages == ("OBJD", "ALPR"))
    share = (stage_intensity(problem, "OBJD") + stage_intensity(problem, "ALPR")) / sum(stage_intensity(problem, s) for s in ("OBJD", "ALPR", "QUAN"))
    assert math.isclose(first.slo_ms, share * 3020)


@pytest.mark.parametrize("rate", [6, 12, 24, 36, 48, 60])
def test_fa2_on_the_papers_paths_is_valid_and_never_beats_the_exact_optimum(rate: int) -> None:
    problem = table_p13_problem(rate)
    exact = pipeline_milp_solve(problem)
    plans = [fa2_solve(problem), inferline_solve(problem), ds2_solve(problem)]
    assert exact.status == "optimal" and pipeline_plan_validate(problem, exact) == []
    for plan in plans:
        assert plan.status == "feasible", plan.notes
        assert pipeline_plan_validate(problem, plan) == [], plan.solver
        assert plan.objective >= exact.objective - 1e-9
    fa2, inferline, ds2 = plans
    assert fa2.instances <= inferline.instances and fa2.instances <= ds2.instances


def random_chain_problem(rng: random.Random) -> PipelineProblem:
    """A chain of 2-4 stages (no aggregators: FA2's transformation changes nothing) with one path."""
    n = rng.randint(2, 4)
    stages = tuple(PipelineStage(f"s{i}", StageLatency(rng.uniform(0, 0.2), rng.uniform(1, 10), rng.uniform(2, 30)), rng.choice([8, 16, 32]))
                   for i in range(n))
    base = sum(s.latency.d(1) for s in stages)
    return PipelineProblem(stages, (ExecutionPath("p", tuple(s.name for s in stages), base * rng.uniform(1.5, 6), rng.uniform(5, 400)),))


def test_fa2_matches_the_exact_optimum_on_chains_up_to_its_time_slots() -> None:
    """On a chain nothing is transformed, and the DP over 0.1 ms slots is exact but for rounding each
    stage's time up to a slot: its instance count equals the MILP's on nearly every instance, and its
    plans are always valid."""
    rng = random.Random(5)
    equal = 0
    trials = 60
    for _ in range(trials):
        problem = random_chain_problem(rng)
        exact = pipeline_milp_solve(problem)
        fa2 = fa2_solve(problem, slot_ms=0.1)
        assert exact.status == "optimal"
        assert fa2.status == "feasible" and pipeline_plan_validate(problem, fa2) == []
        assert fa2.objective >= exact.objective - 1e-9
        equal += fa2.instances == exact.instances
    assert equal >= 0.9 * trials


def test_an_slo_no_batch_can_meet_is_infeasible_for_every_solver_with_a_reason() -> None:
    stages = (PipelineStage("a", StageLatency(0, 10, 50)), PipelineStage("b", StageLatency(0, 10, 50)))
    problem = PipelineProblem(stages, (ExecutionPath("p", ("a", "b"), 100.0, 10),))
    for solve in (fa2_solve, pipeline_milp_solve, inferline_solve, ds2_solve):
        plan = solve(problem)
        assert plan.status == "infeasible" and plan.decisions == {} and plan.notes


def test_the_validator_names_what_a_broken_plan_gets_wrong() -> None:
    problem = table_p13_problem(30)
    good = pipeline_milp_solve(problem)
    decisions = dict(good.decisions)
    decisions["SUMR"] = StageDecision("SUMR", decisions["SUMR"].batch, 1)  # far too few instances
    decisions["OBJD"] = StageDecision("OBJD", 32, problem.instances_needed("OBJD", 32))  # enough of them, but the batch blows the SLO
    errors = pipeline_plan_validate(problem, PipelinePlan("hand", "feasible", decisions, None))
    assert any("SUMR" in e and "below its rate" in e for e in errors)
    decisions["SUMR"] = good.decisions["SUMR"]
    errors = pipeline_plan_validate(problem, PipelinePlan("hand", "feasible", decisions, None))
    assert errors and all("exceeds its SLO" in e for e in errors)
    missing = {k: v for k, v in good.decisions.items() if k != "TCLS"}
    assert pipeline_plan_validate(problem, PipelinePlan("hand", "feasible", missing, None)) == ["stage 'TCLS' has no decision"]
