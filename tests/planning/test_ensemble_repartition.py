"""Garrison's local re-partition through the control plane (issue 20; §3 item 7): when an ensemble's model
pool changes, a `garrison` plan run reconfigures only the instances it affects. The first plan runs (its
desired states written and its MIG instances there, as the agents report them); a member leaves the
pool; the second plan's diff against what runs, which the rollout carries out slot by slot, creates and
destroys no MIG instance and changes only the departed member's runtimes."""
from __future__ import annotations

import pytest

from apps.deployments.services import host_desired_state_set
from apps.inventory.models import GpuInstance, Host
from apps.jobs.services import job_execute
from apps.planning.models import Plan
from apps.planning.services import plan_run_execute, plan_run_start
from apps.policies.services import ensemble_policy_set
from engine.geometry.catalogue import mig_catalogue_load
from tests.factories import ApplicationFactory, GpuFactory, HostFactory, ModelVariantFactory, ProfileFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

MEMBERS = {"m0": (2.0, 0.10), "m1": (2.5, 0.12), "m2": (3.0, 0.20), "m3": (4.0, 0.30)}  # fixed ms, ms per row on one slice


@pytest.fixture
def ensemble_fleet(db):
    host = HostFactory(name="node-a", status="online")
    for index in range(2):
        GpuFactory(host=host, index=index)
    application = ApplicationFactory(name="defend")
    SloPolicyFactory(application=application, latency_p99_ms=100.0)
    spec = mig_catalogue_load().gpu_model_get("A100-SXM4-40GB")
    for name, (fixed, per_row) in MEMBERS.items():
        variant = ModelVariantFactory(application=application, name=name, accuracy=0.8)
        for profile in spec.profiles:
            if profile.media_extensions:
                continue
            for batch in (1, 8, 32, 64):
                latency = fixed + per_row * batch / profile.compute_slices
                ProfileFactory(variant=variant, slice=profile.name, batch_size=batch, latency_p50_ms=latency, latency_p99_ms=latency)
    ensemble_policy_set(application=application, data={"mode": "random", "members": {m: 0.25 for m in MEMBERS}, "min_size": 2, "max_size": 2})
    return {"host": host, "application": application}


def _plan() -> Plan:
    job = plan_run_start(trigger="manual", options={"solver": "garrison", "demand": {"defend": 50.0}, "time_limit_s": 10})
    job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    plan = Plan.objects.get(job=job)
    assert plan.status == "validated", plan.validation
    return plan


def _make_it_run(plan: Plan, host: Host) -> None:
    """What applying the plan leaves: the host's desired state, and its MIG instances as the agent reports them."""
    host_desired_state_set(host=host, spec=plan.desired_states[host.name], actor=None)
    GpuInstance.objects.filter(accelerator__host=host).delete()
    for gpu in plan.desired_states[host.name]["gpus"]:
        accelerator = host.accelerators.get(index=gpu["index"])
        for placement in gpu["layout"]:
            profile, start = placement.split("@")
            GpuInstance.objects.create(accelerator=accelerator, profile=profile, placement_start=int(start), state="ready")


def test_a_member_leaving_the_pool_changes_only_its_own_runtimes(ensemble_fleet) -> None:
    host = ensemble_fleet["host"]
    first = _plan()
    _make_it_run(first, host)
    runtimes_before = {r["key"]: r["variant"] for r in first.desired_states[host.name]["runtimes"]}
    departed = ensemble_fleet["application"].variants.get(name="m3")
    assert departed.pk in runtimes_before.values()
    ensemble_policy_set(application=ensemble_fleet["application"], data={"mode": "random", "members": {"m0": 1 / 3, "m1": 1 / 3, "m2": 1 / 3},
                                                                          "min_size": 2, "max_size": 2})
    second = _plan()
    assert any("keep serving where they run" in n for n in second.result["notes"]), second.result["notes"]
    summary = second.diff["summary"]
    # No MIG instance destroyed or created: the GPUs keep their layouts.
    assert summary["mig_created"] == 0 and summary["mig_destroyed"] == 0, summary
    runtimes_after = {r["key"]: r["variant"] for r in second.desired_states[host.name]["runtimes"]}
    changed = {k for k in runtimes_after if runtimes_before.get(k) != runtimes_after[k]}
    # Only the departed member's slots change hands; every other runtime keeps its slot and model.
    assert changed == {k for k, v in runtimes_before.items() if v == departed.pk}, (runtimes_before, runtimes_after)
    assert summary["runtimes_kept"] == len(runtimes_before) - len(changed)
