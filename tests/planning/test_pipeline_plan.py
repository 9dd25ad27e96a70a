"""Pipelines through a plan run: the registry's pipelines enter the fleet problem (their stages planned
through them, demand from the paths or measured at the entry), fa2 and ipa plan them, the replicas land
side by side on CPU hosts as desired-state runtimes the deployment checker accepts, and the prediction
simulates each pipeline end to end."""
from __future__ import annotations

import pytest

from apps.deployments.services import host_desired_state_validate
from apps.inventory.models import Host
from apps.jobs.services import job_execute
from apps.planning.models import Plan
from apps.planning.services import plan_run_execute, plan_run_start
from apps.planning.snapshot import fleet_problem_build
from apps.registry.services.pipelines import pipeline_save
from tests.factories import (
    ApplicationFactory,
    ArtifactFactory,
    CpuFactory,
    HostFactory,
    ModelVariantFactory,
    ProfileFactory,
    SloPolicyFactory,
)

pytestmark = pytest.mark.django_db


def _cpu_profiles(variant, base_ms: float, per_item_ms: float) -> None:
    for cores in (1, 2):
        for batch in (1, 4, 8, 16):
            latency = (base_ms + per_item_ms * batch) / cores ** 0.7
            ProfileFactory(variant=variant, device_type="cpu", slice="", cpu_cores=cores, batch_size=batch,
                           latency_p50_ms=latency, latency_p99_ms=latency * 1.2)


@pytest.fixture
def pipeline_fleet(db):
    """Two CPU hosts of 8 cores (online); detect (two variants) -> classify (one), declared as a chain at
    120 rps within 250 ms; and tabular, a lone application with its own SLO policy."""
    for name in ("cpu-a", "cpu-b"):
        CpuFactory(host=HostFactory(name=name, status="online"), index=0, cpu_cores=8)
    detect, classify = ApplicationFactory(name="detect"), ApplicationFactory(name="classify")
    _cpu_profiles(ModelVariantFactory(application=detect, name="det-s", accuracy=0.6, artifact=ArtifactFactory()), 5, 2)
    _cpu_profiles(ModelVariantFactory(application=detect, name="det-l", accuracy=0.8, artifact=ArtifactFactory()), 12, 5)
    _cpu_profiles(ModelVariantFactory(application=classify, name="cls", accuracy=0.9, artifact=ArtifactFactory()), 8, 3)
    tabular = ApplicationFactory(name="tabular")
    SloPolicyFactory(application=tabular, latency_p99_ms=40.0)
    _cpu_profiles(ModelVariantFactory(application=tabular, name="mlp", accuracy=0.9, artifact=ArtifactFactory()), 1, 0.5)
    pipeline_save(data={"name": "video", "stages": "detect -> classify", "slo_ms": 250, "demand_rps": 120})


def _run(options: dict) -> Plan:
    job = plan_run_start(trigger="manual", options={"time_limit_s": 10, **options})
    job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    return Plan.objects.get(job=job)


def test_the_snapshot_plans_stages_through_their_pipeline(pipeline_fleet):
    snapshot = fleet_problem_build(demand={"tabular": 10})
    problem = snapshot.problem
    (pipeline,) = problem.pipelines
    assert [s.application for s in pipeline.stages] == ["detect", "classify"]
    # No SLO policy on the stages: their SLO and demand come from the path.
    assert problem.application("detect").demand_rps == 120 and problem.application("classify").slo_ms == 250
    assert snapshot.applications["detect"]["pipeline"] == "video"
    # Demand measured at the entry sizes the paths.
    measured = fleet_problem_build(demand={"detect": 300, "tabular": 10}).problem
    assert measured.pipelines[0].paths[0].demand_rps == 300 and measured.application("classify").demand_rps == 300


def test_a_pipeline_with_an_unprofiled_stage_is_left_out_with_a_note(pipeline_fleet):
    ApplicationFactory(name="caption")
    pipeline_save(data={"name": "captions", "stages": "caption", "slo_ms": 100, "demand_rps": 1})
    snapshot = fleet_problem_build(demand={"tabular": 10})
    assert [p.name for p in snapshot.problem.pipelines] == ["video"]
    assert any("pipeline captions left out" in n and "caption" in n for n in snapshot.notes)


@pytest.mark.parametrize("solver", ["fa2", "ipa"])
def test_a_pipeline_plan_lands_as_cpu_runtimes_side_by_side(pipeline_fleet, solver):
    plan = _run({"solver": solver, "demand": {"detect": 300, "tabular": 20}})
    assert plan.status == "validated", plan.validation
    summary = plan.result["pipelines"]["video"]
    assert summary["paths"]["video"]["latency_ms"] <= 250
    replicas = sum(s["replicas_placed"] for s in summary["stages"].values())
    assert replicas >= 3
    runtimes = [r for spec in plan.desired_states.values() for r in spec["runtimes"]]
    stage_runtimes = [r for r in runtimes if r["application"] in ("detect", "classify")]
    assert len(stage_runtimes) == replicas
    # Several replicas on one host, each its own runtime key and thread count; the host's cores suffice.
    for host_name, spec in plan.desired_states.items():
        keys = [r["key"] for r in spec["runtimes"]]
        assert len(keys) == len(set(keys))
        assert sum(r["cpu_threads"] for r in spec["runtimes"]) <= 8
        host_desired_state_validate(host=Host.objects.get(name=host_name), spec=spec)  # what applying it checks
    assert any(len(spec["runtimes"]) > 1 for spec in plan.desired_states.values())
    assert {r["max_batch"] for r in stage_runtimes if r["application"] == "detect"} == {summary["stages"]["detect"]["batch"]}
    # Tabular, outside the pipeline, was planned by proteus on a host no replica uses.
    assert plan.routing["tabular"]
    # The prediction simulated the pipeline end to end.
    path = plan.prediction["pipelines"]["video"]["paths"]["video"]
    assert path["queries"] > 0 and path["slo_violation_ratio"] < 0.05


@pytest.mark.parametrize("solver", ["sponge", "biscale"])
def test_vertical_plans_carry_the_in_place_scaling_bounds_to_the_desired_state(pipeline_fleet, solver):
    plan = _run({"solver": solver, "demand": {"detect": 120, "tabular": 20}})
    assert plan.status == "validated", plan.validation
    runtimes = {r["application"]: r for spec in plan.desired_states.values() for r in spec["runtimes"]}
    tabular = runtimes["tabular"]
    assert tabular["vertical"]["policy"] == "sponge" and set(tabular["vertical"]["model"]) == {"gamma1", "eps1", "delta1", "eta1"}
    assert tabular["vertical"]["min_cores"] <= tabular["cpu_threads"] <= tabular["vertical"]["max_cores"] <= 8
    if solver == "biscale":
        assert runtimes["detect"]["vertical"]["policy"] == "biscale" and runtimes["detect"]["vertical"]["reserve_ms"] > 0
    else:  # the pipeline is FA2's, at fixed sizes
        assert "vertical" not in runtimes["detect"]
    for host_name, spec in plan.desired_states.items():
        host_desired_state_validate(host=Host.objects.get(name=host_name), spec=spec)
    # Bad bounds are refused with the field named, and nothing else is lost.
    host_name, spec = next((h, s) for h, s in plan.desired_states.items() if any(r["application"] == "tabular" for r in s["runtimes"]))
    bad = {**spec, "runtimes": [{**r, "vertical": {**r["vertical"], "max_cores": 99}} if r["application"] == "tabular" else r
                                for r in spec["runtimes"]]}
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="max_cores <= the host's 8 cores"):
        host_desired_state_validate(host=Host.objects.get(name=host_name), spec=bad)
