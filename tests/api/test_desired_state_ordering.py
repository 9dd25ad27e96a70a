"""A direct desired-state write that changes what a routed slot serves (issue 16): the routes to the slot
are withdrawn first, the write waits until the live routers hold the tables without them, and only then is
the slot's new state stored; routers that do not confirm leave everything as it was (503 `routers_behind`).
A routing table gives a route no endpoint while its slot serves another variant."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from apps.deployments import services
from apps.deployments.models import HostDesiredState, RoutingTable, Runtime
from apps.deployments.services import host_desired_state_set, routing_tables_publish
from apps.telemetry.models import ApplicationSample
from tests.api.test_deployments import fleet, mig_runtime, url  # noqa: F401 (fleet is a fixture)
from tests.factories import ApplicationFactory, ArtifactFactory, ModelVariantFactory, ProfileFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db(transaction=True)

MOVED, KEPT = "gpu0/3g.20gb@4", "gpu1"


@pytest.fixture
def moving(fleet):  # noqa: F811
    """classify/resnet50 runs on MOVED and KEPT, both routed; a second application, mobile, could take MOVED."""
    f = fleet
    f.mobile = ApplicationFactory(name="mobile")
    SloPolicyFactory(application=f.mobile, latency_p99_ms=50.0)
    f.mobilenet = ModelVariantFactory(application=f.mobile, name="mobilenet", artifact=ArtifactFactory())
    for batch in (1, 8):
        ProfileFactory(variant=f.mobilenet, slice="3g.20gb", batch_size=batch, latency_p50_ms=3.0 * batch, latency_p99_ms=4.0 * batch)
    host_desired_state_set(host=f.host, spec={"runtimes": [mig_runtime(f, key=MOVED), mig_runtime(f, key=KEPT)]})
    routing_tables_publish(tables={f.classify: [{"instance": f"{f.host.name}/{key}", "variant": f.resnet.pk, "weight": 1.0} for key in (MOVED, KEPT)]})
    f.move = {"runtimes": [mig_runtime(f, key=MOVED, application="mobile", variant=f.mobilenet.pk), mig_runtime(f, key=KEPT)]}
    return f


def router_report(router: str, application: str, version: int | None, at=None) -> None:
    ApplicationSample.objects.create(router=router, application_name=application, routing_version=version,
                                     at=at or timezone.now(), interval_s=1.0)


class StandInRouter:
    """Reports `application`'s active table version every 100 ms, `lag_s` after it was published (as a router
    that refreshes its tables and reports every second does), or never when `stuck`."""

    def __init__(self, application: str, lag_s: float = 0.3, stuck: bool = False) -> None:
        self.application, self.lag_s, self.stuck = application, lag_s, stuck
        self.confirmed_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        held = self.held
        try:
            while not self._stop.wait(0.1):
                active = RoutingTable.objects.filter(application__name=self.application, active=True).first()
                if not self.stuck and active and active.version != held and time.time() - active.created.timestamp() >= self.lag_s:
                    held = active.version
                    self.confirmed_at.setdefault(held, time.time())
                router_report("stand-in", self.application, held)
        finally:
            connection.close()

    def __enter__(self) -> "StandInRouter":
        self.held = RoutingTable.objects.get(application__name=self.application, active=True).version
        router_report("stand-in", self.application, self.held)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_moving_a_routed_slot_withdraws_its_routes_and_waits_for_the_routers(clients, moving) -> None:
    f = moving
    with StandInRouter("classify", lag_s=0.5) as router:
        response = clients["operator"].post(url(f.host), f.move, format="json")
    assert response.status_code == 201, response.content
    written = HostDesiredState.objects.get(host=f.host, version=2)
    withdrawn = RoutingTable.objects.get(application=f.classify, active=True)
    # The table without the route to the moving slot came first, the router took it, then the slot changed.
    assert withdrawn.version == 2 and [r["instance"] for r in withdrawn.routes] == [f"{f.host.name}/{KEPT}"]
    assert withdrawn.created < written.created
    assert router.confirmed_at[2] <= written.created.timestamp()


def test_routers_that_do_not_confirm_leave_everything_as_it_was(clients, moving, monkeypatch) -> None:
    f = moving
    monkeypatch.setattr(services, "ROUTERS_CONFIRM_DEADLINE_S", 1.0)
    with StandInRouter("classify", stuck=True):
        response = clients["operator"].post(url(f.host), f.move, format="json")
    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert error["code"] == "routers_behind" and "stand-in" in error["message"] and "nothing was changed" in error["message"]
    assert HostDesiredState.objects.filter(host=f.host).count() == 1  # not written
    restored = RoutingTable.objects.get(application=f.classify, active=True)
    assert restored.version == 3 and {r["instance"] for r in restored.routes} == {f"{f.host.name}/{MOVED}", f"{f.host.name}/{KEPT}"}


def test_only_live_routers_count_and_a_write_that_moves_no_route_publishes_nothing(clients, moving) -> None:
    f = moving
    # A router last heard of long ago (gone) and a load test's samples (no table held) do not hold the write up.
    router_report("gone", "classify", 1, at=timezone.now() - timezone.timedelta(minutes=5))
    router_report("load-test", "classify", None)
    started = time.monotonic()
    response = clients["operator"].post(url(f.host), f.move, format="json")
    assert response.status_code == 201 and time.monotonic() - started < 5
    assert RoutingTable.objects.get(application=f.classify, active=True).version == 2
    # The same state again changes no slot: no table is published.
    again = clients["operator"].post(url(f.host), f.move, format="json")
    assert again.status_code == 201 and RoutingTable.objects.get(application=f.classify, active=True).version == 2
    # Bad input: 400 naming the field, nothing published or written.
    bad = clients["operator"].post(url(f.host), {"runtimes": [mig_runtime(f, key=KEPT, variant=999999)]}, format="json")
    assert bad.status_code == 400 and "runtimes" in bad.json()["error"]["fields"]
    assert RoutingTable.objects.get(application=f.classify, active=True).version == 2
    assert HostDesiredState.objects.filter(host=f.host).count() == 3


def test_a_route_gets_no_endpoint_while_its_slot_serves_another_variant(clients, moving) -> None:
    f = moving
    Runtime.objects.create(host=f.host, key=MOVED, application=f.mobile, variant=f.mobilenet, state="ready", endpoint="tcp://10.0.0.5:41001")
    Runtime.objects.create(host=f.host, key=KEPT, application=f.classify, variant=f.resnet, state="ready", endpoint="tcp://10.0.0.5:41002")
    table = RoutingTable.objects.get(application=f.classify, active=True)
    routes = {r["instance"]: (r["endpoint"], r["state"]) for r in clients["viewer"].get(f"/api/v1/routing-tables/{table.pk}/").json()["routes"]}
    assert routes == {f"{f.host.name}/{MOVED}": (None, "unknown"), f"{f.host.name}/{KEPT}": ("tcp://10.0.0.5:41002", "ready")}


def _publish(client, f, *keys):
    routes = [{"instance": f"{f.host.name}/{key}", "variant": f.resnet.pk, "weight": 1.0} for key in keys]
    return client.post("/api/v1/routing-tables/", {"application": f.classify.pk, "routes": routes}, format="json")


def test_a_publish_inside_the_withdrawal_cannot_route_to_the_changing_slot(clients, moving) -> None:
    """The window between the withdrawal and the write (issue 44): an operator's table that puts the moving
    slot's route back for the variant it is leaving is refused while the routers confirm, and after the write;
    routes to slots that keep their variant are published as before."""
    f = moving
    done: dict = {}

    def move() -> None:
        try:
            done["response"] = clients["admin"].post(url(f.host), f.move, format="json")
        finally:
            connection.close()

    with StandInRouter("classify", lag_s=1.5):
        mover = threading.Thread(target=move)
        mover.start()
        # Inside the window: the table without the slot's route is active, the slot's new state is not written.
        deadline = time.monotonic() + 10
        while RoutingTable.objects.get(application=f.classify, active=True).version < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert HostDesiredState.objects.filter(host=f.host).count() == 1
        inside = _publish(clients["operator"], f, MOVED, KEPT)
        mover.join(timeout=30)
    assert inside.status_code == 400, inside.content
    message = " ".join(inside.json()["error"]["fields"]["routes"])
    assert f"{f.host.name}/{MOVED}" in message and "is changing to serve variant" in message
    assert done["response"].status_code == 201, done["response"].content
    active = RoutingTable.objects.get(application=f.classify, active=True)
    assert active.version == 2 and [r["instance"] for r in active.routes] == [f"{f.host.name}/{KEPT}"]  # nothing slipped in
    # After the write: the host's desired state says what the slot serves.
    after = _publish(clients["operator"], f, MOVED, KEPT)
    assert after.status_code == 400 and "desired state version 2" in " ".join(after.json()["error"]["fields"]["routes"])
    assert RoutingTable.objects.get(application=f.classify, active=True).version == 2
    kept = _publish(clients["operator"], f, KEPT)
    assert kept.status_code == 201, kept.content
    mobile = clients["operator"].post("/api/v1/routing-tables/", {"application": f.mobile.pk, "routes": [
        {"instance": f"{f.host.name}/{MOVED}", "variant": f.mobilenet.pk, "weight": 1.0}]}, format="json")
    assert mobile.status_code == 201, mobile.content  # the slot's new variant is routed to it


def test_an_announced_change_that_routers_refuse_is_called_off(clients, moving, monkeypatch) -> None:
    f = moving
    monkeypatch.setattr(services, "ROUTERS_CONFIRM_DEADLINE_S", 0.5)
    with StandInRouter("classify", stuck=True):
        assert clients["operator"].post(url(f.host), f.move, format="json").status_code == 503
    assert not services.SlotChange.objects.exists()  # called off with the routes' return
    assert _publish(clients["operator"], f, MOVED, KEPT).status_code == 201
