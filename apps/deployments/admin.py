from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin

from .models import HostDesiredState, HostOperation, RoutingTable, Runtime

# Written by services (validated documents) and by agents' reports only; the admin shows them.


@admin.register(HostDesiredState)
class HostDesiredStateAdmin(ReadOnlyAdmin):
    list_display = ["host", "version", "created_by", "created"]
    list_filter = ["host"]
    search_fields = ["host__name"]


@admin.register(RoutingTable)
class RoutingTableAdmin(ReadOnlyAdmin):
    list_display = ["application", "version", "active", "created_by", "created"]
    list_filter = ["active", "application"]
    search_fields = ["application__name"]


@admin.register(Runtime)
class RuntimeAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "application", "variant", "state", "endpoint", "simulated", "last_updated"]
    list_filter = ["state", "simulated", "host"]
    search_fields = ["key", "host__name", "application__name"]


@admin.register(HostOperation)
class HostOperationAdmin(ReadOnlyAdmin):
    list_display = ["at", "host", "action", "target", "outcome"]
    list_filter = ["outcome", "action", "host"]
    search_fields = ["target", "detail", "host__name"]
    date_hierarchy = "at"
