import django_filters

from apps.core.filtersets import TesseraFilterSet

from .models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, Profile, ProfilingRequest


class PipelineFilterSet(TesseraFilterSet):
    class Meta:
        model = Pipeline
        fields = ["name"]


class ApplicationFilterSet(TesseraFilterSet):
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains")
    pipeline = django_filters.CharFilter(field_name="pipeline_stage__pipeline__name", help_text="Stages of the pipeline with this name")

    class Meta:
        model = Application
        fields = ["name", "task"]


class ModelVariantFilterSet(TesseraFilterSet):
    application_name = django_filters.CharFilter(field_name="application__name")
    accuracy_min = django_filters.NumberFilter(field_name="accuracy", lookup_expr="gte")
    has_artifact = django_filters.BooleanFilter(field_name="artifact", lookup_expr="isnull", exclude=True)

    class Meta:
        model = ModelVariant
        fields = ["application", "name", "artifact"]


class ArtifactFilterSet(TesseraFilterSet):
    class Meta:
        model = Artifact
        fields = ["sha256", "opset"]


class ProfileFilterSet(TesseraFilterSet):
    application = django_filters.NumberFilter(field_name="variant__application")

    class Meta:
        model = Profile
        fields = ["variant", "device_type", "slice", "cpu_cores", "batch_size", "source"]


class CorunMeasurementFilterSet(TesseraFilterSet):
    application = django_filters.NumberFilter(field_name="variant__application")

    class Meta:
        model = CorunMeasurement
        fields = ["variant", "corunner", "device_type", "partition_pct", "batch", "corunner_batch", "source"]


class ProfilingRequestFilterSet(TesseraFilterSet):
    application = django_filters.NumberFilter(field_name="variant__application")

    class Meta:
        model = ProfilingRequest
        fields = ["host", "variant", "device", "status", "job"]
