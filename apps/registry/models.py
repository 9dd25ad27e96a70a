"""What can be served: applications (query types), optional pipelines, model variants with their accuracy
and ONNX artifacts, and measured or imported performance profiles."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.inventory.models import name_validator
from apps.planning.engine.mig import mig_catalogue_load

from .choices import CPU_DEVICE_TYPE, FULL_SLICE, ProfileSourceChoices, TaskChoices


def _tensor_specs_validate(value, field: str) -> None:
    """Input/output specs: [{"name": str, "dtype": str, "shape": [int | str | null, ...]}]."""
    if not isinstance(value, list):
        raise ValidationError({field: "Expected a list of {name, dtype, shape}."})
    for i, spec in enumerate(value):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValidationError({field: f"Item {i} needs a non-empty 'name'."})
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or not all(d is None or isinstance(d, (int, str)) for d in shape):
            raise ValidationError({field: f"Item {i}: 'shape' must be a list of ints, names or null."})


class Pipeline(ChangeLoggedModel):
    """A chain of applications served as one request path (FA2/IPA), with an end-to-end SLO."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    description = models.TextField(blank=True)
    slo_ms = models.FloatField(validators=[MinValueValidator(0.001)], help_text="End-to-end latency SLO in ms")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Application(ChangeLoggedModel):
    """A query type: every variant of it answers the same question with different speed and accuracy."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    task = models.CharField(max_length=40, choices=TaskChoices.choices, default=TaskChoices.OTHER)
    description = models.TextField(blank=True)
    input_spec = models.JSONField(default=list, blank=True, help_text="[{name, dtype, shape}] every variant accepts")
    pipeline = models.ForeignKey(Pipeline, null=True, blank=True, on_delete=models.SET_NULL, related_name="applications")
    pipeline_stage = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Order in its pipeline, from 0")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        _tensor_specs_validate(self.input_spec, "input_spec")
        if (self.pipeline_id is None) != (self.pipeline_stage is None):
            raise ValidationError({"pipeline_stage": "Give a pipeline and its stage together, or neither."})


def artifact_upload_to(instance: "Artifact", filename: str) -> str:
    # Content-addressed: the same bytes always land at the same path.
    return f"artifacts/{instance.sha256[:2]}/{instance.sha256}.onnx"


class Artifact(ChangeLoggedModel):
    """An ONNX model file, validated on upload and immutable afterwards."""

    file = models.FileField(upload_to=artifact_upload_to, editable=False)
    original_name = models.CharField(max_length=255, editable=False)
    sha256 = models.CharField(max_length=64, unique=True, editable=False)
    size_bytes = models.BigIntegerField(editable=False)
    ir_version = models.PositiveIntegerField(editable=False)
    opset = models.PositiveIntegerField(editable=False, help_text="Default-domain opset the model imports")
    producer = models.CharField(max_length=100, blank=True, editable=False)
    inputs = models.JSONField(default=list, editable=False)
    outputs = models.JSONField(default=list, editable=False)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False)
    last_verified = models.DateTimeField(null=True, blank=True, editable=False)
    verify_error = models.TextField(blank=True, editable=False, help_text="Set when a stored file no longer verifies")

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.original_name} ({self.sha256[:12]})"


class ModelVariant(ChangeLoggedModel):
    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="variants")
    name = models.CharField(max_length=100, validators=[name_validator])
    accuracy = models.FloatField(
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)], help_text="Normalised to 0..1"
    )
    accuracy_metric = models.CharField(max_length=100, help_text='Where the accuracy comes from, e.g. "ImageNet top-1"')
    artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.PROTECT, related_name="variants")
    inputs = models.JSONField(default=list, blank=True, help_text="[{name, dtype, shape}]; from the artifact if empty")
    outputs = models.JSONField(default=list, blank=True, help_text="[{name, dtype, shape}]; from the artifact if empty")
    memory_mb = models.PositiveIntegerField(default=0, help_text="Weights and runtime footprint at batch 1")
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["application__name", "-accuracy", "name"]
        constraints = [models.UniqueConstraint(fields=["application", "name"], name="variant_unique_name_per_application")]

    def __str__(self) -> str:
        return f"{self.application.name}/{self.name}" if self.application_id else self.name

    def clean(self) -> None:
        _tensor_specs_validate(self.inputs, "inputs")
        _tensor_specs_validate(self.outputs, "outputs")
        if self.artifact_id:
            if not self.inputs:
                self.inputs = self.artifact.inputs
            if not self.outputs:
                self.outputs = self.artifact.outputs
            for field in ("inputs", "outputs"):
                have = {t["name"] for t in getattr(self.artifact, field)}
                missing = [t["name"] for t in getattr(self, field) if t["name"] not in have]
                if missing:
                    raise ValidationError({field: f"Not in the artifact's graph: {', '.join(missing)} (it has {', '.join(sorted(have))})."})


class Profile(ChangeLoggedModel):
    """Latency of one variant at one batch size on one device type and slice (MIG profile, `full`, or CPU
    cores)."""

    variant = models.ForeignKey(ModelVariant, on_delete=models.CASCADE, related_name="profiles")
    device_type = models.CharField(max_length=100, help_text='GPU model (e.g. "A100-SXM4-40GB") or "cpu"')
    slice = models.CharField(max_length=30, blank=True, help_text='MIG profile or "full" on GPUs; empty on CPUs')
    cpu_cores = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    batch_size = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    latency_p50_ms = models.FloatField(validators=[MinValueValidator(0.0001)])
    latency_p99_ms = models.FloatField(validators=[MinValueValidator(0.0001)])
    throughput_rps = models.FloatField(
        blank=True, validators=[MinValueValidator(0.0)], help_text="Queries per second; batch / p50 latency if not given"
    )
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=20, choices=ProfileSourceChoices.choices, default=ProfileSourceChoices.IMPORTED)
    source_detail = models.CharField(max_length=200, blank=True, help_text="Where an imported profile came from")
    measured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["variant", "device_type", "slice", "cpu_cores", "batch_size"]
        constraints = [
            models.UniqueConstraint(
                fields=["variant", "device_type", "slice", "cpu_cores", "batch_size"],
                name="profile_unique_point",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        where = f"{self.cpu_cores} cores" if self.device_type == CPU_DEVICE_TYPE else f"{self.device_type}/{self.slice}"
        return f"{self.variant} @ {where} b{self.batch_size}"

    def clean(self) -> None:
        errors = {}
        if self.device_type == CPU_DEVICE_TYPE:
            if not self.cpu_cores:
                errors["cpu_cores"] = "A CPU profile needs the number of cores it ran on."
            if self.slice:
                errors["slice"] = "A CPU profile has no GPU slice."
        else:
            if self.cpu_cores:
                errors["cpu_cores"] = "Only CPU profiles have cores."
            if not self.slice:
                errors["slice"] = f'Give the MIG profile or "{FULL_SLICE}" for a whole GPU.'
            spec = mig_catalogue_load().gpu_model_find(self.device_type)
            if spec is not None:
                self.device_type = spec.name  # one spelling per GPU model, so profiles group reliably
                if self.slice and self.slice != FULL_SLICE:
                    profile = spec.profile_find(self.slice)
                    if profile is None:
                        errors["slice"] = f"{self.slice!r} is not a MIG profile of {spec.name} (known: {', '.join(spec.profile_names)})."
                    else:
                        self.slice = profile.name
        if self.throughput_rps is None and self.latency_p50_ms and self.batch_size:
            self.throughput_rps = self.batch_size * 1000.0 / self.latency_p50_ms
        if self.latency_p50_ms and self.latency_p99_ms and self.latency_p99_ms < self.latency_p50_ms:
            errors["latency_p99_ms"] = "p99 latency cannot be below p50."
        if errors:
            raise ValidationError(errors)
