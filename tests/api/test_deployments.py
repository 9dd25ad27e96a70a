"""Desired state, routing tables, runtimes and operations: the control plane's side of the data plane
(docs/dataplane.md)."""
import pytest
from django.core.exceptions import ValidationError

from apps.core.models import ObjectChange
from apps.deployments.models import HostDesiredState, HostOperation, RoutingTable, Runtime
from apps.deployments.services import host_desired_state_set, routing_table_publish, routing_tables_publish
from tests.factories import (
    ApplicationFactory,
    ArtifactFactory,
    CpuFactory,
    GpuFactory,
    GpuInstanceFactory,
    ModelVariantFactory,
    ProfileFactory,
    SloPolicyFactory,
)

pytestmark = pytest.mark.django_db


class Fleet:
    pass


@pytest.fixture
def fleet(agent_hosts):
    """agent-host-a (simulated): gpu0 an A100 with MIG on (4g.20gb@0, 3g.20gb@4), gpu1 an A100 with MIG off,
    gpu2 a T4, cpu0 with 8 cores. Applications `classify` (SLO 60 ms, slo-2x) and `tabular` (no SLO)."""
    (host, other), (agent, other_agent) = agent_hosts
    f = Fleet()
    f.host, f.other, f.agent, f.other_agent = host, other, agent, other_agent
    gpu0 = GpuFactory(host=host, index=0)
    GpuInstanceFactory(accelerator=gpu0, profile="4g.20gb", placement_start=0)
    GpuInstanceFactory(accelerator=gpu0, profile="3g.20gb", placement_start=4)
    GpuFactory(host=host, index=1, mig_enabled=False)
    GpuFactory(host=host, index=2, model_name="NVIDIA T4", memory_mb=16000, mig_capable=False, mig_enabled=False)
    CpuFactory(host=host, index=0, cpu_cores=8)
    f.classify = ApplicationFactory(name="classify")
    SloPolicyFactory(application=f.classify, latency_p99_ms=60.0, drop_rule="slo-2x")
    f.resnet = ModelVariantFactory(application=f.classify, name="resnet50", artifact=ArtifactFactory())
    f.bare = ModelVariantFactory(application=f.classify, name="resnet-bare")
    for variant in (f.resnet, f.bare):
        for slice_, base in (("3g.20gb", 10.0), ("4g.20gb", 8.0), ("full", 5.0)):
            for batch in (1, 8):
                ProfileFactory(variant=variant, slice=slice_, batch_size=batch, latency_p50_ms=base * batch, latency_p99_ms=base * batch * 1.2)
    ProfileFactory(variant=f.resnet, device_type="T4", slice="full", batch_size=1, latency_p50_ms=7.0, latency_p99_ms=9.0)
    f.tabular = ApplicationFactory(name="tabular")
    f.mlp = ModelVariantFactory(application=f.tabular, name="mlp", artifact=ArtifactFactory())
    f.mlp_bare = ModelVariantFactory(application=f.tabular, name="mlp-bare")
    for cores in (2, 4):
        for batch in (1, 4):
            ProfileFactory(variant=f.mlp, device_type="cpu", slice="", cpu_cores=cores, batch_size=batch,
                           latency_p50_ms=4.0 * batch / cores, latency_p99_ms=5.0 * batch / cores)
    return f


def mig_runtime(f, key="gpu0/3g.20gb@4", **over):
    return {"key": key, "application": "classify", "variant": f.resnet.pk, "max_batch": 8, "batching": {"policy": "proteus"}, **over}


def cpu_runtime(f, slot=0, threads=2, **over):
    return {"key": f"cpu0/{slot}", "device": "cpu0", "placement": None, "cpu_threads": threads, "application": "tabular",
            "variant": f.mlp.pk, "max_batch": 4, "batching": {"policy": "proteus", "slo_ms": 20}, **over}


def url(host):
    return f"/api/v1/hosts/{host.pk}/desired-state/"


# --------------------------------------------------------------------------- desired state


def test_desired_state_is_filled_in_and_versioned(clients, fleet):
    f = fleet
    assert clients["viewer"].get(url(f.host)).status_code == 404
    spec = {
        "gpus": [{"index": 1, "mig_enabled": False, "layout": []}],
        "runtimes": [
            {**mig_runtime(f), "device": "gpu0", "placement": "3g.20gb@4", "cpu_threads": None},
            mig_runtime(f, key="gpu1"),
            cpu_runtime(f, slot=0, threads=2),
            cpu_runtime(f, slot=1, threads=3),
        ],
    }
    created = clients["operator"].post(url(f.host), spec, format="json")
    assert created.status_code == 201, created.content
    doc = created.json()
    assert doc["host"] == f.host.name and doc["version"] == 1
    assert doc["gpus"] == [{"index": 1, "mig_enabled": False, "layout": []}]
    runtimes = {r["key"]: r for r in doc["runtimes"]}
    assert list(runtimes) == ["cpu0/0", "cpu0/1", "gpu0/3g.20gb@4", "gpu1"]
    mig = runtimes["gpu0/3g.20gb@4"]
    artifact = f.resnet.artifact
    assert mig["device"] == "gpu0" and mig["placement"] == "3g.20gb@4" and mig["cpu_threads"] is None
    assert mig["variant"] == {
        "id": f.resnet.pk, "name": "resnet50",
        "artifact": {"id": artifact.pk, "sha256": artifact.sha256, "size_bytes": artifact.size_bytes,
                     "download": f"/api/v1/artifacts/{artifact.pk}/download/"},
    }
    # Batching defaults come from the application's SLO policy; the profile from the registry (p50).
    assert mig["batching"] == {"policy": "proteus", "params": {}, "drop_rule": "slo-2x", "queue_order": "fifo", "slo_ms": 60.0}
    assert mig["profile"] == [{"batch": 1, "latency_ms": 10.0}, {"batch": 8, "latency_ms": 80.0}]
    assert runtimes["gpu1"]["placement"] is None and runtimes["gpu1"]["profile"][0] == {"batch": 1, "latency_ms": 5.0}
    # CPU: the profile at the same core count, else the nearest (the smaller on a tie).
    assert runtimes["cpu0/0"]["profile"] == [{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 8.0}]
    assert runtimes["cpu0/1"]["profile"] == [{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 8.0}]
    assert runtimes["cpu0/0"]["batching"]["drop_rule"] == "deadline" and runtimes["cpu0/0"]["batching"]["slo_ms"] == 20.0

    again = clients["operator"].post(url(f.host), {"runtimes": [cpu_runtime(f)]}, format="json")
    assert again.status_code == 201 and again.json()["version"] == 2
    latest = clients["viewer"].get(url(f.host)).json()
    assert latest["version"] == 2 and [r["key"] for r in latest["runtimes"]] == ["cpu0/0"]
    assert HostDesiredState.objects.get(host=f.host, version=2).created_by.username == "operator"
    # A document read back can be posted again as the next version.
    resent = clients["operator"].post(url(f.host), latest, format="json")
    assert resent.status_code == 201 and resent.json()["version"] == 3 and resent.json()["runtimes"] == latest["runtimes"]


def test_desired_state_who_may_read_and_write(clients, fleet):
    f = fleet
    host_desired_state_set(host=f.host, spec={"runtimes": [cpu_runtime(f)]})
    assert f.agent.get(url(f.host)).status_code == 200
    assert f.other_agent.get(url(f.host)).status_code == 404
    assert f.agent.post(url(f.host), {"runtimes": []}, format="json").status_code == 403
    assert clients["viewer"].post(url(f.host), {"runtimes": []}, format="json").status_code == 403
    assert clients["anonymous"].get(url(f.host)).status_code == 401
    assert clients["admin"].post(url(f.host), {"runtimes": []}, format="json").status_code == 201
    assert clients["operator"].get("/api/v1/hosts/999999/desired-state/").status_code == 404
    # The list of every version: agents see their own host's only.
    host_desired_state_set(host=f.other, spec={})
    assert clients["viewer"].get("/api/v1/desired-states/").json()["count"] == 3
    mine = f.agent.get("/api/v1/desired-states/").json()
    assert mine["count"] == 2 and {d["host"] for d in mine["results"]} == {f.host.pk}
    filtered = clients["viewer"].get(f"/api/v1/desired-states/?host={f.other.pk}").json()
    assert filtered["count"] == 1 and filtered["results"][0]["spec"]["host"] == f.other.name


BAD_SPECS = [
    ("unknown top-level key", lambda f: {"runtime": []}, "Unknown keys"),
    ("gpu not on the host", lambda f: {"gpus": [{"index": 7, "mig_enabled": False, "layout": []}]}, "no such GPU"),
    ("gpu listed twice", lambda f: {"gpus": [{"index": 1, "mig_enabled": False}, {"index": 1, "mig_enabled": False}]}, "listed twice"),
    ("illegal MIG start", lambda f: {"gpus": [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@2"]}]}, "invalid MIG layout"),
    ("overlapping MIG layout", lambda f: {"gpus": [{"index": 0, "mig_enabled": True, "layout": ["4g.20gb@0", "4g.20gb@4"]}]}, "invalid MIG layout"),
    ("MIG on a GPU that cannot", lambda f: {"gpus": [{"index": 2, "mig_enabled": True, "layout": []}]}, "not MIG capable"),
    ("layout without MIG", lambda f: {"gpus": [{"index": 1, "mig_enabled": False, "layout": ["7g.40gb@0"]}]}, "needs mig_enabled"),
    ("malformed key", lambda f: {"runtimes": [mig_runtime(f, key="gpu0:3g")]}, "not a runtime key"),
    ("key used twice", lambda f: {"runtimes": [cpu_runtime(f), cpu_runtime(f, threads=1)]}, "used twice"),
    ("key and placement disagree", lambda f: {"runtimes": [mig_runtime(f, placement="4g.20gb@0")]}, "disagree"),
    ("device not on the host", lambda f: {"runtimes": [mig_runtime(f, key="gpu5")]}, "has no gpu5"),
    ("cpu not on the host", lambda f: {"runtimes": [cpu_runtime(f, key="cpu1/0", device="cpu1")]}, "has no cpu1"),
    ("placement not in the layout", lambda f: {"runtimes": [mig_runtime(f, key="gpu0/3g.20gb@0")]}, "not in gpu0's MIG layout"),
    ("placement not in the new layout", lambda f: {"gpus": [{"index": 0, "mig_enabled": True, "layout": ["7g.40gb@0"]}],
                                                   "runtimes": [mig_runtime(f)]}, "not in gpu0's MIG layout"),
    ("whole GPU with MIG on", lambda f: {"runtimes": [mig_runtime(f, key="gpu0")]}, "needs MIG disabled"),
    ("MIG instance on a GPU with MIG off", lambda f: {"runtimes": [mig_runtime(f, key="gpu1/3g.20gb@4")]}, "MIG is disabled"),
    ("cpu threads on a GPU", lambda f: {"runtimes": [mig_runtime(f, cpu_threads=2)]}, "only for CPU"),
    ("cpu runtime without threads", lambda f: {"runtimes": [cpu_runtime(f, cpu_threads=None)]}, "cpu_threads"),
    ("cpu threads over the cores", lambda f: {"runtimes": [cpu_runtime(f, slot=0, threads=4), cpu_runtime(f, slot=1, threads=5)]}, "9 threads"),
    ("unknown application", lambda f: {"runtimes": [mig_runtime(f, application="nope")]}, "no application named"),
    ("unknown variant", lambda f: {"runtimes": [mig_runtime(f, variant=999999)]}, "is not one"),
    ("variant of another application", lambda f: {"runtimes": [cpu_runtime(f, variant=f.resnet.pk)]}, "belongs to classify"),
    ("cpu variant without artifact", lambda f: {"runtimes": [cpu_runtime(f, variant=f.mlp_bare.pk)]}, "need one"),
    ("max_batch 0", lambda f: {"runtimes": [mig_runtime(f, max_batch=0)]}, "max_batch"),
    ("max_batch past 64 bits", lambda f: {"runtimes": [mig_runtime(f, max_batch=2**64)]}, "max_batch"),
    ("unknown batching policy", lambda f: {"runtimes": [mig_runtime(f, batching={"policy": "greedy"})]}, "batching.policy"),
    ("bad policy params", lambda f: {"runtimes": [mig_runtime(f, batching={"policy": "fixed", "params": {"colour": 1}})]}, "batching.params"),
    ("unknown drop rule", lambda f: {"runtimes": [mig_runtime(f, batching={"policy": "proteus", "drop_rule": "maybe"})]}, "drop_rule"),
    ("no SLO anywhere", lambda f: {"runtimes": [cpu_runtime(f, batching={"policy": "proteus"})]}, "no SLO policy"),
    ("no profile for the slice", lambda f: {"runtimes": [mig_runtime(f, key="gpu2", variant=f.bare.pk)]}, "no profile of"),
    ("bad explicit profile", lambda f: {"runtimes": [mig_runtime(f, profile=[{"batch": 0, "latency_ms": 1}])]}, "batch"),
    ("empty explicit profile", lambda f: {"runtimes": [mig_runtime(f, profile=[])]}, "non-empty"),
]


@pytest.mark.parametrize("spec,needle", [pytest.param(s, n, id=name) for name, s, n in BAD_SPECS])
def test_bad_desired_state_is_refused_and_stores_nothing(clients, fleet, spec, needle):
    response = clients["operator"].post(url(fleet.host), spec(fleet), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and needle in str(error["fields"]), error
    assert not HostDesiredState.objects.exists()
    assert not ObjectChange.objects.filter(changed_object_type__model="hostdesiredstate").exists()


def test_desired_state_every_problem_is_named(fleet):
    with pytest.raises(ValidationError) as excinfo:
        host_desired_state_set(host=fleet.host, spec={"runtimes": [mig_runtime(fleet, max_batch=0), cpu_runtime(fleet, variant=999999)]})
    messages = excinfo.value.message_dict["runtimes"]
    assert len(messages) == 2 and "runtimes[0] (gpu0/3g.20gb@4)" in messages[0] and "runtimes[1] (cpu0/0)" in messages[1]


def test_desired_state_geometry_and_simulation(fleet):
    f = fleet
    # A new layout in the same version; the placement is written canonically.
    state = host_desired_state_set(host=f.host, spec={
        "gpus": [{"index": 0, "mig_enabled": True, "layout": ["MIG 3G.20GB@4", "3g.20gb@0"]},
                 {"index": 1, "mig_enabled": True, "layout": ["7g.40gb@0"]}],
        "runtimes": [mig_runtime(f, key="gpu0/3g.20gb@0"), mig_runtime(f, key="gpu1/7g.40gb@0", profile=[{"batch": 2, "latency_ms": 3}, {"batch": 1, "latency_ms": 2}])],
    })
    assert state.spec["gpus"] == [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@0", "3g.20gb@4"]},
                                  {"index": 1, "mig_enabled": True, "layout": ["7g.40gb@0"]}]
    explicit = next(r for r in state.spec["runtimes"] if r["key"] == "gpu1/7g.40gb@0")
    assert explicit["profile"] == [{"batch": 1, "latency_ms": 2.0}, {"batch": 2, "latency_ms": 3.0}]
    # A T4's profiles stored under its short name are found; a simulated host may run an artifact-less variant.
    state = host_desired_state_set(host=f.host, spec={"runtimes": [mig_runtime(f, key="gpu2"), mig_runtime(f, variant=f.bare.pk)]})
    bare = next(r for r in state.spec["runtimes"] if r["key"] == "gpu0/3g.20gb@4")
    assert bare["variant"]["artifact"] is None and state.version == 2
    f.host.backend = "nvml"
    f.host.save()
    with pytest.raises(ValidationError, match="only a simulated host"):
        host_desired_state_set(host=f.host, spec={"runtimes": [mig_runtime(f, variant=f.bare.pk)]})


# --------------------------------------------------------------------------- routing tables


def routes(f, *pairs):
    return [{"instance": instance, "variant": variant.pk, "weight": weight} for instance, variant, weight in pairs]


def test_publish_switches_the_active_table(clients, fleet):
    f = fleet
    op = clients["operator"]
    first = op.post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": routes(
        f, (f"{f.host.name}/gpu0/3g.20gb@4", f.resnet, 3), (f"{f.host.name}/gpu1", f.resnet, 1))}, format="json")
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["application"] == "classify" and body["version"] == 1 and body["active"] is True
    assert body["slo_ms"] == 60.0 and body["drop_rule"] == "slo-2x"
    assert [(r["instance"], r["variant"], r["weight"], r["endpoint"], r["state"]) for r in body["routes"]] == [
        (f"{f.host.name}/gpu0/3g.20gb@4", "resnet50", 0.75, None, "unknown"),
        (f"{f.host.name}/gpu1", "resnet50", 0.25, None, "unknown"),
    ]
    second = op.post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": routes(f, (f"{f.host.name}/gpu1", f.resnet, 2))}, format="json")
    assert second.status_code == 201 and second.json()["version"] == 2 and second.json()["routes"][0]["weight"] == 1.0
    tabular = op.post("/api/v1/routing-tables/", {"application": f.tabular.pk, "routes": []}, format="json")
    assert tabular.status_code == 201 and tabular.json()["slo_ms"] is None and tabular.json()["drop_rule"] == "deadline"
    active = clients["viewer"].get("/api/v1/routing-tables/?active=true").json()
    assert sorted((t["application"], t["version"]) for t in active["results"]) == [("classify", 2), ("tabular", 1)]
    assert list(RoutingTable.objects.filter(application=f.classify).order_by("version").values_list("active", flat=True)) == [False, True]
    assert clients["viewer"].get(f"/api/v1/routing-tables/?application={f.classify.pk}").json()["count"] == 2
    assert clients["viewer"].get("/api/v1/routing-tables/?application_name=tabular").json()["count"] == 1
    change = ObjectChange.objects.filter(changed_object_type__model="routingtable", action="update").get()
    assert change.changed_fields == ["active"] and change.actor_name == "operator"


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda f: routes(f, ("nohost/gpu1", f.resnet, 1)), "no host named"),
        (lambda f: routes(f, (f"{f.host.name}/gpu:1", f.resnet, 1)), "not a runtime key"),
        (lambda f: routes(f, (f"{f.host.name}/gpu1", f.mlp, 1)), "belongs to tabular"),
        (lambda f: routes(f, (f"{f.host.name}/gpu1", f.resnet, 0), (f"{f.host.name}/gpu0/3g.20gb@4", f.resnet, 0)), "sum to 0"),
        (lambda f: routes(f, (f"{f.host.name}/gpu1", f.resnet, 1), (f"{f.host.name}/gpu1", f.resnet, 2)), "listed twice"),
        (lambda f: routes(f, (f"{f.host.name}/gpu1", f.resnet, -1)), "greater than or equal to 0"),
        (lambda f: [{"instance": f"{f.host.name}/gpu1", "variant": 999999, "weight": 1}], "no model variant"),
    ],
)
def test_bad_routing_table_changes_nothing(clients, fleet, make, needle):
    f = fleet
    routing_table_publish(application=f.classify, routes=routes(f, (f"{f.host.name}/gpu1", f.resnet, 1)))
    response = clients["operator"].post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": make(f)}, format="json")
    assert response.status_code == 400, response.content
    assert needle in str(response.json()["error"]), response.json()
    assert list(RoutingTable.objects.values_list("version", "active")) == [(1, True)]


def test_publish_several_applications_is_all_or_nothing(fleet):
    f = fleet
    routing_tables_publish(tables={f.classify: routes(f, (f"{f.host.name}/gpu1", f.resnet, 1)), f.tabular: routes(f, (f"{f.host.name}/cpu0/0", f.mlp, 1))})
    with pytest.raises(ValidationError, match="tabular: "):
        routing_tables_publish(tables={
            f.classify: routes(f, (f"{f.host.name}/gpu0/3g.20gb@4", f.resnet, 1)),
            f.tabular: routes(f, (f"{f.host.name}/cpu0/0", f.resnet, 1)),
        })
    assert sorted(RoutingTable.objects.filter(active=True).values_list("application__name", "version")) == [("classify", 1), ("tabular", 1)]
    published = routing_tables_publish(tables={
        f.classify: routes(f, (f"{f.host.name}/gpu0/3g.20gb@4", f.resnet, 1)),
        f.tabular: routes(f, (f"{f.host.name}/cpu0/1", f.mlp, 1)),
    })
    assert {a.name: t.version for a, t in published.items()} == {"classify": 2, "tabular": 2}
    assert sorted(RoutingTable.objects.filter(active=True).values_list("application__name", "version")) == [("classify", 2), ("tabular", 2)]
    assert RoutingTable.objects.filter(active=False).count() == 2


def test_routing_tables_who_may_read_and_write(clients, fleet):
    f = fleet
    table = routing_table_publish(application=f.classify, routes=routes(f, (f"{f.other.name}/gpu1", f.resnet, 1)))
    # Every agent reads every table (routers serve every application), and publishes none.
    for agent in (f.agent, f.other_agent):
        assert agent.get("/api/v1/routing-tables/?active=true").json()["count"] == 1
        assert agent.get(f"/api/v1/routing-tables/{table.pk}/").status_code == 200
        assert agent.post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": []}, format="json").status_code == 403
    assert clients["viewer"].post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": []}, format="json").status_code == 403
    assert clients["operator"].patch(f"/api/v1/routing-tables/{table.pk}/", {"active": False}, format="json").status_code == 405
    assert clients["operator"].delete(f"/api/v1/routing-tables/{table.pk}/").status_code == 405


# --------------------------------------------------------------------------- the agent's report


def report(**extra):
    return {
        "backend": "simulated", "agent_version": "0.1.0",
        "accelerators": [
            {"index": 0, "kind": "gpu", "uuid": "GPU-rep-0", "model_name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960,
             "mig_capable": True, "mig_enabled": True, "placements": {"3g.20gb": [0, 4]},
             "instances": [{"profile": "3g.20gb", "start": 4, "uuid": "MIG-1", "state": "ready"}]},
            {"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 8},
        ],
        **extra,
    }


def runtime(key, state="ready", **over):
    return {"key": key, "application": "classify", "variant": None, "state": state, "endpoint": f"tcp://10.0.0.5:{41000 + len(key)}",
            "simulated": True, "error": "", **over}


OPS = [
    {"at": "2026-11-21T10:00:00Z", "action": "mig.create", "target": "gpu0/3g.20gb@4", "outcome": "ok", "detail": "gi 2 ci 0"},
    {"at": "2026-11-21T10:00:01Z", "action": "runtime.start", "target": "gpu0/3g.20gb@4", "outcome": "failed", "detail": "oom"},
]


def test_report_with_runtimes_and_operations(clients, agent_hosts):
    (host, other), (agent, _) = agent_hosts
    app = ApplicationFactory(name="classify")
    variant = ModelVariantFactory(application=app)
    body = report(
        desired_version=3,
        runtimes=[runtime("gpu0/3g.20gb@4", variant=variant.pk), runtime("cpu0/0", application="unknown-app", state="starting")],
        operations=OPS,
        catalogue_disagreements=["gpu0 3g.20gb: NVML reports starts [0, 4], the catalogue [4]"],
    )
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["converged_version"] == 3
    assert response.json()["catalogue_disagreements"] == body["catalogue_disagreements"]
    rows = {r.key: r for r in Runtime.objects.filter(host=host)}
    assert rows["gpu0/3g.20gb@4"].variant == variant and rows["gpu0/3g.20gb@4"].application == app
    assert rows["cpu0/0"].application is None and rows["cpu0/0"].state == "starting"
    assert HostOperation.objects.filter(host=host).count() == 2
    # The next report replaces the runtimes; operations resent after a lost reply are not stored twice.
    body = report(desired_version=4, runtimes=[runtime("cpu0/0", state="ready")], operations=OPS[1:])
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", body, format="json").status_code == 200
    assert list(Runtime.objects.filter(host=host).values_list("key", "state")) == [("cpu0/0", "ready")]
    assert HostOperation.objects.filter(host=host).count() == 2
    host.refresh_from_db()
    assert host.converged_version == 4
    # A report without the data-plane parts leaves them alone.
    assert agent.post(f"/api/v1/hosts/{host.pk}/report/", report(), format="json").status_code == 200
    host.refresh_from_db()
    assert host.converged_version == 4 and Runtime.objects.filter(host=host).count() == 1
    # Reading: the agent its own host's rows, viewers every host's.
    Runtime.objects.create(host=other, key="gpu1", state="ready")
    assert agent.get("/api/v1/runtimes/").json()["count"] == 1
    assert clients["viewer"].get("/api/v1/runtimes/").json()["count"] == 2
    assert clients["viewer"].get(f"/api/v1/runtimes/?host={other.pk}&state=ready").json()["results"][0]["instance"] == f"{other.name}/gpu1"
    assert agent.get("/api/v1/host-operations/").json()["count"] == 2
    ops = clients["viewer"].get(f"/api/v1/host-operations/?host={host.pk}&outcome=failed").json()
    assert [(o["action"], o["detail"]) for o in ops["results"]] == [("runtime.start", "oom")]
    assert clients["viewer"].get(f"/api/v1/host-operations/?host={other.pk}").json()["count"] == 0
    assert agent.post("/api/v1/runtimes/", {}, format="json").status_code == 403
    assert clients["operator"].post("/api/v1/runtimes/", {}, format="json").status_code == 405


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"runtimes": [runtime("gpu0/3g.20gb@4", state="sleeping")]}, "runtimes"),
        ({"runtimes": [runtime("gpu0 3g")]}, "runtimes"),
        ({"runtimes": [runtime("cpu0/0"), runtime("cpu0/0")]}, "runtimes"),
        ({"operations": [{**OPS[0], "outcome": "meh"}]}, "operations"),
        ({"operations": [{**OPS[0], "at": "yesterday"}]}, "operations"),
        ({"desired_version": 0}, "desired_version"),
        ({"catalogue_disagreements": "none"}, "catalogue_disagreements"),
    ],
)
def test_bad_report_changes_nothing(agent_hosts, extra, field):
    (host, _), (agent, _) = agent_hosts
    Runtime.objects.create(host=host, key="gpu1", state="ready")
    response = agent.post(f"/api/v1/hosts/{host.pk}/report/", report(**extra), format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert host.accelerators.count() == 0 and list(Runtime.objects.values_list("key", flat=True)) == ["gpu1"]
    assert not HostOperation.objects.exists()


def test_routing_table_shows_reported_endpoints_and_states(clients, fleet):
    f = fleet
    table = routing_table_publish(application=f.classify, routes=routes(
        f, (f"{f.host.name}/gpu0/3g.20gb@4", f.resnet, 1), (f"{f.other.name}/gpu1", f.resnet, 1), (f"{f.host.name}/gpu1", f.resnet, 1)))
    body = report(runtimes=[runtime("gpu0/3g.20gb@4", variant=f.resnet.pk), runtime("gpu1", state="draining", endpoint="")])
    assert f.agent.post(f"/api/v1/hosts/{f.host.pk}/report/", body, format="json").status_code == 200
    got = clients["viewer"].get(f"/api/v1/routing-tables/{table.pk}/").json()
    assert [(r["endpoint"], r["state"]) for r in got["routes"]] == [
        (body["runtimes"][0]["endpoint"], "ready"), (None, "unknown"), (None, "draining"),
    ]


# --------------------------------------------------------------------------- artifacts an agent may fetch


def test_agent_downloads_only_the_artifacts_its_host_needs(clients, fleet):
    f = fleet
    mine, theirs = f.mlp.artifact, f.resnet.artifact
    download = f"/api/v1/artifacts/{mine.pk}/download/"
    assert f.agent.get(download).status_code == 404
    assert f.agent.get("/api/v1/artifacts/").json()["count"] == 0
    host_desired_state_set(host=f.host, spec={"runtimes": [cpu_runtime(f)]})
    response = f.agent.get(download)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"not-really-onnx!"
    assert response["X-Checksum-Sha256"] == mine.sha256
    assert f.agent.get(f"/api/v1/artifacts/{mine.pk}/").status_code == 200
    assert f.agent.get(f"/api/v1/artifacts/{theirs.pk}/download/").status_code == 404
    assert f.other_agent.get(download).status_code == 404
    assert f.agent.delete(f"/api/v1/artifacts/{mine.pk}/").status_code == 403
    # Only the latest version counts.
    host_desired_state_set(host=f.host, spec={"runtimes": [mig_runtime(f)]})
    assert f.agent.get(download).status_code == 404
    assert f.agent.get(f"/api/v1/artifacts/{theirs.pk}/download/").status_code == 200
    # Variants, applications and profiles stay out of an agent's reach: the documents carry what it needs.
    for path in ("/api/v1/variants/", "/api/v1/applications/", "/api/v1/profiles/"):
        assert f.agent.get(path).status_code == 403



def test_admin_shows_the_data_plane_read_only(admin_client, fleet):
    f = fleet
    state = host_desired_state_set(host=f.host, spec={"runtimes": [cpu_runtime(f)]})
    table = routing_table_publish(application=f.tabular, routes=routes(f, (f"{f.host.name}/cpu0/0", f.mlp, 1)))
    runtime_row = Runtime.objects.create(host=f.host, key="cpu0/0", state="ready")
    HostOperation.objects.create(host=f.host, at="2026-11-21T10:00:00Z", action="runtime.start", outcome="ok")
    for model in ("hostdesiredstate", "routingtable", "runtime", "hostoperation"):
        assert admin_client.get(f"/admin/deployments/{model}/").status_code == 200, model
    for model in ("runtimesample", "gpusample", "applicationsample"):
        assert admin_client.get(f"/admin/telemetry/{model}/").status_code == 200, model
        assert admin_client.get(f"/admin/telemetry/{model}/add/").status_code == 403, model
    assert admin_client.get("/admin/registry/profilingrequest/").status_code == 200
    for obj, path in ((state, "hostdesiredstate"), (table, "routingtable"), (runtime_row, "runtime")):
        assert admin_client.get(f"/admin/deployments/{path}/{obj.pk}/change/").status_code == 200
    assert admin_client.get("/admin/deployments/routingtable/add/").status_code == 403
