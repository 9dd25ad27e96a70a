"""The agent's Prometheus `/metrics` (names in docs/metrics.md):

- GPU telemetry as NVIDIA's dcgm-exporter writes it, set by the agent every second: the same metric names,
  HELP texts (etc/default-counters.csv, etc/dcp-metrics-included.csv), types (gauges), units (MiB, W, C,
  %, profiling figures as ratios 0..1) and labels (internal/pkg/rendermetrics/render_metrics.go:
  `gpu`, `UUID` (the GPU's, on a MIG instance's series too), `pci_bus_id`, `device` ("nvidia<gpu>"),
  `modelName`, `GPU_I_PROFILE` and `GPU_I_ID` on MIG instances' series only, `Hostname` (as released up
  to 4.5.3-4.8.2; the exporter's main branch has since renamed it `hostname`), and the driver's version
  as `DCGM_FI_DRIVER_VERSION`, a "label" field of the default counters), plus Tessera's `simulated`.
  A figure the backend cannot read is absent, never 0: plain utilisation under MIG (NVML does not report
  it there), profiling figures without GPM (before Hopper), the first second of GPM (it needs two samples).
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

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from workers.metrics import exposition_merge

__all__ = ["DCGM_FIELDS", "AgentExporter"]

log = logging.getLogger("tessera.agent")


def _whole(value: float) -> float:
    return float(int(value))  # DCGM's integer fields (MiB, %, C) carry no fraction


def _ratio(percent: float) -> float:
    return percent / 100.0  # DCGM's profiling fields are ratios


def _same(value: float) -> float:
    return float(value)


# Telemetry attribute -> (DCGM field, dcgm-exporter's HELP text, conversion, read on MIG instances too).
DCGM_FIELDS: dict[str, tuple[str, str, Callable[[float], float], bool]] = {
    "utilization_pct": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _whole, False),
    "memory_used_mb": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _whole, True),
    "memory_free_mb": ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _whole, True),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _same, False),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _whole, False),
    "gr_engine_active_pct": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", _ratio, True),
    "sm_active_pct": ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", _ratio, True),
    "sm_occupancy_pct": ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", _ratio, True),
    "tensor_active_pct": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", _ratio, True),
    "dram_active_pct": ("DCGM_FI_PROF_DRAM_ACTIVE",
                        "Ratio of cycles the device memory interface is active sending or receiving data.", _ratio, True),
}


class _GpuCollector:
    """The GPU families as of the last `AgentExporter.update` (built there, handed out at each scrape)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:
        return self.families


class AgentExporter:
    def __init__(self, *, hostname: str, runtime_metrics: Callable[[], list[bytes]] | None = None) -> None:
        self.hostname = hostname
        self.runtime_metrics = runtime_metrics or (lambda: [])  # set by the agent: one text per runtime
        self.registry = CollectorRegistry(auto_describe=False)
        self._gpus = _GpuCollector()
        self.registry.register(self._gpus)
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
        instance id; `model_names`: GPU index -> NVML name. The families are rebuilt from this reading
        alone, so a destroyed MIG instance does not linger at its last value."""
        gi_ids = gi_ids or {}
        model_names = model_names or {}
        families = {attribute: GaugeMetricFamily(name, help_text) for attribute, (name, help_text, _, _) in DCGM_FIELDS.items()}

        def add(attribute: str, labels: dict[str, str], value: float | None) -> None:
            if value is None:
                return  # not read: absent, as in DCGM
            name, _, convert, _ = DCGM_FIELDS[attribute]
            families[attribute].add_sample(name, labels, convert(value))

        for gpu in telemetry:
            labels = {"gpu": str(gpu.index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "device": f"nvidia{gpu.index}",
                      "modelName": model_names.get(gpu.index, "")}
            tail = {"Hostname": self.hostname, "simulated": "true" if gpu.simulated else "false"}
            if gpu.driver_version:
                tail["DCGM_FI_DRIVER_VERSION"] = gpu.driver_version
            for attribute in DCGM_FIELDS:
                add(attribute, {**labels, **tail}, getattr(gpu, attribute))
            for instance in gpu.instances:
                gi_id = gi_ids.get((gpu.index, str(instance.placement)))
                mig = {**labels, "GPU_I_PROFILE": instance.placement.profile, "GPU_I_ID": "" if gi_id is None else str(gi_id), **tail}
                for attribute, (_, _, _, per_instance) in DCGM_FIELDS.items():
                    if per_instance:
                        add(attribute, mig, getattr(instance, attribute))
        with self._lock:
            self._gpus.families = [family for family in families.values() if family.samples]

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
