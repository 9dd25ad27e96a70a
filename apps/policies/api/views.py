from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import ProfilingPolicyFilterSet, ReplanPolicyFilterSet, SloPolicyFilterSet
from ..models import ProfilingPolicy, ReplanPolicy, SloPolicy
from .serializers import ProfilingPolicySerializer, ReplanPolicySerializer, SloPolicySerializer


class SloPolicyViewSet(TesseraModelViewSet):
    queryset = SloPolicy.objects.select_related("application")
    serializer_class = SloPolicySerializer
    filterset_class = SloPolicyFilterSet


class ReplanPolicyViewSet(TesseraModelViewSet):
    queryset = ReplanPolicy.objects.all()
    serializer_class = ReplanPolicySerializer
    filterset_class = ReplanPolicyFilterSet


class ProfilingPolicyViewSet(TesseraModelViewSet):
    """How new variants are profiled (automatic profiling when a variant gets an artifact)."""

    queryset = ProfilingPolicy.objects.all()
    serializer_class = ProfilingPolicySerializer
    filterset_class = ProfilingPolicyFilterSet
