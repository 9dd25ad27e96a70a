from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from apps.core.admin import ReadOnlyAdmin

from .models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, PipelineStage, Profile, ProfilingRequest


class PipelineAdminForm(forms.ModelForm):
    """The admin writes pipelines through the same service as the API and the CLI: the graph is checked by
    the planning parser, the stage index rewritten with it."""

    class Meta:
        model = Pipeline
        fields = ["name", "description", "stages", "paths", "alpha", "beta", "delta", "ipa_threshold_rps"]
        help_texts = {
            "stages": 'e.g. ["detect", {"application": "classify", "variant": "resnet50", "max_batch": 16}], or "detect -> classify"',
            "paths": 'e.g. [{"name": "main", "stages": ["detect", "classify"], "slo_ms": 200, "demand_rps": 40}]',
        }

    def clean(self):
        from .services.pipelines import pipeline_spec_read

        data = super().clean()
        try:
            self.normal = pipeline_spec_read({k: v for k, v in data.items() if v is not None}, pipeline=self.instance if self.instance.pk else None)
        except ValidationError as exc:
            raise forms.ValidationError(exc.messages) from exc
        return data


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    form = PipelineAdminForm
    list_display = ["name", "entry", "stage_list", "path_count"]
    search_fields = ["name"]

    @admin.display(description="stages")
    def stage_list(self, obj) -> str:
        return ", ".join(s["application"] for s in obj.stages)

    @admin.display(description="paths")
    def path_count(self, obj) -> int:
        return len(obj.paths)

    def save_model(self, request, obj, form, change):
        from .services.pipelines import pipeline_save

        saved = pipeline_save(data=form.normal, pipeline=obj if change else None)
        obj.pk = saved.pk


@admin.register(Application)
class ApplicationAdmin(admin.ModelAdmin):
    list_display = ["name", "task", "pipeline_name"]
    list_filter = ["task", "pipeline_stage__pipeline"]
    search_fields = ["name", "description"]

    @admin.display(description="pipeline")
    def pipeline_name(self, obj) -> str:
        stage = PipelineStage.objects.filter(application=obj).select_related("pipeline").first()
        return stage.pipeline.name if stage else "-"


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
