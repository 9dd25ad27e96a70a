from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, parsers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api.permissions import IsAgent
from apps.core.api.viewsets import TesseraReadOnlyModelViewSet
from apps.core.principals import principal_is_agent
from apps.inventory.services import host_visible_find

from ..filtersets import ApplicationSampleFilterSet, GpuSampleFilterSet, RuntimeSampleFilterSet
from ..models import ApplicationSample, GpuSample, RuntimeSample
from ..services import host_metrics_ingest, router_report_ingest
from .serializers import (
    ApplicationSampleSerializer,
    GpuSampleSerializer,
    MetricsIngestedSerializer,
    MetricsReportSerializer,
    RouterReportIngestedSerializer,
    RouterReportSerializer,
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
        written = host_metrics_ingest(host=host, report=report_validate(MetricsReportSerializer, request.data))
        return Response(written, status=status.HTTP_201_CREATED)


class RouterReportView(APIView):
    """A router's per-application counts for one interval. Any host's agent token: routers run on
    registered hosts and use their host's token."""

    permission_classes = [IsAgent]
    parser_classes = [parsers.JSONParser]

    @extend_schema(operation_id="router_reports_create", request=RouterReportSerializer, responses={201: RouterReportIngestedSerializer})
    def post(self, request):
        written = router_report_ingest(host=request.user.host, report=report_validate(RouterReportSerializer, request.data))
        return Response(written, status=status.HTTP_201_CREATED)


class RuntimeSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = RuntimeSample.objects.all()
    serializer_class = RuntimeSampleSerializer
    filterset_class = RuntimeSampleFilterSet
    ordering_fields = ["at", "id"]


class GpuSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = GpuSample.objects.all()
    serializer_class = GpuSampleSerializer
    filterset_class = GpuSampleFilterSet
    ordering_fields = ["at", "id"]


class ApplicationSampleViewSet(TesseraReadOnlyModelViewSet):
    queryset = ApplicationSample.objects.all()
    serializer_class = ApplicationSampleSerializer
    filterset_class = ApplicationSampleFilterSet
    ordering_fields = ["at", "id"]
