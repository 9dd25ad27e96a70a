from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from apps.core.api.validation import serializer_compile
from engine.plans.problem import MAX_QUERY_SIZE

from ..models import ApplicationSample, GpuSample, PipelinePathSample, RuntimeResize, RuntimeSample

# How far ahead of the control plane's clock a report's `at` may be (clock skew between hosts).
REPORT_CLOCK_SKEW_S = 300.0

# --------------------------------------------------------------------------- what agents and routers send
# Plain serializers (no model validation): ingest runs about a thousand times a second.


class _Percent(serializers.FloatField):
    def __init__(self, **kwargs):
        super().__init__(min_value=0.0, max_value=100.0, required=False, allow_null=True, default=None, **kwargs)


class _Count(serializers.IntegerField):
    def __init__(self, **kwargs):
        super().__init__(min_value=0, max_value=2**31 - 1, default=0, **kwargs)


class _ReportTime(serializers.DateTimeField):
    """A report's `at`: when the interval ended, on the reporter's clock. Reports sent late (kept through a
    control-plane outage) carry their original time and are stored under it; one older than the telemetry
    retention (it would be pruned at once) or more than `REPORT_CLOCK_SKEW_S` ahead is refused."""

    def __init__(self, **kwargs):
        super().__init__(help_text="End of the interval (the reporter's time, also for a report sent late)", **kwargs)

    def to_internal_value(self, value):
        at = None
        if isinstance(value, str) and len(value) >= 20 and value[10:11] == "T":
            # What agents send (an aware ISO 8601 time): parsed by the standard library, a tenth of DRF's
            # path, which takes every other form (naive times get the default time zone there).
            try:
                at = datetime.fromisoformat(value)
            except ValueError:
                at = None
            if at is not None:
                at = at.astimezone(dt_timezone.utc) if at.tzinfo is not None else None
        if at is None:
            at = super().to_internal_value(value)
        now = timezone.now()
        if at > now + timedelta(seconds=REPORT_CLOCK_SKEW_S):
            raise serializers.ValidationError(f"is more than {REPORT_CLOCK_SKEW_S:g} s in the future; check the reporter's clock.")
        if at < now - timedelta(days=settings.TESSERA_TELEMETRY_RETENTION_DAYS):
            raise serializers.ValidationError(f"is older than the telemetry retention ({settings.TESSERA_TELEMETRY_RETENTION_DAYS:g} days).")
        return at


class _DroppedReports(serializers.IntegerField):
    def __init__(self, **kwargs):
        super().__init__(min_value=0, max_value=2**31 - 1, default=0, help_text=(
            "Reports the sender dropped since its previous report reached the control plane (its outage buffer "
            "overflowed); added to its dropped_reports count"), **kwargs)


class _LatencyMs(serializers.FloatField):
    def __init__(self, **kwargs):
        super().__init__(min_value=0.0, required=False, allow_null=True, default=None, **kwargs)


class MetricsGpuInstanceSerializer(serializers.Serializer):
    placement = serializers.CharField(max_length=40, help_text='MIG placement, e.g. "3g.20gb@4"')
    utilization_pct = _Percent()
    gr_engine_active_pct = _Percent()
    memory_used_mb = _Count()


class MetricsGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1023)
    uuid = serializers.CharField(max_length=80, required=False, allow_blank=True, allow_null=True)
    utilization_pct = _Percent()
    gr_engine_active_pct = _Percent()
    memory_used_mb = _Count()
    power_w = serializers.FloatField(min_value=0.0, required=False, allow_null=True, default=None)
    simulated = serializers.BooleanField(default=False)
    instances = MetricsGpuInstanceSerializer(many=True, required=False, default=list, max_length=64)


# A CPU runtime's CPUs: Linux CPU ids (0..CPU_ID_MAX), at most CPUS_MAX of them; the resizes an agent keeps
# for one runtime between two reports (workers/agent/vertical.py, RESIZES_KEPT).
CPU_ID_MAX = 65535
CPUS_MAX = 4096
RESIZES_MAX = 256


def _cpu_ids(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=CPU_ID_MAX), max_length=CPUS_MAX,
                                 required=False, allow_null=True, default=None, **kwargs)


class MetricsResizeSerializer(serializers.Serializer):
    """One in-place resize of a CPU runtime since the previous report (workers/agent/vertical.py): when, who
    asked and why, the sizes before and after, and whether the runtime took them."""

    at = serializers.DateTimeField(help_text="When it was resized (the agent's clock)")
    by = serializers.CharField(max_length=20, help_text='Who asked: "vertical" (the agent\'s fast loop) or "desired" (a desired-state change)')
    outcome = serializers.CharField(max_length=20, help_text='"ok", or "failed" (the runtime kept the sizes it had)')
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="",
                                   help_text="Why, where the agent says (the fast loop's decision)")
    from_cores = serializers.IntegerField(min_value=1, max_value=4096, required=False, allow_null=True, default=None)
    from_max_batch = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False, allow_null=True, default=None)
    cores = serializers.IntegerField(min_value=1, max_value=4096, help_text="The cores it was asked to run on")
    max_batch = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False, allow_null=True, default=None)
    cpus = _cpu_ids(help_text="The CPUs it runs on after the resize (null: not pinned)")
    resize_ms = serializers.FloatField(min_value=0.0, required=False, allow_null=True, default=None,
                                       help_text="From the resize frame to the swap (null: it did not answer)")
    prepared = serializers.BooleanField(required=False, allow_null=True, default=None,
                                        help_text="Whether a session for those cores was ready (a warm resize)")


class MetricsRuntimeSerializer(serializers.Serializer):
    key = serializers.CharField(max_length=100)
    application = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    variant = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="The variant's name")
    arrivals = _Count()
    served = _Count()
    late = _Count()
    dropped = _Count()
    queue_length = _Count()
    batches = _Count()
    batch_size_mean = serializers.FloatField(min_value=0.0, default=0.0, allow_null=True, help_text="null when no batch ran")
    latency_p50_ms = _LatencyMs()
    latency_p99_ms = _LatencyMs()
    cores = serializers.IntegerField(min_value=1, max_value=4096, required=False, allow_null=True, default=None,
                                     help_text="A CPU runtime's cores now (they change in place under vertical scaling)")
    max_batch = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False, allow_null=True, default=None,
                                         help_text="Its batch cap now")
    cpus = _cpu_ids(help_text="A CPU runtime's CPU ids now (null: not pinned, or not a CPU runtime)")
    resizes = MetricsResizeSerializer(many=True, required=False, default=list, max_length=RESIZES_MAX,
                                      help_text="A CPU runtime's resizes since the previous report")


class MetricsReportSerializer(serializers.Serializer):
    """An agent's metrics for one interval (also its heartbeat)."""

    at = _ReportTime()
    interval_s = serializers.FloatField(min_value=0.001, max_value=3600.0, default=1.0)
    dropped_reports = _DroppedReports()
    gpus = MetricsGpuSerializer(many=True, required=False, default=list, max_length=256)
    runtimes = MetricsRuntimeSerializer(many=True, required=False, default=list, max_length=1024)


class MetricsIngestedSerializer(serializers.Serializer):
    runtime_samples = serializers.IntegerField()
    gpu_samples = serializers.IntegerField()


class _RouterCountsSerializer(serializers.Serializer):
    """What a router counts over an interval, for an application or for a pipeline path."""

    arrivals = _Count()
    served = _Count()
    late = _Count()
    dropped = _Count()
    no_route = _Count()
    latency_p50_ms = _LatencyMs()
    latency_p99_ms = _LatencyMs()


# Query and ensemble sizes a router reports: whole numbers 1..MAX_QUERY_SIZE (engine.plans.problem), at most
# that many distinct ones per interval; the same bound on the variants an ensemble's counts name.
REPORT_SIZES_MAX = MAX_QUERY_SIZE
# Schedulers one application's ensembles may be counted under in one report (a policy changes rarely; a
# few changes within a second are still told apart).
ENSEMBLE_SCHEDULERS_MAX = 16


def _size_key(key: str) -> str:
    if not (key.isascii() and key.isdigit()) or not 1 <= int(key) <= REPORT_SIZES_MAX:
        raise ValueError(f"a size is a whole number 1..{REPORT_SIZES_MAX}.")
    return str(int(key))


def _variant_key(key: str) -> str:
    if not 1 <= len(key) <= 100 or not key.isprintable():  # no NUL, no lone surrogate: PostgreSQL's JSON takes neither
        raise ValueError("a variant name is 1..100 printable characters.")
    return key


class _Counts(serializers.DictField):
    """{key: count} with at most REPORT_SIZES_MAX keys and counts whole numbers >= 0; `key_check` turns a
    key into its stored form or raises ValueError with the reason (`_size_key`: "<size>", sizes whole
    numbers 1..REPORT_SIZES_MAX in decimal; `_variant_key`: a variant's name)."""

    def __init__(self, *, key_help: str, key_check, **kwargs):
        kwargs.setdefault("help_text", f"{{{key_help}: count}}, at most {REPORT_SIZES_MAX} keys, counts whole numbers >= 0")
        super().__init__(child=serializers.IntegerField(min_value=0, max_value=2**31 - 1), **kwargs)
        self.key_check = key_check

    def to_internal_value(self, data):
        if isinstance(data, dict) and len(data) > REPORT_SIZES_MAX:
            raise serializers.ValidationError(f"at most {REPORT_SIZES_MAX} keys, got {len(data)}.")
        counts = super().to_internal_value(data)
        out: dict[str, int] = {}
        for key, count in counts.items():
            try:
                stored = self.key_check(key)
            except ValueError as exc:
                raise serializers.ValidationError(f"{key[:40]!r}: {exc}") from None
            if stored in out:
                raise serializers.ValidationError(f"{key[:40]!r}: given twice (as {stored!r}).")
            out[stored] = count
        return out


def _size_counts(**kwargs) -> _Counts:
    return _Counts(key_help=f"size 1..{REPORT_SIZES_MAX}", key_check=_size_key, **kwargs)


def _variant_counts(**kwargs) -> _Counts:
    return _Counts(key_help="variant name", key_check=_variant_key, **kwargs)


class RouterEnsembleReportSerializer(serializers.Serializer):
    """An application's random ensembles over the interval (Garrison's frequency table): queries answered by
    an ensemble, each member's draws (`chosen`) and votes counted in the answer (`voted`: it answered in
    time), the ensemble sizes drawn, and the scheduler that picked them."""

    queries = _Count(help_text="Queries answered by an ensemble")
    chosen = _variant_counts(required=False, default=dict)
    voted = _variant_counts(required=False, default=dict)
    sizes = _size_counts(required=False, default=dict)
    scheduler = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                      help_text='Who picked the members: "random", or the learned policy\'s name')


class RouterApplicationReportSerializer(_RouterCountsSerializer):
    application = serializers.CharField(max_length=100)
    routing_version = serializers.IntegerField(min_value=0, required=False, allow_null=True, default=None)
    query_sizes = _size_counts(required=False, allow_null=True, default=None,
                              help_text=f"Rows per request over the interval: {{size: requests}}, sizes 1..{REPORT_SIZES_MAX} (D[b])")
    ensembles = RouterEnsembleReportSerializer(
        many=True, required=False, default=list, max_length=ENSEMBLE_SCHEDULERS_MAX,
        help_text="Its random ensembles over the interval, one block per scheduler that drew them (a policy changed within the "
                  "interval gives two); empty without an ensemble policy")
    ensemble = RouterEnsembleReportSerializer(required=False, allow_null=True, default=None,
                                              help_text="Deprecated (routers before per-scheduler blocks): one block, as in `ensembles`")

    def validate_ensembles(self, blocks: list[dict]) -> list[dict]:
        names = [block.get("scheduler", "") for block in blocks]
        if len(set(names)) != len(names):
            raise serializers.ValidationError("one block per scheduler: a scheduler is named twice.")
        return blocks


class RouterPathReportSerializer(_RouterCountsSerializer):
    pipeline = serializers.CharField(max_length=100)
    path = serializers.CharField(max_length=100)
    failed = _Count()


class RouterReportSerializer(serializers.Serializer):
    """A router's per-application counts for one interval, and per pipeline path its end-to-end counts."""

    router = serializers.CharField(max_length=100, help_text="The router's name: its credential's")
    at = _ReportTime()
    interval_s = serializers.FloatField(min_value=0.001, max_value=3600.0, default=1.0)
    dropped_reports = _DroppedReports()
    applications = RouterApplicationReportSerializer(many=True, max_length=1024)
    pipelines = RouterPathReportSerializer(many=True, max_length=1024, required=False, default=list)


class RouterReportIngestedSerializer(serializers.Serializer):
    application_samples = serializers.IntegerField()
    pipeline_path_samples = serializers.IntegerField()


def _fields_build(serializer: serializers.BaseSerializer) -> None:
    """Build a serializer's fields, and its nested serializers' fields, now."""
    if isinstance(serializer, serializers.ListSerializer):
        _fields_build(serializer.child)
    elif isinstance(serializer, serializers.Serializer):
        for field in serializer.fields.values():
            _fields_build(field)


# One instance of each report serializer per process, its fields built once: DRF builds a serializer's
# fields (a deep copy of the declared ones, validators and all) for every instance, which was the largest
# part of validating a report. Validation reads the fields and changes nothing on the serializer, so
# threads share these.
_REPORT_VALIDATORS = {cls: cls() for cls in (MetricsReportSerializer, RouterReportSerializer)}
for _prototype in _REPORT_VALIDATORS.values():
    _fields_build(_prototype)
_REPORT_FAST = {cls: serializer_compile(prototype) for cls, prototype in _REPORT_VALIDATORS.items()}


def report_fast_validate(serializer_class: type[serializers.Serializer], data) -> dict | None:
    """The validated report when the compiled fast path can vouch for it (a well-formed report), else None:
    then `report_validate` (DRF) decides."""
    return _REPORT_FAST[serializer_class](data)


def report_validate(serializer_class: type[serializers.Serializer], data) -> dict:
    """`serializer_class(data=data)`'s validated data, or its ValidationError: the same values and the same
    errors. A well-formed report takes the compiled fast path (apps/core/api/validation.py, about 5x
    faster than DRF's machinery); anything else is validated by the serializer, once by the shared
    instance and, when that fails, again by a fresh one, so that the error is exactly what
    `is_valid(raise_exception=True)` raises."""
    validated = report_fast_validate(serializer_class, data)
    if validated is not None:
        return validated
    try:
        return _REPORT_VALIDATORS[serializer_class].run_validation(data)
    except serializers.ValidationError:
        pass
    report = serializer_class(data=data)
    report.is_valid(raise_exception=True)
    return report.validated_data


# --------------------------------------------------------------------------- what the API lists


class RuntimeSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = RuntimeSample
        fields = [
            "id", "host", "runtime_key", "application", "application_name", "variant_name", "at", "interval_s",
            "arrivals", "served", "late", "dropped", "queue_length", "batches", "batch_size_mean",
            "latency_p50_ms", "latency_p99_ms", "cores", "batch_cap", "cpus",
        ]
        read_only_fields = fields


class RuntimeResizeSerializer(serializers.ModelSerializer):
    class Meta:
        model = RuntimeResize
        fields = [
            "id", "host", "runtime_key", "application", "application_name", "variant_name", "at", "reported_at", "by", "outcome",
            "reason", "from_cores", "from_batch_cap", "cores", "batch_cap", "cpus", "resize_ms", "prepared",
        ]
        read_only_fields = fields


class GpuSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuSample
        fields = [
            "id", "host", "accelerator_index", "placement", "at", "utilization_pct", "gr_engine_active_pct",
            "memory_used_mb", "power_w", "simulated",
        ]
        read_only_fields = fields


class PipelinePathSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = PipelinePathSample
        fields = [
            "id", "router", "pipeline", "pipeline_name", "path", "at", "interval_s", "arrivals", "served", "late", "dropped", "failed",
            "no_route", "latency_p50_ms", "latency_p99_ms",
        ]
        read_only_fields = fields


class ApplicationSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApplicationSample
        fields = [
            "id", "host", "router", "application", "application_name", "routing_version", "at", "interval_s",
            "arrivals", "served", "late", "dropped", "no_route", "latency_p50_ms", "latency_p99_ms", "query_sizes", "ensembles",
        ]
        read_only_fields = fields
