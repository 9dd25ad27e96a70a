from django.contrib import admin

from .models import Plan


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Plans are written by plan runs and moved through their lifecycle by the API's actions (approve,
    apply, rollback); the admin only shows them."""

    list_display = ["id", "status", "trigger", "solver", "solver_status", "effective_accuracy", "created", "activated_at"]
    list_filter = ["status", "trigger", "solver"]
    search_fields = ["trigger_detail"]
    date_hierarchy = "created"

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
