from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin

from .models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, Profile, ProfilingRequest


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    list_display = ["name", "slo_ms"]
    search_fields = ["name"]


@admin.register(Application)
class ApplicationAdmin(admin.ModelAdmin):
    list_display = ["name", "task", "pipeline", "pipeline_stage"]
    list_filter = ["task", "pipeline"]
    search_fields = ["name", "description"]


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    """Uploads go through the API so they are validated (ONNX checker, onnxruntime); the admin shows them."""

    list_display = ["original_name", "sha256", "size_bytes", "opset", "created", "last_verified", "verify_error"]
    search_fields = ["original_name", "sha256"]


class ProfileInline(admin.TabularInline):
    model = Profile
    extra = 0
    fields = ["device_type", "slice", "cpu_cores", "batch_size", "latency_p50_ms", "latency_p99_ms", "throughput_rps", "source"]


@admin.register(ModelVariant)
class ModelVariantAdmin(admin.ModelAdmin):
    list_display = ["__str__", "accuracy", "accuracy_metric", "artifact", "memory_mb"]
    list_filter = ["application"]
    search_fields = ["name", "application__name"]
    inlines = [ProfileInline]


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ["__str__", "latency_p50_ms", "latency_p99_ms", "throughput_rps", "source"]
    list_filter = ["source", "device_type", "slice"]
    search_fields = ["variant__name", "variant__application__name"]


@admin.register(CorunMeasurement)
class CorunMeasurementAdmin(admin.ModelAdmin):
    list_display = ["__str__", "latency_ms", "throughput_rps", "source"]
    list_filter = ["source", "device_type", "partition_pct"]
    search_fields = ["variant__name", "corunner__name", "variant__application__name"]


@admin.register(ProfilingRequest)
class ProfilingRequestAdmin(admin.ModelAdmin):
    list_display = ["__str__", "status", "progress", "created_by", "created", "finished"]
    list_filter = ["status", "host"]
    search_fields = ["variant__name", "variant__application__name", "host__name"]
    readonly_fields = ["status", "progress", "log", "error", "created_by", "job", "started", "finished"]
