"""A real agent's CPU sizes and resizes reach the control plane and read back (issue 44: `cpus` and `resizes`
were dropped at ingest). The agent resizes a real CPU runtime in place (a desired-state change), its next
metrics report (Agent.metrics_tick, exactly what it posts) goes through the metrics endpoint, and the
runtime's CPUs and the resize, with who asked and the sizes before and after, read back from
/api/v1/runtime-samples/ and /api/v1/runtime-resizes/; the same report sent again stores nothing more."""
from __future__ import annotations

from datetime import datetime

import pytest

from apps.telemetry.models import RuntimeResize
from tests.factories import ApplicationFactory
from tests.workers.test_resize import CPUS, VERTICAL, agent_factory, cpu_runtime, desired_doc, model_file, write  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]


def test_a_real_agents_cpu_sizes_and_resizes_are_stored_and_read_back(tmp_path, agent_factory, model_file, agent_hosts, clients) -> None:
    desired = write(tmp_path / "desired.json", desired_doc(1, cpu_runtime(model_file, threads=1)))
    agent = agent_factory(desired, vertical_s=0)
    assert agent.step().converged
    write(desired, desired_doc(2, cpu_runtime(model_file, threads=2 if len(CPUS) >= 2 else 1, vertical=VERTICAL)))
    assert agent.step().converged
    report = agent.metrics_tick(1.0)
    [runtime] = report["runtimes"]
    [resize] = runtime["resizes"]
    assert runtime["cpus"] and resize["by"] == "desired"

    application = ApplicationFactory(name="tabular")
    (host, _), (agent_client, _) = agent_hosts
    response = agent_client.post(f"/api/v1/hosts/{host.pk}/metrics/", report, format="json")
    assert response.status_code == 201, response.content

    viewer = clients["viewer"]
    [sample] = viewer.get("/api/v1/runtime-samples/", {"host": host.pk, "runtime_key": "cpu0/0"}).json()["results"]
    assert (sample["cpus"], sample["cores"], sample["batch_cap"]) == (runtime["cpus"], runtime["cores"], runtime["max_batch"])
    [stored] = viewer.get("/api/v1/runtime-resizes/", {"host": host.pk, "runtime_key": "cpu0/0", "by": "desired"}).json()["results"]
    pairs = {"outcome": "outcome", "from_cores": "from_cores", "cores": "cores", "from_batch_cap": "from_max_batch", "batch_cap": "max_batch",
             "cpus": "cpus", "prepared": "prepared"}  # stored field: the agent's key
    assert {field: stored[field] for field in pairs} == {field: resize[key] for field, key in pairs.items()}
    assert stored["resize_ms"] == pytest.approx(resize["resize_ms"]) and stored["application"] == application.pk
    assert datetime.fromisoformat(stored["at"].replace("Z", "+00:00")) == datetime.fromisoformat(resize["at"])
    assert datetime.fromisoformat(stored["reported_at"].replace("Z", "+00:00")) == datetime.fromisoformat(report["at"])
    assert viewer.get("/api/v1/runtime-resizes/", {"host": host.pk, "by": "vertical"}).json()["count"] == 0

    again = agent_client.post(f"/api/v1/hosts/{host.pk}/metrics/", report, format="json")  # sent twice: stored once
    assert again.status_code == 201 and again.json() == {"runtime_samples": 0, "gpu_samples": 0}
    assert RuntimeResize.objects.count() == 1
