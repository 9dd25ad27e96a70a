"""mig-parted both ways on mig-parted's own file: every config of NVIDIA's deployments/systemd/
config-default.yaml (a fixture, copied unchanged) imports for every GPU it applies to, places, exports and
re-imports equal; device-filter resolves per board; exports keep to the v1 spec's rules, checked here by a
validator written from api/spec/v1/spec.go, pkg/types and go-nvlib's profile grammar, not by the importer."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from engine.geometry.catalogue import mig_catalogue_load, pci_device_id_format
from engine.geometry.layout import InvalidLayout, layout_counts, layout_parse, mig_layout_validate
from engine.geometry.migparted import (
    DeviceFilter,
    MigPartedEntry,
    MigPartedError,
    MigPartedExportEntry,
    NODE_LABEL,
    mig_parted_export,
    mig_parted_import,
    mig_parted_node_configs,
    mig_parted_profile_parse,
    mig_parted_resolve,
)

CONFIG_DEFAULT = Path(__file__).parent / "data" / "mig-parted-config-default.yaml"
CATALOGUE = mig_catalogue_load()
# Every board: (model, PCI device id); a model described from NVML has none.
BOARDS = [(model.name, device_id) for model in CATALOGUE.gpu_models for device_id in model.pci_device_ids]
# Boards config-default.yaml configures that the catalogue leaves out on purpose (its notes say why):
# A800 and H800 export variants, and PG506-96GB.
RTX_PRO_6000_ONLY = {"all-1g.24gb", "all-1g.24gb.gfx", "all-1g.24gb-me", "all-2g.48gb", "all-2g.48gb.gfx"}
LEFT_OUT_BOARDS = {0x20F310DE, 0x20F510DE, 0x20F610DE, 0x232210DE, 0x232410DE, 0x233A10DE, 0x20B610DE}


@pytest.fixture(scope="module")
def default_configs() -> dict[str, list[MigPartedEntry]]:
    return mig_parted_import(CONFIG_DEFAULT.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the spec's rules, independently

_PROFILE = re.compile(r"^(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[+-][A-Za-z][A-Za-z0-9.]*(?<!\.)(?:,[A-Za-z][A-Za-z0-9.]*(?<!\.))*)?$")


def _go_uint32(text: str) -> bool:
    try:
        return 0 <= int(text, 0) <= 0xFFFFFFFF
    except ValueError:
        return False


def assert_valid_v1(text: str) -> dict:
    """Check a config by mig-parted's v1 rules (api/spec/v1/spec.go UnmarshalJSON of Spec and MigConfigSpec,
    pkg/types/device.go NewDeviceIDFromString, mig_config.go AssertValidFormat, go-nvlib parseMigProfile)."""
    data = yaml.safe_load(text)
    assert isinstance(data, dict) and set(data) == {"version", "mig-configs"}, "only version and mig-configs"
    assert data["version"] == "v1"
    configs = data["mig-configs"]
    assert isinstance(configs, dict) and configs, "at least one entry in 'mig-configs' is required"
    for name, entries in configs.items():
        assert isinstance(name, str)
        assert isinstance(entries, list) and entries, f"at least one entry in {name!r} is required"
        for entry in entries:
            assert isinstance(entry, dict)
            assert set(entry) <= {"device-filter", "devices", "mig-enabled", "mig-devices"}, entry
            assert {"devices", "mig-enabled"} <= set(entry), "missing required field"
            devices = entry["devices"]
            assert devices == "all" or (isinstance(devices, list) and all(type(d) is int for d in devices)), devices
            assert type(entry["mig-enabled"]) is bool
            if "device-filter" in entry:
                filters = entry["device-filter"]
                filters = [filters] if isinstance(filters, str) else filters
                assert isinstance(filters, list) and all(isinstance(f, str) for f in filters)
                for f in filters:
                    parts = f.split(":")
                    assert len(parts) <= 2 and all(_go_uint32(p) for p in parts), f
            devices_map = entry.get("mig-devices")
            if entry["mig-enabled"]:
                assert devices_map is not None, "missing required field 'mig-devices' when 'mig-enabled' is true"
            else:
                assert not devices_map, "MIG devices included when 'mig-enabled' is false"
            if devices_map:
                assert all(isinstance(k, str) and _PROFILE.match(k) for k in devices_map), devices_map
                assert all(type(v) is int and v >= 0 for v in devices_map.values())
                assert any(v > 0 for v in devices_map.values()), "all counts for all MigProfiles are 0"
    return data


def test_the_fixture_is_mig_parted_v1(default_configs):
    data = assert_valid_v1(CONFIG_DEFAULT.read_text(encoding="utf-8"))
    assert list(default_configs) == list(data["mig-configs"])
    assert len(default_configs) > 70


# ----------------------------------------------------------------------------- config-default.yaml, both ways


def test_every_filtered_board_is_in_the_catalogue_or_left_out_on_purpose(default_configs):
    boards = {f.device_id for entries in default_configs.values() for e in entries for f in e.filters}
    known = {d for _, d in BOARDS}
    assert boards - known == LEFT_OUT_BOARDS
    assert not LEFT_OUT_BOARDS & known


@pytest.mark.parametrize(("model_name", "device_id"), BOARDS, ids=[f"{m}-{pci_device_id_format(d)}" for m, d in BOARDS])
def test_config_default_imports_places_exports_and_reimports_equal_on_every_board(default_configs, model_name, device_id):
    applied, failing = 0, set()
    for name, entries in default_configs.items():
        targets = mig_parted_resolve(entries, model_name, device_id=device_id)
        failing |= {name for t in targets if t.status == "does_not_fit"}
        applying = [t for t in targets if t.status == "applies"]
        if not applying:
            continue
        applied += 1
        exported = mig_parted_export({name: [
            MigPartedExportEntry(model_name, t.layout, t.entry.devices, list(t.entry.device_filter or ()) or None)
            for t in applying
        ]})
        assert_valid_v1(exported)
        again = mig_parted_import(exported)[name]
        assert [(e.devices, e.mig_enabled, dict(e.counts), e.device_filter) for e in again] == [
            (t.entry.devices, t.entry.mig_enabled, dict(t.counts), t.entry.device_filter) for t in applying
        ]
        replaced = [t for t in mig_parted_resolve(again, model_name, device_id=device_id) if t.status == "applies"]
        assert [t.layout for t in replaced] == [t.layout for t in applying]
        for t in applying:
            if t.layout is not None:
                assert mig_layout_validate(model_name, t.layout).valid
    # all-disabled and all-enabled apply everywhere; a model mig-parted ships configs for gets more.
    assert applied >= 2
    # The file never asks a board for what the catalogue says it cannot hold, but for the RTX PRO 6000
    # configs (no device-filter) whose profile names RTX PRO 5000 shares with fewer slices: mig-parted
    # would fail to apply them there too.
    assert failing == (RTX_PRO_6000_ONLY if model_name == "RTX-PRO-5000-Blackwell-48GB" else set())


@pytest.mark.parametrize(("model_name", "device_id", "expected"), [
    ("A100-SXM4-40GB", 0x20B010DE, "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4"),
    ("A100-SXM4-80GB", 0x20B210DE, "2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4"),
    ("A30-24GB", 0x20B710DE, "2g.12gb@0 1g.6gb@2 1g.6gb@3"),
    ("H100-94GB", 0x232110DE, "2g.24gb@0 1g.12gb@2 1g.12gb@3 3g.47gb@4"),
    ("H20-96GB", 0x232910DE, "2g.24gb@0 1g.12gb@2 1g.12gb@3 3g.48gb@4"),
    ("GH200-144GB", 0x234810DE, "2g.36gb@0 1g.18gb@2 1g.18gb@3 3g.72gb@4"),
    ("GB200-186GB", 0x294110DE, "2g.47gb@0 1g.23gb@2 1g.23gb@3 3g.93gb@4"),
    ("B300-269GB", 0x318210DE, "2g.67gb@0 1g.34gb@2 1g.34gb@3 3g.135gb@4"),
    ("GB300-278GB", 0x31C210DE, "2g.70gb@0 1g.35gb@2 1g.35gb@3 3g.139gb@4"),
    ("RTX-PRO-6000-Blackwell-96GB", 0x2BB510DE, "2g.48gb@0 1g.24gb@6 1g.24gb@9"),
])
def test_all_balanced_plans_on_each_board(default_configs, model_name, device_id, expected):
    targets = mig_parted_resolve(default_configs["all-balanced"], model_name, device_id=device_id)
    (applying,) = [t for t in targets if t.status == "applies"]
    assert applying.layout == layout_parse(expected)
    assert all(t.status == "filtered_out" for t in targets if t is not applying)


def test_a_named_config_resolves_per_model_without_naming_the_board(default_configs):
    # The case: planning config-default's all-1g.10gb on A100-SXM4-40GB: the 40GB entry, 4 instances.
    targets = mig_parted_resolve(default_configs["all-1g.10gb"], "A100-SXM4-40GB")
    assert [t.status for t in targets] == ["filtered_out", "applies"]
    assert targets[1].layout == layout_parse("1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6")
    targets = mig_parted_resolve(default_configs["all-1g.10gb"], "NVIDIA A100 80GB PCIe")
    assert [t.status for t in targets] == ["applies", "filtered_out"] and len(targets[0].layout) == 7
    # A config for other GPUs, without a filter: not for this model, and why.
    (target,) = mig_parted_resolve(default_configs["all-1g.24gb.gfx"], "A100-SXM4-40GB")
    assert target.status == "not_for_model" and "1g.24gb+gfx" in target.reason
    (target,) = mig_parted_resolve(default_configs["all-1g.24gb"], "RTX-PRO-5000-Blackwell-48GB")
    assert target.status == "does_not_fit" and target.reason == "4 x 1g.24gb does not fit on RTX-PRO-5000-Blackwell-48GB"


def test_boards_of_one_model_that_the_filters_tell_apart(default_configs):
    # all-balanced names the RTX PRO 6000 Server Edition only; all-1g.35gb names the H200 SXM, not the NVL.
    with pytest.raises(MigPartedError, match=r"treat RTX-PRO-6000-Blackwell-96GB's boards differently.*0x2BB110DE: entries none"):
        mig_parted_resolve(default_configs["all-balanced"], "RTX-PRO-6000-Blackwell-96GB")
    workstation = mig_parted_resolve(default_configs["all-balanced"], "RTX-PRO-6000-Blackwell-96GB", device_id="0x2BB110DE")
    assert {t.status for t in workstation} == {"filtered_out"}
    sxm = mig_parted_resolve(default_configs["all-1g.35gb"], "H200-141GB", device_id=0x233510DE)
    assert [t.status for t in sxm] == ["applies", "filtered_out"] and layout_counts(sxm[0].layout) == {"1g.35gb": 4}
    nvl = mig_parted_resolve(default_configs["all-1g.35gb"], "H200-141GB", device_id=0x233B10DE)
    assert [t.status for t in nvl] == ["filtered_out", "filtered_out"]
    with pytest.raises(MigPartedError, match="0x20B010DE is not a PCI device id of H200-141GB"):
        mig_parted_resolve(default_configs["all-1g.35gb"], "H200-141GB", device_id="0x20B010DE")


def test_a_filter_that_names_the_board_and_does_not_fit_is_an_error():
    entries = mig_parted_import(
        'version: v1\nmig-configs:\n  x:\n    - device-filter: "0x20B010DE"\n      devices: all\n      mig-enabled: true\n'
        '      mig-devices:\n        "1g.5gb": 8\n    - device-filter: "0x20B010DE"\n      devices: [1]\n'
        '      mig-enabled: true\n      mig-devices:\n        "1g.18gb": 1\n'
    )["x"]
    first, second = mig_parted_resolve(entries, "A100-SXM4-40GB", device_id=0x20B010DE)
    assert (first.status, first.reason) == ("does_not_fit", "8 x 1g.5gb does not fit on A100-SXM4-40GB")
    assert second.status == "does_not_fit" and "1g.18gb" in second.reason


def test_renamed_and_compute_qualified_profile_names():
    entries = mig_parted_import(
        'version: v1\nmig-configs:\n  early:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n'
        '        "7g.189gb": 1\n  split:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n'
        '        "1c.3g.20gb": 2\n  whole:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n'
        '        "3c.3g.20gb": 2\n'
    )
    (early,) = mig_parted_resolve(entries["early"], "GB200-186GB")
    assert early.status == "applies" and early.counts == {"7g.186gb": 1}
    (split,) = mig_parted_resolve(entries["split"], "A100-SXM4-40GB")
    assert split.status == "does_not_fit" and "one full-size compute instance" in split.reason
    (whole,) = mig_parted_resolve(entries["whole"], "A100-SXM4-40GB")
    assert whole.status == "applies" and whole.layout == layout_parse("3g.20gb@0 3g.20gb@4")


# ----------------------------------------------------------------------------- the grammar


@pytest.mark.parametrize(("name", "parsed"), [
    ("1g.5gb", (1, 1, 5, (), ())),
    ("1c.3g.20gb", (1, 3, 20, (), ())),
    ("1g.24gb+me.all", (1, 1, 24, ("me.all",), ())),
    ("4g.96gb+gfx", (4, 4, 96, ("gfx",), ())),
    ("1g.24gb-me", (1, 1, 24, (), ("me",))),
    ("2c.4g.40gb+me,gfx", (2, 4, 40, ("me", "gfx"), ())),
])
def test_profile_names_parse_as_go_nvlib_parses_them(name, parsed):
    p = mig_parted_profile_parse(name)
    assert (p.compute, p.slices, p.gb, p.attributes, p.lacks) == parsed


@pytest.mark.parametrize("name", ["", "1g", "1g.5", "g.5gb", "1g.5gb+", "1g.5gb+me-x", "1g.5gb+9me", "1g.5gb+me.", "1g.5gb+me,me", "1G.5GB", " 1g.5gb"])
def test_malformed_profile_names(name):
    with pytest.raises(ValueError):
        mig_parted_profile_parse(name)


@pytest.mark.parametrize(("text", "printed", "device", "subsystem"), [
    ("0x20B010DE", "0x20B010DE", 0x20B010DE, None),
    ("0x20b010de", "0x20B010DE", 0x20B010DE, None),
    ("0x2BB510DE:0x204E10DE", "0x2BB510DE:0x204E10DE", 0x2BB510DE, 0x204E10DE),
    ("548409566", "0x20B010DE", 0x20B010DE, None),
])
def test_device_filters(text, printed, device, subsystem):
    f = DeviceFilter.parse(text)
    assert str(f) == printed and (f.device_id, f.subsystem_id) == (device, subsystem)
    assert f.matches(device, subsystem)
    assert not f.matches(device + 1, subsystem)
    if subsystem is not None:
        assert not f.matches(device, None)  # a subsystem filter needs the GPU's subsystem
    else:
        assert f.matches(device, 0x12345678)


@pytest.mark.parametrize("text", ["0xZZ", "0x1:0x2:0x3", "0x1FFFFFFFF", "", "board"])
def test_malformed_device_filters(text):
    with pytest.raises(ValueError):
        DeviceFilter.parse(text)


@pytest.mark.parametrize(("body", "message"), [
    ('    - devices: all\n      mig-enabled: true\n      mig-devices:\n        "1g.5gb": 0\n', "all counts are 0"),
    ('    - devices: all\n      device-filter: "0xZZ"\n      mig-enabled: false\n', "not a number"),
    ('    - devices: all\n      device-filter: [1]\n      mig-enabled: false\n', "PCI device id string"),
    ('    - devices: all\n      mig-enabled: true\n      mig-devices:\n        "1g.5gb+me-x": 1\n', "both"),
])
def test_malformed_entries(body, message):
    with pytest.raises(MigPartedError, match=message):
        mig_parted_import("version: v1\nmig-configs:\n  a:\n" + body)


def test_an_empty_filter_matches_every_gpu():
    (entry,) = mig_parted_import('version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: ""\n      mig-enabled: false\n')["a"]
    assert entry.device_filter is None and entry.matches_device(0x20B010DE)


# ----------------------------------------------------------------------------- exports for nodes


def test_node_configs_for_a_plan_are_valid_and_labelled():
    hosts = {
        "gpu-a.example": [(1, "A100-SXM4-40GB", "7g.40gb@0"), (0, "A100-SXM4-40GB", "3g.20gb@0 3g.20gb@4")],
        "gpu-b": [(0, "RTX-PRO-6000-Blackwell-96GB", "1g.24gb+me.all@0 1g.24gb-me@3"), (1, "A30-24GB", None)],
        "empty": [],
    }
    configs, labels = mig_parted_node_configs("tessera-plan-7", hosts)
    assert labels == {"gpu-a.example": "tessera-plan-7-gpu-a.example", "gpu-b": "tessera-plan-7-gpu-b"}
    text = mig_parted_export(configs)
    data = assert_valid_v1(text)
    assert data["mig-configs"]["tessera-plan-7-gpu-a.example"] == [
        {"device-filter": ["0x20B010DE", "0x20B110DE", "0x20F110DE"], "devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
        {"device-filter": ["0x20B010DE", "0x20B110DE", "0x20F110DE"], "devices": [1], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}},
    ]
    assert data["mig-configs"]["tessera-plan-7-gpu-b"][1] == {"device-filter": ["0x20B710DE"], "devices": [1], "mig-enabled": False}
    # Re-imported and resolved per GPU (index and board), the configs give back the planned layouts.
    imported = mig_parted_import(text)
    for host, gpus in hosts.items():
        for index, model, layout in gpus:
            model_spec = CATALOGUE.gpu_model_get(model)
            targets = [t for t in mig_parted_resolve(imported[labels[host]], model, device_id=model_spec.pci_device_ids[0])
                       if t.status == "applies" and t.entry.matches_index(index)]
            assert targets[-1].layout == (None if layout is None else layout_parse(layout))
    assert NODE_LABEL == "nvidia.com/mig.config"


def test_node_config_names_are_label_values():
    long_host = "h" * 80
    _, labels = mig_parted_node_configs("tessera-plan-12", {long_host: [(0, "A30-24GB", "4g.24gb@0")], "a_b": [(0, "A30-24GB", None)]})
    assert len(labels[long_host]) <= 63 and re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]", labels[long_host])
    assert labels["a_b"] == "tessera-plan-12-a_b"
    with pytest.raises(ValueError, match="no host"):
        mig_parted_node_configs("p", {"idle": []})
    with pytest.raises(InvalidLayout, match="profile 1g.5gb does not exist on A30-24GB"):
        mig_parted_export(mig_parted_node_configs("p", {"x": [(0, "A30-24GB", "1g.5gb@0")]})[0])


def test_export_filters_on_given_ids_and_refuses_models_without_any():
    from engine.geometry.catalogue import gpu_model_from_nvml

    text = mig_parted_export({"x": [MigPartedExportEntry("A30-24GB", "", "all", ["0x20B710DE:0x153210DE"])]})
    assert '    - device-filter: ["0x20B710DE:0x153210DE"]\n      devices: all\n' in text
    assert_valid_v1(text)
    nvml_model = gpu_model_from_nvml("NVIDIA A800 40GB PCIe", 40960, [
        {"name": "7g.40gb", "profile_id": 0, "memory_slices": 8, "compute_slices": 7, "memory_mb": 40192, "starts": [0], "max_count": 1},
    ])
    with pytest.raises(ValueError, match="no known PCI device id"):
        mig_parted_export({"x": [MigPartedExportEntry(nvml_model, "7g.40gb@0", "all", True)]})
    text = mig_parted_export({"x": [MigPartedExportEntry(nvml_model, "7g.40gb@0")]})
    assert "# NVIDIA A800 40GB PCIe (from NVML, not in the catalogue): 7g.40gb@0" in text
