"""Secrets never logged (issue 44, security): the control plane's real ASGI application (the agents' metrics
fast path in front of Django) served by uvicorn in this process, driven by the real clients (the data plane's
ControlPlaneClient, the CLI's API client, httpx) through a flow that uses every kind of secret: an admin
issues an API token, an agent token and a router credential over the API; each is used; each is sent wrong
(one character off, so a log of the wrong one would show the real one) until the address is held (429); a
plan run starts a Celery task. Every log record of every logger (root at DEBUG, every logger lowered to DEBUG
and enabled, Django's SQL logged, propagate=False loggers included) is formatted with everything it carries,
and apps.core.security.secrets_in_logs_find, which the soak bench runs on its processes' logs, finds no
secret in them (an Authorization header holds its secret whole, so it is found as well)."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import httpx
import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from apps.core.security import secrets_in_logs_find
from apps.users.services import API_AUTH_FREE_FAILURES, token_create
from apps.users.tokens import token_hash
from controlplane.cli.app import StepFailed, _Api
from tests.api.test_telemetry import metrics, router_report
from tests.factories import HostFactory
from workers.client import ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable

# The loggers Django, Celery, the servers and the clients use, made before the capture so they are lowered too.
NAMED = ("django", "django.request", "django.server", "django.security", "django.db.backends", "django.channels.server",
         "celery", "celery.app.trace", "celery.task", "celery.worker", "kombu", "uvicorn", "uvicorn.error",
         "uvicorn.access", "daphne", "httpx", "httpcore", "tessera", "tessera.security", "tessera.telemetry")
FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(threadName)s %(message)s")


class _Every(logging.Handler):
    """Keeps every record it is handed, formatted with everything it carries (message, exception, stack, and the
    record's own attributes: arguments, `extra`, the request a Django record names)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.names.add(record.name)
        self.lines.append(f"{FORMAT.format(record)} {vars(record)!r}")


@contextlib.contextmanager
def every_log_record():
    """Every record of every logger at DEBUG into one handler, as it would be written with DEBUG at the root;
    the loggers' levels, states and handlers as they were after."""
    for name in NAMED:
        logging.getLogger(name)
    handler = _Every()
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    saved = [(logger, logger.level, logger.disabled) for logger in loggers]
    cut_off = [logger for logger in loggers[1:] if not logger.propagate]  # their records never reach the root
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.disabled = False
    for logger in [loggers[0], *cut_off]:
        logger.addHandler(handler)

    def sql_logged(sender, connection, **kwargs):  # every connection the server's threads open logs its SQL
        connection.force_debug_cursor = True

    connection_created.connect(sql_logged, weak=False, dispatch_uid="test_secrets_not_logged")
    connection.force_debug_cursor = True
    try:
        yield handler
    finally:
        connection_created.disconnect(dispatch_uid="test_secrets_not_logged")
        connection.force_debug_cursor = False
        for logger in [loggers[0], *cut_off]:
            logger.removeHandler(handler)
        for logger, level, disabled in saved:
            logger.setLevel(level)
            logger.disabled = disabled


@contextlib.contextmanager
def asgi_server():
    """controlplane.asgi's application on uvicorn (as `tessera ingest` serves it) in a thread of this process,
    so its records reach this process's loggers; yields its URL."""
    import uvicorn

    from controlplane.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, log_config=None, log_level="debug", lifespan="off", ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _off_by_one(secret: str) -> str:
    return secret[:-1] + ("B" if secret[-1] == "A" else "A")


def _refused(call) -> int:
    """The status a call was refused with (the data plane's client takes a 429 for "later", as an outage)."""
    try:
        call()
    except ControlPlaneRejected as exc:
        return exc.status
    except ControlPlaneUnavailable as exc:
        return int(str(exc).split(": HTTP ", 1)[1].split(",")[0])
    except StepFailed as exc:
        return int(str(exc).split(": ", 1)[1].split()[0])
    raise AssertionError("not refused")


@pytest.mark.django_db(transaction=True)  # the server's threads and the metrics writer have their own connections
def test_no_secret_reaches_any_log_in_a_flow_that_uses_each(users):
    import controlplane.asgi  # noqa: F401 - set up before the capture: django.setup() configures logging afresh
    from apps.telemetry import ingest

    ingest._batcher = None  # a writer of this test's own
    host = HostFactory(name="logged-host")
    _, admin_secret = token_create(user=users["admin"], description="logs test")
    used: dict[str, str] = {"admin API token": admin_secret}
    with every_log_record() as logs, asgi_server() as url:
        admin = _Api(url, admin_secret, timeout_s=30)
        used["operator API token"] = admin.call("POST", "/tokens/", json={"user": users["operator"].pk})["key"]
        used["agent token"] = admin.call("POST", f"/hosts/{host.pk}/agent-token/")["token"]
        used["router credential"] = admin.call("POST", "/router-credentials/", json={"name": "logged-router"})["token"]

        # Each used as its client uses it.
        operator = _Api(url, used["operator API token"], timeout_s=60)
        assert operator.call("GET", "/applications/")["count"] == 0
        operator.call("POST", "/plan-runs/", json={"solver": "proteus", "time_limit_s": 5}, expect=(201, 202, 400, 409))
        agent = ControlPlaneClient(url, used["agent token"], timeout_s=30)
        assert agent.host_id == host.pk and agent.desired_state() is None
        agent.metrics(metrics())  # the fast path
        agent.report({"backend": "simulated", "agent_version": "0.1.0", "accelerators": [
            {"index": 0, "kind": "cpu", "model_name": "cpu", "cpu_cores": 4}]})
        router = ControlPlaneClient(url, used["router credential"], timeout_s=30)
        assert router.routing_tables() == []
        router.router_report(router_report(router="logged-router"))

        # Each sent one character off, through the same clients, until the address is held.
        wrong = {f"wrong {name}": _off_by_one(secret) for name, secret in used.items()}
        statuses = []
        for _ in range(API_AUTH_FREE_FAILURES // 4 + 1):
            statuses.append(_refused(lambda: _Api(url, wrong["wrong operator API token"], timeout_s=30).call("GET", "/applications/")))
            statuses.append(_refused(lambda: ControlPlaneClient(url, wrong["wrong agent token"], timeout_s=30).host()))
            statuses.append(httpx.post(f"{url}/api/v1/hosts/{host.pk}/metrics/", json=metrics(),  # the fast path, then Django
                                       headers={"Authorization": f"Token {wrong['wrong agent token']}"}).status_code)
            statuses.append(_refused(lambda: ControlPlaneClient(url, wrong["wrong router credential"], timeout_s=30).routing_tables()))
        assert statuses.count(401) == API_AUTH_FREE_FAILURES and set(statuses) == {401, 429}
        agent.close()
        router.close()

    text = "\n".join(logs.lines)
    # The capture saw what it had to: the requests, the refusals, the clients, the SQL that looked each secret up
    # by its hash (where a secret stored or looked up as itself would show), Celery's task.
    assert {"django.request", "tessera.security", "httpx", "django.db.backends", "uvicorn.error"} <= logs.names, logs.names
    assert any(name.startswith("celery") for name in logs.names), logs.names
    for name in ("agent token", "router credential", "operator API token"):
        assert token_hash(used[name]) in text, name
    findings = secrets_in_logs_find(text, {**used, **wrong})
    assert findings == [], "\n".join(map(str, findings))
