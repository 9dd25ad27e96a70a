from django.contrib import admin

from .models import ApplicationSample, GpuSample, RuntimeSample


class SampleAdmin(admin.ModelAdmin):
    """Samples are measurements: shown, never edited or added by hand."""

    date_hierarchy = "at"
    list_per_page = 100

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(RuntimeSample)
class RuntimeSampleAdmin(SampleAdmin):
    list_display = ["at", "host", "runtime_key", "application_name", "variant_name", "arrivals", "served", "late", "dropped", "latency_p99_ms"]
    list_filter = ["host", "application"]
    search_fields = ["runtime_key", "application_name", "variant_name"]


@admin.register(GpuSample)
class GpuSampleAdmin(SampleAdmin):
    list_display = ["at", "host", "accelerator_index", "placement", "utilization_pct", "gr_engine_active_pct", "memory_used_mb", "power_w", "simulated"]
    list_filter = ["host", "simulated"]


@admin.register(ApplicationSample)
class ApplicationSampleAdmin(SampleAdmin):
    list_display = ["at", "router", "application_name", "routing_version", "arrivals", "served", "late", "dropped", "no_route", "latency_p99_ms"]
    list_filter = ["application", "router"]
    search_fields = ["application_name", "router"]
