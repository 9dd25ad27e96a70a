from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import ReplanPolicyFilterSet, SloPolicyFilterSet
from ..models import ReplanPolicy, SloPolicy
from .serializers import ReplanPolicySerializer, SloPolicySerializer


class SloPolicyViewSet(TesseraModelViewSet):
    queryset = SloPolicy.objects.select_related("application")
    serializer_class = SloPolicySerializer
    filterset_class = SloPolicyFilterSet


class ReplanPolicyViewSet(TesseraModelViewSet):
    queryset = ReplanPolicy.objects.all()
    serializer_class = ReplanPolicySerializer
    filterset_class = ReplanPolicyFilterSet
