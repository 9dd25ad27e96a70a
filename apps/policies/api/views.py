from django.core.exceptions import ValidationError as DjangoValidationError

from apps.core.api.exceptions import validation_error_from_django
from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import EnsemblePolicyFilterSet, ProfilingPolicyFilterSet, ReplanPolicyFilterSet, SloPolicyFilterSet
from ..models import EnsemblePolicy, ProfilingPolicy, ReplanPolicy, SloPolicy
from ..services import (
    ensemble_policy_data,
    ensemble_policy_delete,
    ensemble_policy_set,
    profiling_policy_update,
    replan_policy_update,
    slo_policy_update,
)
from .serializers import EnsemblePolicySerializer, ProfilingPolicySerializer, ReplanPolicySerializer, SloPolicySerializer


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


class EnsemblePolicyViewSet(TesseraModelViewSet):
    """Each application's ensemble policy (Garrison's random ensembles): mode single, random or learned; the
    members (variants by id or name) with sampling probability and vote weight; ensemble size bounds; the
    vote. Written through `ensemble_policy_set`, as by `tessera ensemble set` and the dashboard: the
    engine's rules, a 400 by field and nothing stored on bad input, the members replaced as a whole."""

    queryset = EnsemblePolicy.objects.select_related("application").prefetch_related("members__variant")
    serializer_class = EnsemblePolicySerializer
    filterset_class = EnsemblePolicyFilterSet

    def _save(self, serializer, data):
        application = serializer.validated_data.get("application") or serializer.instance.application
        try:
            serializer.instance = ensemble_policy_set(application=application, data=data, actor=self.request.user)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc

    def perform_create(self, serializer):
        self._save(serializer, {k: v for k, v in serializer.validated_data.items() if k != "application"})

    def perform_update(self, serializer):
        # PATCH keeps what it leaves out (members as a whole when given); PUT takes the defaults for it.
        data = ensemble_policy_data(serializer.instance) if serializer.partial else {}
        data.update({k: v for k, v in serializer.validated_data.items() if k != "application"})
        self._save(serializer, data)

    def perform_destroy(self, instance):
        ensemble_policy_delete(policy=instance, actor=self.request.user)
