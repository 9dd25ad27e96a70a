"""Tests for the garrison-demand solver (the demand-sized variant of Garrison's allocation): its plans are sound (valid MIG layouts, instances that fit memory and the
latency budget, traffic within capacity, consistent routing and shortfall) and deterministic, and the
steps of Algorithm 1 (sweet intervals, sampling probabilities, batch-size distribution) do what the
module docstring says."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import layout_parse, mig_layout_validate
from engine.plans.capacity import capacity_for
from engine.plans.problem import Plan, Problem, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.garrison_demand import garrison_demand_solve as garrison_solve
from engine.solvers.garrison_demand import garrison_demand_sweet_intervals as garrison_sweet_intervals

A100 = "A100-SXM4-40GB"
H100 = "H100-SXM5-80GB"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
TOL = 1e-6

# name, application, accuracy, memory_mb, fixed latency (ms), latency per item (ms)
VARIANTS = (
    ("small", "classify", 0.70, 1500.0, 1.0, 0.6),
    ("large", "classify", 0.80, 6000.0, 2.0, 1.5),
    ("detector", "detect", 0.60, 3000.0, 3.0, 2.0),
)


def _latency_ms(batch: int, compute_slices: float, fixed_ms: float, per_item_ms: float) -> float:
    """Synthetic but shaped like measurements: a batch of b keeps at most b/4 compute slices busy, so
    small batches gain nothing from a large slice and large batches need one to stay within the SLO."""
    return fixed_ms + per_item_ms * batch / min(compute_slices, max(1.0, batch / 4))


def problem_build(
    *,
    a100: int = 2,
    h100: int = 0,
    whole_gpus: int = 0,
    cpus: int = 0,
    demand: dict[str, float] | None = None,
    slo_ms: dict[str, float] | None = None,
    min_accuracy: dict[str, float] | None = None,
    fixed: dict[str, list[str]] | None = None,
    objective: str = "max-accuracy",
    variants: tuple = VARIANTS,
) -> Problem:
    demand = demand or {"classify": 3000.0, "detect": 800.0}
    slo_ms = slo_ms or {"classify": 100.0, "detect": 150.0}
    catalogue = mig_catalogue_load()
    profiles: list[dict[str, Any]] = []
    for name, _, _, _, fixed_ms, per_item_ms in variants:
        for model, speed in ((A100, 1.0), (H100, 1.8)):
            for p in catalogue.gpu_model_get(model).profiles:
                if p.media_extensions:
                    continue
                for b in BATCHES:
                    latency = _latency_ms(b, p.compute_slices, fixed_ms, per_item_ms) / speed
                    profiles.append({"variant": name, "device_type": model, "slice": p.name, "batch": b, "latency_ms": latency})
        for b in BATCHES:
            profiles.append({"variant": name, "device_type": "T4", "slice": "full", "batch": b, "latency_ms": _latency_ms(b, 3, fixed_ms, per_item_ms)})
            profiles.append({"variant": name, "device_type": "cpu", "slice": "8", "batch": b, "latency_ms": _latency_ms(b, 1, 4 * fixed_ms, 5 * per_item_ms)})
    devices: list[dict[str, Any]] = [{"name": f"a100-{i}", "type": A100, "mig": True} for i in range(a100)]
    devices += [{"name": f"h100-{i}", "type": H100, "mig": True} for i in range(h100)]
    devices += [{"name": f"t4-{i}", "type": "T4", "memory_mb": 16000} for i in range(whole_gpus)]
    devices += [{"name": f"cpu-{i}", "type": "cpu", "cores": 8} for i in range(cpus)]
    for name, layout in (fixed or {}).items():
        devices.append({"name": name, "type": A100, "mig": True, "fixed_layout": True, "layout": layout})
    apps = sorted({v[1] for v in variants})
    raw = {
        "applications": [
            {"name": a, "slo_ms": slo_ms[a], "demand_rps": demand.get(a, 0.0), **({"min_accuracy": min_accuracy[a]} if min_accuracy and a in min_accuracy else {})}
            for a in apps
        ],
        "variants": [{"name": n, "application": a, "accuracy": acc, "memory_mb": mem} for n, a, acc, mem, _, _ in variants],
        "devices": devices,
        "profiles": profiles,
        "options": {"objective": objective},
    }
    return problem_from_dict(raw)


def assert_plan_sound(problem: Problem, plan: Plan) -> None:
    """The checks every Garrison plan must pass, written against the problem, not the solver."""
    catalogue = mig_catalogue_load()
    assert plan.solver == "garrison-demand"
    assert plan.status in ("feasible", "infeasible")
    assert plan.bound is None and plan.gap is None

    by_device: dict[str, list] = defaultdict(list)
    for inst in plan.instances:
        by_device[inst.device].append(inst)
        device = problem.device(inst.device)
        capacity = capacity_for(problem, inst.variant, device, inst.slice)
        assert capacity is not None, f"{inst.id}: {inst.variant} does not fit memory/latency budget there"
        assert inst.batch == capacity.batch
        assert inst.capacity_rps == pytest.approx(capacity.capacity_rps)
        assert 0 < inst.assigned_rps <= capacity.capacity_rps * (1 + 1e-9) + TOL
        assert capacity.latency_ms <= problem.application(problem.variant(inst.variant).application).slo_ms * problem.options.latency_budget_fraction + 1e-9

    for device in problem.devices:
        instances = by_device.get(device.name, [])
        if device.mig:
            assert device.name in plan.layouts, f"{device.name}: no layout in the plan"
            layout = layout_parse(plan.layouts[device.name])
            verdict = mig_layout_validate(catalogue.gpu_model_get(device.type), layout)
            assert verdict.valid, f"{device.name}: {verdict.reason}"
            placements = [f"{i.slice}@{i.start}" for i in instances]
            assert len(set(placements)) == len(placements), f"{device.name}: two instances on one placement"
            assert set(layout_parse(placements)) <= set(layout), f"{device.name}: instances outside the layout"
            if device.fixed_layout:
                assert layout == tuple(sorted(device.layout or ()))
        else:
            assert device.name not in plan.layouts
            assert len(instances) <= 1, f"{device.name}: more than one instance on a whole GPU / CPU"

    for app in problem.applications:
        served = sum(i.assigned_rps for i in plan.instances if problem.variant(i.variant).application == app.name)
        assert plan.served_rps[app.name] == pytest.approx(served, abs=TOL)
        assert served <= app.demand_rps * (1 + 1e-9) + TOL
        assert served + plan.shortfall_rps[app.name] == pytest.approx(app.demand_rps, rel=1e-6, abs=TOL)
        routes = plan.routing[app.name]
        if served > 0:
            assert math.fsum(r.weight for r in routes) == pytest.approx(1.0, abs=1e-9)
            assigned = {i.id: i.assigned_rps for i in plan.instances}
            for r in routes:
                assert r.weight == pytest.approx(assigned[r.instance] / served, abs=1e-9)
            if app.min_accuracy is not None:
                assert plan.accuracy_by_application[app.name] >= app.min_accuracy - 1e-9
        else:
            assert routes == []
    if problem.total_demand_rps > 0:
        assert (plan.status == "infeasible") == (plan.total_served_rps == 0)


# --------------------------------------------------------------------------- plans


def test_plan_is_sound_and_serves_everything_when_capacity_suffices() -> None:
    problem = problem_build(a100=2)
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.status == "feasible"
    assert all(s == 0 for s in plan.shortfall_rps.values())
    assert plan.served_rps == pytest.approx({"classify": 3000.0, "detect": 800.0})
    assert plan.gpus_used == 1  # first-fit-decreasing consolidates onto the first GPU
    assert plan.layouts["a100-1"] == []


def test_more_demand_than_capacity_gives_a_shortfall() -> None:
    problem = problem_build(a100=1, demand={"classify": 1e6, "detect": 1e5})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.status == "feasible"
    assert plan.shortfall_rps["classify"] > 0 and plan.shortfall_rps["detect"] > 0
    # Overloaded, every instance runs at capacity, and the GPU is full.
    assert all(i.assigned_rps == pytest.approx(i.capacity_rps) for i in plan.instances)
    spec = mig_catalogue_load().gpu_model_get(A100)
    used_compute = sum(spec.profile_get(p.profile).compute_slices for p in layout_parse(plan.layouts["a100-0"]))
    assert used_compute == spec.compute_slices
    # Every ensemble member keeps an instance through the shortage.
    assert {i.variant for i in plan.instances} == {"small", "large", "detector"}


def test_nothing_servable_is_infeasible() -> None:
    problem = problem_build(slo_ms={"classify": 1.0, "detect": 1.0})  # no batch fits half a millisecond
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.status == "infeasible"
    assert plan.instances == []
    assert plan.shortfall_rps == {"classify": 3000.0, "detect": 800.0}
    assert all(layout == [] for layout in plan.layouts.values())


def test_zero_demand_is_feasible_and_runs_nothing() -> None:
    problem = problem_build(demand={"classify": 0.0, "detect": 0.0})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.status == "feasible" and plan.instances == []


def test_output_is_deterministic() -> None:
    problem = problem_build(a100=3, h100=1, whole_gpus=1, cpus=1, demand={"classify": 40000.0, "detect": 9000.0})
    first, second = garrison_solve(problem), garrison_solve(problem_build(a100=3, h100=1, whole_gpus=1, cpus=1, demand={"classify": 40000.0, "detect": 9000.0}))
    a, b = first.to_dict(), second.to_dict()
    a.pop("solve_seconds"), b.pop("solve_seconds")
    assert a == b


def test_whole_gpus_and_cpus_are_single_slots() -> None:
    problem = problem_build(a100=0, whole_gpus=2, cpus=2, demand={"classify": 2500.0, "detect": 300.0})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.status == "feasible"
    assert {i.slice for i in plan.instances} <= {"full", "8"}
    assert plan.layouts == {}
    assert any(i.slice == "8" for i in plan.instances)  # a CPU covers a remainder no GPU is needed for


def test_fixed_layout_is_kept_and_its_slots_are_used() -> None:
    problem = problem_build(a100=0, fixed={"fixed-0": ["4g.20gb@0", "3g.20gb@4"]}, demand={"classify": 2000.0, "detect": 200.0})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.layouts["fixed-0"] == ["4g.20gb@0", "3g.20gb@4"]
    assert plan.total_served_rps > 0
    assert {(i.slice, i.start) for i in plan.instances} <= {("4g.20gb", 0), ("3g.20gb", 4)}


def test_min_accuracy_keeps_less_accurate_variants_out() -> None:
    problem = problem_build(min_accuracy={"classify": 0.75})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert "small" not in {i.variant for i in plan.instances}
    assert plan.accuracy_by_application["classify"] == pytest.approx(0.80)


def test_min_accuracy_nobody_meets_leaves_the_application_short() -> None:
    problem = problem_build(min_accuracy={"detect": 0.99})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    assert plan.shortfall_rps["detect"] == pytest.approx(800.0)
    assert plan.status == "feasible"  # classify is still served
    assert any("detect has no variant" in n for n in plan.notes)


def test_infeasible_plan_says_why() -> None:
    plan = garrison_solve(problem_build(slo_ms={"classify": 1.0, "detect": 1.0}))
    assert any("classify has no variant" in n and "latency budget" in n for n in plan.notes)


def test_mixed_fleet_is_sound() -> None:
    problem = problem_build(a100=2, h100=2, whole_gpus=1, cpus=1, demand={"classify": 60000.0, "detect": 15000.0})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)


def test_plan_passes_the_independent_validator() -> None:
    for problem in (
        problem_build(a100=2),
        problem_build(a100=1, h100=1, whole_gpus=1, cpus=1, demand={"classify": 1e6, "detect": 1e4}),
        problem_build(a100=1, fixed={"fixed-0": ["3g.20gb@0", "3g.20gb@4"]}, demand={"classify": 9000.0, "detect": 2000.0}),
    ):
        verdict = plan_validate(problem, garrison_solve(problem))
        assert verdict.valid, str(verdict)


# --------------------------------------------------------------------------- the steps of Algorithm 1


def test_sweet_intervals_partition_the_feasible_batches() -> None:
    problem = problem_build(a100=1, h100=0)
    for variant in ("small", "large", "detector"):
        intervals = garrison_sweet_intervals(problem, variant)
        assert intervals
        covered: list[int] = []
        for interval in intervals:
            assert interval.low_batch <= interval.high_batch
            assert interval.batch_count == interval.high_batch - interval.low_batch + 1  # contiguous here
            assert interval.high_batch <= interval.capacity.batch  # the kind can run its whole interval
            covered += range(interval.low_batch, interval.high_batch + 1)
        assert sorted(covered) == list(range(1, max(covered) + 1))  # disjoint and gap-free from batch 1
        # Larger batches go to kinds at least as large (a small slice cannot serve them within the SLO).
        shares = [i.kind.gpu_share for i in intervals]
        assert shares == sorted(shares)


def test_sweet_intervals_put_small_batches_on_small_slices() -> None:
    problem = problem_build(a100=1)
    intervals = garrison_sweet_intervals(problem, "detector")
    assert intervals[0].kind.slice == "1g.5gb" and intervals[0].low_batch == 1
    assert len(intervals) >= 2  # more than one granularity: the point of the algorithm
    # 6 GB of weights do not fit a 1g.5gb slice: the large variant's smallest kind is 1g.10gb.
    assert garrison_sweet_intervals(problem, "large")[0].kind.slice == "1g.10gb"


def test_uniform_sampling_splits_traffic_evenly_between_members() -> None:
    problem = problem_build(a100=4, demand={"classify": 8000.0, "detect": 100.0})
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)
    by_variant: Counter = Counter()
    for i in plan.instances:
        by_variant[i.variant] += i.assigned_rps
    assert by_variant["small"] == pytest.approx(4000.0)
    assert by_variant["large"] == pytest.approx(4000.0)


def test_given_sampling_probabilities_are_followed() -> None:
    problem = problem_build(a100=4, demand={"classify": 8000.0, "detect": 100.0})
    plan = garrison_solve(problem, sampling_probabilities={"small": 1.0, "large": 3.0})
    assert_plan_sound(problem, plan)
    by_variant: Counter = Counter()
    for i in plan.instances:
        by_variant[i.variant] += i.assigned_rps
    assert by_variant["small"] == pytest.approx(2000.0)
    assert by_variant["large"] == pytest.approx(6000.0)
    assert by_variant["detector"] == pytest.approx(100.0)  # nothing given for detect: uniform over one


def test_batch_distribution_moves_load_between_granularities() -> None:
    problem = problem_build(a100=4, demand={"classify": 100.0, "detect": 3000.0})
    small_batches = garrison_solve(problem, batch_distribution={"detect": {1: 0.5, 2: 0.5}})
    large_batches = garrison_solve(problem, batch_distribution={"detect": {64: 1.0}})
    for plan in (small_batches, large_batches):
        assert_plan_sound(problem, plan)
    intervals = garrison_sweet_intervals(problem, "detector")
    smallest, largest = intervals[0].kind.slice, intervals[-1].kind.slice
    assert {i.slice for i in small_batches.instances if i.variant == "detector"} == {smallest}
    assert {i.slice for i in large_batches.instances if i.variant == "detector"} == {largest}


def test_bad_inputs_are_refused() -> None:
    problem = problem_build()
    with pytest.raises(ValueError):
        garrison_solve(problem, sampling_probabilities={"small": -1.0})
    with pytest.raises(KeyError):
        garrison_solve(problem, sampling_probabilities={"nonexistent": 1.0})
    with pytest.raises(ValueError):
        garrison_solve(problem, batch_distribution={"detect": {0: 1.0}})
    with pytest.raises(ValueError):
        garrison_solve(problem, batch_distribution={"detect": {4: 0.0}})
    with pytest.raises(KeyError):
        garrison_solve(problem, batch_distribution={"nonexistent": {4: 1.0}})


# --------------------------------------------------------------------------- random problems


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a100=st.integers(0, 3),
    h100=st.integers(0, 2),
    whole_gpus=st.integers(0, 2),
    cpus=st.integers(0, 2),
    classify=st.floats(0, 2e5),
    detect=st.floats(0, 5e4),
    slo_classify=st.floats(5, 400),
    slo_detect=st.floats(5, 400),
    fixed=st.sampled_from([None, ["7g.40gb@0"], ["4g.20gb@0", "2g.10gb@4", "1g.5gb@6"], ["1g.5gb@0", "1g.10gb@2"]]),
    objective=st.sampled_from(["max-accuracy", "min-gpus"]),
)
def test_random_problems_give_sound_plans(a100, h100, whole_gpus, cpus, classify, detect, slo_classify, slo_detect, fixed, objective) -> None:
    if not (a100 or h100 or whole_gpus or cpus or fixed):
        cpus = 1  # a problem needs at least one device
    problem = problem_build(
        a100=a100, h100=h100, whole_gpus=whole_gpus, cpus=cpus,
        demand={"classify": classify, "detect": detect}, slo_ms={"classify": slo_classify, "detect": slo_detect},
        fixed={"fixed-0": fixed} if fixed else None, objective=objective,
    )
    plan = garrison_solve(problem)
    assert_plan_sound(problem, plan)


def test_short_fleet_serves_every_application() -> None:
    """When Algorithm 1 asks for more than the fleet has, each variant keeps one instance (not each
    variant on each slice size), so packing cannot fill the GPUs with a few applications' variants."""
    from engine.reference.generate import mig_fleet_problem
    from engine.solvers.solve import plan_solve

    problem = mig_fleet_problem(8, "A100-SXM4-40GB", n_applications=6, seed=0, load=0.5)
    plan = plan_solve(problem, "garrison-demand")
    assert all(plan.served_rps[a.name] > 0 for a in problem.applications), plan.served_rps
    assert plan.total_served_rps > 0.6 * problem.total_demand_rps
