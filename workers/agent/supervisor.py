"""Runtime processes: start, adopt after an agent restart, health-check, drain and stop.

One process per runtime (`python -m workers.runtime.server`), in its own session, so that an agent that
restarts (an upgrade, a crash) leaves the runtimes serving. What the agent must find again after a restart
is kept on disk under `<state dir>/runtimes/`:

- `<key>.json`, the record: key, fingerprint, spec file, pid, endpoint, the resize fingerprint (what a
  CPU runtime was last resized to in place: reconcile.py's `runtime.resize`; a record written before it
  existed reads as ""), and for an MPS partition's process the identity of the MPS control daemon it was
  started under (`mps_daemon`, backends/mps.py; "" in records written before it). (The process of an MPS partition is
  recorded as `<partition key>#<fingerprint>`, so that its replacement can start, under a record of its
  own, while it still serves: reconcile.py, `partition_record_key`.) It is written *before* the process
  is started (without a pid) and again once it runs, each time atomically (temp file + rename).
- The spec file's name carries a random nonce and is on the runtime's command line, so the agent can tell
  its own processes from any other (pid reuse) and find a runtime that was started but never recorded
  (a crash between the two writes): `observe()` kills every process whose command line names a spec file
  under the state directory that no live record owns.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["RuntimeProcess", "RuntimeStartError", "RuntimeSupervisor", "frame_call"]

log = logging.getLogger("tessera.agent")

_FRAME = struct.Struct(">II")


class RuntimeStartError(RuntimeError):
    """A runtime did not become ready; the message carries the end of its log."""


@dataclass
class RuntimeProcess:
    key: str
    fingerprint: str
    spec_path: str
    ready_file: str
    log_path: str
    pid: int | None = None
    endpoint: str | None = None
    started_at: float = 0.0
    resize_fingerprint: str = ""
    mps_daemon: str = ""


def _atomic_write(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _safe(key: str) -> str:
    return key.replace("/", "_").replace("@", "-")


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped) is not a running runtime
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def frame_call(endpoint: str, header: dict[str, Any], body: bytes = b"", timeout_s: float = 5.0) -> tuple[dict, bytes]:
    """One request on a new connection to a runtime (the agent's control calls: health, stats, drain).
    The frame format is the router's (docs/dataplane.md, "Router ↔ runtime frames")."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        head = json.dumps(header).encode()
        sock.sendall(_FRAME.pack(len(head), len(body)) + head + body)

        def read(n: int) -> bytes:
            chunks, need = [], n
            while need:
                chunk = sock.recv(need)
                if not chunk:
                    raise ConnectionError(f"runtime at {endpoint} closed the connection")
                chunks.append(chunk)
                need -= len(chunk)
            return b"".join(chunks)

        head_len, body_len = _FRAME.unpack(read(_FRAME.size))
        return json.loads(read(head_len)), read(body_len)


class RuntimeSupervisor:
    """See the module docstring."""

    def __init__(self, state_dir: Path, *, bind: str = "127.0.0.1", advertise: str | None = None, python: str = sys.executable) -> None:
        self.dir = Path(state_dir) / "runtimes"
        self.logs = Path(state_dir) / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.bind = bind
        self.advertise = advertise
        self.python = python
        self._children: dict[int, subprocess.Popen] = {}

    # ------------------------------------------------------------------ records

    def _record_path(self, key: str) -> Path:
        return self.dir / f"{_safe(key)}.json"

    def _record_write(self, record: RuntimeProcess) -> None:
        _atomic_write(self._record_path(record.key), json.dumps(asdict(record)))

    def _records(self) -> list[RuntimeProcess]:
        records = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                records.append(RuntimeProcess(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                log.warning("ignoring unreadable runtime record %s", path)
                path.unlink(missing_ok=True)
        return records

    def _is_ours(self, record: RuntimeProcess) -> bool:
        if record.pid is None or not _alive(record.pid):
            return False
        cmdline = _cmdline(record.pid)
        return cmdline is None or record.spec_path in cmdline  # no /proc: trust the pid

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)  # another thread's stop may have taken it already

    def observe(self) -> dict[str, RuntimeProcess]:
        """The runtimes that run now, by key. Records of dead runtimes are removed (with their files), and
        processes started from this state directory that no record owns are killed."""
        self._reap()
        live: dict[str, RuntimeProcess] = {}
        for record in self._records():
            if self._is_ours(record):
                live[record.key] = record
            else:
                self._files_remove(record)
        owned = {r.spec_path for r in live.values()}
        for pid, cmdline in self._processes_under_state_dir():
            if not any(spec in cmdline for spec in owned):
                log.warning("killing runtime process %d that no record owns: %s", pid, cmdline)
                self._kill(pid, grace_s=2.0)
        return live

    def running(self) -> dict[str, RuntimeProcess]:
        """The runtimes that run now, by key, without `observe`'s clean-up (nothing removed or killed): for
        readers in other threads than the control loop (the fast vertical loop), which must not race a start
        whose record is written before its process exists."""
        live = {}
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = RuntimeProcess(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            if self._is_ours(record):
                live[record.key] = record
        return live

    def _processes_under_state_dir(self) -> list[tuple[int, str]]:
        marker = str(self.dir) + os.sep
        found = []
        proc = Path("/proc")
        if not proc.is_dir():
            return found
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            cmdline = _cmdline(int(entry.name))
            if cmdline and "workers.runtime.server" in cmdline and marker in cmdline and _alive(int(entry.name)):
                found.append((int(entry.name), cmdline))
        return found

    def _files_remove(self, record: RuntimeProcess) -> None:
        for name in (record.spec_path, record.ready_file):
            Path(name).unlink(missing_ok=True)
        self._record_path(record.key).unlink(missing_ok=True)

    # ------------------------------------------------------------------ start / stop

    def start(self, *, key: str, fingerprint: str, spec: dict[str, Any], env: dict[str, str] | None = None, ready_timeout_s: float = 60.0,
              resize_fingerprint: str = "", mps_daemon: str = "") -> RuntimeProcess:
        """Start a runtime and wait until it serves (it writes its endpoint to the ready file once warm)."""
        nonce = secrets.token_hex(4)
        safe = _safe(key)
        record = RuntimeProcess(
            key=key, fingerprint=fingerprint, resize_fingerprint=resize_fingerprint, mps_daemon=mps_daemon,
            spec_path=str(self.dir / f"{safe}.{nonce}.spec"), ready_file=str(self.dir / f"{safe}.{nonce}.ready"),
            log_path=str(self.logs / f"{safe}.log"), started_at=time.time(),
        )
        _atomic_write(Path(record.spec_path), json.dumps(spec))
        self._record_write(record)  # before the process exists: a crash now leaves nothing running
        child_env = dict(os.environ)
        child_env.update(env or {})
        with open(record.log_path, "ab") as logfile:
            child = subprocess.Popen(  # nosec B603 - this Python running our runtime module, an argument list
                [self.python, "-m", "workers.runtime.server", "--spec", record.spec_path,
                 "--listen", f"{self.bind}:0", "--ready-file", record.ready_file],
                env=child_env, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the agent's own restart and its terminal's signals
            )
        self._children[child.pid] = child
        record.pid = child.pid
        self._record_write(record)
        deadline = time.monotonic() + ready_timeout_s
        ready = Path(record.ready_file)
        while time.monotonic() < deadline:
            if ready.exists():
                endpoint = ready.read_text().strip()
                if endpoint:
                    record.endpoint = self._advertised(endpoint)
                    self._record_write(record)
                    return record
            if child.poll() is not None:
                break
            time.sleep(0.02)
        self.stop(record, drain_timeout_s=0)
        raise RuntimeStartError(f"runtime {key} did not become ready: {self.log_tail(record)}")

    def _advertised(self, endpoint: str) -> str:
        if not self.advertise:
            return endpoint
        _host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        return f"tcp://{self.advertise}:{port}"

    def log_tail(self, record: RuntimeProcess, lines: int = 8) -> str:
        try:
            text = Path(record.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def drain(self, record: RuntimeProcess, timeout_s: float) -> bool:
        """Ask the runtime to stop taking queries and wait until what it holds is served (or the
        timeout): True when it drained."""
        if not record.endpoint or timeout_s <= 0:
            return False
        try:
            reply, _ = frame_call(record.endpoint, {"op": "drain", "timeout_ms": timeout_s * 1000.0}, timeout_s=timeout_s + 2.0)
            return reply.get("status") == 200
        except (OSError, ValueError) as exc:
            log.info("drain of %s failed: %s", record.key, exc)
            return False

    def stop(self, record: RuntimeProcess, *, drain_timeout_s: float = 10.0) -> None:
        """Drain (if asked), then stop the process (SIGTERM, SIGKILL after a grace period) and remove its
        record. Stopping what is not running is a no-op."""
        if self._is_ours(record):
            if drain_timeout_s > 0:
                self.drain(record, drain_timeout_s)
            self._kill(record.pid, grace_s=5.0)  # type: ignore[arg-type]
        self._files_remove(record)
        self._reap()

    def _kill(self, pid: int, grace_s: float) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            child = self._children.get(pid)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if child is not None and child.poll() is not None:
                    break
                if child is None and not _alive(pid):
                    break
                time.sleep(0.02)
            else:
                continue
            break
        self._children.pop(pid, None)

    def call(self, record: RuntimeProcess, op: str, timeout_s: float = 2.0, *, key: str | None = None) -> dict:
        """A control call (`health`, `stats`) on a running runtime; `key` selects one model of an MPS
        partition's process (without it, `health` answers for the whole process)."""
        if not record.endpoint:
            raise ConnectionError(f"runtime {record.key} has no endpoint yet")
        header: dict[str, Any] = {"op": op}
        if key is not None:
            header["key"] = key
        reply, _ = frame_call(record.endpoint, header, timeout_s=timeout_s)
        return reply

    def request(self, record: RuntimeProcess, header: dict[str, Any], timeout_s: float = 2.0) -> dict:
        """Any control frame (`resize`, `stats` with a reader, ...) on a running runtime; its answer's header."""
        if not record.endpoint:
            raise ConnectionError(f"runtime {record.key} has no endpoint yet")
        reply, _ = frame_call(record.endpoint, header, timeout_s=timeout_s)
        return reply

    def resized(self, record: RuntimeProcess, resize_fingerprint: str) -> None:
        """Remember that the runtime was resized to what `resize_fingerprint` stands for (its record, atomically)."""
        record.resize_fingerprint = resize_fingerprint
        if self._record_path(record.key).exists():
            self._record_write(record)

    def stop_all(self, *, drain_timeout_s: float = 0.0) -> None:
        for record in self.observe().values():
            self.stop(record, drain_timeout_s=drain_timeout_s)
