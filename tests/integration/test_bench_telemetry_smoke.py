"""Smoke run of the telemetry benchmark (benches/telemetry.py) on the real PostgreSQL and Redis: the
server starts, every stand-in agent's report is answered and stored, and the browser (when Chromium is
there) sees reports arrive. The figures are the benchmark's business; nothing here checks the targets."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.services


@pytest.mark.timeout(300)
def test_telemetry_bench_quick_writes_csv(postgres_server_url, redis_url, tmp_path: Path) -> None:
    server = postgres_server_url  # the bench creates its own database on the same server
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "telemetry.py"), "--loads", "70", "--duration", "4", "--warmup", "2",
         "--postgres", server, "--database", "tessera_bench_smoke", "--redis", f"{redis_url.rsplit('/', 1)[0]}/8",
         "--out", str(tmp_path), "--png", str(tmp_path / "telemetry.png")],
        cwd=REPO, capture_output=True, text=True, timeout=290,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "STAND-INS" in result.stdout  # says what the agents are
    with (tmp_path / "telemetry.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))
    assert int(row["errors"]) == 0 and int(row["ok"]) == int(row["sent"]) > 0
    assert float(row["achieved_instance_rps"]) == float(row["db_instance_rps"]) > 0  # every report stored
    if Path("/usr/bin/chromium").exists():
        assert int(row["browser_seen"]) > 0 and float(row["browser_p95_ms"]) > 0
