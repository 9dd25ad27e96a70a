"""IPA (Razavi's thesis P3 §p3.4) in the engine: its exact solution (a dynamic programme over the stages)
equals brute force on small pipelines and HiGHS's walk along the cost-accuracy frontier on larger ones, moves
along the cost-accuracy frontier as its weights move, refuses bad input, and every plan it or its baselines
make passes the independent validator."""
from __future__ import annotations

import random

import pytest

from engine.pipelines.ipa import (
    IpaPipeline,
    IpaStage,
    IpaVariant,
    ipa_brute_force,
    ipa_fixed_variant_solve,
    ipa_milp_solve,
    ipa_plan_validate,
    ipa_solve,
)
from engine.pipelines.problem import PipelineProblemError, StageLatency
from engine.reference.pipelines import ipa_random_pipeline


def test_the_milp_equals_brute_force_on_small_pipelines() -> None:
    rng = random.Random(11)
    for seed in range(25):
        pipeline = ipa_random_pipeline(100 + seed, rng.randint(1, 3), rng.randint(1, 3), max_batch=6, alpha=rng.choice([1.0, 5.0, 20.0]),
                                       beta=rng.choice([0.01, 0.05, 0.2]))
        exact = ipa_brute_force(pipeline)
        milp = ipa_solve(pipeline)
        assert milp.status == exact.status
        if exact.status == "infeasible":
            continue
        assert milp.objective == pytest.approx(exact.objective, abs=1e-6)
        assert ipa_plan_validate(pipeline, milp) == []


def test_raising_alpha_against_beta_moves_along_the_frontier() -> None:
    """As accuracy weighs more against cores, PAS and cores never go down (the solutions lie on the
    cost-accuracy frontier, ordered)."""
    pipeline = ipa_random_pipeline(3, 4, 4)
    seen = []
    for alpha in (0.0, 0.5, 1, 2, 5, 10, 50, 200):
        plan = ipa_solve(IpaPipeline("p", pipeline.stages, pipeline.slo_ms, pipeline.rate_rps, alpha=alpha, beta=0.05))
        assert plan.status == "optimal" and ipa_plan_validate(pipeline, plan) == []
        seen.append((plan.pas, plan.cores))
    assert all(a[0] <= b[0] + 1e-12 and a[1] <= b[1] for a, b in zip(seen, seen[1:])), seen
    assert seen[0][0] < seen[-1][0]  # the sweep does span the frontier


def test_fa2_low_and_high_pin_the_lightest_and_the_most_accurate_variants() -> None:
    pipeline = ipa_random_pipeline(8, 3, 4, alpha=10.0, beta=0.05)
    heaviest = sum(max(v.latency.d(1) for v in st.variants) for st in pipeline.stages)
    pipeline = IpaPipeline("p", pipeline.stages, heaviest * 3, pipeline.rate_rps, alpha=10.0, beta=0.05)  # every variant can fit
    low, high, ipa = ipa_fixed_variant_solve(pipeline, "low"), ipa_fixed_variant_solve(pipeline, "high"), ipa_solve(pipeline)
    for plan in (low, high, ipa):
        assert plan.status != "infeasible" and ipa_plan_validate(pipeline, plan) == [], plan.notes
    assert all(c.variant == "v0" for c in low.choices) and all(c.variant == "v3" for c in high.choices)
    assert low.pas <= ipa.pas <= high.pas
    assert ipa.objective >= max(low.objective, high.objective) - 1e-9  # IPA's optimum includes both


def test_a_six_stage_pipeline_of_six_variants_solves_to_the_optimum_the_milp_walk_finds() -> None:
    """The dynamic programme and HiGHS along the cost-accuracy frontier (two exact methods, nothing shared
    but the candidates) agree where brute force is out of reach. (Ten by ten, the thesis's Fig. P3.13 size,
    is benches/pipelines.py's to time.)"""
    for seed in (1, 2):
        pipeline = ipa_random_pipeline(seed, 6, 6)
        plan, walk = ipa_solve(pipeline, time_limit_s=120), ipa_milp_solve(pipeline, time_limit_s=120)
        assert plan.status == walk.status == "optimal" and ipa_plan_validate(pipeline, plan) == []
        assert "Pareto-optimal partial plans" in plan.notes[0] and "steps along the cost-accuracy frontier" in walk.notes[0]
        assert plan.objective == pytest.approx(walk.objective, abs=1e-6)


def test_bad_input_and_impossible_slos_are_refused_with_reasons() -> None:
    latency = StageLatency(0, 1, 10)
    with pytest.raises(PipelineProblemError, match="accuracy"):
        IpaPipeline("p", (IpaStage("s", (IpaVariant("v", 1.5, 1, latency),)),), 100, 10)
    with pytest.raises(PipelineProblemError, match="cores"):
        IpaPipeline("p", (IpaStage("s", (IpaVariant("v", 0.5, 0, latency),)),), 100, 10)
    with pytest.raises(PipelineProblemError, match="slo_ms"):
        IpaPipeline("p", (IpaStage("s", (IpaVariant("v", 0.5, 1, latency),)),), 0, 10)
    with pytest.raises(PipelineProblemError, match="no variants"):
        IpaPipeline("p", (IpaStage("s", ()),), 100, 10)
    tight = IpaPipeline("p", (IpaStage("a", (IpaVariant("v", 0.5, 1, latency),)), IpaStage("b", (IpaVariant("v", 0.5, 1, latency),))), 15, 10)
    for plan in (ipa_solve(tight), ipa_brute_force(tight), ipa_fixed_variant_solve(tight, "low")):
        assert plan.status == "infeasible" and plan.choices == () and plan.notes


def test_a_solve_out_of_time_says_so_and_never_returns_an_invalid_plan() -> None:
    pipeline = ipa_random_pipeline(1, 6, 6)
    plan = ipa_solve(pipeline, time_limit_s=0.001)
    assert plan.status != "optimal"
    assert plan.status == "no-solution" and "time limit" in plan.notes[0] or ipa_plan_validate(pipeline, plan) == []
