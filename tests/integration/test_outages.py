"""Outages of PostgreSQL and Redis (issue 16), played on fault proxies (benches/faultproxy.py) in front of the
real services, never on the services themselves: the control plane as shipped (`tessera serve`, local
settings, the psycopg pool) answers at once, in JSON under /api/ and with the "unavailable" page
elsewhere, holds no request while a service is frozen, creates no job it cannot queue, and says on
/healthz which service is down; a killed worker's job resumes through the heartbeat sweeper. The bounds
asserted are generous against the failures they catch (10 to 36 s before, or never)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection, connections
from django.test import Client

from apps.jobs.models import Job
from apps.users.services import token_create
from benches.faultproxy import FaultProxy, free_port, url_port, url_via
from tests.conftest import service_unavailable
from tests.waiting import wait_for

from .conftest import REPO, _database_url_of_test_db

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

BOUND_S = 5.0  # "answers at once": well under the 10-36 s the outages held requests before


class Served:
    """A `tessera serve` reaching PostgreSQL (the test database) and Redis only through fault proxies."""

    def __init__(self, redis_url: str, var_dir) -> None:
        database_url = _database_url_of_test_db()
        self.pg = FaultProxy(url_port(database_url, 5432)).start()
        self.redis = FaultProxy(url_port(redis_url, 6379)).start()
        self.port = free_port()
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DJANGO_DEBUG": "false", "TESSERA_VAR_DIR": str(var_dir),
               "DATABASE_URL": url_via(database_url, self.pg), "REDIS_URL": url_via(redis_url, self.redis)}
        self.var_dir = var_dir
        self.log = (var_dir / "server.log").open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--bind", "127.0.0.1", "--port", str(self.port)],
                                        cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        users = get_user_model().objects
        self.token = token_create(user=users.get(username="operator"), description="test_outages")[1]
        browser = Client()
        browser.force_login(users.get(username="viewer"))
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=20, headers={"Authorization": f"Bearer {self.token}"},
                                 cookies={"sessionid": browser.cookies[django_settings.SESSION_COOKIE_NAME].value})

        def up() -> bool:
            try:
                return self.http.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "tessera serve to answer")

    def timed(self, method: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = self.http.request(method, path, **kwargs)
        return response, time.monotonic() - started

    def close(self) -> None:
        self.http.close()
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()
        self.pg.stop()
        self.redis.stop()


@pytest.fixture
def served(transactional_db, private_redis_url, users, tmp_path):
    if connection.vendor != "postgresql":
        service_unavailable("the outage tests need PostgreSQL (set DATABASE_URL)")
    stack = Served(private_redis_url, tmp_path)
    try:
        yield stack
    finally:
        stack.close()


def _json_503(response: httpx.Response) -> dict:
    assert response.status_code == 503, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["retry-after"]) > 0
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"status", "code", "message"}
    assert body["error"]["status"] == 503 and body["error"]["code"] == "service_unavailable"
    return body["error"]


def test_postgres_refused_answers_json_503_the_unavailable_page_and_healthz_at_once(served) -> None:
    assert served.http.get("/api/v1/hosts/").status_code == 200
    served.pg.mode = "refused"
    response, waited = served.timed("GET", "/api/v1/hosts/")
    assert "database" in _json_503(response)["message"].lower() and waited < BOUND_S
    response, waited = served.timed("POST", "/api/v1/plan-runs/", json={})
    _json_503(response)
    assert waited < BOUND_S
    page, waited = served.timed("GET", "/overview/")
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html") and waited < BOUND_S
    assert "Database unavailable" in page.text and page.headers["retry-after"]
    health = served.http.get("/healthz")
    assert health.status_code == 503 and health.json()["down"] == ["database"]
    assert health.json()["services"]["broker"]["up"] is True
    served.pg.mode = "up"
    wait_for(lambda: served.http.get("/api/v1/hosts/").status_code == 200, 30, "the API back once PostgreSQL is")
    assert served.http.get("/healthz").json()["status"] == "ok"


def test_postgres_frozen_holds_no_request(served) -> None:
    assert served.http.get("/api/v1/hosts/").status_code == 200  # the pool holds connections open through the proxy
    served.pg.mode = "frozen"
    try:
        for path in ("/api/v1/hosts/", "/api/v1/hosts/", "/healthz"):
            response, waited = served.timed("GET", path)
            assert response.status_code == 503 and waited < BOUND_S + 2, (path, response.status_code, waited)
    finally:
        served.pg.mode = "up"
    wait_for(lambda: served.http.get("/api/v1/hosts/").status_code == 200, 30, "the API back once PostgreSQL is")


def test_a_pooled_connection_the_database_broke_is_replaced_not_lent(served) -> None:
    """PostgreSQL restarted (here: every connection reset, as a restart or a failover does) while the pool's
    connections sat idle. The next requests get fresh connections, not the broken ones: before the pool
    checked what it lends, the first request on each broken connection answered 503 ("server closed the
    connection"), and a worker's task failed once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # several connections into the pool, idle after
        assert set(pool.map(lambda _: served.http.get("/api/v1/hosts/").status_code, range(8))) == {200}
    served.pg.mode = "refused"  # resets every open connection through the proxy
    served.pg.mode = "up"
    statuses = []
    for _ in range(6):
        response, waited = served.timed("GET", "/api/v1/hosts/")
        statuses.append(response.status_code)
        assert waited < BOUND_S
    assert statuses == [200] * 6, (served.var_dir / "server.log").read_text()[-3000:]


@pytest.mark.parametrize("mode", ["refused", "frozen"])
def test_agents_metrics_get_json_503_at_once_while_postgres_is_away_and_are_stored_after(served, mode) -> None:
    """The metrics fast path (apps/telemetry/ingest.py, its batch writer) through the real server: with
    PostgreSQL away each report is answered 503 within the bound, the writer is not wedged, and once
    PostgreSQL is back the agent's retry of a refused report is stored once."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.inventory.services import host_agent_token_rotate
    from apps.telemetry.models import RuntimeSample
    from tests.factories import HostFactory

    host = HostFactory(name=f"outage-agent-{mode}")
    token = host_agent_token_rotate(host=host)
    start = timezone.now() - timedelta(minutes=5)

    def report(seconds: int):
        at = (start + timedelta(seconds=seconds)).isoformat()
        return served.timed("POST", f"/api/v1/hosts/{host.pk}/metrics/", headers={"Authorization": f"Token {token}"},
                            json={"at": at, "runtimes": [{"key": "gpu0", "application": "a", "arrivals": 1}]})

    assert report(0)[0].status_code == 201
    served.pg.mode = mode
    try:
        for seconds in (1, 2):
            response, waited = report(seconds)
            _json_503(response)
            assert waited < BOUND_S, waited
    finally:
        served.pg.mode = "up"
    wait_for(lambda: report(1)[0].status_code == 201, 30, "metrics stored once PostgreSQL is back")
    assert report(1)[0].json() == {"runtime_samples": 0, "gpu_samples": 0}  # sent again: stored once
    stored = sorted(RuntimeSample.objects.filter(host=host).values_list("at", flat=True))
    # Each at most once; the one answered 503 while PostgreSQL was frozen may have been written when it came
    # back (the writer had taken it): the agent's retry of it is then a duplicate, acknowledged.
    assert stored[:2] == [start, start + timedelta(seconds=1)] and stored[2:] in ([], [start + timedelta(seconds=2)])


@pytest.mark.parametrize("mode", ["refused", "frozen"])
def test_broker_away_plan_run_answers_503_at_once_and_creates_nothing(served, mode) -> None:
    served.redis.mode = mode
    try:
        response, waited = served.timed("POST", "/api/v1/plan-runs/", json={})
        assert "broker" in _json_503(response)["message"].lower() and waited < BOUND_S
        assert not Job.objects.exists()  # nothing that could wedge the next run
        assert served.http.get("/api/v1/hosts/").status_code == 200  # reads go on
        health = served.http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["down"] == ["broker", "channel_layer"]
    finally:
        served.redis.mode = "up"
    response = served.http.post("/api/v1/plan-runs/", json={})
    assert response.status_code == 202, response.text
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == "pending" and job.queued is not None and job.task == "planning.plan_run"
    assert served.http.post("/api/v1/plan-runs/", json={}).status_code == 409  # queued, waiting for a worker: not stale


def _frozen_mid(settings, act) -> list:
    """Run `act(wrapper, freeze)` on a connection of its own through a fault proxy in front of the test
    database, with a 1 s statement bound; `act` calls `freeze()` and then does the thing that must not hang.
    Returns [(outcome, seconds since the freeze)]: "cut off" when the thing raised OperationalError."""
    if connection.vendor != "postgresql":
        service_unavailable("needs PostgreSQL (set DATABASE_URL)")
    settings.TESSERA_DB_STATEMENT_TIMEOUT_S = 1.0
    outcome: list = []
    frozen_at: list = []
    with FaultProxy(url_port(_database_url_of_test_db(), 5432)) as proxy:

        def freeze() -> None:
            proxy.mode = "frozen"
            frozen_at.append(time.monotonic())

        def run() -> None:
            wrapper = connections.create_connection("default")
            wrapper.settings_dict = {**wrapper.settings_dict, "HOST": "127.0.0.1", "PORT": proxy.port}
            try:
                act(wrapper, freeze)
                outcome.append(("answered", time.monotonic() - frozen_at[-1]))
            except OperationalError:
                outcome.append(("cut off", time.monotonic() - frozen_at[-1]))
            finally:
                wrapper.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=15)
        proxy.mode = "up"  # releases whatever still waits (the failure these tests catch)
        thread.join(timeout=10)
    return outcome


def test_a_statement_on_a_frozen_postgres_is_cut_off(transactional_db, settings) -> None:
    """The watchdog (apps.core.outages): libpq has no read timeout, and a frozen server never runs its own
    statement_timeout; without the watchdog the statement waits until the server thaws."""

    def statement(wrapper, freeze) -> None:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
            freeze()
            cursor.execute("SELECT 2")

    outcome = _frozen_mid(settings, statement)
    assert outcome and outcome[0][0] == "cut off" and outcome[0][1] < 5, outcome


def test_a_commit_on_a_frozen_postgres_is_cut_off(transactional_db, settings) -> None:
    """Issue 44: COMMIT goes through psycopg's connection, not a cursor, so the execute wrappers never watched
    it; a server frozen between a transaction's last statement and its COMMIT held the caller until it
    thawed. Tessera's engine (controlplane/postgresql) watches COMMIT and ROLLBACK too."""

    def commit(wrapper, freeze) -> None:
        wrapper.set_autocommit(False)
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
        freeze()
        wrapper.commit()

    outcome = _frozen_mid(settings, commit)
    assert type(connections["default"]).__module__ == "controlplane.postgresql.base"
    assert outcome and outcome[0][0] == "cut off" and outcome[0][1] < 5, outcome


def test_migrate_runs_under_its_own_statement_bound(transactional_db, settings, monkeypatch) -> None:
    """Issue 44: `manage.py migrate` ran under the requests' statement timeout, so a migration longer than
    4 s (a large table rewritten) failed half-way. It runs under TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S (none by
    default), and the connection is back on the request bound afterwards."""
    from django.core.management import call_command
    from django.core.management.commands.migrate import Command as DjangoMigrate
    from django.db.utils import OperationalError as DatabaseError

    if connection.vendor != "postgresql":
        service_unavailable("needs PostgreSQL (set DATABASE_URL)")
    from apps.core.outages import statement_bound_s

    def shown() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return cursor.fetchone()[0]

    request_bound = shown()
    assert request_bound == f"{settings.TESSERA_DB_STATEMENT_TIMEOUT_S:g}s"  # the connection's options set it
    ran: list = []

    def long_migration(self, *args, **options) -> None:  # Django's migrate, standing for a long migration
        ran.append((shown(), statement_bound_s()))
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.3)")

    monkeypatch.setattr(DjangoMigrate, "handle", long_migration)
    call_command("migrate", verbosity=0)
    assert ran == [("0", 0.0)]  # unbounded on the server and for the watchdog
    assert shown() == request_bound  # and the connection is back on the request bound
    settings.TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S = 0.2
    with pytest.raises(DatabaseError, match="statement timeout"):
        call_command("migrate", verbosity=0)  # a bound of its own, when one is set

def _worker(redis_url: str, tmp_path, *, beat: bool) -> subprocess.Popen:
    """A Celery worker on the test database with the bench's `bench.steps` job, fast sweeper settings, and
    kombu's own redelivery out of the way (an hour), so only the sweeper can bring a killed job back."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DATABASE_URL": _database_url_of_test_db(),
           "REDIS_URL": redis_url, "TESSERA_BROKER_VISIBILITY_TIMEOUT": "3600", "TESSERA_JOB_HEARTBEAT_S": "0.5",
           "TESSERA_JOB_STALE_AFTER_S": "3", "TESSERA_JOB_SWEEP_EVERY_S": "1", "TESSERA_VAR_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "--include", "benches.fault_tasks",
           "--hostname", f"outages-{uuid.uuid4().hex[:6]}@%h", "--without-gossip", "--without-mingle", "--loglevel=INFO"]
    if beat:  # the sweeper's schedule (settings CELERY_BEAT_SCHEDULE) in the worker's own beat
        cmd += ["--beat", "--schedule", str(tmp_path / f"beat-{uuid.uuid4().hex[:6]}")]  # the settings' scheduler (apps.core.beat)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def test_a_killed_workers_job_resumes_through_the_sweeper(transactional_db, private_redis_url, tmp_path) -> None:
    if connection.vendor != "postgresql":
        service_unavailable("a Celery worker shares the test database only on PostgreSQL (set DATABASE_URL)")
    from celery import Celery

    from apps.jobs.services import job_create

    redis_url = private_redis_url
    client = Celery("tessera-test-outages", broker=redis_url, set_as_current=False)
    client.conf.update(task_serializer="json", accept_content=["json"])
    steps = 6
    job = job_create(kind="profiling", actor_name="test_outages", params={"steps": steps})
    Job.objects.filter(pk=job.pk).update(task="bench.steps")
    first = _worker(redis_url, tmp_path, beat=False)
    second = None
    try:
        client.send_task("bench.steps", args=[job.pk], queue="celery")
        wait_for(lambda: Job.objects.filter(pk=job.pk, progress__gt=0).exists(), 90, "the job's first step")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        second = _worker(redis_url, tmp_path, beat=True)
        done = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=["succeeded", "failed"]).first(), 90, "the killed job to resume and finish")
        assert done.status == "succeeded", done.log + done.error
        assert done.attempts == 2 and "stopped beating" in done.log and "resuming from its checkpoint" in done.log
        assert done.result == {"steps": steps, "attempts": 2}
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
        client.close()
