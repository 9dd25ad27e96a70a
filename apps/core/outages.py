"""Outages of the services the control plane stands on (PostgreSQL, Redis as broker and channel layer):
answered fast, in the right form, and reported.

- `ServiceUnavailable`: a service a request needs is away. It is an API exception (503, code
  `service_unavailable`, Retry-After), so a view or a service may raise it and the REST framework's
  handler answers it in the one error shape; a database error (`OperationalError`, `InterfaceError`)
  is read as one (`outage_from_exception`).
- `outage_response`: the same for a request that fails outside the REST framework (apps.core.middleware.
  OutageMiddleware): JSON under /api/, the "service unavailable" page (templates/503.html) elsewhere, both
  503 with Retry-After.
- The statement watchdog: a PostgreSQL server that stops answering mid-statement (frozen, or a network
  that drops packets) is not caught by the server's own statement_timeout; the watchdog shuts the
  connection's socket once a statement outlives that bound by `WATCHDOG_GRACE_S`, so the request gets an
  OperationalError (then a 503) instead of waiting for ever. Connecting is bounded by libpq's
  connect_timeout and the pool's timeout (controlplane/settings/base.py, "Outages"). COMMIT and ROLLBACK
  are watched too (controlplane/postgresql, the database engine). Migrations run under their own bound
  (`statement_bound_override`, the migrate command: TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S, none by default).
- `services_health`: each service checked with short bounds, for /healthz."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import count
from typing import Any, Callable, Iterator

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.template import loader
from kombu.exceptions import OperationalError as KombuOperationalError
from rest_framework import exceptions

from .transactions import concurrency_rollback

logger = logging.getLogger("tessera.outages")

DATABASE = "database"
BROKER = "broker"
CHANNEL_LAYER = "channel_layer"
SERVICE_NAMES = {DATABASE: "The database (PostgreSQL)", BROKER: "The task broker (Redis)", CHANNEL_LAYER: "The channel layer (Redis)"}
WATCHDOG_GRACE_S = 0.5  # past the server's statement_timeout: a live server has answered by then
WATCHDOG_TICK_S = 0.1
# What sending a task raises when the broker is away (Celery re-raises connection errors as kombu's).
BROKER_ERRORS = (KombuOperationalError, OSError)


class ServiceUnavailable(exceptions.APIException):
    """503: `service` (DATABASE, BROKER, ...) is away, `reason` says how (for the log); try again after
    `wait` seconds (Retry-After: the REST framework's handler sends the header for an exception with `wait`)."""

    status_code = 503
    default_code = "service_unavailable"

    def __init__(self, service: str, reason: str = "", *, retry_after_s: int | None = None) -> None:
        self.service = service
        self.reason = reason
        self.wait = retry_after_s if retry_after_s is not None else settings.TESSERA_RETRY_AFTER_S
        name = SERVICE_NAMES.get(service, service)
        # The reason (addresses, driver messages) goes to the log, not to the client.
        super().__init__(f"{name} is unavailable; nothing was changed. Try again in {self.wait} s.")


def outage_from_exception(exc: BaseException) -> ServiceUnavailable | None:
    """The outage `exc` means, or None: a database error that is not the request's own fault (a broken
    or refused connection, a timeout) is the database being away."""
    if isinstance(exc, ServiceUnavailable):
        return exc
    if isinstance(exc, (OperationalError, InterfaceError)):
        if concurrency_rollback(exc):  # retried already (transactions.transaction_retry): still a 503, not an outage
            logger.warning("database conflict (deadlock or serialization failure), rolled back: %s", _first_line(exc))
        else:
            logger.warning("database unavailable: %s", _first_line(exc))
        return ServiceUnavailable(DATABASE, _first_line(exc))
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else exc.__class__.__name__


def outage_api_response(outage: ServiceUnavailable) -> JsonResponse:
    """The API's one error shape (apps/core/api/exceptions.py) with Retry-After."""
    from .api.exceptions import tessera_exception_handler

    handled = tessera_exception_handler(outage, {})
    response = JsonResponse(handled.data, status=handled.status_code)
    response["Retry-After"] = str(outage.wait)
    return response


def outage_page_response(outage: ServiceUnavailable) -> HttpResponse:
    """templates/503.html, rendered without the request (no session, no user: the database may be away)."""
    name = SERVICE_NAMES.get(outage.service, outage.service)
    try:
        body = loader.get_template("503.html").render({"service": name, "retry_after": outage.wait, "database": outage.service == DATABASE})
    except Exception:  # noqa: BLE001 - an error page must not fail in turn
        logger.exception("rendering 503.html failed")
        body = f"<!doctype html><title>{name} unavailable</title><h1>{name} is unavailable</h1>"
    response = HttpResponse(body, status=503)
    response["Retry-After"] = str(outage.wait)
    return response


def outage_response(request, outage: ServiceUnavailable) -> HttpResponse:
    if request.path_info.startswith("/api/"):
        return outage_api_response(outage)
    return outage_page_response(outage)


# --------------------------------------------------------------------------- the statement watchdog


class _StatementWatchdog:
    """Statements in flight on PostgreSQL sockets, each with a deadline; one daemon thread per process
    shuts down the socket of a statement past its deadline. The lock makes that safe: a statement leaves
    the table (under the lock) before its connection can be closed and its descriptor reused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[float, int]] = {}
        self._tokens = count()
        self._pid: int | None = None

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # first use, or a forked child (threads do not survive a fork)
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="tessera-statement-watchdog", daemon=True).start()

    def watch(self, fd: int, bound_s: float) -> int:
        with self._lock:
            self._ensure_thread()
            token = next(self._tokens)
            self._watched[token] = (time.monotonic() + bound_s, fd)
            return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    @contextmanager
    def watching(self, fd: int, bound_s: float) -> Iterator[None]:
        """What runs inside waits on the socket `fd` at most `bound_s`."""
        token = self.watch(fd, bound_s)
        try:
            yield
        finally:
            self.unwatch(token)

    def _run(self) -> None:
        while True:
            time.sleep(WATCHDOG_TICK_S)
            now = time.monotonic()
            with self._lock:
                for token, (deadline, fd) in list(self._watched.items()):
                    if deadline <= now:
                        del self._watched[token]
                        _socket_shutdown(fd)


def _socket_shutdown(fd: int) -> None:
    """Shut down the socket behind `fd` (a shutdown acts on the socket, not on this duplicate), so the
    statement waiting on it returns at once with a broken connection."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        logger.warning("a PostgreSQL statement outlived its bound; its connection was cut")
    except OSError:
        pass


_watchdog = _StatementWatchdog()


# A bound other than the setting's for the statements of this context (the migrate command's; 0: none).
_bound_override: ContextVar[float | None] = ContextVar("tessera_statement_bound", default=None)


def statement_bound_s() -> float:
    """The bound on one statement here and now: the setting's, or the one `statement_bound_override` set."""
    override = _bound_override.get()
    return settings.TESSERA_DB_STATEMENT_TIMEOUT_S if override is None else override


@contextmanager
def statement_bound_override(seconds: float) -> Iterator[None]:
    """Statements in this context run under `seconds` (0: unbounded) instead of the request bound, both on
    the server (`SET statement_timeout` on every open PostgreSQL connection, reset after) and for the
    watchdog. For work that is long by nature and runs alone: migrations."""
    from django.db import connections

    token = _bound_override.set(seconds)
    touched = []
    try:
        for connection in connections.all():
            if connection.vendor == "postgresql":  # connected here if it was not: the work inside will use it
                with connection.cursor() as cursor:
                    cursor.execute(f"SET statement_timeout = {int(seconds * 1000)}")
                touched.append(connection)
        yield
    finally:
        _bound_override.reset(token)
        for connection in touched:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("RESET statement_timeout")  # back to the connection's own (its options' -c statement_timeout)
            except Exception:  # noqa: BLE001 - a broken connection is not reused
                connection.close()


@contextmanager
def statement_watched(connection: Any) -> Iterator[None]:
    """Whatever runs inside waits on the connection's socket at most the statement bound + grace: COMMIT and
    ROLLBACK (controlplane/postgresql) as well as statements (`statement_watchdog_wrapper`)."""
    bound = statement_bound_s()
    try:
        fd = connection.connection.pgconn.socket if bound > 0 else None
    except Exception:  # noqa: BLE001 - not psycopg, or no socket: run unwatched
        fd = None
    if fd is None:
        yield
        return
    with _watchdog.watching(fd, bound + WATCHDOG_GRACE_S):
        yield


POOL_CHECK_BOUND_S = 1.0  # an empty query on a loopback or LAN connection answers in well under a millisecond


def pool_connection_check(conn: Any) -> None:
    """Is this pooled connection still alive? An empty query on it, under the watchdog (POOL_CHECK_BOUND_S):
    raises if a restarted, refused or frozen server broke it (controlplane.postgresql's CheckedConnectionPool
    then discards it). psycopg's own `ConnectionPool.check_connection` runs the same query with no bound: a
    frozen server would hold the request at the pool. One round trip per checkout."""
    from psycopg_pool import ConnectionPool

    with _watchdog.watching(conn.pgconn.socket, POOL_CHECK_BOUND_S):
        ConnectionPool.check_connection(conn)


def statement_watchdog_wrapper(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
    """A Django execute wrapper: the statement runs watched, with the bound statement_timeout + grace."""
    with statement_watched(context["connection"]):
        return execute(sql, params, many, context)


def statement_watchdog_install(sender: Any, connection: Any, **kwargs: Any) -> None:
    """`connection_created` receiver: every PostgreSQL connection's statements run watched (when a
    statement timeout is configured)."""
    if connection.vendor == "postgresql" and settings.TESSERA_DB_STATEMENT_TIMEOUT_S > 0 and statement_watchdog_wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(statement_watchdog_wrapper)


# --------------------------------------------------------------------------- health


def _redis_ping(url: str) -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis.from_url(url, socket_connect_timeout=settings.TESSERA_REDIS_CONNECT_TIMEOUT_S,
                                  socket_timeout=settings.TESSERA_REDIS_SOCKET_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    finally:
        client.close()


def _broker_url() -> str | None:
    """The broker's Redis URL; None on embedded defaults (tasks run in this process)."""
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        return None
    url = settings.CELERY_BROKER_URL
    return url if url.startswith(("redis://", "rediss://")) else None


def broker_check() -> None:
    """Raise ServiceUnavailable(BROKER) unless the broker answers a PING within the Redis bounds. Asked
    before anything is created that must be queued, so that a request answers 503 and changes nothing
    rather than leave work that no worker will hear of."""
    url = _broker_url()
    if url is None:
        return
    try:
        _redis_ping(url)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, reset: all the broker being away
        logger.warning("broker unavailable: %s", _first_line(exc))
        raise ServiceUnavailable(BROKER, _first_line(exc)) from exc


def _database_check() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check(probe: Callable[[], None]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 - any failure is the service being down, said in `error`
        # /healthz is public: the driver's message (addresses, user names) goes to the log, the kind of
        # failure to the answer.
        logger.warning("health check failed: %s", _first_line(exc))
        return {"up": False, "error": _health_error(exc), "ms": round((time.monotonic() - started) * 1000, 1)}
    return {"up": True, "ms": round((time.monotonic() - started) * 1000, 1)}


def _health_error(exc: BaseException) -> str:
    """What a public health answer says of a failure: a timeout, a refusal, or the error's class."""
    text = str(exc).lower()
    if isinstance(exc, TimeoutError) or "timeout" in text or "timed out" in text:
        return "timed out"
    if isinstance(exc, ConnectionRefusedError) or "refused" in text:
        return "connection refused"
    return exc.__class__.__name__


def _redis_url_of_channel_layer() -> str | None:
    config = settings.CHANNEL_LAYERS["default"]
    if not config["BACKEND"].startswith("channels_redis"):
        return None
    host = config["CONFIG"]["hosts"][0]
    return host["address"] if isinstance(host, dict) else host


def services_health() -> dict[str, dict[str, Any]]:
    """Each service: {"up": bool, "ms": ..., "error": "..." when down}; an in-process stand-in (embedded
    defaults: no broker, in-memory channel layer) is up and says so."""
    health = {DATABASE: _check(_database_check)}
    broker = _broker_url()
    health[BROKER] = _check(lambda: _redis_ping(broker)) if broker else {"up": True, "in_process": True}
    layer = _redis_url_of_channel_layer()
    if layer and layer == broker:  # one Redis for both (the shipped settings): asked once, so a frozen one costs one bound
        health[CHANNEL_LAYER] = health[BROKER]
    else:
        health[CHANNEL_LAYER] = _check(lambda: _redis_ping(layer)) if layer else {"up": True, "in_process": True}
    return health
