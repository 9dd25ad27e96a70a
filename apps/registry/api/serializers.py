from rest_framework import serializers

from apps.core.api.serializers import TesseraModelSerializer

from ..models import Application, Artifact, ModelVariant, Pipeline, Profile


class PipelineSerializer(TesseraModelSerializer):
    class Meta:
        model = Pipeline
        fields = ["id", "display", "name", "description", "slo_ms", "created", "last_updated"]


class ApplicationSerializer(TesseraModelSerializer):
    variant_count = serializers.IntegerField(source="variants.count", read_only=True)

    class Meta:
        model = Application
        fields = [
            "id", "display", "name", "task", "description", "input_spec", "pipeline", "pipeline_stage",
            "variant_count", "created", "last_updated",
        ]


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
            "latency_p99_ms", "throughput_rps", "memory_mb", "source", "source_detail", "measured_at",
            "created", "last_updated",
        ]
