"""Jobs on the live stream: every change of a job's status, progress or log is announced, once committed,
on one channel-layer group; the dashboard's consumers forward it to subscribers who may view jobs."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.core.streams import group_publish

from .models import Job

JOB_GROUP = "tessera.jobs"
LOG_TAIL_CHARS = 20_000  # a browser shows the end of a long log; the page links to the whole job


def job_event(job: Job) -> dict[str, Any]:
    return {
        "type": "job.update",  # dispatched to the consumers' job_update
        "id": job.pk,
        "kind": job.kind,
        "status": job.status,
        "status_display": job.get_status_display(),
        "active": job.active,
        "progress": job.progress,
        "log": job.log[-LOG_TAIL_CHARS:],
        "error": job.error,
        "attempts": job.attempts,
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "targets": job.targets,
    }


def job_stream_publish(*, job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        group_publish(JOB_GROUP, job_event(job))


def job_stream_announce(job_id: int) -> None:
    """Publish the job's state once the current transaction (if any) commits."""
    transaction.on_commit(lambda: job_stream_publish(job_id=job_id))
