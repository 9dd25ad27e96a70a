"""Celery beat and its database (issue 44): beat started while PostgreSQL refuses waits for it and then sends
its periodic tasks (django-celery-beat's scheduler exited at once, leaving the job sweeper and the planning
watch to a supervisor's restart), and a beat whose database goes away while it runs keeps ticking and
reads its schedule again once the database answers. PostgreSQL is the real test database, reached through
a fault proxy (benches/faultproxy.py) that refuses or freezes; Redis is a database of its own, where the
test reads what beat sent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import redis
from django.db import connection

from benches.faultproxy import FaultProxy, url_port, url_via
from tests.conftest import service_unavailable
from tests.waiting import wait_for

from .conftest import REPO, _database_url_of_test_db
from .processes import process_group_stop

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]


def _sent_tasks(redis_url: str) -> list[str]:
    """The task names of the messages waiting in the default queue (nothing consumes it here)."""
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    try:
        return [json.loads(message)["headers"]["task"] for message in client.lrange("celery", 0, -1)]
    finally:
        client.close()


def _env(redis_url: str, proxy: FaultProxy, tmp_path) -> dict:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DATABASE_URL": url_via(_database_url_of_test_db(), proxy),
            "REDIS_URL": redis_url, "TESSERA_VAR_DIR": str(tmp_path), "TESSERA_JOB_SWEEP_EVERY_S": "1"}


@pytest.fixture
def pg_proxy(transactional_db):
    if connection.vendor != "postgresql":
        service_unavailable("beat's scheduler reads PostgreSQL (set DATABASE_URL)")
    proxy = FaultProxy(url_port(_database_url_of_test_db(), 5432)).start()
    yield proxy
    proxy.stop()


def test_beat_started_while_postgres_refuses_waits_then_sends_and_rides_out_an_outage(pg_proxy, private_redis_url, tmp_path) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    pg_proxy.mode = "refused"
    log_path = tmp_path / "beat.log"
    with log_path.open("w") as log:
        # As deploy/ starts it: the scheduler is the settings' (CELERY_BEAT_SCHEDULER).
        beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO", "--max-interval", "1",
                                 "-s", str(tmp_path / "beat-schedule")],
                                cwd=REPO, env=_env(private_redis_url, pg_proxy, tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        time.sleep(8)  # several of its tries, each refused
        assert beat.poll() is None, f"beat exited while the database was away:\n{log_path.read_text()[-3000:]}"
        assert "the database is unavailable for reading its schedule" in log_path.read_text()
        assert _sent_tasks(private_redis_url) == []

        pg_proxy.mode = "up"
        wait_for(lambda: "jobs.sweep" in _sent_tasks(private_redis_url), 60, "beat to send the job sweeper once the database answers")
        assert PeriodicTask.objects.filter(name="jobs.sweep", enabled=True).exists()  # CELERY_BEAT_SCHEDULE's entry, installed

        # Away while it runs: it keeps ticking on the schedule it read, then reads it again.
        pg_proxy.mode = "refused"
        time.sleep(5)
        pg_proxy.mode = "frozen"
        time.sleep(6)
        pg_proxy.mode = "up"
        assert beat.poll() is None, f"beat exited during the outage:\n{log_path.read_text()[-3000:]}"
        every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name="a task added after the outage", task="tests.beat_probe", interval=every_second)
        wait_for(lambda: "tests.beat_probe" in _sent_tasks(private_redis_url), 60, "beat to read its changed schedule after the outage")
        text = log_path.read_text()
        assert "the database answers again" in text and "Traceback" not in text
    finally:
        process_group_stop(beat)


# The schedule is read again in full at least every 5 minutes (django-celery-beat's SCHEDULE_SYNC_MAX_INTERVAL),
# whatever the database is doing then: one scheduler, in a process of its own, is made to meet that re-read
# inside an outage (its last full read dated back 5 minutes), then ticks after the database returns.
_SCHEDULER_DRIVER = textwrap.dedent("""
    import datetime, sys
    import django
    django.setup()
    from django.utils.module_loading import import_string
    from django_celery_beat.schedulers import SCHEDULE_SYNC_MAX_INTERVAL
    from controlplane.celery import app

    scheduler = import_string(sys.argv[1])(app=app, max_interval=1)
    print("ready", flush=True)
    sys.stdin.readline()  # the database is away now
    scheduler._last_full_sync -= datetime.timedelta(seconds=SCHEDULE_SYNC_MAX_INTERVAL)
    scheduler.tick()
    print("ticked during the outage", flush=True)
    sys.stdin.readline()  # the database is back
    for _ in range(3):
        scheduler.tick()
    print("ticked after", sorted(scheduler.schedule), flush=True)
""")


def test_a_schedule_reread_during_an_outage_keeps_the_last_schedule(pg_proxy, private_redis_url, tmp_path) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    log_path = tmp_path / "scheduler.log"
    with log_path.open("w") as log:
        driver = subprocess.Popen([sys.executable, "-c", _SCHEDULER_DRIVER, "apps.core.beat.DatabaseWaitingScheduler"], cwd=REPO,
                                  env=_env(private_redis_url, pg_proxy, tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=log, text=True, start_new_session=True)
    try:
        assert driver.stdout.readline().strip() == "ready", log_path.read_text()[-3000:]
        pg_proxy.mode = "refused"
        driver.stdin.write("\n")
        driver.stdin.flush()
        line = driver.stdout.readline()
        assert line.strip() == "ticked during the outage", log_path.read_text()[-3000:]
        pg_proxy.mode = "up"
        every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name="a task added after the outage", task="tests.beat_probe", interval=every_second)
        driver.stdin.write("\n")
        driver.stdin.flush()
        line = driver.stdout.readline()
        assert line.startswith("ticked after") and "a task added after the outage" in line, line + log_path.read_text()[-3000:]
        assert driver.wait(timeout=30) == 0
    finally:
        process_group_stop(driver)


def test_beat_gives_up_after_its_bound_and_says_so(pg_proxy, private_redis_url, tmp_path) -> None:
    """The wait is bounded (TESSERA_BEAT_DATABASE_WAIT_S): past it beat exits non-zero, for its supervisor."""
    pg_proxy.mode = "refused"
    env = {**_env(private_redis_url, pg_proxy, tmp_path), "TESSERA_BEAT_DATABASE_WAIT_S": "3"}
    started = time.monotonic()
    beat = subprocess.run([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO", "-s", str(tmp_path / "beat-schedule")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert beat.returncode != 0 and time.monotonic() - started < 30
    assert "the database did not answer reading its schedule" in beat.stderr + beat.stdout
