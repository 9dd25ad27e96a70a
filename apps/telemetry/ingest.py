"""The agents' metrics endpoint on a fast path, with group commit (issue 22 section 3: a fleet of 1,000
GPU hosts sends 1,000 reports a second).

Through Django and the REST framework a report cost 12.4 ms (benches/telemetry_profile.py): 7 queries
and a commit of its own, model instances, and the request machinery (middleware, sessions, DRF's
dispatch), so one process took 80 reports/s. Here a well-formed report from an agent takes this path:

1. `MetricsIngestApplication`, an ASGI layer in front of Django, answers
   `POST /api/v1/hosts/{id}/metrics/` itself: it reads the body, parses the JSON and validates it with
   the report serializer's compiled fast path (apps/core/api/validation.py), on the server's event loop.
2. `MetricsIngestBatcher` hands it to one writer thread, which stores everything that arrived while the
   previous batch committed in one transaction (`host_metrics_ingest_many`: one query per kind of
   thing, rows in by COPY), authenticating every report's agent token against its host in one query.
   Under light load a batch is one report and nothing waits; under heavy load batches grow by themselves.
3. The request is answered 201 only once its batch has committed: an answer means the samples are stored.

Anything else goes to Django unchanged, with the body it sent: a report that is not well-formed (DRF
then gives the exact 400, or accepts it), a token that is not this host's agent's (401/404 from the
usual authentication), a request Django would refuse or redirect (host header, HTTPS redirect), and a
batch that failed for a reason other than the database being away. When PostgreSQL is away or hangs,
the waiting requests get the API's JSON 503 with Retry-After within TESSERA_INGEST_WAIT_S; a report
written after its request gave up is harmless, as the agent's retry of it is recognised as a duplicate.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import connection
from django.http.request import split_domain_port, validate_host

from apps.core.outages import DATABASE, ServiceUnavailable, outage_api_response, outage_from_exception
from apps.inventory.models import Host
from apps.users.services import api_auth_address_failed_recently
from apps.users.tokens import AGENT_TOKEN_PREFIX, token_from_header, token_hash

from .api.serializers import MetricsReportSerializer, report_fast_validate
from .services import host_metrics_ingest_many

log = logging.getLogger("tessera.telemetry")

METRICS_PATH = re.compile(r"^/api/v1/hosts/(\d+)/metrics/$")
REFUSED = object()  # the writer's answer for a report whose token is not its host's agent's: Django decides


@dataclass
class _Pending:
    host_id: int
    token_hash: str
    report: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)

    def resolve(self, outcome: Any) -> None:
        def settle() -> None:
            if self.future.done():  # the request gave up waiting (TESSERA_INGEST_WAIT_S)
                return
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)
        self.loop.call_soon_threadsafe(settle)


class MetricsIngestBatcher:
    """One writer thread per process storing reports in batches (group commit; see the module)."""

    def __init__(self, *, max_batch: int, max_waiting: int) -> None:
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def submit(self, *, host_id: int, token_hash: str, report: dict[str, Any]) -> Any:
        """The rows written for this report (a dict), REFUSED, or the batch's exception, once committed."""
        if self._queue.qsize() >= self.max_waiting:  # the database cannot keep up, or is away
            raise ServiceUnavailable(DATABASE, f"{self.max_waiting} metrics reports waiting to be written")
        self._ensure()
        loop = asyncio.get_running_loop()
        pending = _Pending(host_id, token_hash, report, loop, loop.create_future())
        self._queue.put(pending)
        return await pending.future

    def _ensure(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="tessera-metrics-writer", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch = [p for p in batch if not p.future.done()]  # their requests have had their 503
            if batch:
                self._write(batch)
            if self._queue.empty():
                # Idle: give the connection back (to the pool, or closed), so that none is held open for
                # nothing, and a database can be dropped or restarted while no report comes in.
                try:
                    connection.close()
                except Exception:  # noqa: BLE001 - a broken connection fails to close cleanly; it is gone either way
                    log.warning("closing the metrics writer's connection failed", exc_info=True)

    def _write(self, batch: list[_Pending]) -> None:
        if connection.errors_occurred and connection.connection is not None and not connection.is_usable():
            connection.close()  # broken by an outage or a restart: replaced, not reused
        try:
            hosts = {h.pk: h for h in Host.objects.filter(pk__in={p.host_id for p in batch}).only("pk", "name", "agent_token_hash")}
            accepted = [p for p in batch if (h := hosts.get(p.host_id)) is not None and h.agent_token_hash == p.token_hash]
            written = host_metrics_ingest_many(reports=[(hosts[p.host_id], p.report) for p in accepted])
        except Exception as exc:  # noqa: BLE001 - every waiting request gets it; the thread lives on
            if outage_from_exception(exc) is None:
                log.exception("storing %d metrics reports failed", len(batch))
            for p in batch:
                p.resolve(exc)
            try:
                connection.close()  # a connection an error left behind is not reused
            except Exception:  # noqa: BLE001 - see _run
                log.warning("closing the metrics writer's connection failed", exc_info=True)
            return
        outcomes = {id(p): w for p, w in zip(accepted, written)}
        for p in batch:
            p.resolve(outcomes.get(id(p), REFUSED))


_batcher: MetricsIngestBatcher | None = None
_batcher_lock = threading.Lock()


def metrics_batcher() -> MetricsIngestBatcher:
    global _batcher
    with _batcher_lock:
        if _batcher is None:
            _batcher = MetricsIngestBatcher(max_batch=settings.TESSERA_INGEST_BATCH_MAX, max_waiting=settings.TESSERA_INGEST_MAX_WAITING)
        return _batcher


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _django_would_take(scope: dict) -> bool:
    """Whether Django's own checks would let this request through to the view: its Host header is allowed
    and no HTTPS redirect is due. Where not, Django answers (400 or the redirect)."""
    host = _header(scope, b"host") or ""
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    if settings.SECURE_SSL_REDIRECT and scope.get("scheme") != "https":
        proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
        if not proxy:
            return False
        name, secure = proxy
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        if (_header(scope, header) or "").split(",")[0].strip() != secure:
            return False
    return True


async def _json_send(send, status: int, content: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
        (b"x-content-type-options", b"nosniff"), *headers]})
    await send({"type": "http.response.body", "body": content})


class MetricsIngestApplication:
    """ASGI: agents' metrics reports on the fast path (see the module); every other request to `inner`."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or (match := METRICS_PATH.match(scope["path"])) is None:
            return await self.inner(scope, receive, send)
        body, more, disconnected = b"", True, False
        while more and len(body) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if disconnected:
            return None
        replay = _replaying(body, more, receive)
        report = None if more else self._report(scope, body)
        if report is None:
            return await self.inner(scope, replay, send)
        host_id, secret = int(match.group(1)), token_from_header(_header(scope, b"authorization"))
        try:
            # On timeout the wait is cancelled, and with it the report's future: the writer skips it if it has
            # not taken it yet.
            outcome = await asyncio.wait_for(metrics_batcher().submit(host_id=host_id, token_hash=token_hash(secret), report=report),
                                             timeout=settings.TESSERA_INGEST_WAIT_S)
        except (asyncio.TimeoutError, ServiceUnavailable) as exc:
            outage = exc if isinstance(exc, ServiceUnavailable) else ServiceUnavailable(DATABASE, "metrics batch not committed in time")
            return await self._outage_send(send, outage)
        except Exception as exc:  # noqa: BLE001 - the batch failed: an outage is answered here, anything else by Django
            outage = outage_from_exception(exc)
            if outage is not None:
                return await self._outage_send(send, outage)
            return await self.inner(scope, replay, send)
        if outcome is REFUSED:
            return await self.inner(scope, replay, send)
        return await _json_send(send, 201, json.dumps(outcome, separators=(",", ":")).encode())

    @staticmethod
    def _report(scope: dict, body: bytes) -> dict | None:
        """The validated report when this request is the fast path's to answer, else None."""
        secret = token_from_header(_header(scope, b"authorization"))
        if secret is None or not secret.startswith(AGENT_TOKEN_PREFIX):
            return None
        if api_auth_address_failed_recently((scope.get("client") or (None,))[0]):
            return None  # an address that must wait after refused secrets: Django refuses it unchecked
        if (_header(scope, b"content-type") or "").split(";")[0].strip() != "application/json" or not _django_would_take(scope):
            return None
        try:
            data = orjson.loads(body)  # compiled; what it refuses (NaN, huge integers) goes to Django's path, as all else
        except ValueError:
            return None
        return report_fast_validate(MetricsReportSerializer, data)

    @staticmethod
    async def _outage_send(send, outage: ServiceUnavailable) -> None:
        response = outage_api_response(outage)  # the API's one error shape, as Django would answer it
        await _json_send(send, response.status_code, response.content, ((b"retry-after", response["Retry-After"].encode()),))


def _replaying(body: bytes, more: bool, receive):
    """A `receive` that gives Django the body read so far, then the rest of the request as it comes."""
    given = False

    async def replay():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()
    return replay
