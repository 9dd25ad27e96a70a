"""`tessera mig export --plan ID`: a stored plan's MIG geometry as one mig-parted config per host and the
nvidia.com/mig.config node label that selects it, checked by re-importing the config and resolving it on
each planned GPU."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from apps.planning.mig_export import plan_mig_parted_export
from controlplane.cli import app
from engine.geometry.layout import layout_parse
from engine.geometry.migparted import mig_parted_import, mig_parted_resolve

pytestmark = pytest.mark.django_db


def test_a_plan_exports_one_config_per_host_that_gives_back_its_layouts(small_fleet, validated_plan):
    plan = validated_plan({"classify": 2000, "tabular": 100})
    export = plan_mig_parted_export(plan=plan)
    config = f"tessera-plan-{plan.pk}-node-a"
    assert export.labels == {"node-a": config}  # node-cpu has no GPU
    assert export.label_lines() == [f"node-a: nvidia.com/mig.config={config}"]
    assert export.text.startswith(f"# Tessera plan {plan.pk} (validated): one config per node; set each node's "
                                  f"nvidia.com/mig.config label:\n#   node-a: nvidia.com/mig.config={config}\nversion: v1\n")
    entries = mig_parted_import(export.text)[config]
    planned = {g["index"]: g for g in plan.desired_states["node-a"]["gpus"]}
    assert sorted(i for e in entries for i in e.devices) == sorted(planned)
    for gpu_index, gpu in planned.items():
        applying = [t for t in mig_parted_resolve(entries, "A100-SXM4-40GB", device_id=0x20B010DE)
                    if t.status == "applies" and t.entry.matches_index(gpu_index)]
        expected = layout_parse(gpu["layout"]) if gpu["mig_enabled"] else None
        assert applying[-1].layout == expected and applying[-1].entry.mig_enabled is gpu["mig_enabled"]
        assert applying[-1].entry.device_filter == ("0x20B010DE", "0x20B110DE", "0x20F110DE")


def test_the_cli_prints_the_config_and_the_labels(small_fleet, validated_plan, tmp_path):
    plan = validated_plan({"classify": 2000, "tabular": 100})
    runner = CliRunner()
    printed = runner.invoke(app, ["mig", "export", "--plan", str(plan.pk)])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == plan_mig_parted_export(plan=plan).text
    out = tmp_path / "config.yaml"
    written = runner.invoke(app, ["mig", "export", "--plan", str(plan.pk), "--out", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text() == printed.stdout
    assert f"label node-a: nvidia.com/mig.config=tessera-plan-{plan.pk}-node-a" in written.stdout
    missing = runner.invoke(app, ["mig", "export", "--plan", "999999"])
    assert missing.exit_code == 2 and "no plan 999999" in missing.stderr
    placements = runner.invoke(app, ["mig", "export", "--plan", str(plan.pk), "7g.40gb@0"])
    assert placements.exit_code == 2 and "takes no placements" in placements.stderr


def test_a_plan_without_mig_gpus_says_so(small_fleet, validated_plan):
    plan = validated_plan({"tabular": 100})
    plan.desired_states = {"node-cpu": plan.desired_states["node-cpu"]}
    plan.save(update_fields=["desired_states"])
    with pytest.raises(ValueError, match="no host has a MIG-capable GPU"):
        plan_mig_parted_export(plan=plan)
