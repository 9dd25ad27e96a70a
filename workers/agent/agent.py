"""The agent's loops: register, follow the desired state, report, heartbeat with metrics, profile.

- **Control loop** (the calling thread): every `poll_s`, read the host's desired state (from the control
  plane, or from `desired_file`), reconcile when its version is not the one the host converged to or a
  desired runtime is not running, and report the actual state after every pass (and every `report_s`).
  The last desired state read is kept on disk, so an agent restarted while the control plane is away
  still knows what to run.
- **Metrics loop** (a thread): every `metrics_s`, collect each runtime's counters for the interval and the
  GPUs' telemetry, post them (this is also the heartbeat) and update the Prometheus exporter. Reports the
  control plane cannot take are kept (`ReportBacklog`, `REPORT_BACKLOG_S` of them) and sent, with their
  original times, once it is back; overflow is counted (`tessera_agent_reports_dropped_total`) and told
  to the control plane in the next report (`dropped_reports`).
- **Profiling loop** (a thread): runs the control plane's profiling requests for this host, one at a time.
- **Fast vertical loop** (a thread, every `vertical_s`, about a second; issue 19): sizes the CPU runtimes
  with a `vertical` block in place from what they measured (Sponge), within the host's cores
  (workers/agent/vertical.py). It uses only local state, so it keeps working while the control plane is
  away. The reconciler's in-place resizes (a desired `cpu_threads` or `vertical` change) go through it too.
  Each metrics report's CPU runtimes carry their `cores`, `max_batch`, `cpus` and the `resizes` since the
  previous report.

The control plane being unreachable never stops serving: the runtimes keep their sessions and the router
its tables; the agent logs the outage once and carries on.

Exits (`stop`): by default the runtimes and their MPS daemons outlive the agent (a restart: the next agent takes
them over); with `stop_runtimes` (a drain, as under Kubernetes, where they die with the agent's container) they
are reported draining, drained, stopped and reported stopped first (`drain_exit`). MPS daemons the desired state
relies on are checked on every poll, and one lost after convergence is reported and restored (reconcile.py)."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from engine.geometry import names
from engine.vertical.controller import SHRINK_AFTER_INTERVALS
from workers.client import ReportBacklog, report_backlog_capacity
from workers.metrics import ReportBacklogCollector

from .backends import DeviceBackend
from .desired import DesiredState, DesiredStateError, desired_state_parse
from .reconcile import Operation, ReconcileResult, Reconciler, partition_record_parse, runtimes_missing
from .supervisor import RuntimeProcess, RuntimeSupervisor
from .vertical import VerticalScaler

__all__ = ["Agent", "AGENT_VERSION"]

log = logging.getLogger("tessera.agent")

AGENT_VERSION = "0.1.0"
# A runtime's `stats` fields the agent keeps to itself (the fast loop's signals), and those only CPU runtimes report.
_LOCAL_STATS = ("rate_rps", "budgets_ms", "max_batch_limit")
_CPU_STATS = ("cores", "max_batch", "cpus")
def _mib(value: float | None) -> int:
    return 0 if value is None else max(0, round(value))


class Agent:
    """See the module docstring. `client` is a `workers.client.ControlPlaneClient` (None with a
    `desired_file` and no control plane)."""

    def __init__(
        self,
        *,
        backend: DeviceBackend,
        state_dir: Path,
        client: Any = None,
        desired_file: Path | None = None,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        poll_s: float = 1.0,
        metrics_s: float = 1.0,
        report_s: float = 10.0,
        exporter: Any = None,
        on_operation: Callable[[Operation], None] | None = None,
        drain_timeout_s: float = 10.0,
        vertical_s: float = 1.0,
        pin_cpus: bool = True,
        withdraw_s: float = 0.0,
        vertical_shrink_after: int = SHRINK_AFTER_INTERVALS,
        keep_mig_modes: bool = False,
    ) -> None:
        if client is None and desired_file is None:
            raise ValueError("give a control plane (client) or a desired-state file")
        self.backend = backend
        self.client = client
        self.desired_file = Path(desired_file) if desired_file else None
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.poll_s, self.metrics_s, self.report_s = poll_s, metrics_s, report_s
        self.exporter = exporter
        self.metrics_backlog = ReportBacklog(client.metrics, capacity=report_backlog_capacity(metrics_s), what="metrics report") if client else None
        if exporter is not None:
            exporter.runtime_metrics = self.runtime_metrics
            if self.metrics_backlog is not None:
                exporter.registry.register(ReportBacklogCollector("tessera_agent", self.metrics_backlog))
        self.supervisor = RuntimeSupervisor(self.state_dir, bind=bind, advertise=advertise)
        self._operations: list[Operation] = []
        self._ops_lock = threading.Lock()
        self._specs: dict[str, dict | None] = {}  # spec file -> the spec a runtime process was started with
        self._extra_on_operation = on_operation
        self.vertical = VerticalScaler(
            supervisor=self.supervisor, desired=lambda: self._desired, host_cores=backend.cpu_cores, on_operation=self._operation_seen,
            interval_s=vertical_s, pin_cpus=pin_cpus, shrink_after=vertical_shrink_after,
        )
        self.reconciler = Reconciler(
            backend=backend, supervisor=self.supervisor, artifact_fetch=self._artifact_fetch,
            on_operation=self._operation_seen, drain_timeout_s=drain_timeout_s,
            stop_requested=lambda: self._stop.is_set(), resizer=self.vertical.desired_resize, keep_mig_modes=keep_mig_modes,
        )
        # How long a drain exit waits between reporting its runtimes draining and draining them (`tessera agent`:
        # WITHDRAW_S, two of the routers' one-second refreshes; 0 drains at once, and the runtimes' own `draining`
        # answers send the routers elsewhere).
        self.withdraw_s = withdraw_s
        self._exiting = ""  # "draining", then "stopped", during a drain exit (drain_exit)
        self.converged_version: int | None = None
        # The latest version reached but for runtimes that failed to start (ReconcileResult.settled): a
        # rollout goes on without them rather than failing the whole plan.
        self.settled_version: int | None = None
        self.last_result: ReconcileResult | None = None
        self._desired: DesiredState | None = None
        self._desired_error = ""
        self._last_report = 0.0
        self._cp_down_since: float | None = None
        self._stop = threading.Event()
        self._loop_running = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runtime_errors: dict[str, str] = {}
        self._mps_lost: dict[int, str] = {}  # GPU index -> why its MPS daemon is lost, until a pass restores it
        self._mps_lost_seen: dict[int, str] = {}

    # ------------------------------------------------------------------ helpers

    def _operation_seen(self, op: Operation) -> None:
        with self._ops_lock:
            self._operations.append(op)
            del self._operations[:-1000]  # an agent cut off for long keeps the latest thousand
        if self._extra_on_operation is not None:
            self._extra_on_operation(op)

    def _artifact_fetch(self, artifact: dict) -> Path:
        cache = self.state_dir / "artifacts"
        if self.client is None:
            # Without a control plane, the desired file names local files (`download` is a path).
            path = Path(artifact["download"])
            from workers.client import _file_sha256

            if _file_sha256(path) != artifact["sha256"]:
                raise ValueError(f"{path}: does not match sha256 {artifact['sha256']}")
            return path
        return self.client.artifact_fetch(artifact, cache)

    def _cp_call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call the control plane; an outage is logged once and returns None."""
        from workers.client import ControlPlaneRejected, ControlPlaneUnavailable

        try:
            value = fn()
        except ControlPlaneUnavailable as exc:
            if self._cp_down_since is None:
                self._cp_down_since = time.monotonic()
                log.warning("control plane unreachable (%s); serving on the last desired state: %s", what, exc)
            return None
        except ControlPlaneRejected as exc:
            log.error("control plane refused %s: %s", what, exc)
            return None
        if self._cp_down_since is not None:
            log.info("control plane reachable again after %.0f s", time.monotonic() - self._cp_down_since)
            self._cp_down_since = None
        return value

    # ------------------------------------------------------------------ desired state

    def _desired_cache(self) -> Path:
        return self.state_dir / "desired.json"

    def desired_read(self) -> DesiredState | None:
        """The desired state to follow: fresh from the source when it answers, else the last one kept."""
        doc = None
        if self.desired_file is not None:
            doc = json.loads(self.desired_file.read_text())
        else:
            fetched = self._cp_call("desired state", self.client.desired_state)
            if fetched is not None:
                doc = fetched
            elif self._desired is None and self._desired_cache().exists():
                doc = json.loads(self._desired_cache().read_text())
        if doc is None:
            return self._desired
        try:
            desired = desired_state_parse(doc)
        except DesiredStateError as exc:
            if self._desired_error != str(exc):
                log.error("desired state refused, keeping the previous one: %s", exc)
            self._desired_error = str(exc)
            return self._desired
        self._desired_error = ""
        if self._desired is None or desired.version != self._desired.version:
            tmp = self._desired_cache().with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self._desired_cache())
        self._desired = desired
        return desired

    def _needs_reconcile(self, desired: DesiredState, mps_lost: dict[int, str]) -> bool:
        if self.converged_version != desired.version or self.last_result is None or not self.last_result.converged:
            return True
        return bool(mps_lost) or bool(runtimes_missing(desired, self.supervisor.observe()))

    def _served(self, running: dict[str, RuntimeProcess]) -> dict[str, tuple[RuntimeProcess, dict | None]]:
        """Runtime key -> (the process serving it, its model's spec within an MPS partition's spec, else None).
        A model of an MPS partition is served by its partition's process; while a partition is being replaced
        two processes serve it, and the one the desired state wants (else the newer) stands for it."""
        wanted = {p.key: p.fingerprint for p in (self._desired.partitions() if self._desired else ())}
        served: dict[str, tuple[RuntimeProcess, dict | None]] = {}
        partitions = []
        for key, record in running.items():
            parsed = partition_record_parse(key)
            if parsed is None:
                served[key] = (record, None)
            else:
                partitions.append((parsed[1] == wanted.get(parsed[0]), record.started_at, record))
        for _wanted, _started, record in sorted(partitions, key=lambda item: (item[0], item[1])):
            spec = self._spec(record.spec_path) or {}
            for model in spec.get("models") or []:
                if isinstance(model, dict) and isinstance(model.get("key"), str):
                    served[model["key"]] = (record, model)  # sorted so that the preferred process comes last
        return served

    # ------------------------------------------------------------------ reports

    def actual_state(self) -> dict:
        """The report of docs/dataplane.md, "Actual state"."""
        running = self.supervisor.observe()
        # MPS partitions whose processes run, per GPU: {"percent", "index"} (the contract of issue 17).
        partitions: dict[int, set[tuple[int, int]]] = {}
        for key in running:
            parsed = partition_record_parse(key)
            if parsed is not None:
                rk = names.runtime_key_parse(parsed[0])
                partitions.setdefault(rk.index, set()).add((rk.mps_percent or 0, rk.mps_index or 0))
        accelerators: list[dict] = []
        for gpu in self.backend.gpus():
            accelerators.append({
                "index": gpu.index, "kind": "gpu", "uuid": gpu.uuid, "model_name": gpu.model_name,
                "memory_mb": gpu.memory_mb, "mig_capable": gpu.mig_capable, "mig_enabled": gpu.mig_enabled,
                "instances": [{"profile": i.placement.profile, "start": i.placement.start, "uuid": i.uuid, "state": "ready"} for i in gpu.instances],
                "placements": {name: list(starts) for name, starts in gpu.placements.items()},
                **({"pci_device_id": gpu.pci_device_id} if gpu.pci_device_id else {}),
                # NVML's profile table, while MIG is on: a GPU the catalogue lacks is planned from it.
                **({"nvml_profiles": [dict(p) for p in gpu.nvml_profiles]} if gpu.nvml_profiles else {}),
                "mps_enabled": gpu.mps_enabled,
                # Only while MPS is on (a process left on a GPU whose daemon died is no partition of it).
                "mps_partitions": [{"percent": percent, "index": index}
                                   for percent, index in sorted(partitions.get(gpu.index, ()) if gpu.mps_enabled else (), key=lambda p: (p[1], -p[0]))],
            })
        accelerators.append({"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": self.backend.cpu_cores()})
        desired = {r.key: r for r in (self._desired.runtimes if self._desired else ())}
        wanted_partitions = {p.key: p.fingerprint for p in (self._desired.partitions() if self._desired else ())}
        runtimes = []
        served = self._served(running)
        for key, (record, model) in sorted(served.items()):
            want = desired.get(key)
            if model is not None:
                # A model of an MPS partition: reported as its own runtime, at its partition process's endpoint.
                parsed = partition_record_parse(record.key)
                if want is not None and parsed is not None and wanted_partitions.get(parsed[0]) == record.fingerprint:
                    application, variant, simulated = want.application, want.variant.get("id"), self.backend.name == "simulated"
                else:
                    application, variant, simulated = str(model.get("application") or ""), model.get("variant_id"), bool(model.get("simulated"))
            elif want is not None and record.fingerprint == want.fingerprint:
                application, variant, simulated = want.application, want.variant.get("id"), want.device_kind == "gpu" and self.backend.name == "simulated"
            else:
                # It still runs what an earlier desired state asked for (about to be replaced or stopped): report
                # the model it serves, never the one wanted next, so the control plane routes no query for the new
                # model to it before its replacement runs.
                application, variant, simulated = self._running_model(record.spec_path)
            state, error = "ready", ""
            if self._exiting:
                state, error = "draining", "the agent is stopping: drained before it exits"
            elif model is not None and (parsed := partition_record_parse(record.key)) is not None:
                index = names.runtime_key_parse(parsed[0]).index
                if index in self._mps_lost:  # its MPS server is gone: no query should be routed to it
                    state, error = "failed", f"gpu{index}: {self._mps_lost[index]}"
            runtimes.append({
                "key": key, "application": application, "variant": variant,
                "state": state, "endpoint": record.endpoint or "", "simulated": bool(simulated), "error": error,
            })
        for key, want in sorted(desired.items()):
            if key not in served:
                error = next((e for e in (self.last_result.errors if self.last_result else []) if e.startswith(key + ":")), "not started")
                if self._exiting:
                    error = "stopped with the agent, which drained its runtimes and exited; they start again with it"
                runtimes.append({"key": key, "application": want.application, "variant": want.variant.get("id"), "state": "failed",
                                 "endpoint": "", "simulated": want.device_kind == "gpu" and self.backend.name == "simulated", "error": error})
        with self._ops_lock:
            operations = [op.as_report() for op in self._operations]
        return {
            "backend": self.backend.name, "agent_version": AGENT_VERSION, "accelerators": accelerators,
            "desired_version": self.converged_version, "settled_version": self.settled_version, "runtimes": runtimes, "operations": operations,
            "catalogue_disagreements": self.backend.catalogue_disagreements(),
        }

    def _spec(self, spec_path: str) -> dict | None:
        """The spec a runtime process was started with (None when it cannot be read)."""
        if spec_path not in self._specs:
            try:
                spec = json.loads(Path(spec_path).read_text())
            except (OSError, ValueError):
                return None
            if len(self._specs) > 1024:  # spec files are per process start: forget the old ones
                self._specs.clear()
            self._specs[spec_path] = spec if isinstance(spec, dict) else None
        return self._specs[spec_path]

    def _running_model(self, spec_path: str) -> tuple[str, int | None, bool]:
        """(application, variant id, simulated) of the spec a runtime process was started with; ("", None,
        False) when the spec cannot be read (a record from an older agent has no variant id: None)."""
        spec = self._spec(spec_path)
        if spec is None:
            return "", None, False
        return str(spec.get("application") or ""), spec.get("variant_id"), bool(spec.get("simulated"))

    def report(self) -> bool:
        if self.client is None:
            return False
        report = self.actual_state()
        sent = self._cp_call("report", lambda: self.client.report(report))
        if sent is not None:
            with self._ops_lock:  # what was reported is dropped; what came since stays for the next report
                del self._operations[: len(report["operations"])]
            self._last_report = time.monotonic()
            return True
        return False

    # ------------------------------------------------------------------ the loops

    def step(self) -> ReconcileResult | None:
        """One pass of the control loop. An MPS control daemon found lost (`Reconciler.mps_daemons_lost`) is
        logged and reported at once, its partitions' models failed, before the pass that restores it."""
        desired = self.desired_read()
        result = None
        mps_lost = self.reconciler.mps_daemons_lost(desired, self.supervisor.observe()) if desired is not None else {}
        if mps_lost and mps_lost != self._mps_lost_seen:  # once per loss, not on every poll a repair keeps failing
            for index, why in sorted(mps_lost.items()):
                log.warning("gpu%d: %s; its partitions are reported failed until they run again under a new daemon", index, why)
            self._mps_lost = mps_lost
            self.report()
        self._mps_lost_seen = mps_lost
        if desired is not None and self._needs_reconcile(desired, mps_lost):
            result = self.reconciler.reconcile(desired)
            self.last_result = result
            if result.settled:
                self.settled_version = desired.version
            if result.converged:
                if self.converged_version != desired.version:
                    log.info("converged to desired state version %d", desired.version)
                self.converged_version = desired.version
            else:
                log.warning("desired state version %d not reached yet: %s", desired.version, "; ".join(result.errors[:5]))
            self._mps_lost = {}
        if result is not None or time.monotonic() - self._last_report >= self.report_s:
            self.report()
        return result

    def metrics_tick(self, interval_s: float) -> dict:
        """Collect one interval's metrics, post them and feed the exporter; returns the payload."""
        from datetime import datetime, timezone

        snapshots = []
        desired = {r.key: r for r in (self._desired.runtimes if self._desired else ())}
        mps_load: dict[int, float] = {}  # an MPS GPU's busy fraction: its models' busy time weighted by their partition's share
        for key, (record, model) in sorted(self._served(self.supervisor.observe()).items()):
            try:
                reply = self.supervisor.call(record, "stats", timeout_s=1.0, key=key if model is not None else None)
            except (OSError, ValueError):
                continue
            stats = dict(reply.get("stats") or {})
            want = desired.get(key)
            # Sponge's signals are for the fast loop, not the control plane; a CPU runtime's sizes and resizes are
            # (the cores of each instance over time).
            for name in _LOCAL_STATS:
                stats.pop(name, None)
            if (want is not None and want.device_kind == "cpu") or (want is None and isinstance(stats.get("cores"), int)):
                stats["resizes"] = self.vertical.resizes_take(key)
            else:
                for name in _CPU_STATS:
                    stats.pop(name, None)
            stats.setdefault("key", key)
            stats.setdefault("application", want.application if want else "")
            stats.setdefault("variant", want.variant["name"] if want else "")
            snapshots.append(stats)
            if want is not None and want.device_kind == "gpu" and hasattr(self.backend, "set_load"):
                busy = min(1.0, float(stats.get("busy_ms", 0.0)) / (interval_s * 1000.0))
                if want.mps_percent is not None:
                    mps_load[want.device_index] = mps_load.get(want.device_index, 0.0) + busy * want.mps_percent / 100.0
                else:
                    self.backend.set_load(want.device_index, want.placement, busy)
        for index, busy in mps_load.items():
            self.backend.set_load(index, None, min(1.0, busy))
        telemetry = self.backend.telemetry()
        payload = {
            "at": datetime.now(timezone.utc).isoformat(), "interval_s": interval_s,
            "gpus": [{
                "index": t.index, "uuid": t.uuid, "utilization_pct": t.utilization_pct, "memory_used_mb": _mib(t.memory_used_mb),
                "power_w": t.power_w, "simulated": t.simulated,
                "instances": [{"placement": str(i.placement), "gr_engine_active_pct": i.gr_engine_active_pct, "memory_used_mb": _mib(i.memory_used_mb)} for i in t.instances],
            } for t in telemetry],
            "runtimes": snapshots,
        }
        if self.exporter is not None:
            gpus = self.backend.gpus()
            self.exporter.update(
                telemetry, model_names={g.index: g.model_name for g in gpus},
                gi_ids={(g.index, str(i.placement)): i.gpu_instance_id for g in gpus for i in g.instances},
            )
        if self.metrics_backlog is not None:
            self._cp_call("metrics", lambda: self.metrics_backlog.submit(payload))
        return payload

    def runtime_metrics(self) -> list[bytes]:
        """Each running runtime's Prometheus text (its `metrics` frame), for the exporter's scrape."""
        from .supervisor import frame_call

        texts = []
        for key, (record, model) in sorted(self._served(self.supervisor.observe()).items()):
            if not record.endpoint:
                continue
            try:
                header = {"op": "metrics", "key": key} if model is not None else {"op": "metrics"}
                reply, body = frame_call(record.endpoint, header, timeout_s=1.0)
            except (OSError, ValueError):
                continue
            if reply.get("status") == 200:
                texts.append(body)
        return texts

    def _metrics_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(max(0.0, last + self.metrics_s - time.monotonic())):
            now = time.monotonic()
            try:
                self.metrics_tick(now - last)
            except Exception:  # metrics must never take the agent down
                log.exception("metrics collection failed")
            last = now

    def _profiling_loop(self, poll_s: float = 5.0) -> None:
        from workers.profiler import profiling_request_run

        while not self._stop.wait(poll_s):
            requests = self._cp_call("profiling requests", lambda: self.client.profiling_requests("pending")) or []
            for request in requests:
                if self._stop.is_set():
                    return
                try:
                    profiling_request_run(request, client=self.client, backend=self.backend, cache_dir=self.state_dir / "artifacts")
                except Exception:
                    log.exception("profiling request %s failed", request.get("id"))

    def drain_exit(self) -> None:
        """Take the host's runtimes out of service and stop them, in this order:

        1. report the host with every runtime `draining` and no desired version reached: the control plane's
           routing tables mark their routes not ready, and routers stop choosing them at their next refresh;
        2. `withdraw_s` later (once that report went out), drain every runtime at once and stop it: what it
           holds is answered, and a query still sent to it is refused `draining`, which routers retry on another
           instance; then stop the MPS daemons (`Reconciler.runtimes_stop_all`);
        3. report the host again: its desired runtimes not running (`failed`, saying the agent stopped them).

        Whatever the control plane is told, no query is answered by a runtime that is going: the worst is a
        refusal. The next agent starts the runtimes again from the desired state (kept on disk) and reports the
        host not converged until they all run."""
        self._exiting = "draining"
        self.converged_version = self.settled_version = None
        if self.report() and self.withdraw_s > 0:
            time.sleep(self.withdraw_s)
        self.reconciler.runtimes_stop_all()
        self._exiting = "stopped"
        self.report()
        log.info("runtimes drained and stopped; the agent exits")

    def start_background(self) -> None:
        """Start the metrics (and, with a control plane, profiling) threads."""
        targets = [self._metrics_loop] + ([self._profiling_loop] if self.client is not None else [])
        for target in targets:
            thread = threading.Thread(target=target, name=f"tessera-agent-{target.__name__.strip('_')}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.vertical.interval_s > 0:
            self.vertical.start()

    def run(self, *, once: bool = False) -> None:
        """Run until `stop()` (or a single pass with `once`)."""
        if self.client is not None:
            self.report()  # registration: the host's devices, before anything else
        if once:
            self.step()
            return
        self.start_background()
        self._loop_running.set()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self.step()
                except Exception:
                    log.exception("control loop pass failed; trying again")
                self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - started)))
        finally:
            self._loop_running.clear()

    def stop(self, *, stop_runtimes: bool = False) -> None:
        """Stop the loops, then exit one of two ways (docs/dataplane.md, "Agent exits and restarts"):

        - a restart (the default: an upgrade, a crash, systemd's KillMode=process): the runtimes and their MPS
          daemons keep serving, and the next agent finds them again from their records;
        - a drain (`stop_runtimes`; under Kubernetes, where every process the agent starts dies with its
          container): `drain_exit`, so that no query is routed to a runtime that is about to go."""
        self._stop.set()
        # A pass in progress (another thread runs the loop) finishes first: nothing starts after this.
        deadline = time.monotonic() + 120.0
        while self._loop_running.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.vertical.stop()
        if stop_runtimes:
            self.drain_exit()
        if self.exporter is not None:
            self.exporter.close()
        self.backend.close()
