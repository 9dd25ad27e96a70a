"""Smoke run of the fault-injection benchmark (benches/faults.py) on the real PostgreSQL and Redis, each
behind the bench's own proxy: every fault is played, and no answer is wrong, no request goes unanswered
and no job is left wedged. How fast is the benchmark's business (timing targets are not asserted here)."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from benches.faults import FAULTS

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.services


@pytest.mark.timeout(600)
def test_faults_bench_quick_writes_csv(postgres_server_url, redis_url, tmp_path: Path) -> None:
    server = postgres_server_url  # the bench creates its own database on the same server
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "faults.py"), "--quick", "--postgres", server, "--database", "tessera_faults_smoke",
         "--redis", f"{redis_url.rsplit('/', 1)[0]}/9", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=590,
    )
    assert "longest s" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]  # the table was printed
    with (tmp_path / "faults.csv").open() as fh:
        rows = {row["fault"]: row for row in csv.DictReader(fh)}
    assert list(rows) == list(FAULTS)
    for fault, row in rows.items():
        assert int(row["sent"]) > 0 and int(row["answered"]) == int(row["sent"]), row  # no request unanswered
        assert int(row["wrong"]) == 0, f"{fault}: {row['wrong']} wrong, e.g. {row['wrong_examples']}"
        assert row["plan_run_after"] == "202", row  # nothing wedged
    assert int(rows["postgres-refused"]["unavailable"]) > 0 and int(rows["redis-refused"]["unavailable"]) > 0
    assert rows["worker-killed"]["noticed_s"] and rows["agent-killed"]["noticed_s"]  # both noticed (the bound: the bench's verdict)
