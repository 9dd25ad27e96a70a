from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.inventory.models import name_validator
from apps.registry.models import Application, whole_numbers_validate

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
    `demand_change_threshold` (a fraction) from what the active plan assumed, a host is lost or comes
    back, or a variant is added or removed (apps/planning/triggers.py). With `auto_apply` off, a new plan
    waits for an operator's approval. Saving a policy (re)schedules its periodic re-plan (a
    django-celery-beat task named "replan:<name>"); the first enabled policy by name governs the
    demand, fleet and model-pool triggers."""

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
    debounce_seconds = models.PositiveIntegerField(
        default=60, validators=[MaxValueValidator(24 * 3600)],
        help_text="No automatic re-plan starts within this many seconds of the previous plan run",
    )
    demand_window_seconds = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(5), MaxValueValidator(3600)],
        help_text="Demand for planning: the peak (and the forecast's history) over this many recent seconds",
    )
    forecast_horizon_seconds = models.PositiveIntegerField(
        default=30, validators=[MaxValueValidator(3600)],
        help_text="Demand for planning: forecast this many seconds ahead (about a rollout's duration)",
    )
    host_lost_after_seconds = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(5), MaxValueValidator(24 * 3600)],
        help_text="An online host whose agent has not reported for this long is marked offline",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def _string_list_validate(value, field: str, max_length: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() and len(v) <= max_length for v in value):
        raise ValidationError({field: f"Expected a list of non-empty names of at most {max_length} characters."})
    if len({v.strip().lower() for v in value}) != len(value):
        raise ValidationError({field: "A value is listed twice."})
    return [v.strip() for v in value]


class ProfilingPolicy(ChangeLoggedModel):
    """How new variants are profiled: with `auto_profile_new_variants`, a variant created with an
    artifact (or given one) is profiled on the fleet at once (POST /api/v1/variants/{id}/profile/ with
    these settings), skipped with a log line when no agent can measure it. Empty lists mean the
    profiling defaults: every device type and slice on the online fleet, batch sizes 1..64, CPU threads
    1, 2, 4 up to the cores."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    enabled = models.BooleanField(default=True)
    auto_profile_new_variants = models.BooleanField(default=True)
    device_types = models.JSONField(default=list, blank=True, help_text='"cpu" and GPU models, e.g. ["cpu", "A100-SXM4-40GB"]; empty: all')
    slices = models.JSONField(default=list, blank=True, help_text='GPU slices: MIG profiles and "full"; empty: all present')
    batch_sizes = models.JSONField(default=list, blank=True, help_text="Empty: 1, 2, 4 … 64")
    cpu_threads = models.JSONField(default=list, blank=True, help_text="Empty: 1, 2, 4 up to the cores")
    timeout_s = models.PositiveIntegerField(
        default=1800, validators=[MinValueValidator(10), MaxValueValidator(7 * 24 * 3600)],
        help_text="The profiling job fails (and its open requests) after this long",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "profiling policy"
        verbose_name_plural = "profiling policies"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        self.device_types = _string_list_validate(self.device_types, "device_types", 100)
        self.slices = _string_list_validate(self.slices, "slices", 30)
        self.batch_sizes = whole_numbers_validate(self.batch_sizes, "batch_sizes", 1, 4096)
        self.cpu_threads = whole_numbers_validate(self.cpu_threads, "cpu_threads", 1, 1024)
