"""Profiling jobs: `POST /api/v1/variants/{id}/profile/` finds the agents that can measure a variant, asks
them (profiling requests) and follows them in a `profiling` job; profiling policies do the same for new
variants. The agents are simulated by calling the registry services they reach through the API."""
import logging
import time

import pytest
from celery.exceptions import Retry
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from apps.inventory.choices import GpuInstanceStateChoices, HostBackendChoices, HostStatusChoices
from apps.inventory.models import Host
from apps.jobs.models import Job
from apps.policies.models import ProfilingPolicy
from apps.registry.models import ProfilingRequest
from apps.registry.services.profiling import profiling_request_progress, profiling_results_record
from apps.registry.tasks import profiling_job_task
from tests.factories import (
    ArtifactFactory,
    CpuFactory,
    GpuFactory,
    GpuInstanceFactory,
    HostFactory,
    ModelVariantFactory,
)
from tests.onnx_builders import onnx_mlp_bytes

pytestmark = pytest.mark.django_db

ONLINE = HostStatusChoices.ONLINE


@pytest.fixture
def fleet(db):
    """As the demo: an online CPU host and an online host of simulated GPUs (an A100 with MIG and a ready
    3g.20gb instance, and a whole A100). Both hosts run the simulated backend; a CPU computes for real
    there, a simulated GPU does not."""
    cpu_host = HostFactory(name="sim-cpu-01", status=ONLINE)
    CpuFactory(host=cpu_host, index=0, cpu_cores=8)
    gpu_host = HostFactory(name="sim-gpu-01", status=ONLINE)
    CpuFactory(host=gpu_host, index=0, cpu_cores=4)
    mig = GpuFactory(host=gpu_host, index=0, mig_enabled=True)
    GpuInstanceFactory(accelerator=mig, profile="3g.20gb", placement_start=4, state=GpuInstanceStateChoices.READY)
    GpuFactory(host=gpu_host, index=1, mig_enabled=False)
    return cpu_host, gpu_host


@pytest.fixture
def real_gpu_host(db):
    """An online host with real A100s: gpu0 whole, gpu1 with MIG and a ready 3g.20gb instance at 4."""
    host = HostFactory(name="gpu-real-01", status=ONLINE, backend=HostBackendChoices.NVML)
    GpuFactory(host=host, index=0, mig_enabled=False)
    mig = GpuFactory(host=host, index=1, mig_enabled=True)
    GpuInstanceFactory(accelerator=mig, profile="3g.20gb", placement_start=4, state=GpuInstanceStateChoices.READY)
    return host


@pytest.fixture
def variant(db):
    return ModelVariantFactory(name="mlp", artifact=ArtifactFactory())


def _url(variant) -> str:
    return f"/api/v1/variants/{variant.pk}/profile/"


def _profile(clients, variant, body=None):
    return clients["operator"].post(_url(variant), body or {}, format="json")


def _point(pr: ProfilingRequest, **over) -> dict:
    return {"device_type": pr.profile_device_type, "slice": pr.profile_slice, "cpu_cores": pr.cpu_threads[0] if pr.cpu_threads else None,
            "batch_size": pr.batch_sizes[0], "latency_p50_ms": 2.0, "latency_p99_ms": 3.0, **over}


def _run(job_id: int) -> Job:
    profiling_job_task.delay(job_id)  # eager in tests: one attempt, one look at the requests
    return Job.objects.get(pk=job_id)


def test_cpu_profiling_makes_one_request_on_the_cpu_host(clients, fleet, variant):
    cpu_host, gpu_host = fleet
    response = _profile(clients, variant, {"device_types": ["cpu"], "batch_sizes": [1, 4], "cpu_threads": [1, 2]})
    assert response.status_code == 202, response.content
    body = response.json()
    assert len(body["profiling_requests"]) == 1 and body["skipped"] == []
    pr = ProfilingRequest.objects.get(pk=body["profiling_requests"][0])
    # The host with the most cores (and no open requests) measures it.
    assert (pr.host, pr.device, pr.placement, pr.batch_sizes, pr.cpu_threads) == (cpu_host, "cpu0", "", [1, 4], [1, 2])
    job = body["job"]
    assert job["kind"] == "profiling" and job["status"] == "pending" and job["actor"] == "operator"
    assert pr.job_id == job["id"] and pr.created_by.username == "operator"
    assert {(t["type"], t["id"]) for t in job["targets"]} == {("registry.modelvariant", variant.pk), ("registry.profilingrequest", pr.pk)}
    assert job["params"]["device_types"] == ["cpu"] and job["params"]["timeout_s"] == 1800
    assert job["params"]["profiling_requests"] == [pr.pk]
    assert "request" in job["log"] and "sim-cpu-01/cpu0" in job["log"]
    # The request carries its job, for the API's readers.
    listed = clients["viewer"].get(f"/api/v1/profiling-requests/?job={job['id']}").json()
    assert [r["id"] for r in listed["results"]] == [pr.pk] and listed["results"][0]["job"] == job["id"]


def test_gpus_only_on_simulated_hosts_are_refused(clients, fleet, variant):
    response = _profile(clients, variant, {"device_types": ["A100-SXM4-40GB"]})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "device_types" in error["fields"] and "simulated" in error["message"] and "sim-gpu-01" in error["message"]
    assert not ProfilingRequest.objects.exists() and not Job.objects.exists()
    # An unknown model, and no host online at all, say so too.
    unknown = _profile(clients, variant, {"device_types": ["H100-SXM5-80GB"]})
    assert unknown.status_code == 400 and "no H100-SXM5-80GB GPU in the inventory" in unknown.json()["error"]["message"]
    Host.objects.update(status=HostStatusChoices.OFFLINE)
    offline = _profile(clients, variant, {"device_types": ["cpu"]})
    assert offline.status_code == 400 and "sim-cpu-01 offline" in offline.json()["error"]["message"]


def test_by_default_every_type_on_the_fleet_and_simulated_gpus_are_left_out(clients, fleet, variant):
    response = _profile(clients, variant)
    assert response.status_code == 202, response.content
    body = response.json()
    requests = ProfilingRequest.objects.filter(pk__in=body["profiling_requests"])
    assert [(r.host.name, r.device) for r in requests] == [("sim-cpu-01", "cpu0")]
    assert {(s["device_type"], s["slice"]) for s in body["skipped"]} == {("A100-SXM4-40GB", "full"), ("A100-SXM4-40GB", "3g.20gb")}
    assert all("simulated GPUs compute nothing" in s["reason"] for s in body["skipped"])
    assert "left out A100-SXM4-40GB/full: only on simulated hosts" in body["job"]["log"]
    assert body["job"]["params"]["skipped"] == body["skipped"]


def test_gpu_slices_on_a_real_host(clients, fleet, real_gpu_host, variant):
    response = _profile(clients, variant, {"device_types": ["nvidia a100-sxm4-40gb"], "slices": ["full", "MIG 3G.20GB", "1g.5gb", "9g.99gb"]})
    assert response.status_code == 202, response.content
    body = response.json()
    made = {(r.host.name, r.device, r.placement, r.profile_slice) for r in ProfilingRequest.objects.filter(pk__in=body["profiling_requests"])}
    assert made == {("gpu-real-01", "gpu0", "", "full"), ("gpu-real-01", "gpu1", "3g.20gb@4", "3g.20gb")}
    reasons = {s["slice"]: s["reason"] for s in body["skipped"]}
    assert "no online A100-SXM4-40GB has a ready 1g.5gb MIG instance" in reasons["1g.5gb"]
    assert "is not a MIG profile of A100-SXM4-40GB" in reasons["9g.99gb"]
    assert all(r.cpu_threads == [] for r in ProfilingRequest.objects.all())


def test_variant_without_artifact_and_bad_bodies(clients, fleet):
    bare = ModelVariantFactory()
    response = _profile(clients, bare, {"device_types": ["cpu"]})
    assert response.status_code == 400 and "has no artifact" in response.json()["error"]["message"]
    variant = ModelVariantFactory(artifact=ArtifactFactory())
    assert _profile(clients, variant, {"batch_sizes": [0]}).status_code == 400
    assert _profile(clients, variant, {"device_types": "cpu"}).status_code == 400
    too_many = _profile(clients, variant, {"device_types": ["cpu"], "cpu_threads": [16]})
    assert too_many.status_code == 400 and "16 cores" in too_many.json()["error"]["message"]
    assert not Job.objects.exists()


def test_permissions(clients, agent_hosts, fleet, variant):
    _, (agent, _) = agent_hosts
    assert clients["viewer"].post(_url(variant), {}, format="json").status_code == 403
    assert agent.post(_url(variant), {}, format="json").status_code == 403
    assert clients["anonymous"].post(_url(variant), {}, format="json").status_code in (401, 403)
    assert clients["operator"].post("/api/v1/variants/424242/profile/", {}, format="json").status_code == 404
    assert not ProfilingRequest.objects.exists()


def test_job_follows_its_requests_to_success(clients, fleet, real_gpu_host, variant, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # as in production: the task is queued on commit
        response = _profile(clients, variant, {"device_types": ["cpu", "A100-SXM4-40GB"], "slices": ["full"], "batch_sizes": [1, 2]})
    assert response.status_code == 202, response.content
    body = response.json()
    job_id = body["job"]["id"]
    job = Job.objects.get(pk=job_id)
    assert job.status == "running" and job.attempts == 1  # its first attempt looked once on commit, and returned
    cpu, gpu = (ProfilingRequest.objects.get(pk=pk) for pk in body["profiling_requests"])
    assert (cpu.device, gpu.device) == ("cpu0", "gpu0")

    profiling_request_progress(profiling_request=cpu, progress=50, log_line="batch 1 done")
    job = _run(job_id)
    assert job.status == "running" and job.progress == 25 and "sim-cpu-01/cpu0: running 50%" in job.log
    job = _run(job_id)  # nothing changed: no new line
    assert job.log.count("running 50%") == 1

    profiling_results_record(profiling_request=cpu, points=[_point(cpu)])
    profiling_request_progress(profiling_request=gpu, progress=10)
    job = _run(job_id)
    assert job.status == "running" and job.progress == 55 and "sim-cpu-01/cpu0: succeeded" in job.log
    profiling_results_record(profiling_request=gpu, points=[_point(gpu)])
    job = _run(job_id)
    assert job.status == "succeeded" and job.progress == 100 and job.finished is not None
    assert job.result == {"profiling_requests": 2, "succeeded": [cpu.pk, gpu.pk], "failed": []}
    assert variant.profiles.filter(source="measured").count() == 2
    # A re-delivered task finds the job finished and does nothing; it never makes requests itself.
    log, attempts = job.log, job.attempts
    job = _run(job_id)
    assert (job.status, job.log, job.attempts) == ("succeeded", log, attempts)
    assert ProfilingRequest.objects.count() == 2
    assert clients["viewer"].get(f"/api/v1/jobs/{job_id}/").json()["status"] == "succeeded"


def test_agents_reports_move_the_job_on_without_a_worker(clients, fleet, variant, django_capture_on_commit_callbacks):
    """Embedded services (tasks in-process): no worker polls, so the agents' reports move the job on."""
    response = _profile(clients, variant, {"device_types": ["cpu"], "batch_sizes": [1]})
    job_id = response.json()["job"]["id"]
    pr = ProfilingRequest.objects.get(pk=response.json()["profiling_requests"][0])
    with django_capture_on_commit_callbacks(execute=True):
        profiling_request_progress(profiling_request=pr, progress=40)
    job = Job.objects.get(pk=job_id)
    assert job.progress == 40 and "running 40%" in job.log
    with django_capture_on_commit_callbacks(execute=True):
        profiling_results_record(profiling_request=pr, points=[_point(pr)])
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded" and job.progress == 100


def test_failed_requests_are_noted_and_all_failed_fails_the_job(clients, fleet, real_gpu_host, variant):
    body = _profile(clients, variant, {"device_types": ["cpu", "A100-SXM4-40GB"], "slices": ["full"]}).json()
    cpu, gpu = (ProfilingRequest.objects.get(pk=pk) for pk in body["profiling_requests"])
    profiling_request_progress(profiling_request=gpu, status="failed", error="onnxruntime: CUDA out of memory")
    profiling_results_record(profiling_request=cpu, points=[_point(cpu)])
    job = _run(body["job"]["id"])
    assert job.status == "succeeded" and job.result["succeeded"] == [cpu.pk]
    assert "CUDA out of memory" in job.result["failed"][0] and "1 of 2 request(s) succeeded" in job.log

    again = _profile(clients, variant, {"device_types": ["cpu"]}).json()
    pr = ProfilingRequest.objects.get(pk=again["profiling_requests"][0])
    profiling_request_progress(profiling_request=pr, status="failed", error="artifact download failed")
    job = _run(again["job"]["id"])
    assert job.status == "failed" and "every profiling request failed" in job.error and "artifact download failed" in job.error


def test_timeout_fails_open_requests_and_the_job(clients, fleet, real_gpu_host, variant):
    body = _profile(clients, variant, {"device_types": ["cpu", "A100-SXM4-40GB"], "slices": ["full"], "timeout_s": 60}).json()
    job_id = body["job"]["id"]
    cpu, gpu = (ProfilingRequest.objects.get(pk=pk) for pk in body["profiling_requests"])
    profiling_results_record(profiling_request=cpu, points=[_point(cpu)])
    profiling_request_progress(profiling_request=gpu, progress=30)
    job = _run(job_id)
    assert job.status == "running"
    Job.objects.filter(pk=job_id).update(created=timezone.now() - timezone.timedelta(seconds=61))
    job = _run(job_id)
    gpu.refresh_from_db()
    assert gpu.status == "failed" and "timed out" in gpu.error and gpu.finished is not None
    assert job.status == "failed" and "timed out after 60 s" in job.error and "1 of 2 request(s) succeeded" in job.error
    assert variant.profiles.count() == 1  # what did finish is kept
    # The agent's late report is refused: the request is finished.
    with pytest.raises(Exception, match="already failed"):
        profiling_request_progress(profiling_request=gpu, progress=90)


def test_a_withdrawn_request_counts_as_failed(clients, fleet, variant):
    body = _profile(clients, variant, {"device_types": ["cpu"]}).json()
    assert clients["operator"].delete(f"/api/v1/profiling-requests/{body['profiling_requests'][0]}/").status_code == 204
    job = _run(body["job"]["id"])
    assert job.status == "failed" and "withdrawn" in job.error


def test_worker_attempts_are_bounded_and_rescheduled(clients, fleet, variant, settings, monkeypatch):
    """With a worker, an attempt follows for at most its budget, then re-schedules itself; the next
    attempt carries on from the checkpoint and does not repeat the log."""
    settings.TESSERA_PROFILING_JOB_ATTEMPT_S = 0.05
    settings.TESSERA_PROFILING_JOB_POLL_S = 0.01
    body = _profile(clients, variant, {"device_types": ["cpu"]}).json()
    job_id = body["job"]["id"]
    pr = ProfilingRequest.objects.get(pk=body["profiling_requests"][0])
    profiling_request_progress(profiling_request=pr, progress=20)
    scheduled = []

    def retry(*args, **kwargs):
        scheduled.append(kwargs.get("countdown"))
        raise Retry("re-scheduled")

    monkeypatch.setattr(profiling_job_task, "retry", retry)
    for attempt in (1, 2):
        profiling_job_task.push_request(id=f"attempt-{attempt}", retries=attempt - 1, is_eager=False, called_directly=False)
        try:
            with pytest.raises(Retry):
                profiling_job_task.run(job_id)
        finally:
            profiling_job_task.pop_request()
    assert scheduled == [0.01, 0.01]
    job = Job.objects.get(pk=job_id)
    assert job.status == "running" and job.attempts == 2 and job.log.count("running 20%") == 1
    assert "resuming from its checkpoint" in job.log and ProfilingRequest.objects.count() == 1
    profiling_results_record(profiling_request=pr, points=[_point(pr)])
    profiling_job_task.push_request(id="attempt-3", retries=2, is_eager=False, called_directly=False)
    try:
        result = profiling_job_task.run(job_id)
    finally:
        profiling_job_task.pop_request()
    assert result["succeeded"] == [pr.pk] and Job.objects.get(pk=job_id).status == "succeeded"


def test_in_process_thread_follows_until_the_timeout(clients, fleet, real_gpu_host, variant, settings):
    """Embedded services with the in-process thread: the one attempt follows the requests there (polling)
    until they finish or the job times out."""
    settings.TESSERA_JOBS_IN_THREAD = True
    settings.TESSERA_PROFILING_JOB_POLL_S = 0.05
    body = _profile(clients, variant, {"device_types": ["cpu", "A100-SXM4-40GB"], "slices": ["full"], "timeout_s": 1}).json()
    cpu, gpu = (ProfilingRequest.objects.get(pk=pk) for pk in body["profiling_requests"])
    profiling_results_record(profiling_request=cpu, points=[_point(cpu)])
    profiling_request_progress(profiling_request=gpu, progress=30)
    started = time.monotonic()
    profiling_job_task.apply(args=[body["job"]["id"]])  # what job_enqueue's thread runs
    assert 0.5 < time.monotonic() - started < 5
    job = Job.objects.get(pk=body["job"]["id"])
    assert job.status == "failed" and job.attempts == 1 and "timed out after 1 s" in job.error


# --------------------------------------------------------------------------- profiling policies


def _upload_and_create_variant(client, name="mlp-auto"):
    upload = client.post("/api/v1/artifacts/", {"file": SimpleUploadedFile("mlp.onnx", onnx_mlp_bytes())}, format="multipart")
    assert upload.status_code == 201, upload.content
    application = ModelVariantFactory().application
    return client.post("/api/v1/variants/", {"application": application.pk, "name": name, "accuracy": 0.8, "accuracy_metric": "top-1",
                                             "artifact": upload.json()["id"]}, format="json")


def test_profiling_policy_api(clients):
    url = "/api/v1/profiling-policies/"
    created = clients["operator"].post(url, {"name": "default", "device_types": ["cpu"], "batch_sizes": [4, 1], "timeout_s": 600}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["batch_sizes"] == [1, 4] and created.json()["auto_profile_new_variants"] is True
    for bad, field in (({"batch_sizes": [0]}, "batch_sizes"), ({"device_types": "cpu"}, "device_types"), ({"timeout_s": 1}, "timeout_s"),
                       ({"cpu_threads": [2, 2]}, "cpu_threads")):
        response = clients["operator"].post(url, {"name": "bad", **bad}, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"], response.content
    assert clients["viewer"].get(url).json()["count"] == 1
    assert clients["viewer"].post(url, {"name": "v"}, format="json").status_code == 403
    assert clients["operator"].patch(f"{url}{created.json()['id']}/", {"enabled": False}, format="json").status_code == 200


def test_upload_with_the_policy_on_profiles_the_new_variant(clients, fleet, django_capture_on_commit_callbacks):
    ProfilingPolicy.objects.create(name="new-variants", device_types=["cpu"], batch_sizes=[1, 2], timeout_s=900)
    ProfilingPolicy.objects.create(name="off", enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        response = _upload_and_create_variant(clients["operator"])
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert job.kind == "profiling" and job.actor_name == "profiling policy new-variants" and job.actor.username == "operator"
    assert job.params["timeout_s"] == 900 and job.status == "running"
    pr = ProfilingRequest.objects.get()
    assert (pr.variant_id, pr.host.name, pr.device, pr.batch_sizes, pr.job_id) == (response.json()["id"], "sim-cpu-01", "cpu0", [1, 2], job.pk)


def test_variant_given_its_artifact_later_is_profiled(clients, fleet, django_capture_on_commit_callbacks):
    ProfilingPolicy.objects.create(name="new-variants", device_types=["cpu"])
    variant = ModelVariantFactory()
    with django_capture_on_commit_callbacks(execute=True):
        response = clients["operator"].patch(f"/api/v1/variants/{variant.pk}/", {"artifact": ArtifactFactory().pk}, format="json")
        assert response.status_code == 200, response.content
        clients["operator"].patch(f"/api/v1/variants/{variant.pk}/", {"description": "same artifact"}, format="json")
    assert Job.objects.count() == 1 and ProfilingRequest.objects.get().variant == variant


def test_policy_skips_quietly_when_no_agent_can_profile(clients, fleet, django_capture_on_commit_callbacks, caplog):
    ProfilingPolicy.objects.create(name="gpus", device_types=["A100-SXM4-40GB"])
    with caplog.at_level(logging.INFO, logger="apps.registry.services.profiling"), django_capture_on_commit_callbacks(execute=True):
        response = _upload_and_create_variant(clients["operator"])
    assert response.status_code == 201
    assert not Job.objects.exists() and not ProfilingRequest.objects.exists()
    assert "profiling policy gpus: not profiling" in caplog.text and "simulated" in caplog.text


def test_no_policy_no_profiling(clients, fleet, django_capture_on_commit_callbacks):
    ProfilingPolicy.objects.create(name="manual", auto_profile_new_variants=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert _upload_and_create_variant(clients["operator"]).status_code == 201
    assert not Job.objects.exists()
