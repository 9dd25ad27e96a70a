from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.inventory.models import name_validator
from apps.registry.models import Application, ModelVariant, whole_numbers_validate
from engine.ensembles.policy import EnsembleError
from engine.ensembles.policy import EnsembleMember as EngineEnsembleMember
from engine.ensembles.policy import EnsemblePolicy as EngineEnsemblePolicy
from engine.ensembles.policy import ensemble_policy_to_dict, ensemble_policy_validate

from .choices import DropRuleChoices, EnsembleModeChoices, EnsembleVoteChoices


class SloPolicy(ChangeLoggedModel):
    """An application's service level: p99 latency target, the accuracy it must not fall below, its
    priority when demand cannot all be served, and what to do with queries that will be late; and the
    demand every plan sizes it for at least (`expected_rps`), and whether it may have no capacity at all
    while nobody queries it (`scale_to_zero`; apps/planning/demand.py)."""

    application = models.OneToOneField(Application, on_delete=models.CASCADE, related_name="slo_policy")
    latency_p99_ms = models.FloatField(validators=[MinValueValidator(0.001)], help_text="p99 latency target in ms")
    min_accuracy = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Lowest acceptable accuracy, 0..1; empty for none",
    )
    priority = models.PositiveSmallIntegerField(default=50, validators=[MaxValueValidator(100)], help_text="0..100, higher is served first")
    drop_rule = models.CharField(max_length=20, choices=DropRuleChoices.choices, default=DropRuleChoices.DEADLINE)
    expected_rps = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1e7)],
        help_text="Queries per second every plan sizes it for at least, whatever the routers observe: how a new "
                  "application gets capacity before its first query. Empty: observed demand only",
    )
    scale_to_zero = models.BooleanField(
        default=False,
        help_text="With no expected and no observed demand, plan no capacity for it. Off: a quiet application keeps "
                  "the capacity of the idle floor (docs/control-loop.md, 'Demand')",
    )

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
    demand, fleet and model-pool triggers, and the demand estimate and `headroom_target` of every plan
    run that does not set its own."""

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
    demand_memory_seconds = models.PositiveIntegerField(
        default=900, validators=[MinValueValidator(60), MaxValueValidator(7 * 24 * 3600)],
        help_text="Demand for planning: at least the mean rate over this many seconds, so that a quiet minute does "
                  "not take an application's capacity away",
    )
    host_lost_after_seconds = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(5), MaxValueValidator(24 * 3600)],
        help_text="An online host whose agent has not reported for this long is marked offline",
    )
    headroom_target = models.FloatField(
        default=1.0, validators=[MinValueValidator(1.0), MaxValueValidator(10.0)],
        help_text="Plan runs that do not set it: the fleet planner keeps up to this multiple of the planned demand servable "
                  "before it spends capacity on accuracy (1: the most accurate plan; docs/planning.md, \"Headroom before accuracy\")",
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


# The fields an ensemble policy's errors are reported under (the engine's messages start with them).
ENSEMBLE_POLICY_FIELDS = ("mode", "vote", "members", "min_size", "max_size", "scheduler")


def ensemble_error_as_validation(exc: EnsembleError, *, min_size: Any = None) -> ValidationError:
    """The engine's refusal of an ensemble policy (engine/ensembles/policy.py, whose messages name the field
    first) as a ValidationError under that field: the size bounds' joint rules under `min_size` where
    it is the one out of bounds, else under `max_size`; a message naming no field as a non-field error."""
    message = str(exc)
    if message.startswith("min_size and max_size"):  # a single-variant policy: both must be 1
        field = "min_size" if min_size != 1 else "max_size"
    elif message.startswith("need 1 <= min_size"):
        field = "min_size" if isinstance(min_size, int) and min_size < 1 else "max_size"
    else:
        field = next((f for f in ENSEMBLE_POLICY_FIELDS if message.startswith(f)), NON_FIELD_ERRORS)
    return ValidationError({field: [message]})


class EnsemblePolicy(ChangeLoggedModel):
    """How an application's queries are answered when it has several variants (Garrison, DAC'24, random
    ensembles; engine/ensembles/policy.py): by one variant as the plan routes it (`single`), by a random
    ensemble drawn per query with each member's sampling probability (`random`), or by the members a learned
    scheduler picks (`learned`, its ONNX policy named in `scheduler`); between `min_size` and `max_size`
    members answer, combined by a weighted `vote`. The members (EnsembleMember) are written with the policy
    as a whole (apps/policies/services.py, `ensemble_policy_set`); the engine's validator is the one place
    the rules live (`clean()`), and the audit record carries the members beside the policy's fields."""

    application = models.OneToOneField(Application, on_delete=models.CASCADE, related_name="ensemble_policy")
    mode = models.CharField(max_length=10, choices=EnsembleModeChoices.choices, default=EnsembleModeChoices.RANDOM)
    min_size = models.PositiveSmallIntegerField(default=1, help_text="Fewest members answering a query (single: 1)")
    max_size = models.PositiveSmallIntegerField(default=1, help_text="Most members answering a query, at most the members with a probability > 0")
    vote = models.CharField(max_length=10, choices=EnsembleVoteChoices.choices, default=EnsembleVoteChoices.SOFT)
    scheduler = models.CharField(
        max_length=200, blank=True, help_text="learned: the scheduler's ONNX policy, a name or path the router resolves; else empty",
    )

    class Meta:
        ordering = ["application__name"]
        verbose_name = "ensemble policy"
        verbose_name_plural = "ensemble policies"

    def __str__(self) -> str:
        return f"{self.application.name}: {self.mode} ensemble" if self.application_id else "ensemble policy"

    # The members a save is about to write (set by ensemble_policy_set before it validates and saves): what
    # clean() checks and what the audit record's "after" shows. None: the stored members.
    members_pending: list["EnsembleMember"] | None = None
    # Set by a form that edits the fields apart from the members (the admin's, whose members' inline checks
    # the policy whole with the service's reader): clean() then leaves the members' rules to that check.
    members_checked_apart = False

    def member_list(self) -> list["EnsembleMember"]:
        """The members about to be written, or else the stored ones in their order."""
        if self.members_pending is not None:
            return list(self.members_pending)
        if self.pk is None:
            return []
        if "members" in getattr(self, "_prefetched_objects_cache", {}):
            return list(self.members.all())
        return list(self.members.select_related("variant"))

    def engine_policy(self) -> EngineEnsemblePolicy:
        """The policy as the engine's value (variants by name), not validated."""
        return EngineEnsemblePolicy(
            mode=self.mode,
            members=tuple(EngineEnsembleMember(variant=m.variant.name, probability=m.probability, weight=m.weight) for m in self.member_list()),
            min_size=self.min_size, max_size=self.max_size, vote=self.vote, scheduler=self.scheduler or None,
        )

    def engine_dict(self) -> dict[str, Any]:
        """The policy as the engine writes it (`ensemble_policy_to_dict`: variants by name), each member with
        its `variant_id` (the ModelVariant's pk) beside its name: what routing tables carry to routers."""
        data = ensemble_policy_to_dict(self.engine_policy())
        for member, row in zip(data["members"], self.member_list()):
            member["variant_id"] = row.variant_id
        return data

    def clean(self) -> None:
        if not self.application_id or self.members_checked_apart:
            return  # no application: the field's own error says so
        members = self.member_list()
        foreign = [m.variant for m in members if m.variant.application_id != self.application_id]
        if foreign:
            raise ValidationError({"members": [f"{foreign[0]} is not a variant of {self.application.name}."]})
        try:
            ensemble_policy_validate(self.engine_policy(), variants=self.application.variants.values_list("name", flat=True))
        except EnsembleError as exc:
            raise ensemble_error_as_validation(exc, min_size=self.min_size) from None

    def audit_snapshot(self) -> dict[str, Any]:
        data = super().audit_snapshot()
        data["members"] = [
            {"variant": m.variant.name, "variant_id": m.variant_id, "probability": m.probability, "weight": m.weight} for m in self.member_list()
        ]
        return data


class EnsembleMember(models.Model):
    """One member of an application's ensemble: a variant of it, its sampling probability (the members'
    sum to 1) and its vote's weight. Written with its policy by `ensemble_policy_set`, never on its own; a
    variant that is a member cannot be deleted until the policy lets it go (deleting the application
    takes both)."""

    policy = models.ForeignKey(EnsemblePolicy, on_delete=models.CASCADE, related_name="members")
    variant = models.ForeignKey(ModelVariant, on_delete=models.RESTRICT, related_name="ensemble_memberships")
    probability = models.FloatField(help_text="Sampling probability, 0..1; the members' probabilities sum to 1")
    weight = models.FloatField(default=1.0, help_text="The weight of its vote, > 0")

    class Meta:
        ordering = ["policy", "id"]
        constraints = [models.UniqueConstraint(fields=["policy", "variant"], name="ensemblemember_unique_variant")]

    def __str__(self) -> str:
        return f"{self.variant.name} p={self.probability:g} w={self.weight:g}" if self.variant_id else "ensemble member"
