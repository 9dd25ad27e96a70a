"""The plan diff learns MPS (issue 17): per GPU, the MPS mode before and after, partitions kept, destroyed
and created (by slot), and the duty cycles of kept partitions that change; runtimes of models on
partitions change when their round or turn does; the summary counts partition changes and says so. And the
plan page lists them in its Diff section and draws them before and after."""
from __future__ import annotations

import pytest

from apps.dashboard.plan_geometry import plan_geometry
from apps.deployments.models import HostDesiredState
from apps.planning.diff import plan_diff, plan_diff_summary_text
from apps.planning.models import Plan
from tests.factories import ApplicationFactory, GpuFactory, HostFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db


def _model(key: str, variant: int, application: str, *, duty: float | None, turn: float, batch: int = 8) -> dict:
    return {"key": key, "application": application, "variant": variant, "max_batch": batch, "duty_cycle_ms": duty,
            "turn_ms": turn, "batching": {"policy": "nexus"}}


@pytest.fixture
def mps_host():
    """node-mps: two RTX 2080 Ti in MPS mode; its last desired state (v1) has gpu0 split 60/40 with two
    models taking turns in the 60 % partition, and gpu1 one 100 % partition."""
    host = HostFactory(name="node-mps", status="online")
    for index in range(2):
        GpuFactory(host=host, index=index, model_name="RTX-2080Ti", memory_mb=11264, mig_capable=False, mig_enabled=False, mps_enabled=True)
    resnet, vgg = ModelVariantFactory(application=ApplicationFactory(name="app-a"), name="resnet50"), \
        ModelVariantFactory(application=ApplicationFactory(name="app-b"), name="vgg19")
    before = {
        "gpus": [{"index": 0, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps60@0", "mps40@1"]},
                 {"index": 1, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps100@0"]}],
        "runtimes": [_model("gpu0/mps60@0/0", resnet.pk, "app-a", duty=40.0, turn=15.0),
                     _model("gpu0/mps60@0/1", vgg.pk, "app-b", duty=40.0, turn=25.0),
                     _model("gpu0/mps40@1/0", vgg.pk, "app-b", duty=None, turn=30.0),
                     _model("gpu1/mps100@0/0", resnet.pk, "app-a", duty=None, turn=10.0)],
    }
    HostDesiredState.objects.create(host=host, version=1, spec=before)
    return {"host": host, "before": before, "resnet": resnet, "vgg": vgg}


def _after(mps_host) -> dict:
    """gpu0 keeps mps60@0 (a shorter round: vgg19's turn shrinks), mps40@1 becomes mps20@1 + mps20@2;
    gpu1 is unchanged."""
    resnet, vgg = mps_host["resnet"].pk, mps_host["vgg"].pk
    return {
        "gpus": [{"index": 0, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps60@0", "mps20@1", "mps20@2"]},
                 {"index": 1, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps100@0"]}],
        "runtimes": [_model("gpu0/mps60@0/0", resnet, "app-a", duty=30.0, turn=15.0),
                     _model("gpu0/mps60@0/1", vgg, "app-b", duty=30.0, turn=15.0),
                     _model("gpu0/mps20@1/0", vgg, "app-b", duty=None, turn=45.0),
                     _model("gpu0/mps20@2/0", resnet, "app-a", duty=None, turn=20.0),
                     _model("gpu1/mps100@0/0", resnet, "app-a", duty=None, turn=10.0)],
    }


def test_partition_changes_and_duty_cycles_are_in_the_diff(mps_host):
    plan = Plan.objects.create(status="validated")
    diff = plan_diff(plan=plan, desired_states={"node-mps": _after(mps_host)}, routing={})
    host = diff["hosts"]["node-mps"]
    assert set(host["gpus"]) == {"gpu0"}  # gpu1 is unchanged and not listed
    gpu0 = host["gpus"]["gpu0"]
    assert gpu0["mps_enabled"] == {"before": True, "after": True}
    assert gpu0["partitions"] == {"keep": ["mps60@0"], "destroy": ["mps40@1"], "create": ["mps20@1", "mps20@2"]}
    assert gpu0["duty_cycles"] == [{"partition": "mps60@0", "before": 40.0, "after": 30.0}]
    assert gpu0["create"] == gpu0["destroy"] == []  # no MIG change
    runtimes = host["runtimes"]
    assert [r["key"] for r in runtimes["added"]] == ["gpu0/mps20@1/0", "gpu0/mps20@2/0"]
    assert [r["key"] for r in runtimes["removed"]] == ["gpu0/mps40@1/0"]
    # Both models of the kept partition change: its round (both) and vgg19's turn.
    changed = {c["key"]: c for c in runtimes["changed"]}
    assert set(changed) == {"gpu0/mps60@0/0", "gpu0/mps60@0/1"}
    assert changed["gpu0/mps60@0/1"]["before"]["turn_ms"] == 25.0 and changed["gpu0/mps60@0/1"]["after"]["turn_ms"] == 15.0
    assert runtimes["kept"] == 1
    summary = diff["summary"]
    assert (summary["mps_created"], summary["mps_destroyed"], summary["mps_mode_changes"]) == (2, 1, 0)
    assert summary["changes"] == 2 + 1 + 2 + 1 + 2  # partitions created, destroyed; runtimes added, removed, changed
    text = plan_diff_summary_text(summary=summary)
    assert "2 MPS partitions created" in text and "1 MPS partitions destroyed" in text


def test_turning_mps_on_and_off_is_a_mode_change(mps_host):
    after = _after(mps_host)
    after["gpus"][1] = {"index": 1, "mig_enabled": False, "layout": []}  # gpu1 leaves MPS mode: a whole GPU
    after["runtimes"] = [r for r in after["runtimes"] if not r["key"].startswith("gpu1/")]
    after["runtimes"].append({"key": "gpu1", "application": "app-a", "variant": mps_host["resnet"].pk, "max_batch": 16,
                              "batching": {"policy": "proteus"}})
    diff = plan_diff(plan=Plan.objects.create(status="validated"), desired_states={"node-mps": after}, routing={})
    gpu1 = diff["hosts"]["node-mps"]["gpus"]["gpu1"]
    assert gpu1["mps_enabled"] == {"before": True, "after": False}
    assert gpu1["partitions"] == {"keep": [], "destroy": ["mps100@0"], "create": []}
    assert diff["summary"]["mps_mode_changes"] == 1 and "1 MPS mode changes" in plan_diff_summary_text(summary=diff["summary"])


def test_with_no_desired_state_the_baseline_is_the_gpus_as_they_are(mps_host):
    """Without a desired state the diff compares against the GPUs' recorded MPS partitions."""
    from apps.inventory.models import MpsPartition

    HostDesiredState.objects.all().delete()
    gpu0 = mps_host["host"].accelerators.get(index=0)
    for index, percent in enumerate((60, 40)):
        MpsPartition.objects.create(accelerator=gpu0, index=index, percent=percent)
    diff = plan_diff(plan=Plan.objects.create(status="validated"), desired_states={"node-mps": _after(mps_host)}, routing={})
    partitions = diff["hosts"]["node-mps"]["gpus"]["gpu0"]["partitions"]
    assert partitions == {"keep": ["mps60@0"], "destroy": ["mps40@1"], "create": ["mps20@1", "mps20@2"]}
    # gpu1 had no partition recorded: its one partition is created.
    assert diff["hosts"]["node-mps"]["gpus"]["gpu1"]["partitions"]["create"] == ["mps100@0"]


def test_the_plan_page_lists_and_draws_the_partition_changes(client, users, mps_host):
    after = _after(mps_host)
    diff = plan_diff(plan=Plan.objects.create(status="draft"), desired_states={"node-mps": after}, routing={})
    plan = Plan.objects.create(status="validated", desired_states={"node-mps": after}, diff=diff)
    geometry = plan_geometry(plan)
    gpu0, gpu1 = geometry.hosts[0].gpus
    assert gpu0.layout_changed and gpu0.partitions_created == ["mps20@1", "mps20@2"] and gpu0.partitions_destroyed == ["mps40@1"]
    assert gpu0.duty_cycle_changes == ["mps60@0 round 40 → 30 ms"]
    assert [p.slot for p in gpu0.before.partitions] == ["mps60@0", "mps40@1"]
    kept = gpu0.after.partitions[0]
    assert [r.key for r in kept.runtimes] == ["gpu0/mps60@0/0", "gpu0/mps60@0/1"] and kept.duty_cycle_ms == 30.0
    assert not gpu1.layout_changed and not gpu1.runtimes_changed
    client.force_login(users["viewer"])
    html = client.get(f"/plans/{plan.pk}/").content.decode()
    assert 'data-partition-destroyed="mps40@1"' in html and 'data-partition-created="mps20@2"' in html
    assert 'data-duty-cycle="mps60@0"' in html and "round 40 → 30 ms" in html
    assert '<g class="block partition destroyed" data-placement="mps40@1"' in html
    assert '<g class="block partition created" data-placement="mps20@1"' in html
    assert "MPS on" in html and "+2/−1 MPS" in html
