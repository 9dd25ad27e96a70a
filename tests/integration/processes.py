"""Stopping the real processes an integration test starts in a session of their own (start_new_session)."""
from __future__ import annotations

import os
import signal
import subprocess


def process_group_stop(process: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
    """SIGTERM to the process's group (a Celery worker's or beat's children too), SIGKILL if it outlives
    `timeout_s`; nothing when it has exited already."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
