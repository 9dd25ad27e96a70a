from rest_framework.routers import SimpleRouter

from .views import ReplanPolicyViewSet, SloPolicyViewSet

router = SimpleRouter()
router.register("slo-policies", SloPolicyViewSet, basename="slopolicy")
router.register("replan-policies", ReplanPolicyViewSet, basename="replanpolicy")
urlpatterns = router.urls
