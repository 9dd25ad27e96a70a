from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.viewsets import TesseraModelViewSet, TesseraReadOnlyModelViewSet
from apps.core.principals import principal_is_agent
from apps.deployments.services import host_report_apply
from apps.users.roles import RoleChoices, user_role
from engine.geometry.catalogue import mig_catalogue_load, pci_device_id_format

from ..filtersets import AcceleratorFilterSet, GpuInstanceFilterSet, HostFilterSet, MpsPartitionFilterSet, RouterCredentialFilterSet
from ..models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential
from ..services import host_agent_token_rotate, router_credential_issue, router_credential_revoke, router_credential_update
from .serializers import (
    AcceleratorSerializer,
    AgentTokenSerializer,
    GpuInstanceSerializer,
    HostReportSerializer,
    HostSerializer,
    MpsPartitionSerializer,
    RouterCredentialIssuedSerializer,
    RouterCredentialIssueSerializer,
    RouterCredentialSerializer,
    RouterCredentialUpdateSerializer,
)


class IsOwnHostAgent(permissions.BasePermission):
    message = "Only the host's own agent may report its actual state."

    def has_permission(self, request, view):
        return principal_is_agent(request.user)

    def has_object_permission(self, request, view, obj):
        return request.user.host.pk == obj.pk


class IsAdminRole(permissions.BasePermission):
    message = "Only admins manage agent tokens and router credentials."

    def has_permission(self, request, view):
        user = request.user
        return bool(user and user.is_authenticated and not principal_is_agent(user) and user_role(user) == RoleChoices.ADMIN)


class HostViewSet(TesseraModelViewSet):
    queryset = Host.objects.prefetch_related("accelerators")
    serializer_class = HostSerializer
    filterset_class = HostFilterSet
    ordering_fields = ["name", "status", "last_seen"]

    def restrict_action(self) -> str:
        # The agent's report and the admin's token rotation find the host by what the caller may see.
        return "view" if self.action in ("report", "agent_token") else super().restrict_action()

    @extend_schema(request=HostReportSerializer, responses={200: HostSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOwnHostAgent])
    def report(self, request, pk=None):
        """Agent only: report the host's actual devices and MIG instances, its runtimes and operations. All or
        nothing."""
        host = self.get_object()
        report = HostReportSerializer(data=request.data)
        report.is_valid(raise_exception=True)
        host = host_report_apply(host=host, report=report.validated_data)
        return Response(HostSerializer(host, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={201: AgentTokenSerializer})
    @action(detail=True, methods=["post"], url_path="agent-token", permission_classes=[IsAdminRole])
    def agent_token(self, request, pk=None):
        """Admin only: issue a new agent token for this host; the previous one stops working."""
        host = self.get_object()
        secret = host_agent_token_rotate(host=host)
        return Response({"host": host.pk, "token": secret}, status=status.HTTP_201_CREATED)


class RouterCredentialViewSet(TesseraReadOnlyModelViewSet):
    """Routers' credentials, each scoped to one router name. Viewers list them (never a secret); admins issue
    (`POST`: a new name, or a new secret for a known one) and revoke them. A router sees its own only."""

    queryset = RouterCredential.objects.all()
    serializer_class = RouterCredentialSerializer
    ordering_fields = ["name", "last_used"]
    filterset_class = RouterCredentialFilterSet

    def restrict_action(self) -> str:
        return "view" if self.action in ("revoke", "partial_update") else super().restrict_action()

    def _issued(self, credential: RouterCredential, secret: str) -> Response:
        data = RouterCredentialIssuedSerializer(credential, context=self.get_serializer_context()).data
        return Response({**data, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(request=RouterCredentialIssueSerializer, responses={201: RouterCredentialIssuedSerializer})
    def create(self, request):
        """Admin only: issue a credential for router `name` and return its secret once. Issuing again for the
        same name replaces the secret (the previous one stops working) and lifts a revocation."""
        if not IsAdminRole().has_permission(request, self):
            raise exceptions.PermissionDenied(IsAdminRole.message)
        body = RouterCredentialIssueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        credential, secret = router_credential_issue(**body.validated_data)
        return self._issued(credential, secret)

    @extend_schema(request=RouterCredentialUpdateSerializer, responses={200: RouterCredentialSerializer})
    def partial_update(self, request, pk=None):
        """Admin only: change the credential's description and whether the router may load and unload models,
        keeping its secret (the running router goes on working). Audited."""
        if not IsAdminRole().has_permission(request, self):
            raise exceptions.PermissionDenied(IsAdminRole.message)
        credential = self.get_object()
        body = RouterCredentialUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        credential = router_credential_update(credential=credential, **body.validated_data)
        return Response(RouterCredentialSerializer(credential, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={200: RouterCredentialSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAdminRole])
    def revoke(self, request, pk=None):
        """Admin only: revoke the credential; the router's requests are refused (401) from now on."""
        credential = router_credential_revoke(credential=self.get_object())
        return Response(RouterCredentialSerializer(credential, context=self.get_serializer_context()).data)


class AcceleratorViewSet(TesseraModelViewSet):
    queryset = Accelerator.objects.select_related("host")
    serializer_class = AcceleratorSerializer
    filterset_class = AcceleratorFilterSet
    ordering_fields = ["host__name", "index"]


class GpuInstanceViewSet(TesseraModelViewSet):
    queryset = GpuInstance.objects.select_related("accelerator__host")
    serializer_class = GpuInstanceSerializer
    filterset_class = GpuInstanceFilterSet
    ordering_fields = ["accelerator", "placement_start"]


class MpsPartitionViewSet(TesseraModelViewSet):
    """MPS partitions of GPUs in MPS mode: a percent of the GPU's SMs each, largest first by index. Created
    and deleted one at a time, every step a valid layout (so delete from the last index)."""

    queryset = MpsPartition.objects.select_related("accelerator__host")
    serializer_class = MpsPartitionSerializer
    filterset_class = MpsPartitionFilterSet
    ordering_fields = ["accelerator", "index"]

    def perform_destroy(self, instance):
        with transaction.atomic():
            later = instance.accelerator.mps_partitions_set.filter(index__gt=instance.index).order_by("index")
            if later.exists():
                slots = ", ".join(p.slot for p in later)
                raise exceptions.ValidationError({"index": [f"{instance.accelerator} has later partitions ({slots}); "
                                                            "delete them first, so the indices stay 0..n-1."]})
            instance.delete()


class MigProfileSerializer(serializers.Serializer):
    name = serializers.CharField()
    profile_id = serializers.IntegerField(allow_null=True, help_text="nvidia-smi mig -lgip's ID on this model (ids differ between models); null where unpublished")
    aliases = serializers.ListField(child=serializers.CharField(), help_text="Other names boards give the profile (early GB200: 7g.189gb)")
    attributes = serializers.ListField(child=serializers.CharField(), help_text='"me", "me.all", "gfx"')
    lacks = serializers.ListField(child=serializers.CharField(), help_text='"me" for a -me profile')
    memory_slices = serializers.IntegerField()
    compute_slices = serializers.IntegerField()
    memory_gb = serializers.IntegerField()
    starts = serializers.ListField(child=serializers.IntegerField())
    max_count = serializers.IntegerField()
    media_extensions = serializers.BooleanField()


class GpuModelSerializer(serializers.Serializer):
    name = serializers.CharField()
    nvml_names = serializers.ListField(child=serializers.CharField())
    memory_mib = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    compute_slices = serializers.IntegerField()
    pci_device_ids = serializers.SerializerMethodField(help_text='Its boards\' PCI device ids, as mig-parted\'s device-filter writes them ("0x20B010DE")')
    source = serializers.DictField(child=serializers.CharField(), help_text="Where its profiles, ids, PCI ids and memory come from")
    profiles = serializers.SerializerMethodField()

    def get_pci_device_ids(self, obj) -> list[str]:
        return [pci_device_id_format(d) for d in obj.pci_device_ids]

    def get_profiles(self, obj) -> list[dict]:
        return MigProfileSerializer(list(obj.profiles), many=True).data


class CatalogueReadPermission(permissions.BasePermission):
    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated)


class GpuModelViewSet(viewsets.ViewSet):
    """The MIG catalogue (read-only data from NVIDIA's MIG user guide): GPU models and their profiles."""

    permission_classes = [CatalogueReadPermission]
    lookup_value_regex = r"[^/]+"
    serializer_class = GpuModelSerializer

    @extend_schema(responses=GpuModelSerializer(many=True))
    def list(self, request):
        return Response(GpuModelSerializer(mig_catalogue_load().gpu_models, many=True).data)

    @extend_schema(responses={200: GpuModelSerializer, 404: OpenApiResponse(description="Unknown GPU model")})
    def retrieve(self, request, pk=None):
        spec = mig_catalogue_load().gpu_model_find(pk)
        if spec is None:
            raise exceptions.NotFound(f"No GPU model {pk!r} in the MIG catalogue.")
        return Response(GpuModelSerializer(spec).data)
