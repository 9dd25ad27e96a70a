from rest_framework.routers import SimpleRouter

from .views import PlannerViewSet, PlanRunViewSet, PlanViewSet

router = SimpleRouter()
router.register("plan-runs", PlanRunViewSet, basename="planrun")
router.register("plans", PlanViewSet, basename="plan")
router.register("planners", PlannerViewSet, basename="planner")

urlpatterns = router.urls
