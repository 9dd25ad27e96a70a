from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError
from django.http import FileResponse
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions, parsers
from rest_framework.decorators import action

from apps.core.api.exceptions import validation_error_from_django
from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import (
    ApplicationFilterSet,
    ArtifactFilterSet,
    ModelVariantFilterSet,
    PipelineFilterSet,
    ProfileFilterSet,
)
from ..models import Application, Artifact, ModelVariant, Pipeline, Profile
from ..services import artifact_create
from .serializers import (
    ApplicationSerializer,
    ArtifactSerializer,
    ModelVariantSerializer,
    PipelineSerializer,
    ProfileSerializer,
)


class PipelineViewSet(TesseraModelViewSet):
    queryset = Pipeline.objects.all()
    serializer_class = PipelineSerializer
    filterset_class = PipelineFilterSet


class ApplicationViewSet(TesseraModelViewSet):
    queryset = Application.objects.select_related("pipeline")
    serializer_class = ApplicationSerializer
    filterset_class = ApplicationFilterSet
    ordering_fields = ["name"]


class ArtifactViewSet(TesseraModelViewSet):
    """ONNX artifacts. Upload with multipart `file`; validated with the ONNX checker and an onnxruntime
    session before anything is stored. Immutable: delete and upload again to replace one."""

    queryset = Artifact.objects.select_related("uploaded_by")
    serializer_class = ArtifactSerializer
    filterset_class = ArtifactFilterSet
    parser_classes = [parsers.MultiPartParser, parsers.FormParser, parsers.JSONParser]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def perform_create(self, serializer):
        upload = serializer.validated_data["file"]
        try:
            serializer.instance = artifact_create(upload=upload, original_name=upload.name, uploaded_by=self.request.user)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc

    def perform_destroy(self, instance):
        try:
            super().perform_destroy(instance)
        except ProtectedError as exc:
            users = ", ".join(str(v) for v in exc.protected_objects)
            raise exceptions.ValidationError({"non_field_errors": [f"Artifact is used by variants: {users}."]}) from exc
        instance.file.storage.delete(instance.file.name)

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def download(self, request, pk=None):
        """The ONNX file; its SHA-256 is in the `X-Checksum-Sha256` header and the artifact record."""
        artifact = self.get_object()
        response = FileResponse(artifact.file.open("rb"), as_attachment=True, filename=artifact.original_name)
        response["X-Checksum-Sha256"] = artifact.sha256
        return response


class ModelVariantViewSet(TesseraModelViewSet):
    queryset = ModelVariant.objects.select_related("application", "artifact")
    serializer_class = ModelVariantSerializer
    filterset_class = ModelVariantFilterSet
    ordering_fields = ["name", "accuracy"]


class ProfileViewSet(TesseraModelViewSet):
    queryset = Profile.objects.select_related("variant__application")
    serializer_class = ProfileSerializer
    filterset_class = ProfileFilterSet
    ordering_fields = ["batch_size", "latency_p50_ms", "device_type"]


