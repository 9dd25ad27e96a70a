"""Celery adapters over the core services."""
from datetime import timedelta

from celery import shared_task
from django.conf import settings


@shared_task(name="core.housekeeping", acks_late=True, soft_time_limit=600, time_limit=660)
def housekeeping_task(retention_days: float | None = None) -> dict:
    """Prune the history older than `retention_days` (TESSERA_HISTORY_RETENTION_DAYS) and vacuum where
    autovacuum does not: apps.core.housekeeping.housekeeping_run. Idempotent; on the beat schedule every
    TESSERA_HOUSEKEEPING_EVERY_S."""
    from .housekeeping import housekeeping_run

    days = retention_days if retention_days is not None else settings.TESSERA_HISTORY_RETENTION_DAYS
    return housekeeping_run(older_than=timedelta(days=float(days)))
