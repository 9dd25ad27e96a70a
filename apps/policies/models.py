from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.inventory.models import name_validator
from apps.registry.models import Application

from .choices import DropRuleChoices


class SloPolicy(ChangeLoggedModel):
    """An application's service level: p99 latency target, the accuracy it must not fall below, its
    priority when demand cannot all be served, and what to do with queries that will be late."""

    application = models.OneToOneField(Application, on_delete=models.CASCADE, related_name="slo_policy")
    latency_p99_ms = models.FloatField(validators=[MinValueValidator(0.001)], help_text="p99 latency target in ms")
    min_accuracy = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Lowest acceptable accuracy, 0..1; empty for none",
    )
    priority = models.PositiveSmallIntegerField(default=50, validators=[MaxValueValidator(100)], help_text="0..100, higher is served first")
    drop_rule = models.CharField(max_length=20, choices=DropRuleChoices.choices, default=DropRuleChoices.DEADLINE)

    class Meta:
        ordering = ["application__name"]
        verbose_name = "SLO policy"
        verbose_name_plural = "SLO policies"

    def __str__(self) -> str:
        return f"{self.application.name}: p99 ≤ {self.latency_p99_ms:g} ms" if self.application_id else "SLO policy"

    def clean(self) -> None:
        if self.min_accuracy is not None and self.application_id:
            best = self.application.variants.order_by("-accuracy").values_list("accuracy", flat=True).first()
            if best is not None and best < self.min_accuracy:
                raise ValidationError(
                    {"min_accuracy": f"No variant of {self.application.name} reaches {self.min_accuracy:g} (best is {best:g})."}
                )


class ReplanPolicy(ChangeLoggedModel):
    """When the fleet is re-planned: every `interval_seconds`, and whenever demand moves by more than
    `demand_change_threshold` (a fraction) from what the active plan assumed. With `auto_apply` off, a new
    plan waits for an operator's approval."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    enabled = models.BooleanField(default=True)
    interval_seconds = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10), MaxValueValidator(7 * 24 * 3600)]
    )
    demand_change_threshold = models.FloatField(
        default=0.2, validators=[MinValueValidator(0.01), MaxValueValidator(10.0)],
        help_text="Relative change in any application's demand that triggers a re-plan, e.g. 0.2 for 20%",
    )
    auto_apply = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
