"""The agents' metrics endpoint on its fast path (apps/telemetry/ingest.py), through the ASGI application
as `tessera serve` and `tessera ingest` run it: a well-formed report from the host's own agent is stored
by the batch writer and answered 201 without Django's request machinery; reports arriving together are
stored in one transaction; everything else gets Django's own answer; a database that is away gets the
API's JSON 503 at once."""
from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import OperationalError

from apps.inventory.models import Host
from apps.inventory.services import host_agent_token_rotate
from apps.telemetry import ingest
from apps.telemetry.ingest import MetricsIngestApplication
from apps.telemetry.models import GpuSample, RuntimeSample
from tests.factories import HostFactory

from .test_telemetry import iso, metrics

pytestmark = pytest.mark.django_db(transaction=True)  # the writer thread has its own connection


class Spy:
    """Django's ASGI application, counting the requests the fast path hands to it."""

    def __init__(self) -> None:
        self.inner = get_asgi_application()
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        return await self.inner(scope, receive, send)


@pytest.fixture
def app():
    ingest._batcher = None  # a fresh writer per test (its thread ends with the process)
    spy = Spy()
    return MetricsIngestApplication(spy), spy


@pytest.fixture
def agents():
    hosts = [HostFactory(name=f"ingest-host-{i}") for i in range(4)]
    return [(host, host_agent_token_rotate(host=host)) for host in hosts]


async def post(application, path: str, body, token: str | None, content_type: str = "application/json"):
    headers = [(b"host", b"127.0.0.1"), (b"content-type", content_type.encode())]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers.append((b"content-length", str(len(payload)).encode()))
    communicator = ApplicationCommunicator(application, {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000)})
    await communicator.send_input({"type": "http.request", "body": payload, "more_body": False})
    start = await communicator.receive_output(timeout=20)
    body_message = await communicator.receive_output(timeout=20)
    await communicator.wait(timeout=5)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body_message["body"] or b"null")


def test_a_well_formed_report_is_stored_on_the_fast_path(app, agents) -> None:
    application, spy = app
    host, token = agents[0]
    status, headers, body = asyncio.run(post(application, f"/api/v1/hosts/{host.pk}/metrics/", metrics(), token))
    assert (status, body) == (201, {"runtime_samples": 2, "gpu_samples": 2}) and headers["content-type"] == "application/json"
    assert spy.calls == 0  # Django never saw it
    assert RuntimeSample.objects.filter(host=host).count() == 2 and GpuSample.objects.filter(host=host).count() == 2
    assert Host.objects.get(pk=host.pk).last_seen is not None


@pytest.mark.parametrize("form", ["Z", "+02:00", "naive", "space"])
def test_a_reports_time_is_the_same_instant_whatever_iso_form_it_takes(app, agents, form) -> None:
    """`at` parsed on the fast path (aware ISO 8601 by the standard library) or by DRF (any other form: naive
    times are the default time zone, UTC) is stored as the same instant."""
    from datetime import datetime, timedelta, timezone

    application, spy = app
    host, token = agents[0]
    at = datetime.fromisoformat(iso(1).replace("Z", "+00:00"))
    text = {"Z": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "+02:00": at.astimezone(timezone(timedelta(hours=2))).isoformat(),
            "naive": at.replace(tzinfo=None).isoformat(), "space": at.strftime("%Y-%m-%d %H:%M:%S")}[form]
    status, _headers, _body = asyncio.run(post(application, f"/api/v1/hosts/{host.pk}/metrics/", metrics(at=text), token))
    assert status == 201 and spy.calls == 0
    assert set(RuntimeSample.objects.filter(host=host).values_list("at", flat=True)) == {at}


def test_reports_arriving_together_are_stored_in_one_batch(app, agents, monkeypatch) -> None:
    application, spy = app
    batches: list[int] = []
    many = ingest.host_metrics_ingest_many

    def recorded(*, reports):
        batches.append(len(reports))
        return many(reports=reports)

    monkeypatch.setattr(ingest, "host_metrics_ingest_many", recorded)

    async def together():
        # Every agent twice (two intervals), and host 0's first report sent twice (a retry): 9 requests.
        requests = [post(application, f"/api/v1/hosts/{h.pk}/metrics/", metrics(at=iso(s)), t) for h, t in agents for s in (1, 2)]
        requests.append(post(application, f"/api/v1/hosts/{agents[0][0].pk}/metrics/", metrics(at=iso(1)), agents[0][1]))
        return await asyncio.gather(*requests)

    answers = asyncio.run(together())
    assert [status for status, _, _ in answers] == [201] * 9 and spy.calls == 0
    written = sorted(body["runtime_samples"] for _, _, body in answers)
    assert written == [0] + [2] * 8  # the retry stored nothing
    assert sum(batches) == 9 and len(batches) < 9  # some arrived while a batch was committing, and went in together
    assert RuntimeSample.objects.count() == 16 and GpuSample.objects.count() == 16


@pytest.mark.parametrize("case, expected", [
    ("another host's token", 404), ("no such token", 401), ("not well-formed", 400), ("a user's token", 403), ("form-encoded", 415),
])
def test_anything_else_gets_djangos_own_answer_and_stores_nothing(app, agents, users, case, expected) -> None:
    from apps.users.services import token_create

    application, spy = app
    (host, token), (_, other_token) = agents[0], agents[1]
    path, body, content_type = f"/api/v1/hosts/{host.pk}/metrics/", metrics(), "application/json"
    if case == "another host's token":
        token = other_token
    elif case == "no such token":
        token = "tsa_" + "x" * 40
    elif case == "not well-formed":
        body = metrics(runtimes=[{"key": "gpu1", "arrivals": -1}])
    elif case == "a user's token":
        token = token_create(user=users["admin"], description="test")[1]
    else:
        content_type, body = "application/x-www-form-urlencoded", b"at=now"
    status, _, answer = asyncio.run(post(application, path, body, token, content_type))
    assert status == expected and set(answer) == {"error"} and answer["error"]["status"] == expected
    assert spy.calls == 1  # Django answered, with the body the agent sent
    assert not RuntimeSample.objects.exists() and not GpuSample.objects.exists()
    if case == "not well-formed":
        assert "runtimes" in answer["error"]["fields"]


def test_the_database_away_is_a_json_503_at_once(app, agents, monkeypatch) -> None:
    application, spy = app
    host, token = agents[0]

    def away(*, reports):
        raise OperationalError("connection refused")

    monkeypatch.setattr(ingest, "host_metrics_ingest_many", away)
    status, headers, body = asyncio.run(post(application, f"/api/v1/hosts/{host.pk}/metrics/", metrics(), token))
    assert status == 503 and int(headers["retry-after"]) > 0 and body["error"]["code"] == "service_unavailable"
    assert spy.calls == 0
    monkeypatch.undo()
    status, _, _ = asyncio.run(post(application, f"/api/v1/hosts/{host.pk}/metrics/", metrics(), token))
    assert status == 201  # the writer lives on
