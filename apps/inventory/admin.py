from django.contrib import admin

from .models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential


class AcceleratorInline(admin.TabularInline):
    model = Accelerator
    extra = 0
    fields = ["index", "kind", "model_name", "memory_mb", "mig_capable", "mig_enabled", "mps_enabled", "cpu_cores", "uuid"]


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "backend", "address", "last_seen", "agent_token_prefix"]
    list_filter = ["status", "backend"]
    search_fields = ["name", "address", "description"]
    readonly_fields = ["last_seen", "agent_version", "agent_token_prefix", "converged_version", "catalogue_disagreements"]
    inlines = [AcceleratorInline]


class GpuInstanceInline(admin.TabularInline):
    model = GpuInstance
    extra = 0
    fields = ["profile", "placement_start", "placement_size", "uuid", "state"]
    readonly_fields = ["placement_size"]


class MpsPartitionInline(admin.TabularInline):
    model = MpsPartition
    extra = 0
    fields = ["index", "percent", "state"]


@admin.register(Accelerator)
class AcceleratorAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "model_name", "memory_mb", "mig_capable", "mig_enabled", "mps_enabled", "cpu_cores"]
    list_filter = ["kind", "mig_capable", "mig_enabled", "mps_enabled", "host"]
    search_fields = ["model_name", "uuid", "host__name"]
    inlines = [GpuInstanceInline, MpsPartitionInline]


@admin.register(GpuInstance)
class GpuInstanceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "profile", "placement_start", "placement_size", "state", "uuid"]
    list_filter = ["state", "profile"]
    search_fields = ["uuid", "accelerator__host__name"]
    readonly_fields = ["placement_size"]


@admin.register(MpsPartition)
class MpsPartitionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "percent", "index", "state"]
    list_filter = ["state", "percent"]
    search_fields = ["accelerator__host__name"]


@admin.register(RouterCredential)
class RouterCredentialAdmin(admin.ModelAdmin):
    """Listed, described and deleted here; issued and revoked with the CLI or the API (the secret is shown
    once, by them)."""

    list_display = ["name", "token_prefix", "revoked", "last_used", "dropped_reports"]
    search_fields = ["name", "description"]
    readonly_fields = ["token_prefix", "revoked", "last_used", "dropped_reports"]

    def has_add_permission(self, request) -> bool:
        return False
