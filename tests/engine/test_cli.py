"""The engine's `tessera` subcommands (mig validate/layouts/export/import, plan solve/validate), run through
Typer's CliRunner: output and exit codes (0 fine, 1 invalid, 2 malformed input, 3 for `plan solve`: a valid plan
that leaves demand unserved)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from engine.geometry.catalogue import mig_catalogue_load

from .test_problem_format import small_problem_dict

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def problem_file(tmp_path: Path) -> Path:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(small_problem_dict()))
    return path


# ----------------------------------------------------------------------------- mig


def test_mig_validate_valid_layout() -> None:
    result = run("mig", "validate", "--gpu", "A100-SXM4-40GB", "3g.20gb@0", "2g.10gb@4", "1g.5gb@6")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "valid: 3g.20gb@0 2g.10gb@4 1g.5gb@6 on A100-SXM4-40GB"


def test_mig_validate_accepts_nvml_names() -> None:
    result = run("mig", "validate", "--gpu", "NVIDIA H100 80GB HBM3", "7g.80gb@0")
    assert result.exit_code == 0, result.output
    assert "on H100-SXM5-80GB" in result.stdout


@pytest.mark.parametrize(
    "placements, reason",
    [
        (["3g.20gb@0", "2g.10gb@2"], "invalid: 3g.20gb@0 overlaps 2g.10gb@2 on memory slices 2-3"),
        (["3g.20gb@2"], "invalid: 3g.20gb@2: start 2 is not a legal start for 3g.20gb on A100-SXM4-40GB (legal: 0, 4)"),
        (["3g.40gb@0"], "invalid: 3g.40gb@0: profile 3g.40gb does not exist on A100-SXM4-40GB"),
        (["1g.5gb+me@0", "1g.5gb+me@1"], "at most one media-extension (+me or +me.all) instance"),
    ],
)
def test_mig_validate_invalid_layout_exits_1_with_the_reason(placements: list[str], reason: str) -> None:
    result = run("mig", "validate", "--gpu", "A100-SXM4-40GB", *placements)
    assert result.exit_code == 1, result.output
    assert reason in result.stdout


def test_mig_validate_unknown_gpu_exits_2() -> None:
    result = run("mig", "validate", "--gpu", "V100-SXM2-16GB", "3g.20gb@0")
    assert result.exit_code == 2
    assert "unknown GPU model 'V100-SXM2-16GB'" in result.stderr
    assert "A100-SXM4-40GB" in result.stderr


def test_mig_validate_malformed_placement_exits_2() -> None:
    result = run("mig", "validate", "--gpu", "A100-SXM4-40GB", "3g.20gb")
    assert result.exit_code == 2
    assert "malformed placement '3g.20gb'" in result.stderr


def test_mig_layouts_lists_one_per_line() -> None:
    result = run("mig", "layouts", "--gpu", "A100-SXM4-40GB", "--maximal")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "3g.20gb@0 3g.20gb@4" in lines
    assert "4g.20gb@0 3g.20gb@4" in lines
    assert "7g.40gb@0" in lines
    assert "3g.20gb@0" not in lines  # not maximal: a 3g.20gb@4 still fits
    assert len(lines) == len(set(lines))


def test_mig_layouts_json_matches_the_text_and_includes_the_empty_layout() -> None:
    text = run("mig", "layouts", "--gpu", "A100-SXM4-40GB")
    data = run("mig", "layouts", "--gpu", "A100-SXM4-40GB", "--json")
    assert text.exit_code == data.exit_code == 0
    layouts = json.loads(data.stdout)
    assert [] in layouts and "-" in text.stdout.splitlines()
    assert len(layouts) == len(text.stdout.splitlines())
    assert [" ".join(layout) or "-" for layout in layouts] == text.stdout.splitlines()


def test_mig_layouts_unknown_gpu_exits_2() -> None:
    assert run("mig", "layouts", "--gpu", "T4").exit_code == 2


def test_mig_export_then_import_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "config.yaml"
    result = run("mig", "export", "--gpu", "A100-SXM4-40GB", "--name", "inference", "--out", str(out), "3g.20gb@0", "2g.10gb@4", "1g.5gb@6")
    assert result.exit_code == 0, result.output
    assert "# A100-SXM4-40GB: 3g.20gb@0 2g.10gb@4 1g.5gb@6" in out.read_text()
    back = run("mig", "import", str(out), "--gpu", "A100-SXM4-40GB")
    assert back.exit_code == 0, back.output
    assert "inference:" in back.stdout
    assert "devices all: 1 x 3g.20gb, 1 x 2g.10gb, 1 x 1g.5gb -> 3g.20gb@0 2g.10gb@4 1g.5gb@6" in back.stdout


def test_mig_export_invalid_layout_exits_1() -> None:
    result = run("mig", "export", "--gpu", "A100-SXM4-40GB", "4g.20gb@0", "3g.20gb@0")
    assert result.exit_code == 1
    assert "invalid:" in result.stdout


def test_mig_import_refuses_malformed_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v2\nmig-configs: {}\n")
    result = run("mig", "import", str(bad))
    assert result.exit_code == 2
    assert "unsupported mig-parted config version" in result.stderr


def test_mig_import_counts_that_do_not_fit_exit_1(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        3g.20gb: 2\n        1g.5gb: 1\n")
    result = run("mig", "import", str(config), "--gpu", "A100-SXM4-40GB")
    assert result.exit_code == 1
    assert "does not fit on A100-SXM4-40GB" in result.stdout


CONFIG_DEFAULT = Path(__file__).parent / "data" / "mig-parted-config-default.yaml"


@pytest.mark.parametrize("gpu", [m.name for m in mig_catalogue_load().gpu_models] + ["NVIDIA A30", "NVIDIA GB200", "NVIDIA H100 NVL"])
def test_mig_layouts_of_every_catalogue_gpu(gpu: str) -> None:
    result = run("mig", "layouts", "--gpu", gpu, "--maximal")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines and "-" not in lines
    for line in lines:
        assert run("mig", "validate", "--gpu", gpu, *line.split()).exit_code == 0, line


def test_mig_import_plans_mig_parted_config_default_per_gpu() -> None:
    result = run("mig", "import", str(CONFIG_DEFAULT), "--gpu", "A100-SXM4-40GB")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert ("all-1g.10gb:\n  devices all [0x233010DE, 0x233110DE, 0x232210DE, 0x20B210DE, 0x20B510DE, 0x20F310DE, "
            "0x20F510DE, 0x232410DE]: 7 x 1g.10gb -> not for this board") in out
    assert "  devices all [0x20B010DE, 0x20B110DE, 0x20F110DE, 0x20F610DE]: 4 x 1g.10gb -> 1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6" in out
    assert "all-balanced:" in out and "2 x 1g.5gb, 1 x 2g.10gb, 1 x 3g.20gb -> 2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4" in out
    assert "all-1g.24gb.gfx:\n  devices all: 4 x 1g.24gb+gfx -> for other GPUs: profile '1g.24gb+gfx' does not exist" in out
    assert "CANNOT APPLY" not in out


def test_mig_import_one_config_on_a_board() -> None:
    result = run("mig", "import", str(CONFIG_DEFAULT), "--gpu", "RTX-PRO-6000-Blackwell-96GB", "--config", "all-balanced")
    assert result.exit_code == 2 and "treat RTX-PRO-6000-Blackwell-96GB's boards differently" in result.stderr
    result = run("mig", "import", str(CONFIG_DEFAULT), "--gpu", "RTX-PRO-6000-Blackwell-96GB", "--config", "all-balanced",
                 "--pci-id", "0x2BB510DE")
    assert result.exit_code == 0, result.output
    assert "devices all [0x2BB510DE]: 2 x 1g.24gb, 1 x 2g.48gb -> 2g.48gb@0 1g.24gb@6 1g.24gb@9" in result.stdout
    result = run("mig", "import", str(CONFIG_DEFAULT), "--gpu", "RTX-PRO-6000-Blackwell-96GB", "--config", "all-balanced",
                 "--pci-id", "0x2BB110DE")
    assert result.exit_code == 1
    assert "no entry of all-balanced applies to RTX-PRO-6000-Blackwell-96GB" in result.stdout
    result = run("mig", "import", str(CONFIG_DEFAULT), "--gpu", "RTX-PRO-5000-Blackwell-48GB", "--config", "all-1g.24gb")
    assert result.exit_code == 1
    assert "4 x 1g.24gb -> CANNOT APPLY: 4 x 1g.24gb does not fit on RTX-PRO-5000-Blackwell-48GB" in result.stdout
    assert run("mig", "import", str(CONFIG_DEFAULT), "--config", "nope").exit_code == 2
    assert run("mig", "import", str(CONFIG_DEFAULT), "--pci-id", "0x2BB510DE").exit_code == 2


def test_mig_export_with_the_models_device_filter() -> None:
    result = run("mig", "export", "--gpu", "A30-24GB", "--device-filter", "--devices", "0,1", "2g.12gb+me@0", "1g.6gb@2", "1g.6gb@3")
    assert result.exit_code == 0, result.output
    assert '    - device-filter: ["0x20B710DE"]\n      devices: [0, 1]\n      mig-enabled: true\n' in result.stdout
    assert '        "2g.12gb+me": 1\n        "1g.6gb": 2\n' in result.stdout
    assert run("mig", "export", "--gpu", "A30-24GB", "--plan", "3").exit_code == 2
    assert run("mig", "export").exit_code == 2


# ----------------------------------------------------------------------------- plan


def test_plan_solve_writes_a_valid_plan_and_validate_agrees(problem_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = run("plan", "solve", "--problem", str(problem_file), "--solver", "proteus", "--objective", "max-accuracy",
                 "--time-limit", "20", "--backend", "highs", "--out", str(out))
    assert result.exit_code == 0, result.output
    for label in ("status", "objective", "bound", "gap", "solve time", "accuracy", "served", "GPUs used", "verdict      valid"):
        assert label in result.stdout
    assert "served       960 / 960 rps" in result.stdout
    plan = json.loads(out.read_text())
    assert plan["format_version"] == 1 and plan["solver"].startswith("proteus")
    check = run("plan", "validate", "--problem", str(problem_file), "--plan", str(out))
    assert check.exit_code == 0, check.output
    assert check.stdout.startswith("verdict      valid")


@pytest.mark.parametrize("solver", ["joint", "garrison"])
@pytest.mark.parametrize("objective", ["max-accuracy", "min-gpus"])
def test_plan_solve_other_planners(problem_file: Path, tmp_path: Path, solver: str, objective: str) -> None:
    out = tmp_path / "plan.json"
    result = run("plan", "solve", "--problem", str(problem_file), "--solver", solver, "--objective", objective,
                 "--time-limit", "20", "--gap", "0", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "verdict      valid" in result.stdout
    assert json.loads(out.read_text())["objective_kind"] == objective


def test_plan_validate_lists_errors_and_exits_1(problem_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert run("plan", "solve", "--problem", str(problem_file), "--solver", "joint", "--out", str(out)).exit_code == 0
    plan = json.loads(out.read_text())
    first = plan["instances"][0]
    first["assigned_rps"] = first["capacity_rps"] * 2
    plan["routing"] = {app: [dict(e, weight=-e["weight"]) for e in entries] for app, entries in plan["routing"].items()}
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(plan))
    result = run("plan", "validate", "--problem", str(problem_file), "--plan", str(tampered))
    assert result.exit_code == 1
    assert "verdict      INVALID" in result.stdout
    assert f"error: instance {first['id']}: assigned" in result.stdout and "exceeds its capacity" in result.stdout
    assert "weight must be a non-negative number" in result.stdout


def test_plan_validate_hand_written_plan(problem_file: Path, tmp_path: Path) -> None:
    # A plan from another tool: one T4 instance serving all of detect, classify not served at all.
    plan = {
        "status": "feasible", "solver": "hand", "objective_kind": "max-accuracy",
        "served_rps": {"classify": 0, "detect": 60}, "shortfall_rps": {"classify": 900, "detect": 0},
        "instances": [{"device": "t4-0", "slice": "full", "start": None, "variant": "yolo_l", "batch": 6,
                       "latency_ms": 100.0, "capacity_rps": 60.0, "assigned_rps": 60.0}],
        "routing": {"detect": [{"instance": "t4-0/full", "weight": 1.0}]},
        "effective_accuracy": 0.5, "gpus_used": 1,
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = run("plan", "validate", "--problem", str(problem_file), "--plan", str(path))
    assert result.exit_code == 0, result.output
    plan["instances"][0]["batch"] = 8  # (10 + 5*8) * 2.5 = 125 ms > 100 ms
    path.write_text(json.dumps(plan))
    result = run("plan", "validate", "--problem", str(problem_file), "--plan", str(path))
    assert result.exit_code == 1
    assert "instance t4-0/full: batch 8 of yolo_l takes 125 ms, over the latency budget 100 ms" in result.stdout


def test_plan_solve_malformed_problem_exits_2(tmp_path: Path) -> None:
    raw = small_problem_dict()
    raw["applications"][0]["slo_ms"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    result = run("plan", "solve", "--problem", str(path), "--solver", "proteus")
    assert result.exit_code == 2
    assert "applications[0].slo_ms: -1 is less than or equal to the minimum of 0" in result.stderr


def test_plan_solve_inconsistent_problem_exits_2(tmp_path: Path) -> None:
    raw = small_problem_dict()
    raw["variants"][0]["application"] = "segment"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    result = run("plan", "solve", "--problem", str(path), "--solver", "proteus")
    assert result.exit_code == 2
    assert "variants[0] (resnet18): unknown application 'segment'" in result.stderr


def test_plan_solve_not_json_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{")
    result = run("plan", "solve", "--problem", str(path), "--solver", "proteus")
    assert result.exit_code == 2
    assert "is not valid JSON" in result.stderr


def test_plan_solve_missing_file_exits_2(tmp_path: Path) -> None:
    result = run("plan", "solve", "--problem", str(tmp_path / "nope.json"))
    assert result.exit_code == 2
    assert "cannot read problem" in result.stderr


@pytest.mark.parametrize(
    "option, value, message",
    [("--solver", "cplex", "--solver must be one of proteus, joint, garrison"),
     ("--objective", "min-cost", "--objective must be one of max-accuracy, min-gpus"),
     ("--backend", "gurobi", "--backend must be one of highs, cbc"),
     ("--time-limit", "0", "--time-limit must be positive"),
     ("--gap", "2", "--gap must be between 0 and 1")],
)
def test_plan_solve_bad_options_exit_2(problem_file: Path, option: str, value: str, message: str) -> None:
    result = run("plan", "solve", "--problem", str(problem_file), option, value)
    assert result.exit_code == 2
    assert message in result.stderr


def test_plan_solve_with_demand_left_unserved_exits_3(tmp_path: Path) -> None:
    """A valid plan that cannot serve every application is no success: the summary and a SHORTFALL line say
    how much is unserved, and the exit is 3 (the plan is still written). Ten times the small problem's
    demand, on its own fleet."""
    raw = small_problem_dict()
    for app in raw["applications"]:
        app["demand_rps"] *= 10
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(raw))
    out = tmp_path / "plan.json"
    result = run("plan", "solve", "--problem", str(path), "--solver", "proteus", "--out", str(out))
    assert result.exit_code == 3, result.output
    assert "verdict      valid" in result.stdout and "SHORT of demand" in result.stdout
    assert "SHORTFALL" in result.stdout and " rps unserved: " in result.stdout
    plan = json.loads(out.read_text())
    assert sum(plan["shortfall_rps"].values()) > 0
    # The same plan is valid: `plan validate` checks validity, not service, and exits 0.
    assert run("plan", "validate", "--problem", str(path), "--plan", str(out)).exit_code == 0


def test_plan_solve_that_serves_nothing_exits_3(tmp_path: Path) -> None:
    """An MPS problem on a fleet without MPS GPUs: an infeasible plan, every application short, exit 3."""
    from engine.reference.gpulet_problem import gpulet_mps_problem_dict

    raw = gpulet_mps_problem_dict({"resnet50": 100.0}, gpus=1)
    raw["devices"][0]["mps"] = False
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(raw))
    result = run("plan", "solve", "--problem", str(path), "--solver", "gpulets")
    assert result.exit_code == 3, result.output
    assert "status       infeasible, SHORT of demand (gpulets" in result.stdout
    assert "SHORTFALL    100 of 100 rps unserved: resnet50 100" in result.stdout


def test_plan_validate_malformed_plan_exits_2(problem_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"status": "optimal", "instances": [{"device": "t4-0"}]}))
    result = run("plan", "validate", "--problem", str(problem_file), "--plan", str(path))
    assert result.exit_code == 2
    assert "(top level): 'routing' is a required property" in result.stderr
    assert "instances[0]: 'slice' is a required property" in result.stderr


def test_simulate_offers_every_batching_policy() -> None:
    from controlplane.cli.simulate import SIMULATE_BATCHING
    from engine.dataplane.batching import BATCHING_POLICIES, REFERENCE_BATCHING_POLICIES

    assert SIMULATE_BATCHING == BATCHING_POLICIES + REFERENCE_BATCHING_POLICIES


def test_engine_commands_do_not_set_up_django() -> None:
    # `controlplane/__init__` loads Celery (which touches django.conf); the engine commands must add
    # nothing Django on top of that, must not configure settings, and --help must not load the solvers.
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from controlplane.cli import app\n"
        "before = set(sys.modules)\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0 and 'mig' in r.output and 'plan' in r.output, r.output\n"
        "assert 'pulp' not in sys.modules and 'engine.geometry.layout' not in sys.modules\n"
        "r = CliRunner().invoke(app, ['mig', 'validate', '--gpu', 'A100-SXM4-40GB', '7g.40gb@0'])\n"
        "assert r.exit_code == 0, r.output\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('django', 'rest_framework', 'apps.inventory', 'apps.core'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_plan_solve_threads_option(problem_file: Path, tmp_path: Path) -> None:
    ok = run("plan", "solve", "--problem", str(problem_file), "--backend", "cbc", "--threads", "2", "--out", str(tmp_path / "p.json"))
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert "verdict      valid" in ok.stdout
    bad = run("plan", "solve", "--problem", str(problem_file), "--threads", "0")
    assert bad.exit_code == 2 and "--threads must be at least 1" in bad.stderr


def test_plan_solve_headroom_target_option(tmp_path: Path) -> None:
    """--headroom-target reaches the fleet planner (issue 42): at light load the plan is the most accurate at
    1.5x every demand, and says so; out of range is refused before anything is solved."""
    from engine.plans.problem import problem_to_dict
    from engine.reference.generate import mig_fleet_problem

    path = tmp_path / "light.json"
    path.write_text(json.dumps(problem_to_dict(mig_fleet_problem(2, "A100-SXM4-40GB", n_applications=3, seed=0, load=0.3))))
    ok = run("plan", "solve", "--problem", str(path), "--headroom-target", "1.5", "--out", str(tmp_path / "p.json"))
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert "verdict      valid" in ok.stdout and "headroom target 1.5x" in ok.stdout
    assert json.loads((tmp_path / "p.json").read_text())["status"] == "optimal"
    for bad_value in ("0.5", "11"):
        bad = run("plan", "solve", "--problem", str(path), "--headroom-target", bad_value)
        assert bad.exit_code == 2 and "--headroom-target must be between 1 and 10" in bad.stderr
