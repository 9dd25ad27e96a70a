"""Profiling requests: operators ask, the host's agent measures, the results become measured profiles."""
import pytest

from apps.core.models import ObjectChange
from apps.registry.models import Profile, ProfilingRequest
from tests.factories import (
    ArtifactFactory,
    CpuFactory,
    GpuFactory,
    ModelVariantFactory,
    ProfileFactory,
    ProfilingRequestFactory,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/profiling-requests/"


@pytest.fixture
def hosts(agent_hosts):
    """agent-host-a with an A100 (MIG capable, gpu0) and 6 CPU cores (cpu0)."""
    (host, other), agents = agent_hosts
    GpuFactory(host=host, index=0, mig_enabled=False)
    CpuFactory(host=host, index=0, cpu_cores=6)
    CpuFactory(host=other, index=0, cpu_cores=6)
    return (host, other), agents


@pytest.fixture
def variant(db):
    return ModelVariantFactory(name="mlp", artifact=ArtifactFactory())


def test_operator_creates_and_defaults_are_filled(clients, hosts, variant):
    (host, _), _ = hosts
    cpu = clients["operator"].post(URL, {"variant": variant.pk, "host": host.pk, "device": "cpu0"}, format="json")
    assert cpu.status_code == 201, cpu.content
    body = cpu.json()
    assert body["status"] == "pending" and body["progress"] == 0 and body["created_by"] is not None
    assert body["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64] and body["cpu_threads"] == [1, 2, 4]
    assert body["device_type"] == "cpu" and body["slice"] == "" and body["variant_name"] == "mlp"
    assert body["artifact"] == {"id": variant.artifact.pk, "sha256": variant.artifact.sha256, "size_bytes": 16,
                                "download": f"/api/v1/artifacts/{variant.artifact.pk}/download/"}
    mig = clients["operator"].post(URL, {"variant": variant.pk, "host": host.pk, "device": "gpu0", "placement": "MIG 3G.20GB@4",
                                         "batch_sizes": [8, 1]}, format="json")
    assert mig.status_code == 201, mig.content
    assert mig.json()["placement"] == "3g.20gb@4" and mig.json()["batch_sizes"] == [1, 8] and mig.json()["cpu_threads"] == []
    assert mig.json()["device_type"] == "A100-SXM4-40GB" and mig.json()["slice"] == "3g.20gb"
    whole = clients["operator"].post(URL, {"variant": variant.pk, "host": host.pk, "device": "gpu0"}, format="json")
    assert whole.json()["slice"] == "full"
    assert clients["viewer"].post(URL, {"variant": variant.pk, "host": host.pk, "device": "cpu0"}, format="json").status_code == 403
    assert clients["viewer"].get(URL).json()["count"] == 3
    assert clients["viewer"].get(f"{URL}?status=pending&device=gpu0").json()["count"] == 2
    assert clients["operator"].patch(f"{URL}{body['id']}/", {"device": "gpu0"}, format="json").status_code == 405
    assert clients["operator"].delete(f"{URL}{body['id']}/").status_code == 204


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"device": "gpu3"}, "device"),
        ({"device": "tpu0"}, "device"),
        ({"device": "cpu0", "placement": "1g.5gb@0"}, "placement"),
        ({"device": "gpu0", "placement": "3g.20gb@2"}, "placement"),
        ({"device": "gpu0", "cpu_threads": [2]}, "cpu_threads"),
        ({"device": "cpu0", "cpu_threads": [8]}, "cpu_threads"),
        ({"device": "cpu0", "batch_sizes": []}, "batch_sizes"),
        ({"device": "cpu0", "batch_sizes": [0, 2]}, "batch_sizes"),
        ({"device": "cpu0", "batch_sizes": [2, 2]}, "batch_sizes"),
        ({"device": "cpu0", "variant": "bare"}, "variant"),
    ],
)
def test_bad_request_is_refused(clients, hosts, variant, payload, field):
    (host, _), _ = hosts
    body = {"variant": variant.pk, "host": host.pk, **payload}
    if body["variant"] == "bare":
        body["variant"] = ModelVariantFactory().pk
    response = clients["operator"].post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"], response.content
    assert not ProfilingRequest.objects.exists()


def test_agent_reads_and_reports_only_its_own_hosts_requests(clients, hosts, variant):
    (host, other), (agent, other_agent) = hosts
    mine = ProfilingRequestFactory(host=host, variant=variant)
    theirs = ProfilingRequestFactory(host=other, variant=variant)
    listing = agent.get(URL).json()
    assert [r["id"] for r in listing["results"]] == [mine.pk]
    assert agent.get(f"{URL}{theirs.pk}/").status_code == 404
    assert other_agent.post(f"{URL}{mine.pk}/progress/", {"progress": 5}, format="json").status_code == 404
    assert clients["operator"].post(f"{URL}{mine.pk}/progress/", {"progress": 5}, format="json").status_code == 403
    assert agent.post(URL, {"variant": variant.pk, "host": host.pk, "device": "cpu0"}, format="json").status_code == 403
    assert agent.delete(f"{URL}{mine.pk}/").status_code == 403
    # The artifact of a pending or running request is the agent's to download; not once it is done.
    download = f"/api/v1/artifacts/{variant.artifact.pk}/download/"
    assert agent.get(download).status_code == 200

    first = agent.post(f"{URL}{mine.pk}/progress/", {"progress": 10, "log": "loading model"}, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "running" and first.json()["started"] and first.json()["progress"] == 10
    second = agent.post(f"{URL}{mine.pk}/progress/", {"progress": 50, "log": "batch 2 done\n"}, format="json").json()
    assert second["log"] == "loading model\nbatch 2 done\n"
    bad = agent.post(f"{URL}{mine.pk}/progress/", {"status": "succeeded"}, format="json")
    assert bad.status_code == 400
    failed = agent.post(f"{URL}{mine.pk}/progress/", {"status": "failed", "error": "onnxruntime: out of memory"}, format="json").json()
    assert failed["status"] == "failed" and failed["finished"] and failed["error"] == "onnxruntime: out of memory"
    late = agent.post(f"{URL}{mine.pk}/progress/", {"progress": 60}, format="json")
    assert late.status_code == 400 and "already failed" in late.json()["error"]["message"]
    assert agent.get(download).status_code == 404
    # The log is left out of the audit (it grows with every line); the status changes are there.
    change = ObjectChange.objects.filter(changed_object_type__model="profilingrequest", action="update").first()
    assert "log" not in change.postchange_data and change.actor_kind == "agent"


def point(batch, cores=2, **over):
    return {"device_type": "cpu", "slice": "", "cpu_cores": cores, "batch_size": batch, "latency_p50_ms": 1.0 * batch,
            "latency_p99_ms": 1.5 * batch, "memory_mb": 120, **over}


def test_results_become_measured_profiles(clients, hosts, variant):
    (host, _), (agent, _) = hosts
    request = ProfilingRequestFactory(host=host, variant=variant, batch_sizes=[1, 2, 4], cpu_threads=[1, 2])
    imported = ProfileFactory(variant=variant, device_type="cpu", slice="", cpu_cores=2, batch_size=4, latency_p50_ms=99, latency_p99_ms=120)
    ProfileFactory(variant=variant, device_type="cpu", slice="", cpu_cores=4, batch_size=4, latency_p50_ms=99, latency_p99_ms=120)
    response = agent.post(f"{URL}{request.pk}/results/", {"points": [point(1), point(4), point(1, cores=1, throughput_rps=900)], "log": "done"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["profiling_request"]["status"] == "succeeded" and body["profiling_request"]["progress"] == 100
    assert body["profiling_request"]["log"] == "done\n" and body["profiling_request"]["finished"]
    assert len(body["profiles"]) == 3
    measured = Profile.objects.filter(variant=variant, source="measured")
    assert measured.count() == 3
    assert all(p.measured_at and host.name in p.source_detail and f"profiling request {request.pk}" in p.source_detail for p in measured)
    imported.refresh_from_db()
    assert imported.source == "measured" and imported.latency_p50_ms == 4.0 and imported.throughput_rps == 1000.0
    assert measured.get(cpu_cores=1, batch_size=1).throughput_rps == 900
    assert Profile.objects.filter(variant=variant, source="imported").count() == 1  # the 4-core point is not touched
    again = agent.post(f"{URL}{request.pk}/results/", {"points": [point(2)]}, format="json")
    assert again.status_code == 400 and "already succeeded" in again.json()["error"]["message"]


@pytest.mark.parametrize(
    "points,needle",
    [
        ([point(8)], "batch_size 8"),
        ([point(1, cores=4)], "cpu_cores 4"),
        ([point(1, device_type="A100-SXM4-40GB", slice="full", cpu_cores=None)], "device_type"),
        ([point(1), point(1)], "twice"),
        ([point(2), point(1, latency_p99_ms=0.5)], "p99 latency cannot be below p50"),
        ([], "at least one"),
    ],
)
def test_bad_results_change_nothing(hosts, variant, points, needle):
    (host, _), (agent, _) = hosts
    request = ProfilingRequestFactory(host=host, variant=variant, batch_sizes=[1, 2, 4], cpu_threads=[1, 2])
    response = agent.post(f"{URL}{request.pk}/results/", {"points": points}, format="json")
    assert response.status_code == 400 and needle in str(response.json()["error"]), response.content
    assert not Profile.objects.exists()
    request.refresh_from_db()
    assert request.status == "pending" and request.progress == 0


def test_gpu_results_are_stored_under_the_catalogue_name(hosts, variant):
    (host, _), (agent, _) = hosts
    request = ProfilingRequestFactory(host=host, variant=variant, device="gpu0", placement="3g.20gb@4", cpu_threads=[], batch_sizes=[1, 8])
    points = [{"device_type": "NVIDIA A100-SXM4-40GB", "slice": "MIG 3g.20gb", "batch_size": b, "latency_p50_ms": 2.0 * b,
               "latency_p99_ms": 2.5 * b} for b in (1, 8)]
    response = agent.post(f"{URL}{request.pk}/results/", {"points": points}, format="json")
    assert response.status_code == 200, response.content
    assert sorted(Profile.objects.values_list("device_type", "slice", "cpu_cores", "batch_size")) == [
        ("A100-SXM4-40GB", "3g.20gb", None, 1), ("A100-SXM4-40GB", "3g.20gb", None, 8),
    ]
