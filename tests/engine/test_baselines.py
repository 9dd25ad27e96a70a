"""The allocation baselines (clipper-ha, clipper-ht, sommelier, infaas) and the Proteus ablations: every
plan passes the independent validator, the baselines order the way their definitions say they must
(Clipper-HA most accurate at light load, Clipper-HT most throughput under overload, Proteus at least as
good as any of them), Sommelier keeps its placement, INFaaS keeps min_accuracy, and outputs are
deterministic."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

from engine.plans.problem import Plan, Problem, problem_from_dict
from engine.plans.validate import plan_validate
from engine.reference.generate import mig_fleet_problem, proteus_sized_problem
from engine.solvers.baselines import fixed_slots, infaas_solve, proteus_ablation_solve, sommelier_solve
from engine.solvers.registry import planner_names
from engine.solvers.solve import plan_solve

from .test_problem_format import small_problem_dict

BASELINES = planner_names("baseline")

ACC_TOL = 1e-7  # effective accuracy: the MILP's optimum is exact only to solver tolerance
RPS_TOL = 1e-6
MIG_LAYOUT = ["3g.20gb@0", "2g.10gb@4", "1g.5gb@6"]


# ----------------------------------------------------------------------------- problems


def with_load(problem: Problem, factor: float) -> Problem:
    """The same fleet and models with every application's demand scaled by `factor`."""
    apps = tuple(dataclasses.replace(a, demand_rps=round(a.demand_rps * factor, 3)) for a in problem.applications)
    return dataclasses.replace(problem, applications=apps)


# Twin applications: three applications whose variants have identical profiles (fast, mid, big), so a
# slot serves as many queries per second whichever application it runs. Only then is "the fastest variant
# on every slot" a bound on any plan's throughput (see test_clipper_ht_serves_the_most_under_heavy_load).
_TWIN_VARIANTS = {"fast": (0.70, 1000.0, 2.0, 0.5), "mid": (0.75, 3000.0, 4.0, 1.0), "big": (0.80, 11000.0, 8.0, 2.0)}
_TWIN_SLICES = {("A100-SXM4-40GB", "1g.5gb"): 4.0, ("A100-SXM4-40GB", "2g.10gb"): 2.2, ("A100-SXM4-40GB", "3g.20gb"): 1.6,
                ("T4", "full"): 2.0, ("cpu", "16"): 8.0}


def twin_problem(load: float) -> Problem:
    """Fleet: two A100s with the fixed layout 2g+1g+1g+3g, two whole T4s, a CPU host. `big` (0.80) does
    not fit the 1g and 2g slices. Demand: `load` x what the fleet serves with `fast` everywhere, split
    1 : 2 : 3 over the applications."""
    apps = ["a", "b", "c"]
    variants, profiles = [], []
    for app in apps:
        for kind, (accuracy, memory, base, per) in _TWIN_VARIANTS.items():
            name = f"{app}.{kind}"
            variants.append({"name": name, "application": app, "accuracy": accuracy, "memory_mb": memory})
            for (dtype, slice_name), factor in _TWIN_SLICES.items():
                for b in (1, 2, 4, 8, 16, 32):
                    point: dict[str, Any] = {"variant": name, "device_type": dtype, "slice": slice_name, "batch": b,
                                             "latency_ms": round((base + per * b) * factor, 4)}
                    if dtype != "cpu":
                        point["memory_mb"] = memory + 20.0 * b
                    profiles.append(point)
    layout = ["2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]
    raw: dict[str, Any] = {
        "applications": [{"name": a, "slo_ms": 100.0, "demand_rps": 1.0} for a in apps],
        "variants": variants,
        "devices": [
            *({"name": f"a100-{i}", "type": "A100-SXM4-40GB", "mig": True, "layout": layout, "fixed_layout": True} for i in range(2)),
            *({"name": f"t4-{i}", "type": "T4", "memory_mb": 15360} for i in range(2)),
            {"name": "cpu-0", "type": "cpu", "cores": 16},
        ],
        "profiles": profiles,
    }
    probe = problem_from_dict(raw)
    reach = sum(s.rate(probe, "a.fast") for s in fixed_slots(probe))
    for weight, app in zip((1, 2, 3), raw["applications"]):
        app["demand_rps"] = round(load * reach * weight / 6, 3)
    return problem_from_dict(raw)


@functools.lru_cache(maxsize=None)
def problem_named(name: str) -> Problem:
    kind, load = name.rsplit("@", 1)
    if kind == "twin":
        return twin_problem(float(load))
    if kind == "small":
        return with_load(problem_from_dict(small_problem_dict()), float(load))
    if kind == "mixed":  # whole GPUs of three types and CPU hosts
        return proteus_sized_problem(8, 4, 12, 3, seed=1, load=float(load))
    if kind == "mig":  # A100s with a current MIG layout, kept as fixed instances
        return mig_fleet_problem(3, n_applications=3, seed=2, load=float(load), current_layout=MIG_LAYOUT)
    raise KeyError(name)


LIGHT = ["small@1", "mixed@0.3", "mixed-b@0.1", "mig@0.1", "twin@0.05"]
ALL = ["small@1", "small@4", "mixed@0.3", "mixed@1.0", "mixed@2.5", "mig@0.3", "mig@1.0", "mig@2.5", "twin@0.05", "twin@0.2", "twin@1.0", "twin@3.0"]
HEAVY = ["small@6", "mixed@2.5", "mig@2.5", "twin@1.5", "twin@3.0"]


def problem(name: str) -> Problem:
    if name.startswith("mixed-b@"):  # another draw: two types, more variants per application
        return proteus_sized_problem(6, 2, 12, 2, seed=5, load=float(name.split("@")[1]))
    return problem_named(name)


@functools.lru_cache(maxsize=None)
def solved(name: str, solver: str) -> Plan:
    return plan_solve(problem(name), solver)


def valid(prob: Problem, plan: Plan) -> None:
    verdict = plan_validate(prob, plan)
    assert verdict.valid, f"{plan.solver}: {verdict}"


def full(prob: Problem, plan: Plan) -> bool:
    return all(plan.shortfall_rps.get(a.name, 0.0) <= RPS_TOL * max(1.0, a.demand_rps) for a in prob.applications)


def comparable(plan: Plan) -> dict[str, Any]:
    data = plan.to_dict()
    data.pop("solve_seconds")
    return data


# ----------------------------------------------------------------------------- validity


@pytest.mark.parametrize("name", ALL + ["mixed-b@0.1", "mixed-b@0.2"])
@pytest.mark.parametrize("solver", BASELINES)
def test_every_baseline_plan_passes_the_validator(name: str, solver: str) -> None:
    prob = problem(name)
    plan = solved(name, solver)
    valid(prob, plan)
    assert plan.solver == solver
    assert plan.status == "feasible" and plan.bound is None and plan.gap is None
    assert plan.total_served_rps > 0
    slots = {s.id for s in fixed_slots(prob)}
    for inst in plan.instances:  # the fixed fleet: whole GPUs, kept MIG layouts, one instance per CPU
        where = inst.device if prob.device(inst.device).is_cpu else inst.id
        assert where in slots


@pytest.mark.parametrize("name", ["small@1", "mixed@1.0", "mig@1.0"])
@pytest.mark.parametrize("flags", [(True, False), (False, True), (True, True)])
def test_every_ablation_plan_passes_the_validator(name: str, flags: tuple[bool, bool]) -> None:
    prob = problem(name)
    no_ms, no_mp = flags
    plan = proteus_ablation_solve(prob, no_model_selection=no_ms, no_placement=no_mp)
    valid(prob, plan)
    assert plan.total_served_rps > 0


def test_a_problem_nothing_can_serve_is_reported_infeasible() -> None:
    raw = small_problem_dict()
    for app in raw["applications"]:
        app["min_accuracy"] = 0.99  # no variant is that accurate
    prob = problem_from_dict(raw)
    for solver in BASELINES:
        plan = plan_solve(prob, solver)
        valid(prob, plan)
        assert plan.status == "infeasible" and plan.total_served_rps == 0
        assert plan.shortfall_rps == {a.name: a.demand_rps for a in prob.applications}
        assert plan.notes


# ----------------------------------------------------------------------------- how they compare


@pytest.mark.parametrize("name", LIGHT)
def test_clipper_ha_is_the_most_accurate_baseline_at_light_load(name: str) -> None:
    prob = problem(name)
    plans = {s: solved(name, s) for s in BASELINES}
    for solver, plan in plans.items():
        assert full(prob, plan), f"{solver} should serve all of the light demand: {plan.shortfall_rps}"
    ha = plans["clipper-ha"].effective_accuracy
    for solver, plan in plans.items():
        assert ha >= plan.effective_accuracy - ACC_TOL, solver
    # Clipper-HT never scales up: it is the least accurate (ties allowed).
    ht = plans["clipper-ht"].effective_accuracy
    assert all(ht <= p.effective_accuracy + ACC_TOL for p in plans.values())


@pytest.mark.parametrize("load", [1.5, 3.0])
def test_clipper_ht_serves_the_most_under_heavy_load(load: float) -> None:
    """With twin applications a slot serves the same whichever application runs on it, and `fast` is the
    fastest variant on every slot; under overload Clipper-HT runs it on every slot, which bounds what any
    plan can serve. Proteus, maximising served traffic first, reaches that bound too."""
    name = f"twin@{load}"
    prob = problem(name)
    plans = {s: solved(name, s) for s in BASELINES}
    ht = plans["clipper-ht"]
    assert all(ht.shortfall_rps[a.name] > 0 for a in prob.applications)  # heavy indeed
    assert len(ht.instances) == len(fixed_slots(prob))
    for solver, plan in plans.items():
        assert ht.total_served_rps >= plan.total_served_rps - RPS_TOL, f"{solver} serves {plan.total_served_rps} > clipper-ht {ht.total_served_rps}"
    assert solved(name, "proteus").total_served_rps == pytest.approx(ht.total_served_rps, rel=1e-7)


@pytest.mark.parametrize("name", HEAVY)
def test_heavy_load_orderings_that_hold_on_any_fleet(name: str) -> None:
    """Clipper-HT serves at least as much as Clipper-HA, and Sommelier (Clipper-HA's placement, swapping
    only to variants with more capacity) at least as much as Clipper-HA."""
    plans = {s: solved(name, s) for s in BASELINES}
    assert not full(problem(name), plans["clipper-ha"])
    assert plans["clipper-ht"].total_served_rps >= plans["clipper-ha"].total_served_rps - RPS_TOL
    assert plans["sommelier"].total_served_rps >= plans["clipper-ha"].total_served_rps - RPS_TOL


def test_with_unlike_applications_infaas_can_outserve_clipper_ht_by_starving_one() -> None:
    """Counted in queries per second, Clipper-HT is not an upper bound when applications differ: INFaaS
    gives the largest application every slot first, and classify serves many more queries per slot than
    detect, so it serves more in total while leaving detect unserved (its local optimum)."""
    prob = problem("small@6")
    ht, infaas = solved("small@6", "clipper-ht"), solved("small@6", "infaas")
    assert infaas.total_served_rps > ht.total_served_rps
    assert infaas.served_rps["detect"] == 0 < ht.served_rps["detect"]
    assert ht.served_rps["detect"] / prob.application("detect").demand_rps > 0.5


@pytest.mark.parametrize("name", ALL + ["mixed-b@0.1", "mixed-b@0.2", "mig@0.1"])
def test_proteus_serves_at_least_as_much_and_as_accurately_as_every_baseline(name: str) -> None:
    """Under overload proteus first raises the smallest served fraction (fair shares), then the traffic
    served: a baseline may serve more in total only by serving some application a smaller fraction."""
    prob = problem(name)
    proteus = solved(name, "proteus")
    valid(prob, proteus)

    def smallest_fraction(plan) -> float:
        return min(plan.served_rps[a.name] / a.demand_rps for a in prob.applications if a.demand_rps > 0)

    for solver in BASELINES:
        plan = solved(name, solver)
        if smallest_fraction(plan) < smallest_fraction(proteus) - 1e-6:
            continue  # proteus is fairer; it may serve less in total for it
        assert proteus.total_served_rps >= plan.total_served_rps - RPS_TOL * max(1.0, prob.total_demand_rps), solver
        if full(prob, plan):
            assert full(prob, proteus)
            assert proteus.effective_accuracy >= plan.effective_accuracy - ACC_TOL, solver


@pytest.mark.parametrize("name", ["small@1", "mixed@1.0", "mig@1.0"])
def test_proteus_beats_its_ablations(name: str) -> None:
    prob = problem(name)
    proteus = solved(name, "proteus")
    for no_ms, no_mp in [(True, False), (False, True), (True, True)]:
        plan = proteus_ablation_solve(prob, no_model_selection=no_ms, no_placement=no_mp)
        assert proteus.total_served_rps >= plan.total_served_rps - RPS_TOL * max(1.0, prob.total_demand_rps)
        if full(prob, plan):
            assert proteus.effective_accuracy >= plan.effective_accuracy - ACC_TOL


# ----------------------------------------------------------------------------- each baseline's rule


@pytest.mark.parametrize("name", ["mixed@1.0", "mig@1.0", "small@4"])
def test_clipper_runs_one_variant_per_application(name: str) -> None:
    prob = problem(name)
    ha, ht = solved(name, "clipper-ha"), solved(name, "clipper-ht")
    for plan, pick in ((ha, max), (ht, None)):
        by_app: dict[str, set[str]] = {}
        for inst in plan.instances:
            by_app.setdefault(prob.variant(inst.variant).application, set()).add(inst.variant)
        assert all(len(v) == 1 for v in by_app.values()), by_app
        if pick is max:  # HA: the most accurate variant that runs anywhere on the fleet
            slots = fixed_slots(prob)
            for app, (variant,) in by_app.items():
                runnable = [v for v in prob.variants_of(app) if any(s.rate(prob, v.name) > 0 for s in slots)]
                assert prob.variant(variant).accuracy == max(v.accuracy for v in runnable)
    # Traffic is split in proportion to capacity.
    for inst in ha.instances:
        app = prob.variant(inst.variant).application
        total = sum(i.capacity_rps for i in ha.instances if prob.variant(i.variant).application == app)
        assert inst.assigned_rps == pytest.approx(ha.served_rps[app] * inst.capacity_rps / total, rel=1e-9)


def test_sommelier_keeps_the_current_placement_and_swaps_in_place() -> None:
    light = problem("mixed@0.3")
    current = solved("mixed@0.3", "proteus")
    for factor in (1.0, 4.0, 0.2):
        prob = with_load(light, factor)
        plan = sommelier_solve(prob, current)
        valid(prob, plan)
        before = {(i.device, i.slice, i.start): prob.variant(i.variant).application for i in current.instances}
        after = {(i.device, i.slice, i.start): prob.variant(i.variant).application for i in plan.instances}
        assert after == before  # every instance kept where it was, running the same application
        # Swaps only ever help: each application serves at least what the current variants could.
        for app in prob.applications:
            had = sum(i.capacity_rps for i in current.instances if prob.variant(i.variant).application == app.name)
            assert plan.served_rps[app.name] >= min(app.demand_rps, had) - RPS_TOL
    heavy = sommelier_solve(with_load(light, 4.0), current)
    assert heavy.effective_accuracy < sommelier_solve(light, current).effective_accuracy  # it scaled accuracy down


def test_sommelier_without_a_plan_starts_from_clipper_ha() -> None:
    name = "mig@2.5"
    ha, som = solved(name, "clipper-ha"), solved(name, "sommelier")
    assert {i.id for i in som.instances} == {i.id for i in ha.instances}
    assert som.total_served_rps > ha.total_served_rps  # it swapped to faster variants to meet demand


def test_sommelier_drops_instances_the_fleet_does_not_have() -> None:
    prob = problem("small@1")
    current = solved("small@1", "clipper-ha")
    stranger = dataclasses.replace(current.instances[0], device="no-such-gpu")
    moved = Plan(**{**current.__dict__, "instances": [stranger] + list(current.instances[1:])})
    plan = sommelier_solve(prob, moved)
    valid(prob, plan)
    assert {i.id for i in plan.instances} == {i.id for i in current.instances[1:]}
    assert any("no-such-gpu" in n for n in plan.notes)


@pytest.mark.parametrize("name", ["small@1", "small@6", "mixed@0.3", "mixed@2.5", "mig@1.0"])
def test_infaas_respects_min_accuracy(name: str) -> None:
    base = problem(name)
    apps = []
    for app in base.applications:
        accs = sorted(v.accuracy for v in base.variants_of(app.name))
        apps.append(dataclasses.replace(app, min_accuracy=round((accs[0] + accs[-1]) / 2, 4)))
    prob = dataclasses.replace(base, applications=tuple(apps))
    plan = infaas_solve(prob)
    valid(prob, plan)
    assert plan.instances
    for inst in plan.instances:
        variant = prob.variant(inst.variant)
        assert variant.accuracy >= prob.application(variant.application).min_accuracy
    for app, accuracy in plan.accuracy_by_application.items():
        assert accuracy >= prob.application(app).min_accuracy


def test_infaas_picks_the_cheapest_variant_meeting_the_floor() -> None:
    prob = problem("small@1")  # classify: min_accuracy 0.72 rules out resnet18; detect has no floor
    plan = solved("small@1", "infaas")
    assert full(prob, plan)
    variants = {prob.variant(i.variant).application: i.variant for i in plan.instances}
    assert variants == {"classify": "resnet50", "detect": "yolo_l"}
    # classify (the larger demand) went first and took the fastest slot for resnet50: one slot covers it.
    assert sum(1 for i in plan.instances if i.variant == "resnet50") == 1
    no_floor = dataclasses.replace(prob, applications=tuple(dataclasses.replace(a, min_accuracy=None) for a in prob.applications))
    assert {i.variant for i in infaas_solve(no_floor).instances} == {"resnet50", "yolo_l"}  # floor: the most accurate


# ----------------------------------------------------------------------------- ablations


def test_ablation_without_model_selection_runs_only_the_most_accurate_variants() -> None:
    prob = problem("mixed@1.0")
    plan = proteus_ablation_solve(prob, no_model_selection=True)
    assert plan.solver == "proteus-no-ms"
    slots = fixed_slots(prob)
    for inst in plan.instances:
        app = prob.variant(inst.variant).application
        runnable = [v for v in prob.variants_of(app) if any(s.rate(prob, v.name) > 0 for s in slots)]
        assert prob.variant(inst.variant).accuracy == max(v.accuracy for v in runnable)


def test_ablation_without_placement_keeps_each_slot_on_its_application() -> None:
    light = problem("mig@0.3")
    current = solved("mig@0.3", "proteus")
    prob = with_load(light, 3.0)
    plan = proteus_ablation_solve(prob, no_placement=True, current=current)
    valid(prob, plan)
    assert plan.solver == "proteus-no-mp"
    pinned = {(i.device, i.slice, i.start): prob.variant(i.variant).application for i in current.instances}
    for inst in plan.instances:
        assert pinned[(inst.device, inst.slice, inst.start)] == prob.variant(inst.variant).application
    # Variants may change in place (accuracy scaling); with model selection off too they may not.
    both = proteus_ablation_solve(prob, no_placement=True, no_model_selection=True, current=current)
    valid(prob, both)
    assert plan.total_served_rps >= both.total_served_rps - RPS_TOL * prob.total_demand_rps
    # Round-robin placement when no plan is given.
    dealt = proteus_ablation_solve(prob, no_placement=True)
    valid(prob, dealt)
    assert any("round-robin" in n for n in dealt.notes)


# ----------------------------------------------------------------------------- determinism, dispatch


@pytest.mark.parametrize("solver", BASELINES)
def test_baselines_are_deterministic(solver: str) -> None:
    for name in ("mixed@1.0", "mig@2.5", "small@4"):
        prob = problem(name)
        first, second = plan_solve(prob, solver), plan_solve(prob, solver)
        assert comparable(first) == comparable(second)
        # The device listing order does not matter either.
        shuffled = dataclasses.replace(prob, devices=tuple(reversed(prob.devices)))
        again = comparable(plan_solve(shuffled, solver))
        assert again["instances"] == comparable(first)["instances"]


def test_plan_solve_knows_the_baselines() -> None:
    prob = problem("small@1")
    for solver in BASELINES:
        assert plan_solve(prob, solver, objective="min-gpus").objective_kind == "min-gpus"
    with pytest.raises(ValueError, match="clipper-ha"):
        plan_solve(prob, "clipper")
