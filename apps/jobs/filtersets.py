import django_filters

from apps.core.filtersets import TesseraFilterSet

from .choices import JobKindChoices, JobStatusChoices
from .models import Job


class JobFilterSet(TesseraFilterSet):
    kind = django_filters.MultipleChoiceFilter(choices=JobKindChoices.choices)
    status = django_filters.MultipleChoiceFilter(choices=JobStatusChoices.choices)
    since = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="gte")

    class Meta:
        model = Job
        fields = ["kind", "status", "key", "since"]
