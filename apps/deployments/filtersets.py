import django_filters

from apps.core.filtersets import TesseraFilterSet

from .models import HostDesiredState, HostOperation, RoutingTable, Runtime


class HostDesiredStateFilterSet(TesseraFilterSet):
    host_name = django_filters.CharFilter(field_name="host__name")

    class Meta:
        model = HostDesiredState
        fields = ["host", "version"]


class RoutingTableFilterSet(TesseraFilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = RoutingTable
        fields = ["application", "active", "version"]


class RuntimeFilterSet(TesseraFilterSet):
    host_name = django_filters.CharFilter(field_name="host__name")
    application_name = django_filters.CharFilter(field_name="application__name")

    class Meta:
        model = Runtime
        fields = ["host", "application", "variant", "state", "key", "simulated"]


class HostOperationFilterSet(TesseraFilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = HostOperation
        fields = ["host", "action", "outcome"]
