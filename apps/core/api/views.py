from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse

from ..filtersets import ObjectChangeFilterSet
from ..models import ObjectChange
from .viewsets import TesseraReadOnlyModelViewSet


class ObjectChangeSerializer(serializers.ModelSerializer):
    object_type = serializers.SerializerMethodField()
    changed_fields = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = ObjectChange
        fields = [
            "id", "time", "actor_kind", "actor_name", "user", "request_id", "source", "action",
            "object_type", "changed_object_id", "object_repr", "changed_fields", "prechange_data", "postchange_data",
        ]

    @extend_schema_field(serializers.CharField())
    def get_object_type(self, obj) -> str:
        return f"{obj.changed_object_type.app_label}.{obj.changed_object_type.model}"


class ObjectChangeViewSet(TesseraReadOnlyModelViewSet):
    """The audit log: who changed what, when, with before and after."""

    queryset = ObjectChange.objects.select_related("changed_object_type")
    serializer_class = ObjectChangeSerializer
    filterset_class = ObjectChangeFilterSet
    ordering_fields = ["time", "id"]


@extend_schema(exclude=True)
@api_view(["GET"])
@permission_classes([AllowAny])
def api_root(request, format=None):
    """Index of the API's resources."""
    names = [
        "host", "accelerator", "gpuinstance", "gpumodel", "application", "pipeline", "modelvariant",
        "artifact", "profile", "profilingrequest", "slopolicy", "replanpolicy", "ensemblepolicy", "hostdesiredstate", "routingtable",
        "runtime", "hostoperation", "planrun", "plan", "runtimesample", "runtimeresize", "gpusample", "applicationsample", "objectchange",
        "user", "token",
    ]
    return Response({name: reverse(f"api:{name}-list", request=request, format=format) for name in names})
