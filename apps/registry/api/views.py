from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import ProtectedError
from django.http import FileResponse
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions, parsers, status
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from apps.core.api.exceptions import validation_error_from_django
from apps.core.api.permissions import IsAgent
from apps.core.api.viewsets import TesseraModelViewSet
from apps.core.principals import principal_is_agent
from apps.jobs.api.serializers import JobSerializer

from ..filtersets import (
    ApplicationFilterSet,
    ArtifactFilterSet,
    CorunMeasurementFilterSet,
    ModelVariantFilterSet,
    PipelineFilterSet,
    ProfileFilterSet,
    ProfilingRequestFilterSet,
)
from ..models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, Profile, ProfilingRequest
from ..services.artifacts import artifact_create
from ..services.profiles import profile_rows_from_csv, profiles_import
from ..services.profiling import (
    profiling_auto_schedule,
    profiling_request_progress,
    profiling_results_record,
    variant_profile,
)
from .serializers import (
    ApplicationSerializer,
    ArtifactSerializer,
    CorunMeasurementSerializer,
    ModelVariantSerializer,
    PipelineSerializer,
    ProfileImportFileSerializer,
    ProfileImportResultSerializer,
    ProfileImportRowSerializer,
    ProfileSerializer,
    ProfilingProgressSerializer,
    ProfilingRequestSerializer,
    ProfilingResultsResponseSerializer,
    ProfilingResultsSerializer,
    VariantProfileResponseSerializer,
    VariantProfileSerializer,
)

PROFILE_IMPORT_MAX_BYTES = 16 * 1024 * 1024


class UserHasPermissions(BasePermission):
    """A user (never an agent) holding every one of `perms`: for actions whose model permission is not
    the viewset's own (profiling a variant creates profiling requests; an import adds and changes
    profiles)."""

    perms: tuple[str, ...] = ()

    def has_permission(self, request, view):
        user = request.user
        if not getattr(user, "is_authenticated", False) or principal_is_agent(user):
            return False
        return user.has_perms(self.perms)


class CanRequestProfiling(UserHasPermissions):
    message = "Profiling a variant needs the operator role."
    perms = ("registry.view_modelvariant", "registry.add_profilingrequest")


class CanImportProfiles(UserHasPermissions):
    message = "Importing profiles needs the operator role."
    perms = ("registry.add_profile", "registry.change_profile")


class CsvParser(parsers.BaseParser):
    """text/csv bodies, handed to the view as text."""

    media_type = "text/csv"

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        data = stream.read() if stream is not None else b""
        try:
            return data.decode("utf-8-sig" if encoding.lower().replace("_", "-") == "utf-8" else encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise exceptions.ParseError(f"The CSV is not valid {encoding}: {exc}") from exc


class PipelineViewSet(TesseraModelViewSet):
    """Pipelines: DAGs of applications with per-path SLOs, planned as a whole by the fa2 and ipa solvers.
    Declared as JSON (or YAML with `tessera pipeline apply`); checked by the planning parser, nothing stored
    on bad input."""

    queryset = Pipeline.objects.all()
    serializer_class = PipelineSerializer
    filterset_class = PipelineFilterSet


class ApplicationViewSet(TesseraModelViewSet):
    queryset = Application.objects.select_related("pipeline_stage__pipeline")
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
    """Model variants. A variant created with an artifact, or given one, is profiled automatically when a
    profiling policy says so (see /api/v1/profiling-policies/)."""

    queryset = ModelVariant.objects.select_related("application", "artifact")
    serializer_class = ModelVariantSerializer
    filterset_class = ModelVariantFilterSet
    ordering_fields = ["name", "accuracy"]

    def restrict_action(self) -> str:
        return "view" if self.action == "profile" else super().restrict_action()

    def perform_create(self, serializer):
        with transaction.atomic():
            variant = serializer.save()
            profiling_auto_schedule(variant=variant, previous_artifact_id=None, actor=self.request.user)

    def perform_update(self, serializer):
        previous = serializer.instance.artifact_id
        with transaction.atomic():
            variant = serializer.save()
            profiling_auto_schedule(variant=variant, previous_artifact_id=previous, actor=self.request.user)

    @extend_schema(request=VariantProfileSerializer, responses={202: VariantProfileResponseSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanRequestProfiling], parser_classes=[parsers.JSONParser])
    def profile(self, request, pk=None):
        """Operators: profile the variant on the fleet. One profiling request per device type and slice
        that an online agent can measure (simulated GPUs cannot be: they are left out and listed in
        `skipped`), followed by a `profiling` job (GET /api/v1/jobs/{id}/). 400 when the variant has no
        artifact, or when no agent can measure any of it (saying why per device type)."""
        variant = self.get_object()
        body = VariantProfileSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            start = variant_profile(
                variant=variant, device_types=data.get("device_types") or None, slices=data.get("slices") or None,
                batch_sizes=data.get("batch_sizes") or None, cpu_threads=data.get("cpu_threads") or None,
                timeout_s=data.get("timeout_s"), string_length=data.get("string_length"), actor=request.user,
            )
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc
        start.job.refresh_from_db()  # its task may have started already (embedded services run it on commit)
        return Response(
            {
                "job": JobSerializer(start.job, context=self.get_serializer_context()).data,
                "profiling_requests": [pr.pk for pr in start.requests],
                "skipped": [s.as_dict() for s in start.skipped],
            },
            status=status.HTTP_202_ACCEPTED,
        )


class ProfileViewSet(TesseraModelViewSet):
    queryset = Profile.objects.select_related("variant__application")
    serializer_class = ProfileSerializer
    filterset_class = ProfileFilterSet
    ordering_fields = ["batch_size", "latency_p50_ms", "device_type"]

    @extend_schema(
        request={
            "application/json": ProfileImportRowSerializer(many=True),
            "text/csv": OpenApiTypes.STR,
            "multipart/form-data": ProfileImportFileSerializer,
        },
        responses={200: ProfileImportResultSerializer},
    )
    @action(
        detail=False, methods=["post"], url_path="import", url_name="import", permission_classes=[CanImportProfiles],
        parser_classes=[parsers.JSONParser, CsvParser, parsers.MultiPartParser],
    )
    def import_profiles(self, request):
        """Operators: import profiles measured elsewhere, as a JSON list of rows, a text/csv body, or a
        multipart CSV `file` (header row naming the columns variant, device_type, slice, cpu_cores,
        batch_size, latency_p50_ms, latency_p99_ms, throughput_rps, memory_mb, source_detail). Rows are
        upserted as `imported` profiles; all or nothing, each bad row reported under "line N" (CSV, the
        header being line 1) or "row N" (JSON, from 1)."""
        data = request.data
        source_detail = ""
        try:
            if isinstance(data, str) or (request.content_type or "").startswith(CsvParser.media_type):
                rows = profile_rows_from_csv(text=data if isinstance(data, str) else "")  # an empty body is not parsed
            elif "file" in request.FILES:
                upload = request.FILES["file"]
                if upload.size > PROFILE_IMPORT_MAX_BYTES:
                    raise exceptions.ValidationError({"file": f"File is larger than the limit of {PROFILE_IMPORT_MAX_BYTES} bytes."})
                try:
                    text = upload.read().decode("utf-8-sig")
                except UnicodeDecodeError as exc:
                    raise exceptions.ValidationError({"file": f"The CSV is not UTF-8: {exc}"}) from exc
                rows = profile_rows_from_csv(text=text)
                source_detail = str(data.get("source_detail", "") or "")[:200] or f"imported from {upload.name}"[:200]
            elif isinstance(data, list):
                rows = [(f"row {i}", item) for i, item in enumerate(data, start=1)]
            else:
                raise exceptions.ValidationError(
                    {"non_field_errors": ["Send a JSON list of profiles, a text/csv body, or a multipart CSV `file`."]}
                )
            result = profiles_import(rows=rows, source_detail=source_detail)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc
        return Response({"created": result.created, "updated": result.updated})


class CorunMeasurementViewSet(TesseraModelViewSet):
    """Co-run interference measurements (gpulets): a variant's batch latency on an MPS partition while
    another variant runs on the rest of the GPU. The planner fits its interference model to them; the
    gpulets reference data is imported with `manage.py gpulet_import`."""

    queryset = CorunMeasurement.objects.select_related("variant__application", "corunner__application")
    serializer_class = CorunMeasurementSerializer
    filterset_class = CorunMeasurementFilterSet
    ordering_fields = ["device_type", "partition_pct", "batch", "latency_ms"]


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
