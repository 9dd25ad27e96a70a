"""The agent's Prometheus `/metrics` (names in docs/dataplane.md):

- GPU telemetry under the DCGM exporter's names, set by the agent every second. As in DCGM, a MIG
  instance's series carry `GPU_I_PROFILE` and `GPU_I_ID`, a whole GPU's have them empty, and plain
  utilisation is absent under MIG (NVML does not report it there; the graphics-engine activity is).
- Each runtime's own counters and histograms (Triton's `nv_inference_*` and Tessera's), read from the
  runtime at scrape time (its `metrics` frame) and merged in: they are cumulative in the runtime process,
  so they survive an agent restart, and nothing is counted twice.
- The agent's metrics-report buffer (`tessera_agent_reports_*`: dropped, rejected, sent late, pending),
  registered by the agent (`workers.metrics.ReportBacklogCollector`).
"""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from workers.metrics import exposition_merge

__all__ = ["AgentExporter"]

log = logging.getLogger("tessera.agent")

_LABELS = ("gpu", "UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname", "simulated")


class AgentExporter:
    def __init__(self, *, hostname: str, runtime_metrics: Callable[[], list[bytes]] | None = None) -> None:
        self.hostname = hostname
        self.runtime_metrics = runtime_metrics or (lambda: [])  # set by the agent: one text per runtime
        self.registry = CollectorRegistry()
        r = self.registry
        self.gpu_util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (%); absent on MIG-enabled GPUs", _LABELS, registry=r)
        self.gr_active = Gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Graphics engine active ratio (0..1)", _LABELS, registry=r)
        self.fb_used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (MiB)", _LABELS, registry=r)
        self.power = Gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (W)", _LABELS, registry=r)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def update(
        self,
        telemetry: Iterable[Any],
        *,
        gi_ids: dict[tuple[int, str], int] | None = None,
        model_names: dict[int, str] | None = None,
    ) -> None:
        """One reading of every GPU (`GpuTelemetry`); `gi_ids`: (GPU index, placement) -> NVML GPU
        instance id; `model_names`: GPU index -> NVML name. Series of GPUs and instances that are gone are
        dropped, so a destroyed MIG instance does not linger at its last value."""
        gi_ids = gi_ids or {}
        model_names = model_names or {}
        with self._lock:
            for gauge in (self.gpu_util, self.gr_active, self.fb_used, self.power):
                gauge.clear()
            for gpu in telemetry:
                simulated = "true" if gpu.simulated else "false"
                whole = (str(gpu.index), gpu.uuid, model_names.get(gpu.index, ""), "", "", self.hostname, simulated)
                if gpu.utilization_pct is not None:
                    self.gpu_util.labels(*whole).set(gpu.utilization_pct)
                self.fb_used.labels(*whole).set(gpu.memory_used_mb or 0.0)
                if gpu.power_w is not None:
                    self.power.labels(*whole).set(gpu.power_w)
                for instance in gpu.instances:
                    placement = str(instance.placement)
                    gi_id = gi_ids.get((gpu.index, placement))
                    mig = (str(gpu.index), instance.uuid, model_names.get(gpu.index, ""), instance.placement.profile,
                           "" if gi_id is None else str(gi_id), self.hostname, simulated)
                    if instance.gr_engine_active_pct is not None:
                        self.gr_active.labels(*mig).set(instance.gr_engine_active_pct / 100.0)
                    if instance.memory_used_mb is not None:
                        self.fb_used.labels(*mig).set(instance.memory_used_mb)

    def scrape(self) -> bytes:
        """The whole exposition: the GPUs' gauges and every runtime's metrics."""
        with self._lock:
            own = generate_latest(self.registry)
        try:
            texts = self.runtime_metrics()
        except Exception:  # a scrape never fails because one runtime is going away
            log.exception("reading the runtimes' metrics failed")
            texts = []
        return exposition_merge([own, *texts])

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve `GET /metrics` in a background thread; returns the port (useful with port 0)."""
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.scrape()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line each
                return

        self._server = ThreadingHTTPServer((addr, port), Handler)
        threading.Thread(target=self._server.serve_forever, name="tessera-agent-metrics", daemon=True).start()
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
