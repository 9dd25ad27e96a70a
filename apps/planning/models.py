"""Plans: one planning run's inputs (a snapshot), the engine's answer, its validation, the simulator's
prediction, the diff against the active plan, and its lifecycle from draft to active (and beyond)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.core.querysets import RestrictedQuerySet

from .choices import PlanStatusChoices, PlanTriggerChoices, PredictionTargetChoices


class Plan(ChangeLoggedModel):
    status = models.CharField(max_length=20, choices=PlanStatusChoices.choices, default=PlanStatusChoices.DRAFT)
    trigger = models.CharField(max_length=20, choices=PlanTriggerChoices.choices, default=PlanTriggerChoices.MANUAL)
    trigger_detail = models.CharField(max_length=500, blank=True)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="plans",
                            help_text="The planning job that made it")
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="successors",
                                 help_text="The plan that was active when this one was made (its diff is against it)")
    # Inputs, as snapshotted: the engine's problem (fleet, variants, profiles, SLOs, demand) and how demand was estimated.
    problem = models.JSONField(default=dict, blank=True)
    demand = models.JSONField(default=dict, blank=True, help_text="{application: rps} the plan was made for, with its sources")
    # Device names in `problem` -> inventory: {"sim-a100-01/gpu0": {"host": 1, "kind": "gpu", "index": 0}}
    devices = models.JSONField(default=dict, blank=True)
    # The engine's answer.
    solver = models.CharField(max_length=80, blank=True)  # composed planners: "biscale+gpulets+garrison-demand"
    objective_kind = models.CharField(max_length=30, blank=True)
    solver_status = models.CharField(max_length=30, blank=True)
    objective = models.FloatField(null=True, blank=True)
    bound = models.FloatField(null=True, blank=True)
    gap = models.FloatField(null=True, blank=True)
    solve_seconds = models.FloatField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="The engine's plan (docs/planning.md)")
    effective_accuracy = models.FloatField(null=True, blank=True)
    shortfall = models.JSONField(default=dict, blank=True, help_text="{application: rps} the plan cannot serve")
    validation = models.JSONField(default=dict, blank=True, help_text="{valid, problems: [...]} from plan_validate")
    prediction = models.JSONField(default=dict, blank=True, help_text="The simulator's replay of recent demand")
    diff = models.JSONField(default=dict, blank=True, help_text="Against `previous`: MIG operations, runtimes, routing")
    # What applying it writes: {host name: desired-state spec} and {application: routes}.
    desired_states = models.JSONField(default=dict, blank=True)
    routing = models.JSONField(default=dict, blank=True)
    notes = models.JSONField(default=list, blank=True, help_text="What the plan run wants an operator to know: hosts and "
                             "applications left out, demand it cannot serve, the planner's remarks")
    # Rollout bookkeeping.
    rollout = models.JSONField(default=dict, blank=True, help_text="{host: {version, previous_version, converged}}")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    approved_at = models.DateTimeField(null=True, blank=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    prediction_checked_at = models.DateTimeField(null=True, blank=True, help_text="When its prediction was compared with "
                                                 "what was then measured (its prediction checks)")

    audit_exclude_fields = ("problem", "result", "prediction", "diff", "desired_states", "routing", "devices")

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["status"], condition=models.Q(status="active"), name="plan_one_active"),
        ]

    def __str__(self) -> str:
        return f"plan {self.pk} ({self.status})"


class PredictionCheck(models.Model):
    """One target of an applied plan (an application, an ensemble, a pipeline): what the plan's prediction said
    against what the routers measured while the plan was active (apps.planning.prediction). Derived from the
    plan and the telemetry, so not change-logged; deleted with its plan."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="prediction_checks")
    target = models.CharField(max_length=100, help_text="The application, ensemble application or pipeline")
    kind = models.CharField(max_length=20, choices=PredictionTargetChoices.choices)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    predicted_rps = models.FloatField(null=True, blank=True, help_text="The demand the prediction replayed")
    measured_rps = models.FloatField(null=True, blank=True, help_text="Arrivals over the window, per second")
    predicted_violation_ratio = models.FloatField(null=True, blank=True)
    measured_violation_ratio = models.FloatField(null=True, blank=True, help_text="(late + dropped + no route) / arrivals")
    predicted_p99_ms = models.FloatField(null=True, blank=True)
    measured_p99_ms = models.FloatField(null=True, blank=True, help_text="The highest per-interval p99 any router reported")
    violation_error = models.FloatField(null=True, blank=True, help_text="measured - predicted violation ratio")
    p99_error = models.FloatField(null=True, blank=True, help_text="(measured - predicted) / predicted p99")
    note = models.CharField(max_length=300, blank=True, help_text="Why a figure is missing")

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["plan", "target"]
        constraints = [models.UniqueConstraint(fields=["plan", "target"], name="predictioncheck_plan_target")]

    def __str__(self) -> str:
        return f"plan {self.plan_id} {self.target}"
