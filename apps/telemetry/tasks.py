"""Celery adapters over telemetry services."""
from datetime import timedelta

from celery import shared_task
from django.conf import settings

@shared_task(name="telemetry.prune", acks_late=True, soft_time_limit=600, time_limit=660)
def telemetry_prune_task(retention_days: float | None = None) -> dict:
    """Delete samples older than `retention_days` (TESSERA_TELEMETRY_RETENTION_DAYS, else 7 days); meant for
    a periodic schedule (django-celery-beat)."""
    from .services import telemetry_prune

    days = retention_days if retention_days is not None else settings.TESSERA_TELEMETRY_RETENTION_DAYS
    return telemetry_prune(older_than=timedelta(days=float(days)))
