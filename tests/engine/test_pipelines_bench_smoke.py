"""Smoke run of benches/pipelines.py --quick: FA2, the exact MILP, InferLine and DS2 on Table P1.3's
application, fa2's exact mode against brute force on random profiled pipelines, and IPA against brute
force, at 10 x 10, its weight sweep and FA2-low / FA2-high; every plan valid, the
tables and the CSVs written. What the full run's figures mean is the
bench's business (README, "Pipelines")."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_pipelines_bench_quick(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(REPO / "benches" / "pipelines.py"), "--quick", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=55)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FA2 needs as many instances as the optimum" in result.stdout and "96.8 %" in result.stdout
    with (tmp_path / "pipelines.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["solver"] for r in rows} == {"fa2", "milp", "inferline", "ds2"}
    assert len(rows) == 4 * 3 * 2
    assert all(r["valid"] == "True" for r in rows if r["solver"] in ("fa2", "milp"))
    optimum = {(r["rate_rps"], r["seed"]): int(r["instances"]) for r in rows if r["solver"] == "milp"}
    assert all(int(r["instances"]) >= optimum[(r["rate_rps"], r["seed"])] for r in rows if r["instances"])
    assert (tmp_path / "pipelines.png").exists() or "PNG skipped" in result.stdout
    assert "equal to brute force: 6 of 6" in result.stdout and "monotone along the frontier" in result.stdout
    with (tmp_path / "pipelines_ipa.csv").open() as fh:
        ipa = list(csv.DictReader(fh))
    assert {r["part"] for r in ipa} == {"scale", "brute", "sweep", "baselines"} and all(r["valid"] == "True" for r in ipa)
    with (tmp_path / "pipelines_simulated.csv").open() as fh:
        simulated = list(csv.DictReader(fh))
    assert len(simulated) == 12 and all(int(r["arrivals"]) > 0 for r in simulated if r["violation_ratio"])
    assert {r["trace"] for r in simulated} == {"poisson", "varying"}
    assert "Simulated end to end" in result.stdout
    # fa2's exact mode against the brute-force optimum of P1.3 on random profiled chains, forks, joins, DAGs.
    assert "fa2 exact equals the brute-force optimum: 24 of 24" in result.stdout
    with (tmp_path / "pipelines_exact.csv").open() as fh:
        exact = list(csv.DictReader(fh))
    assert len(exact) == 2 * 4 * 3 * 2 and all(r["valid"] == "True" for r in exact)
    assert all(r["status"] == "optimal" and float(r["excess"]) == 0 for r in exact if r["solver"] == "milp")
    assert all(float(r["excess"]) >= 0 for r in exact if r["excess"])
    assert "10 x 10            ipa" in result.stdout  # its time is the bench's to report, not a test's
