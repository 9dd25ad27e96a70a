"""What can be served: applications (query types), optional pipelines, model variants with their accuracy
and ONNX artifacts, and measured or imported performance profiles."""
from __future__ import annotations

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, Host, name_validator
from engine.geometry.catalogue import gpu_model_canonical, mig_catalogue_load
from engine.geometry.layout import mig_layout_validate, placement_parse
from engine.geometry.names import device_parse
from engine.sharing.partitions import mps_slice_percent

from .choices import (
    CPU_DEVICE_TYPE,
    FULL_SLICE,
    PROFILING_BATCH_SIZE_MAX,
    PROFILING_BATCH_SIZES_DEFAULT,
    PROFILING_CPU_THREADS_DEFAULT,
    PROFILING_STRING_LENGTH_DEFAULT,
    PROFILING_STRING_LENGTH_MAX,
    ProfileSourceChoices,
    ProfilingStatusChoices,
    TaskChoices,
)

# Bounds of an application's Triton-style configuration: a batch is at most the largest query size a plan
# knows (engine.plans.problem.MAX_QUERY_SIZE), a batching delay at most 10 s.
APPLICATION_MAX_BATCH = 4096
APPLICATION_MAX_BATCHING_DELAY_MS = 10_000.0


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
    """A DAG of stages (applications) served as one request path and planned as a whole (FA2, IPA):
    `stages` [{application, variant, max_batch}] and `paths` [{name, stages, slo_ms, demand_rps}], each path
    with its own end-to-end SLO and expected demand, all starting at the entry stage. The same format and
    rules as a planning problem's `pipelines` (engine/plans/problem.py), checked by the same parser when the
    pipeline is written (services/pipelines.py). `PipelineStage` rows index the stages, so that an
    application belongs to one pipeline at most and neither it nor a pinned variant can be deleted while
    the pipeline uses it."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    description = models.TextField(blank=True)
    stages = models.JSONField(default=list, help_text="[{application, variant, max_batch}] in declaration order")
    paths = models.JSONField(default=list, help_text="[{name, stages: [application, ...], slo_ms, demand_rps}]")
    alpha = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)], help_text="IPA: weight of the pipeline accuracy score")
    beta = models.FloatField(default=0.01, validators=[MinValueValidator(0.0)], help_text="IPA: weight of the cores used")
    delta = models.FloatField(default=1e-6, validators=[MinValueValidator(0.0)], help_text="IPA: weight of the batch sizes")
    ipa_threshold_rps = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="IPA: throughput a replica must reach at its base allocation (P3.1b)"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def entry(self) -> str | None:
        return self.paths[0]["stages"][0] if self.paths else None

    def engine_dict(self) -> dict:
        """The pipeline in the planning problem's format."""
        return {
            "name": self.name, "stages": self.stages, "paths": self.paths, "alpha": self.alpha, "beta": self.beta,
            "delta": self.delta, "ipa_threshold_rps": self.ipa_threshold_rps,
        }


class PipelineStage(models.Model):
    """The index of a pipeline's stages (written with the pipeline by `pipeline_save`, never on its own)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="stage_rows")
    application = models.OneToOneField("Application", on_delete=models.PROTECT, related_name="pipeline_stage")
    variant = models.ForeignKey("ModelVariant", null=True, blank=True, on_delete=models.PROTECT, related_name="pinned_in_stages")
    position = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["pipeline", "position"]
        constraints = [models.UniqueConstraint(fields=["pipeline", "position"], name="pipelinestage_unique_position")]

    def __str__(self) -> str:
        return f"{self.pipeline.name}[{self.position}] {self.application.name}"


class Application(ChangeLoggedModel):
    """A query type: every variant of it answers the same question with different speed and accuracy."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    task = models.CharField(max_length=40, choices=TaskChoices.choices, default=TaskChoices.OTHER)
    description = models.TextField(blank=True)
    input_spec = models.JSONField(default=list, blank=True, help_text="[{name, dtype, shape}] every variant accepts")
    released = models.BooleanField(
        default=False,
        help_text="Taken out of service (the model repository's unload): its routes are withdrawn and plans give it no "
        "capacity until it is pinned again (load)",
    )
    # Triton's model configuration where it maps (a model repository load's `parameters.config` sets them too).
    max_batch_size = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(APPLICATION_MAX_BATCH)],
        help_text="The largest batch plans may run it at (queries per batch); empty: any batch it was profiled at",
    )
    batching_delay_ms = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(APPLICATION_MAX_BATCHING_DELAY_MS)],
        help_text="Triton's dynamic batching delay: its runtimes batch with Triton's policy (max-delay), a batch waiting at most "
        "this long for more queries; empty: Tessera's deadline-aware batching (recommended)",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        _tensor_specs_validate(self.input_spec, "input_spec")
        if self.pk is not None:
            # Pipelines name their stages by application: a stage keeps its name while a pipeline uses it.
            previous = Application.objects.filter(pk=self.pk).values_list("name", flat=True).first()
            stage = PipelineStage.objects.filter(application_id=self.pk).select_related("pipeline").first()
            if previous is not None and previous != self.name and stage is not None:
                raise ValidationError({"name": f"{previous} is a stage of pipeline {stage.pipeline.name}; take it out of the pipeline before renaming it."})


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

    @staticmethod
    def agent_scope(queryset, host):
        """An agent reaches only the artifacts its host needs: those of the variants in its host's latest
        desired state, and those of the variants its host has a pending or running profiling request for."""
        wanted = set(
            ProfilingRequest.objects.filter(host=host, status__in=[ProfilingStatusChoices.PENDING, ProfilingStatusChoices.RUNNING])
            .exclude(variant__artifact=None)
            .values_list("variant__artifact_id", flat=True)
        )
        # By name, not by import: deployments builds on the registry, not the other way round.
        desired_state = apps.get_model("deployments", "HostDesiredState")
        spec = desired_state.objects.filter(host=host).order_by("-version").values_list("spec", flat=True).first()
        for runtime in (spec or {}).get("runtimes", []):
            artifact = (runtime.get("variant") or {}).get("artifact")
            if artifact:
                wanted.add(artifact["id"])
        return queryset.filter(pk__in=wanted)


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


def _utilisation_field(what: str) -> models.FloatField:
    return models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text=f"{what} utilisation (%) of the variant alone at this batch and slice: a feature of the co-run "
        "interference model (gpulets §4.4)",
    )


def _gpu_device_type_canonical(device_type: str) -> str:
    """One spelling per GPU model: the catalogue's name where it knows the GPU (MIG or not), else as given."""
    return gpu_model_canonical(device_type) or device_type


class Profile(ChangeLoggedModel):
    """Latency of one variant at one batch size on one device type and slice (MIG profile, `full`, an MPS
    partition "mpsNN" of NN % of a GPU's SMs, or CPU cores)."""

    variant = models.ForeignKey(ModelVariant, on_delete=models.CASCADE, related_name="profiles")
    device_type = models.CharField(max_length=100, help_text='GPU model (e.g. "A100-SXM4-40GB") or "cpu"')
    slice = models.CharField(
        max_length=30, blank=True, help_text='MIG profile, "full" or an MPS partition ("mps60": 60 % of the SMs) on GPUs; empty on CPUs',
    )
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
    l2_util_pct = _utilisation_field("L2 cache")
    dram_util_pct = _utilisation_field("DRAM bandwidth")

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
            for name in ("l2_util_pct", "dram_util_pct"):
                if getattr(self, name) is not None:
                    errors[name] = "Utilisations are of GPUs; a CPU profile has none."
        else:
            if self.cpu_cores:
                errors["cpu_cores"] = "Only CPU profiles have cores."
            if not self.slice:
                errors["slice"] = f'Give the MIG profile, "{FULL_SLICE}" for a whole GPU, or "mpsNN" for an MPS partition.'
            mps = self.slice.lower().startswith("mps") if self.slice else False
            if mps:
                if mps_slice_percent(self.slice.lower()) is None:
                    errors["slice"] = f"{self.slice!r} is not an MPS partition: write mpsNN, NN a whole percent 1..100 (e.g. mps60)."
                else:
                    self.slice = self.slice.lower()
            spec = mig_catalogue_load().gpu_model_find(self.device_type)
            if spec is not None:
                self.device_type = spec.name  # one spelling per GPU model, so profiles group reliably
                if self.slice and self.slice != FULL_SLICE and not mps:
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


class CorunMeasurement(ChangeLoggedModel):
    """A co-run (gpulets §3.4, §4.4): `variant` at `batch` on `partition_pct` % of a GPU's SMs (MPS) while
    `corunner` runs at `corunner_batch` on the rest (100 - partition_pct %), and the variant's batch latency
    then. Over its solo latency (the Profile at the same batch and slice "mps<partition_pct>") it is the
    interference factor the planner's interference model is fitted to, with both variants' solo L2 and
    DRAM utilisations (Profile.l2_util_pct, dram_util_pct)."""

    variant = models.ForeignKey(ModelVariant, on_delete=models.CASCADE, related_name="corun_measurements")
    corunner = models.ForeignKey(
        ModelVariant, on_delete=models.CASCADE, related_name="corun_measurements_as_corunner",
        help_text="The variant running beside it, on the rest of the GPU (it may be the same variant)",
    )
    device_type = models.CharField(max_length=100, help_text='GPU model, e.g. "RTX-2080Ti" (as its profiles name it)')
    batch = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    partition_pct = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(99)], help_text="The variant's share of the SMs; the co-runner has the rest",
    )
    corunner_batch = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    latency_ms = models.FloatField(validators=[MinValueValidator(0.0001)], help_text="The variant's batch latency while co-running")
    throughput_rps = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0)])
    source = models.CharField(max_length=20, choices=ProfileSourceChoices.choices, default=ProfileSourceChoices.IMPORTED)
    source_detail = models.CharField(max_length=200, blank=True, help_text="Where an imported measurement came from")
    measured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["device_type", "variant", "corunner", "partition_pct", "batch", "corunner_batch"]
        constraints = [
            models.UniqueConstraint(
                fields=["variant", "corunner", "device_type", "partition_pct", "batch", "corunner_batch"], name="corun_unique_point",
            ),
        ]

    def __str__(self) -> str:
        variant = str(self.variant) if self.variant_id else "?"
        corunner = str(self.corunner) if self.corunner_id else "?"
        return (f"{variant} b{self.batch} @ {self.device_type}/mps{self.partition_pct} "
                f"beside {corunner} b{self.corunner_batch}")

    def clean(self) -> None:
        if not self.device_type:
            return
        if self.device_type.strip().lower() == CPU_DEVICE_TYPE:
            raise ValidationError({"device_type": "Co-runs are MPS partitions of a GPU; a CPU has none."})
        self.device_type = _gpu_device_type_canonical(self.device_type.strip())


def profiling_batch_sizes_default() -> list[int]:
    return list(PROFILING_BATCH_SIZES_DEFAULT)


def whole_numbers_validate(value, field: str, lo: int, hi: int) -> list[int]:
    """A list of distinct whole numbers in [lo, hi], sorted (batch sizes, thread counts)."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValidationError({field: "Expected a list of whole numbers."})
    outside = [v for v in value if not lo <= v <= hi]
    if outside:
        raise ValidationError({field: f"{', '.join(map(str, outside))}: each must be between {lo} and {hi}."})
    if len(set(value)) != len(value):
        raise ValidationError({field: "A value is listed twice."})
    return sorted(value)


class ProfilingRequest(ChangeLoggedModel):
    """Ask a host's agent to measure a variant on one of its devices (a GPU, a MIG placement on it, or a
    CPU at several thread counts) at several batch sizes. The agent reports progress, then the points, which
    become `measured` Profile rows."""

    variant = models.ForeignKey(ModelVariant, on_delete=models.CASCADE, related_name="profiling_requests")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="profiling_requests")
    device = models.CharField(max_length=20, help_text='The device to measure on: "gpu0", "cpu0"')
    placement = models.CharField(max_length=40, blank=True, help_text='A MIG placement on the GPU ("3g.20gb@4"); blank for the whole GPU and for CPUs')
    batch_sizes = models.JSONField(default=profiling_batch_sizes_default, blank=True)
    cpu_threads = models.JSONField(default=list, blank=True, help_text="CPU only: thread counts to measure; default 1, 2, 4 up to the cores")
    string_length = models.PositiveIntegerField(
        default=PROFILING_STRING_LENGTH_DEFAULT, validators=[MinValueValidator(1), MaxValueValidator(PROFILING_STRING_LENGTH_MAX)],
        help_text="Characters of each element the profiler feeds a string (BYTES) input: a text model's latency depends on it",
    )
    status = models.CharField(max_length=20, choices=ProfilingStatusChoices.choices, default=ProfilingStatusChoices.PENDING)
    progress = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)], help_text="Percent done")
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False, related_name="+")
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, editable=False, related_name="profiling_requests",
        help_text="The profiling job that created and follows this request; empty for a request made directly",
    )
    started = models.DateTimeField(null=True, blank=True, editable=False)
    finished = models.DateTimeField(null=True, blank=True, editable=False)

    audit_exclude_fields = ("log",)  # grows with every progress line; the request's status changes are the record

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        where = f"{self.device}/{self.placement}" if self.placement else self.device
        host = self.host.name if self.host_id else "?"
        variant = str(self.variant) if self.variant_id else "?"
        return f"profile {variant} on {host}/{where}"

    @property
    def accelerator(self) -> Accelerator | None:
        try:
            kind, index = device_parse(self.device)
        except ValueError:
            return None
        return Accelerator.objects.filter(host_id=self.host_id, kind=kind, index=index).first()

    @property
    def profile_device_type(self) -> str:
        """The Profile.device_type the results are stored under: the catalogue name of the GPU (its NVML name
        when the catalogue does not know it), or "cpu"."""
        accelerator = self.accelerator
        if accelerator is None or accelerator.kind == AcceleratorKindChoices.CPU:
            return CPU_DEVICE_TYPE
        return gpu_model_canonical(accelerator.model_name) or accelerator.model_name

    @property
    def profile_slice(self) -> str:
        """The Profile.slice of the results: the MIG profile, "full" for a whole GPU, empty on CPUs."""
        if self.device.startswith(AcceleratorKindChoices.CPU):
            return ""
        return placement_parse(self.placement).profile if self.placement else FULL_SLICE

    def clean(self) -> None:
        if self.variant_id and self.variant.artifact_id is None:
            raise ValidationError({"variant": f"{self.variant} has no artifact to profile."})
        if not self.host_id:
            return
        try:
            kind, index = device_parse(self.device)
        except ValueError as exc:
            raise ValidationError({"device": str(exc)}) from exc
        accelerator = Accelerator.objects.filter(host_id=self.host_id, kind=kind, index=index).first()
        if accelerator is None:
            raise ValidationError({"device": f"{self.host.name} has no {self.device}."})
        self.batch_sizes = whole_numbers_validate(self.batch_sizes, "batch_sizes", 1, PROFILING_BATCH_SIZE_MAX)
        if not self.batch_sizes:
            raise ValidationError({"batch_sizes": "Give at least one batch size."})
        if kind == AcceleratorKindChoices.CPU:
            if self.placement:
                raise ValidationError({"placement": "A CPU has no MIG placement."})
            cores = accelerator.cpu_cores or 1
            if not self.cpu_threads:
                self.cpu_threads = [t for t in PROFILING_CPU_THREADS_DEFAULT if t <= cores]
            self.cpu_threads = whole_numbers_validate(self.cpu_threads, "cpu_threads", 1, cores)
            return
        if self.cpu_threads:
            raise ValidationError({"cpu_threads": "Thread counts are for CPU devices only."})
        if self.placement:
            spec = accelerator.gpu_model
            if not accelerator.mig_capable or spec is None:
                raise ValidationError({"placement": f"{accelerator.model_name} is not MIG capable."})
            try:
                placement = placement_parse(self.placement)
            except ValueError as exc:
                raise ValidationError({"placement": str(exc)}) from exc
            verdict = mig_layout_validate(spec, [placement])
            if not verdict.valid:
                raise ValidationError({"placement": verdict.reason})
            self.placement = f"{spec.profile_find(placement.profile).name}@{placement.start}"

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(host=host)
