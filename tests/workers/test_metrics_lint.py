"""Every exposition of the data plane through Debian's promtool (issue 21 section 4): the runtime's, the
router's and the agent exporter's, each with series in it. The names borrowed from upstream stay exactly as
Triton (`nv_inference_*`) and DCGM exporter (`DCGM_FI_*`) spell them, which promtool's lint flags upstream
too; every other name, Tessera's own, must draw nothing."""
from __future__ import annotations

import shutil
import subprocess

from tests.conftest import service_unavailable
from tests.workers.fake_pynvml import FakeGpu, FakeNvml
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.exporter import DCGM_FIELDS, AgentExporter
from workers.metrics import RouterStats, RuntimeStats

BORROWED = ("nv_inference_", "DCGM_FI_")


def _lint(text: bytes) -> list[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        service_unavailable("no promtool (apt-get install prometheus)")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    lines = [line for line in (result.stdout + result.stderr).decode().splitlines() if line.strip()]
    assert all(" " in line for line in lines), lines  # "<name> <complaint>": nothing else (a parse error would be)
    return lines


def _own(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(BORROWED)]


def test_the_runtimes_exposition_lints_clean_but_for_tritons_names() -> None:
    stats = RuntimeStats()
    instance = stats.instance(key="cpu0/0", application="tabular", variant="mlp", instance="h/cpu0/0")
    instance.arrival(3)
    instance.served(5.0, 1.0, 3.0)
    instance.served(9.0, 2.0, 4.0, late=True)
    instance.dropped(1.0)
    instance.batch(2, 3.0)
    lines = _lint(stats.exposition())
    assert _own(lines) == [] and any(line.startswith("nv_inference_") for line in lines)


def test_the_routers_exposition_lints_clean() -> None:
    stats = RouterStats("r1")
    application = stats.application("tabular")
    application.arrival()
    application.served(4.0, False, variant="mlp", instance="h/cpu0/0")
    application.dropped(9.0, variant="mlp", instance="h/cpu0/0")
    stats.path("chain", "chain")
    stats.versions_set({"tabular": 3})
    assert _own(_lint(stats.exposition())) == []


def test_the_agent_exporters_exposition_lints_clean_but_for_dcgms_names() -> None:
    runtime = RuntimeStats()
    runtime.instance(key="gpu0", application="classify", variant="resnet50").served(3.0)
    exporter = AgentExporter(hostname="h", runtime_metrics=lambda: [runtime.exposition()])
    # Every DCGM family: a Hopper GPU with MIG (per-instance GPM) and one without (whole-GPU GPM), read twice.
    fake = FakeNvml([FakeGpu("H100-SXM5-80GB", mig_enabled=True), "H100-SXM5-80GB"])
    with NvmlBackend(nvml=fake) as backend:
        backend.mig_instance_create(0, "3g.40gb@4")
        backend.telemetry()
        exporter.update(backend.telemetry(), gi_ids={(0, "3g.40gb@4"): 1})
    text = exporter.scrape()
    assert all(f"# TYPE {name} gauge".encode() in text for name, *_ in DCGM_FIELDS.values())
    assert _own(_lint(text)) == []
