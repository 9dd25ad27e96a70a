"""Sponge (thesis P2 §p2.3) in the engine: the performance model P2.2 fitted from profiles, Algorithm 2's
brute force equal to the integer programme P2.3 solved by HiGHS, decisions that keep every queued request
within its remaining budget (checked independently), and the direction they move in."""
from __future__ import annotations

import random

import pytest

from engine.vertical.sponge import (
    VerticalLatency,
    sponge_brute_force,
    sponge_decision_validate,
    sponge_ip_solve,
    vertical_latency_fit,
)

# A YOLOv5s-like model on CPU cores (stated, for the tests): 40 ms of parallel work per image, 8 ms per
# image that does not parallelise, 20 ms of parallel set-up, 2 ms fixed.
MODEL = VerticalLatency(gamma1=40.0, eps1=20.0, delta1=8.0, eta1=2.0)


def test_the_fit_recovers_the_model_from_profiles_at_several_cores_and_batches() -> None:
    points = [(b, c, MODEL.l(b, c)) for b in (1, 2, 4, 8) for c in (1, 2, 4, 8, 16)]
    fitted = vertical_latency_fit(points)
    for b, c, ms in points:
        assert fitted.l(b, c) == pytest.approx(ms, rel=1e-6)
    with pytest.raises(ValueError, match="4 or more"):
        vertical_latency_fit(points[:3])
    with pytest.raises(ValueError, match="latency a finite number > 0"):
        vertical_latency_fit(points + [(1, 1, -3.0)])


def test_algorithm_2_takes_the_fewest_cores_then_the_smallest_batch() -> None:
    # One request with 100 ms left at 5 rps: batch 1 needs l(1, c) = 60/c + 10 <= 100, so 1 core (70 ms).
    decision = sponge_brute_force(MODEL, [100.0], 5.0)
    assert (decision.status, decision.cores, decision.batch) == ("optimal", 1, 1)
    # Tighter budgets need more cores: 30 ms left needs 60/c + 10 <= 30, c = 3.
    assert sponge_brute_force(MODEL, [30.0], 5.0).cores == 3
    # More traffic needs batching or cores: 40 rps is more than one image per 25 ms at any core count.
    busy = sponge_brute_force(MODEL, [400.0] * 8, 40.0)
    assert busy.batch > 1 and MODEL.throughput_rps(busy.batch, busy.cores) >= 40.0


def test_the_edf_queue_holds_each_batch_to_its_tightest_budget() -> None:
    # Four requests at batch 2: the first batch finishes after l(2, c), the second after 2 l(2, c).
    budgets = [500.0, 60.0, 500.0, 130.0]  # unsorted on purpose: the queue orders them
    decision = sponge_brute_force(MODEL, budgets, 1.0, max_batch=2)
    assert sponge_decision_validate(MODEL, budgets, 1.0, decision) == []
    latency = MODEL.l(decision.batch, decision.cores)
    ordered = sorted(budgets)
    for k in range(0, 4, decision.batch):
        assert (k // decision.batch + 1) * latency <= ordered[k] + 1e-9


def test_the_brute_force_equals_the_integer_programme() -> None:
    rng = random.Random(18)
    for _ in range(30):
        model = VerticalLatency(rng.uniform(5, 80), rng.uniform(0, 40), rng.uniform(0, 10), rng.uniform(0.5, 5))
        budgets = [rng.uniform(20, 400) for _ in range(rng.randint(1, 24))]
        rate = rng.uniform(1, 200)
        arrivals = [rng.uniform(-10, 300) for _ in range(rng.randint(0, 12))]  # what recent requests had left on arrival
        brute = sponge_brute_force(model, budgets, rate, arrival_budgets_ms=arrivals)
        exact = sponge_ip_solve(model, budgets, rate, arrival_budgets_ms=arrivals)
        assert brute.status == exact.status and brute.expired == exact.expired
        if brute.status == "optimal":
            assert (brute.cores, brute.batch) == (exact.cores, exact.batch)
            assert sponge_decision_validate(model, budgets, rate, brute) == []
            servable = [a for a in arrivals if a >= 2 * model.l(1, 16)]
            assert all(2 * model.l(brute.batch, brute.cores) <= a + 1e-9 for a in servable)
            assert brute.expired == len(arrivals) - len(servable)


def test_an_impossible_queue_is_reported_with_the_best_configuration() -> None:
    decision = sponge_brute_force(MODEL, [5.0, 300.0, 300.0], 1.0)  # 5 ms is below l(1, 16) = 13.75 ms
    assert decision.status == "infeasible" and decision.late >= 1 and decision.objective is None
    # A request the network already made late is dropped and counted, not sized for.
    expired = sponge_brute_force(MODEL, [-40.0, 300.0], 1.0)
    assert expired.status == "optimal" and expired.expired == 1 and expired.cores == 1
    assert "keeps every request within its budget" in decision.notes[0]
    with pytest.raises(ValueError, match="rate_rps"):
        sponge_brute_force(MODEL, [10.0], -1.0)


def test_the_synthetic_network_leaves_less_budget_in_its_dips() -> None:
    from engine.vertical.workload import bandwidth_trace, requests_with_budgets

    trace = bandwidth_trace(600, seed=3)
    assert trace.min() < 10 < 30 < trace.max()  # dips and good seconds both occur
    requests = requests_with_budgets(trace, rate_rps=20, slo_ms=750, seed=3)
    assert len(requests) == pytest.approx(20 * 600, rel=0.05)
    assert requests == requests_with_budgets(trace, rate_rps=20, slo_ms=750, seed=3)  # seeded
    in_dips = [r.remaining_ms for r in requests if trace[int(r.arrival_s)] < 10]
    in_good = [r.remaining_ms for r in requests if trace[int(r.arrival_s)] >= 30]
    assert sum(in_dips) / len(in_dips) < sum(in_good) / len(in_good) - 100
    # Sponge sizes the instance for what is queued: a queue of eight at the dips' median budget needs more
    # cores than one at the good seconds' median.
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    dip = sponge_brute_force(MODEL, [median(in_dips)] * 8, 20)
    good = sponge_brute_force(MODEL, [median(in_good)] * 8, 20)
    assert dip.status == good.status == "optimal" and dip.cores > good.cores
    with pytest.raises(ValueError):
        bandwidth_trace(0)
