from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import ProtectedError
from django.http import FileResponse
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions, parsers
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.exceptions import validation_error_from_django
from apps.core.api.permissions import IsAgent
from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import (
    ApplicationFilterSet,
    ArtifactFilterSet,
    ModelVariantFilterSet,
    PipelineFilterSet,
    ProfileFilterSet,
    ProfilingRequestFilterSet,
)
from ..models import Application, Artifact, ModelVariant, Pipeline, Profile, ProfilingRequest
from ..services import artifact_create, profiling_request_progress, profiling_results_record
from .serializers import (
    ApplicationSerializer,
    ArtifactSerializer,
    ModelVariantSerializer,
    PipelineSerializer,
    ProfileSerializer,
    ProfilingProgressSerializer,
    ProfilingRequestSerializer,
    ProfilingResultsResponseSerializer,
    ProfilingResultsSerializer,
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


class ProfilingRequestViewSet(TesseraModelViewSet):
    """Profiling requests: operators ask a host's agent to measure a variant on one of its devices; the agent
    reads its own host's requests, reports progress, then the measured points (which become `measured`
    profiles). Requests are not edited; delete one to withdraw it."""

    queryset = ProfilingRequest.objects.select_related("variant__application", "variant__artifact", "host")
    serializer_class = ProfilingRequestSerializer
    filterset_class = ProfilingRequestFilterSet
    ordering_fields = ["created", "status"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def restrict_action(self) -> str:
        # The agent's actions find the request by what it may see: its own host's requests.
        return "view" if self.action in ("progress", "results") else super().restrict_action()

    def perform_create(self, serializer):
        user = self.request.user
        with transaction.atomic():
            serializer.save(created_by=user if getattr(user, "pk", None) else None)

    @extend_schema(request=ProfilingProgressSerializer, responses={200: ProfilingRequestSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAgent])
    def progress(self, request, pk=None):
        """Agent only (the request's host): report progress, a log line, or failure."""
        profiling_request = self.get_object()
        body = ProfilingProgressSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        profiling_request = profiling_request_progress(
            profiling_request=profiling_request, status=data.get("status"), progress=data.get("progress"),
            log_line=data["log"], error=data["error"],
        )
        return Response(self.get_serializer(profiling_request).data)

    @extend_schema(request=ProfilingResultsSerializer, responses={200: ProfilingResultsResponseSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAgent])
    def results(self, request, pk=None):
        """Agent only (the request's host): the measured points. They become `measured` Profile rows and the
        request succeeds. All or nothing."""
        profiling_request = self.get_object()
        body = ProfilingResultsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        profiles = profiling_results_record(
            profiling_request=profiling_request, points=[dict(p) for p in body.validated_data["points"]],
            log_line=body.validated_data["log"],
        )
        profiling_request.refresh_from_db()
        context = self.get_serializer_context()
        return Response({
            "profiling_request": ProfilingRequestSerializer(profiling_request, context=context).data,
            "profiles": ProfileSerializer(profiles, many=True, context=context).data,
        })
