from apps.core.api.serializers import TesseraModelSerializer

from ..models import ProfilingPolicy, ReplanPolicy, SloPolicy


class SloPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = SloPolicy
        fields = ["id", "display", "application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule", "created", "last_updated"]


class ReplanPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = ReplanPolicy
        fields = [
            "id", "display", "name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply", "debounce_seconds",
            "demand_window_seconds", "forecast_horizon_seconds", "host_lost_after_seconds", "created", "last_updated",
        ]


class ProfilingPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = ProfilingPolicy
        fields = [
            "id", "display", "name", "enabled", "auto_profile_new_variants", "device_types", "slices", "batch_sizes", "cpu_threads",
            "timeout_s", "created", "last_updated",
        ]
