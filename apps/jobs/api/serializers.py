from rest_framework import serializers

from ..models import Job


class JobSerializer(serializers.ModelSerializer):
    display = serializers.CharField(source="__str__", read_only=True)
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Job
        fields = [
            "id", "display", "kind", "status", "progress", "log", "error", "targets", "params", "result", "key", "actor",
            "actor_name", "attempts", "created", "started", "finished",
        ]
        read_only_fields = fields
