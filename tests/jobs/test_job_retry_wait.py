"""A job waiting between its task's attempts (a retry with a countdown) is alive to the sweeper until that
attempt is due, and is sent again when the attempt never starts (issue 44): before, the wait wrote no
heartbeat, so a job whose retry's message was lost stayed running for ever, and one whose last heartbeat
landed after the attempt ended was sent again while its retry was still on its way."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job
from apps.jobs.services import job_create, job_execute, job_retry_scheduled, jobs_sweep

pytestmark = pytest.mark.django_db

TASK = "planning.plan_run"


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    sent: list[int] = []
    monkeypatch.setattr("apps.jobs.services._task_send", lambda task, job_id: sent.append(job_id) or True)
    return sent


def _waiting(retry_in_s: float, *, heartbeat_age_s: float | None = None, queued_age_s: float = 60.0) -> Job:
    """A running job whose attempt ended with a retry due `retry_in_s` from now (negative: overdue)."""
    now = timezone.now()
    job = job_create(kind="rollout")
    Job.objects.filter(pk=job.pk).update(task=TASK, status="running", attempts=1, queued=now - timedelta(seconds=queued_age_s))
    job_retry_scheduled(job_id=job.pk, retry_at=now + timedelta(seconds=retry_in_s))
    if heartbeat_age_s is not None:  # a heartbeat written after the attempt ended (its thread was slow to stop)
        Job.objects.filter(pk=job.pk).update(heartbeat=now - timedelta(seconds=heartbeat_age_s))
    job.refresh_from_db()
    return job


def test_a_job_waiting_for_its_retry_is_alive_until_the_retry_is_due(settings, sent) -> None:
    stale = settings.TESSERA_JOB_STALE_AFTER_S
    waiting = _waiting(30)
    assert waiting.status == "running" and waiting.heartbeat is None and waiting.retry_at > timezone.now()
    assert "next attempt due at" in waiting.log
    late_beat = _waiting(30, heartbeat_age_s=stale + 5)  # its heartbeat alone says dead: the retry says not yet
    just_due = _waiting(-(stale - 2))  # due a moment ago: the worker holding it may be picking it up
    assert jobs_sweep()["running_sent"] == 0 and sent == []
    for job in (waiting, late_beat, just_due):
        job.refresh_from_db()
        assert "sweeper" not in job.log


def test_a_retry_that_never_starts_is_sent_again_once(settings, sent) -> None:
    lost = _waiting(-(settings.TESSERA_JOB_STALE_AFTER_S + 1))
    assert jobs_sweep()["running_sent"] == 1 and sent == [lost.pk]
    lost.refresh_from_db()
    assert "never started (its retry was lost)" in lost.log
    assert jobs_sweep()["running_sent"] == 0 and sent == [lost.pk]  # once, not at every sweep
    # The attempt it sent starts: the wait is over, the attempt beats and finishes.
    settings.TESSERA_JOB_HEARTBEAT_S = 2.0
    assert job_execute(job_id=lost.pk, work=lambda job: {"attempt": job.attempts}) == {"attempt": 2}
    lost.refresh_from_db()
    assert (lost.status, lost.retry_at, lost.heartbeat) == ("succeeded", None, None)


def test_a_retry_recorded_for_a_job_no_longer_running_changes_nothing() -> None:
    job = job_create(kind="rollout")
    job_execute(job_id=job.pk, work=lambda j: {})
    job_retry_scheduled(job_id=job.pk, retry_at=timezone.now())
    job.refresh_from_db()
    assert job.status == "succeeded" and job.retry_at is None and "next attempt" not in job.log
