"""The names Tessera borrows (issue 21 section 4), written as upstream writes them.

DCGM: the agent exporter's GPU families against NVIDIA/dcgm-exporter (etc/default-counters.csv,
etc/dcp-metrics-included.csv for names, types and HELP texts; internal/pkg/rendermetrics/render_metrics.go
and internal/pkg/collector/gpu_collector.go for labels and units), read through the nvml backend on the fake
pynvml (GPM on Hopper, none before) and through the simulated backend.

Triton: a runtime's `nv_inference_*` against triton-inference-server/core src/metrics.cc (names, types,
HELP texts), src/metric_model_reporter.cc (`model`, `version`, the four failure `reason`s) and
src/infer_stats.cc (durations count successful requests only), on a real runtime process.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import frame_call, runtime_spec, runtime_start
from tests.workers.fake_pynvml import DRIVER_VERSION, FakeGpu, FakeNvml
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.exporter import AgentExporter
from workers.metrics import RouterStats, RuntimeStats
from workers.wire import request_encode

PROFILING = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
             "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")
# dcgm-exporter's HELP texts, as its counters CSVs write them.
DCGM_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_PROF_SM_ACTIVE": "The ratio of cycles an SM has at least 1 warp assigned.",
    "DCGM_FI_PROF_SM_OCCUPANCY": "The ratio of number of warps resident on an SM.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor (HMMA) pipe is active.",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of cycles the device memory interface is active sending or receiving data.",
}
# Triton's, as core/src/metrics.cc registers them: (type, HELP).
TRITON = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (does not include cached requests)"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds (includes cached requests)"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    "nv_inference_compute_infer_duration_us": (
        "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    "nv_inference_pending_request_count": ("gauge", "Instantaneous number of pending requests awaiting execution per-model."),
}


def scrape(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name -> [(labels, value)], the DCGM families of an exposition."""
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text.decode())}


def exported(backend, *, hostname: str = "gpu-host", reads: int = 2) -> tuple[bytes, dict]:
    """The exporter's text after `reads` telemetry readings (GPM computes between two samples)."""
    for _ in range(reads - 1):
        backend.telemetry()
    telemetry = backend.telemetry()
    gpus = backend.gpus()
    exporter = AgentExporter(hostname=hostname)
    exporter.update(telemetry, model_names={g.index: g.model_name for g in gpus},
                    gi_ids={(g.index, str(i.placement)): i.gpu_instance_id for g in gpus for i in g.instances})
    text = exporter.scrape()
    return text, scrape(text)


def only(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    (value,) = [v for lab, v in samples if all(lab.get(k) == want for k, want in labels.items())]
    return value


# --------------------------------------------------------------------------- DCGM


def test_hopper_mig_instances_carry_every_profiling_figure_as_a_ratio() -> None:
    fake = FakeNvml([FakeGpu("H100-SXM5-80GB", mig_enabled=True)])
    with NvmlBackend(nvml=fake) as backend:
        backend.mig_instance_create(0, "3g.40gb@4")
        backend.mig_instance_create(0, "1g.10gb@0")
        fake.instance_activity_set(0, "3g.40gb@4", gr_engine_active_pct=64.0, sm_active_pct=48.0, sm_occupancy_pct=20.0,
                                   tensor_active_pct=30.0, dram_active_pct=12.5, memory_used_mb=9000.0)
        first = backend.telemetry()[0].instances
        assert all(row.gr_engine_active_pct is None and row.sm_active_pct is None for row in first)  # one GPM sample so far
        text, families = exported(backend)
    big = {"GPU_I_PROFILE": "3g.40gb"}
    assert only(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], **big) == pytest.approx(0.64)
    assert only(families["DCGM_FI_PROF_SM_ACTIVE"], **big) == pytest.approx(0.48)
    assert only(families["DCGM_FI_PROF_SM_OCCUPANCY"], **big) == pytest.approx(0.20)
    assert only(families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"], **big) == pytest.approx(0.30)
    assert only(families["DCGM_FI_PROF_DRAM_ACTIVE"], **big) == pytest.approx(0.125)
    assert only(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], GPU_I_PROFILE="1g.10gb") == 0.0  # idle, measured: 0, present
    assert only(families["DCGM_FI_DEV_FB_USED"], **big) == 9000.0  # MiB
    slice_mib = only(families["DCGM_FI_DEV_FB_USED"], **big) + only(families["DCGM_FI_DEV_FB_FREE"], **big)
    assert 39 * 1024 < slice_mib < 41 * 1024  # the slice's own memory, not the GPU's
    # Under MIG the whole GPU has no utilisation and no profiling series (DCGM reads those per instance here).
    assert "DCGM_FI_DEV_GPU_UTIL" not in families
    assert all("GPU_I_ID" in labels for name in PROFILING for labels, _ in families[name])
    for name, help_text in DCGM_HELP.items():
        if name != "DCGM_FI_DEV_GPU_UTIL":
            assert f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode() in text


def test_dcgm_exporters_labels() -> None:
    fake = FakeNvml([FakeGpu("H100-SXM5-80GB", mig_enabled=True), "NVIDIA L4"])
    with NvmlBackend(nvml=fake) as backend:
        instance = backend.mig_instance_create(0, "3g.40gb@4")
        gpu_uuid, l4_uuid = (gpu.uuid for gpu in backend.gpus())
        _, families = exported(backend, hostname="node-7")
    (mig_labels,) = [labels for labels, _ in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]]
    assert mig_labels == {
        "gpu": "0", "UUID": gpu_uuid, "pci_bus_id": "00000000:07:00.0", "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3", "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": str(instance.gpu_instance_id),
        "Hostname": "node-7", "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION, "simulated": "false",
    }  # the GPU's UUID, not the MIG device's: dcgm-exporter labels a GPU instance with its parent's
    whole = [labels for labels, _ in families["DCGM_FI_DEV_GPU_UTIL"]]
    assert whole == [{"gpu": "1", "UUID": l4_uuid, "pci_bus_id": "00000000:08:00.0",
                      "device": "nvidia1", "modelName": "NVIDIA L4", "Hostname": "node-7", "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
                      "simulated": "false"}]  # no GPU_I_* labels at all on a whole GPU (not empty ones)


def test_gpus_before_hopper_have_no_profiling_series_rather_than_zeros() -> None:
    fake = FakeNvml([FakeGpu("A100-SXM4-40GB", mig_enabled=True), "Tesla T4"])
    with NvmlBackend(nvml=fake) as backend:
        backend.mig_instance_create(0, "3g.20gb@4")
        fake.instance_activity_set(0, "3g.20gb@4", gr_engine_active_pct=90.0, memory_used_mb=512.0)
        fake.gpu_activity_set(1, utilization_pct=37.0, power_w=31.5, temperature_c=55)
        _, families = exported(backend, reads=3)
    assert not set(PROFILING) & set(families)  # no GPM on Ampere or Turing: absent, never 0
    assert only(families["DCGM_FI_DEV_FB_USED"], GPU_I_PROFILE="3g.20gb") == 512.0
    assert only(families["DCGM_FI_DEV_GPU_UTIL"], gpu="1") == 37.0  # whole-GPU utilisation where MIG is off
    assert only(families["DCGM_FI_DEV_POWER_USAGE"], gpu="1") == 31.5 and only(families["DCGM_FI_DEV_GPU_TEMP"], gpu="1") == 55.0
    assert [labels["gpu"] for labels, _ in families["DCGM_FI_DEV_GPU_UTIL"]] == ["1"]  # none for the MIG GPU


def test_a_metric_the_gpu_does_not_compute_is_absent_alone() -> None:
    fake = FakeNvml([FakeGpu("H100-SXM5-80GB", gpm_metrics_missing=("tensor_active_pct",))])
    with NvmlBackend(nvml=fake) as backend:
        fake.gpu_activity_set(0, gr_engine_active_pct=70.0, sm_active_pct=55.0, tensor_active_pct=40.0)
        _, families = exported(backend)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in families
    assert only(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], gpu="0") == pytest.approx(0.70)
    assert only(families["DCGM_FI_PROF_SM_ACTIVE"], gpu="0") == pytest.approx(0.55)


def test_whole_gpu_gpm_stops_when_mig_comes_on_and_frees_its_sample() -> None:
    fake = FakeNvml([FakeGpu("H100-SXM5-80GB")])

    def samples_held() -> int:
        return sum(type(obj).__name__ == "_GpmSample" for obj in fake._objects.values())

    with NvmlBackend(nvml=fake) as backend:
        fake.gpu_activity_set(0, gr_engine_active_pct=25.0)
        backend.telemetry()
        assert backend.telemetry()[0].gr_engine_active_pct == pytest.approx(25.0)
        assert samples_held() == 1  # the one kept for the next reading
        backend.mig_mode_set(0, True)
        backend.mig_instance_create(0, "7g.80gb@0")
        gpu = backend.telemetry()[0]
        assert gpu.gr_engine_active_pct is None and gpu.instances[0].gr_engine_active_pct is None
        assert samples_held() == 1  # the whole GPU's sample freed, the instance's first one kept
    assert samples_held() == 0  # close frees the rest


def test_the_simulated_backend_derives_activity_from_its_load() -> None:
    backend = SimulatedBackend("1xA100-SXM4-40GB,1xT4", seed="sim")
    backend.mig_mode_set(0, True)
    backend.mig_instance_create(0, "3g.20gb@4")
    backend.set_load(0, "3g.20gb@4", 0.5)
    backend.set_load(1, None, 0.25)
    _, families = exported(backend, reads=1)
    mig = {"GPU_I_PROFILE": "3g.20gb", "simulated": "true"}
    assert only(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], **mig) == pytest.approx(0.5)
    assert 0.0 < only(families["DCGM_FI_PROF_SM_ACTIVE"], **mig) < 0.5  # SMs busy part of the engine's active time
    assert only(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], gpu="1") == pytest.approx(0.25)
    assert only(families["DCGM_FI_DEV_GPU_UTIL"], gpu="1") == 25.0
    # Nothing to derive occupancy, tensor or DRAM activity, temperature or a driver from: left out.
    assert not {"DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_GPU_TEMP"} & set(families)
    assert all(labels["simulated"] == "true" and "DCGM_FI_DRIVER_VERSION" not in labels
               for samples in families.values() for labels, _ in samples)


# --------------------------------------------------------------------------- Triton


def triton_families(text: bytes) -> dict:
    # The parser names a counter family without `_total`; Triton's names have none to take off.
    return {f.name: f for f in text_string_to_metric_families(text.decode()) if f.name.startswith("nv_")}


def test_failure_reasons_and_durations_follow_triton() -> None:
    stats = RuntimeStats()
    instance = stats.instance(key="gpu0/3g.20gb@4", application="classify", variant="resnet50", instance="h/gpu0/3g.20gb@4")
    instance.served(10.0, queue_ms=4.0, compute_ms=5.0)
    instance.served(20.0, queue_ms=6.0, compute_ms=5.0, late=True)
    instance.dropped(500.0, 500.0)
    instance.failed(3.0, reason="BACKEND")
    instance.failed()
    with pytest.raises(ValueError, match="failure reason 'TIMEOUT'"):
        instance.failed(reason="TIMEOUT")
    families = triton_families(stats.exposition())
    failures = {s.labels["reason"]: s.value for s in families["nv_inference_request_failure"].samples}
    assert failures == {"REJECTED": 1.0, "CANCELED": 0.0, "BACKEND": 1.0, "OTHER": 1.0}
    labels = {"model": "classify", "version": "resnet50", "instance": "h/gpu0/3g.20gb@4", "simulated": "false"}

    def value(name: str) -> float:
        (sample,) = families[name].samples
        assert sample.labels == labels
        return sample.value

    assert value("nv_inference_request_success") == 2
    # Successful requests only, so duration / success is the mean latency of the answers.
    assert value("nv_inference_request_duration_us") == pytest.approx(30_000.0)
    assert value("nv_inference_queue_duration_us") == pytest.approx(10_000.0)
    assert value("nv_inference_compute_infer_duration_us") == pytest.approx(10_000.0)
    instance.queue_length_set(7)
    assert triton_families(stats.exposition())["nv_inference_pending_request_count"].samples[0].value == 7


@pytest.mark.timeout(240)
def test_a_runtime_process_speaks_tritons_metrics(tmp_path) -> None:
    data = onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=1)
    path = tmp_path / "mlp.onnx"
    path.write_bytes(data)
    runtime = runtime_start(runtime_spec(artifact_path=str(path), sha256=hashlib.sha256(data).hexdigest()), tmp_path / "rt")
    try:
        body, _ = request_encode({"x": np.zeros((1, 4), np.float32)})
        header = {"op": "infer", "content_type": "application/json", "header_length": None, "instance": "test-host/cpu0/0"}
        for i in range(3):
            assert frame_call(runtime.endpoint, {**header, "id": i, "deadline_ms": 30_000.0}, body)[0]["status"] == 200
        assert frame_call(runtime.endpoint, {**header, "id": 3, "deadline_ms": 0.01}, body)[0]["status"] == 504
        reply, text = frame_call(runtime.endpoint, {"op": "metrics"})
    finally:
        assert runtime.stop() == 0, runtime.log()
    assert reply["status"] == 200
    families = triton_families(text)
    assert {name: (f.type, f.documentation) for name, f in families.items()} == TRITON
    labels = {"model": "tabular-cpu", "version": "mlp-wide", "instance": "test-host/cpu0/0", "simulated": "false"}
    success = families["nv_inference_request_success"].samples
    assert [(s.labels, s.value) for s in success] == [(labels, 3.0)]
    rejected = [s.value for s in families["nv_inference_request_failure"].samples if s.labels["reason"] == "REJECTED"]
    assert rejected == [1.0]  # the query past its deadline: a timeout in the scheduler, in Triton's words
    (duration,) = families["nv_inference_request_duration_us"].samples
    assert 0 < duration.value / 3 < 30_000_000  # microseconds per answered query
    assert families["nv_inference_pending_request_count"].samples[0].value == 0


def test_the_routers_triton_durations_count_answers_only() -> None:
    stats = RouterStats("r1")
    application = stats.application("classify")
    application.served(10.0, False, variant="resnet50", instance="h/gpu0/0")
    application.served(30.0, True, variant="resnet50", instance="h/gpu0/0")
    application.dropped(900.0, variant="resnet50", instance="h/gpu0/0")
    families = triton_families(stats.exposition())
    assert [s.value for s in families["nv_inference_request_success"].samples] == [2.0]
    assert [s.value for s in families["nv_inference_request_failure"].samples] == [1.0]
    # Triton's duration / success: the answers' mean latency, 20 ms, not pulled up by the drop.
    assert [s.value for s in families["nv_inference_request_duration_us"].samples] == [pytest.approx(40_000.0)]
