"""The Celery app. Configuration comes from Django settings (CELERY_* names); tasks live in each app's
`tasks.py` and are thin adapters over services."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.local")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
