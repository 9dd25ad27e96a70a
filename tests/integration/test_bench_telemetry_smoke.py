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
    assert int(row["samples_lost"]) == 0 and int(row["samples_stored"]) == int(row["samples_expected"]) > 0  # ... whole
    assert float(row["api_p95_ms"]) > 0 and float(row["api_idle_p95_ms"]) > 0  # operators' reads were measured
    if Path("/usr/bin/chromium").exists():
        assert int(row["browser_seen"]) > 0 and float(row["browser_p95_ms"]) > 0


@pytest.mark.timeout(200)
def test_telemetry_profile_bench_stores_every_report(postgres_server_url, tmp_path: Path) -> None:
    """benches/telemetry_profile.py: every report it posts is stored, and its breakdown adds up (the SQL
    share of a report's time is a part of it)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "telemetry_profile.py"), "--reports", "40", "--postgres", postgres_server_url,
         "--database", "tessera_profile_smoke", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=190,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(all)" in result.stdout and "MISSING ROWS" not in result.stdout
    with (tmp_path / "telemetry_profile.csv").open() as fh:
        rows = {(r["section"], r["name"]): r for r in csv.DictReader(fh)}
    wall = float(rows["total", "wall, no profiler"]["ms_per_report"])
    sql = float(rows["total", "SQL, no profiler"]["ms_per_report"])
    assert 0 < sql < wall
    assert float(rows["total", "SQL, no profiler"]["per_report"]) >= 3  # lookups, duplicate check, inserts
    assert any(section == "group" for section, _ in rows)
