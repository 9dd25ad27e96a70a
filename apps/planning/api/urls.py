from rest_framework.routers import SimpleRouter

from .views import PlanRunViewSet, PlanViewSet

router = SimpleRouter()
router.register("plan-runs", PlanRunViewSet, basename="planrun")
router.register("plans", PlanViewSet, basename="plan")

urlpatterns = router.urls
