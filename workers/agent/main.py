"""Assembling an agent from its command-line options (`tessera agent`)."""
from __future__ import annotations

import logging
import os
import signal
import zlib
from pathlib import Path
from typing import Callable

from engine.vertical.controller import SHRINK_AFTER_INTERVALS

from .agent import Agent
from .backends import backend_make
from .reconcile import Operation

__all__ = ["CRASH_ENV", "MPS_CONTROL_ENV", "VERTICAL_ENV", "VERTICAL_SHRINK_AFTER_ENV", "WITHDRAW_S", "agent_build", "crash_failpoint_from_env"]

log = logging.getLogger("tessera.agent")

# Failpoint for crash-safety tests: with TESSERA_AGENT_CRASH_AFTER_OPS=N the agent kills itself with
# SIGKILL right after its N-th operation (no clean-up of any kind, as a power cut or an OOM kill would).
CRASH_ENV = "TESSERA_AGENT_CRASH_AFTER_OPS"
# The MPS control program of the nvml backend (default: nvidia-cuda-mps-control on the PATH).
MPS_CONTROL_ENV = "TESSERA_MPS_CONTROL"
# The fast vertical loop's period in seconds (default 1; 0 turns it off): workers/agent/vertical.py.
VERTICAL_ENV = "TESSERA_AGENT_VERTICAL_S"
# The intervals a smaller size must have been enough before the fast loop shrinks a runtime (default
# engine.vertical.controller.SHRINK_AFTER_INTERVALS, 5; 1 shrinks at once, as Sponge does): ShrinkDwell.
VERTICAL_SHRINK_AFTER_ENV = "TESSERA_AGENT_VERTICAL_SHRINK_AFTER"
# A drain exit (--stop-runtimes-on-exit) reports the runtimes draining, then waits this long before draining them:
# routers read the routing tables every second, so two of their refreshes (Agent.drain_exit).
WITHDRAW_S = 2.0


def crash_failpoint_from_env() -> Callable[[Operation], None] | None:
    raw = os.environ.get(CRASH_ENV)
    if not raw:
        return None
    limit = int(raw)
    seen = 0

    def after(op: Operation) -> None:
        nonlocal seen
        seen += 1
        if seen >= limit:
            log.warning("failpoint %s=%d: killing the agent after %s %s", CRASH_ENV, limit, op.action, op.target)
            os.kill(os.getpid(), signal.SIGKILL)

    return after


def agent_build(
    *,
    control_plane: str | None,
    token: str | None,
    backend: str,
    simulate: str = "",
    simulate_cpu_cores: int | None = None,
    state_dir: Path,
    desired_file: Path | None = None,
    bind: str = "127.0.0.1",
    advertise: str | None = None,
    metrics_port: int = 0,
    on_operation: Callable[[Operation], None] | None = None,
    vertical_s: float | None = None,
    keep_mig_modes: bool = False,
) -> Agent:
    """The agent the options describe (ValueError with a clear message on bad options)."""
    state_dir = Path(state_dir)
    options: dict = {}
    if backend == "simulated":
        # No GPUs declared: a CPU-only host. The seed keeps simulated UUIDs distinct between hosts (they are
        # unique fleet-wide) and stable across restarts of the same agent.
        seed = zlib.crc32(str(state_dir.resolve()).encode())
        options = {"gpus": simulate, "state_file": state_dir / "simulated-gpus.json", "seed": seed, "cpu_cores": simulate_cpu_cores}
    elif simulate or simulate_cpu_cores is not None:
        raise ValueError("--simulate and --simulate-cpu-cores are for --backend simulated")
    else:
        # MPS control daemons keep their pipes and logs under the state directory (one pair per GPU);
        # TESSERA_MPS_CONTROL names another control program than nvidia-cuda-mps-control on the PATH.
        options = {"mps_dir": state_dir / "mps"}
        if os.environ.get(MPS_CONTROL_ENV):
            options["mps_control"] = os.environ[MPS_CONTROL_ENV]
    device_backend = backend_make(backend, **options)
    client = None
    if control_plane:
        from workers.client import ControlPlaneClient

        client = ControlPlaneClient(control_plane, token or "")
    exporter = None
    if metrics_port:
        from .exporter import AgentExporter

        exporter = AgentExporter(hostname=os.uname().nodename)
        exporter.serve(metrics_port, addr=bind)
    if vertical_s is None:
        raw = os.environ.get(VERTICAL_ENV, "1")
        try:
            vertical_s = float(raw)
        except ValueError:
            raise ValueError(f"{VERTICAL_ENV} must be a number of seconds (0: off), got {raw!r}") from None
    if not vertical_s >= 0:
        raise ValueError(f"the vertical loop's period must be >= 0 s (0: off), got {vertical_s!r}")
    raw = os.environ.get(VERTICAL_SHRINK_AFTER_ENV, str(SHRINK_AFTER_INTERVALS))
    try:
        shrink_after = int(raw)
    except ValueError:
        shrink_after = 0
    if shrink_after < 1:
        raise ValueError(f"{VERTICAL_SHRINK_AFTER_ENV} must be a whole number of intervals >= 1 (1: shrink at once), got {raw!r}")
    return Agent(
        backend=device_backend, state_dir=state_dir, client=client, desired_file=desired_file, bind=bind,
        advertise=advertise, exporter=exporter, on_operation=on_operation, vertical_s=vertical_s, withdraw_s=WITHDRAW_S,
        vertical_shrink_after=shrink_after, keep_mig_modes=keep_mig_modes,
    )
