"""Metrics (the agents' heartbeat), router reports, the sample lists and their retention."""
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.telemetry.models import ApplicationSample, GpuSample, RuntimeSample
from apps.telemetry.services import host_metrics_ingest, telemetry_prune
from tests.factories import ApplicationFactory

pytestmark = pytest.mark.django_db


def metrics(at="2026-11-21T10:00:01Z", runtimes=None, **extra):
    return {
        "at": at, "interval_s": 1.0,
        "gpus": [{"index": 0, "uuid": "GPU-1", "utilization_pct": 71.0, "memory_used_mb": 20480, "power_w": 250.0, "simulated": True,
                  "instances": [{"placement": "3g.20gb@4", "gr_engine_active_pct": 64.0, "memory_used_mb": 9000}]}],
        "runtimes": runtimes if runtimes is not None else [
            {"key": "gpu0/3g.20gb@4", "application": "classify", "variant": "resnet50", "arrivals": 120, "served": 118,
             "late": 1, "dropped": 1, "queue_length": 3, "batches": 20, "batch_size_mean": 5.9,
             "latency_p50_ms": 21.0, "latency_p99_ms": 48.0},
            {"key": "cpu0/0", "application": "not-registered", "variant": "mlp", "arrivals": 0, "served": 0,
             "latency_p50_ms": None, "latency_p99_ms": None},
        ],
        **extra,
    }


def test_metrics_are_stored_and_mark_the_host_seen(clients, agent_hosts):
    (host, _), (agent, _) = agent_hosts
    app = ApplicationFactory(name="classify")
    assert host.last_seen is None
    response = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(), format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {"runtime_samples": 2, "gpu_samples": 2}
    host.refresh_from_db()
    assert host.last_seen is not None
    rows = {s.runtime_key: s for s in RuntimeSample.objects.all()}
    known, unknown = rows["gpu0/3g.20gb@4"], rows["cpu0/0"]
    assert known.application == app and known.served == 118 and known.latency_p99_ms == 48.0 and known.interval_s == 1.0
    assert unknown.application is None and unknown.application_name == "not-registered" and unknown.latency_p50_ms is None
    gpus = {s.placement: s for s in GpuSample.objects.all()}
    assert gpus[""].utilization_pct == 71.0 and gpus[""].power_w == 250.0 and gpus[""].simulated
    assert gpus["3g.20gb@4"].gr_engine_active_pct == 64.0 and gpus["3g.20gb@4"].power_w is None and gpus["3g.20gb@4"].simulated


def test_metrics_only_from_the_hosts_own_agent(clients, agent_hosts):
    (host_a, host_b), (agent_a, _) = agent_hosts
    assert agent_a.post(f"/api/v1/hosts/{host_b.pk}/metrics/", metrics(), format="json").status_code == 404
    assert clients["admin"].post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(), format="json").status_code == 403
    assert clients["anonymous"].post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(), format="json").status_code == 401
    assert not RuntimeSample.objects.exists()


@pytest.mark.parametrize(
    "body,field",
    [
        (metrics(runtimes=[{"key": "gpu1", "arrivals": -1}]), "runtimes"),
        (metrics(runtimes=[{"key": "gpu1", "latency_p99_ms": "NaN"}]), "runtimes"),
        (metrics(at="sometime"), "at"),
        (metrics(interval_s=0), "interval_s"),
        ({**metrics(), "gpus": [{"index": 0, "utilization_pct": 140}]}, "gpus"),
    ],
)
def test_bad_metrics_store_nothing(agent_hosts, body, field):
    (host, _), (agent, _) = agent_hosts
    response = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert not RuntimeSample.objects.exists() and not GpuSample.objects.exists()
    host.refresh_from_db()
    assert host.last_seen is None


def test_metrics_ingest_does_not_query_per_row(agent_hosts, django_assert_max_num_queries):
    (host, _), (agent, _) = agent_hosts
    ApplicationFactory(name="classify")
    many = [{"key": f"cpu0/{i}", "application": "classify", "variant": "mlp", "arrivals": i, "served": i} for i in range(200)]
    # Authentication, the host, the application names, the inserts (SQLite splits 200 rows into 4), the
    # heartbeat, and the savepoint around them.
    with django_assert_max_num_queries(12):
        response = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(runtimes=many), format="json")
    assert response.status_code == 201 and RuntimeSample.objects.filter(application__name="classify").count() == 200


def router_report(router="router-1", **extra):
    return {"router": router, "at": "2026-11-21T10:00:01Z", "interval_s": 1.0,
            "applications": [{"application": "tabular", "routing_version": 2, "arrivals": 50, "served": 49, "late": 0,
                              "dropped": 1, "no_route": 0, "latency_p50_ms": 1.2, "latency_p99_ms": 3.4},
                             {"application": "ghost", "arrivals": 3, "no_route": 3}],
            **extra}


def test_router_reports_from_any_agent(clients, agent_hosts):
    (host_a, host_b), (agent_a, agent_b) = agent_hosts
    app = ApplicationFactory(name="tabular")
    assert agent_a.post("/api/v1/router-reports/", router_report(), format="json").status_code == 201
    response = agent_b.post("/api/v1/router-reports/", router_report("router-2"), format="json")
    assert response.status_code == 201 and response.json() == {"application_samples": 2}
    assert clients["operator"].post("/api/v1/router-reports/", router_report(), format="json").status_code == 403
    bad = agent_a.post("/api/v1/router-reports/", router_report(applications=[{"application": "x", "served": -2}]), format="json")
    assert bad.status_code == 400
    assert ApplicationSample.objects.count() == 4
    sample = ApplicationSample.objects.get(router="router-2", application_name="tabular")
    assert sample.application == app and sample.host == host_b and sample.routing_version == 2 and sample.latency_p99_ms == 3.4
    ghost = ApplicationSample.objects.get(router="router-2", application_name="ghost")
    assert ghost.application is None and ghost.no_route == 3 and ghost.routing_version is None


def test_sample_lists_and_filters(clients, agent_hosts):
    (host_a, host_b), (agent_a, agent_b) = agent_hosts
    app = ApplicationFactory(name="classify")
    agent_a.post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(at="2026-11-21T10:00:01Z"), format="json")
    agent_a.post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(at="2026-11-21T10:00:02Z"), format="json")
    agent_b.post(f"/api/v1/hosts/{host_b.pk}/metrics/", metrics(at="2026-11-21T10:00:02Z"), format="json")
    agent_a.post("/api/v1/router-reports/", router_report(), format="json")
    viewer = clients["viewer"]
    assert viewer.get("/api/v1/runtime-samples/").json()["count"] == 6
    assert viewer.get(f"/api/v1/runtime-samples/?host={host_a.pk}").json()["count"] == 4
    assert viewer.get(f"/api/v1/runtime-samples/?application={app.pk}").json()["count"] == 3
    since = viewer.get(f"/api/v1/runtime-samples/?host={host_a.pk}&since=2026-11-21T10:00:02Z").json()
    assert since["count"] == 2 and {s["at"] for s in since["results"]} == {"2026-11-21T10:00:02Z"}
    newest_first = viewer.get("/api/v1/gpu-samples/").json()["results"]
    assert newest_first[0]["at"] >= newest_first[-1]["at"]
    assert viewer.get(f"/api/v1/gpu-samples/?host={host_b.pk}&placement=3g.20gb@4").json()["count"] == 1
    assert viewer.get("/api/v1/application-samples/?application_name=ghost").json()["count"] == 1
    assert viewer.get("/api/v1/application-samples/?router=router-1&since=2027-01-01T00:00:00Z").json()["count"] == 0
    for path in ("/api/v1/runtime-samples/", "/api/v1/gpu-samples/", "/api/v1/application-samples/"):
        assert agent_a.get(path).status_code == 403
        assert clients["anonymous"].get(path).status_code == 401
        assert clients["operator"].post(path, {}, format="json").status_code == 405


def test_prune_deletes_only_old_samples(agent_hosts):
    (host, _), _ = agent_hosts
    now = timezone.now()
    for at in (now - timedelta(days=10), now - timedelta(days=1)):
        host_metrics_ingest(host=host, report={"at": at, "runtimes": [{"key": "cpu0/0"}], "gpus": [{"index": 0}]})
        ApplicationSample.objects.create(router="r", application_name="a", at=at, interval_s=1.0)
    deleted = telemetry_prune(older_than=timedelta(days=7))
    assert deleted == {"runtimesample": 1, "gpusample": 1, "applicationsample": 1}
    assert RuntimeSample.objects.count() == GpuSample.objects.count() == ApplicationSample.objects.count() == 1


def test_retention_is_scheduled_on_beat(db) -> None:
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.get(name="telemetry.prune")
    assert task.task == "telemetry.prune" and task.enabled and task.interval.every == 3600
