from django.contrib import admin

from .models import ProfilingPolicy, ReplanPolicy, SloPolicy


@admin.register(SloPolicy)
class SloPolicyAdmin(admin.ModelAdmin):
    list_display = ["application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule"]
    list_filter = ["drop_rule"]


@admin.register(ReplanPolicy)
class ReplanPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply"]


@admin.register(ProfilingPolicy)
class ProfilingPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "auto_profile_new_variants", "device_types", "timeout_s"]
