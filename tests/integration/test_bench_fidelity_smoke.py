"""CI's run of the fidelity bench (issue 41, item 2; benches/fidelity.py): the whole stack on the real
PostgreSQL and Redis, a plan applied, a calibration at a low rate, then short traces sent to the CPU host's
real onnxruntime runtimes and the simulator run on the same plan and arrivals. It checks that every row is
there and every figure is a number a reader can compare, not the goals (those are for the report's run, on
a quiet machine: docs/benchmarks.md)."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.services


# Alone under xdist (tests/conftest.py): it calibrates and times real runtimes on this machine's cores; beside
# another worker's tests on CI's two cores it failed twice and passed on its own.
@pytest.mark.solo
@pytest.mark.timeout(900)
def test_fidelity_quick_prints_predicted_against_measured_for_every_application_and_trace(postgres_server_url, redis_url, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "fidelity.py"), "--duration", "15", "--traces", "poisson,diurnal", "--postgres", postgres_server_url,
         "--database", "tessera_fidelity_smoke", "--redis", f"{redis_url.rsplit('/', 1)[0]}/14", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=850,
    )
    output = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    with (tmp_path / "fidelity.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    applications = {r["application"] for r in rows}
    assert {"tabular-cpu", "tabular-calibrate"} <= applications, rows  # the demo's CPU-only applications
    for trace in ("poisson", "diurnal"):
        for application in applications:
            models = {r["model"]: r for r in rows if r["trace"] == trace and r["application"] == application}
            assert set(models) == {"live", "sim", "sim+"}, (trace, application, models)
            live = models["live"]
            assert int(live["sent"]) > 0 and int(live["answered"]) > 0, live
            for name in ("sim", "sim+"):
                row = models[name]
                assert row["sent"] == live["sent"], row  # the simulator replayed the very arrivals sent
                for field in ("violation_ratio", "p99_error", "violation_error"):
                    assert math.isfinite(float(row[field])), (field, row)
    assert (tmp_path / "fidelity_queries.csv").stat().st_size > 0
