import django_filters

from .models import ProfilingPolicy, ReplanPolicy, SloPolicy


class SloPolicyFilterSet(django_filters.FilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = SloPolicy
        fields = ["application", "drop_rule", "priority"]


class ReplanPolicyFilterSet(django_filters.FilterSet):
    class Meta:
        model = ReplanPolicy
        fields = ["name", "enabled", "auto_apply"]


class ProfilingPolicyFilterSet(django_filters.FilterSet):
    class Meta:
        model = ProfilingPolicy
        fields = ["name", "enabled", "auto_profile_new_variants"]
