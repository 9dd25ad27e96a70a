"""Celery adapters over registry services."""
from celery import shared_task

from apps.jobs.services import TRANSIENT_ERRORS
from apps.jobs.tasks import job_task

from .services.artifacts import artifact_verify
from .services.profiling import (
    ProfilingJobWaiting,
    profiling_job_attempt_final,
    profiling_job_attempt_s,
    profiling_job_follow,
    profiling_job_poll_s,
    profiling_job_remaining_s,
    profiling_job_runner,
)

# One attempt of a profiling job follows its requests for at most TESSERA_PROFILING_JOB_ATTEMPT_S (capped
# well under the soft limit below), then hands over to a re-scheduled attempt: no worker is held for the
# whole of a long profiling run, and a killed worker's attempt is re-delivered (acks_late) and carries on.
PROFILING_JOB_SOFT_TIME_LIMIT = 300
PROFILING_JOB_ATTEMPT_MAX_S = PROFILING_JOB_SOFT_TIME_LIMIT - 60


@shared_task(name="registry.artifact_verify", acks_late=True, max_retries=3, soft_time_limit=300, time_limit=330)
def artifact_verify_task(artifact_id: int) -> dict:
    artifact = artifact_verify(artifact_id=artifact_id)
    return {"artifact": artifact.pk, "ok": not artifact.verify_error, "error": artifact.verify_error}


@job_task(
    name="registry.profiling_job", max_retries=None, retry_backoff=1, retry_backoff_max=60,  # 1, 2, 4 ... 60 s
    soft_time_limit=PROFILING_JOB_SOFT_TIME_LIMIT, time_limit=PROFILING_JOB_SOFT_TIME_LIMIT + 30,
)
def profiling_job_task(self, job_id: int) -> dict | None:
    """Follow a profiling job's requests until they finish or the job times out (services: variant_profile,
    profiling_job_follow). Idempotent: a finished job is left alone; a re-delivered or re-scheduled one
    carries on from its checkpoint. Re-scheduling is bounded by the job's own timeout, which fails it.
    Run eagerly (embedded services): in the in-process thread, it follows until the job's timeout; in
    its caller, it looks once and returns (the agents' reports move the job on), so nothing waits there.
    A transient failure (the database away) is retried with backoff (JobTask) until the job is well past
    its timeout (`profiling_job_attempt_final`)."""
    eager = bool(self.request.is_eager)
    poll = profiling_job_poll_s()
    if not eager:
        budget = min(profiling_job_attempt_s(), PROFILING_JOB_ATTEMPT_MAX_S)
    elif profiling_job_runner() == "thread":
        budget = profiling_job_remaining_s(job_id=job_id) + 2 * poll  # past the timeout, a look fails the job
    else:
        budget = 0.0
    final = not eager and profiling_job_attempt_final(job_id=job_id)
    try:
        return self.job_run(job_id, lambda job: profiling_job_follow(job=job, budget_s=budget, poll_s=poll), final_attempt=final)
    except ProfilingJobWaiting:
        if eager:
            return None
        raise self.retry(countdown=poll)  # the next attempt, at the polling pace rather than backing off
    except TRANSIENT_ERRORS:
        if eager:
            return None  # the next agent report, or the next call, picks it up
        raise  # retried with backoff (JobTask)
