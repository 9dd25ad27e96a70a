"""The dashboard's WebSocket (`ws/live/`) on the in-memory channel layer: subscriptions are checked per
topic, metrics roll-ups follow ingested reports within the flush interval, job changes and audited
changes arrive as they happen. (The Redis layer is exercised by the integration tests and the browser.)"""
import asyncio
import time
from datetime import datetime, timezone

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from apps.core.consumers import UNAUTHENTICATED
from apps.dashboard.consumers import LiveConsumer
from apps.jobs.choices import JobKindChoices
from apps.jobs.services import job_create, job_progress
from apps.policies.models import SloPolicy
from apps.inventory.services import router_credential_issue
from apps.telemetry.services import host_metrics_ingest, router_report_ingest
from apps.users.roles import user_role_set
from tests.factories import ApplicationFactory, HostFactory, ModelVariantFactory, UserFactory


async def _open(user):
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


async def _until(communicator, kind, predicate=lambda m: True, timeout=3.0):
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {kind} message matched within {timeout} s")
        message = await communicator.receive_json_from(timeout=left)
        if message["type"] == kind and predicate(message):
            return message


async def _drain(communicator, seconds):
    """Every message that arrives within `seconds` (ticks included)."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # receive_nothing does not consume; a timed-out receive would cancel the consumer
        if not await communicator.receive_nothing(timeout=0.05):
            out.append(await communicator.receive_json_from())
    return out


def test_anonymous_is_told_to_log_in():
    async def scenario():
        communicator, connected, _ = await _open(AnonymousUser())
        return connected, await communicator.receive_output(timeout=2)

    connected, closed = asyncio.run(scenario())
    # Accepted, then closed with 4401: the page tells "log in again" from "the server is away" (1006).
    assert connected and closed == {"type": "websocket.close", "code": UNAUTHENTICATED}


@pytest.mark.django_db(transaction=True)
def test_each_subscription_is_checked(users):
    nobody = UserFactory(username="no-role")
    user_role_set(nobody, None)

    async def scenario():
        limited, connected, _ = await _open(nobody)
        assert connected
        await limited.send_json_to({"subscribe": ["metrics", "jobs", "nonsense"]})
        replies = [await limited.receive_json_from(timeout=2) for _ in range(3)]
        await limited.send_json_to({"hello": 1})
        replies.append(await limited.receive_json_from(timeout=2))
        await limited.send_to(text_data="{not json")
        replies.append(await limited.receive_json_from(timeout=2))
        await limited.send_json_to({"subscribe": "changes"})  # still open after the malformed frame
        replies.append(await _until(limited, "subscribed"))
        viewer, _, _ = await _open(users["viewer"])
        await viewer.send_json_to({"subscribe": ["metrics", "jobs"]})
        granted = [await _until(viewer, "subscribed"), await _until(viewer, "subscribed")]
        await limited.disconnect()
        await viewer.disconnect()
        return replies, granted

    replies, granted = asyncio.run(scenario())
    assert [(r["type"], r.get("topic")) for r in replies] == [("error", "metrics"), ("error", "jobs"), ("error", "nonsense"), ("error", None), ("error", None), ("subscribed", "changes")]
    assert "telemetry.view_applicationsample" in replies[0]["error"] and "Unknown topic" in replies[2]["error"]
    assert replies[4]["error"] == "Send JSON text frames." and replies[5]["topic"] == "changes"
    assert sorted(g["topic"] for g in granted) == ["jobs", "metrics"]


@pytest.mark.django_db(transaction=True)
def test_metrics_rollup_follows_reports(users):
    application = ApplicationFactory(name="live-app")
    SloPolicy.objects.create(application=application, latency_p99_ms=50)
    ModelVariantFactory(application=application, name="small", accuracy=0.70)
    ModelVariantFactory(application=application, name="large", accuracy=0.90)
    host = HostFactory(name="live-host")
    router, _ = router_credential_issue(name="r1")
    now = datetime.now(timezone.utc)

    def reports():
        router_report_ingest(credential=router, report={"router": "r1", "at": now, "interval_s": 1.0, "applications": [
            {"application": "live-app", "arrivals": 200, "served": 190, "late": 6, "dropped": 4, "no_route": 0, "latency_p99_ms": 42.5},
        ]})
        host_metrics_ingest(host=host, report={"at": now, "interval_s": 1.0, "runtimes": [
            {"key": "gpu0/1g.5gb@0", "application": "live-app", "variant": "small", "arrivals": 100, "served": 100},
            {"key": "gpu0/3g.20gb@4", "application": "live-app", "variant": "large", "arrivals": 100, "served": 300},
        ], "gpus": [{"index": 0, "simulated": True, "instances": [
            {"placement": "1g.5gb@0", "gr_engine_active_pct": 40.0, "memory_used_mb": 1000},
            {"placement": "3g.20gb@4", "gr_engine_active_pct": 80.0, "memory_used_mb": 9000},
        ]}]})

    async def scenario():
        viewer, _, _ = await _open(users["viewer"])  # the fleet page: per-instance figures too
        await viewer.send_json_to({"subscribe": ["metrics", "instances"]})
        overview, _, _ = await _open(users["viewer"])  # the overview: roll-ups only
        await overview.send_json_to({"subscribe": "metrics"})
        for communicator in (viewer, viewer, overview):
            await _until(communicator, "subscribed")
        idle = await _until(viewer, "metrics")  # sent at least once a second, reports or not
        sent = time.monotonic()
        await database_sync_to_async(reports)()
        live = await _until(viewer, "metrics", lambda m: "live-host" in m["reports"], timeout=2)
        delay = time.monotonic() - sent
        light = await _until(overview, "metrics", lambda m: "live-host" in m["reports"], timeout=2)
        await viewer.disconnect()
        await overview.disconnect()
        return idle, live, delay, light

    idle, live, delay, light = asyncio.run(scenario())
    assert idle["applications"]["live-app"]["demand_rps"] == 0 and idle["report_age_s"] is None
    app = live["applications"]["live-app"]
    assert app["demand_rps"] == 200 and app["served_rps"] == 190 and app["p99_ms"] == 42.5
    assert app["slo_ms"] == 50 and app["slo_met"] is True
    assert app["violation_ratio"] == pytest.approx(10 / 200)
    assert app["accuracy"] == pytest.approx((0.70 * 100 + 0.90 * 300) / 400)
    assert live["instances"]["live-host/gpu0/3g.20gb@4"]["utilization_pct"] == 80.0
    assert live["instances"]["live-host/gpu0/3g.20gb@4"]["load_rps"] == 100
    assert live["fleet"]["gpu_slices"] == 2 and live["fleet"]["runtimes"] == 2 and live["fleet"]["hosts_reporting"] == 1
    assert delay < 1.0
    assert light["instances"] == {} and light["applications"] == live["applications"] and light["fleet"]["gpu_slices"] == 2


@pytest.mark.django_db(transaction=True)
def test_job_and_change_events_arrive_as_they_happen(users):
    nobody = UserFactory(username="changes-only")
    user_role_set(nobody, None)

    async def scenario():
        viewer, _, _ = await _open(users["viewer"])
        limited, _, _ = await _open(nobody)
        await viewer.send_json_to({"subscribe": ["jobs", "changes"]})
        await limited.send_json_to({"subscribe": ["changes"]})
        await _until(viewer, "subscribed")
        await _until(viewer, "subscribed")
        await _until(limited, "subscribed")
        job = await database_sync_to_async(lambda: job_create(kind=JobKindChoices.PLANNING, actor_name="test"))()
        created = await _until(viewer, "job", lambda m: m["id"] == job.pk)
        await database_sync_to_async(lambda: job_progress(job_id=job.pk, progress=40, log_line="solving"))()
        progressed = await _until(viewer, "job", lambda m: m["progress"] == 40)
        await database_sync_to_async(lambda: HostFactory(name="h-live"))()
        change = await _until(viewer, "change", lambda m: m["object_repr"] == "h-live")
        seen_by_limited = await _drain(limited, 0.5)
        await viewer.disconnect()
        await limited.disconnect()
        return created, progressed, change, seen_by_limited

    created, progressed, change, seen_by_limited = asyncio.run(scenario())
    assert created["status"] == "pending" and created["progress"] == 0
    assert "solving" in progressed["log"]
    assert change["object_type"] == "inventory.host" and change["action"] == "create"
    assert {m["type"] for m in seen_by_limited} <= {"tick"}  # no view permission on hosts: no change sent


@pytest.mark.django_db(transaction=True)
def test_one_process_rolls_up_once_per_view_however_many_dashboards_are_open(users):
    """Issue 43: the reports reach the process once and are rolled up once per view (the applications a user
    may see, with or without instances), not once per socket; every socket still gets its own view."""
    from apps.dashboard.live import live_hub
    from apps.telemetry.rollup import LiveWindow

    application = ApplicationFactory(name="hub-app")
    SloPolicy.objects.create(application=application, latency_p99_ms=40)
    router, _ = router_credential_issue(name="hub-router")
    snapshots_made = []
    original = LiveWindow.snapshots

    def counting(self, *, now, views):
        snapshots_made.append(len(views))
        return original(self, now=now, views=views)

    def report():
        router_report_ingest(credential=router, report={"router": "hub-router", "at": datetime.now(timezone.utc), "interval_s": 1.0,
                                                         "applications": [{"application": "hub-app", "arrivals": 30, "served": 30}]})

    async def scenario():
        sockets = []
        for i in range(6):  # five overview pages and one fleet page, two roles
            communicator, _, _ = await _open(users["viewer"] if i % 2 else users["operator"])
            topics = ["metrics", "instances"] if i == 0 else ["metrics"]
            await communicator.send_json_to({"subscribe": topics})
            for _ in topics:
                await _until(communicator, "subscribed", timeout=2)
            sockets.append(communicator)
        hub = live_hub()
        assert len(hub.sockets) == 6
        await database_sync_to_async(report)()
        got = [await _until(c, "metrics", lambda m: m["applications"].get("hub-app", {}).get("demand_rps") == 30) for c in sockets]
        sends = hub.sends
        for communicator in sockets:
            await communicator.disconnect()
        return got, sends, hub

    LiveWindow.snapshots = counting
    try:
        got, sends, hub = asyncio.run(scenario())
    finally:
        LiveWindow.snapshots = original
    # The viewer's and the operator's catalogues hold the same applications here: two views (with and
    # without instances) at most per roll-up, whatever the six sockets.
    assert snapshots_made and max(snapshots_made) <= 2
    assert sends <= 2 * len(snapshots_made)
    assert all(m["applications"]["hub-app"]["slo_ms"] == 40 for m in got)
    assert not hub.sockets and not hub._tasks  # the last page to leave stopped the hub


def test_messages_are_json_a_browser_reads_even_with_a_nan():
    """The socket's messages are written by orjson: a NaN (a p99 of nothing) arrives as null, which the
    page's JSON.parse reads, where the standard library's NaN would make it drop the whole message."""
    import json

    text = asyncio.run(LiveConsumer.encode_json({"type": "metrics", "p99_ms": float("nan"), "reports": {"h1": 1.5}}))
    assert json.loads(text) == {"type": "metrics", "p99_ms": None, "reports": {"h1": 1.5}}
    assert "NaN" not in text
