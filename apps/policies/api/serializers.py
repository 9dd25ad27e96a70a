from apps.core.api.serializers import TesseraModelSerializer

from ..models import ReplanPolicy, SloPolicy


class SloPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = SloPolicy
        fields = ["id", "display", "application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule", "created", "last_updated"]


class ReplanPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = ReplanPolicy
        fields = ["id", "display", "name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply", "created", "last_updated"]
