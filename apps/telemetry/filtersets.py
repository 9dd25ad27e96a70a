import django_filters

from apps.core.filtersets import TesseraFilterSet

from .models import ApplicationSample, GpuSample, PipelinePathSample, RuntimeResize, RuntimeSample


class _SampleFilterSet(TesseraFilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", help_text="Samples at or after (ISO 8601)")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt", help_text="Samples before (ISO 8601)")


class RuntimeSampleFilterSet(_SampleFilterSet):
    class Meta:
        model = RuntimeSample
        fields = ["host", "application", "application_name", "runtime_key", "variant_name"]


class RuntimeResizeFilterSet(_SampleFilterSet):
    """When and why a runtime was resized: by host and runtime, application, who asked, outcome, and time
    (`since`, `until`: when it was resized)."""

    class Meta:
        model = RuntimeResize
        fields = ["host", "runtime_key", "application", "application_name", "variant_name", "by", "outcome"]


class GpuSampleFilterSet(_SampleFilterSet):
    class Meta:
        model = GpuSample
        fields = ["host", "accelerator_index", "placement", "simulated"]


class ApplicationSampleFilterSet(_SampleFilterSet):
    class Meta:
        model = ApplicationSample
        fields = ["host", "application", "application_name", "router"]


class PipelinePathSampleFilterSet(_SampleFilterSet):
    class Meta:
        model = PipelinePathSample
        fields = ["pipeline", "pipeline_name", "path", "router"]
