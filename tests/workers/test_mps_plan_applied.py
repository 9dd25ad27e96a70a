"""A gpulets plan for a fleet of non-MIG GPUs in MPS mode, from plan run to answered queries (issue 17's
"done when"): the demo's RTX 2080 Ti host alone in service, a real agent (simulated GPUs) serving its seeded
partitions; a plan run with the gpulets solver is solved, validated, simulated (the prediction) and
translated; approved and applied, the rollout writes the new desired state and the agent reorganises the
partitions (new ones ready before old ones stop) and reports them; the router then answers each
application from a model the plan put on a partition, and from nothing else."""
from __future__ import annotations

import threading

import httpx
import pytest

from apps.deployments.models import HostDesiredState, Runtime
from apps.inventory.models import Host, MpsPartition
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.jobs.services import job_execute
from apps.planning.models import Plan
from apps.planning.rollout import plan_apply, plan_approve
from apps.planning.services import plan_run_execute, plan_run_start
from apps.policies.models import SloPolicy
from apps.registry.models import Pipeline
from controlplane.demo import demo_seed
from engine.geometry.names import runtime_key_parse
from tests.waiting import wait_for
from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.client import ControlPlaneClient
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

MPS_HOST = "sim-2080ti-01"
DEMAND = {"classify-resnet": 120.0, "classify-densenet": 60.0, "classify-vgg": 80.0, "classify-mobile": 200.0}


@pytest.fixture
def mps_agent(live_server, tmp_path):
    """The demo with only its MPS host in service, and that host's agent running (in a thread)."""
    demo_seed(admin_password="Admin-demo-pass-1")
    Host.objects.exclude(name=MPS_HOST).update(status="maintenance")
    host = Host.objects.get(name=MPS_HOST)
    client = ControlPlaneClient(live_server.url, host_agent_token_rotate(host=host))
    backend = SimulatedBackend(gpus="2xRTX-2080Ti", state_file=tmp_path / "gpus.json", seed=7)
    agent = Agent(backend=backend, state_dir=tmp_path / MPS_HOST, client=client, metrics_s=0.5, drain_timeout_s=1.0)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    yield {"url": live_server.url, "agent": agent}
    agent.stop(stop_runtimes=True)
    thread.join(timeout=10)


def test_a_gpulets_plan_is_applied_by_the_agent_and_served(mps_agent) -> None:
    wait_for(lambda: Host.objects.get(name=MPS_HOST).converged_version == 1, 120, "the MPS host on the demo's placement")
    seeded = sorted(MpsPartition.objects.filter(accelerator__host__name=MPS_HOST).values_list("accelerator__index", "percent", "index"))

    # This test is about the MPS GPUs: without the demo's pipeline, which FA2 would otherwise plan at its
    # declared demand on the host's CPU (tests/planning/test_pipeline_plan.py covers that).
    Pipeline.objects.all().delete()
    # And without the idle floor of the applications it names no demand for (apps/planning/demand.py): the CPU
    # ones would be short on this host's one CPU, which proteus gives one instance.
    SloPolicy.objects.exclude(application__name__in=DEMAND).update(scale_to_zero=True)
    job = plan_run_start(trigger="manual", options={"solver": "gpulets", "demand": DEMAND, "time_limit_s": 10})
    if not Plan.objects.filter(job=job).exists():
        job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    plan = Plan.objects.get(job=job)
    # Solved by gpulets (the other hosts are in maintenance; the host's CPU, which the agent reports too,
    # has no profile of these applications, so it serves nothing), validated, simulated.
    assert plan.status == "validated", plan.validation
    assert plan.result["solver"].startswith("gpulets") and plan.shortfall == {}
    assert plan.prediction["queries"] > 0 and plan.prediction["slo_violation_ratio"] <= 0.05, plan.prediction
    assert set(plan.desired_states) == {MPS_HOST}
    spec = plan.desired_states[MPS_HOST]
    assert all(g["mps_enabled"] and not g["mig_enabled"] for g in spec["gpus"])
    assert spec["runtimes"] and all(runtime_key_parse(r["key"]).is_mps and r["turn_ms"] > 0 for r in spec["runtimes"])
    planned = sorted((g["index"], int(slot.split("@")[0][3:]), int(slot.split("@")[1])) for g in spec["gpus"] for slot in g.get("mps_layout") or [])
    assert planned != seeded  # the plan reorganises the partitions: the agent has work to do

    plan_approve(plan=plan, actor=None)
    rollout = plan_apply(plan=plan, actor=None, deadline_s=90)  # eager: runs to its end here, waiting on the agent
    plan.refresh_from_db()
    rollout.refresh_from_db()
    assert plan.status == "active", rollout.log + rollout.error
    host = Host.objects.get(name=MPS_HOST)
    latest = HostDesiredState.objects.filter(host=host).latest("version")
    assert latest.version == 2 and host.converged_version == 2
    # The agent reports the plan's partitions, ready, and one ready runtime per planned model (and no other).
    partitions = MpsPartition.objects.filter(accelerator__host=host)
    assert sorted(partitions.values_list("accelerator__index", "percent", "index")) == planned
    assert set(partitions.values_list("state", flat=True)) == {"ready"}
    wait_for(lambda: set(Runtime.objects.filter(host=host).values_list("key", flat=True)) == {r["key"] for r in spec["runtimes"]},
             30, "the old partitions' runtimes gone")
    assert set(Runtime.objects.filter(host=host).values_list("state", flat=True)) == {"ready"}

    # The router answers each application from a model the plan routes it to, on a partition.
    router, client = router_build(control_plane=mps_agent["url"], token=router_credential_issue(name=MPS_HOST)[1])
    handle = router_start_in_thread(router)
    try:
        wait_for(lambda: router.refreshes > 0, what="the router's first tables")
        body = {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}
        for application in DEMAND:
            routed = {r["instance"] for r in plan.routing[application]}
            assert routed and all(i.startswith(f"{MPS_HOST}/gpu") for i in routed)
            for _ in range(5):
                response = httpx.post(f"{handle.url}/v1/infer/{application}", json=body, timeout=10)
                assert response.status_code == 200, response.text
                answer = response.json()
                assert answer["parameters"]["instance"] in routed and answer["parameters"]["simulated"] is True
                assert answer["parameters"]["routing_version"] >= 2
    finally:
        handle.stop()
        client.close()
