"""Fixtures for the tests against real services. CI (.ci/run) provides PostgreSQL, Redis and a Celery
worker and sets TESSERA_REQUIRE_SERVICES=1; on a laptop without them these tests skip with the reason."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import service_unavailable, xdist_worker_index

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def redis_url() -> str:
    """REDIS_URL, with its database number moved up by the xdist worker's index (REDIS_URL's on `gw0` or
    without xdist, the next on `gw1`): each xdist worker its own queues, channel groups and Celery worker."""
    url = settings.TESSERA_TEST_REDIS_URL
    if not url:
        service_unavailable("REDIS_URL is not set")
    url = redis_db_url(url, redis_db_of(url) + xdist_worker_index())
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        service_unavailable(f"Redis at {url} is unreachable: {exc}")
    return url


def redis_db_of(url: str) -> int:
    """The database number `url` names (0 when it names none)."""
    from urllib.parse import urlsplit

    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def redis_db_url(url: str, db: int) -> str:
    """`url` with its database number replaced by `db`."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


@pytest.fixture
def private_redis_url(redis_url):
    """A Redis database of its own (13, or 13 + N on xdist worker `gwN`; flushed before and after): no other
    Celery worker consumes its queue (CI's workers, .ci/run, take every task sent to their REDIS_URL's), so a
    test that starts its own worker, or checks that a job stays queued, sees only its own."""
    import redis

    url = redis_db_url(redis_url, 13 + xdist_worker_index())
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def postgres(db):
    if connection.vendor != "postgresql":
        service_unavailable(f"the test database is {connection.vendor}, not PostgreSQL (set DATABASE_URL)")
    return connection


def _server_url_of_test_db() -> str:
    s = connection.settings_dict
    auth = (s["USER"] or "postgres") + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}"


def _database_url_of_test_db() -> str:
    return f"{_server_url_of_test_db()}/{connection.settings_dict['NAME']}"


@pytest.fixture
def postgres_server_url(postgres) -> str:
    """The test database's server, without a database: for benches that create a database of their own."""
    return _server_url_of_test_db()


@pytest.fixture
def celery_worker(transactional_db, redis_url, tmp_path_factory):
    """A real Celery worker consuming from Redis and writing to the test database. Uses the one .ci/run
    started for this xdist worker (TESSERA_CELERY_EXTERNAL_WORKER=1: on `gwN` a worker on the database
    `test_<NAME>_gwN` and Redis database REDIS_URL's + N, queue `celery`, media root TESSERA_MEDIA_ROOT),
    else starts one for this test on its own queue."""
    if connection.vendor != "postgresql":
        service_unavailable("a Celery worker shares the test database only on PostgreSQL (set DATABASE_URL)")
    from celery import Celery

    # Not the current app: shared tasks elsewhere in the session must keep resolving to the project's app.
    client = Celery("tessera-test-client", broker=redis_url, backend=redis_url, set_as_current=False)
    client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    if os.environ.get("TESSERA_CELERY_EXTERNAL_WORKER") == "1":
        media_root = Path(os.environ["TESSERA_MEDIA_ROOT"])
        if not client.control.ping(timeout=5):
            service_unavailable("TESSERA_CELERY_EXTERNAL_WORKER=1 but no Celery worker answers on Redis")
        yield client, "celery", media_root
        return
    queue = f"tessera-test-{uuid.uuid4().hex[:8]}"
    media_root = tmp_path_factory.mktemp("worker-media")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.local",
        "DATABASE_URL": _database_url_of_test_db(),
        "REDIS_URL": redis_url,
        "TESSERA_MEDIA_ROOT": str(media_root),
    }
    worker = subprocess.Popen(
        # Its own queue for what the test sends, and the default one for what its tasks queue in turn
        # (a plan run that auto-applies queues the rollout), as the worker .ci/run starts consumes.
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "-Q", f"{queue},celery",
         "--hostname", f"{queue}@%h", "--without-gossip", "--without-mingle", "--loglevel=INFO"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not client.control.ping(destination=[f"{queue}@{os.uname().nodename}"], timeout=1):
            if worker.poll() is not None or time.monotonic() > deadline:
                output = worker.stdout.read() if worker.poll() is not None else ""
                pytest.fail(f"Celery worker did not start:\n{output}")
        yield client, queue, media_root
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
