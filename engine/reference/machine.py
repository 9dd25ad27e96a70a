"""What machine a measurement was taken on: the CPU's model name, for the benches' tables and for keying
the demo's kept CPU measurements (controlplane/demo.py)."""
from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model_name"]


def cpu_model_name() -> str:
    """The CPU's model name as Linux's /proc/cpuinfo gives it, else what `platform` knows (the processor, or
    the architecture)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
