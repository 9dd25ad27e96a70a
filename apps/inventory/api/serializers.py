from rest_framework import serializers

from apps.core.api.serializers import TesseraModelSerializer
from apps.deployments.api.serializers import ReportedOperationSerializer, ReportedRuntimeSerializer

from ..choices import AcceleratorKindChoices, GpuInstanceStateChoices, HostBackendChoices, MpsPartitionStateChoices
from ..models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential


class HostSerializer(TesseraModelSerializer):
    simulated = serializers.BooleanField(read_only=True, help_text="True when the host's devices are simulated")
    accelerator_count = serializers.IntegerField(source="accelerators.count", read_only=True)
    agent_token_set = serializers.SerializerMethodField()

    class Meta:
        model = Host
        fields = [
            "id", "display", "name", "address", "labels", "status", "backend", "simulated", "last_seen",
            "agent_version", "agent_token_set", "agent_token_prefix", "accelerator_count", "converged_version", "settled_version",
            "catalogue_disagreements", "description", "created", "last_updated",
        ]
        read_only_fields = [
            "last_seen", "agent_version", "agent_token_prefix", "converged_version", "settled_version", "catalogue_disagreements",
            "created", "last_updated",
        ]

    def get_agent_token_set(self, obj) -> bool:
        return bool(obj.agent_token_hash)


class AcceleratorSerializer(TesseraModelSerializer):
    simulated = serializers.BooleanField(source="host.simulated", read_only=True)
    gpu_model = serializers.SerializerMethodField(help_text="MIG catalogue key, when the catalogue knows this GPU")
    mps_partitions = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=100), required=False, max_length=100,
        help_text="The MPS partition sizes (percent of the SMs) allowed on this GPU; empty: the engine's default",
    )
    mps_partitions_allowed = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="mps_partitions, or the engine's default when empty",
    )

    class Meta:
        model = Accelerator
        fields = [
            "id", "display", "host", "index", "kind", "uuid", "model_name", "gpu_model", "memory_mb",
            "mig_capable", "mig_enabled", "mps_enabled", "mps_partitions", "mps_partitions_allowed", "cpu_cores", "simulated",
            "created", "last_updated",
        ]

    def get_gpu_model(self, obj) -> str | None:
        spec = obj.gpu_model
        return spec.name if spec else None


class GpuInstanceSerializer(TesseraModelSerializer):
    placement = serializers.CharField(read_only=True)
    simulated = serializers.BooleanField(source="accelerator.host.simulated", read_only=True)

    class Meta:
        model = GpuInstance
        fields = [
            "id", "display", "accelerator", "profile", "placement_start", "placement_size", "placement", "uuid",
            "state", "simulated", "created", "last_updated",
        ]
        read_only_fields = ["placement_size"]


class MpsPartitionSerializer(TesseraModelSerializer):
    slot = serializers.CharField(read_only=True, help_text='The partition\'s name in plans and runtime keys, e.g. "mps60@0"')
    simulated = serializers.BooleanField(source="accelerator.host.simulated", read_only=True)

    class Meta:
        model = MpsPartition
        fields = ["id", "display", "accelerator", "percent", "index", "slot", "state", "simulated", "created", "last_updated"]

    def validate_accelerator(self, value):
        if self.instance is not None and value.pk != self.instance.accelerator_id:
            raise serializers.ValidationError("A partition cannot move to another GPU: delete it and create one there.")
        return value


class AgentTokenSerializer(serializers.Serializer):
    host = serializers.IntegerField(read_only=True)
    token = serializers.CharField(read_only=True, help_text="The agent's secret. Shown once, in this response only.")


class RouterCredentialSerializer(TesseraModelSerializer):
    """A router credential as listed: never its secret (only its first characters, `token_prefix`)."""

    active = serializers.BooleanField(read_only=True, help_text="Issued and not revoked")

    class Meta:
        model = RouterCredential
        fields = ["id", "display", "name", "description", "token_prefix", "active", "revoked", "may_load_models", "last_used", "created",
                  "last_updated"]
        read_only_fields = ["token_prefix", "revoked", "last_used", "created", "last_updated"]


class RouterCredentialIssueSerializer(serializers.Serializer):
    """What issuing a router credential takes: the router name its reports will carry."""

    name = serializers.RegexField(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$", max_length=100,
                                  error_messages={"invalid": "Use letters, digits, '.', '_' and '-', starting with a letter or digit."})
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    may_load_models = serializers.BooleanField(required=False, allow_null=True, default=None,
                                               help_text="Let the router relay the model repository's load/unload (omitted: as it was; off when new)")


class RouterCredentialUpdateSerializer(serializers.Serializer):
    """What an admin may change of a router credential without issuing a new secret."""

    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    may_load_models = serializers.BooleanField(required=False, help_text="Let the router relay the model repository's load/unload")

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:  # a misspelt permission would otherwise be a 200 that changed nothing
            raise serializers.ValidationError({name: "not a field that can be changed here (description, may_load_models)" for name in unknown})
        return attrs


class RouterCredentialIssuedSerializer(RouterCredentialSerializer):
    token = serializers.CharField(read_only=True, help_text="The router's secret. Shown once, in this response only.")

    class Meta(RouterCredentialSerializer.Meta):
        fields = [*RouterCredentialSerializer.Meta.fields, "token"]


# Placement starts count NVML's placement units (8 on most MIG GPUs, 12 on RTX PRO 6000 Blackwell).
MAX_PLACEMENT_UNIT = 63


class ReportedGpuInstanceSerializer(serializers.Serializer):
    profile = serializers.CharField(max_length=30)
    start = serializers.IntegerField(min_value=0, max_value=MAX_PLACEMENT_UNIT)
    uuid = serializers.CharField(max_length=80, required=False, allow_blank=True, default="")
    state = serializers.ChoiceField(choices=GpuInstanceStateChoices.choices, default=GpuInstanceStateChoices.READY)


class ReportedMpsPartitionSerializer(serializers.Serializer):
    percent = serializers.IntegerField(min_value=1, max_value=100, help_text="Share of the GPU's SMs")
    index = serializers.IntegerField(min_value=0, max_value=99, help_text="Place in the GPU's layout, largest first")
    state = serializers.ChoiceField(choices=MpsPartitionStateChoices.choices, default=MpsPartitionStateChoices.READY)


class ReportedNvmlProfileSerializer(serializers.Serializer):
    """One GPU instance profile as NVML describes it on the GPU (nvmlDeviceGetGpuInstanceProfileInfo and the
    profile's possible placements)."""

    name = serializers.RegexField(r"^[0-9]+g\.[0-9]+gb(?:[+-][A-Za-z][A-Za-z0-9.]*(?:,[A-Za-z][A-Za-z0-9.]*)*)?$", max_length=40)
    profile_id = serializers.IntegerField(min_value=0, max_value=255, allow_null=True)
    memory_slices = serializers.IntegerField(min_value=1, max_value=MAX_PLACEMENT_UNIT + 1)
    compute_slices = serializers.IntegerField(min_value=1, max_value=64)
    memory_mb = serializers.IntegerField(min_value=0)
    starts = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=MAX_PLACEMENT_UNIT), max_length=64)
    max_count = serializers.IntegerField(min_value=1, max_value=64)


class ReportedAcceleratorSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1023)
    kind = serializers.ChoiceField(choices=AcceleratorKindChoices.choices)
    uuid = serializers.CharField(max_length=80, required=False, allow_null=True, default=None)
    model_name = serializers.CharField(max_length=100)
    memory_mb = serializers.IntegerField(min_value=0, default=0)
    mig_capable = serializers.BooleanField(default=False)
    mig_enabled = serializers.BooleanField(default=False)
    cpu_cores = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    instances = ReportedGpuInstanceSerializer(many=True, required=False, default=list)
    mps_enabled = serializers.BooleanField(
        required=False, help_text="The GPU is in MPS mode; left out, the stored value stays (false when MIG is reported on)",
    )
    mps_partitions = ReportedMpsPartitionSerializer(
        many=True, required=False, max_length=100,
        help_text="The GPU's MPS partitions whose processes run (they replace the stored ones); left out, the stored ones "
        "stay unless MPS is off. During a reorganisation the old and the new ones together",
    )
    pci_device_id = serializers.RegexField(
        r"^0x[0-9A-F]{8}$", required=False, allow_blank=True,
        help_text='The board\'s PCI device id, as mig-parted\'s device-filter writes it ("0x20B010DE")',
    )
    nvml_profiles = ReportedNvmlProfileSerializer(
        many=True, required=False, max_length=64,
        help_text="NVML backend: the GPU's instance profiles while MIG is on (stored; a GPU the catalogue lacks is "
        "planned from them)",
    )
    placements = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=MAX_PLACEMENT_UNIT)), required=False,
        help_text="NVML backend: the starts NVML reports for each MIG profile. Accepted, not stored: the agent "
        "states what differs from the catalogue in catalogue_disagreements.",
    )

    def validate_instances(self, value):
        starts = [i["start"] for i in value]
        if len(starts) != len(set(starts)):
            raise serializers.ValidationError("Two instances reported at the same start.")
        return value

    def validate_mps_partitions(self, value):
        # The same index twice is a reorganisation in progress (old and new partitions both run); the same
        # partition twice is not.
        pairs = [(p["percent"], p["index"]) for p in value]
        if len(pairs) != len(set(pairs)):
            raise serializers.ValidationError("The same MPS partition is reported twice.")
        return value


class HostReportSerializer(serializers.Serializer):
    """What an agent reports about its host: the devices it found and the MIG instances or MPS partitions on
    them, and (the
    data plane, all optional: a part left out leaves what is stored alone) the desired-state version it has
    converged to, its runtimes (they replace the stored ones), its operations since its previous report and
    where NVML disagrees with the MIG catalogue."""

    backend = serializers.ChoiceField(choices=HostBackendChoices.choices)
    agent_version = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")
    accelerators = ReportedAcceleratorSerializer(many=True)
    desired_version = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, help_text="The desired-state version the host has converged to"
    )
    settled_version = serializers.IntegerField(
        min_value=1, required=False, allow_null=True,
        help_text="The desired-state version reached but for runtimes that failed to start (listed as failed in `runtimes`)",
    )
    runtimes = ReportedRuntimeSerializer(many=True, required=False, max_length=1024)
    operations = ReportedOperationSerializer(many=True, required=False, max_length=1000)
    catalogue_disagreements = serializers.ListField(
        child=serializers.CharField(max_length=500), required=False, max_length=200
    )

    def validate_runtimes(self, value):
        keys = [r["key"] for r in value]
        if len(keys) != len(set(keys)):
            raise serializers.ValidationError("Two runtimes reported with the same key.")
        return value

    def validate_accelerators(self, value):
        keys = [(a["kind"], a["index"]) for a in value]
        if len(keys) != len(set(keys)):
            raise serializers.ValidationError("Two accelerators reported with the same kind and index.")
        return value
