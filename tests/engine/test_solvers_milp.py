"""The MILP planners (proteus, joint) against brute force, and their lexicographic, min-accuracy,
reconfiguration, min-gpus and backend behaviour.

Brute force: every assignment of variant-or-nothing to every slot (for the joint planner, on every maximal
MIG layout or the whole GPU), then for each distinct total capacity per variant an LP (scipy's linprog)
for the best traffic split. The MILPs count identical slots instead of naming them; brute force names
them, so it also checks that counting loses nothing."""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pulp
import pytest
from scipy.optimize import linprog

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import mig_layout_validate, mig_layouts_enumerate
from engine.plans.capacity import capacity_for, cpu_slice
from engine.plans.problem import FULL_SLICE, DeviceSpec, Plan, Problem, problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers.joint import candidate_counts, joint_fleet
from engine.solvers.milp import milp_solve
from engine.solvers.proteus import proteus_fleet
from engine.solvers.solve import plan_solve

A100 = "A100-SXM4-40GB"
V100 = "V100-16GB"  # not in the MIG catalogue: a whole GPU only
# MIG slices the generated profiles cover; 1g slices are left out to keep brute force small.
A100_SLICES = {"2g.10gb": 2.0, "3g.20gb": 3.0, "4g.20gb": 4.0, "7g.40gb": 7.0, FULL_SLICE: 7.3}
CPU_CORES = {"4": 0.25, "8": 0.45}
OBJ_TOL = 1e-6


# ----------------------------------------------------------------------------- problem builders


def _points(variant: str, device_type: str, slice_name: str, speed: float, slowness: float) -> list[dict[str, Any]]:
    """Two profiled batches; latency grows sub-linearly with the batch, as on real accelerators."""
    base = 6.0 * slowness / speed
    return [
        {"variant": variant, "device_type": device_type, "slice": slice_name, "batch": 1, "latency_ms": round(base, 4)},
        {"variant": variant, "device_type": device_type, "slice": slice_name, "batch": 8, "latency_ms": round(base * 3.2, 4)},
    ]


def random_problem(seed: int, devices: list[dict[str, Any]], *, apps: int, variants: int, load: float, min_accuracy: bool = False) -> Problem:
    """A small random problem. Demand is `load` times what the fleet could serve of each application with
    its fastest variant, shared between applications."""
    rnd = random.Random(seed)
    raw_apps, raw_variants, profiles = [], [], []
    for a in range(apps):
        app = f"app{a}"
        raw_apps.append({"name": app, "slo_ms": rnd.choice([40.0, 60.0, 100.0]), "demand_rps": 1.0})
        for k in range(variants):
            name = f"{app}v{k}"
            accuracy = round(min(0.99, 0.6 + 0.12 * k + rnd.uniform(0, 0.05)), 4)
            slowness = (1.0 + 1.1 * k) * rnd.uniform(0.8, 1.25)
            raw_variants.append({"name": name, "application": app, "accuracy": accuracy, "memory_mb": rnd.choice([2000, 6000, 12000, 21000])})
            for slice_name, speed in A100_SLICES.items():
                if rnd.random() < 0.85:
                    profiles += _points(name, A100, slice_name, speed, slowness)
            if rnd.random() < 0.9:
                profiles += _points(name, V100, FULL_SLICE, 4.0, slowness)
            for cores, speed in CPU_CORES.items():
                if rnd.random() < 0.7:
                    profiles += _points(name, "cpu", cores, speed, slowness)
    raw = {"applications": raw_apps, "variants": raw_variants, "devices": devices, "profiles": profiles}
    probe = problem_from_dict(raw)
    for app in raw_apps:
        app["demand_rps"] = round(max(1.0, load * _fleet_reach(probe, app["name"]) / apps), 3)
        if min_accuracy:
            accs = sorted(v["accuracy"] for v in raw_variants if v["application"] == app["name"])
            app["min_accuracy"] = round((accs[0] + accs[-1]) / 2, 4)
    return problem_from_dict(raw)


def _fleet_reach(problem: Problem, app: str) -> float:
    """What the fleet as it stands could serve of `app` with its fastest variant on every slot."""
    return sum(
        max((_slot_capacity(problem, d, slot, v.name) or 0.0) for v in problem.variants_of(app))
        for d in problem.devices
        for slot in _slot_sets(problem, d, joint=False)[0]
    )


# ----------------------------------------------------------------------------- brute force


def _slot_sets(problem: Problem, device: DeviceSpec, *, joint: bool) -> list[list[str | None]]:
    """The alternative slot lists a device may have: one list for a fixed device, one per maximal layout
    (plus the whole GPU) for a MIG GPU whose geometry the joint planner chooses. None = a CPU slot."""
    if device.is_cpu:
        return [[None]]
    if not device.mig:
        return [[FULL_SLICE]]
    if device.layout is not None and (device.fixed_layout or not joint):
        return [[p.profile for p in device.layout]]
    if not joint:
        return [[FULL_SLICE]]
    spec = mig_catalogue_load().gpu_model_get(device.type)
    return [[p.profile for p in layout] for layout in mig_layouts_enumerate(spec, maximal=True)] + [[FULL_SLICE]]


def _slot_capacity(problem: Problem, device: DeviceSpec, slot: str | None, variant: str) -> float | None:
    slice_name = cpu_slice(problem, variant, device) if slot is None else slot
    if slice_name is None:
        return None
    cap = capacity_for(problem, variant, device, slice_name)
    return cap.capacity_rps if cap else None


def device_options(problem: Problem, device: DeviceSpec, *, joint: bool) -> set[tuple[tuple[float, ...], int]]:
    """Every (capacity per variant, GPUs used) a device can contribute, over every slot list and every
    assignment of variant-or-nothing to each slot."""
    names = [v.name for v in problem.variants]
    options: set[tuple[tuple[float, ...], int]] = set()
    for slots in _slot_sets(problem, device, joint=joint):
        choices = []
        for slot in slots:
            fitting = [(i, c) for i, v in enumerate(names) if (c := _slot_capacity(problem, device, slot, v))]
            choices.append([None] + fitting)
        for assignment in itertools.product(*choices):
            caps = [0.0] * len(names)
            for pick in assignment:
                if pick is not None:
                    caps[pick[0]] += pick[1]
            used = int(not device.is_cpu and any(p is not None for p in assignment))
            options.add((tuple(round(c, 9) for c in caps), used))
    return options


def pareto_prune(options: set[tuple[tuple[float, ...], int]]) -> list[tuple[tuple[float, ...], int]]:
    """Drop an option when another uses no more GPUs and offers at least as much capacity of every variant:
    more capacity never lowers the best split, so no optimum is lost (keeps joint brute force small)."""
    items = sorted(options, key=lambda o: (o[1], -sum(o[0])))
    kept: list[tuple[tuple[float, ...], int]] = []
    for caps, used in items:
        if not any(u <= used and all(a >= b for a, b in zip(c, caps)) for c, u in kept):
            kept.append((caps, used))
    return kept


@dataclass
class BruteForce:
    full_feasible: bool
    accuracy: float | None  # max-accuracy objective (accuracy over total demand), or lexicographic
    served: float  # total served at that optimum
    min_gpus: int | None
    accuracy_at_min_gpus: float | None


def _lp(
    problem: Problem, caps: Sequence[float], *, mode: str, served_floor: float = 0.0,
    floors: dict[str, float] | None = None, tier: Sequence[str] = (),
) -> float | None:
    """mode `full`: best accuracy over demand serving all demand; `fair`: the largest z such that every
    application of `tier` is served z of its demand; `served`: most traffic servable; `at-served`: best
    accuracy over demand serving at least `served_floor`. Partial modes keep every application at its
    `floors` (rps). None when infeasible."""
    variants = list(problem.variants)
    demand = problem.total_demand_rps
    acc = np.array([v.accuracy for v in variants] + [0.0])  # the last column is z (mode `fair` only)
    a_eq, b_eq, a_ub, b_ub = [], [], [], []
    for app in problem.applications:
        row = [1.0 if v.application == app.name else 0.0 for v in variants] + [0.0]
        if mode == "full":
            a_eq.append(row)
            b_eq.append(app.demand_rps)
        else:
            a_ub.append(row)
            b_ub.append(app.demand_rps)
            if (floors or {}).get(app.name, 0.0) > 0:
                a_ub.append([-x for x in row])
                b_ub.append(-floors[app.name])
            if app.name in tier:
                a_ub.append([-x for x in row[:-1]] + [app.demand_rps])  # z * demand <= served
                b_ub.append(0.0)
        if app.min_accuracy is not None:
            a_ub.append([-(v.accuracy - app.min_accuracy) if v.application == app.name else 0.0 for v in variants] + [0.0])
            b_ub.append(0.0)
    if mode == "at-served":
        a_ub.append([-1.0] * len(variants) + [0.0])
        b_ub.append(-served_floor)
    if mode == "fair":
        cost = np.array([0.0] * len(variants) + [-1.0])
    elif mode == "served":
        cost = np.array([-1.0] * len(variants) + [0.0])
    else:
        cost = -acc / demand
    result = linprog(
        cost, A_ub=a_ub or None, b_ub=b_ub or None, A_eq=a_eq or None, b_eq=b_eq or None,
        bounds=[(0, c) for c in caps] + [(0, 1 if mode == "fair" else 0)], method="highs",
    )
    if result.status != 0:
        return None
    return float(-result.fun)


def brute_force(problem: Problem, *, joint: bool) -> BruteForce:
    per_device = [pareto_prune(device_options(problem, d, joint=joint)) for d in problem.devices]
    combos: dict[tuple[float, ...], int] = {}
    for picks in itertools.product(*per_device):
        caps = tuple(round(sum(p[0][i] for p in picks), 9) for i in range(len(problem.variants)))
        used = sum(p[1] for p in picks)
        combos[caps] = min(used, combos.get(caps, used))
    full = {caps: _lp(problem, caps, mode="full") for caps in combos}
    feasible = {caps: a for caps, a in full.items() if a is not None}
    if feasible:
        fewest = min(combos[c] for c in feasible)
        return BruteForce(
            full_feasible=True, accuracy=max(feasible.values()), served=problem.total_demand_rps, min_gpus=fewest,
            accuracy_at_min_gpus=max(a for c, a in feasible.items() if combos[c] == fewest),
        )
    # Overload: max-min served fraction per priority tier, then most traffic, then accuracy at it.
    runnable = {problem.variants[i].application for caps in combos for i, c in enumerate(caps) if c > 0}
    tiers: dict[int, list[str]] = {}
    for app in problem.applications:
        if app.demand_rps > 0 and app.name in runnable:
            tiers.setdefault(app.priority_tier, []).append(app.name)
    floors: dict[str, float] = {}
    if not (len(tiers) == 1 and len(next(iter(tiers.values()))) == 1):
        for priority in sorted(tiers, reverse=True):
            best_share = max((_lp(problem, caps, mode="fair", floors=floors, tier=tiers[priority]) or 0.0) for caps in combos)
            for name in tiers[priority]:
                demand = problem.application(name).demand_rps
                floors[name] = max(0.0, best_share * demand - 1e-6 - 1e-6 * demand)
    served = {caps: _lp(problem, caps, mode="served", floors=floors) or 0.0 for caps in combos}
    best = max(served.values())
    floor = best - 1e-7 * max(1.0, best)
    accuracy = max(
        (a for caps, s in served.items() if s >= floor and (a := _lp(problem, caps, mode="at-served", served_floor=floor, floors=floors)) is not None),
        default=None,
    )
    return BruteForce(full_feasible=False, accuracy=accuracy, served=best, min_gpus=None, accuracy_at_min_gpus=None)


def accuracy_over_demand(problem: Problem, plan: Plan) -> float:
    weighted = sum(i.assigned_rps * problem.variant(i.variant).accuracy for i in plan.instances)
    return weighted / problem.total_demand_rps


def check_plan_consistent(problem: Problem, plan: Plan) -> None:
    """What any plan must satisfy whatever the objective: capacity, demand, min accuracy at full service."""
    for inst in plan.instances:
        assert inst.assigned_rps <= inst.capacity_rps * (1 + 1e-9)
    for app in problem.applications:
        assert plan.served_rps[app.name] <= app.demand_rps * (1 + 1e-7) + 1e-6
        if app.min_accuracy is not None and plan.served_rps[app.name] > 1e-6:
            assert plan.accuracy_by_application[app.name] >= app.min_accuracy - 1e-6
    slots = [(i.device, i.slice, i.start) for i in plan.instances]
    assert len(slots) == len(set(slots)), "two instances on one slot"


# ----------------------------------------------------------------------------- fleets

MIG_FIXED = {"name": "m0", "type": A100, "mig": True, "layout": ["3g.20gb@0", "3g.20gb@4"], "fixed_layout": True}
MIG_FIXED_B = {"name": "m1", "type": A100, "mig": True, "layout": ["4g.20gb@0", "2g.10gb@4"], "fixed_layout": True}
MIG_FREE = {"name": "m2", "type": A100, "mig": True, "layout": ["3g.20gb@0", "2g.10gb@4", "1g.5gb@6"]}
MIG_BARE = {"name": "m3", "type": A100, "mig": True}
WHOLE = {"name": "v0", "type": V100, "memory_mb": 16000}
WHOLE_B = {"name": "v1", "type": V100, "memory_mb": 16000}
CPU = {"name": "c0", "type": "cpu", "cores": 8}

PROTEUS_FLEETS = [
    [MIG_FIXED, WHOLE],
    [MIG_FIXED, MIG_FIXED_B, WHOLE],
    [MIG_FIXED, WHOLE, WHOLE_B, CPU],
    [MIG_BARE, MIG_FIXED_B, CPU],
]
JOINT_FLEETS = [
    [MIG_FREE, WHOLE],
    [MIG_BARE, MIG_FIXED, CPU],
    [MIG_FREE, MIG_BARE],
]

CASES = [
    # (seed, apps, variants per app, load, min_accuracy)
    (1, 2, 2, 0.5, False),
    (2, 2, 3, 0.9, False),
    (3, 3, 2, 0.7, True),
    (4, 2, 2, 1.6, False),  # more demand than the fleet can serve
    (5, 3, 2, 0.35, True),
]


def _solve_and_compare(problem: Problem, solver: str, objective: str, expected: BruteForce) -> Plan:
    plan = plan_solve(problem, solver, objective=objective)
    check_plan_consistent(problem, plan)
    assert plan.status == "optimal", plan.notes
    if objective == "max-accuracy" or not expected.full_feasible:
        assert expected.accuracy is not None
        assert plan.total_served_rps == pytest.approx(expected.served, rel=1e-6, abs=1e-6)
        assert accuracy_over_demand(problem, plan) == pytest.approx(expected.accuracy, abs=OBJ_TOL)
        if objective == "max-accuracy":
            assert plan.objective == pytest.approx(expected.accuracy, abs=OBJ_TOL)
        if not expected.full_feasible:
            assert any("lexicographic" in n for n in plan.notes), plan.notes
    else:
        assert plan.objective == pytest.approx(expected.min_gpus, abs=OBJ_TOL)
        assert plan.gpus_used == expected.min_gpus
        assert sum(plan.shortfall_rps.values()) == 0
        assert accuracy_over_demand(problem, plan) == pytest.approx(expected.accuracy_at_min_gpus, abs=OBJ_TOL)
    return plan


@pytest.mark.parametrize("fleet", PROTEUS_FLEETS, ids=lambda f: "+".join(d["name"] for d in f))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-load{c[3]}")
def test_proteus_matches_brute_force(fleet: list[dict[str, Any]], case: tuple) -> None:
    seed, apps, variants, load, min_acc = case
    problem = random_problem(seed, fleet, apps=apps, variants=variants, load=load, min_accuracy=min_acc)
    expected = brute_force(problem, joint=False)
    for objective in ("max-accuracy", "min-gpus"):
        _solve_and_compare(problem, "proteus", objective, expected)


@pytest.mark.parametrize("fleet", JOINT_FLEETS, ids=lambda f: "+".join(d["name"] for d in f))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-load{c[3]}")
def test_joint_matches_brute_force(fleet: list[dict[str, Any]], case: tuple) -> None:
    seed, apps, variants, load, min_acc = case
    problem = random_problem(seed, fleet, apps=apps, variants=variants, load=load, min_accuracy=min_acc)
    expected = brute_force(problem, joint=True)
    for objective in ("max-accuracy", "min-gpus"):
        plan = _solve_and_compare(problem, "joint", objective, expected)
        spec = mig_catalogue_load().gpu_model_get(A100)
        for device in problem.devices:
            if device.mig and any(i.device == device.name and i.slice != FULL_SLICE for i in plan.instances):
                assert mig_layout_validate(spec, plan.layouts[device.name]).valid
            if device.fixed_layout:
                assert plan.layouts[device.name] == [str(p) for p in sorted(device.layout)]


def test_joint_never_worse_than_proteus() -> None:
    """The joint planner may keep every current layout, so it can only match or beat proteus."""
    free = [dict(MIG_FREE), dict(MIG_FIXED, fixed_layout=False, name="m9"), WHOLE]
    for seed in range(3):
        problem = random_problem(seed, free, apps=2, variants=2, load=0.8)
        fixed = plan_solve(problem, "proteus")
        chosen = plan_solve(problem, "joint")
        assert chosen.objective >= fixed.objective - OBJ_TOL


# ----------------------------------------------------------------------------- specific behaviour


def _raw(apps: list[dict], variants: list[dict], devices: list[dict], profiles: list[dict], **options: Any) -> dict[str, Any]:
    return {"applications": apps, "variants": variants, "devices": devices, "profiles": profiles, "options": options}


def _flat(variant: str, device_type: str, slice_name: str, latency_ms: float) -> list[dict[str, Any]]:
    """One batch size only: capacity is exactly 1000 / latency_ms queries per second."""
    return [{"variant": variant, "device_type": device_type, "slice": slice_name, "batch": 1, "latency_ms": latency_ms}]


def test_lexicographic_when_demand_exceeds_capacity() -> None:
    # One whole GPU: fast (acc .7) serves 200 rps, slow (acc .9) 100 rps; demand 300 cannot be served.
    raw = _raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 300}],
        [{"name": "fast", "application": "a", "accuracy": 0.7}, {"name": "slow", "application": "a", "accuracy": 0.9}],
        [WHOLE, WHOLE_B],
        _flat("fast", V100, FULL_SLICE, 5.0) + _flat("slow", V100, FULL_SLICE, 10.0),
    )
    problem = problem_from_dict(raw)
    for solver in ("proteus", "joint"):
        plan = plan_solve(problem, solver)  # two GPUs: fast + slow serve all 300 rps
        assert plan.total_served_rps == pytest.approx(300) and not any("lexicographic" in n for n in plan.notes)
        assert plan.objective == pytest.approx((0.7 * 200 + 0.9 * 100) / 300)
    # One GPU only: at most 200 rps, all with `fast`; accuracy comes second to served traffic.
    problem = problem_from_dict(dict(raw, devices=[WHOLE]))
    for solver in ("proteus", "joint"):
        for objective in ("max-accuracy", "min-gpus"):
            plan = plan_solve(problem, solver, objective=objective)
            assert plan.status == "optimal"
            assert plan.total_served_rps == pytest.approx(200)
            assert plan.shortfall_rps["a"] == pytest.approx(100)
            assert [i.variant for i in plan.instances] == ["fast"]
            assert any("lexicographic" in n for n in plan.notes)
            if objective == "max-accuracy":
                assert plan.objective == pytest.approx(0.7 * 200 / 300)
            else:
                assert any("fell back" in n for n in plan.notes)
    # Served ties broken by accuracy: `a` can take one GPU (250 rps), `b` the other; both are short.
    raw2 = _raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 250}, {"name": "b", "slo_ms": 100, "demand_rps": 500}],
        [
            {"name": "a_fast", "application": "a", "accuracy": 0.6}, {"name": "a_slow", "application": "a", "accuracy": 0.8},
            {"name": "b_only", "application": "b", "accuracy": 0.75},
        ],
        [WHOLE, WHOLE_B],
        _flat("a_fast", V100, FULL_SLICE, 4.0) + _flat("a_slow", V100, FULL_SLICE, 4.0) + _flat("b_only", V100, FULL_SLICE, 4.0),
    )
    plan = plan_solve(problem_from_dict(raw2), "proteus")
    assert plan.total_served_rps == pytest.approx(500)  # 250 + 250, every GPU busy
    assert {i.variant for i in plan.instances} <= {"a_slow", "b_only"}  # a_fast serves as much but less accurately
    assert plan.objective == pytest.approx((0.8 * 250 + 0.75 * 250) / 750)


def test_nothing_servable_is_an_infeasible_plan() -> None:
    raw = _raw(
        [{"name": "a", "slo_ms": 10, "demand_rps": 50}],
        [{"name": "huge", "application": "a", "accuracy": 0.9, "memory_mb": 90000}],
        [WHOLE, MIG_FIXED],
        _flat("huge", V100, FULL_SLICE, 2.0) + _flat("huge", A100, "3g.20gb", 2.0),
    )
    problem = problem_from_dict(raw)
    for solver, backend in itertools.product(("proteus", "joint"), ("highs", "cbc")):
        for objective in ("max-accuracy", "min-gpus"):
            plan = plan_solve(problem, solver, objective=objective, backend=backend)
            assert plan.status == "infeasible"
            assert plan.instances == []
            assert plan.shortfall_rps == {"a": 50}
            assert any("no variant fits" in n for n in plan.notes), plan.notes


def test_min_accuracy_respected() -> None:
    # `cheap` (acc .7) serves 400 rps per GPU, `good` (acc .9) 100. 400 rps of demand on 4 GPUs.
    raw = _raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 400}],
        [{"name": "cheap", "application": "a", "accuracy": 0.7}, {"name": "good", "application": "a", "accuracy": 0.9}],
        [dict(WHOLE, name=f"v{i}") for i in range(4)],
        _flat("cheap", V100, FULL_SLICE, 2.5) + _flat("good", V100, FULL_SLICE, 10.0),
        objective="min-gpus",
    )
    plain = plan_solve(problem_from_dict(raw), "proteus")
    assert plain.gpus_used == 1 and plain.accuracy_by_application["a"] == pytest.approx(0.7)
    raw["applications"][0]["min_accuracy"] = 0.8
    for solver in ("proteus", "joint"):
        plan = plan_solve(problem_from_dict(raw), solver)
        assert plan.accuracy_by_application["a"] >= 0.8 - 1e-9
        # 0.7 x + 0.9 (400 - x) >= 0.8 * 400 -> at most 200 rps on cheap: 1 cheap + 2 good GPUs.
        assert plan.gpus_used == 3
        assert plan.total_served_rps == pytest.approx(400)
    # A second application competes for the GPUs under max-accuracy: its min accuracy still holds.
    raw3 = _raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 300}, {"name": "b", "slo_ms": 100, "demand_rps": 300, "min_accuracy": 0.85}],
        [
            {"name": "a_cheap", "application": "a", "accuracy": 0.5}, {"name": "a_good", "application": "a", "accuracy": 0.95},
            {"name": "b_cheap", "application": "b", "accuracy": 0.8}, {"name": "b_good", "application": "b", "accuracy": 0.9},
        ],
        [dict(WHOLE, name=f"v{i}") for i in range(4)],
        _flat("a_cheap", V100, FULL_SLICE, 2.5) + _flat("a_good", V100, FULL_SLICE, 10.0)
        + _flat("b_cheap", V100, FULL_SLICE, 2.5) + _flat("b_good", V100, FULL_SLICE, 10.0),
    )
    for solver in ("proteus", "joint"):
        plan = plan_solve(problem_from_dict(raw3), solver)
        assert plan.total_served_rps == pytest.approx(600)
        assert plan.accuracy_by_application["b"] >= 0.85 - 1e-9
        expected = brute_force(problem_from_dict(raw3), joint=False)
        assert plan.objective == pytest.approx(expected.accuracy, abs=OBJ_TOL)


def _reconfiguration_problem(penalty: float) -> Problem:
    # The current layout is 3g.20gb x2, where only `small` (acc .7) fits; `big` (acc .9) needs 7g.40gb.
    # Moving to 7g.40gb destroys 2 instances and creates 1 (3 changes) and gains .2 in accuracy.
    return problem_from_dict(_raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 150}],
        [{"name": "small", "application": "a", "accuracy": 0.7, "memory_mb": 4000},
         {"name": "big", "application": "a", "accuracy": 0.9, "memory_mb": 25000}],
        [{"name": "m0", "type": A100, "mig": True, "layout": ["3g.20gb@0", "3g.20gb@4"]}],
        _flat("small", A100, "3g.20gb", 10.0) + _flat("big", A100, "7g.40gb", 5.0) + _flat("small", A100, "7g.40gb", 5.0),
        reconfiguration_penalty=penalty,
    ))


def test_reconfiguration_penalty_keeps_or_changes_layout() -> None:
    keep = plan_solve(_reconfiguration_problem(0.1), "joint")  # cost .3 > gain .2
    assert keep.layouts["m0"] == ["3g.20gb@0", "3g.20gb@4"]
    assert {i.variant for i in keep.instances} == {"small"}
    assert keep.objective == pytest.approx(0.7)
    change = plan_solve(_reconfiguration_problem(0.05), "joint")  # cost .15 < gain .2
    assert change.layouts["m0"] == ["7g.40gb@0"]
    assert [i.variant for i in change.instances] == ["big"]
    assert change.objective == pytest.approx(0.9 - 3 * 0.05)
    free = plan_solve(_reconfiguration_problem(0.0), "joint")
    assert free.objective == pytest.approx(0.9)


def test_reconfiguration_keeps_surviving_placements() -> None:
    """A new geometry reuses the current placements it can: of the layouts with the chosen counts, the one
    closest to the current layout is realised, so kept instances are not destroyed and recreated."""
    problem = problem_from_dict(_raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 350}],
        [{"name": "s", "application": "a", "accuracy": 0.7, "memory_mb": 1000}],
        [{"name": "m0", "type": A100, "mig": True, "layout": ["3g.20gb@4", "1g.5gb@1"]}],
        _flat("s", A100, "3g.20gb", 5.0) + _flat("s", A100, "2g.10gb", 10.0) + _flat("s", A100, "1g.5gb", 20.0),
        objective="min-gpus", reconfiguration_penalty=0.01,
    ))
    configs = joint_fleet(problem).device_classes[0].configs
    three_two_one = next(c for c in configs if sorted(s.slice for s in c.slots) == ["1g.5gb", "2g.10gb", "3g.20gb"])
    assert [str(p) for p in three_two_one.layout] == ["1g.5gb@1", "2g.10gb@2", "3g.20gb@4"]
    assert three_two_one.instances_changed == 1
    # The current 250 rps fall short of 350; adding 2g.10gb@2 (one change) is the cheapest way to serve it.
    plan = plan_solve(problem, "joint")
    assert plan.layouts["m0"] == ["1g.5gb@1", "2g.10gb@2", "3g.20gb@4"]
    assert plan.objective == pytest.approx(1 + 0.01)
    assert plan.total_served_rps == pytest.approx(350)


def test_min_gpus_uses_fewer_gpus_than_max_accuracy() -> None:
    raw = _raw(
        [{"name": "a", "slo_ms": 100, "demand_rps": 120}],
        [{"name": "fast", "application": "a", "accuracy": 0.7}, {"name": "slow", "application": "a", "accuracy": 0.9}],
        [dict(WHOLE, name=f"v{i}") for i in range(3)] + [dict(MIG_FREE, name="m0")],
        _flat("fast", V100, FULL_SLICE, 5.0) + _flat("slow", V100, FULL_SLICE, 20.0)
        + _flat("fast", A100, "7g.40gb", 5.0) + _flat("slow", A100, "7g.40gb", 20.0),
    )
    problem = problem_from_dict(raw)
    for solver in ("proteus", "joint"):
        best = plan_solve(problem, solver, objective="max-accuracy")
        fewest = plan_solve(problem, solver, objective="min-gpus")
        assert best.accuracy_by_application["a"] == pytest.approx(0.9)
        assert best.gpus_used >= 3
        assert fewest.gpus_used == 1 and fewest.objective == 1
        assert fewest.objective_kind == "min-gpus"
        # Tie-break: at one GPU (200 rps of fast), the rest of the capacity cannot hold slow, so all fast.
        assert fewest.total_served_rps == pytest.approx(120)


@pytest.mark.parametrize("solver", ["proteus", "joint"])
@pytest.mark.parametrize("objective", ["max-accuracy", "min-gpus"])
def test_cbc_matches_highs(solver: str, objective: str) -> None:
    problem = random_problem(3, [MIG_FREE, MIG_FIXED_B, WHOLE, CPU], apps=3, variants=2, load=0.7, min_accuracy=True)
    highs = plan_solve(problem, solver, objective=objective, backend="highs")
    cbc = plan_solve(problem, solver, objective=objective, backend="cbc")
    assert highs.status == cbc.status == "optimal"
    assert cbc.objective == pytest.approx(highs.objective, abs=1e-6)
    assert accuracy_over_demand(problem, cbc) == pytest.approx(accuracy_over_demand(problem, highs), abs=1e-6)


def test_many_identical_gpus_solve_quickly() -> None:
    """Symmetric fleets collapse into one device class, so 20 identical GPUs are a small model. A sanity
    check, not a timing assertion: the seconds are printed for the record."""
    devices = [{"name": f"g{i:02d}", "type": A100, "mig": True, "layout": ["3g.20gb@0", "3g.20gb@4"]} for i in range(20)]
    problem = random_problem(7, devices, apps=3, variants=3, load=0.6)
    assert len(joint_fleet(problem).device_classes) == 1
    assert len(proteus_fleet(problem).device_classes) == 1
    for solver in ("proteus", "joint"):
        for objective in ("max-accuracy", "min-gpus"):
            started = time.perf_counter()
            plan = plan_solve(problem, solver, objective=objective)
            print(f"{solver} {objective}: {time.perf_counter() - started:.3f} s, {plan.gpus_used} GPUs, objective {plan.objective}")
            assert plan.status == "optimal"
            assert sum(plan.shortfall_rps.values()) == 0
            check_plan_consistent(problem, plan)


def test_candidate_layouts_are_the_38_maximal_count_vectors() -> None:
    spec = mig_catalogue_load().gpu_model_get(A100)
    candidates = candidate_counts(spec)
    assert len(candidates) == 38
    assert all("+me" not in profile for key in candidates for profile, _ in key)


# ----------------------------------------------------------------------------- solver plumbing


def _hard_assignment_problem(seed: int = 3) -> tuple[pulp.LpProblem, dict[tuple[int, int], int]]:
    """A generalised assignment problem too big to close in a second (exercises time-limited solves), and
    its item weights."""
    rnd = random.Random(seed)
    lp = pulp.LpProblem("gap", pulp.LpMaximize)
    x = {(i, j): pulp.LpVariable(f"x_{i}_{j}", cat="Binary") for i in range(150) for j in range(40)}
    weight = {(i, j): rnd.randint(5, 50) for i in range(150) for j in range(40)}
    lp += pulp.lpSum(rnd.randint(1, 100) * var for var in x.values())
    for i in range(150):
        lp += pulp.lpSum(x[i, j] for j in range(40)) <= 1
    for j in range(40):
        lp += pulp.lpSum(weight[i, j] * x[i, j] for i in range(150)) <= 37
    return lp, weight


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_time_limited_solve_reports_bound_and_gap(backend: str) -> None:
    from engine.plans.problem import SolveOptions

    outcome = milp_solve(_hard_assignment_problem()[0], SolveOptions(), time_limit_s=1.0, backend=backend)
    assert outcome.state in ("feasible", "optimal", "no-solution")
    if outcome.state == "feasible":
        assert outcome.bound is not None and outcome.bound >= outcome.objective - 1e-6
        assert outcome.gap == pytest.approx((outcome.bound - outcome.objective) / abs(outcome.objective))


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_small_milp_outcomes(backend: str) -> None:
    from engine.plans.problem import SolveOptions

    lp = pulp.LpProblem("small", pulp.LpMinimize)
    x = pulp.LpVariable("x", 0, 3.5, cat=pulp.LpInteger)
    y = pulp.LpVariable("y", 0)
    lp += x + 2 * y + 1
    lp += x + y >= 3.7
    outcome = milp_solve(lp, SolveOptions(), time_limit_s=5, backend=backend)
    assert outcome.state == "optimal" and outcome.objective == pytest.approx(5.4) and outcome.gap == 0
    assert outcome.bound == pytest.approx(5.4)
    lp += x <= 1
    lp += y <= 1
    assert milp_solve(lp, SolveOptions(), time_limit_s=5, backend=backend).state == "infeasible"


def test_plan_solve_dispatch_and_overrides() -> None:
    problem = _reconfiguration_problem(0.0)
    with pytest.raises(ValueError, match="proteus, joint, garrison"):
        plan_solve(problem, "gurobi")
    with pytest.raises(ValueError, match="max-accuracy"):
        plan_solve(problem, "proteus", objective="fastest")
    with pytest.raises(ValueError, match="highs"):
        plan_solve(problem, "proteus", backend="glpk")
    plan = plan_solve(problem, "proteus", objective="min-gpus", time_limit_s=5, mip_gap=0.0, backend="cbc")
    assert plan.objective_kind == "min-gpus" and plan.objective == 1


def test_plans_pass_the_validator() -> None:
    for fleet in (PROTEUS_FLEETS[2], JOINT_FLEETS[0], JOINT_FLEETS[2]):
        problem = random_problem(2, fleet, apps=2, variants=3, load=0.9, min_accuracy=True)
        for solver in ("proteus", "joint"):
            for objective in ("max-accuracy", "min-gpus"):
                plan = plan_solve(problem, solver, objective=objective)
                verdict = plan_validate(problem, plan)
                assert verdict.valid, f"{solver} {objective}: {verdict}"


def test_falls_back_to_cbc_without_highs(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.solvers import milp

    monkeypatch.setattr(milp, "highs_available", lambda: False)
    plan = plan_solve(_reconfiguration_problem(0.0), "joint", backend="highs")
    assert plan.status == "optimal" and plan.objective == pytest.approx(0.9)
    assert any("solved with CBC" in n for n in plan.notes)


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_mip_start_is_used(backend: str) -> None:
    """Lexicographic stages start from the previous stage's solution: given a good start, a solve cut
    short comes back at least as good as the start (without one, HiGHS finds far less in that time)."""
    from engine.plans.problem import SolveOptions

    lp, _ = _hard_assignment_problem()
    longer = milp_solve(lp, SolveOptions(), time_limit_s=2.0, backend=backend)
    assert longer.has_solution
    start = {v.name: v.value() for v in lp.variables()}
    again, _ = _hard_assignment_problem()
    short = milp_solve(again, SolveOptions(), time_limit_s=0.1, backend=backend, start=start)
    assert short.has_solution
    assert short.objective >= longer.objective - 1e-6


def test_thread_count_may_change_between_solves_in_one_process() -> None:
    """HiGHS keeps one thread scheduler per process; a long-lived worker solving with one thread count and
    then another must get the same plan, not a failure reported as infeasible demand."""
    import dataclasses

    problem = random_problem(3, [MIG_FREE, MIG_FIXED_B, WHOLE, CPU], apps=3, variants=2, load=0.7)
    objectives = []
    for threads in (None, 2, 1, 2):
        plan = plan_solve(dataclasses.replace(problem, options=dataclasses.replace(problem.options, threads=threads)), "proteus")
        assert plan.status == "optimal", plan.notes
        objectives.append(plan.objective)
    assert max(objectives) - min(objectives) < 1e-9


def test_solver_errors_are_raised_not_reported_as_infeasible(monkeypatch: pytest.MonkeyPatch) -> None:
    import highspy

    from engine.solvers import milp

    problem = random_problem(3, [WHOLE, CPU], apps=2, variants=2, load=0.5)
    monkeypatch.setattr(highspy.Highs, "getModelStatus", lambda self: highspy.HighsModelStatus.kSolveError)
    with pytest.raises(milp.SolverFailed, match="Solve error"):
        plan_solve(problem, "proteus")


def _twin_variants_problem(running: dict[str, dict[str, str]] | None = None, better: float = 0.0) -> Problem:
    """Two variants of one application that are equally good on every slot (a tie), or `b` more accurate
    by `better`."""
    devices = [{"name": f"g{i}", "type": "T4", "memory_mb": 16000} for i in range(3)]
    for d in devices:
        if running and d["name"] in running:
            d["running"] = running[d["name"]]
    profiles = [p for v in ("a", "b") for p in _flat(v, "T4", "full", 10.0)]
    return problem_from_dict(_raw(
        [{"name": "app", "slo_ms": 100, "demand_rps": 1500}],
        [{"name": "a", "application": "app", "accuracy": 0.7, "memory_mb": 100},
         {"name": "b", "application": "app", "accuracy": 0.7 + better, "memory_mb": 100}],
        devices, profiles,
    ))


@pytest.mark.parametrize("solver", ["proteus", "joint"])
def test_replanning_keeps_what_runs_when_it_costs_nothing(solver: str) -> None:
    running = {"g0": {"full": "b"}, "g1": {"full": "a"}, "g2": {"full": "b"}}
    plan = plan_solve(_twin_variants_problem(running), solver)
    assert plan.status == "optimal"
    assert {(i.device, i.variant) for i in plan.instances} <= {("g0", "b"), ("g1", "a"), ("g2", "b")}
    # A marginal gain does not pay for a reload (variant_change_penalty 1e-4 of effective accuracy: here
    # 1e-4 more accuracy on a third of the traffic)...
    marginal = plan_solve(_twin_variants_problem(running, better=1e-4), solver)
    assert ("g1", "a") in {(i.device, i.variant) for i in marginal.instances}
    # ...a real one does.
    better = plan_solve(_twin_variants_problem(running, better=0.01), solver)
    assert {i.variant for i in better.instances} == {"b"}


def test_running_must_name_a_slot_and_variant_of_the_problem() -> None:
    from engine.plans.problem import ProblemError, problem_to_dict

    ok = _twin_variants_problem({"g0": {"full": "a"}})
    assert problem_from_dict(problem_to_dict(ok)) == ok
    with pytest.raises(ProblemError, match="slot '3g.20gb@0' is not on this device"):
        _twin_variants_problem({"g0": {"3g.20gb@0": "a"}})
    with pytest.raises(ProblemError, match="unknown variant 'zz'"):
        _twin_variants_problem({"g0": {"full": "zz"}})


def _start_check(problem: Problem, solver: str = "proteus") -> tuple[dict[str, float] | None, list[str]]:
    """The running start for the full-demand stage, and the model's rows it violates (the variant-change
    rows aside: HiGHS completes those variables itself)."""
    from engine.solvers.model import fleet_model_build, running_start

    fleet = proteus_fleet(problem) if solver == "proteus" else joint_fleet(problem)
    model = fleet_model_build(fleet, full_demand=True, name="start_check")
    start = running_start(fleet, model)
    if start is None:
        return None, []
    assert set(start) >= {v.name for v in model.instances.values()} | {v.name for v in model.loads.values()}
    for var in model.lp.variables():
        var.varValue = start.get(var.name, 0.0)
    bad = [name for name, row in model.lp.constraints.items() if not name.startswith("lost_") and not row.valid(1e-6)]
    return start, bad


@pytest.mark.parametrize("seed, growth", [(1, 0.8), (1, 0.9), (1, 1.0), (0, 1.1), (2, 1.1)])
def test_replanning_starts_from_what_runs(seed: int, growth: float) -> None:
    """Re-planning hands the solver the current plan, repaired for the new demand (freed instances, new
    slots, swaps to variants that serve more: every device runs something, the spare ones included), as a
    MIP start that satisfies every row of the model."""
    import dataclasses

    from engine.plans.problem import SolveOptions, device_slot_id
    from engine.reference.generate import proteus_sized_problem

    problem = proteus_sized_problem(12, 3, 12, 3, seed=seed, options=SolveOptions(time_limit_s=20))
    assert _start_check(problem) == (None, [])  # nothing runs: no start
    plan = plan_solve(problem, "proteus")
    devices = {d.name: d for d in problem.devices}
    running: dict[str, list[tuple[str, str]]] = {}
    for i in plan.instances:
        running.setdefault(i.device, []).append((device_slot_id(i.slice, i.start, is_cpu=devices[i.device].is_cpu), i.variant))
    replan = dataclasses.replace(
        problem,
        devices=tuple(dataclasses.replace(d, running=tuple(sorted(running.get(d.name, ())))) for d in problem.devices),
        applications=tuple(dataclasses.replace(a, demand_rps=a.demand_rps * growth) for a in problem.applications),
    )
    assert all(running.get(d.name) for d in problem.devices)  # no free slot: growth needs released or swapped ones
    start, violated = _start_check(replan)
    assert start is not None and violated == []
    again = plan_solve(replan, "proteus")
    assert again.status == "optimal"
    verdict = plan_validate(replan, again)
    assert verdict.valid, str(verdict)


@pytest.mark.parametrize("seed", range(4))
def test_one_partial_instance_row_loses_nothing(seed: int) -> None:
    """Each application may leave at most one instance's worth of capacity idle
    (model._constrain_one_partial_instance). The row must cut no optimum: the same model solved without it
    reaches the same accuracy."""
    from engine.plans.problem import SolveOptions
    from engine.solvers.model import fleet_model_build

    problem = random_problem(seed, [WHOLE, CPU, MIG_FIXED_B], apps=3, variants=3, load=0.5)
    values = []
    for keep_row in (True, False):
        model = fleet_model_build(proteus_fleet(problem), full_demand=True, name="one_partial")
        assert any(name.startswith("one_partial_") for name in model.lp.constraints)
        if not keep_row:
            for name in [n for n in model.lp.constraints if n.startswith("one_partial_")]:
                del model.lp.constraints[name]
        model.lp.setObjective(model.accuracy_over_demand)
        outcome = milp_solve(model.lp, SolveOptions(mip_gap=0.0), time_limit_s=20)
        assert outcome.state == "optimal"
        values.append(outcome.objective)
    assert values[0] == pytest.approx(values[1], abs=1e-7)
