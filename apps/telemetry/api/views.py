from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, parsers, permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api.permissions import IsAgent
from apps.core.api.viewsets import TesseraReadOnlyModelViewSet
from apps.core.metrics import agent_reports_rejected
from apps.core.principals import principal_is_agent, principal_is_router
from apps.inventory.services import host_visible_find

from ..filtersets import (
    ApplicationSampleFilterSet,
    GpuSampleFilterSet,
    PipelinePathSampleFilterSet,
    RuntimeResizeFilterSet,
    RuntimeSampleFilterSet,
)
from ..models import ApplicationSample, GpuSample, PipelinePathSample, RuntimeResize, RuntimeSample
from ..services import host_metrics_ingest, router_report_ingest
from .serializers import (
    ApplicationSampleSerializer,
    GpuSampleSerializer,
    MetricsIngestedSerializer,
    MetricsReportSerializer,
    PipelinePathSampleSerializer,
    RouterReportIngestedSerializer,
    RouterReportSerializer,
    RuntimeResizeSerializer,
    RuntimeSampleSerializer,
    report_validate,
)


def _reporting_host(principal, pk):
    """The host `pk` if the principal may see it: what `host_visible_find` answers, without querying again
    for the host an agent's token has just loaded (an agent sees its own host only)."""
    host = getattr(principal, "host", None)
    if principal_is_agent(principal) and host is not None and host.pk == pk and principal.has_perm("inventory.view_host"):
        return host
    return host_visible_find(principal=principal, pk=pk)


class HostMetricsView(APIView):
    """Agent only: the host's metrics for one interval (runtimes, GPUs, MIG instances). Also the agent's
    heartbeat: it sets the host's last_seen."""

    permission_classes = [IsAgent]
    parser_classes = [parsers.JSONParser]

    @extend_schema(
        operation_id="hosts_metrics_create",
        request=MetricsReportSerializer,
        responses={201: MetricsIngestedSerializer, 404: OpenApiResponse(description="Not this agent's host")},
    )
    def post(self, request, pk):
        host = _reporting_host(request.user, pk)
        if host is None:
            raise exceptions.NotFound("No such host.")
        try:
            report = report_validate(MetricsReportSerializer, request.data)
        except exceptions.ValidationError:
            agent_reports_rejected.labels(reason="invalid").inc()
            raise
        written = host_metrics_ingest(host=host, report=report)
        return Response(written, status=status.HTTP_201_CREATED)


class IsRouter(permissions.BasePermission):
    message = "Only a router, with its own router credential, may post router reports."

    def has_permission(self, request, view):
        return principal_is_router(request.user)


class RouterReportView(APIView):
    """A router's per-application counts for one interval, with the router's own credential and under its
    name only: an agent token, or a report in another router's name, is refused (403), so no host can feed
    planning demand for routers it is not."""

    permission_classes = [IsRouter]
    parser_classes = [parsers.JSONParser]

    @extend_schema(operation_id="router_reports_create", request=RouterReportSerializer,
                   responses={201: RouterReportIngestedSerializer, 403: OpenApiResponse(description="Not this router's name")})
    def post(self, request):
        credential = request.user.credential
        report = report_validate(RouterReportSerializer, request.data)
        if report["router"] != credential.name:
            raise exceptions.PermissionDenied(
                f"This credential reports as router {credential.name!r}, not {report['router']!r}.")
        written = router_report_ingest(credential=credential, report=report)
        return Response(written, status=status.HTTP_201_CREATED)


class RuntimeSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = RuntimeSample.objects.all()
    serializer_class = RuntimeSampleSerializer
    filterset_class = RuntimeSampleFilterSet
    ordering_fields = ["at", "id"]


class RuntimeResizeViewSet(TesseraReadOnlyModelViewSet):
    """CPU runtimes' in-place resizes (vertical scaling), as their agents reported them: when, who asked
    (`by`) and why, the cores and batch cap before and after, the CPUs, and whether it took (`outcome`)."""

    queryset = RuntimeResize.objects.all()
    serializer_class = RuntimeResizeSerializer
    filterset_class = RuntimeResizeFilterSet
    ordering_fields = ["at", "id"]


class GpuSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = GpuSample.objects.all()
    serializer_class = GpuSampleSerializer
    filterset_class = GpuSampleFilterSet
    ordering_fields = ["at", "id"]


class PipelinePathSampleViewSet(TesseraReadOnlyModelViewSet):
    """Each pipeline path's end-to-end counts per interval, as each router reported them."""

    queryset = PipelinePathSample.objects.all()
    serializer_class = PipelinePathSampleSerializer
    filterset_class = PipelinePathSampleFilterSet
    ordering_fields = ["at", "id"]


class ApplicationSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = ApplicationSample.objects.all()
    serializer_class = ApplicationSampleSerializer
    filterset_class = ApplicationSampleFilterSet
    ordering_fields = ["at", "id"]
