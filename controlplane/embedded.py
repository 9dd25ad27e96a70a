"""The embedded scheduler: on embedded defaults (no broker, no beat process) it stands in for
django-celery-beat inside the control plane's process, running the same services the beat tasks run:
the planning watch and the job sweeper every few seconds (lost hosts, model pool, demand; jobs a dead
process left behind), each enabled re-planning policy's periodic re-plan at its interval, the hourly
telemetry retention and the history's (apps.core.housekeeping, every TESSERA_HOUSEKEEPING_EVERY_S). With
Redis configured, `celery beat` does this instead."""
from __future__ import annotations

import logging
import threading
import time

from django.db import connection

log = logging.getLogger("tessera.embedded")

WATCH_EVERY_S = 5.0
PRUNE_EVERY_S = 3600.0


def embedded_scheduler_start(*, watch_every_s: float = WATCH_EVERY_S) -> threading.Event:
    """Start the scheduler thread; set the returned event to stop it."""
    from datetime import timedelta

    from django.conf import settings

    from apps.core.housekeeping import housekeeping_run
    from apps.jobs.services import jobs_sweep
    from apps.planning.triggers import planning_watch, replan_periodic
    from apps.policies.models import ReplanPolicy
    from apps.telemetry.services import telemetry_prune

    stop = threading.Event()

    def run() -> None:
        last_periodic: dict[int, float] = {}
        started = last_prune = last_housekeeping = time.monotonic()
        try:
            while not stop.wait(watch_every_s):
                try:
                    planning_watch()
                    jobs_sweep()
                    now = time.monotonic()
                    for policy in ReplanPolicy.objects.filter(enabled=True):
                        if now - last_periodic.get(policy.pk, started) >= policy.interval_seconds:
                            last_periodic[policy.pk] = now
                            replan_periodic(policy_id=policy.pk)
                    if now - last_prune >= PRUNE_EVERY_S:
                        last_prune = now
                        telemetry_prune(older_than=timedelta(days=settings.TESSERA_TELEMETRY_RETENTION_DAYS))
                    if now - last_housekeeping >= settings.TESSERA_HOUSEKEEPING_EVERY_S:
                        last_housekeeping = now
                        housekeeping_run(older_than=timedelta(days=settings.TESSERA_HISTORY_RETENTION_DAYS))
                except Exception:  # the scheduler outlives a failed check; the next tick tries again
                    log.exception("embedded scheduler tick failed")
        finally:
            connection.close()

    threading.Thread(target=run, name="tessera-embedded-scheduler", daemon=True).start()
    return stop
