from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import HostDesiredStateView, HostDesiredStateViewSet, HostOperationViewSet, RoutingTableViewSet, RuntimeViewSet

router = SimpleRouter()
router.register("desired-states", HostDesiredStateViewSet, basename="hostdesiredstate")
router.register("routing-tables", RoutingTableViewSet, basename="routingtable")
router.register("runtimes", RuntimeViewSet, basename="runtime")
router.register("host-operations", HostOperationViewSet, basename="hostoperation")

urlpatterns = [
    path("hosts/<int:pk>/desired-state/", HostDesiredStateView.as_view(), name="host-desired-state"),
    *router.urls,
]
