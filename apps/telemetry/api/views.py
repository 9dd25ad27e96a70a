from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, parsers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api.permissions import IsAgent
from apps.core.api.viewsets import TesseraReadOnlyModelViewSet
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
)


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
        host = host_visible_find(principal=request.user, pk=pk)
        if host is None:
            raise exceptions.NotFound("No such host.")
        report = MetricsReportSerializer(data=request.data)
        report.is_valid(raise_exception=True)
        written = host_metrics_ingest(host=host, report=report.validated_data)
        return Response(written, status=status.HTTP_201_CREATED)


class RouterReportView(APIView):
    """A router's per-application counts for one interval. Any host's agent token: routers run on
    registered hosts and use their host's token."""

    permission_classes = [IsAgent]
    parser_classes = [parsers.JSONParser]

    @extend_schema(operation_id="router_reports_create", request=RouterReportSerializer, responses={201: RouterReportIngestedSerializer})
    def post(self, request):
        report = RouterReportSerializer(data=request.data)
        report.is_valid(raise_exception=True)
        written = router_report_ingest(host=request.user.host, report=report.validated_data)
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
