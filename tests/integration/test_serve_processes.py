"""`tessera serve --processes N`: N Daphne processes accept from one socket and stop together; without
Redis it refuses (the in-memory channel layer does not reach other processes). `tessera ingest`, the data
plane's HTTP API on uvicorn, the same way."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
TESSERA = [sys.executable, "-c", "from controlplane.cli import app; app()"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="controlplane.settings.local", TESSERA_VAR_DIR=str(tmp_path), DJANGO_DEBUG="false",
               DATABASE_URL=f"sqlite:///{tmp_path / 'serve.sqlite3'}", **extra)
    return env


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_refused_without_redis(tmp_path):
    result = subprocess.run([*TESSERA, "serve", "--bind", "127.0.0.1", "--port", str(_free_port()), "--processes", "2"],
                            cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--processes needs REDIS_URL" in result.stderr


def _serve(redis_url: str, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    server = subprocess.Popen([*TESSERA, "serve", "--bind", "127.0.0.1", "--port", str(port), "--processes", "2"],
                              cwd=REPO, env=_env(tmp_path, REDIS_URL=redis_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return server, port


@pytest.mark.services
def test_processes_share_one_socket_and_stop_together(redis_url, tmp_path):
    server, port = _serve(redis_url, tmp_path)
    try:
        deadline, answered = time.monotonic() + 60, 0
        while time.monotonic() < deadline and answered < 20:
            try:
                answered += httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                time.sleep(0.3)
        assert answered == 20, server.stdout.read() if server.poll() is not None else "no answer"
        daphnes = _children(server.pid)
        assert len(daphnes) == 2
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in daphnes)
    finally:
        if server.poll() is None:
            server.kill()


@pytest.mark.services
def test_one_process_dying_stops_the_service(redis_url, tmp_path):
    server, port = _serve(redis_url, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(_children(server.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        first, second = _children(server.pid)
        os.kill(first, signal.SIGKILL)
        assert server.wait(timeout=30) == 128 + signal.SIGKILL  # the dead child's status, for the supervisor
        assert not Path(f"/proc/{second}").exists()  # the other one was stopped, not left at half capacity
    finally:
        if server.poll() is None:
            server.kill()


def test_ingest_refused_without_redis(tmp_path):
    result = subprocess.run([*TESSERA, "ingest", "--bind", "127.0.0.1", "--port", str(_free_port())],
                            cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "tessera ingest needs REDIS_URL" in result.stderr


@pytest.mark.services
def test_ingest_serves_agents_metrics_on_uvicorn(redis_url, tmp_path):
    """`tessera ingest --processes 2`: uvicorn processes on one socket answering the data plane's HTTP API;
    an agent's report goes in on the fast path and is stored; the operators' API answers there too."""
    env = _env(tmp_path, REDIS_URL=redis_url)
    subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    setup = ("import django; django.setup(); from tests.factories import HostFactory;"
             "from apps.inventory.services import host_agent_token_rotate; h = HostFactory(name='ingest-cli');"
             "print(h.pk, host_agent_token_rotate(host=h))")
    host_id, token = subprocess.run([sys.executable, "-c", setup], cwd=REPO, env=env, capture_output=True, text=True, check=True,
                                    timeout=120).stdout.split()
    port = _free_port()
    server = subprocess.Popen([*TESSERA, "ingest", "--bind", "127.0.0.1", "--port", str(port), "--processes", "2"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, response = time.monotonic() + 60, None
        body = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60)), "runtimes": [{"key": "gpu0", "arrivals": 3}]}
        while time.monotonic() < deadline and response is None:
            # Retried only while nothing listens: a report whose answer timed out may be stored already,
            # and sent again it reads as a duplicate (0 samples), so a slow answer is waited for instead.
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/api/v1/hosts/{host_id}/metrics/", json=body,
                                      headers={"Authorization": f"Token {token}"}, timeout=httpx.Timeout(60, connect=5))
            except httpx.ConnectError:
                time.sleep(0.3)
        assert response is not None and response.status_code == 201, server.stdout.read() if server.poll() is not None else response
        assert response.json() == {"runtime_samples": 1, "gpu_samples": 0}
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/hosts/", headers={"Authorization": f"Token {token}"}, timeout=5).status_code == 200
        assert len(_children(server.pid)) == 2
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
