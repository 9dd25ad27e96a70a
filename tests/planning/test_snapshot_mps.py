"""MPS in the planning snapshot and the plan-run options (issue 17, gpulets): GPUs in MPS mode become MPS
devices with their layout and what their partitions run, MPS profiles carry their utilisations, the
interference model is fitted to the stored co-runs, and a run may choose the MPS planners."""
from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

from apps.deployments.services import host_desired_state_set
from apps.inventory.models import MpsPartition
from apps.planning.services import PLAN_RUN_SOLVERS, plan_run_options_clean
from apps.planning.snapshot import fleet_problem_build
from apps.registry.services.gpulet import gpulet_import
from engine.plans.validate import plan_validate
from engine.reference.profiles import (
    GPULET_GPU_MODEL,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
)
from engine.sharing.interference import INTERFERENCE_FORM_DEFAULT, interference_model_fit, interference_samples_build
from engine.solvers.registry import planner_names
from engine.solvers.solve import plan_solve
from tests.factories import (
    ApplicationFactory,
    GpuFactory,
    GpuInstanceFactory,
    HostFactory,
    ModelVariantFactory,
    ProfileFactory,
    SloPolicyFactory,
)

pytestmark = pytest.mark.django_db

RTX = {"model_name": "RTX-2080Ti", "memory_mb": 11264, "mig_capable": False, "mig_enabled": False}


class MpsFleet:
    pass


@pytest.fixture
def mps_fleet(db):
    """node-mps (online): gpu0 in MPS mode with partitions 60 % + 40 % (sizes 40, 60, 100 allowed), gpu1 in
    MPS mode without partition records (its desired state has mps100@0), gpu2 in MPS mode with neither.
    node-mig (online): an A100 with MIG on. `classify` (SLO 100 ms): vgg19 and resnet50 profiled on
    RTX-2080Ti mps40/60/100 (with utilisations) and on the A100's 3g.20gb (and, never planned there,
    mps100)."""
    f = MpsFleet()
    f.host = HostFactory(name="node-mps", status="online")
    f.gpu0 = GpuFactory(host=f.host, index=0, **RTX, mps_enabled=True, mps_partitions=[40, 60, 100])
    MpsPartition.objects.create(accelerator=f.gpu0, percent=60, index=0, state="ready")
    MpsPartition.objects.create(accelerator=f.gpu0, percent=40, index=1, state="ready")
    f.gpu1 = GpuFactory(host=f.host, index=1, **RTX, mps_enabled=True)
    f.gpu2 = GpuFactory(host=f.host, index=2, **RTX, mps_enabled=True)
    f.mig_host = HostFactory(name="node-mig", status="online")
    GpuInstanceFactory(accelerator=GpuFactory(host=f.mig_host, index=0), profile="3g.20gb", placement_start=4)
    f.classify = ApplicationFactory(name="classify")
    SloPolicyFactory(application=f.classify, latency_p99_ms=100.0)
    f.vgg = ModelVariantFactory(application=f.classify, name="vgg19", accuracy=0.72)
    f.resnet = ModelVariantFactory(application=f.classify, name="resnet50", accuracy=0.76)
    for variant, base in ((f.vgg, 6.0), (f.resnet, 3.0)):
        for percent in (40, 60, 100):
            for batch in (1, 8):
                latency = base * batch * 100 / percent
                ProfileFactory(variant=variant, device_type="RTX-2080Ti", slice=f"mps{percent}", batch_size=batch, latency_p50_ms=latency,
                               latency_p99_ms=latency, l2_util_pct=percent / 4 + batch, dram_util_pct=percent / 5 + batch)
        ProfileFactory(variant=variant, slice="3g.20gb", batch_size=1, latency_p50_ms=base, latency_p99_ms=base)
        ProfileFactory(variant=variant, slice="mps100", batch_size=1, latency_p50_ms=base, latency_p99_ms=base)
    host_desired_state_set(host=f.host, spec={
        "gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps100@0"]}],
        "runtimes": [
            {"key": "gpu0/mps60@0/0", "application": "classify", "variant": f.vgg.pk, "max_batch": 8, "batching": {"policy": "proteus"},
             "duty_cycle_ms": 50},
            {"key": "gpu0/mps60@0/1", "application": "classify", "variant": f.resnet.pk, "max_batch": 8, "batching": {"policy": "proteus"},
             "duty_cycle_ms": 50},
            {"key": "gpu1/mps100@0/0", "application": "classify", "variant": f.resnet.pk, "max_batch": 8, "batching": {"policy": "proteus"}},
        ],
    })
    return f


def test_mps_gpus_become_mps_devices(mps_fleet):
    snapshot = fleet_problem_build(demand={"classify": 100.0})
    problem = snapshot.problem
    gpu0, gpu1, gpu2 = (problem.device(f"node-mps/gpu{i}") for i in range(3))
    assert gpu0.mps and not gpu0.mig and gpu0.type == "RTX-2080Ti" and gpu0.memory_mb == 11264
    assert gpu0.mps_partitions == (40, 60, 100) and gpu0.mps_layout == (60, 40)
    assert gpu0.running == (("mps60@0", "classify/resnet50"), ("mps60@0", "classify/vgg19"))
    assert gpu1.mps_layout == (100,) and gpu1.running == (("mps100@0", "classify/resnet50"),)  # from the desired state
    assert gpu1.mps_partitions == (20, 40, 50, 60, 80, 100)  # the engine's default
    assert gpu2.mps and gpu2.mps_layout is None and gpu2.running == ()
    mig = problem.device("node-mig/gpu0")
    assert mig.mig and not mig.mps
    points = {(p.variant, p.device_type, p.slice, p.batch): p for p in problem.profiles}
    point = points[("classify/vgg19", "RTX-2080Ti", "mps60", 8)]
    assert (point.l2_util_pct, point.dram_util_pct) == (23.0, 20.0)
    # MPS points only for the types of MPS GPUs: the A100 here has MIG only.
    assert not any(p.device_type == "A100-SXM4-40GB" and p.slice.startswith("mps") for p in problem.profiles)
    assert problem.interference is None and not any("interference" in n for n in snapshot.notes)


def test_mps_device_whose_desired_layout_no_longer_fits(mps_fleet):
    f = mps_fleet
    f.gpu1.mps_partitions = [40, 60]
    f.gpu1.save()
    snapshot = fleet_problem_build(demand={"classify": 10.0})
    assert snapshot.problem.device("node-mps/gpu1").mps_layout is None
    assert any("node-mps/gpu1: the MPS layout of its latest desired state is not valid" in n for n in snapshot.notes)


def test_mps_planner_solves_the_snapshot(mps_fleet):
    problem = fleet_problem_build(demand={"classify": 150.0}).problem
    plan = plan_solve(problem, "gpulets")
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.problems
    assert plan.instances and all(i.device.startswith("node-mps/") and i.slice.startswith("mps") for i in plan.instances)
    assert plan.total_served_rps == pytest.approx(150.0)


def test_interference_is_fitted_to_the_stored_coruns():
    application = ApplicationFactory(name="gpulet")
    SloPolicyFactory(application=application, latency_p99_ms=200.0)
    for name in sorted({p.model for p in gpulet_inference_read()}):
        ModelVariantFactory(application=application, name=name, accuracy=0.7)
    gpulet_import()
    host = HostFactory(name="node-rtx", status="online")
    GpuFactory(host=host, index=0, **RTX, mps_enabled=True)
    snapshot = fleet_problem_build(demand={"gpulet": 100.0})
    # The same model as fitted straight from the CSVs: the database keeps every number the fit needs.
    build = interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read())
    expected = interference_model_fit(build.samples, form=INTERFERENCE_FORM_DEFAULT)
    interference = snapshot.problem.interference
    assert interference.form == INTERFERENCE_FORM_DEFAULT
    assert interference.coefficients == pytest.approx(expected.coefficients, rel=1e-9, abs=1e-12)
    assert f"interference model ({INTERFERENCE_FORM_DEFAULT}) fitted to 3675 co-run samples on {GPULET_GPU_MODEL}" in snapshot.notes
    utilised = [p for p in snapshot.problem.profiles if p.slice == "mps60"]
    assert utilised and all(p.l2_util_pct is not None and p.dram_util_pct is not None for p in utilised)
    plan = plan_solve(snapshot.problem, "gpulets")
    assert not any("no interference model" in n for n in plan.notes), plan.notes
    assert plan_validate(snapshot.problem, plan).valid


def test_unjoinable_coruns_are_said_and_not_fitted(mps_fleet):
    from apps.registry.models import CorunMeasurement

    f = mps_fleet
    CorunMeasurement.objects.create(variant=f.vgg, corunner=f.resnet, device_type="RTX-2080Ti", batch=2, partition_pct=60,
                                    corunner_batch=1, latency_ms=20.0)
    snapshot = fleet_problem_build(demand={"classify": 10.0})
    assert snapshot.problem.interference is None
    assert any("1 co-run measurements on RTX-2080Ti, none joined" in n and "no solo latency of the model" in n for n in snapshot.notes)


# --------------------------------------------------------------------------- the solver option


def test_plan_run_options_take_the_mps_planners():
    assert PLAN_RUN_SOLVERS == planner_names("fleet", "mps", "pipeline", "vertical")
    assert not set(PLAN_RUN_SOLVERS) & set(planner_names("baseline"))  # the evaluation baselines are for simulation
    for solver in planner_names("mps", "pipeline", "vertical"):
        assert plan_run_options_clean({"solver": solver})["solver"] == solver
    for bad in ("gpulet", ["gpulets"], 3):
        with pytest.raises(ValidationError) as caught:
            plan_run_options_clean({"solver": bad})
        assert "gpulets, sbp, best-fit, ideal" in str(caught.value)


def test_plan_run_api_and_schema_list_the_mps_planners(clients, small_fleet):
    response = clients["operator"].post("/api/v1/plan-runs/", {"solver": "best-fit", "demand": {"classify": 10}}, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["params"]["options"]["solver"] == "best-fit"
    refused = clients["operator"].post("/api/v1/plan-runs/", {"solver": "gpulet"}, format="json")
    assert refused.status_code == 400 and "solver" in refused.json()["error"]["fields"]
    schema = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    assert schema["components"]["schemas"]["SolverEnum"]["enum"] == list(PLAN_RUN_SOLVERS)
