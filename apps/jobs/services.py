"""Job services: create (one active job per key), claim for a run (idempotent: a finished job is never run
again; a retried one carries on from its checkpoint), progress and log, finish. `job_execute` is the one
place that turns a unit of work into a job run; Celery tasks are thin adapters over it."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection as _connection, models, transaction
from django.db.models import Value
from django.db.models.functions import Concat
from django.utils import timezone

from .choices import JOB_ACTIVE_STATUSES, JobStatusChoices
from .models import Job
from .streams import job_stream_announce

log = logging.getLogger("tessera.jobs")

__all__ = [
    "JobConflict",
    "TransientJobError",
    "job_checkpoint_set",
    "job_create",
    "job_enqueue",
    "job_execute",
    "job_progress",
    "job_targets",
]


class JobConflict(Exception):
    """An active job with the same key exists (one plan run at a time per fleet, say)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        super().__init__(f"{job} is already {job.status} for {job.key!r}")


class TransientJobError(Exception):
    """A failure worth retrying (an agent or the database briefly away); anything else fails the job."""


TRANSIENT_ERRORS = (TransientJobError, OperationalError, InterfaceError)


def job_targets(objects: Iterable[models.Model]) -> list[dict[str, Any]]:
    return [{"type": obj._meta.label_lower, "id": obj.pk, "display": str(obj)} for obj in objects]


def job_create(
    *, kind: str, actor: Any = None, actor_name: str = "", targets: Iterable[models.Model] = (), params: dict | None = None, key: str = ""
) -> Job:
    """A pending job. With `key`, raises `JobConflict` (carrying the active job) when one is active."""
    user = actor if getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None) else None
    job = Job(kind=kind, actor=user, actor_name=actor_name or (getattr(user, "username", "") if user else ""),
              targets=job_targets(targets), params=params or {}, key=key)
    try:
        with transaction.atomic():
            job.save()
    except IntegrityError:
        active = Job.objects.filter(key=key, status__in=JOB_ACTIVE_STATUSES).first()
        if active is None:
            raise
        raise JobConflict(active) from None
    job_stream_announce(job.pk)
    return job


def job_enqueue(*, job: Job, task: Any) -> None:
    """Queue the job's task once the transaction that created the job commits (never before: the worker
    would not find the row). On embedded defaults (no broker) the task runs in a thread of this process."""
    if getattr(settings, "TESSERA_JOBS_IN_THREAD", False):
        transaction.on_commit(lambda: threading.Thread(target=_in_process_run, args=(task, job.pk), name=f"tessera-job-{job.pk}", daemon=True).start())
    else:
        transaction.on_commit(lambda: _task_send(task, job.pk))


def _task_send(task: Any, job_id: int) -> None:
    """The one place a job's task leaves this process (to the broker, or run in the caller when eager)."""
    task.delay(job_id)


def _in_process_run(task: Any, job_id: int) -> None:
    try:
        task.apply(args=(job_id,))
    except Exception:
        log.exception("job %s failed in the in-process worker", job_id)
    finally:
        _connection.close()  # this thread's connection; Django does not close it for us


def _line(text: str) -> str:
    return f"{timezone.now():%H:%M:%S} {text}\n"


def job_progress(*, job_id: int, progress: int | None = None, log_line: str = "") -> None:
    """Record progress (0..100) and append a log line; one UPDATE, safe from any thread."""
    values: dict[str, Any] = {}
    if progress is not None:
        values["progress"] = max(0, min(100, int(progress)))
    if log_line:
        values["log"] = Concat("log", Value(_line(log_line)), output_field=models.TextField())
    if values:
        Job.objects.filter(pk=job_id).update(**values)
        job_stream_announce(job_id)


def job_checkpoint_set(*, job_id: int, name: str, value: Any) -> None:
    """Remember that a step is done (and what it produced) for a retry of the same job."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        job.checkpoint = {**job.checkpoint, name: value}
        job.save(update_fields=["checkpoint"])


def _job_claim(job_id: int) -> Job | None:
    """Mark the job running for this attempt; None when it is already finished (or gone)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or not job.active:
            return None
        job.status = JobStatusChoices.RUNNING
        job.attempts += 1
        job.started = job.started or timezone.now()
        job.log += _line(f"attempt {job.attempts} started" + (" (resuming from its checkpoint)" if job.checkpoint else ""))
        job.save(update_fields=["status", "attempts", "started", "log"])
        job_stream_announce(job.pk)
        return job


def _job_finish(job_id: int, *, status: str, result: dict | None = None, error: str = "") -> None:
    values: dict[str, Any] = {"status": status, "finished": timezone.now(), "error": error[:10_000]}
    if status == JobStatusChoices.SUCCEEDED:
        values["progress"] = 100
        values["result"] = result or {}
    values["log"] = Concat("log", Value(_line(status + (f": {error}" if error else ""))), output_field=models.TextField())
    Job.objects.filter(pk=job_id).update(**values)
    job_stream_announce(job_id)


def job_execute(*, job_id: int, work: Callable[[Job], dict | None], final_attempt: bool = True) -> dict | None:
    """Run `work(job)` as the job's attempt. A finished job is not run again (a duplicate delivery of the
    task). A transient error is re-raised for the task to retry, unless this is its final attempt; any
    other error fails the job with its message."""
    job = _job_claim(job_id)
    if job is None:
        log.info("job %s is already finished; nothing to do", job_id)
        return None
    try:
        result = work(job)
    except TRANSIENT_ERRORS as exc:
        if not final_attempt:
            job_progress(job_id=job_id, log_line=f"attempt {job.attempts} failed ({exc}); retrying")
            raise
        _job_finish(job_id, status=JobStatusChoices.FAILED, error=f"gave up after {job.attempts} attempts: {exc}")
        return None
    except Exception as exc:  # the work's own failure: recorded, not retried
        log.exception("job %s failed", job_id)
        _job_finish(job_id, status=JobStatusChoices.FAILED, error=f"{exc.__class__.__name__}: {exc}")
        return None
    _job_finish(job_id, status=JobStatusChoices.SUCCEEDED, result=result or {})
    return result
