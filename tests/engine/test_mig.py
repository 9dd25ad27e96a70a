"""Tests for engine.geometry (catalogue, layouts, mig-parted YAML) against NVIDIA's published MIG geometry.

The expected tables below are written out by hand from the NVIDIA MIG User Guide
(Supported MIG Profiles tables; ``nvidia-smi mig -lgip`` / ``-lgipp`` outputs), not
read from the catalogue, so that the catalogue is checked against the guide rather
than against itself.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.geometry import layout as layout_module
from engine.geometry.catalogue import (
    DEFAULT_CATALOGUE_PATH,
    CatalogueError,
    GpuModelSpec,
    MigCatalogue,
    MigProfileSpec,
    UnknownGpuModel,
    UnknownMigProfile,
    gpu_model_canonical,
    mig_catalogue_load,
    pci_device_id_format,
    plain_gpu_model_find,
)
from engine.geometry.layout import (
    InvalidLayout,
    LayoutVerdict,
    Placement,
    layout_counts,
    layout_parse,
    mig_counts_to_layout,
    mig_layout_diff,
    mig_layout_validate,
    mig_layouts_enumerate,
    placement_parse,
)
from engine.geometry.migparted import MigPartedEntry, MigPartedError, mig_parted_export, mig_parted_import

REPO_ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- NVIDIA's tables
# profile -> (nvidia-smi profile id, memory slices, compute slices, legal starts, max instances, +me)
# Placements from the guide's `nvidia-smi mig -lgipp`:
#   19 {0,1,2,3,4,5,6}:1 | 20 {0,1,2,3,4,5,6}:1 | 15 {0,2,4,6}:2 | 14 {0,2,4}:2 | 9 {0,4}:4 | 5 {0}:4 | 0 {0}:8
ONE = (0, 1, 2, 3, 4, 5, 6)


def _table(one: str, one_double: str, two: str, three_four: str, seven: str) -> dict[str, tuple]:
    return {
        f"1g.{one}": (19, 1, 1, ONE, 7, False),
        f"1g.{one}+me": (20, 1, 1, ONE, 1, True),
        f"1g.{one_double}": (15, 2, 1, (0, 2, 4, 6), 4, False),
        f"2g.{two}": (14, 2, 2, (0, 2, 4), 3, False),
        f"3g.{three_four}": (9, 4, 3, (0, 4), 2, False),
        f"4g.{three_four}": (5, 4, 4, (0,), 1, False),
        f"7g.{seven}": (0, 8, 7, (0,), 1, False),
    }


# The 7-slice GPUs. A100/H100/H200/B200 from the guide's tables; H100 94GB and 96GB (GH200) from the
# guide's H100 tables; H20, GH200 144GB, GB200, B300 and GB300 from mig-parted's config-default.yaml (their
# all-* and all-balanced configs), the guide having no table for them.
NVIDIA_TABLES = {
    "A100-SXM4-40GB": _table("5gb", "10gb", "10gb", "20gb", "40gb"),
    "A100-SXM4-80GB": _table("10gb", "20gb", "20gb", "40gb", "80gb"),
    "H100-SXM5-80GB": _table("10gb", "20gb", "20gb", "40gb", "80gb"),
    "H100-PCIE-80GB": _table("10gb", "20gb", "20gb", "40gb", "80gb"),
    "H200-141GB": _table("18gb", "35gb", "35gb", "71gb", "141gb"),
    "H100-94GB": _table("12gb", "24gb", "24gb", "47gb", "94gb"),
    "H100-96GB": _table("12gb", "24gb", "24gb", "48gb", "96gb"),
    "H20-96GB": _table("12gb", "24gb", "24gb", "48gb", "96gb"),
    "GH200-144GB": _table("18gb", "36gb", "36gb", "72gb", "144gb"),
    "B200-180GB": _table("23gb", "45gb", "45gb", "90gb", "180gb"),
    "GB200-186GB": _table("23gb", "47gb", "47gb", "93gb", "186gb"),
    "B300-269GB": _table("34gb", "67gb", "67gb", "135gb", "269gb"),
    "GB300-278GB": _table("35gb", "70gb", "70gb", "139gb", "278gb"),
}
# The GPUs with quarter or half slices: (memory slices, compute slices) and the profiles as above.
# A30: the guide's table, ids and placements from `nvidia-smi mig -lgip/-lgipp` on an A30 ({0,1,2,3}:1,
# {0,2}:2, {0}:4). RTX PRO 6000: the guide's table, ids and placements from -lgip/-lgipp on a Server
# Edition ({0,3,6,9}:3, {0,6}:6, {0}:12: twelve placement units). RTX PRO 5000 / 4500: the guide's 2-slice
# tables, no published ids (None) or -lgipp.
Q, H = (0, 1, 2, 3), (0, 1)
SLICED_TABLES = {
    "A30-24GB": ((4, 4), {
        "1g.6gb": (14, 1, 1, Q, 4, False), "1g.6gb+me": (21, 1, 1, Q, 1, True),
        "2g.12gb": (5, 2, 2, (0, 2), 2, False), "2g.12gb+me": (6, 2, 2, (0, 2), 1, True),
        "4g.24gb": (0, 4, 4, (0,), 1, False),
    }),
    "RTX-PRO-6000-Blackwell-96GB": ((12, 4), {
        "1g.24gb": (14, 3, 1, (0, 3, 6, 9), 4, False), "1g.24gb+me": (21, 3, 1, (0, 3, 6, 9), 1, True),
        "1g.24gb+gfx": (47, 3, 1, (0, 3, 6, 9), 4, False), "1g.24gb+me.all": (65, 3, 1, (0, 3, 6, 9), 1, False),
        "1g.24gb-me": (67, 3, 1, (0, 3, 6, 9), 4, False),
        "2g.48gb": (5, 6, 2, (0, 6), 2, False), "2g.48gb+gfx": (35, 6, 2, (0, 6), 2, False),
        "2g.48gb+me.all": (64, 6, 2, (0, 6), 1, False), "2g.48gb-me": (66, 6, 2, (0, 6), 2, False),
        "4g.96gb": (0, 12, 4, (0,), 1, False), "4g.96gb+gfx": (32, 12, 4, (0,), 1, False),
    }),
    "RTX-PRO-5000-Blackwell-48GB": ((2, 2), {
        "1g.24gb": (None, 1, 1, H, 2, False), "1g.24gb+me": (None, 1, 1, H, 1, True),
        "1g.24gb+gfx": (None, 1, 1, H, 2, False), "1g.24gb+me.all": (None, 1, 1, H, 1, False),
        "1g.24gb-me": (None, 1, 1, H, 2, False), "2g.48gb": (None, 2, 2, (0,), 1, False),
        "2g.48gb+gfx": (None, 2, 2, (0,), 1, False),
    }),
    "RTX-PRO-4500-Blackwell-32GB": ((2, 2), {
        "1g.16gb": (None, 1, 1, H, 2, False), "1g.16gb+gfx": (None, 1, 1, H, 2, False),
        "1g.16gb+me.all": (None, 1, 1, H, 1, False), "1g.16gb-me": (None, 1, 1, H, 2, False),
        "2g.32gb": (None, 2, 2, (0,), 1, False), "2g.32gb+gfx": (None, 2, 2, (0,), 1, False),
    }),
}
# Every product of the guide's Supported GPUs table (Table 1) but Thor (unified memory, no memory slices;
# see the catalogue's notes), as NVML names it, with the model it must resolve to.
SUPPORTED_GPUS = {
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX-PRO-6000-Blackwell-96GB",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "RTX-PRO-6000-Blackwell-96GB",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "RTX-PRO-6000-Blackwell-96GB",
    "NVIDIA RTX PRO 5000 Blackwell": "RTX-PRO-5000-Blackwell-48GB",
    "NVIDIA RTX PRO 4500 Blackwell": "RTX-PRO-4500-Blackwell-32GB",
    "NVIDIA GB200": "GB200-186GB",
    "NVIDIA B200": "B200-180GB",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "NVIDIA H100 PCIe": "H100-PCIE-80GB",
    "NVIDIA H100 NVL": "H100-94GB",
    "NVIDIA GH200 480GB": "H100-96GB",
    "NVIDIA H20": "H20-96GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA H200 NVL": "H200-141GB",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-SXM4-40GB",
    "NVIDIA A100 80GB PCIe": "A100-SXM4-80GB",
    "NVIDIA A30": "A30-24GB",
}
# PCI device ids (mig-parted's device-filter form) -> model: mig-parted's config-default.yaml groups and
# pci.ids.
PCI_IDS = {
    "0x20B710DE": "A30-24GB", "0x20B010DE": "A100-SXM4-40GB", "0x20F110DE": "A100-SXM4-40GB",
    "0x20B210DE": "A100-SXM4-80GB", "0x20B510DE": "A100-SXM4-80GB", "0x233010DE": "H100-SXM5-80GB",
    "0x233110DE": "H100-PCIE-80GB", "0x232110DE": "H100-94GB", "0x234210DE": "H100-96GB",
    "0x232910DE": "H20-96GB", "0x233510DE": "H200-141GB", "0x233B10DE": "H200-141GB",
    "0x234810DE": "GH200-144GB", "0x290110DE": "B200-180GB", "0x294110DE": "GB200-186GB",
    "0x318210DE": "B300-269GB", "0x31C210DE": "GB300-278GB", "0x2BB510DE": "RTX-PRO-6000-Blackwell-96GB",
}
NOMINAL_GB = {
    "A100-SXM4-40GB": {"1g.5gb": 5, "1g.5gb+me": 5, "1g.10gb": 10, "2g.10gb": 10, "3g.20gb": 20, "4g.20gb": 20, "7g.40gb": 40},
    "H200-141GB": {"1g.18gb": 18, "1g.18gb+me": 18, "1g.35gb": 35, "2g.35gb": 35, "3g.71gb": 71, "4g.71gb": 71, "7g.141gb": 141},
}
MODEL_MEMORY_MIB = {
    "A100-SXM4-40GB": 40960,
    "A100-SXM4-80GB": 81920,
    "H100-SXM5-80GB": 81559,
    "H100-PCIE-80GB": 81559,
    "H200-141GB": 143771,
    "H100-94GB": 95830,
    "RTX-PRO-6000-Blackwell-96GB": 97887,
}
MODELS = tuple(NVIDIA_TABLES)
ALL_TABLES = {**{m: ((8, 7), t) for m, t in NVIDIA_TABLES.items()}, **SLICED_TABLES}
A100 = "A100-SXM4-40GB"


def _rename(model: str, a100_layout: str) -> str:
    """Write an A100-40GB layout with another model's profile names (same profile ids)."""
    by_id = {spec[0]: name for name, spec in NVIDIA_TABLES[model].items()}
    a100_ids = {name: spec[0] for name, spec in NVIDIA_TABLES[A100].items()}
    parts = []
    for text in a100_layout.split():
        profile, start = text.split("@")
        parts.append(f"{by_id[a100_ids[profile]]}@{start}")
    return " ".join(parts)


@pytest.fixture(scope="module")
def catalogue() -> MigCatalogue:
    return mig_catalogue_load()


# ----------------------------------------------------------------------------- catalogue facts


@pytest.mark.parametrize("model_name", sorted(ALL_TABLES))
def test_profiles_match_nvidia_tables(catalogue, model_name):
    model = catalogue.gpu_model_get(model_name)
    slices, expected = ALL_TABLES[model_name]
    assert (model.memory_slices, model.compute_slices) == slices
    assert set(model.profile_names) == set(expected)
    for profile in model.profiles:
        profile_id, size, compute, starts, max_count, media = expected[profile.name]
        assert profile.profile_id == profile_id, profile.name
        assert profile.memory_slices == size, profile.name
        assert profile.compute_slices == compute, profile.name
        assert profile.starts == starts, profile.name
        assert profile.max_count == max_count, profile.name
        assert profile.media_extensions is media, profile.name


@pytest.mark.parametrize("model_name", sorted(MODEL_MEMORY_MIB))
def test_model_memory_as_nvidia_smi_reports_it(catalogue, model_name):
    assert catalogue.gpu_model_get(model_name).memory_mib == MODEL_MEMORY_MIB[model_name]


def test_catalogue_holds_exactly_the_tabled_models(catalogue):
    assert set(catalogue.gpu_model_names) == set(ALL_TABLES)


@pytest.mark.parametrize(("nvml_name", "model_name"), sorted(SUPPORTED_GPUS.items()))
def test_every_supported_gpu_resolves_and_cites_its_sources(catalogue, nvml_name, model_name):
    model = catalogue.gpu_model_get(nvml_name)
    assert model.name == model_name and model.origin == "catalogue" and model.label == model_name
    assert {"profiles", "pci_device_ids", "memory_mib"} <= set(model.source)
    assert all(len(text) > 20 for text in model.source.values())
    assert mig_layouts_enumerate(model, maximal=True), model_name


@pytest.mark.parametrize(("device_id", "model_name"), sorted(PCI_IDS.items()))
def test_pci_device_ids(catalogue, device_id, model_name):
    assert catalogue.gpu_model_find_by_pci(device_id).name == model_name
    assert catalogue.gpu_model_find_by_pci(int(device_id, 16)).name == model_name
    assert pci_device_id_format(int(device_id, 16)) == device_id.upper().replace("0X", "0x")


@pytest.mark.parametrize("device_id", ["0x20F310DE", "0x2BB5", "20B010DE", "", None, True, "0x1:0x2"])
def test_pci_device_ids_the_catalogue_lacks(catalogue, device_id):
    assert catalogue.gpu_model_find_by_pci(device_id) is None


@pytest.mark.parametrize("model_name", sorted(NOMINAL_GB))
def test_nominal_memory_matches_profile_names(catalogue, model_name):
    model = catalogue.gpu_model_get(model_name)
    assert {p.name: p.memory_gb for p in model.profiles} == NOMINAL_GB[model_name]


def test_a100_lgip_memory_as_the_guide_prints_it(catalogue):
    model = catalogue.gpu_model_get(A100)
    assert {p.name: p.memory_gib_lgip for p in model.profiles} == {
        "1g.5gb": 4.75, "1g.5gb+me": 4.75, "1g.10gb": 9.62, "2g.10gb": 9.62,
        "3g.20gb": 19.5, "4g.20gb": 19.5, "7g.40gb": 39.25,
    }


def test_h200_as_a_real_h200_reports_it(catalogue):
    # `nvidia-smi --query-gpu=name,pci.device_id,memory.total` and `nvidia-smi mig -lgip` on an H200
    # (driver 580.159.04): NVIDIA H200, 0x233510DE, 143771 MiB; ids and GiB per profile.
    model = catalogue.gpu_model_find_by_pci("0x233510DE")
    assert model is catalogue.gpu_model_get("NVIDIA H200") and model.memory_mib == 143771
    assert {p.name: (p.profile_id, p.memory_gib_lgip) for p in model.profiles} == {
        "1g.18gb": (19, 16.0), "1g.18gb+me": (20, 16.0), "1g.35gb": (15, 32.5), "2g.35gb": (14, 32.5),
        "3g.71gb": (9, 69.75), "4g.71gb": (5, 69.75), "7g.141gb": (0, 140.0),
    }


def test_catalogue_file_cites_sources_first():
    raw_text = DEFAULT_CATALOGUE_PATH.read_text(encoding="utf-8")
    data = json.loads(raw_text)
    assert next(iter(data)) == "source"
    assert "Multi-Instance GPU User Guide" in data["source"]["primary"]
    assert any("Supported MIG Profiles" in section for section in data["source"]["sections"])
    assert data["schema_version"] == 2
    assert any("Disagreement" in note for note in data["notes"])
    assert all("source" in model for model in data["gpu_models"])


def test_default_catalogue_is_cached_and_explicit_path_is_not(catalogue):
    assert mig_catalogue_load() is catalogue
    fresh = mig_catalogue_load(DEFAULT_CATALOGUE_PATH)
    assert fresh is not catalogue
    assert fresh.gpu_models == catalogue.gpu_models


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("a100-sxm4-40gb", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("nvidia a100-sxm4-40gb", "A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
        ("h100-pcie-80gb", "H100-PCIE-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
    ],
)
def test_gpu_model_lookup(catalogue, name, expected):
    assert catalogue.gpu_model_get(name).name == expected
    assert catalogue.gpu_model_find(name).name == expected


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),  # MIG: the catalogue's name
    ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080Ti"),  # what NVML reports for gpulets' GPU: the profiles' name
    ("GeForce RTX 2080 Ti", "RTX-2080Ti"),
    ("rtx-2080ti", "RTX-2080Ti"),
    ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", None),  # unknown: the caller keeps its name
])
def test_gpu_model_canonical_meets_inventory_and_profiles(name, expected):
    assert gpu_model_canonical(name) == expected
    if expected in ("RTX-2080Ti", "T4", "L4"):
        assert plain_gpu_model_find(name).name == expected and mig_catalogue_load().gpu_model_find(name) is None


@pytest.mark.parametrize("name", ["A100", "NVIDIA A10", "H100", "", "NVIDIA L40S"])
def test_unknown_gpu_model(catalogue, name):
    assert catalogue.gpu_model_find(name) is None
    with pytest.raises(UnknownGpuModel) as excinfo:
        catalogue.gpu_model_get(name)
    assert isinstance(excinfo.value, ValueError)
    message = str(excinfo.value)
    assert repr(name) in message
    for known in MODELS:
        assert known in message


def _write_catalogue(tmp_path: Path, mutate) -> Path:
    data = json.loads(DEFAULT_CATALOGUE_PATH.read_text(encoding="utf-8"))
    mutate(data)
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["gpu_models"][0]["profiles"][3].update(starts=[0, 2, 4, 6, 7]), "runs past"),
        (lambda d: d["gpu_models"][0]["profiles"][0].update(max_count=8), "exceeds its 7 starts"),
        (lambda d: d["gpu_models"][1]["nvml_names"].append("NVIDIA A100-SXM4-40GB"), "ambiguous"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d.pop("source"), "source"),
        (lambda d: d["gpu_models"][0]["profiles"][1].update(media_extensions=False), "+me"),
        (lambda d: d["gpu_models"][0]["profiles"][2].update(memory_slices=True), "expected int"),
    ],
)
def test_inconsistent_catalogue_is_rejected(tmp_path, mutate, message):
    with pytest.raises(CatalogueError, match=message.replace("+", r"\+")):
        mig_catalogue_load(_write_catalogue(tmp_path, mutate))


def test_unreadable_catalogue(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CatalogueError, match="not valid JSON"):
        mig_catalogue_load(bad)
    with pytest.raises(CatalogueError, match="cannot read"):
        mig_catalogue_load(tmp_path / "missing.json")


def test_module_imports_no_django():
    code = (
        "import sys, engine.geometry.catalogue, engine.geometry.layout, engine.geometry.migparted; "
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in {'django', 'rest_framework', 'celery', 'controlplane'}); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


# ----------------------------------------------------------------------------- placements


def test_placement_round_trip():
    placement = placement_parse("3g.20gb@0")
    assert placement == Placement("3g.20gb", 0)
    assert str(placement) == "3g.20gb@0"
    assert placement_parse(" 1g.5gb+me @ 6 ") == Placement("1g.5gb+me", 6)
    assert placement_parse("MIG 1G.5GB@2") == Placement("1g.5gb", 2)


@pytest.mark.parametrize("text", ["3g.20gb", "3g.20gb@", "@0", "3g.20gb@-1", "3g.20gb@x", "foo@0", "", "3g.20gb@0@1", "3g@0"])
def test_malformed_placement(text):
    with pytest.raises(ValueError, match="placement"):
        placement_parse(text)


@pytest.mark.parametrize(("profile", "start"), [("", 0), ("3g.20gb", -1), ("3g.20gb", True), ("3g.20gb", 1.0)])
def test_placement_constructor_checks(profile, start):
    with pytest.raises(ValueError):
        Placement(profile, start)


def test_layout_parse_sorts_and_accepts_several_forms():
    expected = (Placement("2g.10gb", 0), Placement("1g.5gb", 2), Placement("1g.5gb", 3), Placement("3g.20gb", 4))
    assert layout_parse(["3g.20gb@4", "2g.10gb@0", "1g.5gb@2", "1g.5gb@3"]) == expected
    assert layout_parse("3g.20gb@4, 2g.10gb@0 1g.5gb@2 1g.5gb@3") == expected
    assert layout_parse([Placement("3g.20gb", 4), "2g.10gb@0", "1g.5gb@3", "1g.5gb@2"]) == expected
    assert layout_parse([]) == ()
    assert layout_counts(expected) == {"2g.10gb": 1, "1g.5gb": 2, "3g.20gb": 1}


# ----------------------------------------------------------------------------- validation

# Layouts the guide shows on A100-40GB (the -lgi outputs under Creating GPU Instances,
# the -lgipp capacity statement and the Partitioning diagram) plus mig-parted's
# all-* configs, which NVIDIA ships as known-good.
GUIDE_VALID_A100 = [
    "7g.40gb@0",
    "4g.20gb@0 3g.20gb@4",
    "3g.20gb@0 3g.20gb@4",
    "1g.5gb@0 1g.5gb@1 2g.10gb@2 3g.20gb@4",  # guide: 3-2-1-1 geometry
    "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 2g.10gb@4 1g.5gb@6",  # guide: 2-1-1-1-1-1 geometry
    "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6",  # seven 1g.5gb
    "2g.10gb@0 2g.10gb@2 2g.10gb@4 1g.5gb@6",
    "2g.10gb@0 2g.10gb@2 2g.10gb@4",
    "3g.20gb@4 2g.10gb@0 1g.5gb@2 1g.5gb@3",
    "4g.20gb@0 2g.10gb@4 1g.5gb@6",
    "4g.20gb@0 1g.5gb@4 1g.5gb@5 1g.5gb@6",
    "3g.20gb@0 2g.10gb@4 1g.5gb@6",
    "2g.10gb@0 2g.10gb@2 3g.20gb@4",
    "1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6",
    "1g.5gb+me@0",
    "1g.5gb+me@3 1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@4 1g.5gb@5 1g.5gb@6",
    "",
]


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("layout", GUIDE_VALID_A100)
def test_guide_layouts_are_valid(model_name, layout):
    verdict = mig_layout_validate(model_name, _rename(model_name, layout))
    assert verdict == LayoutVerdict(valid=True, reason=None, code=None)


@pytest.mark.parametrize(
    ("layout", "code", "reason"),
    [
        (
            "2g.10gb@1",
            "illegal_start",
            "2g.10gb@1: start 1 is not a legal start for 2g.10gb on A100-SXM4-40GB (legal: 0, 2, 4)",
        ),
        ("3g.20gb@0 2g.10gb@2", "overlap", "3g.20gb@0 overlaps 2g.10gb@2 on memory slices 2-3"),
        ("1g.10gb@6 1g.5gb@6", "overlap", "1g.10gb@6 overlaps 1g.5gb@6 on memory slice 6"),
        ("3g.20gb@4 1g.10gb@6", "overlap", "3g.20gb@4 overlaps 1g.10gb@6 on memory slices 6-7"),
        ("4g.20gb@0 1g.10gb@2", "overlap", "4g.20gb@0 overlaps 1g.10gb@2 on memory slices 2-3"),
        ("7g.40gb@0 1g.5gb@3", "compute_over", None),
        ("1g.5gb@2 1g.5gb@2", "overlap", "1g.5gb@2 overlaps 1g.5gb@2 on memory slice 2"),
        ("1g.10gb@7", "illegal_start", None),
        ("1g.10gb@1", "illegal_start", None),
        ("3g.20gb@2", "illegal_start", None),
        ("4g.20gb@4", "illegal_start", None),
        ("7g.40gb@1", "illegal_start", None),
        ("1g.5gb@7", "illegal_start", None),
        ("1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6 1g.10gb@6", "too_many",
         "1g.10gb: 5 instances, more than the 4 A100-SXM4-40GB allows"),
        ("3g.20gb@0 3g.20gb@4 3g.20gb@4", "too_many", None),
        ("1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6 1g.5gb@6", "too_many", None),
        ("4g.20gb@0 3g.20gb@4 1g.5gb@6", "compute_over",
         "compute slices sum to 8, more than the 7 of A100-SXM4-40GB "
         "(4g.20gb@0: 4, 3g.20gb@4: 3, 1g.5gb@6: 1)"),
        ("1g.5gb+me@0 1g.5gb+me@1", "media_extension_over",
         "1g.5gb+me@0, 1g.5gb+me@1: at most one media-extension (+me or +me.all) instance fits on "
         "A100-SXM4-40GB, the layout has 2"),
        ("1g.18gb@0", "unknown_profile",
         "1g.18gb@0: profile 1g.18gb does not exist on A100-SXM4-40GB "
         "(known: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"),
        ("3g.40gb@0", "unknown_profile", None),
    ],
)
def test_invalid_layouts_on_a100(layout, code, reason):
    verdict = mig_layout_validate(A100, layout)
    assert verdict.valid is False
    assert verdict.code == code
    if reason is not None:
        assert verdict.reason == reason


def test_4g_plus_3g_leaves_no_room(catalogue):
    # 4g.20gb@0 + 3g.20gb@4 use all 7 compute slices: anything added is compute_over
    # (a second 4g.20gb is first of all one more than the single 4g.20gb allowed).
    model = catalogue.gpu_model_get(A100)
    for profile in model.profiles:
        for start in profile.starts:
            verdict = mig_layout_validate(model, ["4g.20gb@0", "3g.20gb@4", f"{profile.name}@{start}"])
            expected = "too_many" if profile.name == "4g.20gb" else "compute_over"
            assert verdict.code == expected, (profile.name, start)


@pytest.mark.parametrize("model_name", ["H100-SXM5-80GB", "H200-141GB"])
def test_a100_40gb_profiles_are_unknown_elsewhere(model_name):
    assert mig_layout_validate(model_name, "1g.5gb@0").code == "unknown_profile"
    assert mig_layout_validate(model_name, "2g.10gb@0").code == "unknown_profile"


def test_validate_takes_a_spec_or_a_name(catalogue):
    model = catalogue.gpu_model_get(A100)
    assert mig_layout_validate(model, "3g.20gb@0").valid
    assert mig_layout_validate("nvidia a100-sxm4-40gb", "3g.20gb@0").valid
    with pytest.raises(UnknownGpuModel):
        mig_layout_validate("NVIDIA T4", "3g.20gb@0")


# ----------------------------------------------------------------------------- enumeration


def _brute_force(model_name: str) -> tuple[set[frozenset], set[frozenset]]:
    """All valid and all maximal layouts by trying every subset of (profile, start) placements.

    Independent of the module: rules and numbers come from NVIDIA_TABLES or SLICED_TABLES, the rules
    written out here from the guide: no overlap, each profile's instance count, the GPU's compute slices,
    at most one instance with media extensions (+me or +me.all), and beside a +me.all instance (all media
    engines) only -me instances (no media engine). Each instance takes at least one compute slice, so
    subsets of up to that many placements cover every layout.
    """
    (_, compute), table = ALL_TABLES[model_name]
    candidates = [(name, start) for name, spec in table.items() for start in spec[3]]
    masks = {(name, start): ((1 << table[name][1]) - 1) << start for name, start in candidates}

    def valid(subset) -> bool:
        used = 0
        for placement in subset:
            if used & masks[placement]:
                return False
            used |= masks[placement]
        names = Counter(name for name, _ in subset)
        every = any(name.endswith("+me.all") for name, _ in subset)
        return (
            all(n <= table[name][4] for name, n in names.items())
            and sum(table[name][2] for name, _ in subset) <= compute
            and sum(1 for name, _ in subset if name.endswith(("+me", "+me.all"))) <= 1
            and not (every and any(not name.endswith(("+me.all", "-me")) for name, _ in subset))
        )

    layouts = {
        frozenset(subset)
        for k in range(compute + 1)
        for subset in itertools.combinations(candidates, k)
        if valid(subset)
    }
    maximal = {
        layout
        for layout in layouts
        if not any(c not in layout and frozenset(layout | {c}) in layouts for c in candidates)
    }
    return layouts, maximal


def _as_sets(layouts) -> list[frozenset]:
    return [frozenset((p.profile, p.start) for p in layout) for layout in layouts]


@pytest.fixture(scope="module")
def a100_brute_force():
    return _brute_force(A100)


def test_enumeration_matches_brute_force_on_a100(a100_brute_force):
    expected_all, expected_maximal = a100_brute_force
    assert len(expected_maximal) == 239
    assert len(expected_all) == 2319
    assert set(_as_sets(mig_layouts_enumerate(A100, maximal=True))) == expected_maximal
    assert set(_as_sets(mig_layouts_enumerate(A100))) == expected_all


@pytest.mark.parametrize("model_name", MODELS)
def test_enumeration_is_sorted_unique_and_valid(model_name):
    layouts = mig_layouts_enumerate(model_name)
    maximal = mig_layouts_enumerate(model_name, maximal=True)
    assert (len(layouts), len(maximal)) == (2319, 239)
    assert len(set(layouts)) == len(layouts)
    assert len(set(_as_sets(layouts))) == len(layouts)
    assert () in layouts and () not in maximal
    assert set(maximal) <= set(layouts)
    for layout in layouts:
        assert isinstance(layout, tuple)
        assert list(layout) == sorted(layout)
        assert mig_layout_validate(model_name, layout).valid, layout


def test_maximal_layouts_of_the_base_profiles():
    # Keeping only 1g/2g/3g/4g/7g (no +me, no 1g.10gb), the maximal layouts are the
    # combinations of the guide's A100 partitioning diagram (Figure 7), with 4g+3g
    # allowed since R510. The count 19 is derived here; the diagram is an image and
    # was not read, so the count is a regression pin, not a quoted fact.
    base = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
    layouts = [
        layout for layout in mig_layouts_enumerate(A100, maximal=True) if {p.profile for p in layout} <= base
    ]
    shapes = {tuple(int(p.profile[0]) for p in layout) for layout in layouts}
    assert (7,) in shapes and (4, 3) in shapes and (3, 3) in shapes and (1,) * 7 in shapes
    assert (1, 1, 2, 3) in shapes and (2, 2, 2, 1) in shapes
    assert len(layouts) == 19


def test_enumeration_is_fast_enough():
    layout_module._layouts_all.cache_clear()
    layout_module._layouts_maximal.cache_clear()
    began = time.perf_counter()
    mig_layouts_enumerate(A100)
    mig_layouts_enumerate(A100, maximal=True)
    assert time.perf_counter() - began < 1.0


def test_enumeration_returns_fresh_lists():
    first = mig_layouts_enumerate(A100)
    first.clear()
    assert len(mig_layouts_enumerate(A100)) == 2319


@pytest.mark.parametrize("model_name", sorted(SLICED_TABLES))
def test_sliced_gpus_enumerate_exactly_their_brute_force(model_name):
    expected_all, expected_maximal = _brute_force(model_name)
    assert set(_as_sets(mig_layouts_enumerate(model_name))) == expected_all
    assert set(_as_sets(mig_layouts_enumerate(model_name, maximal=True))) == expected_maximal
    for layout in mig_layouts_enumerate(model_name):
        assert mig_layout_validate(model_name, layout).valid


@pytest.mark.parametrize(("model_name", "layout", "code", "reason"), [
    # A30: quarter slices, and one set of media extensions (1 JPEG, 1 OFA) for a 1g or a 2g +me instance.
    ("A30-24GB", "1g.6gb+me@0 1g.6gb@1 2g.12gb@2", None, None),
    ("A30-24GB", "2g.12gb+me@0 2g.12gb@2", None, None),
    ("A30-24GB", "1g.6gb@0 1g.6gb@1 1g.6gb@2 1g.6gb@3", None, None),
    ("A30-24GB", "1g.6gb+me@0 2g.12gb+me@2", "media_extension_over",
     "1g.6gb+me@0, 2g.12gb+me@2: at most one media-extension (+me or +me.all) instance fits on A30-24GB, the layout has 2"),
    ("A30-24GB", "2g.12gb@1", "illegal_start", None),
    ("A30-24GB", "1g.6gb@4", "illegal_start", None),
    ("A30-24GB", "4g.24gb@0 1g.6gb@0", "compute_over", None),
    ("A30-24GB", "2g.12gb@0 2g.12gb@2 2g.12gb@2", "too_many", None),
    # RTX PRO 6000: twelve placement units, three per quarter.
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb+me.all@0 1g.24gb-me@3 1g.24gb-me@6 1g.24gb-me@9", None, None),
    ("RTX-PRO-6000-Blackwell-96GB", "2g.48gb+me.all@6 2g.48gb-me@0", None, None),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb+gfx@0 1g.24gb+me@3 2g.48gb@6", None, None),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb+me.all@0 1g.24gb@3", "media_extension_over",
     "1g.24gb+me.all@0 takes every media engine of RTX-PRO-6000-Blackwell-96GB, so only -me instances may sit "
     "beside it; 1g.24gb@3 holds media engines"),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb+me@0 2g.48gb+me.all@6", "media_extension_over", None),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb@1", "illegal_start",
     "1g.24gb@1: start 1 is not a legal start for 1g.24gb on RTX-PRO-6000-Blackwell-96GB (legal: 0, 3, 6, 9)"),
    ("RTX-PRO-6000-Blackwell-96GB", "2g.48gb@0 1g.24gb@3", "overlap",
     "2g.48gb@0 overlaps 1g.24gb@3 on memory slices 3-5"),
    ("RTX-PRO-5000-Blackwell-48GB", "1g.24gb+me.all@0 1g.24gb-me@1", None, None),
    ("RTX-PRO-5000-Blackwell-48GB", "1g.24gb+gfx@0 1g.24gb+me.all@1", "media_extension_over", None),
])
def test_sliced_gpu_layouts(model_name, layout, code, reason):
    verdict = mig_layout_validate(model_name, layout)
    assert verdict.valid is (code is None), verdict
    assert verdict.code == code
    if reason is not None:
        assert verdict.reason == reason


def test_profile_ids_differ_across_gpus(catalogue):
    # One id, three profiles: ids are only ever read with their GPU model.
    assert catalogue.gpu_model_get("A100-SXM4-40GB").profile_by_id(14).name == "2g.10gb"
    assert catalogue.gpu_model_get("A30-24GB").profile_by_id(14).name == "1g.6gb"
    assert catalogue.gpu_model_get("RTX-PRO-6000-Blackwell-96GB").profile_by_id(14).name == "1g.24gb"
    assert catalogue.gpu_model_get("A30-24GB").profile_by_id(5).name == "2g.12gb"
    assert catalogue.gpu_model_get("RTX-PRO-5000-Blackwell-48GB").profile_by_id(0) is None


def test_profile_attributes(catalogue):
    rtx = catalogue.gpu_model_get("RTX-PRO-6000-Blackwell-96GB")
    every, none, gfx, me = (rtx.profile_get(n) for n in ("1g.24gb+me.all", "1g.24gb-me", "1g.24gb+gfx", "1g.24gb+me"))
    assert (every.attributes, every.media_engines_all, every.holds_media_extensions) == (("me.all",), True, True)
    assert (none.lacks, none.media_engines_none, none.holds_media_extensions) == (("me",), True, False)
    assert (gfx.attributes, gfx.holds_media_extensions) == (("gfx",), False)
    assert (me.attributes, me.media_extensions, me.holds_media_extensions) == (("me",), True, True)


def test_renamed_gb200_profiles_resolve_to_the_production_names(catalogue):
    gb200 = catalogue.gpu_model_get("NVIDIA GB200")
    for early, production in [("1g.24gb", "1g.23gb"), ("1g.24gb+me", "1g.23gb+me"), ("3g.95gb", "3g.93gb"),
                              ("4g.95gb", "4g.93gb"), ("7g.189gb", "7g.186gb")]:
        assert gb200.profile_get(early).name == production
    assert mig_layout_validate(gb200, "7g.189gb@0").valid
    assert mig_layout_validate(gb200, "1g.24gb@0 1g.23gb@1 3g.95gb@4").valid
    assert mig_layout_validate(gb200, "1g.24gb+me@0 1g.23gb+me@1").code == "media_extension_over"
    placed = mig_counts_to_layout(gb200, {"1g.24gb": 2, "2g.47gb": 1, "3g.95gb": 1})
    assert layout_counts(placed) == {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}
    assert mig_layout_validate(gb200, placed).valid
    diff = mig_layout_diff(gb200, "7g.189gb@0", "7g.186gb@0")
    assert diff.operations == () and diff.keep == (Placement("7g.186gb", 0),)
    # The early names are GB200's only: 1g.24gb is another profile on H100 94GB.
    assert catalogue.gpu_model_get("H100-94GB").profile_get("1g.24gb").memory_slices == 2


# ----------------------------------------------------------------------------- diff


def _layout_pairs():
    return st.sampled_from(MODELS).flatmap(
        lambda name: st.tuples(
            st.just(name),
            st.sampled_from(mig_layouts_enumerate(name)),
            st.sampled_from(mig_layouts_enumerate(name)),
        )
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_layout_pairs())
def test_diff_applies_cleanly(case):
    model_name, current, target = case
    diff = mig_layout_diff(model_name, current, target)
    common = set(current) & set(target)
    assert set(diff.keep) == common
    assert set(diff.destroy) == set(current) - common
    assert set(diff.create) == set(target) - common
    # Minimal: exactly what differs is touched, nothing more.
    assert len(diff.destroy) + len(diff.create) == len(set(current) ^ set(target))
    kinds = [kind for kind, _ in diff.operations]
    assert kinds == sorted(kinds, key=lambda kind: kind != "destroy")  # all destroys first
    state = list(current)
    for kind, placement in diff.operations:
        if kind == "destroy":
            state.remove(placement)
        else:
            assert placement not in state
            state.append(placement)
        assert mig_layout_validate(model_name, state).valid, (kind, placement, state)
    assert sorted(state) == list(target)
    assert all(p in state for p in diff.keep)


def test_diff_keeps_unchanged_instances_serving():
    diff = mig_layout_diff(A100, "3g.20gb@0 3g.20gb@4", "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4")
    assert diff.keep == (Placement("3g.20gb", 4),)
    assert diff.destroy == (Placement("3g.20gb", 0),)
    assert diff.operations == (
        ("destroy", Placement("3g.20gb", 0)),
        ("create", Placement("2g.10gb", 0)),
        ("create", Placement("1g.5gb", 2)),
        ("create", Placement("1g.5gb", 3)),
    )
    # Same profile, different start: not the same instance.
    moved = mig_layout_diff(A100, "2g.10gb@0", "2g.10gb@2")
    assert moved.keep == () and moved.destroy == (Placement("2g.10gb", 0),) and moved.create == (Placement("2g.10gb", 2),)
    assert mig_layout_diff(A100, "7g.40gb@0", "7g.40gb@0").operations == ()


def test_diff_rejects_invalid_layouts():
    with pytest.raises(InvalidLayout) as excinfo:
        mig_layout_diff(A100, "3g.20gb@0 2g.10gb@2", "7g.40gb@0")
    assert isinstance(excinfo.value, ValueError)
    assert excinfo.value.verdict.code == "overlap"
    assert "current layout" in str(excinfo.value)
    with pytest.raises(InvalidLayout) as excinfo:
        mig_layout_diff(A100, "7g.40gb@0", "2g.10gb@1")
    assert excinfo.value.verdict.code == "illegal_start"
    assert "target layout" in str(excinfo.value)


# ----------------------------------------------------------------------------- counts to layout


@pytest.mark.parametrize("model_name", MODELS)
def test_every_valid_layout_can_be_rebuilt_from_its_counts(model_name):
    for layout in mig_layouts_enumerate(model_name):
        counts = layout_counts(layout)
        rebuilt = mig_counts_to_layout(model_name, counts)
        assert rebuilt is not None, layout
        assert layout_counts(rebuilt) == counts
        assert mig_layout_validate(model_name, rebuilt).valid


def test_counts_to_layout_is_deterministic_largest_first():
    balanced = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert mig_counts_to_layout(A100, balanced) == layout_parse("2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4")
    assert mig_counts_to_layout(A100, {"3g.20gb": 2}) == layout_parse("3g.20gb@0 3g.20gb@4")
    assert mig_counts_to_layout(A100, {"1g.5gb": 7}) == layout_parse([f"1g.5gb@{i}" for i in range(7)])
    assert mig_counts_to_layout(A100, {"1g.10gb": 1, "1g.5gb": 6}) == layout_parse(
        "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.10gb@6"
    )
    assert mig_counts_to_layout(A100, {}) == ()
    assert mig_counts_to_layout(A100, {"7g.40gb": 0}) == ()


@pytest.mark.parametrize(
    "counts",
    [
        {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1},
        {"1g.5gb+me": 2},
        {"3g.20gb": 1, "1g.10gb": 3},
        {"1g.5gb": 8},
        {"7g.40gb": 1, "1g.5gb": 1},
    ],
)
def test_counts_that_cannot_fit(counts):
    assert mig_counts_to_layout(A100, counts) is None


def test_counts_that_pass_the_totals_but_not_the_geometry():
    tiny = GpuModelSpec(
        name="TINY",
        nvml_names=(),
        memory_mib=4096,
        memory_slices=4,
        compute_slices=4,
        profiles=(
            MigProfileSpec("2g.2gb", 1, 2, 2, 2, (1,), 1, False),
            MigProfileSpec("1g.1gb", 2, 1, 1, 1, (0, 1, 2), 3, False),
        ),
    )
    assert mig_counts_to_layout(tiny, {"2g.2gb": 1, "1g.1gb": 1}) == layout_parse("1g.1gb@0 2g.2gb@1")
    assert mig_counts_to_layout(tiny, {"2g.2gb": 1, "1g.1gb": 2}) is None


def test_counts_to_layout_rejects_bad_input():
    with pytest.raises(UnknownMigProfile, match="1g.18gb"):
        mig_counts_to_layout(A100, {"1g.18gb": 1})
    with pytest.raises(ValueError, match="non-negative"):
        mig_counts_to_layout(A100, {"1g.5gb": -1})
    with pytest.raises(ValueError, match="non-negative"):
        mig_counts_to_layout(A100, {"1g.5gb": 1.5})


# ----------------------------------------------------------------------------- mig-parted

# NVIDIA/mig-parted examples/config.yaml, verbatim.
MIG_PARTED_EXAMPLE = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7

  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3

  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2

  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1

  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
    - devices: [6]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
    - devices: [7]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
"""


def test_import_nvidia_example():
    configs = mig_parted_import(MIG_PARTED_EXAMPLE)
    assert list(configs) == [
        "all-disabled", "all-enabled", "all-1g.5gb", "all-2g.10gb", "all-3g.20gb", "all-balanced", "custom-config",
    ]
    assert configs["all-disabled"] == [MigPartedEntry(devices="all", mig_enabled=False, counts={})]
    assert configs["all-enabled"] == [MigPartedEntry(devices="all", mig_enabled=True, counts={})]
    assert configs["all-balanced"][0].counts == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    custom = configs["custom-config"]
    assert [entry.devices for entry in custom] == [(0, 1, 2, 3), (4,), (5,), (6,), (7,)]
    assert [entry.mig_enabled for entry in custom] == [False, True, True, True, True]
    for entries in configs.values():
        for entry in entries:
            assert mig_counts_to_layout(A100, entry.counts) is not None


def test_import_device_filter():
    text = """\
version: v1
mig-configs:
  all-1g.10gb:
    - device-filter: ["0x233010DE", "0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 4
"""
    entries = mig_parted_import(text)["all-1g.10gb"]
    assert entries[0].device_filter == ("0x233010DE", "0x20B210DE")
    assert entries[1].device_filter == ("0x20B010DE",)
    assert mig_counts_to_layout("H100-SXM5-80GB", entries[0].counts) is not None
    assert mig_counts_to_layout(A100, entries[1].counts) == layout_parse("1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6")


def test_export_matches_mig_parted_format():
    text = mig_parted_export({
        "all-balanced": [(A100, "3g.20gb@4 2g.10gb@0 1g.5gb@2 1g.5gb@3")],
        "mixed": [("NVIDIA H100 80GB HBM3", None), ("H100-SXM5-80GB", []), ("H100-SXM5-80GB", "7g.80gb@0", [5, 6])],
    })
    assert text.startswith("version: v1\nmig-configs:\n")
    assert '        "3g.20gb": 1\n        "2g.10gb": 1\n        "1g.5gb": 2\n' in text
    assert "# A100-SXM4-40GB: 2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4" in text
    data = yaml.safe_load(text)
    assert data == {
        "version": "v1",
        "mig-configs": {
            "all-balanced": [
                {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
            ],
            "mixed": [
                {"devices": [0], "mig-enabled": False},
                {"devices": [1], "mig-enabled": True, "mig-devices": {}},
                {"devices": [5, 6], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
            ],
        },
    }
    imported = mig_parted_import(text)
    assert imported["mixed"][2] == MigPartedEntry(devices=(5, 6), mig_enabled=True, counts={"7g.80gb": 1})


def test_export_quotes_names_yaml_would_change():
    text = mig_parted_export({"true": [(A100, "7g.40gb@0")], "1": [(A100, "7g.40gb@0")], "a: b": [(A100, "")]})
    assert list(yaml.safe_load(text)["mig-configs"]) == ["true", "1", "a: b"]
    assert list(mig_parted_import(text)) == ["true", "1", "a: b"]


def test_export_rejects_bad_input():
    with pytest.raises(InvalidLayout, match="overlap"):
        mig_parted_export({"x": [(A100, "3g.20gb@0 2g.10gb@2")]})
    with pytest.raises(UnknownGpuModel):
        mig_parted_export({"x": [("NVIDIA T4", "")]})
    with pytest.raises(ValueError, match="at least one"):
        mig_parted_export({})
    with pytest.raises(ValueError, match="non-empty list"):
        mig_parted_export({"x": []})
    with pytest.raises(ValueError, match="given twice"):
        mig_parted_export({"x": [(A100, "", [0]), (A100, "", [0, 1])]})
    with pytest.raises(ValueError, match="single entry"):
        mig_parted_export({"x": [(A100, "", "all"), (A100, "")]})


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(MODELS).flatmap(
        lambda name: st.tuples(st.just(name), st.lists(st.sampled_from(mig_layouts_enumerate(name)), min_size=1, max_size=4))
    )
)
def test_mig_parted_round_trip(case):
    model_name, layouts = case
    text = mig_parted_export({"cfg": [(model_name, layout) for layout in layouts]})
    entries = mig_parted_import(text)["cfg"]
    assert len(entries) == len(layouts)
    for entry, layout in zip(entries, layouts):
        assert entry.mig_enabled is True
        assert entry.counts == layout_counts(layout)
        rebuilt = mig_counts_to_layout(model_name, entry.counts)
        assert rebuilt is not None
        assert layout_counts(rebuilt) == layout_counts(layout)
    expected_devices = ["all"] if len(layouts) == 1 else [(i,) for i in range(len(layouts))]
    assert [entry.devices for entry in entries] == expected_devices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\nmig-configs: [unclosed\n", "malformed YAML"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: all\n   mig-enabled: true\n", "malformed YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("", "must be a mapping"),
        ("version: v2\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n", "version"),
        ("mig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n", "version"),
        ("version: v1\nextra: 1\nmig-configs: {}\n", "unexpected top-level field"),
        ("version: v1\nmig-configs: {}\n", "non-empty mapping"),
        ("version: v1\nmig-configs:\n  a: []\n", r"mig-configs\.a: must be a non-empty list"),
        ("version: v1\nmig-configs:\n  a:\n    - mig-enabled: false\n", "missing required field 'devices'"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: all\n", "missing required field 'mig-enabled'"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: some\n      mig-enabled: false\n", r"a\[0\]\.devices"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: [0, -1]\n      mig-enabled: false\n", "non-negative"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: [1, 1]\n      mig-enabled: false\n", "listed twice"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: 1\n", "true or false"),
        ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n", "'mig-devices' is required"),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n"
            "      mig-devices:\n        \"1g.5gb\": 1\n",
            "while 'mig-enabled' is false",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices:\n        \"1g.5gb\": -2\n",
            "non-negative integer",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices:\n        \"big\": 1\n",
            "not a MIG profile name",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices: [1g.5gb]\n",
            "mapping of profile name to count",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      colour: red\n"
            "      mig-devices: {}\n",
            "unexpected field",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n"
            "  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n",
            "duplicate key 'a'",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - device-filter: 12\n      devices: all\n      mig-enabled: false\n",
            "PCI device id",
        ),
    ],
)
def test_malformed_mig_parted_config(text, message):
    with pytest.raises(MigPartedError, match=message) as excinfo:
        mig_parted_import(text)
    assert isinstance(excinfo.value, ValueError)


# ----------------------------------------------------------------------------- models described from NVML


def _nvml_table(model_name: str) -> list[dict]:
    return [{"name": p.name, "profile_id": p.profile_id, "memory_slices": p.memory_slices, "compute_slices": p.compute_slices,
             "memory_mb": p.memory_gb * 1000, "starts": list(p.starts), "max_count": p.max_count}
            for p in mig_catalogue_load().gpu_model_get(model_name).profiles]


def test_a_model_described_from_nvml_is_known_only_inside_its_context():
    import concurrent.futures

    from engine.geometry.catalogue import NVML_ORIGIN_LABEL, gpu_model_from_nvml, mig_catalogue_extended

    a800 = gpu_model_from_nvml("A800 40GB PCIe", 40960, _nvml_table(A100), nvml_names=("NVIDIA A800 40GB PCIe",))
    assert (a800.origin, a800.label, a800.memory_slices, a800.compute_slices) == ("nvml", f"A800 40GB PCIe ({NVML_ORIGIN_LABEL})", 8, 7)
    assert mig_catalogue_load().gpu_model_find("NVIDIA A800 40GB PCIe") is None
    with mig_catalogue_extended([a800]) as extended:
        assert mig_catalogue_load() is extended and mig_catalogue_load().gpu_model_get("NVIDIA A800 40GB PCIe") is a800
        assert len(mig_layouts_enumerate("A800 40GB PCIe", maximal=True)) == 239  # the A100's table, planned the same
        # Another thread (a concurrent solve) does not see it.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(lambda: mig_catalogue_load().gpu_model_find("A800 40GB PCIe")).result() is None
    assert mig_catalogue_load().gpu_model_find("A800 40GB PCIe") is None
    # A name the catalogue has keeps the catalogue's model.
    with mig_catalogue_extended([gpu_model_from_nvml("A100-SXM4-40GB", 1, _nvml_table("A30-24GB"))]):
        assert mig_catalogue_load().gpu_model_get("A100-SXM4-40GB").profile_names == mig_catalogue_load().gpu_model_get(A100).profile_names
        assert mig_catalogue_load().gpu_model_get("A100-SXM4-40GB").origin == "catalogue"


@pytest.mark.parametrize(("table", "message"), [
    ([], "no profiles"),
    ([{"name": "1g.5gb", "memory_slices": 1, "compute_slices": 1, "starts": [0, 0], "max_count": 1}], "strictly increasing"),
    ([{"name": "1g.5gb", "memory_slices": 1, "compute_slices": 1, "starts": [0], "max_count": 2}], "exceeds"),
    ([{"name": "one", "memory_slices": 1, "compute_slices": 1, "starts": [0], "max_count": 1}], "not a GPU instance profile name"),
    ([{"name": "1g.5gb", "compute_slices": 1, "starts": [0], "max_count": 1}], "malformed profile"),
])
def test_inconsistent_nvml_tables_are_refused(table, message):
    from engine.geometry.catalogue import gpu_model_from_nvml

    with pytest.raises(CatalogueError, match=message):
        gpu_model_from_nvml("X", 1024, table)
