"""The project's filterset base, and the audit log's filterset."""
import datetime

import django_filters
from django.core.exceptions import ValidationError
from django.db import connection, models
from django_filters.fields import IsoDateTimeField
from django_filters.utils import get_model_field

from .models import ObjectChange


def _integer_range(model, field_name: str) -> tuple[int | None, int | None]:
    """The range of values the database column behind `field_name` holds (a foreign key: its target's), or
    (None, None) where the field is no integer."""
    field = get_model_field(model, field_name) if model else None
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    if not isinstance(field, (models.IntegerField, models.AutoField)):
        return None, None
    return connection.ops.integer_field_range(field.get_internal_type())


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, in UTC: Python reads offsets up to ±23:59, PostgreSQL only to ±15:59."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(datetime.timezone.utc)
        except OverflowError as exc:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
            raise ValidationError("Date-time out of range.", code="invalid") from exc


class TesseraFilterSet(django_filters.FilterSet):
    """Every API filterset's base: a value the database cannot compare is a 400 naming the filter, not a
    database error. A number filter on an integer column accepts only what the column holds (no integer past
    64 bits); a date-time filter reads any ISO 8601 offset and compares in UTC."""

    @classmethod
    def get_filters(cls):
        filters = super().get_filters()
        for filter_ in filters.values():
            if isinstance(filter_, django_filters.IsoDateTimeFilter):
                filter_.field_class = UtcIsoDateTimeField
            if isinstance(filter_, django_filters.NumberFilter):
                low, high = _integer_range(cls._meta.model, filter_.field_name)
                if low is not None:
                    filter_.extra.setdefault("min_value", low)
                if high is not None:
                    filter_.extra.setdefault("max_value", high)
        return filters


class ObjectChangeFilterSet(TesseraFilterSet):
    object_type = django_filters.CharFilter(method="filter_object_type", help_text="app_label.model, e.g. inventory.host")
    time_after = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="gte")
    time_before = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="lte")

    class Meta:
        model = ObjectChange
        fields = ["action", "actor_kind", "actor_name", "user", "request_id", "changed_object_id"]

    def filter_object_type(self, queryset, name, value):
        app_label, _, model = value.partition(".")
        return queryset.filter(changed_object_type__app_label=app_label, changed_object_type__model=model)
