"""The permission matrix: anonymous, viewer, operator, admin and a host agent against every resource."""
import pytest

from apps.deployments.models import HostDesiredState, Runtime
from apps.deployments.services import host_desired_state_set
from apps.inventory.models import Host
from tests.factories import (
    ApplicationFactory,
    ArtifactFactory,
    CpuFactory,
    GpuFactory,
    HostFactory,
    ModelVariantFactory,
    ProfilingRequestFactory,
)

pytestmark = pytest.mark.django_db

# resource -> (list URL, payload builder for a valid create, the role that may create it)
FLEET_AND_POLICIES = "operator"


def _routing_table_payload():
    variant = ModelVariantFactory()
    return {"application": variant.application.pk, "routes": [{"instance": f"{HostFactory().name}/cpu0/0", "variant": variant.pk, "weight": 1}]}


def _profiling_request_payload():
    cpu = CpuFactory()
    return {"variant": ModelVariantFactory(artifact=ArtifactFactory()).pk, "host": cpu.host.pk, "device": "cpu0"}


# Read-only for every role: written by services and by the agents' reports, metrics and router reports.
READ_ONLY = (
    "/api/v1/artifacts/", "/api/v1/object-changes/", "/api/v1/gpu-models/", "/api/v1/tokens/", "/api/v1/desired-states/",
    "/api/v1/runtimes/", "/api/v1/host-operations/", "/api/v1/runtime-samples/", "/api/v1/gpu-samples/",
    "/api/v1/application-samples/",
)


def _payloads():
    return {
        "hosts": ("/api/v1/hosts/", lambda: {"name": "new-host", "backend": "simulated"}, FLEET_AND_POLICIES),
        "accelerators": (
            "/api/v1/accelerators/",
            lambda: {"host": HostFactory().pk, "index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 4},
            FLEET_AND_POLICIES,
        ),
        "gpu-instances": (
            "/api/v1/gpu-instances/",
            lambda: {"accelerator": GpuFactory().pk, "profile": "3g.20gb", "placement_start": 4},
            FLEET_AND_POLICIES,
        ),
        "pipelines": ("/api/v1/pipelines/", lambda: {"name": "p1", "stages": [ApplicationFactory().name], "slo_ms": 100, "demand_rps": 5}, FLEET_AND_POLICIES),
        "applications": ("/api/v1/applications/", lambda: {"name": "new-app"}, FLEET_AND_POLICIES),
        "variants": (
            "/api/v1/variants/",
            lambda: {"application": ApplicationFactory().pk, "name": "v", "accuracy": 0.5, "accuracy_metric": "top-1"},
            FLEET_AND_POLICIES,
        ),
        "profiles": (
            "/api/v1/profiles/",
            lambda: {
                "variant": ModelVariantFactory().pk, "device_type": "A100-SXM4-40GB", "slice": "1g.5gb",
                "batch_size": 4, "latency_p50_ms": 5, "latency_p99_ms": 6,
            },
            FLEET_AND_POLICIES,
        ),
        "slo-policies": (
            "/api/v1/slo-policies/", lambda: {"application": ApplicationFactory().pk, "latency_p99_ms": 30}, FLEET_AND_POLICIES
        ),
        "replan-policies": ("/api/v1/replan-policies/", lambda: {"name": "nightly", "interval_seconds": 600}, FLEET_AND_POLICIES),
        "ensemble-policies": ("/api/v1/ensemble-policies/", lambda: {
            "application": ModelVariantFactory(name="solo").application.pk, "members": [{"variant": "solo", "probability": 1}]}, FLEET_AND_POLICIES),
        "routing-tables": ("/api/v1/routing-tables/", _routing_table_payload, FLEET_AND_POLICIES),
        "profiling-requests": ("/api/v1/profiling-requests/", _profiling_request_payload, FLEET_AND_POLICIES),
        "users": ("/api/v1/users/", lambda: {"username": "ci-bot", "role": "operator"}, "admin"),
    }


ROLE_RANK = {"viewer": 0, "operator": 1, "admin": 2}


@pytest.mark.parametrize("resource", list(_payloads()))
@pytest.mark.parametrize("principal", ["anonymous", "viewer", "operator", "admin"])
def test_user_roles_list_and_create(clients, principal, resource):
    url, payload, creator = _payloads()[resource]
    client = clients[principal]
    listing = client.get(url)
    created = client.post(url, payload(), format="json")
    if principal == "anonymous":
        assert listing.status_code == 401
        assert created.status_code == 401
        assert listing.json()["error"]["code"] == "not_authenticated"
        return
    may_read = resource != "users" or principal == "admin"
    assert listing.status_code == (200 if may_read else 403), listing.content
    may_create = ROLE_RANK[principal] >= ROLE_RANK[creator]
    assert created.status_code == (201 if may_create else 403), created.content


@pytest.mark.parametrize("principal,expected", [("anonymous", 401), ("viewer", 200), ("operator", 200), ("admin", 200)])
def test_read_only_resources(clients, principal, expected):
    for url in READ_ONLY:
        assert clients[principal].get(url).status_code == expected, url


@pytest.mark.parametrize("principal,expected", [("anonymous", 401), ("viewer", 403), ("operator", 201), ("admin", 201)])
def test_desired_state_is_set_by_operators(clients, principal, expected):
    host = HostFactory()
    response = clients[principal].post(f"/api/v1/hosts/{host.pk}/desired-state/", {"runtimes": []}, format="json")
    assert response.status_code == expected, response.content
    assert HostDesiredState.objects.filter(host=host).exists() == (expected == 201)
    if principal != "anonymous":
        assert clients[principal].get(f"/api/v1/hosts/{host.pk}/desired-state/").status_code == (200 if expected == 201 else 404)


@pytest.mark.parametrize("principal,update,delete", [("viewer", 403, 403), ("operator", 200, 204), ("admin", 200, 204)])
def test_update_and_delete_by_role(clients, principal, update, delete):
    host = HostFactory()
    assert clients[principal].patch(f"/api/v1/hosts/{host.pk}/", {"description": "x"}, format="json").status_code == update
    assert clients[principal].delete(f"/api/v1/hosts/{host.pk}/").status_code == delete
    assert Host.objects.filter(pk=host.pk).exists() == (delete != 204)


def test_agent_sees_only_its_own_host(agent_hosts):
    (host_a, host_b), (agent_a, _agent_b) = agent_hosts
    listing = agent_a.get("/api/v1/hosts/").json()
    assert [h["name"] for h in listing["results"]] == [host_a.name]
    assert agent_a.get(f"/api/v1/hosts/{host_a.pk}/").status_code == 200
    assert agent_a.get(f"/api/v1/hosts/{host_b.pk}/").status_code == 404
    GpuFactory(host=host_b)
    assert agent_a.get("/api/v1/accelerators/").json()["count"] == 0


def test_agent_reads_its_own_hosts_data_plane(agent_hosts):
    (host_a, host_b), (agent_a, _agent_b) = agent_hosts
    for host in (host_a, host_b):
        host_desired_state_set(host=host, spec={})
        Runtime.objects.create(host=host, key="gpu0", state="ready")
        ProfilingRequestFactory(host=host)
    assert agent_a.get(f"/api/v1/hosts/{host_a.pk}/desired-state/").status_code == 200
    assert agent_a.get(f"/api/v1/hosts/{host_b.pk}/desired-state/").status_code == 404
    for url in ("/api/v1/desired-states/", "/api/v1/runtimes/", "/api/v1/profiling-requests/"):
        listing = agent_a.get(url).json()
        assert listing["count"] == 1, url
    assert agent_a.get("/api/v1/host-operations/").status_code == 200
    assert agent_a.get("/api/v1/routing-tables/").status_code == 200


def test_agent_cannot_touch_anything_else(agent_hosts):
    (host_a, host_b), (agent_a, _agent_b) = agent_hosts
    assert agent_a.get("/api/v1/applications/").status_code == 403
    for url in ("/api/v1/variants/", "/api/v1/profiles/", "/api/v1/runtime-samples/", "/api/v1/slo-policies/"):
        assert agent_a.get(url).status_code == 403, url
    assert agent_a.post(f"/api/v1/hosts/{host_a.pk}/desired-state/", {}, format="json").status_code == 403
    assert agent_a.post("/api/v1/routing-tables/", {}, format="json").status_code == 403
    assert agent_a.post("/api/v1/profiling-requests/", {}, format="json").status_code == 403
    assert agent_a.get("/api/v1/object-changes/").status_code == 403
    assert agent_a.get("/api/v1/users/").status_code == 403
    assert agent_a.post("/api/v1/hosts/", {"name": "sneaky"}, format="json").status_code == 403
    assert agent_a.patch(f"/api/v1/hosts/{host_a.pk}/", {"description": "x"}, format="json").status_code == 403
    assert agent_a.delete(f"/api/v1/hosts/{host_a.pk}/").status_code == 403
    assert agent_a.post(f"/api/v1/hosts/{host_a.pk}/agent-token/").status_code == 403


def test_agent_reports_only_its_own_host(agent_hosts, clients):
    (host_a, host_b), (agent_a, agent_b) = agent_hosts
    report = {"backend": "simulated", "accelerators": [{"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 4}]}
    assert agent_a.post(f"/api/v1/hosts/{host_b.pk}/report/", report, format="json").status_code == 404
    assert agent_b.post(f"/api/v1/hosts/{host_a.pk}/report/", report, format="json").status_code == 404
    assert clients["admin"].post(f"/api/v1/hosts/{host_a.pk}/report/", report, format="json").status_code == 403
    assert host_b.accelerators.count() == 0
    assert agent_a.post(f"/api/v1/hosts/{host_a.pk}/report/", report, format="json").status_code == 200
    assert host_a.accelerators.count() == 1


def test_only_admins_issue_agent_tokens(clients):
    host = HostFactory()
    for principal in ("viewer", "operator"):
        assert clients[principal].post(f"/api/v1/hosts/{host.pk}/agent-token/").status_code == 403
    response = clients["admin"].post(f"/api/v1/hosts/{host.pk}/agent-token/")
    assert response.status_code == 201
    assert response.json()["token"].startswith("tsa_")


def test_invalid_tokens_are_refused(db):
    from rest_framework.test import APIClient

    for header in ("Bearer tsu_not-a-real-token", "Bearer tsa_not-a-real-token"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = client.get("/api/v1/hosts/")
        assert response.status_code == 401
        assert "Invalid" in response.json()["error"]["message"]
