from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin

from .models import Plan


@admin.register(Plan)
class PlanAdmin(ReadOnlyAdmin):
    """Plans are written by plan runs and moved through their lifecycle by the API's actions (approve,
    apply, rollback); the admin only shows them."""

    list_display = ["id", "status", "trigger", "solver", "solver_status", "effective_accuracy", "created", "activated_at"]
    list_filter = ["status", "trigger", "solver"]
    search_fields = ["trigger_detail"]
    date_hierarchy = "created"
    deletable = False
