"""The discrete-event simulator (engine/simulation/simulator.py): exact timing on a hand-computed case,
conservation of queries, no-capacity drops, the closed re-planning loop (interval, burst, reconfiguration
delay with unchanged instances serving on), routing identical to the data plane's, determinism, queueing
against M/D/1 theory, and the `tessera simulate` command end to end."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.dataplane.routing import RoutingTable, WeightedRouter
from engine.plans.problem import Plan, Problem, problem_from_dict
from engine.simulation.simulator import (
    DROPPED_EXPIRED,
    DROPPED_NO_CAPACITY,
    LATE,
    ON_TIME,
    PER_SECOND_FIELDS,
    FlatAliasRouter,
    SimulationConfig,
    simulate,
)
from engine.simulation.workload import Trace, arrivals_poisson, trace_write
from engine.solvers.assemble import Assignment, plan_assemble

# --------------------------------------------------------------------------- fixtures

# Batch latency (ms) of variant "v" on the simulated GPU "SIM": 10, 16, 28, 52 ms at batch 1, 2, 4, 8.
LATENCY = {1: 10.0, 2: 16.0, 4: 28.0, 8: 52.0}


def tiny_problem(n_gpus: int = 1, slo_ms: float = 100.0, demand: float = 50.0, apps: int = 1) -> Problem:
    names = [f"app{i}" for i in range(apps)]
    return problem_from_dict({
        "applications": [{"name": n, "slo_ms": slo_ms, "demand_rps": demand} for n in names],
        "variants": [{"name": f"v{i}", "application": n, "accuracy": 0.9 - 0.1 * i, "memory_mb": 100} for i, n in enumerate(names)]
        + [{"name": f"w{i}", "application": n, "accuracy": 0.7, "memory_mb": 100} for i, n in enumerate(names)],
        "devices": [{"name": f"g{k}", "type": "SIM", "memory_mb": 16000} for k in range(n_gpus)],
        "profiles": [
            {"variant": v, "device_type": "SIM", "slice": "full", "batch": b, "latency_ms": lat * (0.5 if v.startswith("w") else 1.0)}
            for v in [f"v{i}" for i in range(apps)] + [f"w{i}" for i in range(apps)] for b, lat in LATENCY.items()
        ],
    })


def fixed_planner(*assignments: tuple[str, str, str, int | None, float]):
    """A planner that always runs these (device, slice, variant, start, rps) instances."""

    def planner(problem: Problem) -> Plan:
        return plan_assemble(
            problem, [Assignment(d, s, start, v, rps) for d, s, v, start, rps in assignments],
            status="optimal", solver="fixed", objective=None, bound=None, gap=None, solve_seconds=0.0,
        )

    return planner


def trace_of(times_s: list[float], apps: list[int] | None = None, names: tuple[str, ...] = ("app0",), deadline_ms=None) -> Trace:
    return Trace(np.array(times_s, dtype=float), np.array(apps or [0] * len(times_s), dtype=np.int32), names,
                 None if deadline_ms is None else np.array(deadline_ms, dtype=float))


QUIET = dict(noise_sigma=0.0, replan_interval_s=None, burst_factor=None)


def outcomes(result) -> list[int]:
    return result.queries["outcome"].tolist()


def check_conservation(result) -> None:
    """Every query ends exactly once; per-second counts add up to the totals."""
    out = result.queries["outcome"]
    s, ps = result.summary, result.per_second
    assert np.all(out > 0), "a query has no outcome"
    assert s["on_time"] + s["late"] + s["dropped"] == s["queries"] == out.size
    assert s["dropped"] == s["dropped_expired"] + s["dropped_no_capacity"] + s["dropped_unfinished"]
    assert int(ps["demand"].sum()) == s["queries"]
    assert int(ps["on_time"].sum()) == s["on_time"]
    assert int(ps["late"].sum()) == s["late"]
    assert int(ps["dropped"].sum()) == s["dropped"]
    assert int(ps["throughput"].sum()) == s["on_time"] + s["late"]
    np.testing.assert_array_equal(ps["demand"], ps["on_time"] + ps["late"] + ps["dropped"])
    served = (out == ON_TIME) | (out == LATE)
    assert np.all(result.queries["done_ms"][served] >= result.queries["arrival_ms"][served])
    assert sum(i["served"] for i in result.instances) == s["on_time"] + s["late"]


# --------------------------------------------------------------------------- exact timing


def test_hand_computed_fixed_batching_gives_exact_completion_times() -> None:
    # One instance, batches of at most 2, no noise. q0 runs alone [0, 10); q1, q2 queue and run together
    # [10, 26); q3 runs alone [26, 36); q4 arrives to an idle instance and runs [50, 60).
    result = simulate(
        tiny_problem(), trace_of([0.0, 0.001, 0.002, 0.003, 0.050]), planner=fixed_planner(("g0", "full", "v0", None, 50.0)),
        config=SimulationConfig(batching="fixed", batching_params={"size": 2}, **QUIET),
    )
    assert result.queries["done_ms"].tolist() == pytest.approx([10.0, 26.0, 26.0, 36.0, 60.0])
    assert outcomes(result) == [ON_TIME] * 5
    s = result.summary
    assert s["latency_p50_ms"] == pytest.approx(24.0)  # latencies 10, 25, 24, 33, 10
    assert s["effective_accuracy"] == pytest.approx(0.9) and s["max_accuracy_drop"] == pytest.approx(0.0)
    (inst,) = result.instances
    assert inst["batches"] == 4 and inst["served"] == 5 and inst["mean_batch"] == pytest.approx(1.25)
    assert inst["busy_s"] == pytest.approx((10 + 16 + 10 + 10) / 1000)
    assert inst["utilisation"] == pytest.approx(46 / 60)
    check_conservation(result)


@pytest.mark.parametrize("rule, expected, done3", [("deadline", DROPPED_EXPIRED, 26.0), ("never", LATE, 36.0)])
def test_per_request_deadline_expires_or_is_late(rule: str, expected: int, done3: float) -> None:
    # q3 carries its own deadline of 30 ms (Sponge): 33 ms. At 26 ms it cannot finish alone by then (26 + 10 > 33):
    # the deadline rule drops it; with "never" it runs [26, 36) and is late.
    nan = math.nan
    result = simulate(
        tiny_problem(), trace_of([0.0, 0.001, 0.002, 0.003, 0.050], deadline_ms=[nan, nan, nan, 30.0, nan]),
        planner=fixed_planner(("g0", "full", "v0", None, 50.0)),
        config=SimulationConfig(batching="fixed", batching_params={"size": 2}, drop_rule=rule, **QUIET),
    )
    assert result.queries["deadline_ms"][3] == pytest.approx(33.0)
    assert outcomes(result)[3] == expected
    assert result.queries["done_ms"][3] == pytest.approx(done3)
    assert outcomes(result)[:3] + outcomes(result)[4:] == [ON_TIME] * 4
    check_conservation(result)


def test_proteus_batching_waits_until_the_head_must_start() -> None:
    # Proteus: a lone query waits until deadline - latency(2) = 100 - 16 = 84 ms, then runs alone: done 94.
    result = simulate(tiny_problem(), trace_of([0.0]), planner=fixed_planner(("g0", "full", "v0", None, 50.0)),
                      config=SimulationConfig(batching="proteus", **QUIET))
    assert result.queries["done_ms"].tolist() == pytest.approx([94.0])
    assert outcomes(result) == [ON_TIME]


def test_an_applications_own_batching_overrides_the_fleets() -> None:
    """A Triton-style delay set on the application (engine.dataplane.batching.application_batching): its
    instances batch with max-delay, as plans translate it for the live runtimes. A lone query waits the
    delay (5 ms) and runs alone, where Proteus's policy would wait until 84 ms."""
    from engine.dataplane.batching import application_batching

    assert application_batching(None) is None
    assert application_batching(0.0) == ("max-delay", {"max_queue_delay_ms": 0.0})
    own = {"app0": application_batching(5.0)}
    result = simulate(tiny_problem(), trace_of([0.0]), planner=fixed_planner(("g0", "full", "v0", None, 50.0)),
                      config=SimulationConfig(batching="proteus", batching_by_application=own, **QUIET))
    assert result.queries["done_ms"].tolist() == pytest.approx([15.0])
    with pytest.raises(ValueError, match="max-delay"):
        simulate(tiny_problem(), trace_of([0.0]), planner=fixed_planner(("g0", "full", "v0", None, 50.0)),
                 config=SimulationConfig(batching_by_application={"app0": ("max-delay", {"max_queue_delay_ms": -1.0})}, **QUIET))


# --------------------------------------------------------------------------- conservation and drops


@pytest.mark.parametrize("batching", ["proteus", "aimd", "nexus", "max-delay", "fixed"])
@pytest.mark.parametrize("routing", ["weights", "matching"])
def test_every_query_ends_exactly_once(batching: str, routing: str) -> None:
    # Re-plans every 2 s swap the variants of g0 and g1 (both re-created, 1 s delay: app0 has no capacity
    # meanwhile, and their queues are routed again); g2 stays.
    problem = tiny_problem(n_gpus=3, slo_ms=60.0, apps=2)
    trace = arrivals_poisson(350, 6.0, seed=3, application="app0").merge(arrivals_poisson(100, 6.0, seed=4, application="app1"))
    plans = [
        fixed_planner(("g0", "full", "v0", None, 110), ("g1", "full", "w0", None, 240), ("g2", "full", "v1", None, 100)),
        fixed_planner(("g0", "full", "w0", None, 240), ("g1", "full", "v0", None, 110), ("g2", "full", "v1", None, 100)),
    ]
    calls = []

    def planner(p: Problem) -> Plan:
        calls.append(1)
        return plans[len(calls) % 2](p)

    params = {"max_queue_delay_ms": 5.0} if batching == "max-delay" else {}
    result = simulate(problem, trace, planner=planner, config=SimulationConfig(
        batching=batching, batching_params=params, routing=routing, replan_interval_s=2.0, reconfiguration_delay_s=1.0, seed=5,
    ))
    check_conservation(result)
    assert result.summary["queries"] == len(trace)
    assert [(r["kept"], r["created"], r["destroyed"]) for r in result.replans[1:]] == [(1, 2, 2), (1, 2, 2)]
    assert result.summary["on_time"] > 0.3 * len(trace)
    assert result.summary["dropped_no_capacity"] > 0
    assert 0.7 <= result.summary["effective_accuracy"] <= 0.9
    assert set(PER_SECOND_FIELDS) == set(result.per_second)


def test_edf_queue_and_slo_drop_rule_conserve_queries() -> None:
    problem = tiny_problem(n_gpus=1, slo_ms=40.0)
    trace = arrivals_poisson(300, 3.0, seed=1, application="app0").with_deadlines(None)
    rng = np.random.default_rng(0)
    trace = Trace(trace.time_s, trace.application, trace.applications, rng.uniform(10, 60, len(trace)))
    result = simulate(problem, trace, planner=fixed_planner(("g0", "full", "v0", None, 300)),
                      config=SimulationConfig(batching="nexus", queue_order="edf", drop_rule={"app0": "slo-1x"}))
    check_conservation(result)


def test_no_capacity_drops_everything() -> None:
    trace = arrivals_poisson(200, 2.0, seed=1, application="app0")
    result = simulate(tiny_problem(), trace, planner=fixed_planner(), config=SimulationConfig(**QUIET))
    assert outcomes(result) == [DROPPED_NO_CAPACITY] * len(trace)
    s = result.summary
    assert s["dropped_no_capacity"] == s["queries"] == len(trace) and s["slo_violation_ratio"] == 1.0
    assert s["effective_accuracy"] is None and s["latency_p99_ms"] is None
    check_conservation(result)


def test_an_empty_trace_gives_an_empty_result() -> None:
    result = simulate(tiny_problem(), trace_of([]), planner=fixed_planner(("g0", "full", "v0", None, 50.0)))
    assert result.summary["queries"] == 0 and result.summary["slo_violation_ratio"] == 0.0
    assert json.loads(result.to_json())["summary"]["effective_accuracy"] is None


def test_an_application_without_instances_is_dropped_while_others_are_served() -> None:
    trace = arrivals_poisson(100, 2.0, seed=1, application="app0").merge(arrivals_poisson(100, 2.0, seed=2, application="app1"))
    result = simulate(tiny_problem(apps=2), trace, planner=fixed_planner(("g0", "full", "v0", None, 100)), config=SimulationConfig(**QUIET))
    app = result.queries["application"]
    out = result.queries["outcome"]
    assert np.all(out[app == 1] == DROPPED_NO_CAPACITY)
    assert np.all(out[app == 0] == ON_TIME)
    assert result.summary["applications"]["app1"]["slo_violation_ratio"] == 1.0
    check_conservation(result)


# --------------------------------------------------------------------------- closed loop


class RecordingPlanner:
    """Plan A on the first call, plan B on every later one; remembers the demand it was asked for."""

    def __init__(self, first, later) -> None:
        self.first, self.later = first, later
        self.demands: list[dict[str, float]] = []

    def __call__(self, problem: Problem) -> Plan:
        self.demands.append({a.name: a.demand_rps for a in problem.applications})
        return (self.first if len(self.demands) == 1 else self.later)(problem)


def test_replanning_happens_every_interval_on_the_observed_demand() -> None:
    trace = arrivals_poisson(200, 10.0, seed=2, application="app0")
    planner = RecordingPlanner(fixed_planner(("g0", "full", "v0", None, 200)), fixed_planner(("g0", "full", "v0", None, 200)))
    result = simulate(tiny_problem(), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=3.0, burst_factor=1.5, seed=1, demand_estimate="mean", demand_headroom=1.0))
    assert [(r["time_s"], r["reason"]) for r in result.replans] == [(0.0, "initial"), (3.0, "interval"), (6.0, "interval"), (9.0, "interval")]
    assert [t for t, _ in result.plans] == [0.0, 3.0, 6.0, 9.0]
    # Initial: the first interval's rate; later: the rate over the last window (3 s).
    assert planner.demands[0]["app0"] == pytest.approx(np.sum(trace.time_s <= 3.0) / 3.0)
    assert planner.demands[2]["app0"] == pytest.approx(np.sum((trace.time_s >= 3.0) & (trace.time_s < 6.0)) / 3.0)
    assert all(r["kept"] == 1 and r["created"] == 0 for r in result.replans[1:])
    assert result.summary["replans_interval"] == 3 and result.summary["replans_burst"] == 0
    check_conservation(result)


def test_peak_demand_estimate_plans_for_the_busiest_second_of_the_window() -> None:
    """demand_estimate "peak": each re-plan sizes for max(busiest whole second of the window, Holt forecast
    ahead) x headroom, the live control loop's estimate (engine.forecasting.holt.peak_forecast_estimate)."""
    times = [0.1] * 5 + [1.5] * 40 + [2.2] * 10 + [3.5] * 5 + [4.5] * 5 + [5.5] * 5 + [6.5]
    trace = trace_of(times)
    planner = RecordingPlanner(*[fixed_planner(("g0", "full", "v0", None, 50))] * 2)
    config = SimulationConfig(replan_interval_s=3.0, burst_factor=None, demand_estimate="peak", demand_window_s=3.0,
                              demand_headroom=1.5, seed=1)
    simulate(tiny_problem(), trace, planner=planner, config=config)
    # At 3 s the window holds seconds 0..2 (5, 40, 10 arrivals): peak 40; the Holt level is below it.
    assert planner.demands[1]["app0"] == pytest.approx(40 * 1.5)
    # At 6 s: seconds 3..5, 5 each.
    assert planner.demands[2]["app0"] == pytest.approx(5 * 1.5)
    with pytest.raises(ValueError, match="demand_estimate"):
        SimulationConfig(demand_estimate="median")
    with pytest.raises(ValueError, match="forecast_horizon_s"):
        SimulationConfig(forecast_horizon_s=-1.0)


def test_a_burst_triggers_a_replan_once() -> None:
    # 100 q/s, then 400 q/s from t = 6 s: the second [6, 7) is seen at t = 7 s.
    low = arrivals_poisson(100, 12.0, seed=1, application="app0")
    high = arrivals_poisson(300, 6.0, seed=2, application="app0")
    trace = low.merge(Trace(high.time_s + 6.0, high.application, high.applications))
    planner = RecordingPlanner(fixed_planner(("g0", "full", "v0", None, 100)), fixed_planner(("g0", "full", "v0", None, 200)))
    result = simulate(tiny_problem(demand=100.0), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=60.0, burst_factor=1.5, burst_debounce_s=2.0, noise_sigma=0.0, initial_demand="problem"))
    assert [(r["time_s"], r["reason"]) for r in result.replans] == [(0.0, "initial"), (7.0, "burst")]
    assert planner.demands[1]["app0"] >= 300  # the burst's own second, not the window's mean
    assert result.summary["replans_burst"] == 1


def test_burst_trigger_is_debounced_and_can_be_switched_off() -> None:
    trace = arrivals_poisson(100, 6.0, seed=1, application="app0")
    # The plan assumes 10 q/s: every second looks like a burst, but re-plans are 3 s apart at least.
    planner = fixed_planner(("g0", "full", "v0", None, 10))
    result = simulate(tiny_problem(demand=10.0), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=None, burst_factor=1.5, burst_debounce_s=3.0, initial_demand="problem"))
    bursts = [r["time_s"] for r in result.replans if r["reason"] == "burst"]
    assert bursts == [3.0]  # after it, the plan assumes ~100 q/s
    off = simulate(tiny_problem(demand=10.0), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=None, burst_factor=None, initial_demand="problem"))
    assert len(off.replans) == 1


def test_created_instances_serve_nothing_during_the_reconfiguration_delay() -> None:
    # Plan A: g0 only. Plan B (from t = 2 s): g0 unchanged plus a new g1, half the traffic each. The delay is 3 s.
    trace = arrivals_poisson(100, 8.0, seed=7, application="app0")
    planner = RecordingPlanner(
        fixed_planner(("g0", "full", "v0", None, 100)),
        fixed_planner(("g0", "full", "v0", None, 50), ("g1", "full", "v0", None, 50)),
    )
    result = simulate(tiny_problem(n_gpus=2), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=2.0, burst_factor=None, reconfiguration_delay_s=3.0, seed=3))
    first = result.replans[1]
    assert (first["time_s"], first["kept"], first["created"], first["destroyed"]) == (2.0, 1, 1, 0)
    by_id = {i["id"]: i for i in result.instances}
    assert by_id["g1/full"]["ready_s"] == pytest.approx(5.0)
    q = result.queries
    k0, k1 = by_id["g0/full"]["index"], by_id["g1/full"]["index"]
    served_by_g1 = q["arrival_ms"][q["instance"] == k1]
    assert served_by_g1.size > 0 and served_by_g1.min() >= 5000.0
    # g0 kept serving through the delay: everything that arrived in [2 s, 5 s) went to g0, mostly on time.
    window = (q["arrival_ms"] >= 2000.0) & (q["arrival_ms"] < 5000.0)
    assert np.all(q["instance"][window] == k0)
    assert np.mean(q["outcome"][window] == ON_TIME) > 0.9
    # After g1 is ready, both serve.
    after = q["arrival_ms"] >= 5100.0
    assert 0.3 < np.mean(q["instance"][after] == k1) < 0.7
    check_conservation(result)


MIG_SLICES = {"3g.20gb": 1.0, "2g.10gb": 1.4, "1g.5gb": 2.5}


def mig_problem() -> Problem:
    return problem_from_dict({
        "applications": [{"name": "app0", "slo_ms": 200.0, "demand_rps": 100.0}],
        "variants": [{"name": "v0", "application": "app0", "accuracy": 0.8, "memory_mb": 500}],
        "devices": [{"name": "a100", "type": "A100-SXM4-40GB", "mig": True, "layout": ["3g.20gb@0", "3g.20gb@4"]}],
        "profiles": [
            {"variant": "v0", "device_type": "A100-SXM4-40GB", "slice": s, "batch": b, "latency_ms": lat * f}
            for s, f in MIG_SLICES.items() for b, lat in LATENCY.items()
        ],
    })


def test_mig_reconfiguration_keeps_the_surviving_instance_serving() -> None:
    # Plan A: 3g.20gb@0 + 3g.20gb@4. Plan B (t = 2 s): 3g.20gb@0 stays; @4 becomes 2g.10gb@4 + 1g.5gb@6.
    trace = arrivals_poisson(120, 7.0, seed=9, application="app0")
    plan_a = fixed_planner(("a100", "3g.20gb", "v0", 0, 60), ("a100", "3g.20gb", "v0", 4, 60))
    plan_b = fixed_planner(("a100", "3g.20gb", "v0", 0, 60), ("a100", "2g.10gb", "v0", 4, 40), ("a100", "1g.5gb", "v0", 6, 20))
    planner = RecordingPlanner(plan_a, plan_b)
    result = simulate(mig_problem(), trace, planner=planner, config=SimulationConfig(
        replan_interval_s=2.0, burst_factor=None, reconfiguration_delay_s=2.0, seed=1))
    r = result.replans[1]
    assert (r["kept"], r["created"], r["destroyed"], r["mig_created"], r["mig_destroyed"]) == (1, 2, 1, 2, 1)
    assert all(x["kept"] == 3 and x["created"] == 0 for x in result.replans[2:])
    by_id = {i["id"]: i for i in result.instances}
    assert set(by_id) == {"a100/3g.20gb@0", "a100/3g.20gb@4", "a100/2g.10gb@4", "a100/1g.5gb@6"}
    assert by_id["a100/3g.20gb@4"]["stopped_s"] == pytest.approx(2.0)
    q = result.queries
    window = (q["arrival_ms"] >= 2000.0) & (q["arrival_ms"] < 4000.0)
    assert np.all(q["instance"][window] == by_id["a100/3g.20gb@0"]["index"])
    for new in ("a100/2g.10gb@4", "a100/1g.5gb@6"):
        assert by_id[new]["ready_s"] == pytest.approx(4.0)
        served = q["arrival_ms"][q["instance"] == by_id[new]["index"]]
        assert served.size > 0 and served.min() >= 4000.0
    # The stopped instance started nothing after 2 s (a batch in flight may finish).
    stopped = q["done_ms"][q["instance"] == by_id["a100/3g.20gb@4"]["index"]]
    assert stopped.max() <= 2000.0 + 52.0 * 1.5
    # The next plan starts from the layout the current one left (carry_layouts).
    check_conservation(result)


def test_replanning_starts_from_the_current_mig_layout() -> None:
    seen: list[Any] = []
    plan_b = fixed_planner(("a100", "3g.20gb", "v0", 0, 60), ("a100", "2g.10gb", "v0", 4, 40), ("a100", "1g.5gb", "v0", 6, 20))

    def planner(problem: Problem) -> Plan:
        seen.append([str(p) for p in problem.device("a100").layout])
        return plan_b(problem)

    simulate(mig_problem(), arrivals_poisson(50, 5.0, seed=1, application="app0"), planner=planner,
             config=SimulationConfig(replan_interval_s=2.0, burst_factor=None))
    assert seen[0] == ["3g.20gb@0", "3g.20gb@4"]
    assert seen[1] == ["3g.20gb@0", "2g.10gb@4", "1g.5gb@6"]


# --------------------------------------------------------------------------- routing, determinism, theory


def test_vectorised_routing_picks_exactly_what_the_weighted_router_picks() -> None:
    table = RoutingTable("app", 1, (("a", 0.5), ("b", 0.3), ("c", 0.15), ("d", 0.05)))
    router = WeightedRouter(table, seed=11)
    expected = [router.choose() for _ in range(5000)]
    stream = random.Random(11)
    uniforms = np.array([stream.random() for _ in range(5000)])
    keys = {"a": 0, "b": 1, "c": 2, "d": 3}
    flat = FlatAliasRouter(2, {1: [(keys[i], w) for i, w in table.entries]})
    picks = flat.draw(np.ones(5000, dtype=np.int64), uniforms)
    assert [("abcd")[k] for k in picks.tolist()] == expected
    assert np.all(flat.draw(np.zeros(3, dtype=np.int64), np.array([0.1, 0.5, 0.99])) == -1)


def test_routing_follows_the_plan_weights() -> None:
    trace = arrivals_poisson(160, 50.0, seed=1, application="app0")
    result = simulate(tiny_problem(n_gpus=2), trace, planner=fixed_planner(("g0", "full", "v0", None, 120), ("g1", "full", "v0", None, 40)),
                      config=SimulationConfig(**QUIET))
    share = np.mean(result.queries["instance"] == 0)
    assert share == pytest.approx(0.75, abs=0.02)


def test_same_seed_same_result_other_seed_other_result() -> None:
    trace = arrivals_poisson(500, 4.0, seed=1, application="app0").merge(arrivals_poisson(200, 4.0, seed=2, application="app1"))
    planner = fixed_planner(("g0", "full", "v0", None, 250), ("g1", "full", "w0", None, 250), ("g2", "full", "v1", None, 200))

    def run(seed: int):
        return simulate(tiny_problem(n_gpus=3, apps=2, slo_ms=50.0), trace, planner=planner, config=SimulationConfig(seed=seed, replan_interval_s=2.0))

    a, b, c = run(1), run(1), run(2)
    for key in ("done_ms", "outcome", "instance"):
        np.testing.assert_array_equal(a.queries[key], b.queries[key])
    strip = lambda s: {k: v for k, v in s.items() if k not in ("wall_s", "planner_wall_s", "simulated_queries_per_wall_s")}  # noqa: E731
    assert strip(a.summary) == strip(b.summary)
    assert not np.array_equal(a.queries["instance"], c.queries["instance"])


def test_single_server_queue_matches_md1_theory() -> None:
    # Batches of 1, deterministic 10 ms service, Poisson arrivals at 50 q/s (rho 0.5): M/D/1 mean waiting
    # time rho D / (2 (1 - rho)) = 5 ms, so the mean latency is 15 ms.
    trace = arrivals_poisson(50, 2000.0, seed=4, application="app0")
    result = simulate(tiny_problem(slo_ms=10_000.0), trace, planner=fixed_planner(("g0", "full", "v0", None, 50)),
                      config=SimulationConfig(batching="fixed", drop_rule="never", **QUIET))
    q = result.queries
    assert np.all(q["outcome"] == ON_TIME)
    assert float(np.mean(q["done_ms"] - q["arrival_ms"])) == pytest.approx(15.0, rel=0.03)
    assert result.instances[0]["utilisation"] == pytest.approx(0.5, rel=0.03)


def test_service_time_noise_is_mean_preserving() -> None:
    trace = trace_of([i * 0.1 for i in range(20000)])  # 10 q/s, never queued: latency = service time
    result = simulate(tiny_problem(), trace, planner=fixed_planner(("g0", "full", "v0", None, 10)),
                      config=SimulationConfig(batching="fixed", noise_sigma=0.3, replan_interval_s=None, burst_factor=None, drop_rule="never"))
    latency = result.queries["done_ms"] - result.queries["arrival_ms"]
    assert float(np.mean(latency)) == pytest.approx(10.0, rel=0.01)
    assert float(np.std(np.log(latency))) == pytest.approx(0.3, rel=0.05)


def test_a_measured_service_model_replaces_the_profile_for_its_variant_only() -> None:
    # v0 measured at 1.5x its profile plus 2 ms a batch, spread 0.2; w0 keeps its profile (5 ms) and no noise.
    times = [i * 0.05 for i in range(20000)]  # 10 q/s each, alternating, never queued: latency = service time
    trace = trace_of(times, apps=[i % 2 for i in range(len(times))], names=("app0", "app1"))
    planner = fixed_planner(("g0", "full", "v0", None, 10), ("g1", "full", "w1", None, 10))
    config = SimulationConfig(batching="fixed", drop_rule="never", service_by_variant={"v0": (1.5, 2.0, 0.2)}, **QUIET)
    result = simulate(tiny_problem(n_gpus=2, apps=2, slo_ms=1000.0), trace, planner=planner, config=config)
    q = result.queries
    latency = q["done_ms"] - q["arrival_ms"]
    measured, profiled = latency[q["application"] == 0], latency[q["application"] == 1]
    assert float(np.mean(measured)) == pytest.approx(10.0 * 1.5 + 2.0, rel=0.01)  # mean-preserving
    assert float(np.std(np.log(measured))) == pytest.approx(0.2, rel=0.05)
    assert np.allclose(profiled, 5.0)  # QUIET: no noise for the variant without a model
    plain = simulate(tiny_problem(n_gpus=2, apps=2, slo_ms=1000.0), trace, planner=planner,
                     config=SimulationConfig(batching="fixed", drop_rule="never", **QUIET))
    assert np.array_equal(plain.queries["done_ms"][q["application"] == 1], q["done_ms"][q["application"] == 1])
    assert config.to_dict()["service_by_variant"] == {"v0": [1.5, 2.0, 0.2]}
    for bad in ((0.0, 0.0, 0.1), (1.0, -1.0, 0.1), (1.0, 0.0, math.nan), (1.0, 2.0)):
        with pytest.raises(ValueError, match="service_by_variant"):
            SimulationConfig(service_by_variant={"v0": bad})


def test_bad_configuration_and_traces_are_refused() -> None:
    with pytest.raises(ValueError, match="routing"):
        SimulationConfig(routing="random")
    with pytest.raises(ValueError, match="drop_rule"):
        SimulationConfig(drop_rule={"app0": "sometimes"})
    with pytest.raises(ValueError, match="unknown batching policy"):
        simulate(tiny_problem(), trace_of([0.0]), planner=fixed_planner(), config=SimulationConfig(batching="greedy"))
    with pytest.raises(ValueError, match="applications the problem does not"):
        simulate(tiny_problem(), trace_of([0.0], names=("other",)), planner=fixed_planner())


def test_result_outputs(tmp_path: Path) -> None:
    trace = arrivals_poisson(100, 3.0, seed=1, application="app0")
    result = simulate(tiny_problem(), trace, planner=fixed_planner(("g0", "full", "v0", None, 100)), config=SimulationConfig(replan_interval_s=1.0))
    data = json.loads(result.to_json(per_second=True))
    assert data["summary"]["queries"] == len(trace) and len(data["replans"]) == 3
    result.write_csv(tmp_path / "per_second.csv")
    lines = (tmp_path / "per_second.csv").read_text().splitlines()
    assert lines[0].split(",") == list(PER_SECOND_FIELDS) and len(lines) == 1 + result.per_second["second"].size
    pytest.importorskip("matplotlib")
    result.plot(tmp_path / "plots.png")
    assert (tmp_path / "plots.png").stat().st_size > 1000


# --------------------------------------------------------------------------- CLI


def test_cli_simulate_end_to_end(tmp_path: Path) -> None:
    from controlplane.cli import app

    from .test_problem_format import small_problem_dict

    raw = small_problem_dict()
    for a in raw["applications"]:
        a["demand_rps"] = a["demand_rps"] / 10
    (tmp_path / "problem.json").write_text(json.dumps(raw))
    trace = arrivals_poisson(90, 3.0, seed=1, application="classify").merge(arrivals_poisson(6, 3.0, seed=2, application="detect"))
    trace_write(trace, tmp_path / "trace.csv")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "simulate", "--problem", str(tmp_path / "problem.json"), "--trace", str(tmp_path / "trace.csv"), "--planner", "proteus",
        "--batching", "fixed", "--batching-param", "size=4", "--replan-every", "1", "--seed", "1", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    assert "SLO violations" in result.stdout and f"simulated    {len(trace)} queries" in result.stdout
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["queries"] == len(trace) and summary["planner"] == "proteus" and summary["replans_interval"] == 2
    assert summary["on_time"] + summary["late"] + summary["dropped"] == len(trace)
    rows = (out / "per_second.csv").read_text().splitlines()
    assert rows[0].startswith("second,demand,on_time")
    assert (out / "plots.png").exists()


def test_cli_simulate_refuses_bad_input(tmp_path: Path) -> None:
    from controlplane.cli import app

    (tmp_path / "trace.csv").write_text("time_s,application\n0.5,classify\n0.1,classify\n")
    from .test_problem_format import small_problem_dict

    (tmp_path / "problem.json").write_text(json.dumps(small_problem_dict()))
    runner = CliRunner()
    bad_planner = runner.invoke(app, ["simulate", "--problem", str(tmp_path / "problem.json"), "--trace", str(tmp_path / "trace.csv"), "--planner", "magic"])
    assert bad_planner.exit_code == 2 and "--planner must be one of" in bad_planner.output
    unsorted = runner.invoke(app, ["simulate", "--problem", str(tmp_path / "problem.json"), "--trace", str(tmp_path / "trace.csv")])
    assert unsorted.exit_code == 2 and "line 3" in unsorted.output


@pytest.mark.timeout(120)
def test_simulator_bench_quick_writes_csv(tmp_path: Path) -> None:
    import csv
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(repo / "benches" / "simulator.py"), "--quick", "--out", str(tmp_path)],
                         cwd=repo, capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    with (tmp_path / "simulator.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["batching"] for r in rows} == {"proteus", "aimd", "nexus", "max-delay", "fixed"}
    assert all(int(r["queries"]) > 50_000 and float(r["queries_per_s"]) > 0 for r in rows)


def test_proteus_batching_survives_latency_profiles_that_dip_with_batch_size() -> None:
    """Measured profiles are often flat or dip at small batches (the gpulets data does). The latency the
    policies see is made non-decreasing, so Proteus never waits past the point where the head could still
    be served alone (the deadline drop rule then dropped 87% of queries)."""
    from engine.plans.problem import problem_from_dict
    from engine.simulation.simulator import SimulationConfig, simulate
    from engine.simulation.workload import arrivals_poisson

    latency = {1: 2.40, 2: 2.31, 4: 2.38, 8: 2.42}
    problem = problem_from_dict({
        "applications": [{"name": "a", "slo_ms": 5.0, "demand_rps": 500}],
        "variants": [{"name": "v", "application": "a", "accuracy": 0.8, "memory_mb": 100}],
        "devices": [{"name": "g0", "type": "SIM", "memory_mb": 16000}],
        "profiles": [{"variant": "v", "device_type": "SIM", "slice": "full", "batch": b, "latency_ms": l} for b, l in latency.items()],
    })
    trace = arrivals_poisson(500, 10.0, seed=1, application="a")
    summary = simulate(problem, trace, planner="proteus", config=SimulationConfig(
        batching="proteus", noise_sigma=0.0, replan_interval_s=None, burst_factor=None)).summary
    assert summary["dropped_expired"] == 0 and summary["slo_violation_ratio"] < 0.01


def test_mig_gpus_run_whole_stay_in_the_fleet_across_replans() -> None:
    """A MIG GPU the plan runs whole reports an empty layout; carried into the next problem as a MIG GPU
    with zero instances it vanished (instances 6 -> 2 and a third of the queries dropped)."""
    import dataclasses

    from engine.reference.generate import proteus_sized_problem
    from engine.simulation.simulator import SimulationConfig, simulate
    from engine.simulation.workload import trace_for_applications

    base = proteus_sized_problem(6, 3, 12, 2, seed=0, load=0.5)
    devices = tuple(dataclasses.replace(d, mig=True) if d.type in ("A100-SXM4-40GB", "H100-SXM5-80GB") else d for d in base.devices)
    problem = dataclasses.replace(base, devices=devices)
    trace = trace_for_applications("poisson", tuple(a.name for a in problem.applications), problem.total_demand_rps, 30.0, seed=1)
    from engine.solvers.solve import plan_solve

    seen = []

    def planner(p):
        seen.append(p)
        return plan_solve(p, "proteus")

    result = simulate(problem, trace, planner=planner, config=SimulationConfig(replan_interval_s=10, burst_factor=None))
    assert len(seen) >= 3
    for p in seen:
        for device in p.devices:
            if device.mig:
                assert device.layout is None, (device.name, device.layout)
    assert result.summary["dropped_no_capacity"] == 0


def test_even_routing_spreads_a_family_alike_whatever_the_weights() -> None:
    """`routing="even"`, the Proteus artefact's (its executor replaces the capacity weights by ones;
    docs/fidelity-proteus.md, section 4): every routed instance gets an equal share, where `weights` follows
    the plan's 4:1 split."""
    planner = fixed_planner(("g0", "full", "v0", None, 40.0), ("g1", "full", "v0", None, 10.0))
    trace = arrivals_poisson(50.0, 60.0, 3, application="app0")
    shares = {}
    for routing in ("weights", "even"):
        result = simulate(tiny_problem(n_gpus=2), trace, planner=planner, config=SimulationConfig(routing=routing, seed=0, **QUIET))
        check_conservation(result)
        served = result.queries["instance"][result.queries["outcome"] == ON_TIME]
        counts = np.bincount(served[served >= 0])
        shares[routing] = counts.max() / counts.sum()
    assert shares["weights"] == pytest.approx(0.8, abs=0.03) and shares["even"] == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError, match="routing must be one of"):
        SimulationConfig(routing="round-robin")
