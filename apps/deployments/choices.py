from django.db import models


class RuntimeStateChoices(models.TextChoices):
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    FAILED = "failed", "Failed"


class OperationOutcomeChoices(models.TextChoices):
    OK = "ok", "OK"
    FAILED = "failed", "Failed"


# A route's state when no agent has reported the runtime behind it.
ROUTE_STATE_UNKNOWN = "unknown"
