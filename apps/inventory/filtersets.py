import django_filters

from apps.core.filtersets import TesseraFilterSet

from .models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential


class HostFilterSet(TesseraFilterSet):
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains")
    label = django_filters.CharFilter(method="filter_label", help_text="key=value")

    class Meta:
        model = Host
        fields = ["name", "status", "backend"]

    def filter_label(self, queryset, name, value):
        key, _, wanted = value.partition("=")
        return queryset.filter(**{f"labels__{key}": wanted})


class AcceleratorFilterSet(TesseraFilterSet):
    model_name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Accelerator
        fields = ["host", "kind", "mig_capable", "mig_enabled", "mps_enabled", "uuid"]


class GpuInstanceFilterSet(TesseraFilterSet):
    host = django_filters.NumberFilter(field_name="accelerator__host")

    class Meta:
        model = GpuInstance
        fields = ["accelerator", "profile", "state"]


class MpsPartitionFilterSet(TesseraFilterSet):
    host = django_filters.NumberFilter(field_name="accelerator__host")

    class Meta:
        model = MpsPartition
        fields = ["accelerator", "percent", "index", "state"]


class RouterCredentialFilterSet(TesseraFilterSet):
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains")
    revoked = django_filters.BooleanFilter(field_name="revoked", lookup_expr="isnull", exclude=True,
                                           help_text="true: revoked credentials; false: valid ones")

    class Meta:
        model = RouterCredential
        fields = ["name"]
