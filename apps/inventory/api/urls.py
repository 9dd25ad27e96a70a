from rest_framework.routers import SimpleRouter

from .views import (
    AcceleratorViewSet,
    GpuInstanceViewSet,
    GpuModelViewSet,
    HostViewSet,
    MpsPartitionViewSet,
    RouterCredentialViewSet,
)

router = SimpleRouter()
router.register("hosts", HostViewSet, basename="host")
router.register("accelerators", AcceleratorViewSet, basename="accelerator")
router.register("gpu-instances", GpuInstanceViewSet, basename="gpuinstance")
router.register("mps-partitions", MpsPartitionViewSet, basename="mpspartition")
router.register("gpu-models", GpuModelViewSet, basename="gpumodel")
router.register("router-credentials", RouterCredentialViewSet, basename="routercredential")
urlpatterns = router.urls
