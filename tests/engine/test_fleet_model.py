"""The fleet model (engine/solvers/fleet.py, issue 40): MIG geometry, whole GPUs, CPU hosts and MPS GPUs
(splits with one model per partition at the worst co-runner's interference, and gpulets' and SBP's
time-shared schedules as patterns) in one MILP, with a bound and gap for the whole fleet. Its plans pass
the independent validator, and on the same problems they are never worse than the compositions of the
seeds' planners (gpulets on the MPS GPUs, proteus or joint on the rest) in the objective's own order."""
from __future__ import annotations

import dataclasses
import math

import pytest

from engine.plans.problem import SolveOptions, problem_from_dict
from engine.plans.validate import plan_validate
from engine.reference.generate import mig_fleet_problem, mixed_fleet_problem, proteus_sized_problem
from engine.reference.gpulet_problem import gpulet_mps_problem_dict
from engine.sharing.partitions import mps_slice_percent
from engine.solvers.fleet import fleet_model_fleet
from engine.solvers.gpulets import interference_predictor_for
from engine.solvers.assemble import plan_objective
from engine.solvers.registry import planner_get
from engine.solvers.solve import plan_solve

from .test_mixed_fleet import mixed_problem_dict

GAP = 1e-3


def _idle(problem, **changes):
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options, spare_capacity="idle", mip_gap=GAP, **changes))


def _fair_share(problem, plan) -> float:
    return min(plan.served_rps.get(a.name, 0.0) / a.demand_rps for a in problem.applications if a.demand_rps > 0)


def _not_worse(problem, fleet, other) -> bool:
    """Fair share, then served, then the objective, each within the gap."""
    pairs = [(_fair_share(problem, fleet), _fair_share(problem, other)),
             (fleet.total_served_rps, other.total_served_rps), (fleet.objective, other.objective)]
    for f, o in pairs:
        if f > o + GAP * abs(o):
            return True
        if f < o - GAP * abs(o):
            return False
    return True


def test_the_fleet_model_plans_mps_and_other_gpus_in_one_milp_with_a_bound() -> None:
    problem = problem_from_dict(mixed_problem_dict())
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan.solver == "fleet" and plan.status == "optimal"
    assert plan.bound is not None and plan.gap is not None and plan.gap <= 1e-6
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    kinds = {problem.device(i.device).mps for i in plan.instances}
    assert kinds == {True, False}  # one 2080 Ti cannot serve 7,000 req/s: both kinds serve
    for app in problem.applications:
        assert math.isclose(plan.served_rps[app.name], app.demand_rps, rel_tol=1e-6)
    assert not any("mixed fleet" in n for n in plan.notes)  # no two-stage composition
    assert any("bound and gap are over the configurations offered" in n for n in plan.notes)


def test_the_registry_says_the_fleet_model_plans_mps_itself() -> None:
    info = planner_get("fleet")
    assert info.kind == "fleet" and info.plans_mps and info.as_dict()["plans_mps"] is True
    assert not planner_get("proteus").plans_mps


@pytest.mark.parametrize("seed, load", [(0, 0.5), (0, 0.9), (1, 0.9), (1, 1.3)])
def test_never_worse_than_the_compositions_of_the_seeds_planners(seed: int, load: float) -> None:
    problem = _idle(mixed_fleet_problem(2, 2, 1, 1, n_applications=3, seed=seed, load=load))
    fleet = plan_solve(problem, "fleet", time_limit_s=30)
    assert plan_validate(problem, fleet).valid
    assert fleet.gap is not None and fleet.gap <= 0.005
    for solver in ("proteus", "joint"):
        composed = plan_solve(problem, solver, time_limit_s=30)
        assert composed.solver.startswith("gpulets+") and plan_validate(problem, composed).valid
        assert _not_worse(problem, fleet, composed), (solver, _fair_share(problem, fleet), _fair_share(problem, composed),
                                                      fleet.total_served_rps, composed.total_served_rps, fleet.objective, composed.objective)


def test_at_light_load_it_uses_no_more_gpus_than_the_composition() -> None:
    """Equal accuracy, fewer GPUs (the tie-break): one 2080 Ti serves it all, the big GPU stays idle."""
    problem = _idle(problem_from_dict(mixed_problem_dict({"resnet50": 50.0, "mobilenet": 80.0}, mps_gpus=3, big_gpus=1)))
    fleet = plan_solve(problem, "fleet")
    composed = plan_solve(problem, "proteus")
    assert plan_validate(problem, fleet).valid
    assert fleet.gpus_used <= composed.gpus_used == 1
    assert fleet.effective_accuracy == pytest.approx(composed.effective_accuracy)


def test_on_mps_gpus_alone_it_serves_at_least_what_gpulets_serves() -> None:
    problem = _idle(problem_from_dict(gpulet_mps_problem_dict({"resnet50": 6000.0, "mobilenet": 6000.0, "vgg16": 800.0}, gpus=4)))
    fleet = plan_solve(problem, "fleet", time_limit_s=20)
    gpulets = plan_solve(problem, "gpulets")
    assert plan_validate(problem, fleet).valid and plan_validate(problem, gpulets).valid
    assert _not_worse(problem, fleet, gpulets)


def test_a_split_partition_carries_the_factor_of_the_model_beside_it() -> None:
    """Admitted at the worst co-runner's factor, re-derived against the one the plan puts beside it: the
    factor written is the oracle's for that pair at their batches, the latency the profile's times it."""
    raw = gpulet_mps_problem_dict({"resnet50": 900.0, "mobilenet": 1500.0, "densenet121": 300.0}, gpus=2)
    problem = _idle(problem_from_dict(raw))
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan_validate(problem, plan).valid
    oracle = interference_predictor_for(problem, "RTX-2080Ti", {v.name for v in problem.variants}, [])
    split = [i for i in plan.instances if i.duty_cycle_ms is None and mps_slice_percent(i.slice) < 100]
    for inst in split:
        beside = [o for o in plan.instances if o.device == inst.device and o.start != inst.start]
        expected = max([1.0] + [oracle.factor(inst.variant, inst.batch, mps_slice_percent(inst.slice), o.variant, o.batch,
                                              mps_slice_percent(o.slice)) for o in beside])
        assert inst.interference_factor == pytest.approx(expected) or inst.interference_factor >= expected
        assert inst.capacity_rps == pytest.approx(inst.batch * 1000.0 / inst.latency_ms)


def test_a_fixed_mps_layout_is_kept() -> None:
    raw = gpulet_mps_problem_dict({"resnet50": 1200.0, "mobilenet": 1500.0}, gpus=2)
    raw["devices"][0].update(mps_layout=[60, 40], fixed_layout=True)
    problem = _idle(problem_from_dict(raw))
    fleet = fleet_model_fleet(problem)
    fixed = next(g for g in fleet.device_classes if g.devices[0].name == "gpu0")
    assert [c.name for c in fixed.configs] == ["fixed", "unused"]
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan_validate(problem, plan).valid
    if any(i.device == "gpu0" for i in plan.instances):
        assert plan.layouts["gpu0"] == ["mps60@0", "mps40@1"]


def test_without_an_interference_model_partitions_are_planned_alone_and_the_plan_says_so() -> None:
    raw = gpulet_mps_problem_dict({"resnet50": 2500.0, "mobilenet": 2500.0}, gpus=2, interference=False)
    problem = _idle(problem_from_dict(raw))
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan_validate(problem, plan).valid
    assert all(i.interference_factor == 1.0 for i in plan.instances)
    assert any("no interference model" in n for n in plan.notes)


def test_ensembles_and_pipelines_are_planned_in_the_one_model_with_a_bound() -> None:
    """The pipeline is in the model (FA2's plans at fractions of its demand as options), so the plan is the
    model's own, with a bound and gap for the whole fleet, and the pipeline's summary is the validator's."""
    problem = _idle(mixed_fleet_problem(2, 2, 1, 2, n_applications=3, seed=0, load=0.6, ensembles=1, pipelines=1))
    plan = plan_solve(problem, "fleet", time_limit_s=30)
    assert plan.solver == "fleet" and plan.bound is not None and plan.gap is not None
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert plan.pipelines and any(problem.device(i.device).mps for i in plan.instances)
    (summary,) = plan.pipelines.values()
    stages = set(summary["stages"])
    # Every stage carries the same share of its rate, the one the summary states.
    shares = {plan.served_rps[app] / problem.application(app).demand_rps for app in stages}
    assert max(shares) - min(shares) < 1e-9 and min(shares) == pytest.approx(summary["served_fraction"])


def test_the_mixed_generator_is_deterministic_and_has_every_kind() -> None:
    a = mixed_fleet_problem(2, 2, 1, 1, n_applications=3, seed=4, ensembles=1, pipelines=1)
    b = mixed_fleet_problem(2, 2, 1, 1, n_applications=3, seed=4, ensembles=1, pipelines=1)
    assert a == b
    assert {d.partitioning for d in a.devices} == {"mig", "mps", "none"} and any(d.is_cpu for d in a.devices)
    assert a.interference is not None and a.pipelines and any(app.ensemble for app in a.applications)
    with pytest.raises(ValueError, match="device counts"):
        mixed_fleet_problem(0, 0, 0, 0)


def test_a_fleet_plan_on_mps_gpus_keeps_its_slos_in_simulation_with_the_problems_model() -> None:
    """The split partitions' factors and the time-shared patterns hold up in the fleet simulator, whose MPS
    GPUs slow co-running partitions by the problem's interference model."""
    from engine.reference.gpulet_problem import gpulet_mps_problem
    from engine.simulation.simulator import simulate

    from .test_simulator_mps import CONFIG, _trace

    rates = {"resnet50": 300.0, "vgg19": 150.0, "densenet121": 200.0, "mobilenet": 300.0}
    problem = gpulet_mps_problem(rates)
    plan = plan_solve(gpulet_mps_problem({m: 1.1 * r for m, r in rates.items()}), "fleet", time_limit_s=20)
    assert plan.solver == "fleet" and not any(plan.shortfall_rps.values())
    config = dataclasses.replace(CONFIG, noise_sigma=0.05, record_batches=False)
    result = simulate(problem, _trace(rates, 10.0), planner=lambda p: plan, config=config)
    assert result.summary["interference"] == "problem model"
    assert result.summary["slo_violation_ratio"] < 0.01


def test_on_more_mps_gpus_than_the_pattern_sample_the_plan_still_validates_and_beats_gpulets() -> None:
    """Past PATTERN_GPUS MPS GPUs the time-shared patterns are scheduled on a sample at its share of the demand."""
    from engine.solvers.fleet import PATTERN_GPUS

    gpus = PATTERN_GPUS + 2
    rates = {"resnet50": 1500.0 * gpus, "mobilenet": 1500.0 * gpus, "vgg16": 100.0 * gpus}
    problem = _idle(problem_from_dict(gpulet_mps_problem_dict(rates, gpus=gpus)))
    plan = plan_solve(problem, "fleet", time_limit_s=30)
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert any("time-shared pattern(s)" in n for n in plan.notes)
    assert _not_worse(problem, plan, plan_solve(problem, "gpulets"))


def test_a_replan_of_mps_splits_starts_from_what_runs_and_keeps_it() -> None:
    """Issue 40, item 3: a running MPS split (one model per partition) is one of the model's configurations,
    so a re-plan gets a MIP start from it, and the variant-change penalty counts its instances: at the same
    demand the split and its models stay where they are."""
    from engine.solvers.model import _running_counts, fleet_model_build, running_start

    running = [{"mps_layout": [60, 40], "running": {"mps60@0": "resnet50", "mps40@1": "mobilenet"}},
               {"mps_layout": [100], "running": {"mps100@0": "resnet50"}}]
    raw = gpulet_mps_problem_dict({"resnet50": 600.0, "mobilenet": 500.0}, gpus=2, running=running)
    raw["options"] = {"spare_capacity": "idle", "mip_gap": GAP}
    problem = problem_from_dict(raw)
    fleet = fleet_model_fleet(problem)
    counts = _running_counts(fleet)
    assert len(counts) == 3 and all(key in fleet.slot_classes for key, _ in counts)  # every running instance has its slot class
    start = running_start(fleet, fleet_model_build(fleet, full_demand=True, name="start"))
    assert start is not None  # both GPUs matched their configuration
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan.status == "optimal" and plan_validate(problem, plan).valid
    kept = {(i.device, f"{i.slice}@{i.start}", i.variant) for i in plan.instances}
    assert {("gpu0", "mps60@0", "resnet50"), ("gpu0", "mps40@1", "mobilenet")} <= kept
    # Two models time-sharing a partition, as gpulets' pattern at this demand has them: that pattern is the
    # device's configuration, and a re-plan at the same demand keeps it.
    shared = [{"mps_layout": [100], "running": {"mps100@0": ["mobilenet", "resnet50"]}}]
    raw = gpulet_mps_problem_dict({"resnet50": 600.0, "mobilenet": 500.0}, gpus=3, running=shared)
    raw["options"] = {"spare_capacity": "idle", "mip_gap": GAP}
    problem = problem_from_dict(raw)
    fleet = fleet_model_fleet(problem)
    assert running_start(fleet, fleet_model_build(fleet, full_demand=True, name="start")) is not None
    plan = plan_solve(problem, "fleet", time_limit_s=20)
    assert plan_validate(problem, plan).valid
    assert sorted((i.device, f"{i.slice}@{i.start}", i.variant) for i in plan.instances) == [
        ("gpu0", "mps100@0", "mobilenet"), ("gpu0", "mps100@0", "resnet50")]
    # Partitions no configuration has (three): no start, and no error.
    three = [{"mps_layout": [40, 40, 20], "running": {"mps40@0": "resnet50", "mps40@1": "mobilenet"}}]
    raw = gpulet_mps_problem_dict({"resnet50": 600.0, "mobilenet": 500.0}, gpus=1, running=three)
    fleet = fleet_model_fleet(problem_from_dict(raw))
    assert running_start(fleet, fleet_model_build(fleet, full_demand=True, name="start")) is None


def test_a_cpu_host_is_split_into_instances_of_a_profiled_core_count_for_several_applications() -> None:
    """Issue 40: CPU instances with a core count. Two CPU applications and one 8-core host: Proteus's one
    instance per host serves one of them; the fleet model splits the host into 2-core instances and
    serves both, each instance numbered on the host."""
    def flat(variant: str, cores: int, ms: float) -> list[dict]:
        return [{"variant": variant, "device_type": "cpu", "slice": str(cores), "batch": b, "latency_ms": ms * (1 + 0.2 * (b - 1))}
                for b in (1, 2, 4, 8)]

    raw = {
        "applications": [{"name": "a", "slo_ms": 100, "demand_rps": 150}, {"name": "b", "slo_ms": 100, "demand_rps": 150}],
        "variants": [{"name": "a1", "application": "a", "accuracy": 0.8}, {"name": "b1", "application": "b", "accuracy": 0.7}],
        "devices": [{"name": "h0", "type": "cpu", "cores": 8}],
        "profiles": flat("a1", 2, 10.0) + flat("a1", 8, 4.0) + flat("b1", 2, 10.0) + flat("b1", 8, 4.0),
        "options": {"spare_capacity": "idle", "mip_gap": GAP},
    }
    problem = problem_from_dict(raw)
    proteus = plan_solve(problem, "proteus")
    assert plan_validate(problem, proteus).valid and sum(proteus.shortfall_rps.values()) > 100  # one application only
    plan = plan_solve(problem, "fleet")
    assert plan.status == "optimal" and plan_validate(problem, plan).valid
    assert plan.shortfall_rps == {"a": 0.0, "b": 0.0}
    assert {i.slice for i in plan.instances} == {"2"} and sorted(i.start for i in plan.instances) == list(range(len(plan.instances)))
    assert sum(int(i.slice) for i in plan.instances) <= 8


def test_instances_of_millions_of_rps_serving_a_few_rps_are_planned_not_lost_in_the_solver_tolerance() -> None:
    """The demo's random forests answer 64 rows in about 13 us on a core: 4.8 million rps an instance. A load
    of 1e-6 instances is within HiGHS's feasibility tolerance of zero, and a plan once routed a member's
    4 rps to a slot class with no instance, said `optimal`, and dropped it. The model reads an instance's
    capacity as at most its application's demand."""
    def fast(variant: str, cores: int) -> list[dict]:
        return [{"variant": variant, "device_type": "cpu", "slice": str(cores), "batch": b, "latency_ms": 0.0097 + 0.00005 * b}
                for b in (1, 2, 4, 8, 16, 32, 64)]

    demands = {"a": 4.083, "b": 8.0, "c": 7.25, "d": 5.667}
    raw = {
        "applications": [{"name": n, "slo_ms": 25, "demand_rps": d} for n, d in demands.items()],
        "variants": [{"name": f"{n}1", "application": n, "accuracy": 0.7} for n in demands],
        "devices": [{"name": "h0", "type": "cpu", "cores": 14}],
        "profiles": [p for n in demands for p in fast(f"{n}1", 1) + fast(f"{n}1", 2)],
        "options": {"spare_capacity": "idle"},
    }
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "fleet")
    assert plan_validate(problem, plan).valid
    assert plan.status == "optimal" and all(v == 0.0 for v in plan.shortfall_rps.values()), plan.shortfall_rps
    assert sorted(i.variant for i in plan.instances) == ["a1", "b1", "c1", "d1"]


def test_an_ensemble_is_planned_whole_its_fair_share_over_all_its_members() -> None:
    """Seed 1's ensemble has a member no device runs within its SLO. Planned one application per member,
    that member's share is 0 and fixes the fair share at 0; the plan, though, counts the ensemble's served
    queries over all its members' rows, and so does the fleet model now: its fair share is the plan's, and
    it is no worse than the composition that splits the ensemble (benches/planning.py, mixed, small all 0.5)."""
    problem = _idle(mixed_fleet_problem(4, 4, 2, 2, seed=1, load=0.5, ensembles=1, pipelines=1))
    (ensemble,) = [a for a in problem.applications if a.ensemble is not None]
    fleet = plan_solve(problem, "fleet", time_limit_s=30)
    assert fleet.solver == "fleet" and fleet.gap is not None and fleet.gap <= GAP
    verdict = plan_validate(problem, fleet)
    assert verdict.valid, verdict.errors
    assert any(f"ensembles: {ensemble.name} planned whole" in n for n in fleet.notes)
    assert 0 < fleet.served_rps[ensemble.name] < ensemble.demand_rps  # one member short, the others served
    assert _fair_share(problem, fleet) > 0
    composed = plan_solve(problem, "joint", time_limit_s=30)
    assert composed.solver.startswith("fa2+gpulets+") and plan_validate(problem, composed).valid
    assert _not_worse(problem, fleet, composed), (_fair_share(problem, fleet), _fair_share(problem, composed),
                                                  fleet.total_served_rps, composed.total_served_rps, fleet.objective, composed.objective)


@pytest.mark.parametrize("solver", ["fleet", "proteus"])
def test_an_application_of_several_rows_a_query_is_planned_in_rows(solver: str) -> None:
    """An instance's capacity counts rows and the plan counts queries (rows / mean query size): a planner
    that filled the demand in queries left 3 of every 4 queries of a 4-row application unserved while
    calling the plan optimal."""
    base = proteus_sized_problem(10, 2, 20, 3, seed=0, load=0.3)
    sized = dataclasses.replace(base.applications[0], query_sizes=((2, 0.5), (6, 0.5)))
    problem = _idle(dataclasses.replace(base, applications=(sized,) + base.applications[1:]))
    plan = plan_solve(problem, solver, time_limit_s=20)
    assert plan_validate(problem, plan).valid
    assert plan.status == "optimal" and not any(plan.shortfall_rps.values())
    assert plan.served_rps[sized.name] == pytest.approx(sized.demand_rps, rel=1e-6)
    rows = sum(i.assigned_rps for i in plan.instances if problem.variant(i.variant).application == sized.name)
    assert rows == pytest.approx(4 * sized.demand_rps, rel=1e-6)
    assert any(f"{sized.name}: planned in rows (4 rows per query" in n for n in plan.notes)


def test_the_served_stages_keep_each_slots_fastest_variant_and_lose_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under overload the fair-share and max-served stages count traffic alone, so on each slot class only
    an application's fastest variant keeps its columns there, unless the application has a minimum
    accuracy; the plan serves what the model with every column serves, to the gap."""
    from engine.solvers import model

    base = mixed_fleet_problem(2, 2, 1, 1, n_applications=3, seed=1, load=1.3)
    floored = dataclasses.replace(base.applications[0], min_accuracy=0.5)
    problem = _idle(dataclasses.replace(base, applications=(floored,) + base.applications[1:]))
    fleet = fleet_model_fleet(problem)
    built = model.fleet_model_build(fleet, full_demand=False, name="probe")
    fixed = model._fastest_variants_only(built, fleet)
    assert fixed > 0
    for (key, variant), count in built.instances.items():
        app = problem.variant(variant).application
        if app == floored.name:
            assert count.upBound != 0  # a slower, more accurate variant may be what its floor needs
        elif count.upBound == 0:
            faster = [model.model_capacity_rps(fleet, key, v) for (k, v) in built.instances
                      if k == key and v != variant and problem.variant(v).application == app]
            assert faster and max(faster) >= model.model_capacity_rps(fleet, key, variant)

    reduced = plan_solve(problem, "fleet", time_limit_s=30)
    monkeypatch.setattr(model, "_fastest_variants_only", lambda built, fleet: 0)
    every_column = plan_solve(problem, "fleet", time_limit_s=30)
    for plan in (reduced, every_column):
        assert plan.status == "optimal" and plan_validate(problem, plan).valid
        assert any(plan.shortfall_rps.values())  # overloaded: the fair-share and served stages ran
    assert _fair_share(problem, reduced) == pytest.approx(_fair_share(problem, every_column), rel=GAP, abs=1e-6)
    assert reduced.total_served_rps == pytest.approx(every_column.total_served_rps, rel=2 * GAP)


def test_spare_capacity_fill_runs_every_gpu_for_headroom_at_the_same_accuracy() -> None:
    """Spare capacity "fill" (the default): the MPS GPUs the accuracy stage left idle get partitions too,
    chosen for the largest common multiple of every demand the plan could serve (issue 42, item 1); "idle"
    keeps the fewest GPUs. Same accuracy and served traffic either way; the fill's instances carry the
    demand further below their capacity."""
    rates = {"resnet50": 400.0, "mobilenet": 400.0, "vgg16": 100.0}
    fill = problem_from_dict(gpulet_mps_problem_dict(rates, gpus=4))
    fill = dataclasses.replace(fill, options=dataclasses.replace(fill.options, mip_gap=GAP))
    assert fill.options.spare_capacity == "fill"
    idle = _idle(fill)
    plans = {name: plan_solve(p, "fleet", time_limit_s=30) for name, p in (("fill", fill), ("idle", idle))}
    for name, plan in plans.items():
        verdict = plan_validate(fill, plan)
        assert verdict.valid, (name, verdict.errors)
        assert plan.status == "optimal" and not any(plan.shortfall_rps.values())
    assert plans["idle"].gpus_used < plans["fill"].gpus_used
    assert plans["fill"].effective_accuracy == pytest.approx(plans["idle"].effective_accuracy, rel=GAP)
    (note,) = [n for n in plans["fill"].notes if n.startswith("headroom:")]
    headroom = float(note.split("could be served ")[1].split("x")[0])
    assert headroom > 1.5
    for app, demand in rates.items():
        capacity = {name: sum(i.capacity_rps for i in plan.instances if i.variant == app) for name, plan in plans.items()}
        assert capacity["fill"] >= headroom * demand * (1 - 1e-6) and capacity["fill"] > capacity["idle"]
        busiest = max(i.assigned_rps / i.capacity_rps for i in plans["fill"].instances if i.variant == app)
        assert busiest <= 1 / headroom + 1e-6


def _capacity_multiple(problem, plan) -> dict[str, float]:
    """Per application, what its instances could serve over its demand."""
    return {a.name: sum(i.capacity_rps for i in plan.instances if problem.variant(i.variant).application == a.name) / a.demand_rps
            for a in problem.applications if a.demand_rps > 0}


@pytest.mark.parametrize("load", [0.3, 0.5])
def test_headroom_target_plans_the_most_accuracy_at_that_headroom(load: float) -> None:
    """options.headroom_target (issue 42, item 2): at light load the most accurate plan leaves no headroom
    on these MIG GPUs; with a target of 1.5 every application's instances can serve 1.5x its demand, the
    plan is proved the most accurate at that headroom (the objective is measured on the plan itself), and
    it gives up accuracy for it, never more than the accuracy stage's optimum."""
    problem = mig_fleet_problem(2, "A100-SXM4-40GB", n_applications=3, seed=0, load=load,
                                options=SolveOptions(time_limit_s=30))
    accurate = plan_solve(problem, "fleet")
    target = dataclasses.replace(problem, options=dataclasses.replace(problem.options, headroom_target=1.5))
    headroom = plan_solve(target, "fleet")
    for plan in (accurate, headroom):
        verdict = plan_validate(problem, plan)
        assert verdict.valid, verdict.errors
        assert plan.status == "optimal" and not any(plan.shortfall_rps.values())
        assert plan.objective == pytest.approx(plan_objective(problem, plan), rel=1e-5)  # the solver's tolerance
    assert min(_capacity_multiple(problem, accurate).values()) < 1.5
    assert min(_capacity_multiple(problem, headroom).values()) >= 1.5 * (1 - 1e-6)
    assert headroom.effective_accuracy < accurate.effective_accuracy
    assert headroom.objective <= accurate.bound + 1e-9
    assert any(n.startswith("headroom target 1.5x:") and "planned for the most accuracy at 1.5x" in n for n in headroom.notes)
    # Already that much headroom at the most accuracy: the target changes nothing.
    roomy = dataclasses.replace(problem, options=dataclasses.replace(problem.options, headroom_target=1.0))
    same = plan_solve(roomy, "fleet")
    assert same.objective == pytest.approx(accurate.objective, abs=1e-9)
    assert not any(n.startswith("headroom target") for n in same.notes)


def test_headroom_target_is_capped_by_what_the_fleet_can_serve() -> None:
    """A target the fleet cannot reach: the plan is the most accurate at the largest multiple it can serve,
    not short of demand."""
    problem = mig_fleet_problem(2, "A100-SXM4-40GB", n_applications=3, seed=0, load=0.5,
                                options=SolveOptions(time_limit_s=30, headroom_target=10.0))
    plan = plan_solve(problem, "fleet")
    assert plan.status == "optimal" and not any(plan.shortfall_rps.values()) and plan_validate(problem, plan).valid
    (note,) = [n for n in plan.notes if n.startswith("headroom target 10x:")]
    reached = float(note.split("planned for the most accuracy at ")[1].split("x")[0])
    assert 1.0 < reached < 10.0
    assert min(_capacity_multiple(problem, plan).values()) >= reached * (1 - 5e-3)  # the note rounds to 3 digits


def test_spare_capacity_fill_gives_empty_mig_slices_an_instance_and_keeps_the_objective() -> None:
    """On a mixed fleet at light load the accuracy stage leaves MIG slices and GPUs empty; the fill runs
    them with the objective, bound and gap of the accuracy stage unchanged."""
    problem = mixed_fleet_problem(2, 2, 1, 1, n_applications=3, seed=0, load=0.3, options=SolveOptions(mip_gap=GAP, time_limit_s=30))
    fill = plan_solve(problem, "fleet")
    idle = plan_solve(_idle(problem), "fleet")
    for plan in (fill, idle):
        assert plan_validate(problem, plan).valid and plan.status == "optimal" and not any(plan.shortfall_rps.values())
    assert fill.objective == pytest.approx(idle.objective, rel=2 * GAP)
    assert len(fill.instances) > len(idle.instances) and fill.gpus_used >= idle.gpus_used
    assert any(n.startswith("headroom:") for n in fill.notes)
    mig = {d.name for d in problem.devices if d.mig}
    assert sum(1 for i in fill.instances if i.device in mig) > sum(1 for i in idle.instances if i.device in mig)
