from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, parsers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.viewsets import RestrictedQuerysetMixin, TesseraModelViewSet, TesseraReadOnlyModelViewSet
from apps.inventory.models import Host
from apps.inventory.services import host_visible_find
from apps.registry.models import Application
from engine.dataplane.triton import TritonLoadConfigError, triton_load_config_parse

from ..filtersets import HostDesiredStateFilterSet, HostOperationFilterSet, RoutingTableFilterSet, RuntimeFilterSet
from ..models import HostDesiredState, HostOperation, RoutingTable, Runtime
from ..services import RoutersBehind, application_pin, application_release, host_desired_state_change, routing_table_publish
from .permissions import MayLoadModels
from .serializers import (
    RepositoryActionResultSerializer,
    RepositoryActionSerializer,
    DesiredStateDocumentSerializer,
    DesiredStateRequestSerializer,
    HostDesiredStateSerializer,
    HostOperationSerializer,
    RoutingTablePublishSerializer,
    RoutingTableSerializer,
    RuntimeSerializer,
)


def host_visible_get(request, pk) -> Host:
    """The host as the caller may see it (an agent: its own host only), else 404."""
    host = host_visible_find(principal=request.user, pk=pk)
    if host is None:
        raise exceptions.NotFound("No such host.")
    return host


class RoutersBehindError(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "routers_behind"
    default_detail = "Routers did not take the routing tables without the routes to the slots that change."


class HostDesiredStateView(RestrictedQuerysetMixin, generics.GenericAPIView):
    """A host's desired state: GET the latest version (the host's own agent, viewers and up; 404 when none
    was ever set); POST a new version (operators and up), validated against the host's inventory.

    A POST that changes what a routed slot serves first withdraws the routes to that slot and waits until
    the live routers hold the tables without them (usually a second or two, at most 30 s); only then is the
    version stored (201). Routers that do not confirm in time: 503 `routers_behind`, nothing changed."""

    queryset = HostDesiredState.objects.select_related("host")
    serializer_class = DesiredStateDocumentSerializer
    parser_classes = [parsers.JSONParser]
    pagination_class = None
    filter_backends = []

    @extend_schema(
        operation_id="hosts_desired_state_retrieve",
        responses={200: DesiredStateDocumentSerializer, 404: OpenApiResponse(description="No such host, or no desired state yet")},
    )
    def get(self, request, pk):
        host = host_visible_get(request, pk)
        state = self.get_queryset().filter(host=host).order_by("-version").first()
        if state is None:
            raise exceptions.NotFound(f"No desired state was ever set for {host.name}.")
        return Response(state.spec)

    @extend_schema(
        operation_id="hosts_desired_state_create",
        request=DesiredStateRequestSerializer,
        responses={201: DesiredStateDocumentSerializer, 503: OpenApiResponse(description="Routers did not confirm the withdrawn routes; nothing changed")},
    )
    def post(self, request, pk):
        host = host_visible_get(request, pk)
        try:
            state = host_desired_state_change(host=host, spec=request.data, actor=request.user)
        except RoutersBehind as exc:
            raise RoutersBehindError(exc.message) from exc
        return Response(state.spec, status=status.HTTP_201_CREATED)


class HostDesiredStateViewSet(TesseraReadOnlyModelViewSet):
    """Every stored version of every host's desired state (read-only; set them through
    /hosts/{id}/desired-state/)."""

    queryset = HostDesiredState.objects.select_related("host")
    serializer_class = HostDesiredStateSerializer
    filterset_class = HostDesiredStateFilterSet
    ordering_fields = ["version", "created"]


class RoutingTableViewSet(TesseraModelViewSet):
    """Routing tables, one active version per application. POST publishes a new version and makes it the
    active one in the same transaction. Agents read every table (their routers serve every application)."""

    queryset = RoutingTable.objects.select_related(
        "application__slo_policy", "application__pipeline_stage__pipeline", "application__ensemble_policy"
    ).prefetch_related("application__variants", "application__ensemble_policy__members__variant")
    serializer_class = RoutingTableSerializer
    filterset_class = RoutingTableFilterSet
    ordering_fields = ["version", "created"]
    http_method_names = ["get", "post", "head", "options"]

    @extend_schema(request=RoutingTablePublishSerializer, responses={201: RoutingTableSerializer})
    def create(self, request, *args, **kwargs):
        publish = RoutingTablePublishSerializer(data=request.data)
        publish.is_valid(raise_exception=True)
        routes = [dict(route) for route in publish.validated_data["routes"]]
        table = routing_table_publish(application=publish.validated_data["application"], routes=routes, actor=request.user)
        return Response(self.get_serializer(table).data, status=status.HTTP_201_CREATED)


    @extend_schema(request=RepositoryActionSerializer, responses={200: RepositoryActionResultSerializer})
    @action(detail=False, methods=["post"], url_path="repository", permission_classes=[MayLoadModels])
    def repository(self, request):
        """The Open Inference Protocol's model repository extension, as routers relay it: `unload` releases an
        application (its routes withdrawn now, left out of plans), `load` pins it back into planning. Open to
        operators (`registry.change_application`) and to routers whose credential an admin allowed to."""
        body = RepositoryActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        application = Application.objects.filter(name=body.validated_data["model"]).first()
        if application is None:  # Triton's answer to loading a model its repository does not hold: 400, "failed to load"
            raise exceptions.ValidationError(
                f"failed to {body.validated_data['action']} '{body.validated_data['model']}': no application of that name in the registry")
        if body.validated_data["action"] == "unload":
            table = application_release(application=application, actor=request.user)
            changed = table is not None
        else:
            settings = None
            if body.validated_data.get("config") is not None:
                variants = list(application.variants.all())
                try:
                    settings = triton_load_config_parse(
                        body.validated_data["config"], model=application.name,
                        inputs=sorted({t["name"] for v in variants for t in v.inputs or []}),
                        outputs=sorted({t["name"] for v in variants for t in v.outputs or []}))
                except TritonLoadConfigError as exc:
                    raise exceptions.ValidationError({"config": [f"failed to load '{application.name}': {exc}"]}) from None
            changed = application_pin(application=application, actor=request.user, settings=settings)
        application.refresh_from_db(fields=["released", "max_batch_size", "batching_delay_ms"])
        active = RoutingTable.objects.filter(application=application, active=True).values_list("version", flat=True).first()
        return Response({"model": application.name, "action": body.validated_data["action"], "released": application.released,
                         "changed": changed, "routing_table_version": active, "max_batch_size": application.max_batch_size,
                         "batching_delay_ms": application.batching_delay_ms})


class RuntimeViewSet(TesseraReadOnlyModelViewSet):
    """Runtimes as their agents last reported them (replaced by every report)."""

    queryset = Runtime.objects.select_related("host", "application", "variant")
    serializer_class = RuntimeSerializer
    filterset_class = RuntimeFilterSet
    ordering_fields = ["key", "last_updated"]


class HostOperationViewSet(TesseraReadOnlyModelViewSet):
    """What the agents did (MIG changes, runtime starts and stops), appended from their reports."""

    queryset = HostOperation.objects.select_related("host")
    serializer_class = HostOperationSerializer
    filterset_class = HostOperationFilterSet
    ordering_fields = ["at", "id"]
