"""Schedules telemetry retention on django-celery-beat at install: "telemetry.prune" every hour deletes
samples older than TESSERA_TELEMETRY_RETENTION_DAYS (7 days by default). Reversing removes it."""
from django.db import migrations
from django.utils import timezone

PRUNE = "telemetry.prune"
EVERY_S = 3600


def schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    interval = IntervalSchedule.objects.filter(every=EVERY_S, period="seconds").order_by("pk").first() or IntervalSchedule.objects.create(
        every=EVERY_S, period="seconds"
    )
    PeriodicTask.objects.update_or_create(
        name=PRUNE, defaults={"task": PRUNE, "interval": interval, "kwargs": "{}", "enabled": True, "expire_seconds": EVERY_S,
                              "description": "Telemetry retention: delete samples older than TESSERA_TELEMETRY_RETENTION_DAYS"},
    )
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=PRUNE).delete()
    apps.get_model("django_celery_beat", "PeriodicTasks").objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


class Migration(migrations.Migration):

    dependencies = [
        ("telemetry", "0001_initial"),
        ("django_celery_beat", "0018_improve_crontab_helptext"),
    ]

    operations = [migrations.RunPython(schedule, unschedule)]
