"""Pipelines in the planning problem: the `pipelines` section is read and refused as it should be, and
`plan_solve(problem, "fa2" | "ipa")` plans each pipeline as a whole, places its replicas side by side on CPU
hosts, leaves the other applications to proteus, and every plan passes the independent validator, which
checks each path's end-to-end time against its SLO on the profiled latencies."""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from engine.pipelines.problem import stage_latency_bound
from engine.plans.problem import Plan, ProblemError, plan_from_dict, problem_from_dict, problem_to_dict
from engine.plans.schema import SchemaError, json_validate, plan_schema, problem_schema
from engine.plans.validate import plan_validate
from engine.solvers.hosts import replicas_place
from engine.solvers.pipelines import ipa_base_allocation
from engine.solvers.solve import plan_solve


def _profile(variant: str, cores: int, base_ms: float, per_item_ms: float, batches=(1, 2, 4, 8, 16)) -> list[dict[str, Any]]:
    # More cores run faster, sublinearly (as onnxruntime's intra-op threads do on small models).
    return [{"variant": variant, "device_type": "cpu", "slice": str(cores), "batch": b,
             "latency_ms": round((base_ms + per_item_ms * b) / cores ** 0.7, 4)} for b in batches]


def _raw(hosts: int = 4, cores: int = 8, **pipeline: Any) -> dict[str, Any]:
    chain = {"name": "video", "stages": ["detect", "classify"], "slo_ms": 200, "demand_rps": 40}
    chain.update(pipeline)
    return {
        "applications": [{"name": "detect"}, {"name": "classify"}, {"name": "other", "slo_ms": 100, "demand_rps": 10}],
        "variants": [
            {"name": "det-s", "application": "detect", "accuracy": 0.6}, {"name": "det-l", "application": "detect", "accuracy": 0.8},
            {"name": "cls-s", "application": "classify", "accuracy": 0.7}, {"name": "cls-l", "application": "classify", "accuracy": 0.9},
            {"name": "oth", "application": "other", "accuracy": 0.5},
        ],
        "devices": [{"name": f"h{i}", "type": "cpu", "cores": cores} for i in range(hosts)],
        "profiles": (_profile("det-s", 1, 5, 2) + _profile("det-s", 2, 5, 2) + _profile("det-l", 1, 12, 5) + _profile("det-l", 2, 12, 5)
                     + _profile("det-l", 4, 12, 5) + _profile("cls-s", 1, 3, 1) + _profile("cls-l", 1, 8, 3) + _profile("cls-l", 2, 8, 3)
                     + _profile("oth", 4, 2, 1)),
        "pipelines": [chain],
    }


def _assert_valid(problem, plan: Plan) -> None:
    verdict = plan_validate(problem, plan)
    assert verdict.valid, str(verdict)
    # ... and after the JSON round trip, against the published schema.
    raw = json.loads(json.dumps(plan.to_dict()))
    json_validate(raw, plan_schema())
    assert plan_validate(problem, plan_from_dict(raw)).valid


# --------------------------------------------------------------------------- the problem format


def test_a_chain_is_declared_by_its_stages_in_order_and_stage_demand_follows_from_the_paths() -> None:
    raw = _raw()
    json_validate(raw, problem_schema())
    problem = problem_from_dict(raw)
    (pipeline,) = problem.pipelines
    assert pipeline.is_chain and pipeline.entry == "detect"
    assert [q.stages for q in pipeline.paths] == [("detect", "classify")]
    assert problem.application("detect").demand_rps == 40 and problem.application("detect").slo_ms == 200
    assert problem.pipeline_of("classify") is pipeline and problem.pipeline_of("other") is None
    again = problem_to_dict(problem)
    json_validate(again, problem_schema())
    assert problem_from_dict(again) == problem


def test_a_dag_with_shared_stages_sums_the_rates_of_the_paths_through_each() -> None:
    raw = _raw()
    raw["applications"].append({"name": "ocr"})
    raw["variants"].append({"name": "ocr-1", "application": "ocr", "accuracy": 0.9})
    raw["profiles"] += _profile("ocr-1", 1, 6, 2)
    raw["pipelines"] = [{"name": "video", "stages": ["detect", "classify", {"application": "ocr", "max_batch": 8}], "paths": [
        {"name": "objects", "stages": ["detect", "classify"], "slo_ms": 150, "demand_rps": 30},
        {"name": "text", "stages": ["detect", "ocr"], "slo_ms": 300, "demand_rps": 10},
    ]}]
    json_validate(raw, problem_schema())
    problem = problem_from_dict(raw)
    assert problem.application("detect").demand_rps == 40
    assert problem.application("detect").slo_ms == 150  # the tightest path through it
    assert problem.application("ocr").demand_rps == 10
    assert problem.pipelines[0].stage("ocr").max_batch == 8


@pytest.mark.parametrize("change, message", [
    (lambda r: r["pipelines"][0].update(stages=["detect", "nope"]), "unknown application 'nope'"),
    (lambda r: r["pipelines"][0].update(stages=["detect", "detect"]), "listed twice"),
    (lambda r: r["pipelines"].append({"name": "again", "stages": ["classify"], "slo_ms": 10, "demand_rps": 1}),
     "already a stage of pipeline 'video'"),
    (lambda r: r["pipelines"][0].update(slo_ms=None), "give 'paths', or 'slo_ms' and 'demand_rps'"),
    (lambda r: r["pipelines"][0].update(slo_ms=-5), "slo_ms: must be > 0"),
    (lambda r: r["pipelines"][0].update(paths=[{"name": "p", "stages": ["detect", "classify"], "slo_ms": 9, "demand_rps": 1}]),
     "remove the pipeline's"),
    (lambda r: (r["pipelines"][0].update(slo_ms=None, demand_rps=None,
                                         paths=[{"name": "a", "stages": ["detect"], "slo_ms": 9, "demand_rps": 1},
                                                {"name": "b", "stages": ["classify"], "slo_ms": 9, "demand_rps": 1}])),
     "one entry stage"),
    (lambda r: (r["pipelines"][0].update(slo_ms=None, demand_rps=None,
                                         paths=[{"name": "a", "stages": ["detect", "classify"], "slo_ms": 9, "demand_rps": 1},
                                                {"name": "b", "stages": ["detect", "other"], "slo_ms": 9, "demand_rps": 1}])),
     "not stages of 'video'"),
    (lambda r: (r["pipelines"][0].update(stages=["detect", "classify", "other"], slo_ms=None, demand_rps=None,
                                         paths=[{"name": "a", "stages": ["detect", "classify", "other"], "slo_ms": 9, "demand_rps": 1},
                                                {"name": "b", "stages": ["detect", "other", "classify"], "slo_ms": 9, "demand_rps": 1}])),
     "cycle"),
    (lambda r: (r["pipelines"][0].update(stages=["detect", "classify", "other"])), "other"),
    (lambda r: r["pipelines"][0].update(stages=["detect", {"application": "classify", "variant": "det-s"}]),
     "a variant of 'detect', not of 'classify'"),
    (lambda r: r["applications"][0].update(demand_rps=7), "leave demand_rps out"),
    (lambda r: r["applications"][2].pop("slo_ms"), "missing 'slo_ms'"),
    (lambda r: r["options"].update(pipeline_headroom=0.5) if "options" in r else r.update(options={"pipeline_headroom": 0.5}),
     "pipeline_headroom: must be >= 1"),
])
def test_bad_pipelines_are_refused_with_a_message_naming_the_fault(change, message: str) -> None:
    raw = copy.deepcopy(_raw())
    change(raw)
    with pytest.raises(ProblemError, match=None) as caught:
        problem_from_dict(raw)
    assert message in str(caught.value), str(caught.value)


def test_the_schema_refuses_unknown_stage_keys() -> None:
    raw = _raw()
    raw["pipelines"][0]["stages"][1] = {"application": "classify", "batch": 4}
    with pytest.raises(SchemaError):
        json_validate(raw, problem_schema())
    with pytest.raises(ProblemError, match="unknown keys"):
        problem_from_dict(raw)


# --------------------------------------------------------------------------- the latency model


def test_the_bounded_fit_is_nowhere_below_the_profile() -> None:
    points = [(1, 10.0), (2, 11.0), (4, 19.0), (8, 24.0), (16, 60.0)]  # bumpy: no quadratic passes through them
    model = stage_latency_bound(points)
    for b in range(1, 17):
        lo = max(p for p in points if p[0] <= b)
        hi = min(p for p in points if p[0] >= b)
        profiled = lo[1] if hi[0] == lo[0] else lo[1] + (hi[1] - lo[1]) * (b - lo[0]) / (hi[0] - lo[0])
        assert model.d(b) >= profiled - 1e-9
    assert min(model.d(b) - p for b, p in points) == pytest.approx(0.0, abs=1e-6)  # raised no more than needed


def test_the_base_allocation_is_the_fewest_cores_meeting_the_threshold() -> None:
    problem = problem_from_dict(_raw())
    # det-l serves about 1000*16/(92/1) = 174 rps on 1 core, more on 2 and 4.
    assert ipa_base_allocation(problem, "det-l", host_cores=8, threshold_rps=0, stage_sla_ms=100) == 1
    assert ipa_base_allocation(problem, "det-l", host_cores=8, threshold_rps=250, stage_sla_ms=100) == 2
    assert ipa_base_allocation(problem, "det-l", host_cores=8, threshold_rps=1e6, stage_sla_ms=100) == 4  # the fastest that meets the SLA
    assert ipa_base_allocation(problem, "det-l", host_cores=8, threshold_rps=0, stage_sla_ms=1) is None


def test_replicas_fill_the_hosts_running_the_pipeline_then_the_largest_one_host_at_a_time() -> None:
    problem = problem_from_dict(_raw(hosts=2, cores=4))
    placed, left = replicas_place(problem.devices, [("a", 3), ("b", 2), ("c", 1), ("d", 2), ("e", 1)])
    assert placed == {"h0": ["a", "c"], "h1": ["b", "d"]}
    assert left == ["e"]
    small, big = dataclasses.replace(problem.devices[0], cores=2), dataclasses.replace(problem.devices[1], cores=8)
    placed, _ = replicas_place([small, big], [("a", 1), ("b", 1), ("c", 1)])
    assert placed == {"h1": ["a", "b", "c"]}  # the large host first, filled before another is opened
    # A host that runs the pipeline now is filled first.
    placed, _ = replicas_place(problem.devices, [("a", 1), ("b", 1), ("c", 1)], prefer={"h1"})
    assert placed == {"h1": ["a", "b", "c"]}


# --------------------------------------------------------------------------- planning


@pytest.mark.parametrize("solver", ["fa2", "ipa"])
def test_pipeline_plans_keep_every_path_within_its_slo_and_pass_the_validator(solver: str) -> None:
    problem = problem_from_dict(_raw())
    plan = plan_solve(problem, solver)
    _assert_valid(problem, plan)
    # The pipeline's programme is proved optimal, proteus's on "other" too; the whole, split before solving, is not.
    assert plan.status == "feasible" and plan.bound is None and plan.gap is None
    assert plan.notes[0].startswith(f"composed plan ({solver}+proteus): {solver} optimal, proteus optimal; the whole is feasible")
    assert plan.shortfall_rps == {"detect": 0.0, "classify": 0.0, "other": 0.0}
    summary = plan.pipelines["video"]
    assert summary["paths"]["video"]["latency_ms"] <= 200
    for app, stage in summary["stages"].items():
        # Sized for 1.25x the rate (options.pipeline_headroom), all placed.
        assert stage["capacity_rps"] >= 1.25 * 40 - 1e-6
        assert stage["replicas_placed"] == stage["replicas"]
        assert {i.variant for i in plan.instances if problem.variant(i.variant).application == app} == {stage["variant"]}
    # The other application went to proteus: on a host the replicas use, on the cores they leave, numbered
    # after them (the validator checked that the cores add up).
    pipeline_hosts = {i.device for i in plan.instances if i.variant != "oth"}
    for inst in (i for i in plan.instances if i.variant == "oth" and i.device in pipeline_hosts):
        assert inst.start is not None and any(n.startswith(f"{inst.device}: oth on {inst.slice} of the cores") for n in plan.notes)


@pytest.mark.parametrize("solver", ["fa2", "fleet"])
def test_an_application_beside_a_pipeline_gets_the_cores_its_replicas_leave_on_their_host(solver: str) -> None:
    """One 16-core host: the pipeline's replicas take a few cores, and the other application (profiled on 4
    cores) runs beside them instead of going short because a part used the host."""
    problem = problem_from_dict(_raw(hosts=1, cores=16))
    plan = plan_solve(problem, solver)
    _assert_valid(problem, plan)
    assert plan.shortfall_rps == {"detect": 0.0, "classify": 0.0, "other": 0.0}
    (other,) = [i for i in plan.instances if i.variant == "oth"]
    replicas = [i for i in plan.instances if i.variant != "oth"]
    assert other.device == "h0" and other.slice == "4" and other.start == len(replicas)
    assert sum(int(i.slice) for i in plan.instances) <= 16
    # Replicas that grow in place (biscale) keep the host's free cores as their room to grow: nothing else runs there.
    plan = plan_solve(problem, "biscale")
    _assert_valid(problem, plan)
    assert plan.shortfall_rps["other"] == pytest.approx(10.0)


def test_fa2_scales_one_core_replicas_side_by_side_on_a_host() -> None:
    problem = problem_from_dict(_raw(demand_rps=400))
    plan = plan_solve(problem, "fa2")
    _assert_valid(problem, plan)
    stage_instances = [i for i in plan.instances if i.variant != "oth"]
    assert all(i.slice == "1" for i in stage_instances)  # FA2's homogeneous one-core instances
    per_host: dict[str, list[int]] = {}
    for inst in stage_instances:
        per_host.setdefault(inst.device, []).append(inst.start)
    assert max(len(v) for v in per_host.values()) > 1
    for starts in per_host.values():
        assert sorted(starts) == list(range(len(starts)))  # each with its own index on the host
    # FA2 picks each stage's most accurate variant (it scales, it does not trade accuracy).
    assert {s["variant"] for s in plan.pipelines["video"]["stages"].values()} == {"det-l", "cls-l"}


@pytest.mark.parametrize("solver", ["fa2", "ipa"])
def test_pipelines_alone_are_optimal_when_their_programme_proves_it(solver: str) -> None:
    raw = _raw()
    raw["applications"] = [a for a in raw["applications"] if a["name"] != "other"]
    raw["variants"] = [v for v in raw["variants"] if v["application"] != "other"]
    raw["profiles"] = [p for p in raw["profiles"] if p["variant"] != "oth"]
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, solver)
    _assert_valid(problem, plan)
    assert plan.status == "optimal" and plan.solver == solver and not any(plan.shortfall_rps.values())


def test_fa2_by_its_dynamic_programme_plans_no_fewer_instances_than_the_exact_programme() -> None:
    from engine.solvers.assemble import plan_from_instances
    from engine.solvers.hosts import CpuHostUse
    from engine.solvers.pipelines import pipeline_part_solve

    problem = problem_from_dict(_raw(demand_rps=300, slo_ms=120))
    parts = {method: pipeline_part_solve(problem, CpuHostUse(), solver="fa2", method=method) for method in ("exact", "dp")}
    for part in parts.values():
        plan = plan_from_instances(problem, part.instances, status="feasible", solver="fa2", objective=None, bound=None, gap=None,
                                   solve_seconds=0.0)
        plan.pipelines = part.pipelines
        _assert_valid(problem, plan)
    assert parts["exact"].statuses == ["optimal"]
    cores = lambda part: part.pipelines["video"]["cores"]  # noqa: E731
    assert cores(parts["dp"]) >= cores(parts["exact"])


def test_ipa_trades_accuracy_for_cores_as_beta_grows() -> None:
    cheap = plan_solve(problem_from_dict(_raw(demand_rps=300, beta=0.0001)), "ipa")
    lean = plan_solve(problem_from_dict(_raw(demand_rps=300, beta=1.0)), "ipa")
    assert cheap.pipelines["video"]["pas"] > lean.pipelines["video"]["pas"]
    assert cheap.pipelines["video"]["cores"] > lean.pipelines["video"]["cores"]


def test_a_pinned_variant_is_kept() -> None:
    problem = problem_from_dict(_raw(stages=[{"application": "detect", "variant": "det-s"}, "classify"]))
    for solver in ("fa2", "ipa"):
        plan = plan_solve(problem, solver)
        _assert_valid(problem, plan)
        assert plan.pipelines["video"]["stages"]["detect"]["variant"] == "det-s"


def test_too_few_cores_leave_a_reported_shortfall_and_a_valid_plan() -> None:
    problem = problem_from_dict(_raw(hosts=1, cores=2, demand_rps=600))
    plan = plan_solve(problem, "fa2")
    _assert_valid(problem, plan)
    assert plan.status == "feasible"
    assert plan.shortfall_rps["detect"] > 0 or plan.shortfall_rps["classify"] > 0
    assert any("not enough CPU cores" in n for n in plan.notes)
    assert plan.shortfall_rps["other"] == 10  # no host left for it


def test_an_unreachable_slo_is_infeasible_and_says_why() -> None:
    problem = problem_from_dict(_raw(slo_ms=5))
    for solver in ("fa2", "ipa"):
        plan = plan_solve(problem, solver)
        _assert_valid(problem, plan)
        assert plan.pipelines["video"]["status"] == "infeasible"
        assert plan.served_rps["detect"] == 0


def test_ipa_refuses_a_dag_and_fa2_plans_it() -> None:
    raw = _raw()
    raw["pipelines"] = [{"name": "video", "stages": ["detect", "classify", "other"], "paths": [
        {"name": "a", "stages": ["detect", "classify"], "slo_ms": 150, "demand_rps": 30},
        {"name": "b", "stages": ["detect", "other"], "slo_ms": 300, "demand_rps": 10},
    ]}]
    raw["applications"][2] = {"name": "other"}
    problem = problem_from_dict(raw)
    ipa = plan_solve(problem, "ipa")
    assert ipa.pipelines["video"]["status"] == "infeasible"
    assert any("linear pipelines" in n for n in ipa.notes)
    fa2 = plan_solve(problem, "fa2")
    _assert_valid(problem, fa2)
    paths = fa2.pipelines["video"]["paths"]
    assert paths["a"]["latency_ms"] <= 150 and paths["b"]["latency_ms"] <= 300


# --------------------------------------------------------------------------- the validator


def _fa2_plan(demand: float = 400):
    problem = problem_from_dict(_raw(demand_rps=demand))
    return problem, plan_solve(problem, "fa2")


def _replace(plan: Plan, pick, **changes) -> Plan:
    out = copy.deepcopy(plan)
    out.instances = [dataclasses.replace(i, **changes) if pick(i) else i for i in out.instances]
    return out


def test_the_validator_catches_a_path_over_its_slo() -> None:
    problem, plan = _fa2_plan()
    tight = dataclasses.replace(problem, pipelines=(dataclasses.replace(
        problem.pipelines[0], paths=(dataclasses.replace(problem.pipelines[0].paths[0], slo_ms=plan.pipelines["video"]["paths"]["video"]["latency_ms"] - 1),)),))
    verdict = plan_validate(tight, plan)
    assert not verdict.valid and any("path video" in e and "over its SLO" in e for e in verdict.errors), str(verdict)


def test_the_validator_catches_a_stage_running_two_variants() -> None:
    problem, plan = _fa2_plan()
    first = next(i for i in plan.instances if i.variant == "det-l")
    changed = _replace(plan, lambda i: i.id == first.id, variant="det-s")
    verdict = plan_validate(problem, changed)
    assert any("a stage runs one variant at one batch" in e for e in verdict.errors), str(verdict)


def test_the_validator_catches_a_host_over_its_cores_and_instances_without_an_index() -> None:
    problem, plan = _fa2_plan()
    busy = next(i for i in plan.instances if i.start == 1)
    over = _replace(plan, lambda i: i.device == busy.device, slice="8")
    assert any("cores in all" in e for e in plan_validate(problem, over).errors)
    unindexed = _replace(plan, lambda i: i.device == busy.device and i.start == 0, start=None)
    assert any("each need one" in e for e in plan_validate(problem, unindexed).errors)


def test_the_validator_catches_capacity_below_the_rate_without_a_shortfall() -> None:
    problem, plan = _fa2_plan()
    gone = next(i for i in plan.instances if i.variant == "cls-l")
    thinner = copy.deepcopy(plan)
    thinner.instances = [i for i in plan.instances if i.id != gone.id]
    verdict = plan_validate(problem, thinner)
    assert any("stage classify: its instances serve" in e and "reports no shortfall" in e for e in verdict.errors), str(verdict)


def test_a_placed_pipeline_plan_is_simulated_end_to_end_on_its_profiles() -> None:
    from engine.simulation.pipeline import PipelineSimulationConfig, fleet_pipeline_simulate

    problem, plan = _fa2_plan()
    result = fleet_pipeline_simulate(problem, plan, "video", PipelineSimulationConfig(duration_s=30, seed=1))
    outcome = result.paths["video"]
    assert outcome.arrivals == pytest.approx(400 * 30, rel=0.05)
    # Sized for 1.25x the rate with queueing in the budget: Poisson arrivals keep their SLO.
    assert outcome.violation_ratio < 0.01
    assert result.instances == sum(s["replicas_placed"] for s in plan.pipelines["video"]["stages"].values())
    with pytest.raises(ValueError, match="no pipeline 'nope'"):
        fleet_pipeline_simulate(problem, plan, "nope")


def test_plan_solve_on_the_command_line_prints_each_path_with_its_simulation(tmp_path) -> None:
    from typer.testing import CliRunner

    from controlplane.cli import app

    path = tmp_path / "problem.json"
    path.write_text(json.dumps(_raw(demand_rps=300)))
    result = CliRunner().invoke(app, ["plan", "solve", "--problem", str(path), "--solver", "ipa", "--out", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    assert "pipeline     video: optimal (ipa)" in result.output
    assert "path video:" in result.output and "simulated 60 s:" in result.output
    assert json.loads((tmp_path / "plan.json").read_text())["pipelines"]["video"]["stages"]["detect"]["replicas_placed"] >= 1
    bad = CliRunner().invoke(app, ["plan", "solve", "--problem", str(path), "--solver", "fa3"])
    assert bad.exit_code == 2 and "fa2, ipa" in bad.output


def test_a_chain_may_be_written_as_text() -> None:
    raw = _raw(stages="detect -> classify")
    json_validate(raw, problem_schema())
    assert problem_from_dict(raw) == problem_from_dict(_raw())
    with pytest.raises(ProblemError, match="an empty stage name"):
        problem_from_dict(_raw(stages="detect -> "))


def test_any_other_solver_leaves_the_pipelines_to_fa2_and_plans_the_rest() -> None:
    problem = problem_from_dict(_raw(demand_rps=200))
    plan = plan_solve(problem, "proteus")
    _assert_valid(problem, plan)
    assert plan.solver == "fa2+proteus" and plan.pipelines["video"]["solver"].startswith("fa2")
    assert plan.shortfall_rps == {"detect": 0.0, "classify": 0.0, "other": 0.0}


def test_ipa_keeps_to_a_stages_min_accuracy() -> None:
    raw = _raw(demand_rps=300, beta=1.0)  # cores weigh heavily: without a floor IPA takes det-s
    assert plan_solve(problem_from_dict(raw), "ipa").pipelines["video"]["stages"]["detect"]["variant"] == "det-s"
    raw["applications"][0]["min_accuracy"] = 0.7
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "ipa")
    _assert_valid(problem, plan)
    assert plan.pipelines["video"]["stages"]["detect"]["variant"] == "det-l"


# --------------------------------------------------------------------------- pipelines inside the fleet model


def test_the_fleet_model_runs_part_of_a_pipeline_when_the_cores_cannot_hold_all_of_it() -> None:
    """Too few cores for the whole pipeline and the other application: the model picks one of FA2's plans
    for a fraction of the demand, every stage carries the same share of its rate, the rest is reported short,
    and the fair share is raised for both the pipeline and the other application."""
    problem = problem_from_dict(_raw(hosts=1, cores=8, demand_rps=2000))
    full = plan_solve(problem, "fa2")  # FA2 alone: the replicas the whole demand needs
    assert sum(s["replicas"] for s in full.pipelines["video"]["stages"].values()) > 8
    plan = plan_solve(problem, "fleet")
    _assert_valid(problem, plan)
    assert plan.solver == "fleet" and plan.gap is not None
    summary = plan.pipelines["video"]
    share = summary["served_fraction"]
    assert 0 < share < 1
    for app in ("detect", "classify"):
        assert plan.served_rps[app] == pytest.approx(share * 2000)
        assert plan.shortfall_rps[app] == pytest.approx((1 - share) * 2000)
        # Sized with the headroom for what it carries.
        assert summary["stages"][app]["capacity_rps"] >= 1.25 * plan.served_rps[app] - 1e-6
    assert plan.served_rps["other"] > 0
    assert any("cannot be served in full" in n for n in plan.notes)
    assert sum(int(i.slice) for i in plan.instances) <= 8


def test_the_fleet_model_leaves_a_pipeline_no_plan_meets_unrun_and_says_why() -> None:
    problem = problem_from_dict(_raw(hosts=1, cores=16, slo_ms=1))
    plan = plan_solve(problem, "fleet")
    _assert_valid(problem, plan)
    assert plan.pipelines == {}
    assert plan.shortfall_rps["detect"] == pytest.approx(40) and plan.shortfall_rps["classify"] == pytest.approx(40)
    assert plan.shortfall_rps["other"] == 0.0
    assert any(n.startswith("pipeline video: not run (no plan meets its SLOs)") for n in plan.notes)
    assert any(n.startswith("pipeline video:") and "SLO" in n for n in plan.notes)


def test_spare_capacity_never_touches_a_pipelines_replicas() -> None:
    """With the spare fill on (the default), an idle host gets the other application, never a stage at
    another batch, and the replicas keep the batch and the equal shares their option gave them."""
    raw = _raw(hosts=3, cores=8)
    raw["options"] = {"spare_capacity": "fill"}
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "fleet")
    _assert_valid(problem, plan)
    summary = plan.pipelines["video"]
    for app, stage in summary["stages"].items():
        mine = [i for i in plan.instances if problem.variant(i.variant).application == app]
        assert len(mine) == stage["replicas"] and {i.batch for i in mine} == {stage["batch"]}
        assert {round(i.assigned_rps, 9) for i in mine} == {round(40 / stage["replicas"], 9)}


def test_a_fleet_model_replan_keeps_a_pipeline_on_the_host_it_runs_on() -> None:
    """Two identical hosts, the pipeline running on the second: a re-plan keeps both stages there (the
    model counts replicas moved to hosts that run none of its stages; realisation gives the host running it
    the configuration with room for them) and the other application takes the first host."""
    raw = _raw(hosts=2, cores=4)
    raw["devices"][1]["running"] = {"cpu": "det-l"}
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "fleet")
    _assert_valid(problem, plan)
    replicas = [i for i in plan.instances if i.variant != "oth"]
    assert replicas and {i.device for i in replicas} == {"h1"}
    assert {i.device for i in plan.instances if i.variant == "oth"} == {"h0"}
    # Hosts of different sizes (two classes of devices): the larger one has room for both, but the
    # pipeline stays on the smaller one that runs it.
    raw = _raw(hosts=2, cores=4)
    raw["devices"][0]["cores"] = 8
    raw["devices"][1]["running"] = {"cpu": "det-l"}
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "fleet")
    _assert_valid(problem, plan)
    assert {i.device for i in plan.instances if i.variant != "oth"} == {"h1"}
    # Nothing running: no preference, and still one valid plan.
    fresh = problem_from_dict(_raw(hosts=2, cores=4))
    _assert_valid(fresh, plan_solve(fresh, "fleet"))
