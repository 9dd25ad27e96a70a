import django_filters

from apps.core.filtersets import TesseraFilterSet

from .models import EnsemblePolicy, ProfilingPolicy, ReplanPolicy, SloPolicy


class SloPolicyFilterSet(TesseraFilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = SloPolicy
        fields = ["application", "drop_rule", "priority", "scale_to_zero"]


class ReplanPolicyFilterSet(TesseraFilterSet):
    class Meta:
        model = ReplanPolicy
        fields = ["name", "enabled", "auto_apply"]


class ProfilingPolicyFilterSet(TesseraFilterSet):
    class Meta:
        model = ProfilingPolicy
        fields = ["name", "enabled", "auto_profile_new_variants"]


class EnsemblePolicyFilterSet(TesseraFilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = EnsemblePolicy
        fields = ["application", "mode"]
