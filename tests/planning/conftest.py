"""Fleets for the plan-run tests: the demo fleet (as `tessera demo` seeds it, its hosts marked online as
their agents would) and a small hand-made one that builds in milliseconds."""
from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from apps.inventory.models import Host
from tests.factories import (
    ApplicationFactory,
    ArtifactFactory,
    CpuFactory,
    GpuFactory,
    GpuInstanceFactory,
    HostFactory,
    ModelVariantFactory,
    ProfileFactory,
    SloPolicyFactory,
)

DEMO_DEMAND = {"classify-resnet": 300.0, "classify-densenet": 200.0, "classify-vgg": 150.0, "classify-mobile": 400.0, "tabular-cpu": 100.0}


RECORDED_CPU_PROFILES = Path(__file__).with_name("demo_cpu_profiles.json")


def demo_cpu_measure_recorded(monkeypatch) -> None:
    """The demo seed reads its CPU models' latencies from a recording (demo_cpu_profiles.json) instead of timing
    them on this machine: what the plan-run tests check of a plan must not hang on how busy the machine was
    while the seed timed them. Timed under a loaded CI run the heavy classifier came out several times slower,
    FA2 sized the pipeline's replicas for that, and the predicted chain missed its SLO for 28 % of the queries
    (Poisson queueing at a service time close to the SLO; the measuring itself is tested in tests/test_demo.py)."""
    from controlplane import demo

    recorded = json.loads(RECORDED_CPU_PROFILES.read_text())["models"]
    names = {hashlib.sha256(m.onnx_bytes).hexdigest(): m.name
             for m in (*demo.demo_models_build(), demo.demo_calibrator_build(), *demo.demo_ensemble_members_build())}

    def measure(onnx_bytes: bytes, cores: int, batches: tuple[int, ...]) -> list[dict]:
        rows = recorded[names[hashlib.sha256(onnx_bytes).hexdigest()]][str(cores)]
        assert [r[0] for r in rows] == list(batches), "demo_cpu_profiles.json: record the demo's models again (new batch sizes)"
        return [{"batch": b, "p50": p50, "p99": p99, "runs": runs} for b, p50, p99, runs in rows]

    monkeypatch.setattr(demo, "_cpu_points_measure", measure)


@pytest.fixture
def demo_fleet(db, monkeypatch):
    from controlplane.demo import demo_seed

    demo_cpu_measure_recorded(monkeypatch)
    demo_seed()
    Host.objects.update(status="online")  # what the agents' first reports do


class SmallFleet:
    pass


@pytest.fixture
def small_fleet(db):
    """node-a (online): gpu0 an A100-40GB with MIG on (3g.20gb@0, 3g.20gb@4), gpu1 an A100-40GB with MIG
    off. node-cpu (online): cpu0 with 8 cores. node-maint (maintenance) and node-new (registered, its
    agent never reported) with one A100 each. Applications: classify (SLO 100 ms; variants small and big
    profiled on 3g.20gb and full), tabular (SLO 40 ms; mlp on CPUs, with an artifact), orphan (no SLO
    policy)."""
    f = SmallFleet()
    f.host = HostFactory(name="node-a", status="online")
    gpu0 = GpuFactory(host=f.host, index=0)
    GpuInstanceFactory(accelerator=gpu0, profile="3g.20gb", placement_start=0)
    GpuInstanceFactory(accelerator=gpu0, profile="3g.20gb", placement_start=4)
    GpuFactory(host=f.host, index=1, mig_enabled=False)
    f.cpu_host = HostFactory(name="node-cpu", status="online")
    CpuFactory(host=f.cpu_host, index=0, cpu_cores=8)
    f.maint = HostFactory(name="node-maint", status="maintenance")
    GpuFactory(host=f.maint, index=0, mig_enabled=False)
    f.new = HostFactory(name="node-new", status="registered")
    GpuFactory(host=f.new, index=0, mig_enabled=False)

    f.classify = ApplicationFactory(name="classify")
    SloPolicyFactory(application=f.classify, latency_p99_ms=100.0)
    f.small = ModelVariantFactory(application=f.classify, name="small", accuracy=0.70)
    f.big = ModelVariantFactory(application=f.classify, name="big", accuracy=0.76)
    for variant, base in ((f.small, 4.0), (f.big, 8.0)):
        for slice_, factor in (("3g.20gb", 1.0), ("full", 0.5)):
            for batch in (1, 8, 32):
                latency = base * factor * (1 + 0.5 * (batch - 1))
                ProfileFactory(variant=variant, slice=slice_, batch_size=batch, latency_p50_ms=latency, latency_p99_ms=latency * 1.2)
    f.tabular = ApplicationFactory(name="tabular")
    SloPolicyFactory(application=f.tabular, latency_p99_ms=40.0, drop_rule="slo-2x")
    f.mlp = ModelVariantFactory(application=f.tabular, name="mlp", accuracy=0.9, artifact=ArtifactFactory())
    f.mlp_bare = ModelVariantFactory(application=f.tabular, name="mlp-bare", accuracy=0.95)  # no artifact: not on CPUs
    for variant in (f.mlp, f.mlp_bare):
        for cores in (1, 4):
            for batch in (1, 8):
                ProfileFactory(variant=variant, device_type="cpu", slice="", cpu_cores=cores, batch_size=batch,
                               latency_p50_ms=2.0 * batch / cores, latency_p99_ms=2.5 * batch / cores)
    f.orphan = ApplicationFactory(name="orphan")
    ProfileFactory(variant=ModelVariantFactory(application=f.orphan, name="o1"), slice="3g.20gb")
    return f


@pytest.fixture
def fake_demand(monkeypatch):
    """Install a stand-in for apps.planning.demand (its contract: demand_for_planning(*, now=None) -> dict
    with "rps", "method" and details), whether or not the real module exists yet."""

    def install(rps: dict[str, float], method: str = "test", **details):
        module = types.ModuleType("apps.planning.demand")
        calls = []

        def demand_for_planning(*, now=None) -> dict:
            calls.append(now)
            return {"rps": dict(rps), "method": method, **details}

        module.demand_for_planning = demand_for_planning
        module.calls = calls
        monkeypatch.setitem(sys.modules, "apps.planning.demand", module)
        import apps.planning

        monkeypatch.setattr(apps.planning, "demand", module, raising=False)
        return module

    return install


@pytest.fixture
def validated_plan(db):
    """make(demand, **options) -> a Plan made by a manual plan run (10 s limit, the default planner unless
    `options` names a solver) for {application: rps}, checked valid."""
    from apps.jobs.services import job_execute
    from apps.planning.models import Plan
    from apps.planning.services import plan_run_execute, plan_run_start

    def make(demand: dict[str, float], **options: object) -> Plan:
        job = plan_run_start(trigger="manual", options={"time_limit_s": 10, "demand": demand, **options})
        job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
        plan = Plan.objects.get(job=job)
        assert plan.status == "validated", plan.validation
        return plan

    return make
