"""Metrics (the agents' heartbeat), router reports and who may post them (router credentials), reports
sent late with their original times, the sample lists and their retention."""
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.models import ObjectChange
from apps.inventory.models import Host, RouterCredential
from apps.telemetry.models import ApplicationSample, GpuSample, RuntimeSample
from apps.telemetry.services import host_metrics_ingest, telemetry_prune
from tests.conftest import _token_client
from tests.factories import ApplicationFactory

pytestmark = pytest.mark.django_db

# Report times an hour ago: recent enough to be inside the retention whatever day the tests run.
T0 = (timezone.now() - timedelta(hours=1)).replace(microsecond=0)


def iso(seconds: float = 0.0) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def metrics(at=None, runtimes=None, **extra):
    return {
        "at": at or iso(1), "interval_s": 1.0,
        "gpus": [{"index": 0, "uuid": "GPU-1", "utilization_pct": 71.0, "memory_used_mb": 20480, "power_w": 250.0, "simulated": True,
                  "instances": [{"placement": "3g.20gb@4", "gr_engine_active_pct": 64.0, "memory_used_mb": 9000}]}],
        "runtimes": runtimes if runtimes is not None else [
            {"key": "gpu0/3g.20gb@4", "application": "classify", "variant": "resnet50", "arrivals": 120, "served": 118,
             "late": 1, "dropped": 1, "queue_length": 3, "batches": 20, "batch_size_mean": 5.9,
             "latency_p50_ms": 21.0, "latency_p99_ms": 48.0},
            {"key": "cpu0/0", "application": "not-registered", "variant": "mlp", "arrivals": 0, "served": 0,
             "latency_p50_ms": None, "latency_p99_ms": None, "cores": 3, "max_batch": 8},
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
    # A CPU runtime says its cores and batch cap now (vertical scaling changes them in place); a GPU one does not.
    assert (unknown.cores, unknown.batch_cap) == (3, 8) and (known.cores, known.batch_cap) == (None, None)
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
        (metrics(runtimes=[{"key": "cpu0/0", "cores": 0}]), "runtimes"),
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
    # Authentication (and whether the client's address is held for refused secrets), the host, the application
    # names, the inserts (SQLite splits 200 rows into 4), the heartbeat, and the savepoint around them.
    with django_assert_max_num_queries(13):
        response = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(runtimes=many), format="json")
    assert response.status_code == 201 and RuntimeSample.objects.filter(application__name="classify").count() == 200


def router_report(router="router-1", **extra):
    return {"router": router, "at": iso(1), "interval_s": 1.0,
            "applications": [{"application": "tabular", "routing_version": 2, "arrivals": 50, "served": 49, "late": 0,
                              "dropped": 1, "no_route": 0, "latency_p50_ms": 1.2, "latency_p99_ms": 3.4},
                             {"application": "ghost", "arrivals": 3, "no_route": 3}],
            **extra}


@pytest.fixture
def routers(clients):
    """Router credentials for router-1 and router-2, issued by an admin through the API, and a client each."""
    out = {}
    for name in ("router-1", "router-2"):
        response = clients["admin"].post("/api/v1/router-credentials/", {"name": name, "description": "rack 4"}, format="json")
        assert response.status_code == 201, response.content
        out[name] = _token_client(response.json()["token"])
    return out


def test_router_reports_are_stored_under_the_credentials_router(clients, routers):
    app = ApplicationFactory(name="tabular")
    assert routers["router-1"].post("/api/v1/router-reports/", router_report(), format="json").status_code == 201
    response = routers["router-2"].post("/api/v1/router-reports/", router_report("router-2"), format="json")
    assert response.status_code == 201 and response.json() == {"application_samples": 2, "pipeline_path_samples": 0}
    bad = routers["router-1"].post("/api/v1/router-reports/", router_report(applications=[{"application": "x", "served": -2}]), format="json")
    assert bad.status_code == 400 and "applications" in bad.json()["error"]["fields"]
    assert ApplicationSample.objects.count() == 4
    sample = ApplicationSample.objects.get(router="router-2", application_name="tabular")
    assert sample.application == app and sample.host is None and sample.routing_version == 2 and sample.latency_p99_ms == 3.4
    ghost = ApplicationSample.objects.get(router="router-2", application_name="ghost")
    assert ghost.application is None and ghost.no_route == 3 and ghost.routing_version is None
    # A router reads the routing tables and its own credential, nothing else.
    assert routers["router-1"].get("/api/v1/routing-tables/?active=true").status_code == 200
    own = routers["router-1"].get("/api/v1/router-credentials/").json()["results"]
    assert [c["name"] for c in own] == ["router-1"] and "token" not in own[0]
    for path in ("/api/v1/hosts/", "/api/v1/application-samples/", "/api/v1/applications/"):
        assert routers["router-1"].get(path).status_code == 403


def test_only_a_routers_own_credential_may_post_its_reports(clients, agent_hosts, routers):
    """Finding 4: an agent token (any host) used to post router reports under any name; now only the
    router's own credential may, under its own name."""
    _, (agent_a, _) = agent_hosts
    refused = agent_a.post("/api/v1/router-reports/", router_report(), format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    other = routers["router-1"].post("/api/v1/router-reports/", router_report("router-2"), format="json")
    assert other.status_code == 403 and "router-1" in other.json()["error"]["message"]
    assert clients["operator"].post("/api/v1/router-reports/", router_report(), format="json").status_code == 403
    # A router credential is no agent token: it cannot post a host's metrics.
    host = agent_hosts[0][0]
    assert routers["router-1"].post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(), format="json").status_code == 403
    assert ApplicationSample.objects.count() == 0


def test_router_credentials_are_issued_and_revoked_by_admins_and_audited(clients, users, routers):
    for role in ("viewer", "operator"):
        assert clients[role].post("/api/v1/router-credentials/", {"name": "r9"}, format="json").status_code == 403
    listed = clients["viewer"].get("/api/v1/router-credentials/").json()["results"]
    assert [c["name"] for c in listed] == ["router-1", "router-2"] and all(c["active"] and "token" not in c for c in listed)
    bad = clients["admin"].post("/api/v1/router-credentials/", {"name": "no spaces"}, format="json")
    assert bad.status_code == 400 and "name" in bad.json()["error"]["fields"]
    credential = RouterCredential.objects.get(name="router-1")
    assert clients["operator"].post(f"/api/v1/router-credentials/{credential.pk}/revoke/").status_code == 403
    revoked = clients["admin"].post(f"/api/v1/router-credentials/{credential.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["active"] is False and revoked.json()["revoked"]
    response = routers["router-1"].post("/api/v1/router-reports/", router_report(), format="json")
    assert response.status_code == 401 and response.json()["error"]["status"] == 401
    names = lambda query: [c["name"] for c in clients["viewer"].get(f"/api/v1/router-credentials/?{query}").json()["results"]]  # noqa: E731
    assert names("revoked=true") == ["router-1"] and names("revoked=false") == ["router-2"] and names("q=ER-2") == ["router-2"]
    # Issued again: a new secret works, the revoked one stays refused.
    again = clients["admin"].post("/api/v1/router-credentials/", {"name": "router-1"}, format="json").json()
    assert again["active"] is True and again["description"] == "rack 4"
    assert _token_client(again["token"]).post("/api/v1/router-reports/", router_report(), format="json").status_code == 201
    assert routers["router-1"].post("/api/v1/router-reports/", router_report(), format="json").status_code == 401
    changes = list(ObjectChange.objects.filter(changed_object_type__model="routercredential",
                                               changed_object_id=str(credential.pk)).order_by("id"))
    assert [c.action for c in changes] == ["create", "update", "update"]
    assert all(c.user == users["admin"] and c.actor_kind == "user" for c in changes)
    assert changes[1].changed_fields == ["revoked"] and "token_hash" not in changes[1].postchange_data
    assert "token_prefix" in changes[2].changed_fields and "revoked" in changes[2].changed_fields


def test_late_reports_keep_their_times_and_report_what_was_dropped(agent_hosts, routers):
    """Reports kept through an outage arrive late, oldest first, stored under their own times; the count
    the sender had to drop is added up on the host and on the router's credential."""
    (host, _), (agent, _) = agent_hosts
    late = (timezone.now() - timedelta(minutes=12)).replace(microsecond=0)
    at = late.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert agent.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(at=at, dropped_reports=7), format="json").status_code == 201
    assert agent.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics(dropped_reports=2), format="json").status_code == 201
    assert set(RuntimeSample.objects.filter(host=host).values_list("at", flat=True)) == {late, T0 + timedelta(seconds=1)}
    host = Host.objects.get(pk=host.pk)
    assert host.dropped_reports == 9 and host.last_seen > timezone.now() - timedelta(minutes=1)
    assert routers["router-1"].post("/api/v1/router-reports/", router_report(at=at, dropped_reports=4), format="json").status_code == 201
    assert set(ApplicationSample.objects.values_list("at", flat=True)) == {late}
    assert RouterCredential.objects.get(name="router-1").dropped_reports == 4
    # Bounds: not older than the retention, not from the future, a count >= 0; nothing stored when refused.
    for body, field in ((router_report(at=(timezone.now() - timedelta(days=30)).isoformat()), "at"),
                        (router_report(at=(timezone.now() + timedelta(hours=1)).isoformat()), "at"),
                        (router_report(dropped_reports=-1), "dropped_reports")):
        response = routers["router-1"].post("/api/v1/router-reports/", body, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"], response.content
    assert ApplicationSample.objects.count() == 2


def test_sample_lists_and_filters(clients, agent_hosts):
    (host_a, host_b), (agent_a, agent_b) = agent_hosts
    app = ApplicationFactory(name="classify")
    agent_a.post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(at=iso(1)), format="json")
    agent_a.post(f"/api/v1/hosts/{host_a.pk}/metrics/", metrics(at=iso(2)), format="json")
    agent_b.post(f"/api/v1/hosts/{host_b.pk}/metrics/", metrics(at=iso(2)), format="json")
    ApplicationSample.objects.create(router="router-1", application_name="ghost", at=T0, interval_s=1.0)
    viewer = clients["viewer"]
    assert viewer.get("/api/v1/runtime-samples/").json()["count"] == 6
    assert viewer.get(f"/api/v1/runtime-samples/?host={host_a.pk}").json()["count"] == 4
    assert viewer.get(f"/api/v1/runtime-samples/?application={app.pk}").json()["count"] == 3
    since = viewer.get(f"/api/v1/runtime-samples/?host={host_a.pk}&since={iso(2)}").json()
    assert since["count"] == 2 and {s["at"] for s in since["results"]} == {iso(2)}
    newest_first = viewer.get("/api/v1/gpu-samples/").json()["results"]
    assert newest_first[0]["at"] >= newest_first[-1]["at"]
    assert viewer.get(f"/api/v1/gpu-samples/?host={host_b.pk}&placement=3g.20gb@4").json()["count"] == 1
    assert viewer.get("/api/v1/application-samples/?application_name=ghost").json()["count"] == 1
    assert viewer.get(f"/api/v1/application-samples/?router=router-1&since={iso(86400)}").json()["count"] == 0
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
    assert deleted == {"runtimesample": 1, "gpusample": 1, "applicationsample": 1, "pipelinepathsample": 0, "runtimeresize": 0}
    assert RuntimeSample.objects.count() == GpuSample.objects.count() == ApplicationSample.objects.count() == 1


def test_retention_is_scheduled_on_beat(db) -> None:
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.get(name="telemetry.prune")
    assert task.task == "telemetry.prune" and task.enabled and task.interval.every == 3600


def test_a_late_report_does_not_replace_fresher_live_state():
    """The live window (dashboard) holds each source's latest report by its time: a report kept through an
    outage and delivered afterwards is older than what is already held and must not replace it."""
    from apps.telemetry.rollup import ApplicationCatalogue, LiveWindow

    window = LiveWindow(horizon_s=60.0)
    now = 1_000_000.0
    fresh = {"router": "r1", "at": now, "interval_s": 1.0, "applications": [{"application": "a", "arrivals": 50}]}
    stale = {"router": "r1", "at": now - 300.0, "interval_s": 1.0, "applications": [{"application": "a", "arrivals": 7}]}
    window.router_report(fresh)
    window.router_report(stale)
    host_fresh = {"host": "h", "at": now, "runtimes": [{"key": "cpu0/0", "application": "a", "variant": "v", "arrivals": 30}], "instances": []}
    host_stale = {"host": "h", "at": now - 300.0, "runtimes": [{"key": "cpu0/0", "application": "a", "variant": "v", "arrivals": 3}], "instances": []}
    window.host_report(host_fresh)
    window.host_report(host_stale)
    snapshot = window.snapshot(now=now, catalogue={"a": ApplicationCatalogue(slo_ms=None, accuracies={})})
    assert snapshot["applications"]["a"]["demand_rps"] == 50.0
    assert snapshot["instances"]["h/cpu0/0"]["load_rps"] == 30.0
    assert snapshot["fleet"]["hosts_reporting"] == 1 and snapshot["reports"] == {"h": now}


def test_a_report_delivered_twice_is_stored_once(agent_hosts, routers):
    """A sender that gave up waiting (a frozen control plane answered after its timeout) sends the report
    again from its buffer while the first attempt got through: the second is acknowledged, not stored."""
    (host, _), (agent, _) = agent_hosts
    body = metrics(dropped_reports=3)
    assert agent.post(f"/api/v1/hosts/{host.pk}/metrics/", body, format="json").json() == {"runtime_samples": 2, "gpu_samples": 2}
    again = agent.post(f"/api/v1/hosts/{host.pk}/metrics/", body, format="json")
    assert again.status_code == 201 and again.json() == {"runtime_samples": 0, "gpu_samples": 0}
    assert RuntimeSample.objects.filter(host=host).count() == 2 and Host.objects.get(pk=host.pk).dropped_reports == 3
    report = router_report(dropped_reports=1)
    assert routers["router-1"].post("/api/v1/router-reports/", report, format="json").json() == {"application_samples": 2, "pipeline_path_samples": 0}
    assert routers["router-1"].post("/api/v1/router-reports/", report, format="json").json() == {"application_samples": 0, "pipeline_path_samples": 0}
    # Another router may report the same second.
    assert routers["router-2"].post("/api/v1/router-reports/", router_report("router-2"), format="json").json() == {"application_samples": 2, "pipeline_path_samples": 0}
    assert ApplicationSample.objects.count() == 4 and RouterCredential.objects.get(name="router-1").dropped_reports == 1


def test_router_reports_carry_each_pipeline_paths_end_to_end_counts(routers, clients):
    from apps.registry.services.pipelines import pipeline_save
    from apps.telemetry.models import PipelinePathSample
    from apps.telemetry.selectors import pipeline_paths_live

    ApplicationFactory(name="tabular")
    ApplicationFactory(name="calibrate")
    pipeline = pipeline_save(data={"name": "chain", "stages": "tabular -> calibrate", "slo_ms": 40, "demand_rps": 10})
    paths = [{"pipeline": "chain", "path": "chain", "arrivals": 20, "served": 19, "late": 2, "dropped": 1, "failed": 0, "no_route": 0,
              "latency_p50_ms": 8.0, "latency_p99_ms": 31.5},
             {"pipeline": "gone", "path": "p", "arrivals": 1, "failed": 1}]
    response = routers["router-1"].post("/api/v1/router-reports/", router_report(pipelines=paths), format="json")
    assert response.status_code == 201 and response.json() == {"application_samples": 2, "pipeline_path_samples": 2}
    sample = PipelinePathSample.objects.get(pipeline_name="chain")
    assert sample.pipeline == pipeline and sample.router == "router-1" and sample.late == 2 and sample.latency_p99_ms == 31.5
    assert PipelinePathSample.objects.get(pipeline_name="gone").pipeline is None  # kept by name
    live = pipeline_paths_live(seconds=60, now=T0 + timedelta(seconds=30))[("chain", "chain")]
    assert live["arrivals"] == 20 and live["violation_ratio"] == pytest.approx(3 / 20) and live["p99_ms"] == 31.5
    bad = routers["router-1"].post("/api/v1/router-reports/", router_report(at=iso(2), pipelines=[{"pipeline": "chain", "path": "chain", "late": -1}]),
                                   format="json")
    assert bad.status_code == 400 and "pipelines" in bad.json()["error"]["fields"]
    listed = clients["viewer"].get("/api/v1/pipeline-path-samples/?pipeline_name=chain").json()["results"]
    assert [(r["router"], r["path"], r["arrivals"], r["latency_p99_ms"]) for r in listed] == [("router-1", "chain", 20, 31.5)]
    assert telemetry_prune(older_than=timedelta(seconds=-60))["pipelinepathsample"] == 2
