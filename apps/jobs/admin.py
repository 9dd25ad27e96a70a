from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin

from .models import Job


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs are created and run by services and their tasks; the admin shows them."""

    list_display = ("id", "kind", "status", "progress", "actor_name", "created", "finished")
    list_filter = ("kind", "status")
