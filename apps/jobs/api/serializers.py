from rest_framework import serializers

from ..models import Job


class JobSerializer(serializers.ModelSerializer):
    display = serializers.CharField(source="__str__", read_only=True)
    actor = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="The user who started the job; null for an agent, a trigger or the scheduler (see actor_name)",
    )

    class Meta:
        model = Job
        fields = [
            "id", "display", "kind", "status", "progress", "log", "error", "targets", "params", "result", "key", "actor",
            "actor_name", "attempts", "created", "started", "finished", "queued", "heartbeat", "retry_at",
        ]
        read_only_fields = fields
