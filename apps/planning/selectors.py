"""Read-side helpers for plans and plan runs (querysets with what their views need joined in)."""
from __future__ import annotations

from django.db.models import QuerySet

from apps.jobs.choices import JOB_ACTIVE_STATUSES, JobKindChoices
from apps.jobs.models import Job

from .choices import PlanStatusChoices
from .models import Plan, PredictionCheck

__all__ = ["plan_active_get", "plan_for_job", "plan_queryset", "plan_run_active_get", "plan_run_queryset"]


def plan_queryset() -> QuerySet[Plan]:
    return Plan.objects.select_related("job", "previous", "created_by", "approved_by").prefetch_related("prediction_checks")


def prediction_check_queryset() -> QuerySet[PredictionCheck]:
    return PredictionCheck.objects.select_related("plan")


def plan_active_get() -> Plan | None:
    """The plan the fleet runs (at most one: a database constraint)."""
    return Plan.objects.filter(status=PlanStatusChoices.ACTIVE).first()


def plan_for_job(*, job: Job) -> Plan | None:
    return Plan.objects.filter(job=job).first()


def plan_run_queryset() -> QuerySet[Job]:
    """Planning jobs, newest first."""
    return Job.objects.filter(kind=JobKindChoices.PLANNING).select_related("actor")


def plan_run_active_get() -> Job | None:
    return plan_run_queryset().filter(status__in=JOB_ACTIVE_STATUSES).first()
