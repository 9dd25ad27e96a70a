"""A plan run on the demo fleet, which has MPS GPUs (sim-2080ti-01, RTX 2080 Ti in MPS mode) beside MIG
GPUs and a CPU host: whichever solver is chosen, the plan covers both kinds (engine/solvers/mixed.py), is
validated, simulated (the prediction) and translated into desired states the control plane accepts: MPS
partitions with models time-sharing them in rounds on the MPS host, MIG instances on the others."""
from __future__ import annotations

import pytest

from apps.inventory.models import Host
from apps.jobs.services import job_execute
from apps.planning.models import Plan
from apps.planning.services import plan_run_execute, plan_run_start
from engine.geometry.names import runtime_key_parse

# Three times the demo's demand: more than the MIG GPUs serve at their best accuracy, so whichever order the
# composition keeps, both kinds serve. (At the demo's own demand the MIG GPUs serve everything at the same
# accuracy, and the composition rightly keeps the order that needs fewer GPUs: MPS idle.)
DEMAND = {"classify-resnet": 8100.0, "classify-densenet": 2700.0, "classify-vgg": 5400.0, "classify-mobile": 13500.0, "tabular-cpu": 150.0}


def _plan_run(solver: str) -> Plan:
    Host.objects.update(status="online")
    job = plan_run_start(trigger="manual", options={"solver": solver, "demand": DEMAND, "time_limit_s": 10})
    if not Plan.objects.filter(job=job).exists():  # outside a transactional test the on-commit task never ran
        job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    return Plan.objects.get(job=job)


@pytest.mark.django_db
# The demo's pipeline (tabular-chain) is planned as a whole by FA2 first, whichever solver plans the rest.
@pytest.mark.parametrize("solver, composed", [("gpulets", "fa2+gpulets+proteus"), ("proteus", "fa2+gpulets+proteus")])
def test_a_plan_run_on_the_demo_fleet_uses_its_mps_and_its_mig_gpus(demo_fleet, solver: str, composed: str) -> None:
    plan = _plan_run(solver)
    assert plan.status == "validated", plan.validation
    assert plan.solver == solver and plan.result["solver"] == composed  # what was asked for, what planned
    # Simulated before it is offered: the prediction replays the demand against the whole plan.
    assert plan.prediction["queries"] > 1000 and 0.0 <= plan.prediction["slo_violation_ratio"] <= 1.0
    mps = plan.desired_states["sim-2080ti-01"]
    layouts = [g["mps_layout"] for g in mps["gpus"] if g.get("mps_enabled")]
    assert layouts and all(all(slot.startswith("mps") for slot in layout) for layout in layouts)
    assert mps["runtimes"] and all(runtime_key_parse(r["key"]).is_mps for r in mps["runtimes"])
    assert all(r["turn_ms"] > 0 and r["batching"]["policy"] == "nexus" for r in mps["runtimes"])
    # The MIG hosts are planned too, not emptied.
    mig_runtimes = [r for host, spec in plan.desired_states.items() if host.startswith(("sim-a100", "sim-h100")) for r in spec["runtimes"]]
    assert mig_runtimes
    routed = {r["instance"] for routes in plan.routing.values() for r in routes}
    assert any(i.startswith("sim-2080ti-01/") for i in routed) and any(i.startswith(("sim-a100", "sim-h100")) for i in routed)
