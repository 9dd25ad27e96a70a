"""Biscale (thesis P4 §p4.4-p4.5) in the engine: Algorithm 3 (vertical DP) and Algorithm 4 (horizontal DP,
FA2's) equal the integer programme P4.6 solved by HiGHS on small pipelines, plans pass the independent
validator, the binary search on the rate hands the rest to more instances, and the controller's switching
rules; the simulator replays Sponge and Biscale against their baselines."""
from __future__ import annotations

import random

import pytest

from engine.simulation.vertical import (BiscalePolicy, HorizontalPolicy, SpongeExtendedPolicy, SpongePolicy, StageView, StaticPolicy,
                                        VerticalRequest, bursty_rates, requests_from_rates, vertical_simulate)
from engine.vertical.biscale import (BiscaleController, BiscalePlan, BiscaleProblem, BiscaleStage, BiscaleStageDecision,
                                     biscale_horizontal_solve, biscale_ip_solve, biscale_plan_validate, biscale_vertical_solve)
from engine.vertical.controller import VerticalObservation, sponge_step
from engine.vertical.sponge import VerticalLatency

# Stated stand-ins: a detector and a classifier on CPU cores (ms; the thesis's video-monitoring pipeline in kind).
DETECT = BiscaleStage("detect", VerticalLatency(60.0, 10.0, 2.0, 4.0))
CLASSIFY = BiscaleStage("classify", VerticalLatency(30.0, 5.0, 1.0, 2.0))
SLO = 3 * (DETECT.latency.l(1, 1) + CLASSIFY.latency.l(1, 1))  # §p4.6: three times the b = c = 1 latencies


def _random_pipeline(rng: random.Random) -> BiscaleProblem:
    stages = tuple(
        BiscaleStage(f"s{i}", VerticalLatency(rng.uniform(5, 80), rng.uniform(0, 20), rng.uniform(0, 5), rng.uniform(0, 5)),
                     max_batch=rng.choice((4, 8)), max_cores=rng.choice((4, 8)))
        for i in range(rng.choice((1, 2, 3))))
    base = sum(s.latency.l(1, 1) for s in stages)
    return BiscaleProblem(stages, slo_ms=round(base * rng.uniform(1.2, 3.0)), rate_rps=rng.uniform(2, 40))


@pytest.mark.parametrize("seed", range(12))
def test_the_dynamic_programmes_equal_the_exact_integer_programme(seed: int) -> None:
    rng = random.Random(seed)
    problem = _random_pipeline(rng)
    vertical = biscale_vertical_solve(problem)
    exact_vertical = biscale_ip_solve(problem, mode="vertical", slot_ms=1.0)
    assert (vertical.status == "optimal") == (exact_vertical.status == "optimal")
    if vertical.status == "optimal":
        assert vertical.cores == exact_vertical.cores
        assert biscale_plan_validate(problem, vertical) == []
    horizontal = biscale_horizontal_solve(problem)
    exact_horizontal = biscale_ip_solve(problem, mode="horizontal", slot_ms=1.0)
    assert horizontal.status == exact_horizontal.status
    if horizontal.status == "optimal":
        assert horizontal.cores == exact_horizontal.cores
        assert all(d.cores == 1 for d in horizontal.decisions.values())
        assert biscale_plan_validate(problem, horizontal) == []
        # The joint programme may mix both, and is never worse than either (§p4.4.3).
        joint = biscale_ip_solve(problem, mode="joint")
        assert joint.status == "optimal" and joint.cores <= horizontal.cores
        assert biscale_plan_validate(problem, joint) == []


def test_vertical_scaling_gives_cores_where_the_load_needs_them() -> None:
    problem = BiscaleProblem((DETECT, CLASSIFY), SLO, rate_rps=30.0)
    plan = biscale_vertical_solve(problem)
    assert plan.status == "optimal" and all(d.instances == 1 for d in plan.decisions.values())
    # The detector is the heavier stage: it gets at least as many cores.
    assert plan.decisions["detect"].cores >= plan.decisions["classify"].cores
    more = biscale_vertical_solve(problem.with_rate(60.0))
    assert more.cores > plan.cores


def test_too_much_load_for_vertical_scaling_bisects_the_rate_and_adds_instances_of_the_same_size() -> None:
    problem = BiscaleProblem((DETECT, CLASSIFY), SLO, rate_rps=400.0)
    plan = biscale_vertical_solve(problem)
    assert plan.status == "feasible" and 1 <= plan.vertical_rate_rps < 400
    # The vertical part at its largest served rate is feasible, one more request per second is not.
    assert biscale_vertical_solve(problem.with_rate(plan.vertical_rate_rps)).status == "optimal"
    assert biscale_vertical_solve(problem.with_rate(plan.vertical_rate_rps + 1)).status != "optimal"
    assert any(d.instances > 1 for d in plan.decisions.values())
    assert biscale_plan_validate(problem, plan) == []
    # The hardware limit is a cap on the pipeline's cores.
    capped = biscale_vertical_solve(problem.with_rate(30.0), cores_cap=2)
    assert capped.status == "feasible" and capped.vertical_rate_rps < 30


def test_an_slo_below_the_fastest_configuration_is_infeasible_everywhere() -> None:
    problem = BiscaleProblem((DETECT,), slo_ms=5.0, rate_rps=1.0)
    assert biscale_vertical_solve(problem).status == "infeasible"
    assert biscale_horizontal_solve(problem).status == "infeasible"
    assert biscale_ip_solve(problem, mode="joint").status == "infeasible"


def test_the_validator_catches_what_a_solver_might_get_wrong() -> None:
    problem = BiscaleProblem((DETECT, CLASSIFY), SLO, rate_rps=30.0)
    slow = BiscalePlan("x", "optimal", {"detect": BiscaleStageDecision("detect", 1, 1, 1), "classify": BiscaleStageDecision("classify", 1, 1, 1)},
                       2.0, 0.0)
    errors = biscale_plan_validate(problem, slow)
    assert any("rps < 30" in e for e in errors)
    too_long = BiscalePlan("x", "optimal", {"detect": BiscaleStageDecision("detect", 16, 16, 4), "classify": BiscaleStageDecision("classify", 16, 16, 4)},
                           0.0, 0.0)
    assert any("over the SLO" in e for e in biscale_plan_validate(problem.with_rate(1.0), too_long))
    assert any("is not decided" in e for e in biscale_plan_validate(problem, BiscalePlan("x", "optimal", {"detect": slow.decisions["detect"]}, 1, 0)))
    with pytest.raises(ValueError, match="unique"):
        BiscaleProblem((DETECT, DETECT), SLO, 1.0)
    with pytest.raises(ValueError, match="rate_rps"):
        BiscaleProblem((DETECT,), SLO, 0.0)


def test_the_controller_switches_as_section_p4_5_says() -> None:
    controller = BiscaleController((DETECT, CLASSIFY), SLO)
    enough = biscale_horizontal_solve(BiscaleProblem((DETECT, CLASSIFY), SLO, 30.0))
    ready = {n: d.instances for n, d in enough.decisions.items()}
    # The running one-core instances serve the predicted load: horizontal, one core each.
    steady = controller.decide(rate_rps=30.0, predicted_rps=30.0, ready=ready, starting={})
    assert steady.mode == "horizontal" and all(t.cores == 1 and t.start == 0 for t in steady.targets.values())
    # A surge the running instances cannot serve: resize them in place; nothing starts while the load moves.
    surge = controller.decide(rate_rps=60.0, predicted_rps=90.0, ready=ready, starting={})
    assert surge.mode == "vertical"
    assert any(t.cores > 1 for t in surge.targets.values()) and all(t.start == 0 for t in surge.targets.values())
    # The load is stable at the new level: one-core instances start, the vertical ones keep their cores until they are up.
    settled = controller.decide(rate_rps=60.0, predicted_rps=60.0, ready=ready, starting={})
    assert settled.mode == "vertical-to-horizontal" and any(t.start > 0 and t.start_cores == 1 for t in settled.targets.values())
    # Once they are up, horizontal again: back to one core, and surplus instances stop when the load falls.
    wanted = biscale_horizontal_solve(BiscaleProblem((DETECT, CLASSIFY), SLO, 60.0))
    up = {n: d.instances for n, d in wanted.decisions.items()}
    assert controller.decide(rate_rps=60.0, predicted_rps=60.0, ready=up, starting={}).mode == "horizontal"
    calm = controller.decide(rate_rps=10.0, predicted_rps=10.0, ready=up, starting={})
    assert calm.mode == "horizontal" and sum(t.stop for t in calm.targets.values()) > 0
    # Beyond what the host gives the pipeline: the rest goes to new instances of the vertical size.
    capped = BiscaleController((DETECT, CLASSIFY), SLO, cores_cap=4).decide(rate_rps=60.0, predicted_rps=90.0, ready={"detect": 1, "classify": 1},
                                                                            starting={})
    assert capped.mode == "hardware-limit" and any(t.start > 0 for t in capped.targets.values())


def test_sponge_step_sizes_for_the_budgets_it_sees_and_keeps_an_idle_instance() -> None:
    model = DETECT.latency
    relaxed = sponge_step(model, VerticalObservation(4, 1, 5.0, (300.0,) * 5))
    tight = sponge_step(model, VerticalObservation(4, 1, 5.0, (300.0,) * 4 + (20.0,)))
    assert tight.cores > relaxed.cores and tight.changed
    idle = sponge_step(model, VerticalObservation(6, 2, 0.0, ()))
    assert (idle.status, idle.cores, idle.batch, idle.changed) == ("idle", 6, 2, False)
    # Beyond what any size serves: the size late for the fewest, the most cores where they help...
    overloaded = sponge_step(model, VerticalObservation(2, 1, 20.0, (100.0,) * 60), max_cores=8)
    assert overloaded.status == "infeasible" and overloaded.cores == 8 and 0 < overloaded.late < 60
    # ... and no growth where they cannot help (one request whose budget no size meets).
    hopeless = sponge_step(model, VerticalObservation(2, 1, 5.0, (3.0,)), max_cores=8)
    assert hopeless.status == "infeasible" and hopeless.cores == 1 and hopeless.late == 1
    # Arrivals of the interval are a sample of what comes next: each must fit 2 l(b, c), none queued behind the others.
    as_queue = sponge_step(model, VerticalObservation(1, 1, 20.0, (200.0,) * 20))
    as_arrivals = sponge_step(model, VerticalObservation(1, 1, 20.0, (200.0,) * 20, queued=0))
    assert as_arrivals.cores < as_queue.cores and 2 * model.l(as_arrivals.batch, as_arrivals.cores) <= 200.0
    with pytest.raises(ValueError, match="queued"):
        sponge_step(model, VerticalObservation(1, 1, 20.0, (200.0,), queued=2))
    assert sponge_step(model, VerticalObservation(2, 1, 5.0, (300.0,)), min_cores=3).cores == 3
    with pytest.raises(ValueError):
        sponge_step(model, VerticalObservation(2, 1, -1.0, ()))


def test_the_simulator_replays_vertical_and_horizontal_scaling() -> None:
    rates = bursty_rates(120, base_rps=10, peak_rps=45, seed=1)
    requests = requests_from_rates(rates, slo_ms=SLO, seed=1)
    stages = (DETECT, CLASSIFY)
    initial = {"detect": (1, 1, 1), "classify": (1, 1, 1)}
    runs = {p.name: vertical_simulate(stages, requests, p, initial=initial)
            for p in (HorizontalPolicy(stages, SLO, headroom=1.25), SpongeExtendedPolicy(stages, SLO, headroom=1.25),
                      BiscalePolicy(stages, SLO, headroom=1.25))}
    for run in runs.values():
        assert run.requests == len(requests)
        assert len(run.latencies_ms) + run.violations == run.requests  # every request served in time or counted
        assert (run.latencies_ms <= SLO + 1e-6).all()
        assert len(run.per_second) == 120
    assert runs["vertical"].starts == 0 and runs["vertical"].resizes > 0
    assert runs["horizontal"].resizes == 0 and runs["horizontal"].starts > 0
    assert runs["biscale"].violations < runs["horizontal"].violations
    # A static instance changes nothing; one request with no budget left is dropped and counted.
    late = [VerticalRequest(0.5, 0.5), VerticalRequest(0.6, 5.0)]
    static = vertical_simulate((DETECT,), late, StaticPolicy(4, 1), initial={"detect": (1, 4, 1)}, duration_s=3)
    assert (static.violations, static.dropped, len(static.latencies_ms), static.resizes) == (1, 1, 1, 0)
    sponge = vertical_simulate((DETECT,), late, SpongePolicy(DETECT), initial={"detect": (1, 1, 1)}, duration_s=3)
    assert sponge.violations == 1


def test_biscale_with_a_shrink_dwell_holds_a_stage_s_cores_through_the_swings_of_a_burst() -> None:
    """Issue 42: the controller as published goes back to one-core instances the interval enough of them are
    ready, and meets the burst's next swing a whole interval late; with `shrink_after` a stage keeps the cores
    it grew to until that many intervals in a row said fewer would do. Growing is never held."""
    stages = (DETECT, CLASSIFY)
    policy = BiscalePolicy(stages, SLO, headroom=1.25, shrink_after=3)
    assert policy.name == "biscale-dwell" and BiscalePolicy(stages, SLO).name == "biscale"
    with pytest.raises(ValueError, match="whole number of intervals"):
        BiscalePolicy(stages, SLO, shrink_after=0)

    def view(name: str, *, ready: int, cores: int, rate: float, history: tuple[float, ...]) -> StageView:
        return StageView(name, ready, 0, cores, 1, rate, (), history)

    # A burst at 45 rps on one one-core instance per stage: vertical scaling grows both stages at once.
    burst = [view(s.name, ready=1, cores=1, rate=45.0, history=(10.0, 45.0)) for s in stages]
    grown = policy.decide(1.0, burst)
    published = BiscalePolicy(stages, SLO, headroom=1.25).decide(1.0, burst)
    assert {n: t.cores for n, t in grown.items()} == {n: t.cores for n, t in published.items()}
    held = {n: t.cores for n, t in grown.items()}
    assert max(held.values()) > 1
    # The load drops back: the published controller shrinks at once, the dwell holds the cores for 2 intervals.
    calm = [view(s.name, ready=1, cores=held[s.name], rate=10.0, history=(45.0, 10.0)) for s in stages]
    fresh = BiscalePolicy(stages, SLO, headroom=1.25).decide(2.0, calm)
    smaller = [n for n in held if fresh[n].cores < held[n]]
    assert smaller
    for second in (2.0, 3.0):
        kept = policy.decide(second, calm)
        assert all(kept[n].cores == held[n] for n in smaller), kept
    shrunk = policy.decide(4.0, calm)
    assert all(shrunk[n].cores < held[n] for n in smaller), shrunk


def test_the_shrink_dwell_cuts_biscale_s_violations_on_a_bursty_trace() -> None:
    rates = bursty_rates(200, base_rps=10, peak_rps=45, seed=0)
    requests = requests_from_rates(rates, slo_ms=SLO, seed=0)
    stages = (DETECT, CLASSIFY)
    initial = {"detect": (1, 1, 1), "classify": (1, 1, 1)}
    published = vertical_simulate(stages, requests, BiscalePolicy(stages, SLO, headroom=1.25), initial=initial)
    dwell = vertical_simulate(stages, requests, BiscalePolicy(stages, SLO, headroom=1.25, shrink_after=5), initial=initial)
    assert published.violations > 0 and dwell.violations < published.violations
    assert dwell.resizes < published.resizes  # fewer flips between sizes, too
