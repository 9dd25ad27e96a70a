from rest_framework.routers import SimpleRouter

from .views import EnsemblePolicyViewSet, ProfilingPolicyViewSet, ReplanPolicyViewSet, SloPolicyViewSet

router = SimpleRouter()
router.register("slo-policies", SloPolicyViewSet, basename="slopolicy")
router.register("replan-policies", ReplanPolicyViewSet, basename="replanpolicy")
router.register("profiling-policies", ProfilingPolicyViewSet, basename="profilingpolicy")
router.register("ensemble-policies", EnsemblePolicyViewSet, basename="ensemblepolicy")
urlpatterns = router.urls
