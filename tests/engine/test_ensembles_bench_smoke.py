"""Smoke run of benches/ensembles.py (Garrison Figures 7 and 9a in kind, and the sampler's fidelity) on a
tiny configuration: one scenario, the garrison plan and one homogeneous allocation, one second of traffic.
It runs end to end in a subprocess with the shipped learned policy, cites the reference data, and writes
the CSVs with a row for every scheduler. What the full run's numbers mean is the bench's business."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEDULERS = {"full", "random", "fixed", "learned"}
COLUMNS = ("section", "scenario", "allocation", "probabilities", "scheduler", "name", "size", "slo_ms", "rate_rps", "instances", "slices",
           "queries", "p50_ms", "p99_ms", "p99_ok", "violation_ratio", "mean_ensemble", "mean_voted", "bias_rms", "bias_max", "bias_expected",
           "policy", "wall_s", "error")
SUMMARY_COLUMNS = ("scenario", "allocation", "members", "slo_ms", "rate_rps", "instances", "slices", "largest_fixed_ok", "largest_fixed_p99_ms",
                   "next_fixed_p99_ms", "full_p99_ms", "full_violation_ratio", "learned_mean", "learned_p99_ms", "learned_violation_ratio",
                   "learned_ok", "robustness_proxy", "error")


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.timeout(60)
def test_ensembles_bench_quick_on_one_scenario(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "ensembles.py"), "--quick", "--scenarios", "table1-a", "--allocations", "garrison,fleet,1g,7g",
         "--duration", "1", "--jobs", "1", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=55,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "engine/reference/data/gpulet" in result.stdout and "engine/ensembles/policies" in result.stdout
    with (tmp_path / "ensembles.csv").open() as fh:
        assert tuple(next(csv.reader(fh))) == COLUMNS
    rows = csv_rows(tmp_path / "ensembles.csv")
    served = [r for r in rows if not r["error"]]
    for section, allocation in (("ensemble", "garrison"), ("ensemble", "fleet"), ("ensemble", "1g"), ("fidelity", "garrison")):
        kinds = {r["scheduler"] for r in served if (r["section"], r["allocation"]) == (section, allocation)}
        assert kinds == SCHEDULERS, (section, allocation, kinds)
    assert all(int(r["queries"]) > 0 and 0.0 <= float(r["violation_ratio"]) <= 1.0 and float(r["bias_rms"]) >= 0.0 for r in served)
    full = next(r for r in served if r["scheduler"] == "full" and r["allocation"] == "garrison" and r["section"] == "ensemble")
    assert float(full["mean_ensemble"]) == 10.0  # Table 1's scenario A: ten members, every one answers
    # 7g has 8 GIs for 10 members: reported as not built, with the reason, for every scheduler.
    assert {r["scheduler"] for r in rows if r["allocation"] == "7g" and "8 GIs" in r["error"]} == SCHEDULERS
    summary = csv_rows(tmp_path / "ensembles_summary.csv")
    with (tmp_path / "ensembles_summary.csv").open() as fh:
        assert tuple(next(csv.reader(fh))) == SUMMARY_COLUMNS
    assert {s["allocation"] for s in summary} == {"garrison", "fleet", "1g", "7g"}
    # The default planner is planned (its plan's status and slices printed) and compared with the best homogeneous.
    assert "table1-a fleet: " in result.stdout and "best homogeneous 1g" in result.stdout and "fleet " in result.stdout.split("best homogeneous 1g")[1]
    assert all(float(s["robustness_proxy"]) >= 0 for s in summary if not s["error"])
    assert (tmp_path / "ensembles.png").exists() or "PNG skipped" in result.stdout
