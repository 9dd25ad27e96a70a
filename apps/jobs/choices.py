from django.db import models


class JobKindChoices(models.TextChoices):
    PROFILING = "profiling", "Profiling"
    PLANNING = "planning", "Planning"
    ROLLOUT = "rollout", "Rollout"
    ROLLBACK = "rollback", "Rollback"


class JobStatusChoices(models.TextChoices):
    PENDING = "pending", "Pending"  # created, queued on commit
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


JOB_ACTIVE_STATUSES = (JobStatusChoices.PENDING, JobStatusChoices.RUNNING)
