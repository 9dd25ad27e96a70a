"""A job task for tests/integration/test_job_retry_worker.py, loaded by the Celery worker those tests start
(`--include tests.integration.job_retry_tasks`): its first attempt fails with a transient error, so Celery
retries it after RETRY_AFTER_S (JobTask's backoff: `retry_backoff` seconds for the first retry); the second
attempt succeeds. Nothing in the product queues it."""
from __future__ import annotations

from apps.jobs.models import Job
from apps.jobs.services import TransientJobError, job_checkpoint_set
from apps.jobs.tasks import job_task

RETRY_AFTER_S = 8


@job_task(name="tests.fails_once", max_retries=3, retry_backoff=RETRY_AFTER_S)
def fails_once_task(self, job_id: int) -> dict | None:
    def work(job: Job) -> dict:
        if not job.checkpoint.get("failed_once"):
            job_checkpoint_set(job_id=job.pk, name="failed_once", value=True)
            raise TransientJobError("the first attempt fails")
        return {"attempts": job.attempts}

    return self.job_run(job_id, work)
