"""Exact means exact: fa2's exact mode, P1.3 solved by HiGHS (engine/pipelines/exact.py),
equals an independent brute-force optimum of P1.3 on the profiled latencies (engine/pipelines/brute.py:
every batch of every stage enumerated, latency read linearly between profiled batches as the validators
read it) on random chains, forks, joins and DAGs; it says `optimal` only when it proved it; FA2's dynamic
programme (the paper's model) stays valid and never beats the optimum; and IPA on profiled variants equals
a brute force written here, apart from engine/pipelines/ipa.py."""
from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from engine.pipelines import exact as exact_module
from engine.pipelines.brute import SHAPES, ProfiledPipeline, p13_brute_force, profiled_pipeline_random
from engine.pipelines.exact import pipeline_milp_solve
from engine.pipelines.fa2 import fa2_solve
from engine.pipelines.ipa import IpaPipeline, IpaStage, IpaVariant, ipa_milp_solve, ipa_plan_validate, ipa_solve
from engine.pipelines.problem import ExecutionPath, PipelinePlan, PipelineProblem, PipelineStage, StageDecision, stage_latency_bound
from engine.pipelines.validate import pipeline_plan_validate
from engine.plans.capacity import profile_interpolate
from engine.plans.problem import ProfilePoint, SolveOptions, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.milp import SolveOutcome
from engine.solvers.solve import plan_solve

SEEDS = range(8)


@pytest.mark.parametrize("headroom", [1.0, 1.25])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_exact_programme_equals_brute_force_on_random_pipelines(shape: str, headroom: float) -> None:
    for seed in SEEDS:
        pipeline = profiled_pipeline_random(seed, shape, headroom=headroom)
        reference = p13_brute_force(pipeline)
        problem = pipeline.problem()
        plan = pipeline_milp_solve(problem, options=SolveOptions(threads=1))
        if reference is None:
            assert plan.status == "infeasible", (pipeline.name, plan)
            continue
        assert plan.status == "optimal", (pipeline.name, plan.notes)
        assert plan.instances == reference.instances, (pipeline.name, dict(plan.decisions), reference)
        assert plan.objective == pytest.approx(reference.objective, abs=1e-9), pipeline.name
        assert pipeline_plan_validate(problem, plan) == []


@pytest.mark.parametrize("shape", SHAPES)
def test_fa2s_dynamic_programme_is_valid_on_the_profile_and_never_beats_the_optimum(shape: str) -> None:
    """FA2 plans with the paper's model (the fitted quadratic raised above the profile), so it may need more
    instances than the optimum on the profile: that is measured (benches/pipelines.py), not hidden."""
    for seed in SEEDS:
        pipeline = profiled_pipeline_random(seed, shape, headroom=1.25)
        reference = p13_brute_force(pipeline)
        problem = pipeline.problem()
        plan = fa2_solve(problem)
        if plan.status == "infeasible":
            continue
        assert plan.status == "feasible" and pipeline_plan_validate(problem, plan) == [], pipeline.name
        assert reference is not None and plan.instances >= reference.instances


def _fleet(pipeline: ProfiledPipeline) -> dict[str, Any]:
    """The pipeline as a fleet problem: one application and one one-core CPU variant per stage, hosts with
    room for every replica."""
    return {
        "applications": [{"name": s} for s in pipeline.profiles],
        "variants": [{"name": f"{s}-v", "application": s, "accuracy": 0.9} for s in pipeline.profiles],
        "devices": [{"name": f"h{i}", "type": "cpu", "cores": 64} for i in range(4)],
        "profiles": [{"variant": f"{s}-v", "device_type": "cpu", "slice": "1", "batch": b, "latency_ms": ms}
                     for s, points in pipeline.profiles.items() for b, ms in points],
        "pipelines": [{"name": "p", "stages": list(pipeline.profiles), "paths": [
            {"name": q.name, "stages": list(q.stages), "slo_ms": q.slo_ms, "demand_rps": q.rate_rps} for q in pipeline.paths]}],
        "options": {"pipeline_headroom": pipeline.headroom, "threads": 1},
    }


@pytest.mark.parametrize("shape", ["chain", "fork", "dag"])  # a fleet's pipeline has one entry stage: no "join" of several entries
def test_plan_solve_fa2_plans_the_brute_force_optimum_and_the_fleet_validator_accepts_it(shape: str) -> None:
    """The whole way: `plan_solve(problem, "fa2")` builds each stage's model from its CPU profile
    (engine/solvers/pipelines.py) and solves P1.3 exactly; its replicas add up to the brute-force optimum's
    (ties between equally good plans may split them differently) and engine/plans/validate.py accepts it."""
    for seed in range(3):
        pipeline = profiled_pipeline_random(seed, shape, headroom=1.25)
        reference = p13_brute_force(pipeline)
        if reference is None:
            continue
        problem = problem_from_dict(_fleet(pipeline))
        plan = plan_solve(problem, "fa2")
        summary = plan.pipelines["p"]
        assert summary["status"] == "optimal" and plan.status == "optimal", (pipeline.name, summary["notes"])
        assert sum(st["replicas"] for st in summary["stages"].values()) == reference.instances, pipeline.name
        assert summary["objective"] == pytest.approx(reference.objective, abs=1e-9), pipeline.name
        assert all(st["replicas_placed"] == st["replicas"] for st in summary["stages"].values())
        verdict = plan_validate(problem, plan)
        assert verdict.valid, str(verdict)


def test_a_stage_profiled_at_24_ms_is_sized_from_24_ms_not_from_the_raised_fit() -> None:
    """The issue's case in small: the fit raised above a bumpy profile reads batch 4 far slower than it
    was profiled; replicas are sized from the profile."""
    points = [(1, 10.0), (2, 11.0), (4, 19.0), (8, 24.0), (16, 60.0)]
    latency = stage_latency_bound(points)
    assert latency.d(8) > 24.0 + 1.0  # the raised quadratic
    assert latency.profiled_ms(8) == 24.0 and latency.profiled_ms(6) == pytest.approx(21.5) and latency.profiled_ms(12) == pytest.approx(42.0)
    assert math.isinf(latency.profiled_ms(17)) and latency.profiled_throughput_rps(17) == 0.0
    profile = [ProfilePoint("v", "cpu", "1", b, ms) for b, ms in points]
    assert all(latency.profiled_ms(b) == pytest.approx(profile_interpolate(profile, b, "latency_ms")) for b in range(1, 17))


def test_the_validator_refuses_a_batch_outside_the_profiled_range() -> None:
    """max_batch allows batch 9, but the profile stops at 8: no latency is known there, so no plan may use
    it (as engine/plans/validate.py refuses a batch outside the profiled range)."""
    stage = PipelineStage("a", stage_latency_bound([(1, 10.0), (2, 12.0), (4, 15.0), (8, 22.0)]), max_batch=9)
    problem = PipelineProblem((stage,), (ExecutionPath("p", ("a",), 1000.0, 50.0),))
    assert pipeline_milp_solve(problem).decisions["a"].batch <= 8
    errors = pipeline_plan_validate(problem, PipelinePlan("hand", "feasible", {"a": StageDecision("a", 9, 50)}, None))
    assert errors == ["stage 'a': batch 9 is outside its profiled batches 1..8"]


def test_no_solver_picks_a_batch_below_the_smallest_profiled_one() -> None:
    """A stage profiled from batch 4 up: batches 1-3 have no latency the validator can read, so neither FA2's
    dynamic programme nor the exact programme may choose them, however cheap the fit makes them look."""
    stage = PipelineStage("a", stage_latency_bound([(4, 8.0), (8, 12.0), (16, 20.0)]), max_batch=16)
    problem = PipelineProblem((stage,), (ExecutionPath("p", ("a",), 200.0, 40.0),))
    for plan in (fa2_solve(problem), pipeline_milp_solve(problem)):
        assert plan.status in {"optimal", "feasible"}, (plan.solver, plan.notes)
        assert plan.decisions["a"].batch >= 4, (plan.solver, plan.decisions)
        assert pipeline_plan_validate(problem, plan) == [], plan.solver


def test_a_solve_with_a_gap_left_is_feasible_with_its_bound_not_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`optimal` only when HiGHS proved it: a solve that stopped at a gap (mip_gap, or a time limit with an
    incumbent) reports `feasible` with the bound and gap it reached."""
    real = exact_module.milp_solve

    def stopped_at_a_gap(lp, options, **kwargs) -> SolveOutcome:
        outcome = real(lp, options, **kwargs)
        return SolveOutcome("optimal", outcome.objective, outcome.objective * 0.9, 0.1, outcome.seconds, outcome.backend)

    monkeypatch.setattr(exact_module, "milp_solve", stopped_at_a_gap)
    plan = pipeline_milp_solve(profiled_pipeline_random(1, "dag").problem())
    assert plan.status == "feasible" and plan.gap == pytest.approx(0.1) and plan.bound is not None
    assert any("not proved optimal" in n for n in plan.notes)


# --------------------------------------------------------------------------- IPA on profiled variants


def _ipa_profiled(seed: int) -> tuple[IpaPipeline, dict[tuple[str, str], list[tuple[int, float]]]]:
    """A small linear pipeline whose variants carry profiles (bumpy, some not growing with the batch)."""
    rng = random.Random(seed)
    stages, profiles = [], {}
    for s in range(rng.randint(1, 3)):
        variants = []
        for m in range(rng.randint(1, 3)):
            base = rng.uniform(4, 20) * (1 + m)
            points = [(b, round(base * (0.5 + 0.5 * b ** rng.uniform(0.5, 1.1)) * rng.uniform(0.9, 1.1), 3)) for b in (1, 2, 4, 6)]
            profiles[(f"s{s}", f"v{m}")] = points
            variants.append(IpaVariant(f"v{m}", min(1.0, 0.5 + 0.1 * m + rng.uniform(0, 0.05)), 1 + m, stage_latency_bound(points)))
        stages.append(IpaStage(f"s{s}", tuple(variants), max_batch=6))
    fastest = sum(min(p[0][1] for (st, _v), p in profiles.items() if st == f"s{s}") for s in range(len(stages)))
    return IpaPipeline(f"profiled-{seed}", tuple(stages), fastest * rng.uniform(1.5, 5), rng.uniform(5, 80),
                       alpha=rng.choice([1.0, 5.0, 20.0]), beta=rng.choice([0.01, 0.05, 0.2]), headroom=rng.choice([1.0, 1.25])), profiles


def _ipa_brute(pipeline: IpaPipeline, profiles: dict[tuple[str, str], list[tuple[int, float]]]) -> float | None:
    """P3.10's optimum by enumeration, from the raw profiles (linear between profiled batches)."""
    def lerp(points: list[tuple[int, float]], b: int) -> float | None:
        for (b0, m0), (b1, m1) in zip(points, points[1:]):
            if b0 <= b <= b1:
                return m0 + (m1 - m0) * (b - b0) / (b1 - b0)
        return None

    per_stage = []
    for st in pipeline.stages:
        options = []
        for v in st.variants:
            for b in range(1, st.max_batch + 1):
                ms = lerp(profiles[(st.name, v.name)], b)
                if ms is None:
                    continue
                replicas = max(1, math.ceil(pipeline.headroom * pipeline.rate_rps * ms / (1000.0 * b) - 1e-9))
                options.append((ms + 1000.0 * (b - 1) / pipeline.rate_rps, v.accuracy, replicas * v.cores, b))
        per_stage.append(options)
    best = None
    for combo in itertools.product(*per_stage):
        if sum(c[0] for c in combo) > pipeline.slo_ms:
            continue
        value = pipeline.alpha * math.prod(c[1] for c in combo) - pipeline.beta * sum(c[2] for c in combo) - pipeline.delta * sum(c[3] for c in combo)
        best = value if best is None else max(best, value)
    return best


def test_ipa_on_profiled_variants_equals_brute_force_on_small_pipelines() -> None:
    for seed in range(30):
        pipeline, profiles = _ipa_profiled(seed)
        reference = _ipa_brute(pipeline, profiles)
        plan = ipa_solve(pipeline)
        if reference is None:
            assert plan.status == "infeasible", pipeline.name
            continue
        assert plan.status == "optimal" and ipa_plan_validate(pipeline, plan) == [], pipeline.name
        assert plan.objective == pytest.approx(reference, abs=1e-9), pipeline.name
        walk = ipa_milp_solve(pipeline)
        assert walk.objective == pytest.approx(reference, abs=1e-6), pipeline.name
