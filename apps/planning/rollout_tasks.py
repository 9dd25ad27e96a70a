"""Celery adapters for rollout and rollback jobs (imported by apps/planning/tasks.py for autodiscovery)."""
from celery import shared_task

from apps.jobs.services import TRANSIENT_ERRORS, job_execute

from .rollout import rollback_execute, rollout_execute

# A rollout waits for agents: its time limit is generous (waves x the convergence deadline).
_LIMITS = {"soft_time_limit": 1800, "time_limit": 1860}


@shared_task(name="planning.rollout", bind=True, acks_late=True, max_retries=3, **_LIMITS)
def rollout_task(self, job_id: int) -> dict | None:
    try:
        return job_execute(job_id=job_id, work=lambda job: rollout_execute(job=job), final_attempt=self.request.retries >= self.max_retries)
    except TRANSIENT_ERRORS as exc:
        raise self.retry(exc=exc, countdown=2 ** self.request.retries)


@shared_task(name="planning.rollback", bind=True, acks_late=True, max_retries=3, **_LIMITS)
def rollback_task(self, job_id: int) -> dict | None:
    try:
        return job_execute(job_id=job_id, work=lambda job: rollback_execute(job=job), final_attempt=self.request.retries >= self.max_retries)
    except TRANSIENT_ERRORS as exc:
        raise self.retry(exc=exc, countdown=2 ** self.request.retries)
