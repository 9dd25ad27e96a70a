"""The Celery app. Configuration comes from Django settings (CELERY_* names); tasks live in each app's
`tasks.py` and are thin adapters over services."""
import os

from celery import Celery
from celery.signals import task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.local")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _content_types_fresh(**kwargs) -> None:
    """A long-lived worker outlives the content-type ids it cached when the database under it is rebuilt
    (a restore; the test suite flushing it between tests), and the audit log writes those ids: each task
    reads them afresh (a handful of queries per task)."""
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()
