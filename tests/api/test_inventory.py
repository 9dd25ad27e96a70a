import pytest

from apps.core.models import ObjectChange
from apps.inventory.models import Accelerator, GpuInstance
from tests.factories import CpuFactory, GpuFactory, GpuInstanceFactory, HostFactory

pytestmark = pytest.mark.django_db


def test_host_crud_and_filters(clients):
    op = clients["operator"]
    created = op.post("/api/v1/hosts/", {"name": "gpu-01", "labels": {"zone": "eu-1"}, "backend": "nvml"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "registered" and body["simulated"] is False and body["agent_token_set"] is False
    op.post("/api/v1/hosts/", {"name": "gpu-02", "labels": {"zone": "us-1"}, "backend": "simulated"}, format="json")
    assert [h["name"] for h in op.get("/api/v1/hosts/?label=zone=eu-1").json()["results"]] == ["gpu-01"]
    assert [h["name"] for h in op.get("/api/v1/hosts/?backend=simulated").json()["results"]] == ["gpu-02"]
    assert op.get("/api/v1/hosts/?limit=1").json()["count"] == 2


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"name": "bad name!"}, "name"),
        ({"name": "h1", "labels": {"zone": 3}}, "labels"),
        ({"name": "h1", "labels": ["zone"]}, "labels"),
        ({"name": "h1", "backend": "quantum"}, "backend"),
    ],
)
def test_host_bad_input_is_refused_and_stores_nothing(clients, payload, field):
    response = clients["operator"].post("/api/v1/hosts/", payload, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["fields"] and error["message"]
    assert not ObjectChange.objects.filter(changed_object_type__model="host").exists()


@pytest.mark.parametrize(
    "payload,field,needle",
    [
        ({"kind": "cpu", "model_name": "cpu"}, "cpu_cores", "cores"),
        ({"kind": "gpu", "model_name": "NVIDIA A100-SXM4-40GB", "memory_mb": 0}, "memory_mb", "memory"),
        ({"kind": "gpu", "model_name": "NVIDIA T4", "memory_mb": 16000, "mig_enabled": True}, "mig_enabled", "not MIG capable"),
        # MIG on a GPU the catalogue lacks needs the NVML profile table its agent reports (MIG off is fine).
        ({"kind": "gpu", "model_name": "NVIDIA A800 40GB PCIe", "memory_mb": 40960, "mig_capable": True, "mig_enabled": True},
         "model_name", "No MIG catalogue entry"),
    ],
)
def test_accelerator_invariants(clients, payload, field, needle):
    host = HostFactory()
    response = clients["operator"].post("/api/v1/accelerators/", {"host": host.pk, "index": 0, **payload}, format="json")
    assert response.status_code == 400
    assert needle in " ".join(response.json()["error"]["fields"][field])
    assert not Accelerator.objects.exists()


def test_accelerator_reports_catalogue_model_and_simulation(clients):
    gpu = GpuFactory(host=HostFactory(backend="simulated"))
    body = clients["viewer"].get(f"/api/v1/accelerators/{gpu.pk}/").json()
    assert body["gpu_model"] == "A100-SXM4-40GB" and body["simulated"] is True


def test_gpu_instance_placement_validated_against_the_catalogue(clients):
    gpu = GpuFactory()
    op = clients["operator"]
    ok = op.post("/api/v1/gpu-instances/", {"accelerator": gpu.pk, "profile": "3g.20gb", "placement_start": 4}, format="json")
    assert ok.status_code == 201, ok.content
    assert ok.json()["placement_size"] == 4 and ok.json()["placement"] == "3g.20gb@4"
    overlap = op.post("/api/v1/gpu-instances/", {"accelerator": gpu.pk, "profile": "2g.10gb", "placement_start": 4}, format="json")
    assert overlap.status_code == 400
    illegal = op.post("/api/v1/gpu-instances/", {"accelerator": gpu.pk, "profile": "2g.10gb", "placement_start": 1}, format="json")
    assert illegal.status_code == 400 and "legal" in illegal.json()["error"]["message"]
    unknown = op.post("/api/v1/gpu-instances/", {"accelerator": gpu.pk, "profile": "1g.18gb", "placement_start": 0}, format="json")
    assert unknown.status_code == 400 and "not a MIG profile" in unknown.json()["error"]["message"]
    fits = op.post("/api/v1/gpu-instances/", {"accelerator": gpu.pk, "profile": "4g.20gb", "placement_start": 0}, format="json")
    assert fits.status_code == 201
    assert sorted(GpuInstance.objects.values_list("profile", "placement_start")) == [("3g.20gb", 4), ("4g.20gb", 0)]


def test_gpu_instance_needs_mig_enabled_gpu(clients):
    whole = GpuFactory(mig_enabled=False)
    cpu = CpuFactory()
    for accelerator in (whole, cpu):
        response = clients["operator"].post(
            "/api/v1/gpu-instances/", {"accelerator": accelerator.pk, "profile": "1g.5gb", "placement_start": 0}, format="json"
        )
        assert response.status_code == 400
    assert not GpuInstance.objects.exists()


def test_gpu_model_catalogue(clients):
    models = clients["viewer"].get("/api/v1/gpu-models/").json()
    names = {m["name"] for m in models}
    assert {"A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H200-141GB"} <= names
    a100 = clients["viewer"].get("/api/v1/gpu-models/NVIDIA A100-SXM4-40GB/").json()
    profiles = {p["name"]: p for p in a100["profiles"]}
    assert profiles["3g.20gb"]["starts"] == [0, 4] and profiles["1g.5gb"]["max_count"] == 7
    assert clients["viewer"].get("/api/v1/gpu-models/B300/").status_code == 404


def _report(**gpu):
    base = {"index": 0, "kind": "gpu", "uuid": "GPU-r-0", "model_name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960,
            "mig_capable": True, "mig_enabled": True}
    return {"backend": "nvml", "agent_version": "0.1.0", "accelerators": [{**base, **gpu}, {"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 32}]}


def test_agent_report_syncs_devices_and_instances(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    first = _report(instances=[{"profile": "7g.40gb", "start": 0, "uuid": "MIG-1"}])
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", first, format="json").status_code == 200
    host.refresh_from_db()
    assert host.status == "online" and host.backend == "nvml" and host.last_seen and host.agent_version == "0.1.0"
    assert list(GpuInstance.objects.values_list("profile", "placement_start", "state")) == [("7g.40gb", 0, "ready")]
    # Re-geometry: the 7g goes, two 3g come; the report order must not matter.
    second = _report(instances=[{"profile": "3g.20gb", "start": 4}, {"profile": "3g.20gb", "start": 0}])
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", second, format="json").status_code == 200
    assert sorted(GpuInstance.objects.values_list("profile", "placement_start")) == [("3g.20gb", 0), ("3g.20gb", 4)]
    changes_before = ObjectChange.objects.count()
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", second, format="json").status_code == 200
    assert ObjectChange.objects.count() == changes_before, "an unchanged report is not a change"
    change = ObjectChange.objects.filter(changed_object_type__model="gpuinstance").first()
    assert change.actor_kind == "agent" and change.actor_name == f"agent:{host.name}"


@pytest.mark.parametrize(
    "instances,needle",
    [
        ([{"profile": "4g.20gb", "start": 0}, {"profile": "3g.20gb", "start": 0}], "Two instances"),
        ([{"profile": "4g.20gb", "start": 0}, {"profile": "2g.10gb", "start": 2}], "invalid"),
        ([{"profile": "2g.10gb", "start": 1}], "invalid"),
        ([{"profile": "banana", "start": 0}], "invalid"),
    ],
)
def test_invalid_report_changes_nothing(agent_hosts, instances, needle):
    (host, _), (agent, _) = agent_hosts
    GpuInstanceFactory(accelerator=GpuFactory(host=host, index=0, uuid="GPU-r-0"), profile="7g.40gb", placement_start=0)
    changes_before = ObjectChange.objects.count()
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", _report(instances=instances), format="json")
    assert response.status_code == 400
    assert needle in response.json()["error"]["message"]
    assert list(GpuInstance.objects.values_list("profile", "placement_start")) == [("7g.40gb", 0)]
    assert host.accelerators.count() == 1 and ObjectChange.objects.count() == changes_before
    host.refresh_from_db()
    assert host.status == "registered"


def test_malformed_report(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", {"backend": "nvml", "accelerators": "lots"}, format="json")
    assert response.status_code == 400 and "accelerators" in response.json()["error"]["fields"]
