import django_filters

from apps.core.filtersets import TesseraFilterSet
from apps.jobs.choices import JobStatusChoices
from apps.jobs.models import Job

from .choices import PlanStatusChoices, PlanTriggerChoices, PredictionTargetChoices
from .models import Plan, PredictionCheck


class PlanFilterSet(TesseraFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=PlanStatusChoices.choices)
    trigger = django_filters.MultipleChoiceFilter(choices=PlanTriggerChoices.choices)
    since = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="lt")

    class Meta:
        model = Plan
        fields = ["status", "trigger", "solver", "job", "since", "until"]


class PlanRunFilterSet(TesseraFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=JobStatusChoices.choices)
    since = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="gte")

    class Meta:
        model = Job
        fields = ["status", "since"]


class PredictionCheckFilterSet(TesseraFilterSet):
    kind = django_filters.MultipleChoiceFilter(choices=PredictionTargetChoices.choices)
    since = django_filters.IsoDateTimeFilter(field_name="window_end", lookup_expr="gte")

    class Meta:
        model = PredictionCheck
        fields = ["plan", "target", "kind", "since"]
