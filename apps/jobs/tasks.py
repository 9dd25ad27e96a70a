"""The one way a job's Celery task is declared: `job_task`. A job's task is a thin adapter taking the job's
id; it runs the job's attempt through `JobTask.job_run` (`job_execute`), and a transient failure
(TRANSIENT_ERRORS: the database or an agent briefly away) is retried by Celery's own `autoretry_for`,
after `retry_backoff * 2 ** retries` seconds (no jitter), at most `retry_backoff_max`. The job's checkpoints
keep a retry from redoing finished steps; the final attempt fails the job instead of raising. Its one task
of its own is the sweeper (`jobs.sweep`, on Celery beat: settings CELERY_BEAT_SCHEDULE)."""
from __future__ import annotations

from typing import Any, Callable

from celery import Task, shared_task

from .models import Job
from .services import TRANSIENT_ERRORS, job_execute, jobs_sweep

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
