"""MPS in the inventory (issue 17, gpulets): an accelerator's MPS mode and allowed partition sizes, MPS
partition records beside MIG instances (validated, audited, on the API), and the agent's report of them."""
import pytest

from apps.core.models import ObjectChange
from apps.inventory.models import Accelerator, MpsPartition
from engine.sharing.partitions import MPS_PARTITIONS_DEFAULT
from tests.factories import CpuFactory, GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

RTX = {"model_name": "RTX-2080Ti", "memory_mb": 11264, "mig_capable": False, "mig_enabled": False}


def mps_gpu(**over):
    return GpuFactory(**{**RTX, "mps_enabled": True, **over})


# --------------------------------------------------------------------------- the accelerator's mode


def test_accelerator_mps_fields_on_the_api(clients):
    host = HostFactory()
    op = clients["operator"]
    created = op.post("/api/v1/accelerators/", {"host": host.pk, "index": 0, "kind": "gpu", **RTX, "mps_enabled": True,
                                                "mps_partitions": [60, 20, 40]}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["mps_enabled"] is True and body["mps_partitions"] == [20, 40, 60] and body["mps_partitions_allowed"] == [20, 40, 60]
    cleared = op.patch(f"/api/v1/accelerators/{body['id']}/", {"mps_partitions": []}, format="json")
    assert cleared.status_code == 200 and cleared.json()["mps_partitions_allowed"] == list(MPS_PARTITIONS_DEFAULT)
    assert [a["id"] for a in op.get("/api/v1/accelerators/?mps_enabled=true").json()["results"]] == [body["id"]]
    change = ObjectChange.objects.filter(changed_object_type__model="accelerator", action="update").first()
    assert change.prechange_data["mps_partitions"] == [20, 40, 60] and change.postchange_data["mps_partitions"] == []


@pytest.mark.parametrize(
    "payload,field,needle",
    [
        ({**RTX, "model_name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "mig_capable": True, "mig_enabled": True,
          "mps_enabled": True}, "mps_enabled", "MIG and MPS cannot both be enabled"),
        ({**RTX, "mps_partitions": [0, 50]}, "mps_partitions", "greater than or equal to 1"),
        ({**RTX, "mps_partitions": [101]}, "mps_partitions", "less than or equal to 100"),
        ({**RTX, "mps_partitions": [50, 50]}, "mps_partitions", "listed twice"),
        ({**RTX, "mps_partitions": "50+50"}, "mps_partitions", "list"),
        ({"kind": "cpu", "model_name": "cpu", "cpu_cores": 8, "mps_enabled": True}, "mps_enabled", "CPU cannot use MPS"),
        ({"kind": "cpu", "model_name": "cpu", "cpu_cores": 8, "mps_partitions": [50]}, "mps_partitions", "CPU has no MPS"),
    ],
)
def test_accelerator_mps_invariants(clients, payload, field, needle):
    host = HostFactory()
    response = clients["operator"].post("/api/v1/accelerators/", {"host": host.pk, "index": 0, "kind": "gpu", **payload}, format="json")
    assert response.status_code == 400, response.content
    assert needle in str(response.json()["error"]["fields"][field])
    assert not Accelerator.objects.exists()


def test_mps_cannot_be_switched_off_or_narrowed_under_its_partitions(clients):
    gpu = mps_gpu()
    MpsPartition.objects.create(accelerator=gpu, percent=60, index=0)
    op = clients["operator"]
    off = op.patch(f"/api/v1/accelerators/{gpu.pk}/", {"mps_enabled": False}, format="json")
    assert off.status_code == 400 and "delete them before disabling MPS" in off.json()["error"]["message"]
    mig = op.patch(f"/api/v1/accelerators/{gpu.pk}/", {"mig_capable": True, "mig_enabled": True}, format="json")
    assert mig.status_code == 400
    narrow = op.patch(f"/api/v1/accelerators/{gpu.pk}/", {"mps_partitions": [20, 40]}, format="json")
    assert narrow.status_code == 400 and "60" in narrow.json()["error"]["fields"]["mps_partitions"][0]
    gpu.refresh_from_db()
    assert gpu.mps_enabled and gpu.mps_partitions == []


# --------------------------------------------------------------------------- partitions


def test_mps_partitions_crud_validated_and_audited(clients):
    gpu = mps_gpu()
    op = clients["operator"]
    first = op.post("/api/v1/mps-partitions/", {"accelerator": gpu.pk, "percent": 60, "index": 0}, format="json")
    assert first.status_code == 201, first.content
    assert first.json()["slot"] == "mps60@0" and first.json()["state"] == "pending" and first.json()["simulated"] is True
    second = op.post("/api/v1/mps-partitions/", {"accelerator": gpu.pk, "percent": 40, "index": 1}, format="json")
    assert second.status_code == 201, second.content
    assert [p["slot"] for p in op.get(f"/api/v1/mps-partitions/?host={gpu.host_id}").json()["results"]] == ["mps60@0", "mps40@1"]
    assert [p["slot"] for p in op.get("/api/v1/mps-partitions/?percent=40").json()["results"]] == ["mps40@1"]
    full = op.post("/api/v1/mps-partitions/", {"accelerator": gpu.pk, "percent": 20, "index": 2}, format="json")
    assert full.status_code == 400 and "add up to 120 %" in full.json()["error"]["message"]
    # Deleting the first would leave indices 1..1: refused; from the last one it works.
    refused = op.delete(f"/api/v1/mps-partitions/{first.json()['id']}/")
    assert refused.status_code == 400 and "mps40@1" in refused.json()["error"]["message"]
    assert op.delete(f"/api/v1/mps-partitions/{second.json()['id']}/").status_code == 204
    grow = op.patch(f"/api/v1/mps-partitions/{first.json()['id']}/", {"percent": 100}, format="json")
    assert grow.status_code == 200, grow.content
    actions = list(ObjectChange.objects.filter(changed_object_type__model="mpspartition").order_by("time", "id").values_list("action", flat=True))
    assert actions == ["create", "create", "delete", "update"]
    assert clients["viewer"].post("/api/v1/mps-partitions/", {"accelerator": gpu.pk, "percent": 20, "index": 1}, format="json").status_code == 403


@pytest.mark.parametrize(
    "existing,payload,field,needle",
    [
        ([], {"percent": 30, "index": 0}, "percent", "not a partition size"),
        ([], {"percent": 60, "index": 1}, "index", "indices must be 0..0"),
        ([(40, 0)], {"percent": 60, "index": 1}, "index", "largest first"),
        ([(60, 0)], {"percent": 50, "index": 1}, "index", "add up to 110 %"),
        ([(60, 0)], {"percent": 40, "index": 0}, "non_field_errors", "must make a unique set"),
        ([], {"percent": 0, "index": 0}, "percent", "greater than or equal to 1"),
    ],
)
def test_mps_partition_refused_changes_nothing(clients, existing, payload, field, needle):
    gpu = mps_gpu()
    for percent, index in existing:
        MpsPartition.objects.create(accelerator=gpu, percent=percent, index=index)
    before = ObjectChange.objects.count()
    response = clients["operator"].post("/api/v1/mps-partitions/", {"accelerator": gpu.pk, **payload}, format="json")
    assert response.status_code == 400, response.content
    assert needle in " ".join(response.json()["error"]["fields"][field])
    assert MpsPartition.objects.count() == len(existing) and ObjectChange.objects.count() == before


def test_mps_partition_needs_an_mps_gpu_and_its_allowed_sizes(clients):
    op = clients["operator"]
    whole = GpuFactory(**RTX)
    cpu = CpuFactory()
    mig = GpuFactory()
    narrow = mps_gpu(mps_partitions=[25, 75])
    for accelerator, needle in ((whole, "MPS is not enabled"), (cpu, "not CPUs"), (mig, "MPS is not enabled")):
        response = op.post("/api/v1/mps-partitions/", {"accelerator": accelerator.pk, "percent": 50, "index": 0}, format="json")
        assert response.status_code == 400 and needle in response.json()["error"]["message"]
    refused = op.post("/api/v1/mps-partitions/", {"accelerator": narrow.pk, "percent": 50, "index": 0}, format="json")
    assert refused.status_code == 400 and "allowed: 25, 75" in refused.json()["error"]["message"]
    assert op.post("/api/v1/mps-partitions/", {"accelerator": narrow.pk, "percent": 75, "index": 0}, format="json").status_code == 201
    other = mps_gpu()
    moved = op.patch(f"/api/v1/mps-partitions/{MpsPartition.objects.get().pk}/", {"accelerator": other.pk}, format="json")
    assert moved.status_code == 400 and "cannot move" in moved.json()["error"]["message"]


# --------------------------------------------------------------------------- the agent's report


def _report(**gpu):
    base = {"index": 0, "kind": "gpu", "uuid": "GPU-m-0", **RTX}
    return {"backend": "simulated", "agent_version": "0.1.0",
            "accelerators": [{**base, **gpu}, {"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 8}]}


def _layout():
    return list(MpsPartition.objects.order_by("index").values_list("percent", "index", "state"))


def test_agent_report_syncs_mps_partitions(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    post = lambda body: agent.post(f"/api/v1/hosts/{host.pk}/report/", body, format="json")  # noqa: E731
    first = post(_report(mps_enabled=True, mps_partitions=[{"percent": 40, "index": 1}, {"percent": 60, "index": 0, "state": "pending"}]))
    assert first.status_code == 200, first.content
    assert Accelerator.objects.get(kind="gpu").mps_enabled and _layout() == [(60, 0, "pending"), (40, 1, "ready")]
    kept = MpsPartition.objects.get(index=0).pk
    # 60+40 -> 60+20+20: the 60 stays (its state changes), the 40 goes, two 20s come.
    assert post(_report(mps_enabled=True, mps_partitions=[{"percent": 60, "index": 0}, {"percent": 20, "index": 1},
                                                           {"percent": 20, "index": 2}])).status_code == 200
    assert _layout() == [(60, 0, "ready"), (20, 1, "ready"), (20, 2, "ready")] and MpsPartition.objects.get(index=0).pk == kept
    before = ObjectChange.objects.count()
    assert post(_report(mps_enabled=True, mps_partitions=[{"percent": 60, "index": 0}, {"percent": 20, "index": 1},
                                                           {"percent": 20, "index": 2}])).status_code == 200
    assert ObjectChange.objects.count() == before, "an unchanged report is not a change"
    # A report that says nothing of MPS (an older agent) leaves the mode and the partitions alone.
    assert post(_report()).status_code == 200
    assert Accelerator.objects.get(kind="gpu").mps_enabled and len(_layout()) == 3
    # A new layout whose first partition differs: everything is replaced, every step a valid layout.
    assert post(_report(mps_enabled=True, mps_partitions=[{"percent": 50, "index": 0}, {"percent": 50, "index": 1}])).status_code == 200
    assert _layout() == [(50, 0, "ready"), (50, 1, "ready")]
    # MPS reported off: the partitions go with it.
    assert post(_report(mps_enabled=False)).status_code == 200
    assert not Accelerator.objects.get(kind="gpu").mps_enabled and _layout() == []
    change = ObjectChange.objects.filter(changed_object_type__model="mpspartition").first()
    assert change.action == "delete" and change.actor_kind == "agent"


def test_agent_report_of_mig_on_turns_mps_off(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    gpu = GpuFactory(host=host, index=0, uuid="GPU-m-0", mig_enabled=False, mps_enabled=True)
    MpsPartition.objects.create(accelerator=gpu, percent=100, index=0)
    report = {"backend": "nvml", "accelerators": [{"index": 0, "kind": "gpu", "uuid": "GPU-m-0", "model_name": "NVIDIA A100-SXM4-40GB",
                                                   "memory_mb": 40960, "mig_capable": True, "mig_enabled": True,
                                                   "instances": [{"profile": "7g.40gb", "start": 0}]}]}
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", report, format="json")
    assert response.status_code == 200, response.content
    gpu.refresh_from_db()
    assert gpu.mig_enabled and not gpu.mps_enabled and not MpsPartition.objects.exists()


def test_agent_report_during_a_reorganisation(agent_hosts):
    """gpulets §4.6: the agent starts the new partitions before it stops the old ones, and reports them
    all meanwhile. The stored partitions stay until every partition of the desired layout runs, then
    they are that layout."""
    from apps.deployments.services import host_desired_state_set

    (host, _), (agent, _) = agent_hosts
    post = lambda parts: agent.post(f"/api/v1/hosts/{host.pk}/report/", _report(mps_enabled=True, mps_partitions=parts), format="json")  # noqa: E731
    assert post([{"percent": 100, "index": 0}]).status_code == 200
    host_desired_state_set(host=host, spec={"gpus": [{"index": 0, "mig_enabled": False, "mps_enabled": True,
                                                      "mps_layout": ["mps50@0", "mps50@1"]}]})
    old = {"percent": 100, "index": 0}
    for during in ([old, {"percent": 50, "index": 0}], [old, {"percent": 50, "index": 1}]):
        response = post(during)
        assert response.status_code == 200, response.content
        assert _layout() == [(100, 0, "ready")]
    assert post([old, {"percent": 50, "index": 0}, {"percent": 50, "index": 1, "state": "pending"}]).status_code == 200
    assert _layout() == [(50, 0, "ready"), (50, 1, "pending")]
    assert post([{"percent": 50, "index": 0}, {"percent": 50, "index": 1}]).status_code == 200
    assert _layout() == [(50, 0, "ready"), (50, 1, "ready")]
    # Over 100 % without a repeated index (a new partition started at a new index first): a reorganisation too.
    assert post([{"percent": 50, "index": 0}, {"percent": 50, "index": 1}, {"percent": 20, "index": 2}]).status_code == 200
    assert _layout() == [(50, 0, "ready"), (50, 1, "ready")]


@pytest.mark.parametrize(
    "partitions",
    [
        [{"percent": 40, "index": 0}, {"percent": 60, "index": 1}],  # not largest first
        [{"percent": 60, "index": 1}],  # a gap: partition 0 failed to start, or is being replaced
    ],
)
def test_a_reported_layout_that_is_not_one_is_taken_as_transitional(agent_hosts, partitions):
    """The agent reports the partitions whose processes run: a gap or an order that is no layout by itself
    is a reorganisation under way or a partition that failed, not a reason to refuse the host's report."""
    (host, _), (agent, _) = agent_hosts
    accelerator = mps_gpu(host=host, index=0, uuid="GPU-m-0")
    MpsPartition.objects.create(accelerator=accelerator, percent=100, index=0)
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", _report(mps_enabled=True, mps_partitions=partitions), format="json")
    assert response.status_code == 200, response.content
    assert _layout() == [(100, 0, "pending")]
    host.refresh_from_db()
    assert host.status == "online"


@pytest.mark.parametrize(
    "gpu,needle",
    [
        ({"mps_enabled": True, "mps_partitions": [{"percent": 30, "index": 0}]}, "does not allow"),
        ({"mps_enabled": True, "mps_partitions": [{"percent": 60, "index": 0}, {"percent": 30, "index": 0}]}, "does not allow"),
        ({"mps_enabled": True, "mps_partitions": [{"percent": 60, "index": 0}, {"percent": 60, "index": 0}]}, "reported twice"),
        ({"mps_enabled": False, "mps_partitions": [{"percent": 60, "index": 0}]}, "without MPS enabled"),
        ({"mps_enabled": True, "mig_enabled": True, "mig_capable": True, "model_name": "NVIDIA A100-SXM4-40GB"}, "MIG and MPS"),
        ({"mps_enabled": True, "mps_partitions": [60, 40]}, "invalid"),
    ],
)
def test_invalid_mps_report_changes_nothing(agent_hosts, gpu, needle):
    (host, _), (agent, _) = agent_hosts
    accelerator = mps_gpu(host=host, index=0, uuid="GPU-m-0")
    MpsPartition.objects.create(accelerator=accelerator, percent=100, index=0)
    before = ObjectChange.objects.count()
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", _report(**gpu), format="json")
    assert response.status_code == 400, response.content
    assert needle in str(response.json()["error"])
    assert _layout() == [(100, 0, "pending")] and ObjectChange.objects.count() == before
    host.refresh_from_db()
    assert host.status == "registered" and host.accelerators.count() == 1
