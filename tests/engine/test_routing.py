"""Tests for the data-plane routing helpers: weighted picks match their weights, draining renormalises,
seeds reproduce, bad tables are refused, and the query-to-instance matching is optimal (checked against a
brute force over all assignments) with deadlines taking precedence over completion time."""
from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from engine.dataplane.routing import (
    NoRouteAvailable,
    RoutingError,
    RoutingTable,
    WeightedRouter,
    matching_cost_matrix,
    queries_match_instances,
    routing_tables_from_plan,
)
from engine.plans.problem import Plan, PlanInstance, RouteEntry

PICKS = 100_000


def table_of(weights: dict[str, float], version: int = 1) -> RoutingTable:
    return RoutingTable("classify", version, tuple(weights.items()))


def frequencies(pick, n: int = PICKS) -> dict[str, float]:
    counts = Counter(pick() for _ in range(n))
    return {k: c / n for k, c in counts.items()}


# --------------------------------------------------------------------------- tables


def test_weights_are_normalised() -> None:
    table = table_of({"a": 2.0, "b": 6.0, "c": 0.0})
    assert table.entries == (("a", 0.25), ("b", 0.75), ("c", 0.0))
    assert math.fsum(w for _, w in table.entries) == pytest.approx(1.0, abs=1e-12)
    assert table.weight_of("b") == 0.75 and table.weight_of("zzz") == 0.0
    assert table.instances == ("a", "b", "c")


def test_huge_finite_weights_normalise() -> None:
    table = table_of({"a": 1.0e308, "b": 1.0e308, "c": 5e-324})
    assert table.weight_of("a") == pytest.approx(0.5) and table.weight_of("b") == pytest.approx(0.5)


def test_empty_table_means_no_capacity() -> None:
    table = RoutingTable("classify", 3)
    assert table.is_empty
    router = WeightedRouter(table, seed=1)
    with pytest.raises(NoRouteAvailable):
        router.choose()
    with pytest.raises(NoRouteAvailable):
        router.choose_excluding({"a"})


@pytest.mark.parametrize(
    "entries",
    [
        (("a", -0.1), ("b", 1.1)),
        (("a", float("nan")), ("b", 1.0)),
        (("a", float("inf")), ("b", 1.0)),
        (("a", 0.0), ("b", 0.0)),
        (("a", 0.5), ("a", 0.5)),
        (("", 1.0),),
        (("a", "1"),),
        (("a", True),),
        (("a",),),
    ],
)
def test_bad_weights_are_rejected(entries) -> None:
    with pytest.raises(RoutingError):
        RoutingTable("classify", 1, entries)


@pytest.mark.parametrize("version", [-1, 1.5, "2", None, True])
def test_bad_versions_are_rejected(version) -> None:
    with pytest.raises(RoutingError):
        RoutingTable("classify", version, (("a", 1.0),))


def test_tables_from_a_plan() -> None:
    plan = Plan(
        status="feasible", solver="test", objective_kind="max-accuracy", objective=None, bound=None, gap=None,
        solve_seconds=0.0, effective_accuracy=0.7, served_rps={"classify": 40.0, "detect": 0.0},
        shortfall_rps={"classify": 0.0, "detect": 10.0}, instances=[],
        routing={"classify": [RouteEntry("gpu0/1g.5gb@0", 0.25), RouteEntry("gpu0/3g.20gb@4", 0.75)], "detect": []},
        layouts={},
    )
    tables = routing_tables_from_plan(plan, version=7)
    assert set(tables) == {"classify", "detect"}
    assert tables["classify"].version == 7 and tables["detect"].version == 7
    assert tables["classify"].entries == (("gpu0/1g.5gb@0", 0.25), ("gpu0/3g.20gb@4", 0.75))
    assert tables["detect"].is_empty


def test_normalising_is_idempotent() -> None:
    # A table rebuilt from a table's entries (published, then read by a router) holds the same weights, bit
    # for bit, even where dividing again would round differently.
    for weights in ({"a": 250.0, "b": 200.0, "c": 450.0}, {"a": 1.0, "b": 3.0, "c": 7.0}, {f"i{k}": k / 7 for k in range(1, 30)}):
        table = table_of(weights)
        again = RoutingTable("classify", 2, table.entries)
        assert again.entries == table.entries
        assert RoutingTable("classify", 3, again.entries).entries == table.entries
    # Weights that sum to 1 are taken as they are (not rescaled by their largest first).
    assert table_of({"a": 0.4999996, "b": 0.5000004}).entries == (("a", 0.4999996), ("b", 0.5000004))


def test_tables_take_the_plans_route_weights_not_the_instances_assigned_rps() -> None:
    """The plan's routing is what the tables route by, even where it is not the instances' traffic shares
    (a what-if such as uniform routing); routes with weight 0 are left out, whatever their instance serves."""
    def instance(start: int, rps: float) -> PlanInstance:
        return PlanInstance(device="gpu0", slice="1g.5gb", start=start, variant="classify/a", batch=4, latency_ms=10.0,
                            capacity_rps=100.0, assigned_rps=rps)

    plan = Plan(
        status="feasible", solver="test", objective_kind="max-accuracy", objective=None, bound=None, gap=None,
        solve_seconds=0.0, effective_accuracy=0.7, served_rps={"classify": 100.0}, shortfall_rps={"classify": 0.0},
        instances=[instance(0, 60.0), instance(1, 40.0), instance(2, 1e-5)],
        routing={"classify": [RouteEntry("gpu0/1g.5gb@0", 0.5), RouteEntry("gpu0/1g.5gb@1", 0.5), RouteEntry("gpu0/1g.5gb@2", 0.0)]},
        layouts={},
    )
    tables = routing_tables_from_plan(plan)
    assert tables["classify"].version == 0
    assert tables["classify"].entries == (("gpu0/1g.5gb@0", 0.5), ("gpu0/1g.5gb@1", 0.5))


def test_tables_from_a_garrison_plan() -> None:
    from engine.solvers.garrison_demand import garrison_demand_solve as garrison_solve
    from tests.engine.test_garrison_demand import problem_build

    plan = garrison_solve(problem_build(a100=2, demand={"classify": 5000.0, "detect": 0.0}))
    tables = routing_tables_from_plan(plan, version=2)
    assert tables["detect"].is_empty
    assert dict(tables["classify"].entries) == pytest.approx({r.instance: r.weight for r in plan.routing["classify"]})


# --------------------------------------------------------------------------- picks


@pytest.mark.parametrize(
    "weights",
    [
        {"a": 1.0},
        {"a": 0.5, "b": 0.5},
        {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4},
        {"a": 0.001, "b": 0.999},
        {"a": 3.0, "b": 0.0, "c": 1.0},
        {f"i{k}": float(k) for k in range(1, 21)},
    ],
)
def test_pick_frequencies_match_weights(weights: dict[str, float]) -> None:
    table = table_of(weights)
    seen = frequencies(WeightedRouter(table, seed=12345).choose)
    for instance, weight in table.entries:
        assert abs(seen.get(instance, 0.0) - weight) < 0.01, f"{instance}: {seen.get(instance, 0.0)} vs {weight}"
        if weight == 0:
            assert instance not in seen  # a zero weight is never drawn, not just rarely


def test_excluding_renormalises_over_the_rest() -> None:
    table = table_of({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4})
    router = WeightedRouter(table, seed=99)
    seen = frequencies(lambda: router.choose_excluding({"d", "unknown"}))
    assert "d" not in seen
    for instance, weight in (("a", 0.1), ("b", 0.2), ("c", 0.3)):
        assert abs(seen[instance] - weight / 0.6) < 0.01
    # The full table is still used without exclusions, and a second exclusion set is independent.
    assert abs(frequencies(router.choose)["d"] - 0.4) < 0.01
    assert set(frequencies(lambda: router.choose_excluding({"a", "b"}), 10_000)) == {"c", "d"}


def test_excluding_everything_with_weight_raises() -> None:
    router = WeightedRouter(table_of({"a": 1.0, "b": 0.0}), seed=1)
    with pytest.raises(NoRouteAvailable):
        router.choose_excluding({"a"})
    assert router.choose_excluding(set()) == "a"


def test_seed_reproduces_the_sequence() -> None:
    table = table_of({"a": 0.2, "b": 0.3, "c": 0.5})
    one, two = WeightedRouter(table, seed=42), WeightedRouter(table, seed=42)
    assert [one.choose() for _ in range(1000)] == [two.choose() for _ in range(1000)]
    assert [one.choose_excluding({"c"}) for _ in range(100)] == [two.choose_excluding({"c"}) for _ in range(100)]
    other, again = WeightedRouter(table, seed=43), WeightedRouter(table, seed=42)
    assert [other.choose() for _ in range(1000)] != [again.choose() for _ in range(1000)]


def test_many_instances_stay_fast() -> None:
    table = table_of({f"gpu{k}/1g.5gb@0": 1.0 + (k % 7) for k in range(5000)})
    router = WeightedRouter(table, seed=3)
    picks = Counter(router.choose() for _ in range(50_000))
    assert sum(picks.values()) == 50_000 and len(picks) > 4000


# --------------------------------------------------------------------------- Garrison's matching


def _score(pairs, deadlines, free_at, service) -> tuple[int, float]:
    """(deadline misses, total completion time) of a matching: what the matching minimises, in order."""
    misses, total = 0, 0.0
    for q, i in pairs:
        done = free_at[i] + service[q][i]
        misses += done > deadlines[q]
        total += done
    return misses, total


def _brute_force(deadlines, free_at, service) -> tuple[int, float]:
    nq, ni = len(deadlines), len(free_at)
    best = None
    if nq <= ni:
        for instances in itertools.permutations(range(ni), nq):
            s = _score(list(zip(range(nq), instances)), deadlines, free_at, service)
            best = s if best is None or (s[0], s[1]) < (best[0], best[1] - 1e-9) else best
    else:
        for queries in itertools.permutations(range(nq), ni):
            s = _score(list(zip(queries, range(ni))), deadlines, free_at, service)
            best = s if best is None or (s[0], s[1]) < (best[0], best[1] - 1e-9) else best
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(60))
def test_matching_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    nq, ni = rng.randint(1, 5), rng.randint(1, 5)
    free_at = [rng.uniform(0, 50) for _ in range(ni)]
    if seed % 2:  # per-pair service times (queries of different batch sizes)
        service = [[rng.uniform(1, 30) for _ in range(ni)] for _ in range(nq)]
        arg = service
    else:  # per-instance service times
        per_instance = [rng.uniform(1, 30) for _ in range(ni)]
        service = [per_instance for _ in range(nq)]
        arg = per_instance
    deadlines = [rng.uniform(5, 80) for _ in range(nq)]
    pairs = queries_match_instances(deadlines, free_at, arg)
    assert len(pairs) == min(nq, ni)
    assert len({q for q, _ in pairs}) == len(pairs) and len({i for _, i in pairs}) == len(pairs)
    misses, total = _score(pairs, deadlines, free_at, service)
    best_misses, best_total = _brute_force(deadlines, free_at, service)
    assert misses == best_misses
    assert total == pytest.approx(best_total, abs=1e-6)


def test_deadline_penalty_is_respected() -> None:
    # Any matching finishes at 10 and 50 in total, so only the deadlines tell them apart: the urgent query
    # (deadline 20) must take the instance that finishes at 10.
    pairs = queries_match_instances([100.0, 20.0], [0.0, 40.0], [10.0, 10.0])
    assert pairs == [(0, 1), (1, 0)]


def test_deadline_beats_completion_time() -> None:
    # Minimising completion time alone would put query 0 on the fast instance and make query 1 miss;
    # missing no deadline is worth more than the 30 ms saved.
    service = [[5.0, 60.0], [10.0, 40.0]]
    deadlines = [100.0, 15.0]
    pairs = queries_match_instances(deadlines, [0.0, 0.0], service)
    assert pairs == [(0, 1), (1, 0)]
    assert _score(pairs, deadlines, [0.0, 0.0], service) == (0, 70.0)


def test_more_queries_than_instances_serves_the_savable_ones() -> None:
    # One instance free at 0, service 10: query 0 can no longer make its deadline, query 1 can.
    assert queries_match_instances([5.0, 30.0], [0.0], 10.0) == [(1, 0)]


def test_matching_edge_cases() -> None:
    assert queries_match_instances([], [0.0, 1.0], 5.0) == []
    assert queries_match_instances([10.0], [], 5.0) == []
    with pytest.raises(RoutingError):
        queries_match_instances([10.0], [0.0], -1.0)
    with pytest.raises(RoutingError):
        queries_match_instances([float("nan")], [0.0], 1.0)
    with pytest.raises(RoutingError):
        queries_match_instances([10.0, 20.0], [0.0, 1.0], [[1.0, 2.0]])


def test_matching_by_normalised_usage_time_prefers_the_smaller_instance_garrison_5_3() -> None:
    # §5.3's example: a query takes 5 ms on a GI(2) and on a GI(4); a millisecond on the GI(2) costs half as
    # much, so the query goes there. By completion time alone the two tie and the first instance wins.
    assert queries_match_instances([100.0], [0.0, 0.0], [5.0, 5.0], levels=[4, 2], now_ms=0.0) == [(0, 1)]
    assert queries_match_instances([100.0], [0.0, 0.0], [5.0, 5.0]) == [(0, 0)]
    # The SLO stays first: the cheaper instance is busy for 98 ms, so the query goes where it makes its deadline.
    assert queries_match_instances([100.0], [0.0, 98.0], [5.0, 5.0], levels=[4, 2], now_ms=0.0) == [(0, 0)]
    # Two queries, two instances: the large one goes to the big instance, where it is not slower by more
    # than the granularity costs (U = L * D: 4 * 10 + 2 * 4 = 48 against 4 * 3 + 2 * 30 = 72).
    pairs = queries_match_instances([100.0, 100.0], [0.0, 0.0], [[10.0, 30.0], [3.0, 4.0]], levels=[4, 2], now_ms=0.0)
    assert pairs == [(0, 0), (1, 1)]
    # What is left of a running query counts in D from now.
    cost = matching_cost_matrix([100.0], [50.0, 0.0], [5.0, 5.0], levels=[1, 1], now_ms=40.0)
    assert cost.tolist() == [[15.0, 5.0]]
    with pytest.raises(RoutingError):
        matching_cost_matrix([1.0], [0.0], 1.0, levels=[1.0])
    with pytest.raises(RoutingError):
        matching_cost_matrix([1.0], [0.0], 1.0, levels=[0.0], now_ms=0.0)
