from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import (
    ApplicationSampleViewSet,
    GpuSampleViewSet,
    HostMetricsView,
    PipelinePathSampleViewSet,
    RouterReportView,
    RuntimeResizeViewSet,
    RuntimeSampleViewSet,
)

router = SimpleRouter()
router.register("runtime-samples", RuntimeSampleViewSet, basename="runtimesample")
router.register("runtime-resizes", RuntimeResizeViewSet, basename="runtimeresize")
router.register("gpu-samples", GpuSampleViewSet, basename="gpusample")
router.register("application-samples", ApplicationSampleViewSet, basename="applicationsample")
router.register("pipeline-path-samples", PipelinePathSampleViewSet, basename="pipelinepathsample")

urlpatterns = [
    path("hosts/<int:pk>/metrics/", HostMetricsView.as_view(), name="host-metrics"),
    path("router-reports/", RouterReportView.as_view(), name="router-reports"),
    *router.urls,
]
