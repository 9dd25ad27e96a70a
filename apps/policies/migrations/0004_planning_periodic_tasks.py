"""Schedules the re-planning tasks on django-celery-beat at install: the watch ("planning.watch" every
5 s: lost hosts, fleet, model-pool and demand triggers) and one periodic re-plan per existing
ReplanPolicy ("replan:<name>"). From then on apps/planning/triggers.py keeps them in step (a policy's
save or delete resyncs its task and puts the watch back if it was deleted). Reversing removes them."""
import json

from django.db import migrations
from django.utils import timezone

WATCH = "planning.watch"
WATCH_INTERVAL_S = 5
REPLAN_TASK = "planning.replan_periodic"


def _interval(IntervalSchedule, seconds):
    found = IntervalSchedule.objects.filter(every=seconds, period="seconds").order_by("pk").first()
    return found or IntervalSchedule.objects.create(every=seconds, period="seconds")


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    ReplanPolicy = apps.get_model("policies", "ReplanPolicy")
    if not PeriodicTask.objects.filter(name=WATCH).exists():
        PeriodicTask.objects.create(
            name=WATCH, task=WATCH, interval=_interval(IntervalSchedule, WATCH_INTERVAL_S), kwargs="{}", enabled=True,
            expire_seconds=2 * WATCH_INTERVAL_S,
            description="Re-planning triggers: lost hosts, fleet, model-pool and demand changes (apps/planning/triggers.py)",
        )
    for policy in ReplanPolicy.objects.all():
        PeriodicTask.objects.update_or_create(
            name=f"replan:{policy.name}",
            defaults={
                "task": REPLAN_TASK, "interval": _interval(IntervalSchedule, policy.interval_seconds),
                "kwargs": json.dumps({"policy_id": policy.pk}), "enabled": policy.enabled, "expire_seconds": policy.interval_seconds,
                "description": f"Periodic re-plan of re-planning policy {policy.name} (apps/planning/triggers.py)",
            },
        )
    # Historical models send no signals: tell a running beat that its schedule changed.
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def unschedule(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    PeriodicTask.objects.filter(task__in=[WATCH, REPLAN_TASK]).delete()
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


class Migration(migrations.Migration):

    dependencies = [
        ("policies", "0003_replanpolicy_trigger_settings"),
        ("django_celery_beat", "0018_improve_crontab_helptext"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
