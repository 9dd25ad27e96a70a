from apps.core.api.viewsets import TesseraReadOnlyModelViewSet

from ..filtersets import JobFilterSet
from ..models import Job
from .serializers import JobSerializer


class JobViewSet(TesseraReadOnlyModelViewSet):
    """Long-running actions (profiling, planning, rollout) and their progress and log. Read-only: jobs are
    created by the actions that start them."""

    queryset = Job.objects.select_related("actor")
    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    ordering_fields = ["created", "status", "kind"]
