"""Agents, runtimes and the router together with the control plane (a live server on the test database):
the demo's desired state is applied by real agents (simulated GPUs, the real CPU), reported back, metrics
flow, the router serves real inferences on the CPU application and labelled simulated ones on GPUs, and a
profiling request on the CPU yields measured profiles."""
from __future__ import annotations

import hashlib
import math
import threading
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from apps.deployments.models import HostDesiredState, Runtime
from apps.inventory.models import GpuInstance, Host, MpsPartition, RouterCredential
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.registry.models import ModelVariant, Profile, ProfilingRequest
from apps.telemetry.models import ApplicationSample, GpuSample, RuntimeSample
from controlplane.demo import demo_seed
from tests.waiting import wait_for
from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.client import ControlPlaneClient
from workers.profiler import profiling_request_run
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(live_server, tmp_path):
    demo_seed(admin_password="Admin-demo-pass-1")
    agents, threads = [], []
    tokens = {}
    hosts = {"sim-a100-01": "2xA100-SXM4-40GB", "sim-2080ti-01": "2xRTX-2080Ti", "sim-cpu-01": ""}
    for name, gpus in hosts.items():
        host = Host.objects.get(name=name)
        tokens[name] = host_agent_token_rotate(host=host)
        client = ControlPlaneClient(live_server.url, tokens[name])
        backend = SimulatedBackend(gpus=gpus, state_file=tmp_path / name / "gpus.json", seed=len(agents) + 1)
        agent = Agent(backend=backend, state_dir=tmp_path / name, client=client, metrics_s=0.5, drain_timeout_s=1.0)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        agents.append(agent)
        threads.append(thread)
    yield {"url": live_server.url, "tokens": tokens, "agents": dict(zip(hosts, agents))}
    for agent in agents:
        agent.stop(stop_runtimes=True)
    for thread in threads:
        thread.join(timeout=10)


def _post(url: str, body: dict) -> httpx.Response:
    """One query, asked again (up to 5 times) while the router refuses it at its deadline: this router runs in
    the test's process, sharing the interpreter with the live server and three agents, and on CI's two busy
    cores a 20 ms SLO can pass before it picks an instance. A refusal at the deadline is what the router
    promises under load; any other error, or a wrong answer, fails the test."""
    for _attempt in range(5):
        response = httpx.post(url, json=body, timeout=10)
        if response.status_code != 504 or '"deadline_exceeded"' not in response.text:
            return response
        time.sleep(0.05)
    return response


def test_agents_converge_report_and_serve_through_the_router(fleet) -> None:
    for name in ("sim-a100-01", "sim-2080ti-01", "sim-cpu-01"):
        wait_for(lambda: Host.objects.get(name=name).converged_version == 1, what=f"{name} to converge")
    host = Host.objects.get(name="sim-a100-01")
    assert host.status == "online" and host.backend == "simulated"
    # The MIG instances the demo declared are now reported by the agent, with simulated MIG uuids.
    instances = GpuInstance.objects.filter(accelerator__host=host)
    assert instances.count() == 5 and set(instances.values_list("state", flat=True)) == {"ready"}
    assert all(gi.uuid.startswith("MIG-sim-") for gi in instances)
    runtimes = Runtime.objects.filter(host__name__in=["sim-a100-01", "sim-cpu-01"])
    # Every runtime the desired states declare: 5 MIG instances and the CPU's (the heavy classifier only when its
    # latency, measured on this machine at seed time, fits the SLO: not on a busy machine).
    declared = sum(len(HostDesiredState.objects.filter(host__name=name).latest("version").spec["runtimes"])
                   for name in ("sim-a100-01", "sim-cpu-01"))
    assert declared >= 8 and runtimes.count() == declared and set(runtimes.values_list("state", flat=True)) == {"ready"}
    assert set(runtimes.filter(host__name="sim-cpu-01").values_list("simulated", flat=True)) == {False}
    assert set(runtimes.filter(host__name="sim-a100-01").values_list("simulated", flat=True)) == {True}
    assert host.operations.filter(action="mig.create", outcome="ok").count() == 5

    router, client = router_build(control_plane=fleet["url"], token=router_credential_issue(name="sim-cpu-01")[1])
    handle = router_start_in_thread(router)
    try:
        wait_for(lambda: router.refreshes > 0, what="the router's first tables")
        rng = np.random.default_rng(0)
        rows = rng.normal(size=(3, 8)).astype(np.float32)
        body = {"id": "q1", "inputs": [{"name": "input", "shape": [3, 8], "datatype": "FP32", "data": rows.ravel().tolist()}]}
        served_by = set()
        for _ in range(20):
            response = _post(f"{handle.url}/v1/infer/tabular-cpu", body)
            assert response.status_code == 200, response.text
            answer = response.json()
            variant = answer["parameters"]["variant"]
            served_by.add(variant)
            assert response.headers["X-Tessera-Variant"] == variant and answer["parameters"]["simulated"] is False
            # The same numbers onnxruntime gives on the variant's artifact: real inference. Its version is its number.
            artifact = ModelVariant.objects.get(application__name="tabular-cpu", name=variant).artifact
            assert answer["model_version"] == str(ModelVariant.objects.get(application__name="tabular-cpu", name=variant).pk)
            data = artifact.file.open("rb").read()
            assert hashlib.sha256(data).hexdigest() == artifact.sha256
            session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            expected = session.run(None, {"input": rows})
            for out, want in zip(answer["outputs"], expected):
                assert out["shape"] == list(want.shape)
                np.testing.assert_allclose(np.asarray(out["data"], dtype=np.float64).reshape(want.shape), want, rtol=1e-5, atol=1e-6)
        assert served_by <= {"linear", "random-features-256", "conv-features-80"} and served_by

        # The demo's pipeline, end to end on the real CPU: the classifier, then the calibrator on its answer.
        response = _post(f"{handle.url}/v1/pipelines/tabular-chain/infer", body)
        assert response.status_code == 200, response.text
        stages = dict(part.split("=") for part in response.headers["X-Tessera-Variant"].split(", "))
        assert list(stages) == ["tabular-cpu", "tabular-calibrate"] and stages["tabular-calibrate"] == "temperature"
        answer = response.json()
        assert answer["model_name"] == "tabular-calibrate" and answer["parameters"]["simulated"] is False

        def session_of(application: str, variant: str):
            artifact = ModelVariant.objects.get(application__name=application, name=variant).artifact
            return ort.InferenceSession(artifact.file.open("rb").read(), providers=["CPUExecutionProvider"])

        probabilities = session_of("tabular-cpu", stages["tabular-cpu"]).run(None, {"input": rows})[0]
        calibrated = session_of("tabular-calibrate", "temperature").run(None, {"probabilities": probabilities})[0]
        got = np.asarray(answer["outputs"][0]["data"], dtype=np.float64).reshape(calibrated.shape)
        np.testing.assert_allclose(got, calibrated, rtol=1e-5, atol=1e-6)
        assert (got.argmax(1) == probabilities.argmax(1)).all()  # calibration never changes the winning class

        # A GPU application: served by a simulated runtime, labelled so, with no outputs computed.
        response = _post(f"{handle.url}/v1/infer/classify-resnet", {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]})
        assert response.status_code == 200, response.text
        assert response.json()["parameters"]["simulated"] is True

        # The MPS host (gpulets): its partitions reported ready, one runtime per model time-sharing one, and
        # the router reaches a model on a partition (simulated, labelled so).
        mps_host = Host.objects.get(name="sim-2080ti-01")
        partitions = MpsPartition.objects.filter(accelerator__host=mps_host)
        assert sorted(p.slot for p in partitions) == ["mps40@1", "mps50@0", "mps50@1", "mps60@0"]
        assert set(partitions.values_list("state", flat=True)) == {"ready"}
        mps_runtimes = Runtime.objects.filter(host=mps_host)
        assert mps_runtimes.count() == 6 and set(mps_runtimes.values_list("state", flat=True)) == {"ready"}
        assert mps_host.operations.filter(action="mps.mode", outcome="ok").count() == 2
        mps_instances = {f"sim-2080ti-01/{key}" for key in mps_runtimes.values_list("key", flat=True)}
        answered_by = set()
        for _ in range(300):
            response = _post(f"{handle.url}/v1/infer/classify-vgg", {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]})
            assert response.status_code == 200, response.text
            answered_by.add(response.json()["parameters"]["instance"])
            if answered_by & mps_instances:
                break
        assert answered_by & mps_instances, answered_by

        # Router reports and agent metrics reach the control plane every second.
        wait_for(lambda: ApplicationSample.objects.filter(application__name="tabular-cpu", served__gt=0).exists(), what="router reports")
        wait_for(lambda: RuntimeSample.objects.filter(host__name="sim-cpu-01", served__gt=0).exists(), what="runtime samples")
        assert GpuSample.objects.filter(host__name="sim-a100-01", simulated=True).exists()
        assert Host.objects.get(name="sim-cpu-01").last_seen is not None
    finally:
        handle.stop()
        client.close()


def test_profiling_request_on_the_real_cpu_posts_measured_profiles(fleet) -> None:
    variant = ModelVariant.objects.get(application__name="tabular-cpu", name="linear")
    host = Host.objects.get(name="sim-cpu-01")
    request = ProfilingRequest.objects.create(variant=variant, host=host, device="cpu0", batch_sizes=[1, 4], cpu_threads=[1])
    agent = fleet["agents"]["sim-cpu-01"]
    listed = agent.client.profiling_requests("pending")
    assert [r["id"] for r in listed] == [request.pk]
    before = {p.batch_size: p.measured_at for p in Profile.objects.filter(variant=variant, device_type="cpu", cpu_cores=1)}
    points = profiling_request_run(listed[0], client=agent.client, backend=agent.backend, cache_dir=agent.state_dir / "artifacts")
    assert [p["batch_size"] for p in points] == [1, 4]
    request.refresh_from_db()
    assert request.status == "succeeded" and request.progress == 100 and "batch 4" in request.log
    for batch in (1, 4):
        row = Profile.objects.get(variant=variant, device_type="cpu", cpu_cores=1, batch_size=batch)
        assert row.source == "measured" and row.measured_at > before[batch] and row.latency_p99_ms >= row.latency_p50_ms > 0

    # A simulated GPU cannot be profiled: the request fails and says why.
    gpu_variant = ModelVariant.objects.filter(application__name="classify-resnet").first()
    gpu_host = Host.objects.get(name="sim-a100-01")
    failing = ProfilingRequest.objects.create(variant=gpu_variant, host=gpu_host, device="gpu0", placement="3g.20gb@4")
    gpu_agent = fleet["agents"]["sim-a100-01"]
    listed = [r for r in gpu_agent.client.profiling_requests("pending") if r["id"] == failing.pk]
    profiling_request_run(listed[0], client=gpu_agent.client, backend=gpu_agent.backend, cache_dir=gpu_agent.state_dir / "artifacts")
    failing.refresh_from_db()
    assert failing.status == "failed" and ("simulated" in failing.error or "artifact" in failing.error)


def test_triton_s_client_talks_to_the_fleet_and_its_load_and_unload_reach_the_control_plane(fleet) -> None:
    """tritonclient against the router of the demo fleet: the model's metadata comes from the registry, JSON
    and binary inferences are onnxruntime's numbers on the routed variant's artifact, and the repository
    extension's unload and load release and pin the application through the control plane with the router's
    credential (refused while the credential is not allowed to)."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    from apps.registry.models import Application

    wait_for(lambda: Host.objects.get(name="sim-cpu-01").converged_version == 1, what="sim-cpu-01 to converge")
    router, _ = router_build(control_plane=fleet["url"], token=router_credential_issue(name="oip-router")[1])
    handle = router_start_in_thread(router)
    try:
        client = triton.InferenceServerClient(handle.url.removeprefix("http://"), network_timeout=30.0)
        wait_for(lambda: client.is_model_ready("tabular-cpu"), what="tabular-cpu to be ready at the router")
        metadata = client.get_model_metadata("tabular-cpu")
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
        rows = np.random.default_rng(3).normal(size=(4, 8)).astype(np.float32)
        for binary in (False, True):
            inp = triton.InferInput("input", [4, 8], "FP32")
            inp.set_data_from_numpy(rows, binary_data=binary)
            result = client.infer("tabular-cpu", [inp], outputs=[triton.InferRequestedOutput(metadata["outputs"][0]["name"], binary_data=binary)])
            artifact = ModelVariant.objects.get(pk=int(result.get_response()["model_version"])).artifact  # the version: its number
            expected = ort.InferenceSession(artifact.file.open("rb").read(), providers=["CPUExecutionProvider"]).run(None, {"input": rows})[0]
            np.testing.assert_allclose(result.as_numpy(metadata["outputs"][0]["name"]), expected, rtol=1e-5, atol=1e-6)

        with pytest.raises(InferenceServerException) as refused:
            client.unload_model("tabular-cpu")
        assert refused.value.status() == "403" and not Application.objects.get(name="tabular-cpu").released
        credential = RouterCredential.objects.get(name="oip-router")  # an admin allows it (the admin's form does this)
        credential.may_load_models = True
        credential.save()
        client.unload_model("tabular-cpu")
        assert Application.objects.get(name="tabular-cpu").released
        assert not client.is_model_ready("tabular-cpu")  # the router refreshed its tables: no routes left
        inp = triton.InferInput("input", [4, 8], "FP32")
        inp.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as gone:
            client.infer("tabular-cpu", [inp])
        assert gone.value.status() == "503"
        client.load_model("tabular-cpu")
        assert not Application.objects.get(name="tabular-cpu").released
    finally:
        handle.stop()


# Alone under xdist (tests/conftest.py): every query must meet the demo's SLO (25 ms, or 3x the slowest member's
# measured 32-row batch on a slower machine) on real onnxruntime
# members, which the other worker's tests on the same two cores made it miss once in CI.
@pytest.mark.solo
def test_the_demo_ensemble_is_served_by_the_learned_scheduler_and_its_frequencies_and_p99_reach_the_dashboard(fleet, client) -> None:
    """Issue 20's "done when": the demo's four-member ensemble, each query answered by the members the shipped
    learned policy draws, combined by the soft vote weighted by held-out accuracy (checked against
    onnxruntime on each member's artifact); the routers' counts reach the control plane, and the Policies
    page shows the sampling frequencies and the p99."""
    from django.contrib.auth import get_user_model

    from apps.policies.models import EnsemblePolicy
    from engine.ensembles.vote import ensemble_vote

    wait_for(lambda: Host.objects.get(name="sim-cpu-01").converged_version == 1, what="sim-cpu-01 to converge")
    # The SLO scaled to what the demo measured on this machine: 25 ms holds the members' 32-row batches on an idle
    # machine of the usual speed; one fresh-clone run on a slower one had no member answer a query in time (504).
    # The test is about the scheduler, the vote and the counts, not this machine's speed.
    from apps.policies.models import SloPolicy
    from apps.registry.models import Profile

    slowest = max(Profile.objects.filter(variant__application__name="tabular-ensemble", device_type="cpu", cpu_cores=1, batch_size=32)
                  .values_list("latency_p99_ms", flat=True), default=0.0)
    slo_ms = float(max(25, math.ceil(3 * slowest)))
    SloPolicy.objects.filter(application__name="tabular-ensemble").update(latency_p99_ms=slo_ms)
    router, rclient = router_build(control_plane=fleet["url"], token=router_credential_issue(name="ensemble-router")[1])
    handle = router_start_in_thread(router)
    try:
        wait_for(lambda: "tabular-ensemble" in router.tables.apps and router.tables.apps["tabular-ensemble"].ensemble is not None,
                 what="the ensemble's table at the router")
        ensemble = router.tables.apps["tabular-ensemble"].ensemble
        assert ensemble.scheduler_note == "learned (demo-ensemble)"
        members = {v.name: v for v in ModelVariant.objects.filter(application__name="tabular-ensemble").select_related("artifact")}
        sessions = {name: ort.InferenceSession(v.artifact.file.open("rb").read(), providers=["CPUExecutionProvider"]) for name, v in members.items()}
        weights = {m.variant.name: m.weight for m in EnsemblePolicy.objects.get(application__name="tabular-ensemble").members.select_related("variant")}
        rng = np.random.default_rng(5)
        seen_sizes = set()
        late = []
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            for i in range(120):
                rows = int(rng.choice([1, 2, 8, 32]))
                x = rng.normal(size=(rows, 8)).astype(np.float32)
                body = {"id": f"e{i}", "inputs": [{"name": "input", "shape": [rows, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
                answer = http.post("/v2/models/tabular-ensemble/infer", json=body)
                if answer.status_code == 504 and answer.headers.get("X-Tessera-Error-Code") == "deadline_exceeded":
                    # Refused rather than late: the deadline rule at work. A query in time is this machine's latency,
                    # measured by benches. Stalls of the shared cores (the Celery workers, agents and runtimes run beside
                    # this test) made one of 120 miss 25 ms in CI, and four on a slower CI machine.
                    late.append(answer.text)
                    continue
                assert answer.status_code == 200, answer.text
                doc = answer.json()
                voted = doc["parameters"]["ensemble"]["voted"]
                assert doc["parameters"]["ensemble"]["scheduler"] == "learned (demo-ensemble)" and 1 <= len(voted) <= 4
                seen_sizes.add(len(voted))
                expected = ensemble_vote({m: sessions[m].run(None, {"input": x})[0] for m in voted}, weights, "soft").scores
                (output,) = doc["outputs"]
                np.testing.assert_allclose(np.asarray(output["data"], dtype=np.float32).reshape(output["shape"]), expected, rtol=1e-5, atol=1e-6)
        assert len(seen_sizes) >= 2  # random per query
        # Nearly all in time (at most one in ten refused at the deadline), and so enough answered to check the vote.
        assert len(late) <= 12, late
        wait_for(lambda: ApplicationSample.objects.filter(application_name="tabular-ensemble", ensembles__isnull=False).exists(),
                 what="the router's ensemble counts at the control plane")
        wait_for(lambda: sum(s.arrivals for s in ApplicationSample.objects.filter(application_name="tabular-ensemble")) >= 120,
                 what="every query counted")
    finally:
        handle.stop()
        rclient.close()
    client.force_login(get_user_model().objects.get(username="viewer"))
    page = client.get("/policies/").content.decode()
    assert "tabular-ensemble" in page and "data-ensemble-frequencies" in page and "queries in the last" in page
    assert "randomness bias" in page and "learned (demo-ensemble)" in page
    assert "data-p99" in page and f"(SLO {slo_ms:g} ms)" in page
