"""Plans: one planning run's inputs (a snapshot), the engine's answer, its validation, the simulator's
prediction, the diff against the active plan, and its lifecycle from draft to active (and beyond)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.core.models import ChangeLoggedModel

from .choices import PlanStatusChoices, PlanTriggerChoices


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

    audit_exclude_fields = ("problem", "result", "prediction", "diff", "desired_states", "routing", "devices")

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["status"], condition=models.Q(status="active"), name="plan_one_active"),
        ]

    def __str__(self) -> str:
        return f"plan {self.pk} ({self.status})"
