from rest_framework.routers import SimpleRouter

from .views import (
    ApplicationViewSet,
    ArtifactViewSet,
    CorunMeasurementViewSet,
    ModelVariantViewSet,
    PipelineViewSet,
    ProfileViewSet,
    ProfilingRequestViewSet,
)

router = SimpleRouter()
router.register("pipelines", PipelineViewSet, basename="pipeline")
router.register("applications", ApplicationViewSet, basename="application")
router.register("artifacts", ArtifactViewSet, basename="artifact")
router.register("variants", ModelVariantViewSet, basename="modelvariant")
router.register("profiles", ProfileViewSet, basename="profile")
router.register("corun-measurements", CorunMeasurementViewSet, basename="corunmeasurement")
router.register("profiling-requests", ProfilingRequestViewSet, basename="profilingrequest")
urlpatterns = router.urls
