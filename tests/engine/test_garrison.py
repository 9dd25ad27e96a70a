"""The `garrison` planner: Garrison's Algorithm 1 as the paper writes it (DAC'24 §4.2), its sweet
intervals (§4.1), the rounding and the plan it makes on 8 A100s (the paper's 56 slices)."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from engine.geometry.catalogue import mig_catalogue_load
from engine.plans.problem import Problem, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.garrison import (
    QuerySizeRange,
    allocation_round,
    garrison_allocate,
    garrison_solve,
    garrison_sweet_intervals,
    query_size_ranges,
)
from engine.solvers.garrison_fleet import SlotKind
from engine.solvers.solve import plan_solve

A100 = "A100-SXM4-40GB"
SIZES = (1, 2, 4, 8, 16, 32, 64)


def test_algorithm_1_line_by_line() -> None:
    # Two models, two query-size ranges; GS, L, D, SP, M as the paper's inputs.
    gs = {("a", 0): 1, ("b", 0): 2, ("a", 1): 4, ("b", 1): 4}
    lat = {("a", 0): 10.0, ("b", 0): 20.0, ("a", 1): 30.0, ("b", 1): 60.0}
    d = {0: 0.75, 1: 0.25}
    sp = {"a": 0.5, "b": 0.5}
    n = garrison_allocate(gs, lat, d, sp, 56)
    # IR: a0 = 1*10*.5 = 5, b0 = 2*20*.5 = 20, a1 = 4*30*.5 = 60, b1 = 4*60*.5 = 120.
    # RR: a0 = .2, b0 = .8, a1 = 1/3, b1 = 2/3; AR = RR * D; P = AR * 56; N = P / GS.
    assert n[("a", 0)] == pytest.approx(0.2 * 0.75 * 56 / 1)
    assert n[("b", 0)] == pytest.approx(0.8 * 0.75 * 56 / 2)
    assert n[("a", 1)] == pytest.approx((1 / 3) * 0.25 * 56 / 4)
    assert n[("b", 1)] == pytest.approx((2 / 3) * 0.25 * 56 / 4)
    # Every slice is handed out: sum of N * GS is M.
    assert sum(n[k] * gs[k] for k in n) == pytest.approx(56)


def test_a_range_no_model_serves_keeps_its_slices_unallocated_and_sp_zero_gets_none() -> None:
    n = garrison_allocate({("a", 0): 1, ("b", 0): 1}, {("a", 0): 5.0, ("b", 0): 5.0}, {0: 0.5, 1: 0.5}, {"a": 1.0, "b": 0.0}, 14)
    assert n == {("a", 0): pytest.approx(7.0), ("b", 0): 0.0}


def test_query_size_ranges_are_powers_of_two_with_their_share() -> None:
    ranges = query_size_ranges(((1, 0.1), (3, 0.2), (5, 0.3), (40, 0.4)))
    assert ranges == (QuerySizeRange(1, 1, 0.1, 1), QuerySizeRange(2, 3, 0.2, 3), QuerySizeRange(4, 7, 0.3, 5), QuerySizeRange(32, 63, 0.4, 40))
    assert query_size_ranges(None) == (QuerySizeRange(1, 1, 1.0, 1),)


def _latency_ms(size: int, compute_slices: int, fixed_ms: float, per_row_ms: float) -> float:
    """Stand-in profile shaped as §4.1 describes: throughput s / L grows with s and saturates at g /
    per_row_ms, the later the larger the GI (its knee at 9 * fixed * g / per_row)."""
    return fixed_ms + per_row_ms * size / compute_slices


# Table 1's scenario A in kind: MobileNet(2), GoogLeNet(2), DenseNet40(6), with stand-in costs.
SCENARIO_A = {"mobilenet": (2, 0.5, 0.05), "googlenet": (2, 0.8, 0.12), "densenet40": (6, 1.0, 0.30)}


def ensemble_problem(*, gpus: int = 8, query_sizes: dict[str, float] | None = None, slo_ms: float = 100.0,
                     ensemble: dict[str, Any] | None = None, demand_rps: float = 200.0) -> Problem:
    catalogue = mig_catalogue_load()
    variants, profiles = [], []
    for family, (count, fixed_ms, per_row_ms) in SCENARIO_A.items():
        for i in range(count):
            name = f"{family}-{i}"
            variants.append({"name": name, "application": "defend", "accuracy": 0.9, "memory_mb": 2000})
            for p in catalogue.gpu_model_get(A100).profiles:
                if p.media_extensions:
                    continue
                for s in SIZES:
                    profiles.append({"variant": name, "device_type": A100, "slice": p.name, "batch": s,
                                     "latency_ms": _latency_ms(s, p.compute_slices, fixed_ms, per_row_ms)})
    names = [v["name"] for v in variants]
    app: dict[str, Any] = {"name": "defend", "slo_ms": slo_ms, "demand_rps": demand_rps,
                           "query_sizes": query_sizes or {"1": 0.4, "4": 0.3, "16": 0.2, "64": 0.1}}
    app["ensemble"] = ensemble or {"mode": "random", "members": {n: 1 / len(names) for n in names}, "min_size": 3, "max_size": 3}
    return problem_from_dict({
        "applications": [app], "variants": variants, "profiles": profiles,
        "devices": [{"name": f"a100-{i}", "type": A100, "mig": True} for i in range(gpus)],
    })


def test_sweet_intervals_grow_with_the_gi_as_in_figure_5() -> None:
    problem = ensemble_problem()
    intervals = garrison_sweet_intervals(problem, "densenet40-0")
    slices = [mig_catalogue_load().gpu_model_get(A100).profile_get(s.kind.slice).compute_slices for s in intervals]
    assert slices == sorted(slices) and len(set(slices)) >= 3, intervals
    assert intervals[0].low == 1 and intervals[-1].high == 64
    # Each GI holds the sizes up to its knee (the smallest GI not yet saturated), the last one past every knee.
    for sweet in intervals[:-1]:
        assert sweet.high <= sweet.knee


def test_garrison_divides_all_56_slices_by_algorithm_1_and_the_plan_validates() -> None:
    problem = ensemble_problem()
    plan = garrison_solve(problem)
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert plan.solver == "garrison" and plan.status == "feasible"
    spec = mig_catalogue_load().gpu_model_get(A100)
    used = sum(spec.profile_get(i.slice).compute_slices for i in plan.instances)
    # Algorithm 1 hands out every slice; packing into valid layouts may lose a few.
    assert used >= 0.9 * 56, (used, plan.notes)
    # Every member of the ensemble has instances, and the costlier members (L x GS) get more slices.
    by_member: Counter[str] = Counter()
    for i in plan.instances:
        by_member[i.variant] += spec.profile_get(i.slice).compute_slices
    assert set(by_member) == {v.name for v in problem.variants}
    assert min(by_member[f"densenet40-{i}"] for i in range(6)) > max(by_member[f"mobilenet-{i}"] for i in range(2))
    # Rows assigned count each member of a 3-member ensemble: served queries = rows / (3 x mean size).
    app = problem.application("defend")
    assert math.isclose(app.load_factor, 3 * app.mean_query_size)
    assert plan.served_rps["defend"] == pytest.approx(sum(i.assigned_rps for i in plan.instances) / app.load_factor)


def test_sampling_probabilities_shift_the_slices() -> None:
    names = [f"{f}-{i}" for f, (c, _, _) in SCENARIO_A.items() for i in range(c)]
    skewed = {n: (0.5 if n == "mobilenet-0" else 0.5 / (len(names) - 1)) for n in names}
    spec = mig_catalogue_load().gpu_model_get(A100)

    def slices_of(plan, variant):
        return sum(spec.profile_get(i.slice).compute_slices for i in plan.instances if i.variant == variant)

    uniform = garrison_solve(ensemble_problem())
    favoured = garrison_solve(ensemble_problem(ensemble={"mode": "random", "members": skewed, "min_size": 3, "max_size": 3}))
    assert slices_of(favoured, "mobilenet-0") > slices_of(uniform, "mobilenet-0")


def test_larger_queries_take_larger_gis() -> None:
    spec = mig_catalogue_load().gpu_model_get(A100)

    def mean_gi(plan) -> float:
        sizes = [spec.profile_get(i.slice).compute_slices for i in plan.instances]
        return sum(sizes) / len(sizes)

    small = garrison_solve(ensemble_problem(query_sizes={"1": 1.0}))
    large = garrison_solve(ensemble_problem(query_sizes={"64": 1.0}))
    assert mean_gi(large) > mean_gi(small)


def test_rounding_keeps_every_member_and_stays_within_the_slices() -> None:
    one = SlotKind(A100, "1g.5gb", 1 / 7, 1)
    four = SlotKind(A100, "4g.20gb", 4 / 7, 4)
    counts = allocation_round({("a", one): 0.2, ("b", four): 1.6, ("c", one): 4.9}, 7, ["a", "b", "c"])
    assert counts[("a", one)] == 1 and counts[("b", four)] == 1
    assert sum(n * (4 if k == four else 1) for (_, k), n in counts.items()) <= 7


def test_through_plan_solve_and_beside_garrison_demand() -> None:
    problem = ensemble_problem(gpus=2)
    assert plan_solve(problem, "garrison").solver == "garrison"
    demand = plan_solve(problem, "garrison-demand")
    assert demand.solver == "garrison-demand" and plan_validate(problem, demand).valid


def test_a_changed_model_pool_reconfigures_only_the_instances_it_affects_section_3_item_7() -> None:
    """When a member leaves the pool, the instances of the others keep serving where they run (the
    problem's current layout and running variants); only the departed member's slots change hands, and no
    GPU is re-partitioned around them: the MIG layouts stay as they are."""
    from engine.geometry.layout import mig_layout_diff
    from engine.plans.problem import problem_to_dict

    first = ensemble_problem(gpus=4)
    plan = garrison_solve(first)
    raw = problem_to_dict(first)
    for device in raw["devices"]:
        device["layout"] = plan.layouts[device["name"]]
        device["running"] = {f"{i.slice}@{i.start}": i.variant for i in plan.instances if i.device == device["name"]}
    members = [m for m in raw["applications"][0]["ensemble"]["members"] if m["variant"] != "densenet40-5"]
    for m in members:
        m["probability"] = 1 / len(members)
    raw["applications"][0]["ensemble"]["members"] = members
    second = problem_from_dict(raw)
    replanned = garrison_solve(second)
    assert plan_validate(second, replanned).valid
    before = {(i.device, i.slice, i.start, i.variant) for i in plan.instances}
    after = {(i.device, i.slice, i.start, i.variant) for i in replanned.instances}
    departed = {k for k in before if k[3] == "densenet40-5"}
    # Everything but the departed member's instances stays; their slots go to others.
    assert before - after == departed and len(after - before) == len(departed)
    assert any("keep serving where they run" in n for n in replanned.notes)
    for name, layout in replanned.layouts.items():
        diff = mig_layout_diff(A100, plan.layouts[name], layout)
        assert not diff.destroy and not diff.create, (name, diff)
    # Planned from scratch (no running instances known), the same pool moves more of them.
    for device in raw["devices"]:
        device.pop("running")
        device.pop("layout")
    scratch = garrison_solve(problem_from_dict(raw))
    assert len(before & {(i.device, i.slice, i.start, i.variant) for i in scratch.instances}) < len(before & after)
