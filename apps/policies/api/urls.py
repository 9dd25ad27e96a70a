from rest_framework.routers import SimpleRouter

from .views import ProfilingPolicyViewSet, ReplanPolicyViewSet, SloPolicyViewSet

router = SimpleRouter()
router.register("slo-policies", SloPolicyViewSet, basename="slopolicy")
router.register("replan-policies", ReplanPolicyViewSet, basename="replanpolicy")
router.register("profiling-policies", ProfilingPolicyViewSet, basename="profilingpolicy")
urlpatterns = router.urls
