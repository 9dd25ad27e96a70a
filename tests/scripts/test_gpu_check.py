"""scripts/gpu_check.py (issue 45) on a machine without a GPU: every GPU step skipped with its reason; the probe
against a fake NVML holding an H200 (the report an agent would send); and a CPU rehearsal of the measuring steps
and of the product end to end (real onnxruntime, real MPS orchestration with a fake control program, the embedded
control plane, a real agent and router), every row labelled a rehearsal."""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.fake_pynvml import FakeGpu, FakeNvml
from tests.workers.test_agent_mps import FakeControl

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env_drop = ("DATABASE_URL", "REDIS_URL")
    import os

    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _no_gpu_here() -> None:
    from tests.gpu import gpu_absent_reason

    if gpu_absent_reason() is None:
        pytest.skip("this machine has a GPU: the no-GPU behaviour is tested where there is none")


def test_without_a_gpu_every_gpu_step_is_skipped_and_says_why(tmp_path) -> None:
    _no_gpu_here()
    done = _run("--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = summary["steps"]
    assert steps["probe"]["status"] == "ok" and steps["probe"]["reason"].startswith("no GPU: no NVIDIA driver answers")
    for name in ("models", "profiles", "mps", "e2e"):
        assert steps[name]["status"] == "skipped", (name, steps[name])
        assert steps[name]["reason"].startswith("no GPU: "), (name, steps[name]["reason"])
    assert summary["provenance"]["git_commit"] and summary["provenance"]["rehearsal"] is False
    probe = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert probe["gpu_absent_reason"].startswith("no NVIDIA driver answers") and "agent_report" not in probe
    assert "CPUExecutionProvider" in probe["onnxruntime"]["providers"]
    assert "skipped" in done.stdout and "no GPU" in done.stdout

    required = _run("--out", str(tmp_path / "required"), "--require-gpu")
    assert required.returncode == 2 and "no GPU and --require-gpu" in required.stderr
    assert json.loads((tmp_path / "required" / "summary.json").read_text())["exit"] == 2


def test_the_probe_reports_what_an_agent_on_an_h200_would_send(tmp_path) -> None:
    gpu_check = _module()
    gpu = FakeGpu("H200-141GB", activity={"sm_active_pct": 40.0, "dram_active_pct": 25.0})
    nvml = FakeNvml([gpu])
    result, probe = gpu_check.probe_run(tmp_path, nvml=nvml, mps_control="no-such-mps-control")
    assert result.status == "ok" and result.reason == "1 GPU(s): NVIDIA H200"
    assert probe.device_type == "H200-141GB" and probe.gpu.mig_enabled is False and probe.mps_control is None
    doc = json.loads((tmp_path / "probe.json").read_text())
    (record,) = doc["gpus"]
    assert record["name"] == "NVIDIA H200" and record["mig_current"] == 0 and record["uuid"] == probe.gpu.uuid
    assert record["pci_device_id"] == "0x233510DE" and record["memory_mb"] == 143771 and record["compute_capability"] == "9.0"
    assert doc["driver_version"] == "550.54.15" and doc["cuda_driver_version"] == "12.4"
    report = doc["agent_report"]
    gpus = [a for a in report["accelerators"] if a["kind"] == "gpu"]
    assert report["backend"] == "nvml" and len(gpus) == 1
    assert gpus[0]["model_name"] == "NVIDIA H200" and gpus[0]["mig_capable"] is True and gpus[0]["mig_enabled"] is False
    assert gpus[0]["mps_enabled"] is False and report["runtimes"] == [] and report["catalogue_disagreements"] == []
    assert doc["agent_telemetry"][0]["uuid"] == probe.gpu.uuid
    # Read only: MIG stays as it was.
    assert gpu.mig_enabled is False

    mig = FakeNvml([FakeGpu("H200-141GB", mig_enabled=True)])
    _, probe = gpu_check.probe_run(tmp_path / "mig", nvml=mig)
    assert probe.gpu.mig_enabled is True
    with pytest.raises(gpu_check.StepSkipped, match="MIG is enabled"):
        gpu_check.mps_run(tmp_path / "mig", [], probe, control="/bin/true")


@pytest.mark.solo  # it times real work (co-runs, a load against an SLO), and its dozen processes would take the cores others time
def test_a_cpu_rehearsal_measures_profiles_mps_coruns_and_the_product_end_to_end(tmp_path) -> None:
    models = []
    for n, hidden in enumerate((16, 256)):
        path = tmp_path / f"mlp{n}.onnx"
        path.write_bytes(onnx_mlp_bytes(n_in=32, hidden=hidden, n_out=8, seed=n))
        models += ["--model", f"mlp{n}={path}"]
    control = FakeControl(tmp_path)
    out = tmp_path / "out"
    done = _run("--out", str(out), "--cpu-rehearsal", *models, "--architectures", "", "--batches", "1,4,16", "--min-time", "0.05",
                "--mps-control", str(control.path), "--mps-window", "0.3", "--e2e-model", "mlp1", "--e2e-seconds", "4",
                "--e2e-rps", "20", "--e2e-slo-ms", "200")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        control.kill_daemons()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["rehearsal"] is True
    assert [summary["steps"][s]["status"] for s in ("probe", "models", "profiles", "mps", "e2e")] == ["ok", "skipped", "ok", "ok", "ok"]

    profiles = _rows(out / "profiles.csv")
    assert sorted((r["model"], int(r["batch"])) for r in profiles) == [(m, b) for m in ("mlp0", "mlp1") for b in (1, 4, 16)]
    assert {r["runtime"] for r in profiles} == {"rehearsal-cpu"} and {r["providers"] for r in profiles} == {"CPUExecutionProvider"}
    assert all(float(r["latency_p99_ms"]) >= float(r["latency_p50_ms"]) > 0 for r in profiles)
    assert summary["steps"]["profiles"]["details"]["onnx_cuda_path"].startswith("rehearsal on the CPU")

    # MPS: a daemon of its own started and stopped through MpsControl; each model alone on three partitions, then
    # the pairs on complementary ones, measured over the same windows.
    calls = control.calls()
    assert calls[0]["argv"] == ["-d"] and calls[-1]["stdin"].strip() == "quit"
    assert calls[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == calls[-1]["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    solo = _rows(out / "mps_solo.csv")
    assert sorted((r["model"], int(r["percent"]), int(r["batch"])) for r in solo) == [
        (m, p, b) for m in ("mlp0", "mlp1") for p in (25, 50, 75) for b in (1, 8)]
    coruns = _rows(out / "mps_corun.csv")
    pairs = {(r["model"], r["corunner"]) for r in coruns}
    assert pairs == {("mlp0", "mlp1"), ("mlp0", "mlp0"), ("mlp1", "mlp1")}
    assert len(coruns) == 3 * 3 * 2 and all(float(r["factor"]) > 0 and float(r["corunner_factor"]) > 0 for r in coruns)
    assert {int(r["percent"]) for r in coruns} == {25, 50, 75}
    forms = {r["form"]: r for r in _rows(out / "mps_interference.csv")}
    assert forms["constant"]["status"] == forms["solo-linear"]["status"] == "validated by pair"
    assert float(forms["constant"]["p90"]) >= 0 and int(forms["constant"]["n"]) == len(coruns)
    for name in ("paper", "paper-log", "products-log", "operating-point-log"):
        assert forms[name]["status"] == "not validated" and "L2" in forms[name]["note"]

    # End to end: deployed with `tessera app deploy` (profiled by the agent, planned, rolled out), then loaded.
    e2e = json.loads((out / "e2e.json").read_text())
    assert "error" not in e2e, e2e.get("error")
    assert any("mlp1 is in service" in line for line in e2e["deploy_output"]) and e2e["device_type"] == "cpu"
    load = e2e["load"]
    # Every request answered, or (on a machine too busy to send it in time) not sent for lack of budget: none failed.
    assert load["sent"] > 40 and load["answered"] + load["not_sent"] == load["sent"] and load["errors"] == 0
    assert load["in_time"] > 0.8 * load["sent"] and 0 < load["p50_ms"] <= load["p99_ms"]
    assert e2e["prediction"]["plan"] is not None and e2e["prediction"]["latency_p99_ms"] is not None and e2e["slo_ms"] == 200
    assert len(_rows(out / "e2e_load.csv")) >= 4


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "x=/nonexistent.onnx"], "--model x: no file /nonexistent.onnx"),
    (["--model", "nothing"], "--model wants NAME=PATH[:SHAPE]"),
    (["--architectures", "resnet50,alexnet"], "unknown architectures alexnet"),
    (["--batches", "1,0"], "want whole numbers >= 1"),
    (["--steps", "probe,warp"], "unknown steps warp"),
])
def test_bad_options_are_refused_and_nothing_is_written(tmp_path, args, message) -> None:
    done = _run("--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "out").exists()
