from django.db import models


class PlanStatusChoices(models.TextChoices):
    DRAFT = "draft", "Draft"  # solved, not yet checked
    VALIDATED = "validated", "Validated"  # passed plan_validate; waits for approval (auto-apply off)
    APPROVED = "approved", "Approved"
    ROLLING_OUT = "rolling_out", "Rolling out"
    ACTIVE = "active", "Active"  # what the fleet runs; at most one
    FAILED = "failed", "Failed"  # invalid, or its rollout failed (then rolled back)
    ROLLED_BACK = "rolled_back", "Rolled back"
    SUPERSEDED = "superseded", "Superseded"  # was active; a newer plan is


class PlanTriggerChoices(models.TextChoices):
    MANUAL = "manual", "Manual (API or dashboard)"
    PERIODIC = "periodic", "Periodic (re-planning policy interval)"
    DEMAND = "demand", "Demand changed beyond the policy's threshold"
    MODEL_POOL = "model_pool", "A variant was added or removed"
    FLEET = "fleet", "A host was lost or added"


# Which states may follow which (plan_status_set refuses anything else).
PLAN_TRANSITIONS = {
    PlanStatusChoices.DRAFT: {PlanStatusChoices.VALIDATED, PlanStatusChoices.FAILED},
    PlanStatusChoices.VALIDATED: {PlanStatusChoices.APPROVED, PlanStatusChoices.SUPERSEDED},
    PlanStatusChoices.APPROVED: {PlanStatusChoices.ROLLING_OUT, PlanStatusChoices.SUPERSEDED},
    PlanStatusChoices.ROLLING_OUT: {PlanStatusChoices.ACTIVE, PlanStatusChoices.FAILED, PlanStatusChoices.ROLLED_BACK},
    PlanStatusChoices.ACTIVE: {PlanStatusChoices.SUPERSEDED, PlanStatusChoices.ROLLED_BACK},
    PlanStatusChoices.FAILED: set(),
    PlanStatusChoices.ROLLED_BACK: set(),
    PlanStatusChoices.SUPERSEDED: {PlanStatusChoices.ACTIVE},  # its successor was rolled back
}


class PredictionTargetChoices(models.TextChoices):
    """What a prediction check compares (apps.planning.prediction)."""

    APPLICATION = "application", "Application"
    ENSEMBLE = "ensemble", "Ensemble"
    PIPELINE = "pipeline", "Pipeline"
