"""Pieces of the agent on their own: the Prometheus exporter (DCGM and Triton names, counters that add up
per-interval reports), and the control-plane client (outage vs refusal, verified artifact downloads)."""
from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from engine.geometry.layout import Placement
from workers.agent.backends import GpuTelemetry, MigInstanceTelemetry
from workers.agent.exporter import AgentExporter
from workers.client import ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable
from workers.metrics import RuntimeStats


def runtime_text(key: str, served: int) -> bytes:
    """What a runtime's `metrics` frame answers (its own registry, as in workers/runtime/server.py)."""
    stats = RuntimeStats()
    instance = stats.instance(key=key, application="classify", variant="resnet50", instance=f"h/{key}", simulated=True)
    for _ in range(served):
        instance.arrival()
        instance.served(12.0, queue_ms=2.0, compute_ms=10.0)
    instance.batch(served, 10.0)
    return stats.exposition()


def test_exporter_uses_dcgm_names_and_merges_the_runtimes_metrics() -> None:
    exporter = AgentExporter(hostname="gpu-host-1")
    telemetry = [
        GpuTelemetry(index=0, uuid="GPU-a", utilization_pct=None, memory_used_mb=9000.0, power_w=210.0, simulated=True,
                     instances=(MigInstanceTelemetry(Placement("3g.20gb", 4), "MIG-x", 64.0, 8000.0),)),
        GpuTelemetry(index=1, uuid="GPU-b", utilization_pct=37.0, memory_used_mb=100.0, power_w=None, simulated=False, instances=(),
                     pci_bus_id="00000000:08:00.0", driver_version="550.54.15"),
    ]
    exporter.update(telemetry, gi_ids={(0, "3g.20gb@4"): 2}, model_names={0: "NVIDIA A100-SXM4-40GB", 1: "NVIDIA L4"})
    exporter.runtime_metrics = lambda: [runtime_text("gpu0/3g.20gb@4", 3), runtime_text("gpu0/4g.20gb@0", 5)]
    port = exporter.serve(0)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        exporter.close()
    # dcgm-exporter's labels: the GPU's UUID on a MIG instance's series too, GPU_I_* only there, device from the
    # index, pci_bus_id empty where there is no bus (simulated GPUs), plus Tessera's `simulated`.
    gpu_a = 'Hostname="gpu-host-1",UUID="GPU-a",device="nvidia0",gpu="0",modelName="NVIDIA A100-SXM4-40GB",pci_bus_id="",simulated="true"'
    mig = ('GPU_I_ID="2",GPU_I_PROFILE="3g.20gb",Hostname="gpu-host-1",UUID="GPU-a",device="nvidia0",gpu="0",'
           'modelName="NVIDIA A100-SXM4-40GB",pci_bus_id="",simulated="true"')
    assert "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge" in text
    assert f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig}}} 0.64" in text
    assert f"DCGM_FI_DEV_FB_USED{{{mig}}} 8000.0" in text and f"DCGM_FI_DEV_FB_USED{{{gpu_a}}} 9000.0" in text
    assert f"DCGM_FI_DEV_POWER_USAGE{{{gpu_a}}} 210.0" in text
    assert "DCGM_FI_DEV_GPU_UTIL{" + gpu_a not in text  # not reported under MIG, rather than 0
    assert "DCGM_FI_PROF_SM_ACTIVE" not in text  # no backend read it: absent, not 0
    assert ('DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION="550.54.15",Hostname="gpu-host-1",UUID="GPU-b",device="nvidia1",gpu="1",'
            'modelName="NVIDIA L4",pci_bus_id="00000000:08:00.0",simulated="false"} 37.0') in text
    # Both runtimes' Triton counters, under one family each (Triton's names have no _total).
    success = [line for line in text.splitlines() if line.startswith("nv_inference_request_success{")]
    assert len(success) == 2 and text.count("# TYPE nv_inference_request_success counter") == 1
    assert any('instance="h/gpu0/4g.20gb@0"' in line and line.endswith(" 5.0") for line in success)
    # A GPU instance that is gone is dropped from the exposition.
    exporter.update(telemetry[1:])
    assert "GPU_I_PROFILE" not in exporter.scrape().decode()


def client_with(handler) -> ControlPlaneClient:
    return ControlPlaneClient("http://cp.invalid", "tsa_secret", transport=httpx.MockTransport(handler))


def test_client_tells_an_outage_from_a_refusal() -> None:
    def down(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ControlPlaneUnavailable):
        client_with(down).routing_tables()
    with pytest.raises(ControlPlaneUnavailable):
        client_with(lambda r: httpx.Response(503)).routing_tables()
    # Held or throttled (429 with Retry-After): "later", like an outage, so the agent keeps its report.
    with pytest.raises(ControlPlaneUnavailable, match="retry after 8 s"):
        client_with(lambda r: httpx.Response(429, headers={"Retry-After": "8"}, json={"error": {"status": 429}})).metrics({})
    refused = client_with(lambda r: httpx.Response(400, json={"error": {"status": 400, "code": "invalid", "message": "bad version", "fields": {"version": ["bad"]}}}))
    with pytest.raises(ControlPlaneRejected, match="bad version") as info:
        refused.router_report({})
    assert info.value.status == 400 and info.value.fields == {"version": ["bad"]}


def test_client_follows_pages_and_finds_its_host() -> None:
    def handler(request):
        if request.url.path == "/api/v1/hosts/":
            assert request.headers["Authorization"] == "Token tsa_secret"
            return httpx.Response(200, json={"results": [{"id": 7, "name": "h"}], "next": None})
        if request.url.params.get("offset") == "1":
            return httpx.Response(200, json={"results": [{"id": 2}], "next": None})
        return httpx.Response(200, json={"results": [{"id": 1}], "next": "http://cp.invalid/api/v1/routing-tables/?active=true&offset=1"})

    client = client_with(handler)
    assert client.host_id == 7
    assert [t["id"] for t in client.routing_tables()] == [1, 2]


def test_artifact_download_is_verified_and_cached(tmp_path) -> None:
    data = b"onnx bytes"
    good = {"sha256": hashlib.sha256(data).hexdigest(), "download": "/api/v1/artifacts/1/download/"}
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(200, content=data)

    client = client_with(handler)
    path = client.artifact_fetch(good, tmp_path)
    assert path.read_bytes() == data and path.name == f"{good['sha256']}.onnx"
    assert client.artifact_fetch(good, tmp_path) == path and len(calls) == 1  # cached, not fetched again
    bad = dict(good, sha256="0" * 64)
    with pytest.raises(ControlPlaneRejected, match="does not match its sha256"):
        client.artifact_fetch(bad, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing half-written or wrong kept


def test_agent_restarted_while_the_control_plane_is_away_follows_its_last_desired_state(tmp_path) -> None:
    from workers.agent.agent import Agent
    from workers.agent.backends.simulated import SimulatedBackend
    from workers.agent.supervisor import RuntimeSupervisor

    desired = {
        "host": "h", "version": 4, "gpus": [{"index": 0, "mig_enabled": True, "layout": ["7g.40gb@0"]}],
        "runtimes": [{"key": "gpu0/7g.40gb@0", "application": "classify", "variant": {"id": 1, "name": "resnet50", "artifact": None},
                      "max_batch": 4, "batching": {"policy": "proteus", "slo_ms": 50.0}, "profile": [{"batch": 1, "latency_ms": 2.0}]}],
    }
    (tmp_path / "desired.json").write_text(json.dumps(desired))  # what the previous run of the agent kept

    def down(request):
        raise httpx.ConnectError("connection refused", request=request)

    agent = Agent(backend=SimulatedBackend(gpus="1xA100-SXM4-40GB"), state_dir=tmp_path, client=client_with(down))
    try:
        result = agent.step()
        assert result is not None and result.converged and agent.converged_version == 4
        assert sorted(agent.supervisor.observe()) == ["gpu0/7g.40gb@0"]
        assert agent.report() is False  # nothing reached the control plane; the agent carries on
    finally:
        RuntimeSupervisor(tmp_path).stop_all()
