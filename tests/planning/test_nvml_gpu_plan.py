"""A MIG GPU the catalogue lacks is planned from the NVML profile table its agent reported: the snapshot
describes it in the problem's `gpu_models` (with a note saying so), the planners and the validator use it,
the desired state is checked against it, and `tessera mig export --plan` exports it, labelled."""
from __future__ import annotations

import pytest

from apps.inventory.models import GpuInstance
from apps.planning.mig_export import plan_mig_parted_export
from apps.planning.snapshot import fleet_problem_build
from engine.geometry.catalogue import NVML_ORIGIN_LABEL, mig_catalogue_load
from engine.geometry.layout import layout_parse, mig_layout_validate
from engine.plans.problem import problem_from_dict, problem_to_dict
from tests.factories import (
    ApplicationFactory,
    GpuFactory,
    HostFactory,
    ModelVariantFactory,
    ProfileFactory,
    SloPolicyFactory,
)

pytestmark = pytest.mark.django_db

A800 = "NVIDIA A800 40GB PCIe"
A800_TYPE = "A800 40GB PCIe"
TABLE = [
    {"name": p.name, "profile_id": p.profile_id, "memory_slices": p.memory_slices, "compute_slices": p.compute_slices,
     "memory_mb": p.memory_gb * 1000, "starts": list(p.starts), "max_count": p.max_count}
    for p in mig_catalogue_load().gpu_model_get("A100-SXM4-40GB").profiles
]


@pytest.fixture
def a800_fleet(db):
    host = HostFactory(name="node-a800", status="online")
    gpu = GpuFactory(host=host, index=0, model_name=A800, pci_device_id="0x20F610DE", nvml_profiles=TABLE)
    GpuInstance.objects.create(accelerator=gpu, profile="3g.20gb", placement_start=0)
    GpuInstance.objects.create(accelerator=gpu, profile="3g.20gb", placement_start=4)
    classify = ApplicationFactory(name="classify")
    SloPolicyFactory(application=classify, latency_p99_ms=100.0)
    variant = ModelVariantFactory(application=classify, name="small", accuracy=0.7)
    for slice_ in ("3g.20gb", "2g.10gb", "1g.5gb"):
        for batch in (1, 8):
            ProfileFactory(variant=variant, device_type=A800_TYPE, slice=slice_, batch_size=batch,
                           latency_p50_ms=4.0 * batch, latency_p99_ms=5.0 * batch)
    return host


def test_the_snapshot_describes_the_gpu_from_nvml(a800_fleet):
    snapshot = fleet_problem_build(demand={"classify": 100.0})
    problem = snapshot.problem
    (device,) = problem.devices
    assert (device.type, device.mig, device.layout) == (A800_TYPE, True, layout_parse("3g.20gb@0 3g.20gb@4"))
    (model,) = problem.gpu_models
    assert model.name == A800_TYPE and model.from_nvml and model.label == f"{A800_TYPE} ({NVML_ORIGIN_LABEL})"
    assert f"node-a800/gpu0: {A800_TYPE} ({NVML_ORIGIN_LABEL}): planned from the profile table NVML reports on it" in snapshot.notes
    # The stored form carries the model, so a stored problem reads back (and solves) on its own.
    again = problem_from_dict(problem_to_dict(problem))
    assert again.gpu_models == problem.gpu_models and again.devices == problem.devices


def test_a_plan_run_plans_validates_and_exports_it(a800_fleet, validated_plan):
    plan = validated_plan({"classify": 300.0})
    (gpu,) = plan.desired_states["node-a800"]["gpus"]
    model = plan.problem["gpu_models"][0]
    assert model["name"] == A800_TYPE
    assert gpu["mig_enabled"] and gpu["layout"]
    spec = a800_fleet.accelerators.get(index=0).gpu_model_planned
    assert mig_layout_validate(spec, gpu["layout"]).valid
    keys = {r["key"] for r in plan.desired_states["node-a800"]["runtimes"]}
    assert keys == {f"gpu0/{placement}" for placement in gpu["layout"]}
    export = plan_mig_parted_export(plan=plan)
    assert export.labels == {"node-a800": f"tessera-plan-{plan.pk}-node-a800"}
    assert f"# {A800_TYPE} ({NVML_ORIGIN_LABEL}): " in export.text
    assert "device-filter" not in export.text  # the catalogue knows no board of it to filter on


def test_a_stored_problem_with_a_catalogue_model_in_gpu_models_is_refused():
    from engine.plans.problem import ProblemError

    raw = {"applications": [{"name": "a", "slo_ms": 10, "demand_rps": 1}], "variants": [{"name": "v", "application": "a", "accuracy": 1}],
           "devices": [{"name": "d", "type": "A100-SXM4-40GB", "mig": True}], "profiles": [],
           "gpu_models": [{"name": "A100-SXM4-40GB", "memory_mib": 40960, "profiles": TABLE}]}
    with pytest.raises(ProblemError, match="the MIG catalogue has this model"):
        problem_from_dict(raw)
