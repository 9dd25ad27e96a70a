"""Make a host what its desired state says: MIG geometry, then the runtimes on it.

Level-triggered: every pass starts from what is observed (the GPUs' instances as the device backend
reports them, the runtime processes the supervisor finds), never from a memory of what was done before.
So a pass interrupted at any step (a crash, a kill, a failed call), followed by another pass, converges:
what was created is found and kept, what is missing is made, and what must go is removed. No step
depends on an earlier pass having finished.

Order within a pass (make before break where the GPU has room):

1. Create the new MIG instances that fit beside everything on the GPU now, and start the desired
   runtimes whose instance exists (new capacity serves before old capacity goes).
2. Drain and stop the runtimes that are no longer wanted, changed, or sit on an instance that goes; only
   then destroy instances (no runtime is ever left on a destroyed instance), switch MIG modes, create the
   remaining instances (`mig_layout_diff`: destroys before creates, every intermediate layout valid), and
   start the remaining runtimes.

MPS GPUs (issue 17, gpulets §4.2 and §4.6): the models of one partition (`gpu0/mps60@0/0`, `/1`, ...) are
served by ONE runtime process started with a partition spec (`partition_spec_build`) and the backend's MPS
environment (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`). Its record is `<partition key>#<fingerprint>`, the
fingerprint covering every model of the partition, so a partition whose models change, or a new
partition, gets a new process beside the old one. Within a pass: the GPU's MPS control daemon is started
before its first partition process; the new partitions' processes are started and ready (step 1) before
the processes of partitions that are gone or changed are drained and stopped (step 2), so serving does not
stop while a GPU is reorganised (the percents may add up to more than 100 % meanwhile, which MPS allows);
a GPU taken out of MPS mode has its daemon stopped after its last partition process.

MPS daemons are watched (issue 44): every partition process's record keeps the identity of the daemon it was
started under (`mps_daemon`: PID and start time, backends/mps.py). A daemon the desired state relies on that
is gone after convergence (it died: its clients lost their MPS server, so their queries fail or run without
the partition's SM limit), or partition processes under another daemon than the one running now, is lost
(`mps_daemons_lost`, which the agent checks on every poll, reports, and repairs with a pass): the pass
records `mps.daemon` failed (a WARNING), stops the partition processes that used the lost daemon, starts the
daemon again and their partitions under it. The daemons are stopped only by a GPU leaving MPS mode, and by
the agent's drain exit (`mps_daemons_stop`, after its runtimes); an agent that exits to be restarted leaves
them running with the runtimes that need them.

CPU runtimes resized in place (issue 19): a CPU runtime's `cpu_threads` and `vertical` block are not in its
restart fingerprint (desired.py). When only they change, the running process is sent a `resize` frame at
the end of the pass (its cores become `cpu_threads`, within the vertical bounds, its batch cap the desired
`max_batch`, its latency model the vertical one), never restarted: the `runtime.resize` operation, a fast
kind of change of its own (milliseconds; nothing queued or in flight is lost). The record keeps the
`resize_fingerprint` it was resized to, so the next pass (or an agent restarted) does not resize it again.
With the agent's fast loop (workers/agent/vertical.py) the resize goes through it (`resizer`), which keeps
the host's core budget and the CPU pinning; from then on the fast loop sizes runtimes with a `vertical` block.

Every action is an `Operation` (logged, and reported to the control plane). A runtime that fails to start
is retried on a later pass with exponential backoff.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from engine.dataplane.batching import DEFAULT_BATCHING_POLICY
from engine.geometry import names
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import Placement, mig_layout_diff, mig_layout_validate

from .backends import BackendError, DeviceBackend, GpuInfo, gpu_model_of
from .desired import DesiredPartition, DesiredRuntime, DesiredState, runtime_key_parse
from .supervisor import RuntimeProcess, RuntimeStartError, RuntimeSupervisor

__all__ = [
    "Operation",
    "ReconcileResult",
    "Reconciler",
    "partition_record_key",
    "partition_record_parse",
    "partition_spec_build",
    "resize_detail",
    "resize_frame",
    "runtime_spec_build",
    "runtimes_missing",
    "runtimes_unresized",
]

log = logging.getLogger("tessera.agent")

# Backoff for a runtime that failed to start: 2, 4, 8, ... seconds, at most this.
RESTART_BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Operation:
    at: str
    # runtime.start | runtime.drain | runtime.stop | mig.create | mig.destroy | mig.mode | mps.mode, and
    # runtime.resize: a CPU runtime's cores and batch cap changed in place (no restart; the reconciler's for a
    # desired-state change, the fast vertical loop's every second or so), detail "1 -> 2 cores, batch 8 -> 4, ... ms".
    action: str
    target: str
    outcome: str  # ok | failed
    detail: str = ""

    def as_report(self) -> dict:
        return {"at": self.at, "action": self.action, "target": self.target, "outcome": self.outcome, "detail": self.detail}


@dataclass
class ReconcileResult:
    version: int
    converged: bool
    errors: list[str] = field(default_factory=list)
    # Desired runtimes whose process could not be started (the artifact, the process or its health check),
    # with the last error: retried with backoff on later passes.
    failed_starts: dict[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Everything reached but runtimes that failed to start: the GPUs have their layouts and MPS modes,
        nothing undesired runs, and every other runtime runs. The control plane's rollout then goes on
        without them (their routes stay withdrawn), instead of failing the whole plan over one model."""
        if self.converged:
            return True
        return bool(self.errors) and all(any(error.startswith(key + ":") for key in self.failed_starts) for error in self.errors)


def runtime_spec_build(runtime: DesiredRuntime, *, artifact_path: Path | None, device_uuid: str | None, simulated: bool,
                       cpu_oversubscribe: bool = False) -> dict:
    """The runtime process's spec file (workers.runtime.spec.RuntimeSpec). `cpu_oversubscribe`: a resize may
    give the runtime more cores than the machine has CPUs (a simulated host, whose declared cores the control
    plane plans with)."""
    artifact = runtime.variant.get("artifact") or {}
    spec = {
        "key": runtime.key,
        "application": runtime.application,
        "variant": runtime.variant["name"],
        "variant_id": runtime.variant.get("id"),  # the agent's report, and the runtime's model_version (the protocol's)
        "artifact_path": str(artifact_path) if artifact_path is not None else None,
        "sha256": artifact.get("sha256"),
        "simulated": simulated,
        "device_uuid": device_uuid,
        "cpu_threads": runtime.cpu_threads or 1,
        "max_batch": runtime.max_batch,
        "batching": {
            "policy": runtime.batching.get("policy", DEFAULT_BATCHING_POLICY),
            "params": runtime.batching.get("params", {}) or {},
            "drop_rule": runtime.batching.get("drop_rule", "deadline"),
            "queue_order": runtime.batching.get("queue_order", "fifo"),
            "slo_ms": float(runtime.batching["slo_ms"]),
        },
        "profile": [{"batch": b, "latency_ms": ms} for b, ms in runtime.profile],
    }
    if runtime.device_kind == "cpu":
        spec["vertical"] = runtime.vertical.to_dict() if runtime.vertical is not None else None
        spec["cpu_oversubscribe"] = cpu_oversubscribe
    return spec


def resize_frame(runtime: DesiredRuntime, cores: int, *, cpus: list[int] | None = None, max_batch: int | None = None) -> dict:
    """The `resize` frame that makes a running CPU runtime what `runtime` says at `cores`: the desired batch cap
    (unless `max_batch`), its vertical latency model (null without one), pinned to `cpus` (None: the CPUs it
    was started with)."""
    frame: dict = {"op": "resize", "cores": int(cores), "max_batch": int(max_batch if max_batch is not None else runtime.max_batch),
                   "model": runtime.vertical.to_dict()["model"] if runtime.vertical is not None else None}
    if cpus is not None:
        frame["cpus"] = list(cpus)
    return frame


def resize_detail(before: dict | None, reply: dict) -> str:
    """An Operation's detail for a resize answered `reply` (a runtime's `resize` answer), from `before` (its
    sizes then: cores, max_batch; None when unknown)."""
    before = before or {}
    cpus = reply.get("cpus")
    text = (f"{before.get('cores', '?')} -> {reply.get('cores')} cores, batch {before.get('max_batch', '?')} -> {reply.get('max_batch')}, "
            f"cpus {cpus if cpus is not None else 'unpinned'}, {reply.get('resize_ms')} ms ({'prepared' if reply.get('prepared') else 'cold'})")
    if reply.get("affinity_error"):
        text += f"; not pinned: {reply['affinity_error']}"
    return text


# The supervisor record of an MPS partition's process: "<partition key>#<fingerprint>".
PARTITION_RECORD_SEP = "#"


def partition_record_key(partition_key: str, fingerprint: str) -> str:
    return f"{partition_key}{PARTITION_RECORD_SEP}{fingerprint}"


def partition_record_parse(record_key: str) -> tuple[str, str] | None:
    """("gpu0/mps60@0", fingerprint) for a partition process's record key; None for any other runtime's."""
    if PARTITION_RECORD_SEP not in record_key:
        return None
    key, _, fingerprint = record_key.partition(PARTITION_RECORD_SEP)
    return key, fingerprint


def partition_spec_build(partition: DesiredPartition, *, host: str, artifact_paths: dict[str, Path | None], device_uuid: str | None, simulated: bool) -> dict:
    """The partition spec of the MPS contract (issue 17): the partition's key, percent and duty cycle, and
    one single-model runtime spec per model, each with its own key and fleet instance id."""

    def instance(key: str) -> str | None:
        return names.instance_id(host, key) if host else None  # without a host name the runtime uses the key

    models = []
    for runtime in partition.runtimes:
        spec = runtime_spec_build(runtime, artifact_path=artifact_paths.get(runtime.key), device_uuid=device_uuid, simulated=simulated)
        spec["instance"] = instance(runtime.key)
        spec["turn_ms"] = runtime.turn_ms  # its slot in the partition's rounds (workers/runtime/partition.py)
        models.append(spec)
    return {
        "key": partition.key, "partition_percent": partition.percent, "duty_cycle_ms": partition.duty_cycle_ms,
        "device_uuid": device_uuid, "instance": instance(partition.key), "models": models,
    }


def runtimes_missing(desired: DesiredState, running: dict[str, RuntimeProcess]) -> list[str]:
    """Keys of the desired runtimes no process serves as desired (an MPS model counts as served when its
    partition's process with the desired fingerprint runs)."""
    missing = [r.key for r in desired.process_runtimes if running.get(r.key) is None or running[r.key].fingerprint != r.fingerprint]
    for partition in desired.partitions():
        if partition_record_key(partition.key, partition.fingerprint) not in running:
            missing.extend(r.key for r in partition.runtimes)
    return missing


def runtimes_unresized(desired: DesiredState, running: dict[str, RuntimeProcess]) -> list[str]:
    """Keys of the CPU runtimes that run as desired but were not resized to the desired cores yet."""
    return [r.key for r in desired.process_runtimes
            if r.device_kind == "cpu" and (record := running.get(r.key)) is not None and record.fingerprint == r.fingerprint
            and record.resize_fingerprint != r.resize_fingerprint]


class Reconciler:
    """See the module docstring. `artifact_fetch(artifact dict) -> Path` downloads and verifies a model
    file (the control-plane client's cache); `on_operation` sees every operation after it is done (the
    agent reports them; tests use it to kill the agent between steps)."""

    def __init__(
        self,
        *,
        backend: DeviceBackend,
        supervisor: RuntimeSupervisor,
        artifact_fetch: Callable[[dict], Path],
        on_operation: Callable[[Operation], None] | None = None,
        drain_timeout_s: float = 10.0,
        ready_timeout_s: float = 60.0,
        stop_requested: Callable[[], bool] = lambda: False,
        resizer: Callable[[RuntimeProcess, DesiredRuntime], dict] | None = None,
        keep_mig_modes: bool = False,
    ) -> None:
        self.backend = backend
        # `tessera agent --keep-mig-modes`: the GPUs' MIG modes belong to someone else (NVIDIA's mig-manager, an
        # operator, a shared machine): a desired state that would switch one is refused for that GPU.
        self.keep_mig_modes = keep_mig_modes
        self.supervisor = supervisor
        self.artifact_fetch = artifact_fetch
        self.on_operation = on_operation
        self.drain_timeout_s = drain_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.stop_requested = stop_requested  # the agent is shutting down: start nothing more
        # How a CPU runtime is resized in place to what the desired state says (the agent's fast loop, which keeps
        # the host's core budget; by default a plain resize frame). Returns the runtime's answer, with the sizes it
        # had before under "before" (cores, max_batch) when known.
        self.resizer = resizer or self._resize_direct
        self.catalogue = mig_catalogue_load()
        self._failures: dict[str, tuple[int, float]] = {}  # runtime key -> (consecutive failures, retry at)
        self._start_errors: dict[str, str] = {}  # runtime key -> why its last start failed
        self._mps_daemons: dict[int, str] = {}  # GPU index -> the MPS daemon this reconciler last saw serving it

    # ------------------------------------------------------------------ bookkeeping

    def _op(self, action: str, target: str, outcome: str, detail: str = "") -> Operation:
        op = Operation(datetime.now(timezone.utc).isoformat(), action, target, outcome, detail)
        (log.info if outcome == "ok" else log.warning)("%s %s: %s %s", action, target, outcome, detail)
        if self.on_operation is not None:
            self.on_operation(op)
        return op

    # ------------------------------------------------------------------ the pass

    def reconcile(self, desired: DesiredState) -> ReconcileResult:
        result = ReconcileResult(version=desired.version, converged=False)
        gpus = {g.index: g for g in self.backend.gpus()}
        targets: dict[int, tuple[object, tuple[Placement, ...], bool]] = {}  # index -> (spec, layout, mig)
        for want in desired.gpus:
            gpu = gpus.get(want.index)
            if gpu is None:
                result.errors.append(f"gpu{want.index}: no such GPU on this host")
                continue
            spec = gpu_model_of(gpu, self.catalogue)
            if want.mig_enabled and (not gpu.mig_capable or spec is None):
                result.errors.append(
                    f"gpu{want.index}: {gpu.model_name} is not a MIG GPU the catalogue knows, nor one whose NVML "
                    "profile table is known (MIG off)"
                )
                continue
            if self.keep_mig_modes and want.mig_enabled != gpu.mig_enabled:
                result.errors.append(
                    f"gpu{want.index}: the desired state turns MIG {'on' if want.mig_enabled else 'off'}, and this agent keeps "
                    "MIG modes as they are (--keep-mig-modes); nothing changed on this GPU"
                )
                continue
            if spec is not None and want.layout:
                verdict = mig_layout_validate(spec, want.layout)
                if not verdict.valid:
                    result.errors.append(f"gpu{want.index}: desired layout is invalid: {verdict.reason}")
                    continue
            targets[want.index] = (spec, want.layout, want.mig_enabled)

        # 1. Make before break: new instances that fit now, MPS daemons and the new partitions' processes
        #    (each ready before anything is stopped), and runtimes whose instance exists.
        running = self.supervisor.observe()
        for index, (spec, layout, mig_enabled) in targets.items():
            gpu = gpus[index]
            if gpu.mig_enabled != mig_enabled or spec is None:
                continue
            current = [i.placement for i in gpu.instances]
            for placement in mig_layout_diff(spec, current, layout).create:
                if mig_layout_validate(spec, current + [placement]).valid:
                    if self._instance_create(index, placement, result):
                        current.append(placement)
        gpus = self._mps_make(desired, running, result)
        stopping = self._runtimes_to_stop(desired, running, gpus, targets)
        self._runtimes_start(desired, running, gpus, skip=set(stopping), result=result)

        # 2. Break: stop what goes (runtimes, then MPS partitions and daemons), reshape the GPUs, start the rest.
        for record in stopping.values():
            self._runtime_stop(record)
        self._mps_break(desired, result)
        running = self.supervisor.observe()
        gpus = {g.index: g for g in self.backend.gpus()}
        for index, (spec, layout, mig_enabled) in targets.items():
            gpu = gpus[index]
            if gpu.mig_enabled != mig_enabled:
                for instance in gpu.instances:
                    self._instance_destroy(index, instance.placement, result)
                try:
                    self.backend.mig_mode_set(index, mig_enabled)
                    self._op("mig.mode", f"gpu{index}", "ok", "enabled" if mig_enabled else "disabled")
                except BackendError as exc:
                    self._op("mig.mode", f"gpu{index}", "failed", str(exc))
                    result.errors.append(f"gpu{index}: {exc}")
                    continue
                gpu = next(g for g in self.backend.gpus() if g.index == index)
            if spec is None or not gpu.mig_enabled:
                continue
            diff = mig_layout_diff(spec, [i.placement for i in gpu.instances], layout)
            for placement in diff.destroy:
                self._instance_destroy(index, placement, result)
            for placement in diff.create:
                self._instance_create(index, placement, result)
        gpus = self._mps_make(desired, running, result)
        self._runtimes_start(desired, running, gpus, skip=set(), result=result)
        self._runtimes_resize(desired, result)

        # Converged: every listed GPU has its layout and MPS mode, and every desired runtime runs as desired.
        running = self.supervisor.observe()
        for index, (_spec, layout, mig_enabled) in targets.items():
            gpu = gpus[index]
            if gpu.mig_enabled != mig_enabled or tuple(sorted(i.placement for i in gpu.instances)) != tuple(sorted(layout)):
                result.errors.append(f"gpu{index}: layout not reached")
            want = desired.gpu(index)
            if want is not None and gpu.mps_enabled != want.mps_enabled:
                result.errors.append(f"gpu{index}: MPS mode not reached")
        for key in runtimes_missing(desired, running):
            if not any(e.startswith(key + ":") for e in result.errors):
                result.errors.append(f"{key}: not running")
        for key in runtimes_unresized(desired, running):
            if not any(e.startswith(key + ":") for e in result.errors):
                result.errors.append(f"{key}: not resized yet")
        wanted = {r.key for r in desired.process_runtimes} | {partition_record_key(p.key, p.fingerprint) for p in desired.partitions()}
        for key in sorted(set(running) - wanted):
            result.errors.append(f"{key}: still running though not desired")
        result.converged = not result.errors
        return result

    # ------------------------------------------------------------------ MPS

    def mps_daemons_lost(self, desired: DesiredState, running: dict[str, RuntimeProcess]) -> dict[int, str]:
        """The GPUs the desired state keeps in MPS mode whose MPS control daemon was lost, each with why: its
        daemon does not run though this reconciler saw it run or partition processes still run on the GPU, or
        partition processes run there under another daemon than the one running now (see the module docstring).
        A GPU whose daemon was simply never started yet is not lost (the pass starts it)."""
        partitions: dict[int, list[RuntimeProcess]] = {}
        for record_key, record in running.items():
            parsed = partition_record_parse(record_key)
            if parsed is not None:
                partitions.setdefault(names.runtime_key_parse(parsed[0]).index, []).append(record)
        lost: dict[int, str] = {}
        for want in desired.gpus:
            if not want.mps_enabled:
                continue
            try:
                daemon = self.backend.mps_daemon(want.index)
            except BackendError:
                continue  # no such GPU: the pass reports it
            records = partitions.get(want.index, [])
            if daemon is None:
                seen = self._mps_daemons.get(want.index)
                if seen is not None or records:
                    lost[want.index] = (f"the MPS control daemon{f' {seen}' if seen else ''} is not running "
                                        f"({len(records)} partition process(es) used it)")
                continue
            stale = [r for r in records if r.mps_daemon and r.mps_daemon != daemon]
            if stale:
                lost[want.index] = (f"{len(stale)} partition process(es) run under MPS control daemon {stale[0].mps_daemon}, "
                                    f"which is gone (now {daemon})")
        return lost

    def _mps_daemons_repair(self, desired: DesiredState, running: dict[str, RuntimeProcess]) -> None:
        """Record every lost daemon (`mps.daemon` failed) and stop the partition processes that used it (taken out
        of `running`), so that the pass starts the daemon again and their partitions under it."""
        for index, why in sorted(self.mps_daemons_lost(desired, running).items()):
            self._op("mps.daemon", f"gpu{index}", "failed", f"{why}: starting it again, and its partitions under it")
            self._mps_daemons.pop(index, None)
            daemon = self.backend.mps_daemon(index)
            for record_key, record in sorted(running.items()):
                parsed = partition_record_parse(record_key)
                if parsed is None or names.runtime_key_parse(parsed[0]).index != index:
                    continue
                if daemon is None or (record.mps_daemon and record.mps_daemon != daemon):
                    # Their MPS server is gone: what they hold fails anyway, so a short drain only.
                    self._runtime_stop(record, target=parsed[0], drain_timeout_s=min(self.drain_timeout_s, 2.0))
                    del running[record_key]

    def runtimes_stop_all(self) -> None:
        """The agent's drain exit: every runtime drained at once (each answers what it holds and refuses new
        queries with `draining`), then stopped, one `runtime.drain` and `runtime.stop` each; then the MPS daemons
        (`mps_daemons_stop`), which nothing needs any more."""
        running = sorted(self.supervisor.observe().items())

        def stop(item: tuple[str, RuntimeProcess]) -> None:
            key, record = item
            parsed = partition_record_parse(key)
            self._runtime_stop(record, target=parsed[0] if parsed else key)

        if running:
            with ThreadPoolExecutor(max_workers=min(16, len(running)), thread_name_prefix="tessera-agent-drain") as pool:
                list(pool.map(stop, running))
        self.mps_daemons_stop()

    def mps_daemons_stop(self) -> None:
        """Stop the MPS control daemon of every GPU in MPS mode (the agent's drain exit, once no runtime is left
        to need one). A failure is recorded and the rest are still stopped."""
        try:
            gpus = self.backend.gpus()
        except BackendError as exc:
            log.warning("MPS daemons not stopped: the GPUs cannot be read: %s", exc)
            return
        for gpu in gpus:
            if not gpu.mps_enabled:
                continue
            try:
                self.backend.mps_mode_set(gpu.index, False)
            except BackendError as exc:
                self._op("mps.mode", f"gpu{gpu.index}", "failed", str(exc))
                continue
            self._mps_daemons.pop(gpu.index, None)
            self._op("mps.mode", f"gpu{gpu.index}", "ok", "disabled: the agent stopped its runtimes and exits")

    def _mps_make(self, desired: DesiredState, running: dict[str, RuntimeProcess], result: ReconcileResult) -> dict[int, GpuInfo]:
        """Lost MPS daemons repaired (`_mps_daemons_repair`), MPS daemons on for the GPUs that want them (once MIG
        is off), then the desired partitions' processes that do not run yet, each ready before the next, each
        recorded with the daemon it runs under. Returns the GPUs as they are now."""
        self._mps_daemons_repair(desired, running)
        gpus = {g.index: g for g in self.backend.gpus()}
        changed = False
        for want in desired.gpus:
            gpu = gpus.get(want.index)
            if not want.mps_enabled or gpu is None or gpu.mps_enabled or gpu.mig_enabled:
                continue  # a GPU leaving MIG is switched in step 2 first
            try:
                self.backend.mps_mode_set(want.index, True)
            except BackendError as exc:
                self._op("mps.mode", f"gpu{want.index}", "failed", str(exc))
                result.errors.append(f"gpu{want.index}: {exc}")
                continue
            self._op("mps.mode", f"gpu{want.index}", "ok", "enabled")
            changed = True
        if changed:
            gpus = {g.index: g for g in self.backend.gpus()}
        now = time.monotonic()
        for partition in desired.partitions():
            if self.stop_requested():
                result.errors.append("stopped before finishing")
                break
            record_key = partition_record_key(partition.key, partition.fingerprint)
            gpu = gpus.get(partition.device_index)
            if record_key in running or gpu is None or not gpu.mps_enabled:
                continue
            failures, retry_at = self._failures.get(partition.key, (0, 0.0))
            if now < retry_at:
                result.errors.extend(f"{r.key}: start failed {failures}x; retrying in {retry_at - now:.0f} s" for r in partition.runtimes)
                continue
            simulated = self.backend.name == "simulated"
            try:
                paths = {r.key: (self.artifact_fetch(r.variant["artifact"]) if r.variant.get("artifact") else None) for r in partition.runtimes}
                spec = partition_spec_build(partition, host=desired.host, artifact_paths=paths, device_uuid=gpu.uuid, simulated=simulated)
                env = self.backend.mps_environment(partition.device_index, partition.percent)
                record = self.supervisor.start(key=record_key, fingerprint=partition.fingerprint, spec=spec, env=env, ready_timeout_s=self.ready_timeout_s,
                                               mps_daemon=self.backend.mps_daemon(partition.device_index) or "")
                health = self.supervisor.call(record, "health", timeout_s=5.0)
                if health.get("status") != 200:
                    self.supervisor.stop(record, drain_timeout_s=0)
                    raise RuntimeStartError(f"health check answered {health}")
            except Exception as exc:  # artifacts, the environment, the process or its health: retried later
                failures += 1
                self._failures[partition.key] = (failures, now + min(RESTART_BACKOFF_MAX_S, 2.0 ** failures))
                self._op("runtime.start", partition.key, "failed", str(exc)[:500])
                result.errors.extend(f"{r.key}: {exc}" for r in partition.runtimes)
                continue
            self._failures.pop(partition.key, None)
            running[record_key] = record
            label = "simulated" if simulated else gpu.uuid
            models = ", ".join(r.variant["name"] for r in partition.runtimes)
            self._op("runtime.start", partition.key, "ok", f"{partition.percent} % for {models} at {record.endpoint} on {label}")
        for want in desired.gpus:
            daemon = self.backend.mps_daemon(want.index) if want.mps_enabled and want.index in gpus else None
            if daemon is not None:
                self._mps_daemons[want.index] = daemon
        return gpus

    def _mps_break(self, desired: DesiredState, result: ReconcileResult) -> None:
        """Stop the partition processes no longer desired as they are (the new ones started in step 1), then
        the MPS daemons of the GPUs leaving MPS mode, once none of their partitions runs."""
        wanted = {partition_record_key(p.key, p.fingerprint) for p in desired.partitions()}
        running = self.supervisor.observe()
        for record_key, record in sorted(running.items()):
            parsed = partition_record_parse(record_key)
            if parsed is not None and record_key not in wanted:
                self._runtime_stop(record, target=parsed[0])
        gpus = {g.index: g for g in self.backend.gpus()}
        left = {names.runtime_key_parse(parsed[0]).index for k in self.supervisor.observe() if (parsed := partition_record_parse(k))}
        for want in desired.gpus:
            gpu = gpus.get(want.index)
            if want.mps_enabled or gpu is None or not gpu.mps_enabled:
                continue
            if want.index in left:
                result.errors.append(f"gpu{want.index}: MPS partitions still run; MPS stays on")
                continue
            try:
                self.backend.mps_mode_set(want.index, False)
            except BackendError as exc:
                self._op("mps.mode", f"gpu{want.index}", "failed", str(exc))
                result.errors.append(f"gpu{want.index}: {exc}")
                continue
            self._mps_daemons.pop(want.index, None)
            self._op("mps.mode", f"gpu{want.index}", "ok", "disabled")

    # ------------------------------------------------------------------ MIG

    def _instance_create(self, index: int, placement: Placement, result: ReconcileResult) -> bool:
        try:
            created = self.backend.mig_instance_create(index, placement)
        except BackendError as exc:
            self._op("mig.create", f"gpu{index}/{placement}", "failed", str(exc))
            result.errors.append(f"gpu{index}/{placement}: {exc}")
            return False
        self._op("mig.create", f"gpu{index}/{placement}", "ok", created.uuid)
        return True

    def _instance_destroy(self, index: int, placement: Placement, result: ReconcileResult) -> None:
        # Never destroy under a runtime: stop whatever runs on the instance first (found by its key).
        for record in self.supervisor.observe().values():
            if partition_record_parse(record.key) is not None:
                continue  # MPS partitions are stopped before MIG is enabled (step 2)
            kind, gpu_index, where, _ = runtime_key_parse(record.key)
            if kind == "gpu" and gpu_index == index and where in (placement, None):
                self._runtime_stop(record)
        try:
            self.backend.mig_instance_destroy(index, placement)
        except BackendError as exc:
            self._op("mig.destroy", f"gpu{index}/{placement}", "failed", str(exc))
            result.errors.append(f"gpu{index}/{placement}: {exc}")
            return
        self._op("mig.destroy", f"gpu{index}/{placement}", "ok")

    # ------------------------------------------------------------------ runtimes

    def _runtimes_to_stop(self, desired: DesiredState, running: dict[str, RuntimeProcess], gpus: dict[int, GpuInfo], targets: dict) -> dict[str, RuntimeProcess]:
        stop: dict[str, RuntimeProcess] = {}
        for key, record in running.items():
            if partition_record_parse(key) is not None:
                continue  # MPS partitions: _mps_break
            want = desired.runtime(key)
            kind, index, placement, _ = runtime_key_parse(key)
            on_gone_instance = False
            if kind == "gpu":
                gpu = gpus.get(index)
                target = targets.get(index)
                if gpu is None:
                    on_gone_instance = True
                elif placement is None:
                    on_gone_instance = gpu.mig_enabled or (target is not None and target[2])
                else:
                    present = placement in [i.placement for i in gpu.instances]
                    kept = target is None or (target[2] == gpu.mig_enabled and placement in target[1])
                    on_gone_instance = not present or not kept
            if want is None or want.fingerprint != record.fingerprint or on_gone_instance:
                stop[key] = record
        return stop

    def _runtimes_resize(self, desired: DesiredState, result: ReconcileResult) -> None:
        """Resize in place the CPU runtimes whose `cpu_threads` or `vertical` changed (see the module docstring)."""
        running = self.supervisor.observe()
        for key in runtimes_unresized(desired, running):
            if self.stop_requested():
                result.errors.append("stopped before finishing")
                return
            runtime, record = desired.runtime(key), running[key]
            assert runtime is not None
            try:
                reply = self.resizer(record, runtime)
            except (OSError, ValueError) as exc:  # the runtime did not answer: tried again on the next pass
                reply = {"status": None, "message": f"{type(exc).__name__}: {exc}"}
            if reply.get("status") != 200:
                message = reply.get("message") or str(reply)
                self._op("runtime.resize", key, "failed", str(message)[:500])
                result.errors.append(f"{key}: resize failed: {message}")
                continue
            self.supervisor.resized(record, runtime.resize_fingerprint)
            self._op("runtime.resize", key, "ok", resize_detail(reply.get("before"), reply) + " (desired state)")

    def _resize_direct(self, record: RuntimeProcess, runtime: DesiredRuntime) -> dict:
        """A resize frame to the desired cores (clamped into the vertical bounds), without the fast loop."""
        before = self.supervisor.call(record, "health", timeout_s=5.0)
        cores = runtime.cpu_threads or 1
        if runtime.vertical is not None:
            cores = min(max(cores, runtime.vertical.min_cores), runtime.vertical.max_cores)
        reply = self.supervisor.request(record, resize_frame(runtime, cores), timeout_s=60.0)
        reply["before"] = {"cores": before.get("cores"), "max_batch": before.get("max_batch")}
        return reply

    def _runtime_stop(self, record: RuntimeProcess, target: str | None = None, drain_timeout_s: float | None = None) -> None:
        target = target or record.key
        drained = self.supervisor.drain(record, self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s)
        self._op("runtime.drain", target, "ok" if drained else "failed", "" if drained else "did not drain; stopping anyway")
        self.supervisor.stop(record, drain_timeout_s=0)
        self._op("runtime.stop", target, "ok")

    def _device_for(self, runtime: DesiredRuntime, gpus: dict[int, GpuInfo]) -> tuple[bool, str | None]:
        """(can start now, device uuid) for a runtime: its GPU instance must exist."""
        if runtime.device_kind == "cpu":
            return True, None
        gpu = gpus.get(runtime.device_index)
        if gpu is None:
            return False, None
        if runtime.placement is None:
            return (not gpu.mig_enabled), gpu.uuid
        instance = next((i for i in gpu.instances if i.placement == runtime.placement), None)
        return (instance is not None), (instance.uuid if instance else None)

    def _runtimes_start(self, desired: DesiredState, running: dict[str, RuntimeProcess], gpus: dict[int, GpuInfo], *, skip: set[str], result: ReconcileResult) -> None:
        now = time.monotonic()
        for runtime in desired.process_runtimes:
            record = running.get(runtime.key)
            if self.stop_requested():
                result.errors.append("stopped before finishing")
                return
            if runtime.key in skip or (record is not None and record.fingerprint == runtime.fingerprint):
                continue
            if record is not None:
                continue  # a different runtime still holds this key; it is stopped first
            ready, device_uuid = self._device_for(runtime, gpus)
            if not ready:
                continue
            failures, retry_at = self._failures.get(runtime.key, (0, 0.0))
            if now < retry_at:
                last = self._start_errors.get(runtime.key, "")
                result.errors.append(f"{runtime.key}: start failed {failures}x ({last}); retrying in {retry_at - now:.0f} s")
                result.failed_starts[runtime.key] = last
                continue
            simulated = runtime.device_kind == "gpu" and self.backend.name == "simulated"
            try:
                artifact = runtime.variant.get("artifact")
                path = self.artifact_fetch(artifact) if artifact else None
                # A simulated host plans with the cores it declares, which may be more than this machine has.
                spec = runtime_spec_build(runtime, artifact_path=path, device_uuid=device_uuid, simulated=simulated,
                                          cpu_oversubscribe=self.backend.name == "simulated")
                env = {"CUDA_VISIBLE_DEVICES": "" if simulated or device_uuid is None else device_uuid}
                if runtime.cpu_threads:
                    env["OMP_NUM_THREADS"] = str(runtime.cpu_threads)
                # What a CPU runtime starts with is what it is resized to (GPU runtimes are never resized).
                extra = {"resize_fingerprint": runtime.resize_fingerprint} if runtime.resize_fingerprint else {}
                record = self.supervisor.start(key=runtime.key, fingerprint=runtime.fingerprint, spec=spec, env=env,
                                               ready_timeout_s=self.ready_timeout_s, **extra)
                health = self.supervisor.call(record, "health", timeout_s=5.0)
                if health.get("status") != 200:
                    self.supervisor.stop(record, drain_timeout_s=0)
                    raise RuntimeStartError(f"health check answered {health}")
            except Exception as exc:  # the artifact, the process or its health: retried later
                failures += 1
                self._failures[runtime.key] = (failures, now + min(RESTART_BACKOFF_MAX_S, 2.0 ** failures))
                self._start_errors[runtime.key] = str(exc)[:500]
                self._op("runtime.start", runtime.key, "failed", str(exc)[:500])
                result.errors.append(f"{runtime.key}: {exc}")
                result.failed_starts[runtime.key] = str(exc)[:500]
                continue
            self._failures.pop(runtime.key, None)
            self._start_errors.pop(runtime.key, None)
            running[runtime.key] = record
            label = "simulated" if simulated else (device_uuid or "cpu")
            self._op("runtime.start", runtime.key, "ok", f"{runtime.variant['name']} at {record.endpoint} on {label}")
