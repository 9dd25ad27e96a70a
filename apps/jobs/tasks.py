"""The one way a job's Celery task is declared: `job_task`. A job's task is a thin adapter taking the job's
id; it runs the job's attempt through `JobTask.job_run` (`job_execute`), and a transient failure
(TRANSIENT_ERRORS: the database or an agent briefly away) is retried by Celery's own `autoretry_for`,
after `retry_backoff * 2 ** retries` seconds (no jitter), at most `retry_backoff_max`. The job's checkpoints
keep a retry from redoing finished steps; the final attempt fails the job instead of raising. Every retry,
Celery's own or the task's `self.retry(countdown=...)`, records when the next attempt is due on the job
(`job_retry_scheduled`), so that the sweeper neither takes the wait for a dead worker nor forgets the job
when the retry's message is lost. Its one task of its own is the sweeper (`jobs.sweep`, on Celery beat:
settings CELERY_BEAT_SCHEDULE)."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, Callable

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from .models import Job
from .services import TRANSIENT_ERRORS, job_execute, job_retry_scheduled, jobs_sweep

log = logging.getLogger("tessera.jobs")

RETRY_BACKOFF_MAX_S = 600  # Celery's own default for retry_backoff_max


class JobTask(Task):
    """Base of every job's task: acknowledged once done (a killed worker's attempt is delivered again),
    retried on TRANSIENT_ERRORS with exponential backoff and no jitter."""

    acks_late = True
    autoretry_for = TRANSIENT_ERRORS
    retry_jitter = False

    def job_final_attempt(self) -> bool:
        """Whether this attempt is the last the task's `max_retries` allows (never, when it is None)."""
        return self.max_retries is not None and self.request.retries >= self.max_retries

    def job_run(self, job_id: int, work: Callable[[Job], dict | None], *, final_attempt: bool | None = None) -> dict | None:
        """Run `work(job)` as this attempt of the job (`job_execute`). `final_attempt` defaults to
        `job_final_attempt()`: on it a transient failure fails the job instead of being retried."""
        final = self.job_final_attempt() if final_attempt is None else final_attempt
        return job_execute(job_id=job_id, work=work, final_attempt=final)

    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None, max_retries=None, **options):
        """Celery's retry (autoretry_for's and the task's own), with the job told when its next attempt is
        due before the retry's message leaves (so that attempt finds the record made, never the reverse)."""
        request = self.request
        limit = self.max_retries if max_retries is None else max_retries
        if not request.called_directly and (limit is None or request.retries < limit):
            due = self._job_retry_due(eta, countdown)
            job_id = request.args[0] if request.args else (request.kwargs or {}).get("job_id")  # every job task takes the job id
            if job_id is not None:
                try:
                    job_retry_scheduled(job_id=job_id, retry_at=due)
                except (OperationalError, InterfaceError) as away:  # the heartbeat goes stale instead: the sweeper sends it
                    log.warning("job %s: its next attempt's time not recorded: %s", job_id, away)
        return super().retry(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown, max_retries=max_retries, **options)

    def _job_retry_due(self, eta: datetime | None, countdown: float | None) -> datetime:
        if eta is not None:
            return eta if timezone.is_aware(eta) else timezone.make_aware(eta, timezone.get_default_timezone())
        delay = self.default_retry_delay if countdown is None else countdown
        return timezone.now() + timedelta(seconds=float(delay or 0))


def job_task(
    *, name: str, max_retries: int | None, retry_backoff: int, retry_backoff_max: int = RETRY_BACKOFF_MAX_S, **options: Any
) -> Callable[[Callable[..., Any]], JobTask]:
    """`shared_task` for a job's task (bound, on JobTask): `max_retries` transient failures are retried
    (None: no limit, the task bounds itself), the n-th retry (n from 0) after
    `min(retry_backoff * 2 ** n, retry_backoff_max)` seconds. Other options (time limits) go to Celery."""
    return shared_task(
        name=name, base=JobTask, bind=True, max_retries=max_retries,
        retry_backoff=retry_backoff, retry_backoff_max=retry_backoff_max, **options,
    )


@shared_task(name="jobs.sweep", ignore_result=True, acks_late=False)
def jobs_sweep_task() -> dict[str, int]:
    """Re-send the jobs a broker or a killed worker lost (`jobs_sweep`)."""
    return jobs_sweep()
