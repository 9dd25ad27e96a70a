from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import ChoiceTextField, TesseraModelSerializer
from apps.jobs.api.serializers import JobSerializer

from ..choices import PROFILING_BATCH_SIZE_MAX, PROFILING_STRING_LENGTH_DEFAULT, PROFILING_STRING_LENGTH_MAX, ProfilingStatusChoices
from ..models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, Profile, ProfilingRequest


class PipelineSerializer(TesseraModelSerializer):
    """A pipeline as the planning problem writes one (docs/planning.md, "Pipelines"): `stages` (application
    names, or {application, variant, max_batch}; a chain may be text, "detect -> classify") and `paths`
    ({name, stages, slo_ms, demand_rps}), or for a chain `slo_ms` and `demand_rps` instead of paths. Stored
    in normal form: the response always lists the paths."""

    stages = serializers.JSONField(help_text="[application | {application, variant, max_batch}], or text: 'detect -> classify'")
    paths = serializers.JSONField(required=False, allow_null=True, help_text="[{name, stages, slo_ms, demand_rps}]; omit for a chain")
    slo_ms = serializers.FloatField(required=False, write_only=True, help_text="A chain's end-to-end SLO (without paths)")
    demand_rps = serializers.FloatField(required=False, write_only=True, help_text="A chain's expected demand (without paths)")
    entry = serializers.CharField(read_only=True, allow_null=True, help_text="The stage every path starts at")

    class Meta:
        model = Pipeline
        fields = [
            "id", "display", "name", "description", "stages", "paths", "slo_ms", "demand_rps", "entry", "alpha", "beta", "delta",
            "ipa_threshold_rps", "created", "last_updated",
        ]
        # The name's uniqueness is checked with the rest by the service.
        extra_kwargs = {"name": {"validators": []}}

    def validate(self, attrs):
        from django.core.exceptions import ValidationError as DjangoValidationError

        from apps.core.api.exceptions import validation_error_from_django

        from ..services.pipelines import pipeline_spec_read

        data = {k: v for k, v in self.initial_data.items() if k in attrs} if hasattr(self.initial_data, "items") else dict(attrs)
        try:
            pipeline_spec_read(data, pipeline=self.instance)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc
        if self.instance is None or "name" in attrs:
            clash = Pipeline.objects.filter(name=attrs.get("name", getattr(self.instance, "name", None))).exclude(pk=getattr(self.instance, "pk", None))
            if clash.exists():
                raise serializers.ValidationError({"name": ["A pipeline with this name already exists."]})
        return data

    def create(self, validated_data):
        from ..services.pipelines import pipeline_save

        return pipeline_save(data=validated_data)

    def update(self, instance, validated_data):
        from ..services.pipelines import pipeline_save

        return pipeline_save(data=validated_data, pipeline=instance)


class ApplicationSerializer(TesseraModelSerializer):
    variant_count = serializers.IntegerField(source="variants.count", read_only=True)
    pipeline = serializers.SerializerMethodField(help_text="The pipeline this application is a stage of (declared on the pipeline)")

    def get_pipeline(self, obj) -> str | None:
        stage = getattr(obj, "pipeline_stage", None)  # None when it is no stage (the reverse one-to-one raises)
        return stage.pipeline.name if stage is not None else None

    class Meta:
        model = Application
        fields = [
            "id", "display", "name", "task", "description", "input_spec", "max_batch_size", "batching_delay_ms", "released", "pipeline",
            "variant_count", "created", "last_updated",
        ]
        # Out of service and back only through the model repository's unload and load (routes withdrawn first).
        read_only_fields = ["released"]


class ArtifactSerializer(TesseraModelSerializer):
    file = serializers.FileField(write_only=True, help_text="The ONNX model (multipart upload)")
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = [
            "id", "display", "file", "original_name", "sha256", "size_bytes", "ir_version", "opset", "producer",
            "inputs", "outputs", "uploaded_by", "last_verified", "verify_error", "download_url", "created",
        ]
        read_only_fields = [f for f in fields if f not in ("file",)]

    def get_download_url(self, obj) -> str:
        request = self.context.get("request")
        path = f"/api/v1/artifacts/{obj.pk}/download/"
        return request.build_absolute_uri(path) if request else path

    def validate(self, attrs):
        return attrs  # the upload is validated by the artifact_create service, not by model fields


class ModelVariantSerializer(TesseraModelSerializer):
    class Meta:
        model = ModelVariant
        fields = [
            "id", "display", "application", "name", "accuracy", "accuracy_metric", "artifact", "inputs", "outputs",
            "memory_mb", "description", "created", "last_updated",
        ]


class ProfileSerializer(TesseraModelSerializer):
    throughput_rps = serializers.FloatField(required=False, min_value=0.0, help_text="batch / p50 latency if omitted")

    class Meta:
        model = Profile
        fields = [
            "id", "display", "variant", "device_type", "slice", "cpu_cores", "batch_size", "latency_p50_ms",
            "latency_p99_ms", "throughput_rps", "memory_mb", "l2_util_pct", "dram_util_pct", "source", "source_detail",
            "measured_at", "created", "last_updated",
        ]


class CorunMeasurementSerializer(TesseraModelSerializer):
    """A co-run measurement: the variant's batch latency on partition_pct % of the GPU beside the co-runner
    on the rest."""

    class Meta:
        model = CorunMeasurement
        fields = [
            "id", "display", "variant", "corunner", "device_type", "batch", "partition_pct", "corunner_batch", "latency_ms",
            "throughput_rps", "source", "source_detail", "measured_at", "created", "last_updated",
        ]


class ProfilingArtifactSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sha256 = serializers.CharField()
    size_bytes = serializers.IntegerField()
    download = serializers.CharField(help_text="API path of the file")


class ProfilingRequestSerializer(TesseraModelSerializer):
    """A profiling request, with what the host's agent needs to run it: the variant's name, application and
    artifact, and the device_type and slice its results are to be reported under."""

    application = serializers.CharField(source="variant.application.name", read_only=True)
    variant_name = serializers.CharField(source="variant.name", read_only=True)
    artifact = serializers.SerializerMethodField()
    device_type = serializers.CharField(source="profile_device_type", read_only=True, help_text='Profile.device_type of the results')
    slice = serializers.CharField(source="profile_slice", read_only=True, help_text='Profile.slice of the results ("" on CPUs)')
    status = ChoiceTextField(choices=ProfilingStatusChoices.choices, read_only=True)

    class Meta:
        model = ProfilingRequest
        fields = [
            "id", "display", "variant", "variant_name", "application", "artifact", "host", "device", "placement",
            "device_type", "slice", "batch_sizes", "cpu_threads", "string_length", "status", "progress", "log", "error", "created_by",
            "job", "started", "finished", "created", "last_updated",
        ]
        read_only_fields = ["status", "progress", "log", "error", "created_by", "job", "started", "finished", "created", "last_updated"]

    @extend_schema_field(ProfilingArtifactSerializer(allow_null=True))
    def get_artifact(self, obj) -> dict | None:
        artifact = obj.variant.artifact
        if artifact is None:
            return None
        return {
            "id": artifact.pk, "sha256": artifact.sha256, "size_bytes": artifact.size_bytes,
            "download": f"/api/v1/artifacts/{artifact.pk}/download/",
        }


class ProfilingProgressSerializer(serializers.Serializer):
    status = ChoiceTextField(
        choices=[ProfilingStatusChoices.RUNNING.value, ProfilingStatusChoices.FAILED.value], required=False,
        help_text="running (the default once anything is reported) or failed (finishes the request).",
    )
    progress = serializers.IntegerField(min_value=0, max_value=100, required=False, help_text="Percent done")
    log = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False, help_text="A line to append to the log")
    error = serializers.CharField(required=False, allow_blank=True, default="", help_text="Why it failed")


class ProfilingPointSerializer(serializers.Serializer):
    device_type = serializers.CharField(max_length=100, help_text='As the request\'s device_type, e.g. "A100-SXM4-40GB" or "cpu"')
    slice = serializers.CharField(max_length=30, required=False, allow_blank=True, default="", help_text='As the request\'s slice')
    cpu_cores = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None, help_text="CPU: the thread count measured")
    batch_size = serializers.IntegerField(min_value=1)
    latency_p50_ms = serializers.FloatField(min_value=0.0001)
    latency_p99_ms = serializers.FloatField(min_value=0.0001)
    throughput_rps = serializers.FloatField(min_value=0.0, required=False, allow_null=True, default=None, help_text="batch / p50 latency if omitted")
    memory_mb = serializers.IntegerField(min_value=0, required=False, allow_null=True, default=None)


class ProfilingResultsSerializer(serializers.Serializer):
    points = ProfilingPointSerializer(many=True, max_length=10_000)
    log = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False, help_text="A line to append to the log")


class ProfilingResultsResponseSerializer(serializers.Serializer):
    profiling_request = ProfilingRequestSerializer()
    profiles = ProfileSerializer(many=True)


class VariantProfileSerializer(serializers.Serializer):
    """What to profile a variant on; everything optional."""

    device_types = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, max_length=50,
        help_text='"cpu" and GPU models ("A100-SXM4-40GB"); default: every type on the online fleet',
    )
    slices = serializers.ListField(
        child=serializers.CharField(max_length=30), required=False, max_length=50,
        help_text='GPUs: MIG profiles ("3g.20gb") and "full" for a whole GPU; default: every slice the online GPUs have',
    )
    batch_sizes = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=PROFILING_BATCH_SIZE_MAX), required=False, max_length=64,
        help_text="Default 1, 2, 4 … 64",
    )
    cpu_threads = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=1024), required=False, max_length=64,
        help_text="CPUs: thread counts to measure; default 1, 2, 4 up to the CPU's cores",
    )
    timeout_s = serializers.IntegerField(
        min_value=1, max_value=7 * 24 * 3600, required=False,
        help_text="Fail the job (and its open requests) after this long; default TESSERA_PROFILING_JOB_TIMEOUT_S (1800)",
    )
    string_length = serializers.IntegerField(
        min_value=1, max_value=PROFILING_STRING_LENGTH_MAX, required=False,
        help_text=f"String (BYTES) inputs: characters per element the profiler feeds; default {PROFILING_STRING_LENGTH_DEFAULT}",
    )


class ProfilingSkipSerializer(serializers.Serializer):
    device_type = serializers.CharField()
    slice = serializers.CharField(allow_blank=True)
    reason = serializers.CharField()


class VariantProfileResponseSerializer(serializers.Serializer):
    job = JobSerializer()
    profiling_requests = serializers.ListField(child=serializers.IntegerField(), help_text="Ids of the requests created")
    skipped = ProfilingSkipSerializer(many=True, help_text="What could not be profiled, and why (e.g. simulated GPUs)")


class ProfileImportRowSerializer(serializers.Serializer):
    """One imported profile (the JSON form; a CSV has these as columns)."""

    variant = serializers.CharField(help_text='Its id, or "application/variant"')
    device_type = serializers.CharField(max_length=100)
    slice = serializers.CharField(max_length=30, required=False, allow_blank=True, help_text='"full", a MIG profile or "mpsNN" on GPUs; empty on CPUs')
    cpu_cores = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    batch_size = serializers.IntegerField(min_value=1)
    latency_p50_ms = serializers.FloatField(min_value=0.0001)
    latency_p99_ms = serializers.FloatField(min_value=0.0001)
    throughput_rps = serializers.FloatField(min_value=0.0, required=False, allow_null=True, help_text="batch / p50 latency if omitted")
    memory_mb = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    l2_util_pct = serializers.FloatField(min_value=0.0, max_value=100.0, required=False, allow_null=True, help_text="GPUs: L2 utilisation (%)")
    dram_util_pct = serializers.FloatField(min_value=0.0, max_value=100.0, required=False, allow_null=True, help_text="GPUs: DRAM bandwidth utilisation (%)")
    source_detail = serializers.CharField(max_length=200, required=False, allow_blank=True)


class ProfileImportFileSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A CSV with a header row naming the columns")
    source_detail = serializers.CharField(max_length=200, required=False, allow_blank=True, help_text="For rows that give none")


class ProfileImportResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
