"""Jobs: every long-running action (profiling, planning, rollout) is a row that its Celery task updates as
it runs, so an API client or the dashboard can follow it.

Jobs are not change-logged: their progress changes many times a second. What they act on is audited by
the services they call, with the job's actor."""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models

from apps.core.querysets import RestrictedQuerySet

from .choices import JOB_ACTIVE_STATUSES, JobKindChoices, JobStatusChoices


class Job(models.Model):
    kind = models.CharField(max_length=20, choices=JobKindChoices.choices)
    status = models.CharField(max_length=20, choices=JobStatusChoices.choices, default=JobStatusChoices.PENDING)
    progress = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    # What the job concerns: [{"type": "registry.modelvariant", "id": 3, "display": "tabular-cpu/linear"}].
    targets = models.JSONField(default=list, blank=True)
    params = models.JSONField(default=dict, blank=True, help_text="What the job was asked to do")
    result = models.JSONField(default=dict, blank=True)
    # Steps already done, so that a retried task (its worker was killed) does not do them twice.
    checkpoint = models.JSONField(default=dict, blank=True)
    # At most one active job per key (e.g. "planning:fleet"): the database refuses a second one.
    key = models.CharField(max_length=100, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    actor_name = models.CharField(max_length=150, blank=True, help_text="The user, or what started it (a trigger)")
    attempts = models.PositiveSmallIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Delivery bookkeeping for the sweeper (apps.jobs.services.jobs_sweep): the task that runs the job, when
    # it last left for the broker (null: never), and the running attempt's last sign of life (null: none
    # beating, e.g. heartbeats off or between attempts), and while it waits between attempts when its next
    # attempt is due (its task's retry): the sweeper counts that wait as alive, and sends the job again
    # only if that attempt has not started TESSERA_JOB_STALE_AFTER_S after it was due (its message lost).
    task = models.CharField(max_length=100, blank=True, help_text="The Celery task that runs the job")
    queued = models.DateTimeField(null=True, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True, help_text="Between attempts: when the next attempt is due")

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"], condition=models.Q(status__in=JOB_ACTIVE_STATUSES) & ~models.Q(key=""),
                name="job_one_active_per_key",
            ),
        ]
        # The sweeper reads the active few out of a table that keeps every job ever run.
        indexes = [models.Index(fields=["status"], condition=models.Q(status__in=JOB_ACTIVE_STATUSES), name="job_active")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} job {self.pk} ({self.status})"

    @property
    def active(self) -> bool:
        return self.status in JOB_ACTIVE_STATUSES
