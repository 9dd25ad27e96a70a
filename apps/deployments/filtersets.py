import django_filters

from .models import HostDesiredState, HostOperation, RoutingTable, Runtime


class HostDesiredStateFilterSet(django_filters.FilterSet):
    host_name = django_filters.CharFilter(field_name="host__name")

    class Meta:
        model = HostDesiredState
        fields = ["host", "version"]


class RoutingTableFilterSet(django_filters.FilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = RoutingTable
        fields = ["application", "active", "version"]


class RuntimeFilterSet(django_filters.FilterSet):
    host_name = django_filters.CharFilter(field_name="host__name")
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = Runtime
        fields = ["host", "application", "variant", "state", "key", "simulated"]


class HostOperationFilterSet(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = HostOperation
        fields = ["host", "action", "outcome"]
