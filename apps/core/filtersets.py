import django_filters

from .models import ObjectChange


class ObjectChangeFilterSet(django_filters.FilterSet):
    object_type = django_filters.CharFilter(method="filter_object_type", help_text="app_label.model, e.g. inventory.host")
    time_after = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="gte")
    time_before = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="lte")

    class Meta:
        model = ObjectChange
        fields = ["action", "actor_kind", "actor_name", "user", "request_id", "changed_object_id"]

    def filter_object_type(self, queryset, name, value):
        app_label, _, model = value.partition(".")
        return queryset.filter(changed_object_type__app_label=app_label, changed_object_type__model=model)
