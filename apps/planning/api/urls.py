from rest_framework.routers import SimpleRouter

from .views import PlannerViewSet, PlanRunViewSet, PlanViewSet, PredictionCheckViewSet

router = SimpleRouter()
router.register("plan-runs", PlanRunViewSet, basename="planrun")
router.register("plans", PlanViewSet, basename="plan")
router.register("planners", PlannerViewSet, basename="planner")
router.register("prediction-checks", PredictionCheckViewSet, basename="predictioncheck")

urlpatterns = router.urls
