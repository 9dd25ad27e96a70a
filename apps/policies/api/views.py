from django.core.exceptions import ValidationError as DjangoValidationError

from apps.core.api.exceptions import validation_error_from_django
from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import ProfilingPolicyFilterSet, ReplanPolicyFilterSet, SloPolicyFilterSet
from ..models import ProfilingPolicy, ReplanPolicy, SloPolicy
from ..services import profiling_policy_update, replan_policy_update, slo_policy_update
from .serializers import ProfilingPolicySerializer, ReplanPolicySerializer, SloPolicySerializer


class PolicyUpdateMixin:
    """Updates go through the policy's service (apps/policies/services.py), the same one the dashboard's
    Policies page uses: the serializer parses and checks the input, the service validates and saves."""

    update_service = None

    def perform_update(self, serializer):
        try:
            serializer.instance = self.update_service(policy=serializer.instance, data=dict(serializer.validated_data))
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc


class SloPolicyViewSet(PolicyUpdateMixin, TesseraModelViewSet):
    queryset = SloPolicy.objects.select_related("application")
    serializer_class = SloPolicySerializer
    filterset_class = SloPolicyFilterSet
    update_service = staticmethod(slo_policy_update)


class ReplanPolicyViewSet(PolicyUpdateMixin, TesseraModelViewSet):
    queryset = ReplanPolicy.objects.all()
    serializer_class = ReplanPolicySerializer
    filterset_class = ReplanPolicyFilterSet
    update_service = staticmethod(replan_policy_update)


class ProfilingPolicyViewSet(PolicyUpdateMixin, TesseraModelViewSet):
    """How new variants are profiled (automatic profiling when a variant gets an artifact)."""

    queryset = ProfilingPolicy.objects.all()
    serializer_class = ProfilingPolicySerializer
    filterset_class = ProfilingPolicyFilterSet
    update_service = staticmethod(profiling_policy_update)
