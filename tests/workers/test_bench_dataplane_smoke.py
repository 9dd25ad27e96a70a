"""Smoke run of the data-plane benchmark (benches/dataplane.py --quick): the runtime and router processes
start, every request is answered, and the CSV has a row per batch size. The numbers are the benchmark's
business (they depend on the machine), so nothing here checks the targets."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_dataplane_bench_quick_writes_csv(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "dataplane.py"), "--quick", "--models", "small", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=230,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "added p99" in result.stdout and "CPU per request" in result.stdout
    with (tmp_path / "dataplane.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["batch"]) for r in rows] == [1, 8, 32]
    for r in rows:
        assert int(r["errors"]) == 0, r
        assert float(r["router_p50_ms"]) > 0 and float(r["bare_p50_ms"]) > 0
        assert float(r["router_rows_per_s"]) > 0 and float(r["bare_rows_per_s"]) > 0 and float(r["batching_rows_per_s"]) > 0
        assert r["verdict"]
    assert "Latency client: one keep-alive raw socket" in result.stdout  # says how the client is measured
    assert (tmp_path / "dataplane.png").exists() or "PNG skipped" in result.stdout
