from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import TesseraModelSerializer

from ..models import EnsemblePolicy, ProfilingPolicy, ReplanPolicy, SloPolicy


class SloPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = SloPolicy
        fields = ["id", "display", "application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule", "expected_rps", "scale_to_zero",
                  "created", "last_updated"]


class ReplanPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = ReplanPolicy
        fields = [
            "id", "display", "name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply", "debounce_seconds",
            "demand_window_seconds", "forecast_horizon_seconds", "demand_memory_seconds", "host_lost_after_seconds", "headroom_target", "created",
            "last_updated",
        ]


class ProfilingPolicySerializer(TesseraModelSerializer):
    class Meta:
        model = ProfilingPolicy
        fields = [
            "id", "display", "name", "enabled", "auto_profile_new_variants", "device_types", "slices", "batch_sizes", "cpu_threads",
            "timeout_s", "created", "last_updated",
        ]


@extend_schema_field({
    "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1, "maxLength": 100}],
    "description": "A variant of the policy's application: its id or its name on input; its name on output",
})
class VariantReferenceField(serializers.Field):
    """A variant by id (a whole number) or by name (text); which application's variants is the service's
    to check. Out: the variant's name."""

    default_error_messages = {"invalid": "Give the variant's id (a whole number) or its name (text of at most 100 characters)."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)) or (isinstance(data, str) and not 1 <= len(data) <= 100):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class EnsembleMemberSerializer(serializers.Serializer):
    variant = VariantReferenceField()
    variant_id = serializers.IntegerField(read_only=True, help_text="The variant's id")
    probability = serializers.FloatField(help_text="Sampling probability, 0..1; the members' probabilities sum to 1")
    weight = serializers.FloatField(required=False, default=1.0, help_text="The weight of its vote, > 0 (default 1)")

    def to_representation(self, instance):
        return {"variant": instance.variant.name, "variant_id": instance.variant_id, "probability": instance.probability, "weight": instance.weight}


class EnsemblePolicySerializer(TesseraModelSerializer):
    """An application's ensemble policy with its members (variants by id or name; answered by name, with
    the id beside it). The rules are the engine's (engine/ensembles/policy.py), checked by the service
    (`ensemble_policy_set`) with the CLI's and the dashboard's messages; members are replaced as a whole.
    A partial update (PATCH) keeps what it leaves out; a full one (PUT) takes the defaults for it."""

    members = EnsembleMemberSerializer(many=True, max_length=1024, help_text="[{variant, probability, weight}]")

    class Meta:
        model = EnsemblePolicy
        fields = ["id", "display", "application", "mode", "min_size", "max_size", "vote", "scheduler", "members", "created", "last_updated"]
        extra_kwargs = {"min_size": {"required": False}, "max_size": {"required": False, "help_text": (
            "Most members answering a query, at most the members with a probability > 0; left out on create or PUT: all of "
            "them (1 for single)")}}

    def validate(self, attrs):
        # The field checks are the service's (ensemble_policy_set, through the engine's validator), called by
        # the viewset; here only what the service cannot see: a policy stays with its application.
        if self.instance is not None and "application" in attrs and attrs["application"] != self.instance.application:
            raise serializers.ValidationError({"application": [
                "An ensemble policy stays with its application: delete it and create one for the other application."]})
        return attrs
