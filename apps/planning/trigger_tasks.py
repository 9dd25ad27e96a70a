"""Celery adapters for the re-planning triggers (apps/planning/triggers.py); imported by
apps/planning/tasks.py for autodiscovery. Thin and idempotent: a duplicate delivery finds the run it
would start already started (active, or within the debounce window) and does nothing."""
from celery import shared_task

__all__ = ["planning_watch_task", "replan_periodic_task", "replan_trigger_task"]

_LIMITS = {"soft_time_limit": 60, "time_limit": 90}


@shared_task(name="planning.replan_periodic", acks_late=True, **_LIMITS)
def replan_periodic_task(policy_id: int) -> dict:
    """A policy's periodic re-plan (its beat task "replan:<policy name>")."""
    from .triggers import replan_periodic

    job = replan_periodic(policy_id=policy_id)
    return {"job": job.pk if job else None}


@shared_task(name="planning.watch", acks_late=True, **_LIMITS)
def planning_watch_task() -> dict:
    """The fleet, model-pool and demand checks (beat task "planning.watch", every few seconds)."""
    from .triggers import planning_watch

    return planning_watch()


@shared_task(name="planning.replan_trigger", acks_late=True, **_LIMITS)
def replan_trigger_task(trigger: str, detail: str = "") -> dict:
    """An event's re-plan (a model-pool signal), queued when its transaction commits."""
    from .triggers import replan_trigger

    job = replan_trigger(trigger=trigger, detail=detail)
    return {"job": job.pk if job else None}
