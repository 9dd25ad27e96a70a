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


@pytest.mark.timeout(240)
def test_dataplane_bench_peers_table_with_tessera_alone(tmp_path: Path) -> None:
    """--peers with no peer venvs in the folder (CI installs none: they are 1.5 GB): Tessera's rows over OIP
    JSON and binary are measured with the peers' client and written; the missing peers are skipped."""
    (tmp_path / "peers").mkdir()
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "dataplane.py"), "--quick", "--models", "small", "--batches", "1,8", "--batching-max", "1",
         "--peers", str(tmp_path / "peers"), "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=230,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Side by side with the serving systems" in result.stdout
    with (tmp_path / "dataplane_peers.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["system"], r["wire"], int(r["batch"])) for r in rows] == [
        ("Tessera", "json", 1), ("Tessera", "json", 8), ("Tessera", "binary", 1), ("Tessera", "binary", 8)]
    assert all(int(r["errors"]) == 0 and float(r["rows_per_s"]) > 0 and float(r["throughput_x_bare"]) > 0 for r in rows)


def test_the_bench_client_reads_chunked_answers_and_tritons_binary_header() -> None:
    """The raw-socket client frames Ray Serve's chunked answers and Triton's binary ones (whose
    Inference-Header-Content-Length must not be taken for the Content-Length)."""
    import socket

    sys.path.insert(0, str(REPO / "benches"))
    from dataplane import _Reader

    left, right = socket.socketpair()
    try:
        reader = _Reader(left)
        right.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n"
                      b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 4\r\nContent-Length: 7\r\n\r\n{}\x00\x01\x02\x03\x04"
                      b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n")
        statuses = []
        while len(statuses) < 3:
            if reader.feed() or reader._complete():
                statuses.append(reader.status)
                while reader._complete():
                    statuses.append(reader.status)
        assert statuses == [200, 200, 503] and reader.buf == b""
    finally:
        left.close()
        right.close()
