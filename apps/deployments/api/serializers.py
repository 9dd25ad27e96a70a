from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import ChoiceTextField, TesseraModelSerializer
from apps.policies.choices import DropRuleChoices, EnsembleModeChoices
from apps.registry.models import Application
from engine.dataplane.batching import BATCHING_POLICIES
from engine.plans.problem import MAX_QUERY_SIZE
from engine.dataplane.tensors import TensorSpecError, oip_tensor_metadata
from engine.geometry.names import RUNTIME_KEY_MAX_LENGTH, instance_id_parse, runtime_key_parse

from ..choices import ROUTE_STATE_UNKNOWN, OperationOutcomeChoices, RuntimeStateChoices
from ..models import HostDesiredState, HostOperation, RoutingTable, Runtime
from ..services import DEFAULT_DROP_RULE

# --------------------------------------------------------------------------- the desired-state document
# These describe the document for the OpenAPI schema; host_desired_state_set validates it in full.


class DesiredGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0)
    mig_enabled = serializers.BooleanField()
    layout = serializers.ListField(child=serializers.CharField(), help_text='MIG placements, e.g. ["4g.20gb@0", "3g.20gb@4"]')


class BatchingSerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=list(BATCHING_POLICIES))
    params = serializers.DictField(required=False, help_text="The policy's parameters ({} by default)")
    drop_rule = serializers.ChoiceField(
        choices=DropRuleChoices.choices, required=False, help_text="Default: the SLO policy's, else deadline"
    )
    queue_order = serializers.ChoiceField(choices=["fifo", "edf"], required=False, help_text="Default: fifo")
    slo_ms = serializers.FloatField(required=False, help_text="Default: the SLO policy's p99 latency target")


class ProfilePointSerializer(serializers.Serializer):
    batch = serializers.IntegerField(min_value=1)
    latency_ms = serializers.FloatField(help_text="Latency of the whole batch (the profile's p50)")


class DesiredRuntimeRequestSerializer(serializers.Serializer):
    key = serializers.CharField(help_text='"gpu0/3g.20gb@4", "gpu1" or "cpu0/0"')
    device = serializers.CharField(required=False, help_text="The key's device; derived from the key if omitted")
    placement = serializers.CharField(required=False, allow_null=True, help_text="The MIG placement; null otherwise")
    cpu_threads = serializers.IntegerField(required=False, allow_null=True, help_text="CPU runtimes only")
    application = serializers.CharField(help_text="The application's name")
    variant = serializers.IntegerField(help_text="The model variant's id")
    max_batch = serializers.IntegerField(min_value=1)
    batching = BatchingSerializer()
    profile = ProfilePointSerializer(
        many=True, required=False, help_text="Default: the variant's profile on this slice from the registry"
    )


class DesiredStateRequestSerializer(serializers.Serializer):
    gpus = DesiredGpuSerializer(many=True, required=False, help_text="GPUs whose geometry this version sets")
    runtimes = DesiredRuntimeRequestSerializer(many=True, required=False)


class DesiredArtifactSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sha256 = serializers.CharField()
    size_bytes = serializers.IntegerField()
    download = serializers.CharField(help_text="API path of the file")


class DesiredVariantSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    artifact = DesiredArtifactSerializer(allow_null=True)


class DesiredRuntimeSerializer(serializers.Serializer):
    key = serializers.CharField()
    device = serializers.CharField()
    placement = serializers.CharField(allow_null=True)
    cpu_threads = serializers.IntegerField(allow_null=True)
    application = serializers.CharField()
    variant = DesiredVariantSerializer()
    max_batch = serializers.IntegerField()
    batching = BatchingSerializer()
    profile = ProfilePointSerializer(many=True)


class DesiredStateDocumentSerializer(serializers.Serializer):
    host = serializers.CharField()
    version = serializers.IntegerField()
    gpus = DesiredGpuSerializer(many=True)
    runtimes = DesiredRuntimeSerializer(many=True)


@extend_schema_field(DesiredStateDocumentSerializer)
class DesiredStateDocumentField(serializers.JSONField):
    """The stored document, returned as stored."""


class HostDesiredStateSerializer(TesseraModelSerializer):
    host_name = serializers.CharField(source="host.name", read_only=True)
    spec = DesiredStateDocumentField(read_only=True)

    class Meta:
        model = HostDesiredState
        fields = ["id", "display", "host", "host_name", "version", "spec", "created_by", "created"]
        read_only_fields = fields


# --------------------------------------------------------------------------- routing tables


class RouteSerializer(serializers.Serializer):
    instance = serializers.CharField(help_text='"<host>/<runtime key>"')
    variant = serializers.CharField(allow_null=True, help_text="The variant's name")
    weight = serializers.FloatField()
    batch = serializers.IntegerField(allow_null=True, help_text="The instance's planned batch size; null where the table does not say")
    endpoint = serializers.CharField(allow_null=True, help_text="As the instance's agent last reported it")
    state = ChoiceTextField(choices=[*RuntimeStateChoices.values, ROUTE_STATE_UNKNOWN], help_text="The runtime's state as reported;")


class RoutingTableSerializer(serializers.ModelSerializer):
    """A routing table as routers read it: variants by name, endpoints and states from the runtimes the
    agents last reported (null and "unknown" for an instance not reported). A runtime that does not serve
    the route's variant (its slot serves another model now, or not yet this one) gives the route no
    endpoint, and "unknown" where it reports "ready": routers never send a query to another model."""

    application = serializers.CharField(source="application.name", read_only=True)
    slo_ms = serializers.SerializerMethodField()
    drop_rule = serializers.SerializerMethodField()
    routes = serializers.SerializerMethodField()
    pipeline = serializers.SerializerMethodField(
        help_text="When the application is a pipeline stage: the pipeline's name, stages and paths, so that the router runs it"
    )

    model = serializers.SerializerMethodField(
        help_text="The application as an Open Inference Protocol model: its inputs and outputs (datatype, shape; -1 where a "
        "dimension varies) and each variant's, by variant name (a variant is a model version)"
    )
    ensemble = serializers.SerializerMethodField(
        help_text="The application's ensemble policy when its queries are answered by random ensembles (mode random or learned): "
        "{mode, members: [{variant, variant_id, probability, weight}], min_size, max_size, vote, scheduler (learned only)}; "
        "null: one variant per query, by the routes' weights"
    )

    class Meta:
        model = RoutingTable
        fields = ["id", "application", "version", "active", "slo_ms", "drop_rule", "routes", "pipeline", "model", "ensemble", "created"]
        read_only_fields = fields

    @staticmethod
    def _slo(obj):
        try:
            return obj.application.slo_policy
        except ObjectDoesNotExist:
            return None

    @staticmethod
    def _pipeline(obj):
        try:
            return obj.application.pipeline_stage.pipeline
        except ObjectDoesNotExist:
            return None

    def get_slo_ms(self, obj) -> float | None:
        """The SLO policy's p99 target; for a pipeline stage without one, the tightest SLO of the paths
        through it (a query sent to the stage alone has no more time than that)."""
        slo = self._slo(obj)
        if slo:
            return slo.latency_p99_ms
        pipeline = self._pipeline(obj)
        through = [q["slo_ms"] for q in (pipeline.paths if pipeline else []) if obj.application.name in q["stages"]]
        return min(through) if through else None

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_pipeline(self, obj) -> dict | None:
        pipeline = self._pipeline(obj)
        return None if pipeline is None else {"name": pipeline.name, "stages": pipeline.stages, "paths": pipeline.paths}

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_ensemble(self, obj) -> dict | None:
        """The policy as the engine writes it (engine.ensembles.policy.ensemble_policy_to_dict), each member
        with its variant's id beside its name; a `single` policy answers as no policy does (null)."""
        try:
            policy = obj.application.ensemble_policy
        except ObjectDoesNotExist:
            return None
        return None if policy.mode == EnsembleModeChoices.SINGLE else policy.engine_dict()

    @extend_schema_field(serializers.JSONField())
    def get_model(self, obj) -> dict:
        """What a router answers to `GET /v2/models/{application}` and `.../versions/{variant}`: the registry's
        tensor specs in the protocol's spelling. The application's inputs are its `input_spec` (what every
        variant accepts); its outputs those every variant has, so a client that names them gets them from
        whichever variant the plan routes it to."""
        versions = {}
        for variant in obj.application.variants.all():
            # "id": the variant's number as a version too: Triton's clients and perf_analyzer read versions as integers.
            versions[variant.name] = {"id": variant.pk, "inputs": _oip_specs(variant.inputs), "outputs": _oip_specs(variant.outputs)}
        inputs = _oip_specs(obj.application.input_spec) or next((v["inputs"] for v in versions.values() if v["inputs"]), [])
        common = None
        for v in versions.values():
            names = {t["name"] for t in v["outputs"]}
            common = names if common is None else common & names
        first = next(iter(versions.values()), {"outputs": []})
        outputs = [t for t in first["outputs"] if common and t["name"] in common]
        # The application's Triton-style batching delay, where its configuration sets one (routers show it).
        return {"platform": "onnxruntime_onnx", "inputs": inputs, "outputs": outputs, "versions": versions,
                "batching_delay_ms": obj.application.batching_delay_ms}

    @extend_schema_field(serializers.ChoiceField(choices=DropRuleChoices.choices))
    def get_drop_rule(self, obj) -> str:
        slo = self._slo(obj)
        return slo.drop_rule if slo else DEFAULT_DROP_RULE

    def _runtimes(self, host_names: set[str]) -> dict[str, dict[str, Runtime]]:
        """Runtimes by host name and key, loaded once per host for the whole response."""
        cache = self.context.setdefault("_runtimes_by_host", {})
        missing = host_names - cache.keys()
        if missing:
            for name in missing:
                cache[name] = {}
            for runtime in Runtime.objects.filter(host__name__in=missing).select_related("host").only(
                "key", "state", "endpoint", "variant_id", "host__name"
            ):
                cache[runtime.host.name][runtime.key] = runtime
        return cache

    @extend_schema_field(RouteSerializer(many=True))
    def get_routes(self, obj) -> list[dict]:
        located = []
        for route in obj.routes:
            try:
                host_name, key = instance_id_parse(route["instance"])
                located.append((route, host_name, key.key))
            except ValueError:
                located.append((route, None, None))
        runtimes = self._runtimes({h for _, h, _ in located if h})
        variants = {v.pk: v.name for v in obj.application.variants.all()}
        result = []
        for route, host_name, key in located:
            runtime = runtimes.get(host_name, {}).get(key) if host_name else None
            serves = runtime is not None and runtime.variant_id == route["variant"]
            state = runtime.state if runtime else ROUTE_STATE_UNKNOWN
            result.append({
                "instance": route["instance"],
                "variant": variants.get(route["variant"]),
                "weight": route["weight"],
                "batch": route.get("batch"),
                "endpoint": (runtime.endpoint or None) if serves else None,
                "state": state if serves or state != RuntimeStateChoices.READY else ROUTE_STATE_UNKNOWN,
            })
        return result


def _oip_specs(specs) -> list[dict]:
    """Registry tensor specs in the protocol's spelling; a spec the protocol cannot spell is left out (the
    registry validates names and shapes, not every type ONNX has)."""
    out = []
    for spec in specs or []:
        try:
            out.extend(oip_tensor_metadata([spec]))
        except (TensorSpecError, KeyError, TypeError):
            continue
    return out


class RepositoryActionSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="The application's name (the protocol's model name)")
    action = serializers.ChoiceField(choices=["load", "unload"], help_text="unload: release it; load: pin it back into planning")
    config = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="load only: the load's `parameters.config`, Triton's model configuration (JSON text or object). Mapped: "
                  "max_batch_size (the plans' batch cap) and dynamic_batching.max_queue_delay_microseconds (its batching delay); "
                  "name, platform, backend, input and output are checked; any other field is refused (400, naming it)")

    def validate(self, attrs):
        if attrs.get("config") is not None and attrs["action"] != "load":
            raise serializers.ValidationError({"config": "a configuration applies to a load only."})
        return attrs


class RepositoryActionResultSerializer(serializers.Serializer):
    model = serializers.CharField()
    action = serializers.CharField()
    released = serializers.BooleanField()
    changed = serializers.BooleanField(help_text="False when it already was as asked")
    routing_table_version = serializers.IntegerField(allow_null=True, help_text="The active table's version now")
    max_batch_size = serializers.IntegerField(allow_null=True, help_text="The application's batch cap now (null: none)")
    batching_delay_ms = serializers.FloatField(allow_null=True, help_text="Its Triton-style batching delay now (null: Tessera's batching)")


class RouteRequestSerializer(serializers.Serializer):
    instance = serializers.CharField(help_text='"<host>/<runtime key>", e.g. "sim-cpu-01/cpu0/0"')
    variant = serializers.IntegerField(help_text="The model variant's id (a variant of the application)")
    weight = serializers.FloatField(min_value=0.0, help_text="Relative share; normalised to sum to 1")
    batch = serializers.IntegerField(min_value=1, max_value=MAX_QUERY_SIZE, required=False,
                                     help_text="The instance's planned batch size (plans give it; routers show it as the model's batching)")


class RoutingTablePublishSerializer(serializers.Serializer):
    application = serializers.PrimaryKeyRelatedField(queryset=Application.objects.all())
    routes = RouteRequestSerializer(many=True, allow_empty=True, help_text="Empty: the application has no capacity")


# --------------------------------------------------------------------------- actual state


class RuntimeSerializer(serializers.ModelSerializer):
    host_name = serializers.CharField(source="host.name", read_only=True)
    instance = serializers.SerializerMethodField(help_text='"<host>/<runtime key>", as routing tables name it')
    application_name = serializers.CharField(source="application.name", read_only=True, allow_null=True, default=None)
    variant_name = serializers.CharField(source="variant.name", read_only=True, allow_null=True, default=None)
    state = ChoiceTextField(choices=RuntimeStateChoices.choices, read_only=True)

    class Meta:
        model = Runtime
        fields = [
            "id", "host", "host_name", "key", "instance", "application", "application_name", "variant", "variant_name",
            "state", "endpoint", "simulated", "error", "last_updated",
        ]
        read_only_fields = fields

    def get_instance(self, obj) -> str:
        return f"{obj.host.name}/{obj.key}"


class HostOperationSerializer(serializers.ModelSerializer):
    host_name = serializers.CharField(source="host.name", read_only=True)

    class Meta:
        model = HostOperation
        fields = ["id", "host", "host_name", "at", "action", "target", "outcome", "detail"]
        read_only_fields = fields


# --------------------------------------------------------------------------- parts of the agent's report


class ReportedRuntimeSerializer(serializers.Serializer):
    key = serializers.CharField(max_length=RUNTIME_KEY_MAX_LENGTH)
    application = serializers.CharField(max_length=100, required=False, allow_blank=True, allow_null=True, default="")
    variant = serializers.IntegerField(required=False, allow_null=True, default=None, help_text="The variant's id")
    state = ChoiceTextField(choices=RuntimeStateChoices.choices)
    endpoint = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    simulated = serializers.BooleanField(default=False)
    error = serializers.CharField(required=False, allow_blank=True, default="")

    def validate_key(self, value):
        try:
            runtime_key_parse(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value

    def validate_application(self, value):
        return value or ""


class ReportedOperationSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    action = serializers.CharField(max_length=50)
    target = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    outcome = serializers.ChoiceField(choices=OperationOutcomeChoices.choices)
    detail = serializers.CharField(required=False, allow_blank=True, default="")
