"""Job services: create (one active job per key), queue, claim for a run (idempotent: a finished job is never
run again; a retried one carries on from its checkpoint), progress and log, heartbeats, finish, and the
sweeper. `job_execute` is the one place that turns a unit of work into a job run; Celery tasks are thin
adapters over it.

Delivery is reliable without trusting the broker's redelivery: the job row is the outbox. A job is queued
only when the broker answers (else the request fails with 503 and its transaction, job included, rolls
back); a message lost after the commit leaves a pending job that `jobs_sweep` sends again, and a running
attempt whose heartbeat stopped (its worker was killed) is sent again by the sweeper within the configured
bound (settings "Outages"). A stale pending job never blocks a new one of its key."""
from __future__ import annotations

import contextlib
import logging
import threading
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection as _connection, models, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce, Concat, Greatest
from django.utils import timezone

from apps.core.outages import BROKER_ERRORS, broker_check

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
    "job_retry_scheduled",
    "job_targets",
    "jobs_sweep",
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
    """A pending job. With `key`, raises `JobConflict` (carrying the active job) when one is active; a stale
    pending one (`_job_pending_stale`: its message never left, or no worker took it for
    TESSERA_JOB_PENDING_MAX_S) is failed with that reason instead, and the new job takes its place."""
    user = actor if getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None) else None
    job = Job(kind=kind, actor=user, actor_name=actor_name or (getattr(user, "username", "") if user else ""),
              targets=job_targets(targets), params=params or {}, key=key)
    # A few tries: the job in the way may finish (or be failed as stale) between our insert and our look at it.
    for last_try in (False, False, True):
        try:
            with transaction.atomic():
                job.save()
            break
        except IntegrityError:
            if not key:
                raise  # not the one-active-per-key rule: a real error
            active = Job.objects.filter(key=key, status__in=JOB_ACTIVE_STATUSES).first()
            if active is None:
                if last_try:
                    raise
                continue  # it finished in between: the key is free now
            stale = _job_pending_stale(active)
            if last_try or not stale:
                raise JobConflict(active) from None
            _job_finish(active.pk, status=JobStatusChoices.FAILED, error=f"superseded by a new {kind} job: {stale}")
    job_stream_announce(job.pk)
    return job


def _job_pending_stale(job: Job) -> str:
    """Why a pending job is stale ("" when it is not): its message never left for the broker although it
    should have within TESSERA_JOB_STALE_AFTER_S, or it has waited TESSERA_JOB_PENDING_MAX_S."""
    if job.status != JobStatusChoices.PENDING:
        return ""
    age = (timezone.now() - job.created).total_seconds()
    if age > settings.TESSERA_JOB_PENDING_MAX_S:
        return f"no worker took it in {age:.0f} s"
    if job.queued is None and age > settings.TESSERA_JOB_STALE_AFTER_S:
        return f"its task was never queued ({age:.0f} s)"
    return ""


def job_enqueue(*, job: Job, task: Any) -> None:
    """Queue the job's task once the transaction that created the job commits (never before: the worker
    would not find the row). The broker is asked first: when it does not answer, ServiceUnavailable (503)
    is raised now, inside the transaction, which rolls the job (and what came with it) back. On embedded
    defaults (no broker) the task runs in a thread of this process."""
    broker_check()
    Job.objects.filter(pk=job.pk).update(task=task.name)
    job.task = task.name
    transaction.on_commit(lambda: _task_send(task, job.pk))


def _task_send(task: Any, job_id: int) -> bool:
    """The one place a job's task leaves this process: to the broker, run in the caller when eager, or in
    a thread of this process (TESSERA_JOBS_IN_THREAD). Records when it left; a broker that fails now
    (after the commit) leaves the job pending for `jobs_sweep`, said in its log. Whether it left."""
    if getattr(settings, "TESSERA_JOBS_IN_THREAD", False):
        Job.objects.filter(pk=job_id).update(queued=timezone.now())
        threading.Thread(target=_in_process_run, args=(task, job_id), name=f"tessera-job-{job_id}", daemon=True).start()
        return True
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):  # no broker: it runs here, now
        Job.objects.filter(pk=job_id).update(queued=timezone.now())
        task.delay(job_id)
        return True
    sent_at = timezone.now()
    try:
        task.delay(job_id)
    except BROKER_ERRORS as exc:
        log.warning("job %s: its task could not be queued: %s", job_id, exc)
        job_progress(job_id=job_id, log_line=f"could not be queued ({exc}); it is sent again when the broker answers")
        return False
    Job.objects.filter(pk=job_id, status__in=JOB_ACTIVE_STATUSES).update(queued=sent_at)
    return True


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
    """Mark the job running for this attempt; None when it is already finished (or gone), or running
    elsewhere with a fresh heartbeat (a second delivery of the same task: the sweeper's and the broker's)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or not job.active:
            return None
        if job.status == JobStatusChoices.RUNNING and job.heartbeat and not _heartbeat_stale(job.heartbeat):
            log.info("job %s is running elsewhere (heartbeat %s); this delivery does nothing", job_id, job.heartbeat)
            return None
        job.status = JobStatusChoices.RUNNING
        job.attempts += 1
        job.started = job.started or timezone.now()
        job.heartbeat = timezone.now() if settings.TESSERA_JOB_HEARTBEAT_S > 0 else None
        job.retry_at = None
        job.log += _line(f"attempt {job.attempts} started" + (" (resuming from its checkpoint)" if job.checkpoint else ""))
        job.save(update_fields=["status", "attempts", "started", "heartbeat", "retry_at", "log"])
        job_stream_announce(job.pk)
        return job


def _heartbeat_stale(heartbeat) -> bool:
    return heartbeat < timezone.now() - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S)


@contextlib.contextmanager
def _heartbeats(job_id: int) -> Iterator[None]:
    """While the attempt runs, a thread writes its heartbeat every TESSERA_JOB_HEARTBEAT_S (on its own
    connection), so that the sweeper can tell a slow attempt from a dead worker's."""
    every_s = settings.TESSERA_JOB_HEARTBEAT_S
    if every_s <= 0:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(every_s):
                try:
                    Job.objects.filter(pk=job_id, status=JobStatusChoices.RUNNING).update(heartbeat=timezone.now())
                except (OperationalError, InterfaceError) as exc:  # the database away: the next beat tries again
                    log.warning("job %s: heartbeat not written: %s", job_id, exc)
        finally:
            _connection.close()

    thread = threading.Thread(target=beat, name=f"tessera-job-heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_s)


def job_retry_scheduled(*, job_id: int, retry_at: datetime) -> None:
    """Record that the job's attempt ended with its task's retry, due at `retry_at` (a transient failure's
    backoff, or a job that re-schedules itself to look again later). Between attempts nothing beats, so
    the wait itself counts as the job's sign of life: the sweeper leaves the job alone until `retry_at` +
    TESSERA_JOB_STALE_AFTER_S, and sends it again after that (the retry's message was lost: a worker
    killed while holding it, a broker restarted). A job no longer running is left as it is."""
    line = _line(f"next attempt due at {timezone.localtime(retry_at):%H:%M:%S}")
    if Job.objects.filter(pk=job_id, status=JobStatusChoices.RUNNING).update(
            heartbeat=None, retry_at=retry_at, log=Concat("log", Value(line), output_field=models.TextField())):
        job_stream_announce(job_id)


def _job_finish(job_id: int, *, status: str, result: dict | None = None, error: str = "") -> None:
    values: dict[str, Any] = {"status": status, "finished": timezone.now(), "error": error[:10_000], "heartbeat": None, "retry_at": None}
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
        with _heartbeats(job_id):
            result = work(job)
    except TRANSIENT_ERRORS as exc:
        if not final_attempt:
            job_progress(job_id=job_id, log_line=f"attempt {job.attempts} failed ({exc}); retrying")
            Job.objects.filter(pk=job_id).update(heartbeat=None)  # between attempts: nobody is running it
            raise
        _job_finish(job_id, status=JobStatusChoices.FAILED, error=f"gave up after {job.attempts} attempts: {exc}")
        return None
    except Exception as exc:  # the work's own failure: recorded, not retried
        log.exception("job %s failed", job_id)
        _job_finish(job_id, status=JobStatusChoices.FAILED, error=f"{exc.__class__.__name__}: {exc}")
        return None
    _job_finish(job_id, status=JobStatusChoices.SUCCEEDED, result=result or {})
    return result


def jobs_sweep() -> dict[str, int]:
    """Deliver what the broker lost (Celery beat runs it every TESSERA_JOB_SWEEP_EVERY_S; also callable on
    demand): send again a pending job whose task never left (TESSERA_JOB_STALE_AFTER_S after its creation)
    or that no worker took within TESSERA_JOB_REQUEUE_AFTER_S of its last send, and a running job whose
    last sign of life is older than TESSERA_JOB_STALE_AFTER_S (its worker died; the attempt resumes from
    its checkpoint), at most once per TESSERA_JOB_REQUEUE_AFTER_S after the first. A running job's sign of
    life is its heartbeat or, between attempts, the time its next attempt is due (`job_retry_scheduled`):
    a job waiting for its retry is not sent early, and is sent again when that attempt never started. Fail a job pending for
    TESSERA_JOB_PENDING_MAX_S. A send is claimed with a conditional update, so two sweepers never both
    send; a duplicate delivery is harmless anyway (`_job_claim`). Counts of what it did."""
    from celery import current_app

    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S)
    requeue_before = now - timedelta(seconds=settings.TESSERA_JOB_REQUEUE_AFTER_S)
    done = {"failed": 0, "pending_sent": 0, "running_sent": 0, "send_failed": 0}
    expired = Job.objects.filter(status=JobStatusChoices.PENDING, created__lt=now - timedelta(seconds=settings.TESSERA_JOB_PENDING_MAX_S))
    for job in expired:
        _job_finish(job.pk, status=JobStatusChoices.FAILED, error=f"no worker took it in {settings.TESSERA_JOB_PENDING_MAX_S:.0f} s")
        done["failed"] += 1
    lost = Job.objects.filter(status=JobStatusChoices.PENDING).exclude(task="").filter(
        Q(queued__isnull=True, created__lt=stale_before) | Q(queued__lt=requeue_before))
    # The later of the two (PostgreSQL's GREATEST skips a null, SQLite's MAX does not: both coalesced).
    alive_at = Greatest(Coalesce("heartbeat", "retry_at"), Coalesce("retry_at", "heartbeat"))
    dead = Job.objects.filter(status=JobStatusChoices.RUNNING).exclude(task="").alias(alive_at=alive_at).filter(alive_at__lt=stale_before).filter(
        Q(queued__isnull=True) | Q(queued__lt=F("alive_at")) | Q(queued__lt=requeue_before))
    for kind, jobs in (("pending_sent", lost), ("running_sent", dead)):
        for job in jobs:
            # Claim this send: only the sweeper whose update matched sends it.
            if not Job.objects.filter(pk=job.pk, queued=job.queued, status=job.status).update(queued=now):
                continue
            why = _job_lost_why(job, now)
            job_progress(job_id=job.pk, log_line=f"sweeper: {why}; sent again")
            task = _task_by_name(current_app, job.task)
            if task is not None and _task_send(task, job.pk):
                done[kind] += 1
            else:
                done["send_failed"] += 1
    if any(done.values()):
        log.warning("jobs sweep: %s", done)
    return done


def _job_lost_why(job: Job, now: datetime) -> str:
    """Why the sweeper sends `job` again, for its log."""
    if job.status != JobStatusChoices.RUNNING:
        return "no worker took it"
    if job.retry_at is not None and (job.heartbeat is None or job.retry_at >= job.heartbeat):
        return f"its next attempt, due {(now - job.retry_at).total_seconds():.0f} s ago, never started (its retry was lost)"
    return f"its worker stopped beating (last heartbeat {(now - job.heartbeat).total_seconds():.0f} s ago)"


def _task_by_name(app: Any, name: str) -> Any:
    """The registered task `name`; outside a worker the apps' tasks modules may not be imported yet."""
    if name not in app.tasks:
        app.loader.import_default_modules()  # Celery's autodiscovery of every app's tasks.py
    return app.tasks.get(name)
