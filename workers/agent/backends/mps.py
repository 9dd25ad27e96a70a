"""NVIDIA's MPS control daemon, one per GPU, for the nvml backend (issue 17, gpulets §4.6).

gpulets partitions a GPU with MPS: each runtime process gets a share of the SMs through
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, fixed when the process starts (a partition of another size is a new
process). What this module relies on, from NVIDIA's MPS documentation (docs.nvidia.com/deploy/mps,
"Appendix: Tools and Interface Reference", and the ``nvidia-cuda-mps-control(1)`` man page):

- ``nvidia-cuda-mps-control -d`` starts the control daemon in the background; ``echo quit |
  nvidia-cuda-mps-control`` shuts it down. The control daemon starts an MPS server when the first client
  (a CUDA process) connects.
- The daemon, its server and its clients talk through named pipes and UNIX sockets in
  ``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), which must be the same for the daemon and
  all its clients; logs go to ``CUDA_MPS_LOG_DIRECTORY``. So one daemon per GPU, each with its own pipe
  and log directories (here ``<root>/gpu<i>/pipe`` and ``<root>/gpu<i>/log``), and the ``quit`` is sent
  with the same pipe directory to reach the right daemon.
- The daemon writes its PID to ``nvidia-cuda-mps-control.pid`` in its pipe directory ("one can target a
  specific instance by looking up its PID in the corresponding CUDA_MPS_PIPE_DIRECTORY"): the running
  check reads it. A PID alone does not name a process for long: the pid file outlives a daemon that was
  killed (with its container, under Kubernetes, whose next PID namespace hands the same numbers out again),
  so once a daemon runs its identity, PID and start time (``/proc/<pid>/stat``), is kept beside it
  (``<root>/gpu<i>/daemon.id``), and a live process with that PID but another start time is not the daemon.
  The identity is also what the agent records with every runtime process it starts under the daemon
  (`daemon_id`), so that a daemon that died and was started again is told from the one they connected to.
- ``CUDA_VISIBLE_DEVICES`` set when the daemon starts restricts (and renumbers) the devices its server
  uses; NVIDIA recommends GPU UUIDs rather than indices so that the daemon and its clients name the same
  device, so both get the GPU's ``GPU-…`` UUID.
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in a client's environment limits the share of the device's
  threads (SMs) the client's contexts may use (Volta and newer); it only lowers the daemon's own default
  (100).

The executable is a parameter, so tests run a fake control (a script that records its arguments,
environment and input, and daemonises a sleeping process that stands for the daemon).

Keep the state directory short: the pipe directory holds UNIX sockets, whose paths are limited to about
100 bytes.
"""
from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

from . import BackendError

__all__ = ["MPS_CONTROL", "MPS_DAEMON_ID_FILE", "MPS_PID_FILE", "MpsControl"]

log = logging.getLogger("tessera.agent")

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_PID_FILE = "nvidia-cuda-mps-control.pid"
# Beside each GPU's pipe directory: "<pid>@<start time>" of the daemon the agent started there.
MPS_DAEMON_ID_FILE = "daemon.id"
# Longest pipe directory that leaves room for the daemon's socket names under the UNIX socket path limit.
_PIPE_DIR_MAX = 80


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # the daemon may run as another user (root)
    try:  # a zombie (exited, not reaped) is not a running daemon
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _identity(pid: int) -> str | None:
    """"<pid>@<start time in clock ticks since boot>" while `pid` runs (not a zombie); just "<pid>" where /proc
    cannot say; None when no such process runs."""
    if not _alive(pid):
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return f"{pid}@{fields[19]}"  # starttime, field 22 of proc(5); the text after the command's ")" begins at field 3
    except (OSError, IndexError):
        return str(pid)


class MpsControl:
    """The MPS control daemons of one host's GPUs, under `root` (the agent's state directory's ``mps``).
    `executable`: the control program (``nvidia-cuda-mps-control``, or a fake); `timeout_s`: how long to
    wait for the daemon to start or to quit."""

    def __init__(self, root: Path | str, executable: str = MPS_CONTROL, *, timeout_s: float = 10.0) -> None:
        self.root = Path(root)
        self.executable = str(executable)
        self.timeout_s = timeout_s

    def pipe_dir(self, index: int) -> Path:
        return self.root / f"gpu{index}" / "pipe"

    def log_dir(self, index: int) -> Path:
        return self.root / f"gpu{index}" / "log"

    def _id_path(self, index: int) -> Path:
        return self.root / f"gpu{index}" / MPS_DAEMON_ID_FILE

    def _env(self, index: int, device: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir(index))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir(index))
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        return env

    def pid(self, index: int) -> int | None:
        """The PID of GPU `index`'s daemon while it runs (from its pid file), else None. A live process under that
        PID that is not the daemon started there (another start time than the one kept: the PID was reused) is
        not it."""
        return int(found.split("@", 1)[0]) if (found := self.daemon_id(index)) else None

    def daemon_id(self, index: int) -> str | None:
        """The identity ("<pid>@<start time>") of GPU `index`'s daemon while it runs, else None."""
        try:
            pid = int((self.pipe_dir(index) / MPS_PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        identity = _identity(pid) if pid > 0 else None
        if identity is None:
            return None
        try:
            kept = self._id_path(index).read_text().strip()
        except OSError:
            kept = ""  # a daemon started before identities were kept, or by hand with this pipe directory
        if kept.split("@", 1)[0] == str(pid) and "@" in kept and "@" in identity and kept != identity:
            return None  # the PID names another process now
        return identity

    def running(self, index: int) -> bool:
        return self.pid(index) is not None

    def _run(self, index: int, args: list[str], *, device: str | None = None, stdin: bytes | None = None) -> None:
        self.log_dir(index).mkdir(parents=True, exist_ok=True)
        # Output to a file, not a pipe: a daemonised child keeps inherited pipes open and would hang a reader.
        out_path = self.log_dir(index) / "control.out"
        with open(out_path, "ab") as out:
            try:
                done = subprocess.run(  # nosec B603 - the MPS control program the agent was configured with, an argument list
                    [self.executable, *args], env=self._env(index, device), input=stdin,
                    stdin=None if stdin is not None else subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    timeout=self.timeout_s,
                )
            except FileNotFoundError:
                raise BackendError(
                    f"gpu{index}: the MPS control program {self.executable!r} is not installed (it comes with the "
                    "NVIDIA driver's compute utilities)"
                ) from None
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BackendError(f"gpu{index}: {self.executable} {' '.join(args)} failed: {exc}") from exc
        if done.returncode != 0:
            raise BackendError(
                f"gpu{index}: {self.executable} {' '.join(args)} exited with {done.returncode}: {self._tail(out_path)}"
            )

    @staticmethod
    def _tail(path: Path, lines: int = 5) -> str:
        try:
            return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(no output)"
        except OSError:
            return "(no output)"

    def start(self, index: int, device: str) -> None:
        """Start GPU `index`'s daemon, restricted to `device` (the GPU's UUID), unless it runs already;
        return once its pid file names a live process."""
        if self.running(index):
            return
        pipe = self.pipe_dir(index)
        pipe.mkdir(parents=True, exist_ok=True)
        self.log_dir(index).mkdir(parents=True, exist_ok=True)
        if len(str(pipe)) > _PIPE_DIR_MAX:
            log.warning("MPS pipe directory %s is long; its sockets may exceed the UNIX path limit", pipe)
        (pipe / MPS_PID_FILE).unlink(missing_ok=True)  # a stale file from a daemon that died
        self._id_path(index).unlink(missing_ok=True)
        self._run(index, ["-d"], device=device)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            identity = self.daemon_id(index)
            if identity is not None:
                self._id_path(index).write_text(identity + "\n")
                log.info("gpu%d: MPS control daemon started (pid %s, pipes in %s)", index, self.pid(index), pipe)
                return
            time.sleep(0.05)
        raise BackendError(
            f"gpu{index}: the MPS control daemon did not start within {self.timeout_s:.0f} s (no live pid in "
            f"{pipe / MPS_PID_FILE}); its log: {self._tail(self.log_dir(index) / 'control.log')}"
        )

    def stop(self, index: int) -> None:
        """Ask GPU `index`'s daemon to quit (through its pipe directory) and wait until it is gone. Stopping
        a daemon that does not run is a no-op."""
        pid = self.pid(index)
        if pid is None:
            return
        self._run(index, [], stdin=b"quit\n")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                (self.pipe_dir(index) / MPS_PID_FILE).unlink(missing_ok=True)
                self._id_path(index).unlink(missing_ok=True)
                log.info("gpu%d: MPS control daemon stopped", index)
                return
            time.sleep(0.05)
        raise BackendError(
            f"gpu{index}: the MPS control daemon (pid {pid}) did not quit within {self.timeout_s:.0f} s "
            "(a client may still be connected)"
        )

    def client_environment(self, index: int, percent: int, device: str) -> dict[str, str]:
        """The environment of a runtime process on a partition of `percent` % of GPU `index`."""
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
            raise ValueError(f"an MPS partition is 1..100 % of the GPU, got {percent!r}")
        return {
            "CUDA_VISIBLE_DEVICES": device,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(index)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(index)),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
        }
