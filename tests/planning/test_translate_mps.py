"""A gpulets plan translated into what an MPS host runs (issue 17): one runtime per model time-sharing a
partition (`gpu0/mps60@0/1`), the partition's percent and duty cycle on each, the GPU's `mps_layout`, routes
to each model's instance, and a desired state the deployments service accepts."""
from __future__ import annotations

import pytest

from apps.deployments.services import host_desired_state_set
from apps.planning.snapshot import fleet_problem_build
from apps.planning.translate import plan_translate, runtime_key
from apps.registry.services.gpulet import gpulet_import
from engine.geometry.names import runtime_key_parse
from engine.plans.validate import plan_validate
from engine.solvers.solve import plan_solve
from tests.factories import ApplicationFactory, GpuFactory, HostFactory, ModelVariantFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

MODELS = {"resnet50": 108.0, "mobilenet": 64.0, "inception": 66.0, "vgg19": 142.0}


@pytest.fixture
def gpulet_fleet(db):
    host = HostFactory(name="node-mps", status="online")
    for index in range(2):
        GpuFactory(host=host, index=index, model_name="RTX-2080Ti", memory_mb=11264, mig_capable=False, mig_enabled=False, mps_enabled=True)
    for model, slo in MODELS.items():
        app = ApplicationFactory(name=f"app-{model}")
        SloPolicyFactory(application=app, latency_p99_ms=slo)
        ModelVariantFactory(application=app, name=model, accuracy=0.7)
    gpulet_import()
    return host


def test_runtime_keys_of_mps_models():
    device = {"kind": "gpu", "index": 1}
    assert runtime_key(device=device, slice_name="mps60", start=0, slot=2) == "gpu1/mps60@0/2"
    assert runtime_key(device=device, slice_name="3g.20gb", start=4) == "gpu1/3g.20gb@4"
    assert runtime_key(device=device, slice_name="full", start=None) == "gpu1"


def test_a_gpulets_plan_becomes_mps_partitions_the_deployments_service_accepts(gpulet_fleet):
    snapshot = fleet_problem_build(demand={f"app-{m}": 150.0 for m in MODELS})
    problem = snapshot.problem
    assert problem is not None and problem.interference is not None
    plan = plan_solve(problem, "gpulets")
    assert plan.status == "feasible" and plan_validate(problem, plan).valid
    translation = plan_translate(problem=problem, engine_plan=plan, devices=snapshot.devices, variant_ids=snapshot.variant_ids)
    assert translation.problems == []
    spec = translation.desired_states["node-mps"]
    used = {g["index"]: g for g in spec["gpus"] if g.get("mps_layout")}
    assert used and all(g["mps_enabled"] and not g["mig_enabled"] for g in used.values())
    runtimes = spec["runtimes"]
    assert len(runtimes) == len(plan.instances)
    by_partition: dict[str, list[dict]] = {}
    for runtime in runtimes:
        rk = runtime_key_parse(runtime["key"])
        assert rk.slot is not None and runtime["placement"] in used[rk.index]["mps_layout"]
        assert runtime["mps_percent"] == rk.mps_percent and runtime["batching"]["policy"] == "nexus"
        by_partition.setdefault(rk.partition_key, []).append(runtime)
    for models in by_partition.values():
        assert sorted(runtime_key_parse(r["key"]).slot for r in models) == list(range(len(models)))
        assert len({r["duty_cycle_ms"] for r in models}) == 1
        # Each model's turn in the round is the plan's latency of its batch there; the turns fit the round.
        assert all(r["turn_ms"] > 0 for r in models)
        if models[0]["duty_cycle_ms"] is not None:
            assert sum(r["turn_ms"] for r in models) <= models[0]["duty_cycle_ms"] + 1e-6
    # Every application is routed to its own model's instances on this host.
    for app, routes in translation.routing.items():
        assert routes and abs(sum(r["weight"] for r in routes) - 1.0) < 1e-9
        for route in routes:
            key = route["instance"].split("/", 1)[1]
            runtime = next(r for r in runtimes if r["key"] == key)
            assert runtime["application"] == app and runtime["variant"] == route["variant"]
    # What applying writes: the service stores it, with each model's profile on its partition.
    stored = host_desired_state_set(host=gpulet_fleet, spec=spec)
    assert {r["key"] for r in stored.spec["runtimes"]} == {r["key"] for r in runtimes}
    assert all(r["profile"] for r in stored.spec["runtimes"])
