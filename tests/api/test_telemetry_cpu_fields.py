"""A CPU runtime's `cpus` and `resizes` in agents' metrics reports (issue 44): refused whole when malformed (400
naming the field, nothing stored, the host not marked seen), listed and filtered over the API (when and
why a runtime was resized), and pruned with the samples by the telemetry retention."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.telemetry.models import GpuSample, RuntimeResize, RuntimeSample
from apps.telemetry.services import host_metrics_ingest, telemetry_prune

pytestmark = pytest.mark.django_db


def _resize(**fields) -> dict:
    """A resize record as workers/agent/vertical.py writes it."""
    return {"at": timezone.now().isoformat(), "by": "vertical", "outcome": "ok", "from_cores": 1, "from_max_batch": 4, "cores": 2,
            "max_batch": 8, "cpus": [0, 1], "resize_ms": 2.5, "prepared": True, **fields}


def _report(*, cpus=(0, 1), resizes=None, at=None) -> dict:
    runtime = {"key": "cpu0/0", "application": "tabular", "variant": "mlp", "arrivals": 3, "served": 3, "cores": 2, "max_batch": 8,
               "cpus": list(cpus) if isinstance(cpus, tuple) else cpus, "resizes": [_resize()] if resizes is None else resizes}
    return {"at": (at or timezone.now()).isoformat(), "interval_s": 1.0, "gpus": [{"index": 0}], "runtimes": [runtime]}


@pytest.mark.parametrize("runtime_fields, named", [
    ({"cpus": "0-3"}, "cpus"),
    ({"cpus": [0, -1]}, "cpus"),
    ({"cpus": [0, "one"]}, "cpus"),
    ({"cpus": list(range(4097))}, "cpus"),
    ({"resizes": "one"}, "resizes"),
    ({"resizes": [_resize(at="yesterday")]}, "at"),
    ({"resizes": [_resize(cores=0)]}, "cores"),
    ({"resizes": [{k: v for k, v in _resize().items() if k != "by"}]}, "by"),
    ({"resizes": [_resize(cpus=[1, 1.5])]}, "cpus"),
    ({"resizes": [_resize()] * 257}, "resizes"),
])
def test_a_malformed_cpu_field_is_refused_naming_it_and_nothing_is_stored(agent_hosts, runtime_fields, named) -> None:
    (host, _), (agent, _) = agent_hosts
    report = _report()
    report["runtimes"][0].update(runtime_fields)
    response = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", report, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and "runtimes" in error["fields"] and f'"{named}"' in json.dumps(error["fields"])
    assert not RuntimeSample.objects.exists() and not RuntimeResize.objects.exists() and not GpuSample.objects.exists()
    host.refresh_from_db()
    assert host.last_seen is None


def test_resizes_are_listed_by_when_who_and_outcome(agent_hosts, clients) -> None:
    (host, other), (agent, other_agent) = agent_hosts
    now = timezone.now()
    failed = _resize(at=(now - timedelta(minutes=5)).isoformat(), by="desired", outcome="failed", cpus=None, resize_ms=None, prepared=None)
    assert agent.post(f"/api/v1/hosts/{host.pk}/metrics/", _report(resizes=[failed, _resize()], at=now), format="json").status_code == 201
    assert other_agent.post(f"/api/v1/hosts/{other.pk}/metrics/", _report(cpus=None, resizes=[]), format="json").status_code == 201
    viewer = clients["viewer"]
    listed = viewer.get("/api/v1/runtime-resizes/", {"host": host.pk}).json()
    assert listed["count"] == 2 and [r["outcome"] for r in listed["results"]] == ["ok", "failed"]  # newest first
    [only] = viewer.get("/api/v1/runtime-resizes/", {"outcome": "failed", "by": "desired"}).json()["results"]
    assert only["cpus"] is None and only["resize_ms"] is None and only["prepared"] is None and only["reason"] == ""
    recent = viewer.get("/api/v1/runtime-resizes/", {"since": (now - timedelta(minutes=1)).isoformat()}).json()
    assert [r["by"] for r in recent["results"]] == ["vertical"]
    samples = {s["host"]: s["cpus"] for s in viewer.get("/api/v1/runtime-samples/").json()["results"]}
    assert samples == {host.pk: [0, 1], other.pk: None}
    assert clients["anonymous"].get("/api/v1/runtime-resizes/").status_code == 401
    assert agent.get("/api/v1/runtime-resizes/").status_code == agent.get("/api/v1/runtime-samples/").status_code == 403
    assert viewer.get("/api/v1/").json()["runtimeresize"].endswith("/api/v1/runtime-resizes/")


def test_retention_prunes_resizes_with_the_samples(agent_hosts) -> None:
    (host, _), _ = agent_hosts
    now = timezone.now()
    for age in (timedelta(days=10), timedelta(days=1)):
        at = now - age
        report = {"at": at, "interval_s": 1.0, "runtimes": [{"key": "cpu0/0", "cores": 2, "cpus": [0, 1],
                                                           "resizes": [{"at": at, "by": "vertical", "outcome": "ok", "cores": 2}]}]}
        host_metrics_ingest(host=host, report=report)
    assert RuntimeResize.objects.count() == 2
    deleted = telemetry_prune(older_than=timedelta(days=7))
    assert deleted["runtimeresize"] == 1 and deleted["runtimesample"] == 1
    assert list(RuntimeResize.objects.values_list("cpus", flat=True)) == [None] and RuntimeSample.objects.get().cpus == [0, 1]
