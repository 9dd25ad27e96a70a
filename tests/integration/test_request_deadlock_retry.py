"""An operator's request that PostgreSQL rolls back for a deadlock is run once more and answered, not 503
(issue 44): through the API (a REST framework view) and the dashboard (a Django view), on `tessera serve`
(Daphne, the psycopg pool) over the real test database. The deadlock is a real one: a second transaction
holds the operator's user row (FOR UPDATE), the request updates its object and then, at its COMMIT, waits
for that row (the audit record's foreign key, deferred, takes a share lock on it), and the second transaction then updates the
request's object, closing the cycle. Its deadlock_timeout is long, so PostgreSQL picks the request as the
victim; the second transaction then commits, and the request's second run goes through."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client

from apps.inventory.models import Host
from apps.policies.models import SloPolicy
from apps.users.services import token_create
from benches.faultproxy import free_port
from tests.conftest import service_unavailable
from tests.factories import SloPolicyFactory
from tests.waiting import wait_for

from .conftest import REPO, _database_url_of_test_db

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]


@pytest.fixture
def server(transactional_db, users, tmp_path):
    """`tessera serve` on the test database (embedded services otherwise: nothing here needs Redis)."""
    if connection.vendor != "postgresql":
        service_unavailable("a deadlock is PostgreSQL's (set DATABASE_URL)")
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DJANGO_DEBUG": "false", "TESSERA_VAR_DIR": str(tmp_path),
           "DATABASE_URL": _database_url_of_test_db(), "REDIS_URL": ""}
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--bind", "127.0.0.1", "--port", str(port)],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def up() -> bool:
        try:
            return http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, "tessera serve to answer")
        yield http, log_path
    finally:
        http.close()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def _deadlocked(request, *, user_pk: int, table: str, pk: int) -> httpx.Response:
    """Send `request()` (on a thread) into a deadlock with a second transaction, as the module docstring
    says, and return its answer."""
    other = psycopg.connect(_database_url_of_test_db(), autocommit=False)
    answer: list = []
    try:
        other.execute("SET deadlock_timeout = '60s'")  # never the one to look for the cycle: the request is
        other.execute("SELECT 1 FROM auth_user WHERE id = %s FOR UPDATE", [user_pk])
        sender = threading.Thread(target=lambda: answer.append(request()))
        sender.start()

        def request_waits_for_the_user_row() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
                               "AND pid <> %s", [other.info.backend_pid])
                return cursor.fetchone()[0] > 0

        wait_for(request_waits_for_the_user_row, 30, "the request to wait for the user's row", interval_s=0.02)
        other.execute(f'UPDATE "{table}" SET id = id WHERE id = %s', [pk])  # the cycle: PostgreSQL ends the request's transaction
        other.commit()
        sender.join(30)
    finally:
        other.close()
    assert answer, "the request did not answer"
    return answer[0]


def test_a_deadlocked_api_request_is_run_again_and_succeeds(server, users) -> None:
    http, log_path = server
    operator = users["operator"]
    token = token_create(user=operator, description="test_request_deadlock_retry")[1]
    host = Host.objects.create(name="deadlock-host")
    response = _deadlocked(lambda: http.patch(f"/api/v1/hosts/{host.pk}/", json={"description": "set by the operator"},
                                              headers={"Authorization": f"Bearer {token}"}),
                           user_pk=operator.pk, table=Host._meta.db_table, pk=host.pk)
    assert response.status_code == 200, response.text[:500]
    host.refresh_from_db()
    assert host.description == "set by the operator"
    assert "running the request once more" in log_path.read_text()


def test_a_deadlocked_dashboard_post_is_run_again_and_succeeds(server, users) -> None:
    http, log_path = server
    operator = users["operator"]
    policy = SloPolicyFactory(application__name="deadlock-app", latency_p99_ms=60.0, priority=40)
    browser = Client()
    browser.force_login(operator)
    http.cookies.set(django_settings.SESSION_COOKIE_NAME, browser.cookies[django_settings.SESSION_COOKIE_NAME].value)
    assert http.get("/policies/").status_code == 200  # the CSRF cookie
    form = {"csrfmiddlewaretoken": http.cookies[django_settings.CSRF_COOKIE_NAME], "kind": "slo", "pk": str(policy.pk),
            "latency_p99_ms": "75", "min_accuracy": "", "priority": "40", "drop_rule": policy.drop_rule}
    response = _deadlocked(lambda: http.post("/policies/", data=form), user_pk=operator.pk, table=SloPolicy._meta.db_table, pk=policy.pk)
    assert response.status_code == 302 and response.headers["location"] == "/policies/", response.text[:500]
    policy.refresh_from_db()
    assert policy.latency_p99_ms == 75.0
    assert "running the request once more" in log_path.read_text()
