"""Smoke run of benches/vertical.py --quick: Sponge and its baselines on the bandwidth trace, Biscale and
its baselines on the three bursty pipelines, the DPs against the exact IP; tables, CSVs and the figure
written. What the full run's figures mean is the bench's business (README, "Vertical scaling")."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_vertical_bench_quick(tmp_path: Path) -> None:
    # The real run for a few seconds per policy: a real runtime under the real agent's fast loop, behind a router.
    result = subprocess.run([sys.executable, str(REPO / "benches" / "vertical.py"), "--quick", "--real-seconds", "5", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=230)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Sponge vs static 16 cores" in result.stdout and "Sponge with events (Tessera's fast loop) vs static 16 cores" in result.stdout
    assert "Biscale on video" in result.stdout and "Biscale with the shrink dwell on nlp" in result.stdout
    assert "Algorithm 3 equal to the IP (n = 1) on 8 of 8, Algorithm 4 equal to the IP (c = 1) on 8 of 8" in result.stdout
    with (tmp_path / "vertical.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["scenario"], r["policy"]) for r in rows} == {
        ("sponge", p) for p in ("sponge", "sponge-events", "static-16", "static-8", "horizontal")} | {
        (s, p) for s in ("video", "audio", "nlp") for p in ("biscale", "biscale-dwell", "horizontal", "horizontal-1.5", "vertical")} | {
        ("real", p) for p in ("sponge", "static-1", "static-max")}
    assert all(r["errors"] in ("", "0") for r in rows)  # the real runs lost nothing
    assert "Real run on this machine" in result.stdout
    static = next(r for r in rows if r["policy"] == "static-16")
    assert float(static["mean_cores"]) == 16.0 and int(static["resizes"]) == 0
    assert all(int(r["requests"]) > 0 and 0 <= float(r["violation_rate"]) <= 1 for r in rows)
    assert (tmp_path / "vertical.png").exists() or "PNG skipped" in result.stdout
