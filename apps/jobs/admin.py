from django.contrib import admin

from .models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "progress", "actor_name", "created", "finished")
    list_filter = ("kind", "status")
    readonly_fields = [f.name for f in Job._meta.fields]

    def has_add_permission(self, request):
        return False
