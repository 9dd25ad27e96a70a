"""The NVML backend against the MIG catalogue on the fake pynvml: per-model profile ids and names (A30's
quarters, RTX PRO 6000's twelve placement units and +me.all/-me/+gfx, early GB200 names), the model found
by the board's PCI device id, every disagreement reported, and a GPU the catalogue lacks described and
driven from NVML's own profile table."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.geometry.catalogue import NVML_ORIGIN_LABEL, mig_catalogue_load
from engine.geometry.layout import layout_parse, mig_layout_validate
from workers.agent.backends import gpu_model_of
from workers.agent.backends.nvml import NvmlBackend

from .fake_pynvml import FakeGpu, FakeNvml

CATALOGUE = mig_catalogue_load()


def _backend(*gpus: FakeGpu) -> NvmlBackend:
    return NvmlBackend(nvml=FakeNvml(list(gpus)))


@pytest.mark.parametrize("model_name", ["A30-24GB", "RTX-PRO-6000-Blackwell-96GB", "H100-94GB", "GB200-186GB", "B300-269GB"])
def test_catalogue_gpus_agree_with_their_nvml_tables(model_name):
    backend = _backend(FakeGpu(model_name, mig_enabled=True))
    (gpu,) = backend.gpus()
    spec = CATALOGUE.gpu_model_get(model_name)
    assert gpu.pci_device_id == f"0x{spec.pci_device_ids[0]:08X}"
    assert gpu_model_of(gpu) is spec
    assert {p["name"]: (p["profile_id"], p["memory_slices"], tuple(p["starts"]), p["max_count"]) for p in gpu.nvml_profiles} == {
        p.name: (p.profile_id, p.memory_slices, p.starts, p.max_count) for p in spec.profiles
    }
    assert backend.catalogue_disagreements() == []


def test_a30_and_rtx_pro_instances_are_created_where_the_planner_puts_them():
    backend = _backend(FakeGpu("A30-24GB", mig_enabled=True), FakeGpu("RTX-PRO-6000-Blackwell-96GB", mig_enabled=True))
    for placement in ("2g.12gb+me@0", "1g.6gb@2", "1g.6gb@3"):
        backend.mig_instance_create(0, placement)
    for placement in ("1g.24gb+me.all@0", "1g.24gb-me@3", "2g.48gb-me@6"):
        backend.mig_instance_create(1, placement)
    a30, rtx = backend.gpus()
    assert a30.layout == layout_parse("2g.12gb+me@0 1g.6gb@2 1g.6gb@3")
    assert rtx.layout == layout_parse("1g.24gb+me.all@0 1g.24gb-me@3 2g.48gb-me@6")
    assert mig_layout_validate("RTX-PRO-6000-Blackwell-96GB", rtx.layout).valid


def test_every_kind_of_disagreement_is_reported():
    a30 = CATALOGUE.gpu_model_get("A30-24GB")
    # Hardware whose 1g.6gb has another id and instance count than the catalogue says.
    odd = replace(a30, profiles=tuple(replace(p, profile_id=99, max_count=3) if p.name == "1g.6gb" else p for p in a30.profiles))
    backend = _backend(FakeGpu("NVIDIA A30", mig_enabled=True, spec=odd, placements_override={"2g.12gb": [0]},
                               profile_names_override={"4g.24gb": "4g.23gb"}))
    lines = backend.catalogue_disagreements()
    assert "gpu0 1g.6gb: NVML gives it profile id 99, the catalogue 14" in lines
    assert "gpu0 1g.6gb: NVML allows 3 instance(s), the catalogue 4" in lines
    assert "gpu0 2g.12gb: NVML reports starts [0], the catalogue [0, 2]" in lines
    # A name the catalogue does not know, on an id it does: the catalogue's name, and the difference said.
    assert "gpu0 4g.24gb: NVML names profile id 0 '4g.23gb', the catalogue '4g.24gb'" in lines
    assert len(lines) == 4


def test_early_gb200_names_are_not_disagreements():
    backend = _backend(FakeGpu("GB200-186GB", mig_enabled=True,
                               profile_names_override={"7g.186gb": "7g.189gb", "1g.23gb": "1g.24gb"}))
    assert backend.catalogue_disagreements() == []
    backend.mig_instance_create(0, "7g.189gb@0")
    assert backend.gpus()[0].layout == layout_parse("7g.186gb@0")


def test_the_model_is_found_by_the_boards_pci_device_id_when_the_name_is_new():
    h100_94 = CATALOGUE.gpu_model_get("H100-94GB")
    backend = _backend(FakeGpu("NVIDIA H100 NVL 2026 Edition", mig_enabled=True, spec=h100_94, pci_device_id=0x232110DE))
    (gpu,) = backend.gpus()
    assert gpu_model_of(gpu) is h100_94
    assert backend.catalogue_disagreements() == []


def test_a_gpu_the_catalogue_lacks_is_described_from_nvml():
    a100 = CATALOGUE.gpu_model_get("A100-SXM4-40GB")
    a800 = replace(a100, name="A800-40GB", nvml_names=(), pci_device_ids=())
    backend = _backend(FakeGpu("NVIDIA A800 40GB PCIe", mig_enabled=True, spec=a800, pci_device_id=0x20F610DE))
    (gpu,) = backend.gpus()
    assert gpu.pci_device_id == "0x20F610DE"
    (line,) = backend.catalogue_disagreements()
    assert line.startswith("gpu0 NVIDIA A800 40GB PCIe (PCI device id 0x20F610DE): NVML reports MIG profiles ")
    assert line.endswith(f"it is planned from NVML's profile table ({NVML_ORIGIN_LABEL})")
    model = gpu_model_of(gpu)
    assert model.origin == "nvml" and model.label == f"NVIDIA A800 40GB PCIe ({NVML_ORIGIN_LABEL})"
    assert (model.memory_slices, model.compute_slices) == (8, 7)
    assert {p.name: (p.profile_id, p.memory_slices, p.starts, p.max_count) for p in model.profiles} == {
        p.name: (p.profile_id, p.memory_slices, p.starts, p.max_count) for p in a100.profiles
    }
    backend.mig_instance_create(0, "3g.20gb@4")
    backend.mig_instance_create(0, "2g.10gb@0")
    assert mig_layout_validate(model, backend.gpus()[0].layout).valid
    assert not mig_layout_validate(model, "3g.20gb@2").valid
