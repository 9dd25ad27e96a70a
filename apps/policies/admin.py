from django.contrib import admin

from .models import ReplanPolicy, SloPolicy


@admin.register(SloPolicy)
class SloPolicyAdmin(admin.ModelAdmin):
    list_display = ["application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule"]
    list_filter = ["drop_rule"]


@admin.register(ReplanPolicy)
class ReplanPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply"]
