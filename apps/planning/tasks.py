"""Celery adapters over planning services (thin: the work and its idempotence live in the services)."""
from apps.jobs.tasks import job_task

from .services import plan_run_execute

# Solving is bounded by the run's time limit (at most 600 s), plus the snapshot, prediction and diff.
PLAN_RUN_SOFT_TIME_LIMIT_S = 900
PLAN_RUN_TIME_LIMIT_S = 960


@job_task(
    name="planning.plan_run", max_retries=3, retry_backoff=2,  # retried after 2, 4, 8 s
    soft_time_limit=PLAN_RUN_SOFT_TIME_LIMIT_S, time_limit=PLAN_RUN_TIME_LIMIT_S,
)
def plan_run_task(self, job_id: int) -> dict | None:
    """Run a planning job (`plan_run_execute`). A transient failure (the database briefly away) is retried
    with backoff; the job's checkpoints keep a retry from solving again once a plan is stored."""
    return self.job_run(job_id, lambda job: plan_run_execute(job=job))


# Rollout and rollback tasks live in rollout_tasks.py; imported here so the worker's autodiscovery
# (which imports each app's `tasks` module) registers them.
from .rollout_tasks import rollback_task, rollout_task  # noqa: E402,F401

# Re-planning trigger tasks (planning.replan_periodic, planning.watch, planning.replan_trigger), for autodiscovery.
from .trigger_tasks import *  # noqa: E402,F401,F403
