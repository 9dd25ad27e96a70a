"""An agent reports each GPU's PCI device id and, while MIG is on, NVML's profile table: stored, so that a
GPU the MIG catalogue lacks is known by its table (its instances validated against it) and planned from it,
labelled "from NVML, not in the catalogue"; placements past memory slice 7 (RTX PRO 6000's twelve units)
are accepted."""
from __future__ import annotations

import pytest

from apps.inventory.models import Accelerator, GpuInstance
from engine.geometry.catalogue import NVML_ORIGIN_LABEL, mig_catalogue_load

pytestmark = pytest.mark.django_db

# The A100-40GB's table, as NVML reports it on an A800 40GB PCIe (a board the catalogue leaves out).
A800_PROFILES = [
    {"name": p.name, "profile_id": p.profile_id, "memory_slices": p.memory_slices, "compute_slices": p.compute_slices,
     "memory_mb": p.memory_gb * 1000, "starts": list(p.starts), "max_count": p.max_count}
    for p in mig_catalogue_load().gpu_model_get("A100-SXM4-40GB").profiles
]


def _report(**gpu):
    return {"backend": "nvml", "agent_version": "0.1.0", "accelerators": [
        {"index": 0, "kind": "gpu", "uuid": "GPU-n-0", "memory_mb": 40960, "mig_capable": True, "mig_enabled": True, **gpu},
    ]}


def test_a_gpu_the_catalogue_lacks_is_kept_with_its_nvml_table(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    report = _report(model_name="NVIDIA A800 40GB PCIe", pci_device_id="0x20F610DE", nvml_profiles=A800_PROFILES,
                     instances=[{"profile": "3g.20gb", "start": 4}, {"profile": "2g.10gb", "start": 0}])
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", report, format="json")
    assert response.status_code == 200, response.content
    gpu = Accelerator.objects.get(host=host, kind="gpu")
    assert gpu.pci_device_id == "0x20F610DE" and gpu.gpu_model is None
    model = gpu.gpu_model_planned
    assert model.origin == "nvml" and model.label == f"A800 40GB PCIe ({NVML_ORIGIN_LABEL})"
    assert model.nvml_names == ("A800 40GB PCIe", "NVIDIA A800 40GB PCIe")
    assert sorted(GpuInstance.objects.filter(accelerator=gpu).values_list("profile", "placement_start", "placement_size")) == [
        ("2g.10gb", 0, 2), ("3g.20gb", 4, 4)]
    # Its instances are checked against NVML's table like any other GPU's against the catalogue.
    bad = _report(model_name="NVIDIA A800 40GB PCIe", nvml_profiles=A800_PROFILES, instances=[{"profile": "3g.20gb", "start": 2}])
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", bad, format="json").status_code == 400


def test_mig_on_a_gpu_neither_the_catalogue_nor_nvml_describes_is_refused(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", _report(model_name="NVIDIA A800 40GB PCIe"), format="json")
    assert response.status_code == 400
    assert "no NVML profile table" in response.content.decode()


def test_the_pci_device_id_finds_a_catalogue_model_and_twelve_placement_units_are_accepted(agent_hosts):
    (host, _), (agent, _) = agent_hosts
    report = _report(model_name="NVIDIA RTX PRO 6000 Blackwell Server Edition (new driver name)", pci_device_id="0x2BB510DE",
                     memory_mb=97887, instances=[{"profile": "1g.24gb-me", "start": 9}, {"profile": "1g.24gb+me.all", "start": 0}])
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", report, format="json")
    assert response.status_code == 200, response.content
    gpu = Accelerator.objects.get(host=host, kind="gpu")
    assert gpu.gpu_model.name == "RTX-PRO-6000-Blackwell-96GB"
    assert sorted(GpuInstance.objects.values_list("profile", "placement_start", "placement_size")) == [
        ("1g.24gb+me.all", 0, 3), ("1g.24gb-me", 9, 3)]


@pytest.mark.parametrize("gpu", [
    {"pci_device_id": "20F610DE"},
    {"nvml_profiles": [{**A800_PROFILES[0], "name": "one g"}]},
    {"nvml_profiles": [{**A800_PROFILES[0], "starts": [64]}]},
])
def test_malformed_nvml_reports(agent_hosts, gpu):
    (host, _), (agent, _) = agent_hosts
    report = _report(model_name="NVIDIA A100-SXM4-40GB", **gpu)
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", report, format="json").status_code == 400
    assert not Accelerator.objects.filter(host=host).exists()


def test_the_gpu_models_api_cites_sources_and_boards(clients):
    rtx = clients["viewer"].get("/api/v1/gpu-models/RTX-PRO-6000-Blackwell-96GB/").json()
    assert rtx["pci_device_ids"] == ["0x2BB510DE", "0x2BB110DE", "0x2BB410DE"]
    assert "Supported MIG Profiles" in rtx["source"]["profiles"] and (rtx["memory_slices"], rtx["compute_slices"]) == (12, 4)
    every = {p["name"]: p for p in rtx["profiles"]}["1g.24gb+me.all"]
    assert (every["profile_id"], every["attributes"], every["starts"]) == (65, ["me.all"], [0, 3, 6, 9])
    assert {p["name"]: p for p in rtx["profiles"]}["1g.24gb-me"]["lacks"] == ["me"]
    gb200 = clients["viewer"].get("/api/v1/gpu-models/NVIDIA GB200/").json()
    assert {p["name"]: p["aliases"] for p in gb200["profiles"]}["7g.186gb"] == ["7g.189gb"]
    rtx5000 = clients["viewer"].get("/api/v1/gpu-models/RTX-PRO-5000-Blackwell-48GB/").json()
    assert {p["profile_id"] for p in rtx5000["profiles"]} == {None}
