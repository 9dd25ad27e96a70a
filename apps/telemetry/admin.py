from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin

from .models import ApplicationSample, GpuSample, RuntimeResize, RuntimeSample


class SampleAdmin(ReadOnlyAdmin):
    """Samples are measurements: shown, never edited or added by hand."""

    date_hierarchy = "at"
    list_per_page = 100


@admin.register(RuntimeSample)
class RuntimeSampleAdmin(SampleAdmin):
    list_display = ["at", "host", "runtime_key", "application_name", "variant_name", "arrivals", "served", "late", "dropped", "latency_p99_ms"]
    list_filter = ["host", "application"]
    search_fields = ["runtime_key", "application_name", "variant_name"]


@admin.register(RuntimeResize)
class RuntimeResizeAdmin(SampleAdmin):
    list_display = ["at", "host", "runtime_key", "application_name", "by", "outcome", "from_cores", "cores", "from_batch_cap", "batch_cap",
                    "resize_ms", "reason"]
    list_filter = ["host", "by", "outcome"]
    search_fields = ["runtime_key", "application_name", "reason"]


@admin.register(GpuSample)
class GpuSampleAdmin(SampleAdmin):
    list_display = ["at", "host", "accelerator_index", "placement", "utilization_pct", "gr_engine_active_pct", "memory_used_mb", "power_w", "simulated"]
    list_filter = ["host", "simulated"]


@admin.register(ApplicationSample)
class ApplicationSampleAdmin(SampleAdmin):
    list_display = ["at", "router", "application_name", "routing_version", "arrivals", "served", "late", "dropped", "no_route", "latency_p99_ms"]
    list_filter = ["application", "router"]
    search_fields = ["application_name", "router"]
