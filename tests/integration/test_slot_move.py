"""Issue 16, the worst defect: a slot that served classify-resnet is given to classify-mobile while both
applications take traffic through a real router, with a real agent (simulated A100s) and the live control
plane. Through both paths, an operator's direct desired-state write and a plan rollout that reuses the
runtime key for the other application, not one query is answered by the wrong model."""
from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
from django.contrib.auth import get_user_model

from apps.deployments.models import HostDesiredState, RoutingTable, Runtime
from apps.deployments.services import host_desired_state_latest
from apps.inventory.models import Host
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.planning.choices import PlanStatusChoices
from apps.planning.models import Plan
from apps.planning.rollout import plan_apply, plan_approve
from apps.registry.models import Application, ModelVariant
from apps.users.services import token_create
from controlplane.demo import demo_seed
from tests.waiting import wait_for
from workers.agent.agent import Agent
from workers.agent.backends.simulated import SimulatedBackend
from workers.client import ControlPlaneClient
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

RESNET, MOBILE = "classify-resnet", "classify-mobile"
HOST = "sim-a100-01"
QUERY = {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}
PROFILE = [{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 4.0}]


class Traffic:
    """One thread per application posting queries to the router; `answers[application]` counts (status,
    model that answered) and `wrong` lists the answers from another model."""

    def __init__(self, url: str, applications: tuple[str, ...]) -> None:
        self.url = url
        self.answers = {a: Counter() for a in applications}
        self.wrong: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(a,), daemon=True) for a in applications]

    def _run(self, application: str) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                response = client.post(f"/v1/infer/{application}", json=QUERY)
                model = response.json().get("model_name") if response.status_code == 200 else None
                self.answers[application][(response.status_code, model)] += 1
                if response.status_code == 200 and model != application:
                    self.wrong.append((application, model))
                time.sleep(0.01)

    def served(self, application: str) -> int:
        return self.answers[application][(200, application)]

    def __enter__(self) -> "Traffic":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)


@pytest.fixture
def dataplane(live_server, tmp_path):
    """The demo seeded; a real agent for sim-a100-01 (two simulated A100s, its MIG slots serving the GPU
    applications) converged on version 1; a router that follows the live control plane and reports to it."""
    demo_seed(admin_password="Admin-demo-pass-1")
    host = Host.objects.get(name=HOST)
    client = ControlPlaneClient(live_server.url, host_agent_token_rotate(host=host))
    backend = SimulatedBackend(gpus="2xA100-SXM4-40GB", state_file=tmp_path / HOST / "gpus.json", seed=3)
    agent = Agent(backend=backend, state_dir=tmp_path / HOST, client=client, metrics_s=0.5, drain_timeout_s=1.0)
    agent_thread = threading.Thread(target=agent.run, daemon=True)
    agent_thread.start()
    router, router_client = router_build(control_plane=live_server.url, token=router_credential_issue(name="slot-move-router")[1])
    handle = router_start_in_thread(router)
    _, secret = token_create(user=get_user_model().objects.get(username="operator"), description="slot move test")
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=120)
    try:
        wait_for(lambda: Host.objects.get(pk=host.pk).converged_version == 1, 120, f"{HOST} on version 1")
        wait_for(lambda: router.refreshes > 0, 30, "the router's first tables")
        yield {"host": host, "router": handle, "api": api}
    finally:
        api.close()
        handle.stop()
        router_client.close()
        agent.stop(stop_runtimes=True)
        agent_thread.join(timeout=10)


def routed_slot(application: str) -> str:
    """A runtime key on HOST that `application`'s active table routes to and whose runtime is ready."""
    table = RoutingTable.objects.get(application__name=application, active=True)
    ready = set(Runtime.objects.filter(host__name=HOST, state="ready").values_list("key", flat=True))
    return next(r["instance"].split("/", 1)[1] for r in table.routes if r["instance"].startswith(f"{HOST}/") and r["instance"].split("/", 1)[1] in ready)


def runtimes_with(key: str, application: str) -> list[dict]:
    """HOST's latest desired runtimes with `key` given to `application`'s most accurate variant."""
    variant = ModelVariant.objects.filter(application__name=application).order_by("-accuracy", "name").first()
    latest = host_desired_state_latest(host=Host.objects.get(name=HOST))
    return [{**r, "variant": r["variant"]["id"]} if r["key"] != key else
            {**r, "application": application, "variant": variant.pk, "profile": PROFILE, "batching": {"policy": "proteus"}}
            for r in latest.spec["runtimes"]]


def serving(key: str, application: str, version: int) -> bool:
    host = Host.objects.get(name=HOST)
    runtime = Runtime.objects.filter(host=host, key=key, state="ready").select_related("application").first()
    return host.converged_version >= version and runtime is not None and runtime.application.name == application


def test_a_slot_moved_to_another_application_never_answers_for_the_first(dataplane) -> None:
    api, host = dataplane["api"], dataplane["host"]
    with Traffic(dataplane["router"].url, (RESNET, MOBILE)) as traffic:
        wait_for(lambda: traffic.served(RESNET) and traffic.served(MOBILE), 60, "both applications served")

        # 1. An operator's direct write gives a classify-resnet slot to classify-mobile.
        slot = routed_slot(RESNET)
        latest = host_desired_state_latest(host=host)
        response = api.post(f"/api/v1/hosts/{host.pk}/desired-state/", json={"gpus": latest.spec["gpus"], "runtimes": runtimes_with(slot, MOBILE)})
        assert response.status_code == 201, response.text
        version = response.json()["version"]
        wait_for(lambda: serving(slot, MOBILE, version), 120, f"{slot} serving {MOBILE}")
        # The operator routes classify-mobile to its new slot as well.
        mobile = Application.objects.get(name=MOBILE)
        table = RoutingTable.objects.get(application=mobile, active=True)
        variant = ModelVariant.objects.filter(application=mobile).order_by("-accuracy", "name").first()
        routes = [{"instance": r["instance"], "variant": r["variant"], "weight": r["weight"]} for r in table.routes]
        routes.append({"instance": f"{HOST}/{slot}", "variant": variant.pk, "weight": 1.0})
        assert api.post("/api/v1/routing-tables/", json={"application": mobile.pk, "routes": routes}).status_code == 201
        served = traffic.served(MOBILE)
        wait_for(lambda: traffic.served(MOBILE) > served + 50, 60, "classify-mobile served after the move")
        time.sleep(3)  # the router refreshes every second: a stale route would have been drawn by now
        assert not traffic.wrong, f"after the direct write: {Counter(traffic.wrong)}; {traffic.answers}"

        # 2. A plan rollout reuses the same runtime key for classify-resnet again.
        routing = {}
        for active in RoutingTable.objects.filter(active=True).select_related("application"):
            routing[active.application.name] = [{"instance": r["instance"], "variant": r["variant"], "weight": r["weight"]}
                                                for r in active.routes if r["instance"] != f"{HOST}/{slot}"]
        resnet_variant = ModelVariant.objects.filter(application__name=RESNET).order_by("-accuracy", "name").first()
        routing[RESNET].append({"instance": f"{HOST}/{slot}", "variant": resnet_variant.pk, "weight": 1.0})
        current = host_desired_state_latest(host=host)
        plan = Plan.objects.create(status=PlanStatusChoices.VALIDATED, routing=routing,
                                   desired_states={HOST: {"gpus": current.spec["gpus"], "runtimes": runtimes_with(slot, RESNET)}})
        plan_approve(plan=plan, actor=None)
        job = plan_apply(plan=plan, actor=None, deadline_s=120)  # runs to its end here
        job.refresh_from_db()
        assert job.status == "succeeded", job.log + job.error
        assert "routes to the slots that change withdrawn" in job.log
        final = HostDesiredState.objects.filter(host=host).order_by("-version").first()
        wait_for(lambda: serving(slot, RESNET, final.version), 120, f"{slot} serving {RESNET} again")
        served = traffic.served(RESNET)
        wait_for(lambda: traffic.served(RESNET) > served + 50, 60, "classify-resnet served after the rollout")
        time.sleep(3)
    print(f"answers during both moves: {traffic.answers}")
    assert not traffic.wrong, f"{len(traffic.wrong)} answers from the wrong model: {Counter(traffic.wrong)}; {traffic.answers}"
    assert traffic.served(RESNET) and traffic.served(MOBILE), traffic.answers
