"""Smoke run of the planning benchmark (benches/planning.py --quick): it runs end to end and writes rows."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_planning_bench_quick_writes_csv(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "planning.py"), "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=55,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "engine/reference/data/gpulet" in result.stdout
    with (tmp_path / "planning.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["experiment"] for r in rows} >= {"proteus:n_devices", "joint", "gain", "mixed"}
    assert {r["solver"] for r in rows if r["experiment"] == "mixed"} == {"proteus", "joint", "fleet"}
    assert "4. the fleet model against the compositions" in result.stdout
    (replan,) = [r for r in rows if r["experiment"] == "replan"]
    kept, total = map(int, replan["kept"].split("/"))
    assert total > 0 and 0 <= kept <= total and "6. re-planning at the same demand" in result.stdout
    assert all(r["status"] in ("optimal", "feasible") for r in rows), [(r["experiment"], r["status"], r["error"]) for r in rows]
    # Either the figure was drawn or the script said why not.
    assert (tmp_path / "planning.png").exists() or "PNG skipped" in result.stdout
