"""Celery adapters over planning services (thin: the work and its idempotence live in the services)."""
from celery import shared_task
from django.db import InterfaceError, OperationalError

from apps.jobs.services import TransientJobError, job_execute

from .services import plan_run_execute

# Solving is bounded by the run's time limit (at most 600 s), plus the snapshot, prediction and diff.
PLAN_RUN_SOFT_TIME_LIMIT_S = 900
PLAN_RUN_TIME_LIMIT_S = 960


@shared_task(
    name="planning.plan_run", bind=True, acks_late=True, max_retries=3, default_retry_delay=2,
    soft_time_limit=PLAN_RUN_SOFT_TIME_LIMIT_S, time_limit=PLAN_RUN_TIME_LIMIT_S,
)
def plan_run_task(self, job_id: int) -> dict | None:
    """Run a planning job (`plan_run_execute`). A transient failure (the database briefly away) is retried
    with backoff; the job's checkpoints keep a retry from solving again once a plan is stored."""
    try:
        return job_execute(
            job_id=job_id, work=lambda job: plan_run_execute(job=job), final_attempt=self.request.retries >= self.max_retries,
        )
    except (TransientJobError, OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, countdown=self.default_retry_delay * 2 ** self.request.retries)


# Rollout and rollback tasks live in rollout_tasks.py; imported here so the worker's autodiscovery
# (which imports each app's `tasks` module) registers them.
from .rollout_tasks import rollback_task, rollout_task  # noqa: E402,F401

# Re-planning trigger tasks (planning.replan_periodic, planning.watch, planning.replan_trigger), for autodiscovery.
from .trigger_tasks import *  # noqa: E402,F401,F403
