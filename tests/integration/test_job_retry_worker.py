"""A job waiting between its attempts, with a real Celery worker and beat's job sweeper (issue 44): the wait
for the retry counts as the job's sign of life, so the sweeper does not send the job again meanwhile, and
when the retry's message is lost (the worker holding it until it was due is killed; the broker would give
it back only after its visibility timeout, an hour) the sweeper sends the job again once the retry is
overdue, and it finishes. Before, the job waited with no heartbeat at all, and the lost retry left it
running for ever."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from celery import Celery
from django.db import connection
from django.utils import timezone

from apps.jobs.models import Job
from apps.jobs.services import job_create
from tests.conftest import service_unavailable
from tests.waiting import wait_for

from .conftest import REPO, _database_url_of_test_db
from .processes import process_group_stop
from .job_retry_tasks import RETRY_AFTER_S

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

STALE_AFTER_S = 3  # the worker's TESSERA_JOB_STALE_AFTER_S, well under RETRY_AFTER_S


def _worker(redis_url: str, tmp_path, *, with_sweeper: bool) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DATABASE_URL": _database_url_of_test_db(),
           "REDIS_URL": redis_url, "TESSERA_BROKER_VISIBILITY_TIMEOUT": "3600", "TESSERA_JOB_HEARTBEAT_S": "0.5",
           "TESSERA_JOB_STALE_AFTER_S": str(STALE_AFTER_S), "TESSERA_JOB_SWEEP_EVERY_S": "1", "TESSERA_VAR_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "--include", "tests.integration.job_retry_tasks",
               "--hostname", f"retry-{uuid.uuid4().hex[:6]}@%h", "--without-gossip", "--without-mingle", "--loglevel=INFO"]
    if with_sweeper:
        command += ["--beat", "--schedule", str(tmp_path / f"beat-{uuid.uuid4().hex[:6]}")]
    log = (tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log").open("w")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def send(transactional_db, private_redis_url):
    if connection.vendor != "postgresql":
        service_unavailable("a Celery worker shares the test database only on PostgreSQL (set DATABASE_URL)")
    client = Celery("tessera-test-retry", broker=private_redis_url, set_as_current=False)
    client.conf.update(task_serializer="json", accept_content=["json"])

    def send_job() -> Job:
        job = job_create(kind="profiling", actor_name="test_job_retry_worker")
        Job.objects.filter(pk=job.pk).update(task="tests.fails_once")
        client.send_task("tests.fails_once", args=[job.pk], queue="celery")
        return job

    yield send_job
    client.close()


def _waiting_for_retry(job: Job) -> Job:
    return wait_for(lambda: Job.objects.filter(pk=job.pk, status="running", retry_at__isnull=False).first(), 90, "the first attempt to fail")


def test_the_sweeper_leaves_a_job_waiting_for_its_retry_alone(send, private_redis_url, tmp_path) -> None:
    worker = _worker(private_redis_url, tmp_path, with_sweeper=True)
    try:
        job = send()
        waiting = _waiting_for_retry(job)
        assert waiting.heartbeat is None and 0 < (waiting.retry_at - timezone.now()).total_seconds() <= RETRY_AFTER_S
        done = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=["succeeded", "failed"]).first(), 90, "the retry to finish the job")
        assert done.status == "succeeded", done.log + done.error
        assert done.attempts == 2 and "sweeper" not in done.log  # its own retry ran it; no second delivery
        assert done.retry_at is None
    finally:
        process_group_stop(worker)


def test_a_lost_retry_is_sent_again_by_the_sweeper(send, private_redis_url, tmp_path) -> None:
    first = _worker(private_redis_url, tmp_path, with_sweeper=False)
    second = None
    try:
        job = send()
        waiting = _waiting_for_retry(job)
        time.sleep(1)  # the worker has taken the retry's message, to hold it until it is due
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        second = _worker(private_redis_url, tmp_path, with_sweeper=True)
        done = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=["succeeded", "failed"]).first(), 90, "the lost retry's job to finish")
        assert done.status == "succeeded", done.log + done.error
        assert done.attempts == 2 and "never started (its retry was lost)" in done.log
        assert done.finished >= waiting.retry_at  # not sent before its retry was due
    finally:
        process_group_stop(first)
        process_group_stop(second)
