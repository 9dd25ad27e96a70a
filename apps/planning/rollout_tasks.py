"""Celery adapters for rollout and rollback jobs (imported by apps/planning/tasks.py for autodiscovery)."""
from apps.jobs.tasks import job_task

from .rollout import rollback_execute, rollout_execute

# A rollout waits for agents: its time limit is generous (waves x the convergence deadline). A transient
# failure is retried after 1, 2, 4 s.
_OPTIONS = {"max_retries": 3, "retry_backoff": 1, "soft_time_limit": 1800, "time_limit": 1860}


@job_task(name="planning.rollout", **_OPTIONS)
def rollout_task(self, job_id: int) -> dict | None:
    return self.job_run(job_id, lambda job: rollout_execute(job=job))


@job_task(name="planning.rollback", **_OPTIONS)
def rollback_task(self, job_id: int) -> dict | None:
    return self.job_run(job_id, lambda job: rollback_execute(job=job))
