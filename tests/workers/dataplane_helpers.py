"""Helpers of the data-plane tests: runtime processes started the way the agent starts them
(`python -m workers.runtime.server --spec ... --ready-file ...`), and a blocking frame client."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers.wire import FRAME_PREFIX, frame_pack

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 90.0  # generous: a loaded two-core CI machine imports onnxruntime slowly


def runtime_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "key": "cpu0/0", "application": "tabular-cpu", "variant": "mlp-wide", "artifact_path": None, "sha256": None,
        "simulated": False, "device_uuid": None, "cpu_threads": 1, "max_batch": 4, "instance": "test-host/cpu0/0",
        "batching": {"policy": "fixed", "params": {"size": 4}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 5000.0},
        "profile": [{"batch": 1, "latency_ms": 1.0}, {"batch": 4, "latency_ms": 2.0}],
    }
    spec.update(overrides)
    return spec


class RuntimeProcess:
    """A runtime subprocess; `endpoint` once ready."""

    def __init__(self, spec: dict[str, Any], workdir: Path, name: str = "runtime") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.spec_path = workdir / f"{name}.spec.json"
        self.ready_file = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        self.spec_path.write_text(json.dumps(spec))
        self.ready_file.unlink(missing_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.runtime.server", "--spec", str(self.spec_path), "--listen", "127.0.0.1:0",
             "--ready-file", str(self.ready_file)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        self.endpoint: str | None = None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                text = self.ready_file.read_text().strip()
                if text:
                    self.endpoint = text
                    return text
            if self.proc.poll() is not None:
                raise RuntimeError(f"runtime exited with {self.proc.returncode}: {self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"runtime not ready after {timeout_s} s: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def runtime_start(spec: dict[str, Any], workdir: Path, name: str = "runtime") -> RuntimeProcess:
    runtime = RuntimeProcess(spec, workdir, name)
    try:
        runtime.wait_ready()
    except BaseException:
        runtime.stop()
        raise
    return runtime


def _address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host, int(port)


class FrameClient:
    """A blocking frame connection to a runtime (requests answered in any order are matched by id)."""

    def __init__(self, endpoint: str, timeout_s: float = 60.0) -> None:
        self.sock = socket.create_connection(_address(endpoint), timeout=timeout_s)
        self.buf = b""
        self.answers: dict[Any, tuple[dict, bytes]] = {}

    def send(self, header: dict, body: bytes = b"") -> None:
        self.sock.sendall(frame_pack(header, body))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the runtime closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def receive(self) -> tuple[dict, bytes]:
        header_len, body_len = FRAME_PREFIX.unpack(self._read(8))
        header = json.loads(self._read(header_len))
        return header, self._read(body_len)

    def answer(self, request_id: Any) -> tuple[dict, bytes]:
        while request_id not in self.answers:
            header, body = self.receive()
            self.answers[header.get("id")] = (header, body)
        return self.answers.pop(request_id)

    def call(self, header: dict, body: bytes = b"") -> tuple[dict, bytes]:
        self.send(header, body)
        return self.answer(header.get("id"))

    def close(self) -> None:
        self.sock.close()


def frame_call(endpoint: str, header: dict, body: bytes = b"", timeout_s: float = 60.0) -> tuple[dict, bytes]:
    client = FrameClient(endpoint, timeout_s)
    try:
        return client.call(header, body)
    finally:
        client.close()


def router_answer_wait(router_url: str, application: str, body: dict, timeout_s: float = 60.0) -> dict:
    """The first 200 answer of a router for `application` to `body` (the Open Inference Protocol's infer),
    waiting while the router has no route to it yet (its tables refresh, its runtime starts)."""
    import httpx

    from tests.waiting import wait_for

    def answered():
        response = httpx.post(f"{router_url}/v2/models/{application}/infer", json=body, timeout=10)
        return response if response.status_code == 200 else None

    return wait_for(answered, timeout_s, f"the router to answer for {application}").json()
