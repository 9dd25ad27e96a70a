"""Smoke runs of the paper-reproduction benchmarks (benches/batching.py, benches/end_to_end.py,
benches/mig_granularity.py --quick): each runs end to end in a subprocess, cites the reference data and
writes a CSV with rows. The full runs, and what their numbers mean, are the benchmarks' business."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_quick(script: str, out: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / script), "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=55,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "engine/reference/data/gpulet" in result.stdout
    return result.stdout


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def figure_or_reason(stdout: str, png: Path) -> None:
    assert png.exists() or "PNG skipped" in stdout


@pytest.mark.timeout(60)
def test_batching_bench_quick(tmp_path: Path) -> None:
    stdout = run_quick("batching.py", tmp_path)
    rows = csv_rows(tmp_path / "batching.csv")
    assert {r["batching"] for r in rows} == {"proteus", "aimd", "nexus", "quantile"}
    assert {r["arrival"] for r in rows} == {"uniform", "poisson", "gamma"}
    assert all(int(r["queries"]) > 0 and 0.0 <= float(r["slo_violation_ratio"]) <= 1.0 for r in rows)
    assert "single static plan" in stdout
    # Where the violations fall: the batch-1 instances' share is counted within each run's own totals.
    assert "Where nexus's violations fall" in stdout
    assert all(0 <= int(r["violations_batch1"]) <= int(r["queries"]) - int(r["on_time"]) and int(r["queries_batch1"]) <= int(r["queries"])
               for r in rows)
    figure_or_reason(stdout, tmp_path / "batching.png")


@pytest.mark.timeout(60)
def test_end_to_end_bench_quick(tmp_path: Path) -> None:
    stdout = run_quick("end_to_end.py", tmp_path)
    rows = csv_rows(tmp_path / "end_to_end.csv")
    assert not [r for r in rows if r["error"]], [(r["row"], r["error"]) for r in rows if r["error"]]
    names = {r["row"] for r in rows}
    assert {"clipper-ha", "clipper-ht", "sommelier", "infaas", "proteus", "joint"} <= names
    assert {"no model selection", "no placement (frozen)", "no query assignment (uniform)"} <= names
    assert all(int(r["queries"]) > 0 for r in rows)
    assert (tmp_path / "end_to_end_series.csv").exists()
    figure_or_reason(stdout, tmp_path / "end_to_end.png")


@pytest.mark.timeout(60)
def test_mig_granularity_bench_quick(tmp_path: Path) -> None:
    stdout = run_quick("mig_granularity.py", tmp_path)
    rows = csv_rows(tmp_path / "mig_granularity.csv")
    assert not [r for r in rows if r["error"]], [(r["row"], r["error"]) for r in rows if r["error"]]
    assert {"garrison-demand", "joint", "fleet (default)", "proteus, all 1g.5gb (7)", "proteus, all 7g.40gb (1)"} <= {r["row"] for r in rows}
    assert all(int(r["queries"]) > 0 for r in rows)
    figure_or_reason(stdout, tmp_path / "mig_granularity.png")


@pytest.mark.timeout(60)
def test_gpulets_interference_bench(tmp_path: Path) -> None:
    stdout = run_quick("gpulets_interference.py", tmp_path)
    rows = csv_rows(tmp_path / "gpulets_interference.csv")
    from engine.sharing.interference import INTERFERENCE_FORMS

    assert {r["form"] for r in rows} == set(INTERFERENCE_FORMS)
    assert all(0.0 < float(r["p50"]) <= float(r["p90"]) <= float(r["p95"]) <= float(r["max"]) for r in rows)
    assert "10.26" in stdout  # the paper's figure, side by side
    figure_or_reason(stdout, tmp_path / "gpulets_interference.png")


@pytest.mark.timeout(180)
def test_gpulets_bench_small_sample(tmp_path: Path) -> None:
    """benches/gpulets.py on 4 scenarios (its --quick takes 100, about 150 s on 2 cores): every policy's
    schedules are valid and the paper's figures are printed beside the measured ones."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "gpulets.py"), "--scenarios", "4", "--jobs", "1", "--out", str(tmp_path),
         "--mixes", "scen2", "--sim-seconds", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "engine/reference/data/gpulet" in result.stdout and "92.6" in result.stdout
    rows = csv_rows(tmp_path / "gpulets.csv")
    assert len(rows) == 4
    assert all(r[f"{p}: invalid"] == "0" for r in rows for p in ("gpulets", "sbp", "best-fit", "ideal"))
    assert all(float(r["ideal: max scale"]) > 0 for r in rows)
    summary = {r["policy"]: r for r in csv_rows(tmp_path / "gpulets_summary.csv")}
    assert set(summary) == {"gpulets", "gpulets (no int)", "sbp", "best-fit", "ideal"}
    # The simulated throughput of Figure 13, on one mix: every policy found a rate it serves within 1 %.
    throughput = csv_rows(tmp_path / "gpulets_throughput.csv")
    assert {r["policy"] for r in throughput} == {"gpulets", "gpulets (no int)", "sbp", "best-fit", "fleet", "fleet (idle)"}
    assert all(float(r["max_throughput_rps"]) > 0 and float(r["misses_at_max"]) <= 0.01 for r in throughput)
    assert "61.7" in result.stdout and "Simulated SLO-preserved max throughput" in result.stdout
    assert "fleet (the default) over SBP" in result.stdout and "fleet ahead of SBP and best-fit (ramp) on" in result.stdout
    figure_or_reason(result.stdout, tmp_path / "gpulets.png")
