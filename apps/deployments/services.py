"""Deployment services: a host's desired state (validated against its inventory, then filled in for the
agent), routing tables (published atomically, several applications at once if need be), the ordering of a
change of what a slot serves (`routes_withdraw`, `host_desired_state_change`), and the data-plane half of
an agent's report (its runtimes and operations).

The documents are those of docs/dataplane.md. Every service is all or nothing: bad input raises
ValidationError with a message naming the offending item, and nothing is stored.

How a slot change is ordered (never a query answered by the wrong model): before a desired state that
changes what a routed slot serves (another application or variant, or nothing) is written, the routes to
that slot are withdrawn from the active routing tables (`routes_withdraw`), and the write waits until every
live router reports the new table versions (`routers_behind`); only then is the slot's desired state
written, and routes to it are published again once it serves the routed variant (a rollout's switch, or
an operator's table; a table read shows a route's endpoint only while its runtime reports that variant).
The change is announced before the withdrawal (`SlotChange`), and a table may not add a route to a slot
for a variant it is leaving, neither while the change stands nor after it (`_routes_slots_check`)."""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Mapping

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, Host, mps_partitions_problem
from apps.inventory.services import host_actual_state_apply
from apps.policies.choices import DropRuleChoices
from apps.registry.choices import CPU_DEVICE_TYPE, FULL_SLICE
from apps.registry.models import Application, ModelVariant, Profile
from apps.telemetry.models import ApplicationSample
from engine.dataplane.batching import BATCHING_POLICIES, DROP_RULES, QUEUE_ORDERS, batching_policy_make
from engine.dataplane.routing import RoutingError
from engine.dataplane.routing import RoutingTable as EngineRoutingTable
from engine.geometry.catalogue import GpuModelSpec, gpu_model_canonical
from engine.geometry.layout import Placement, layout_parse, mig_layout_validate, placement_parse
from engine.geometry.names import RuntimeKey, instance_id_parse, mps_placement_parse, runtime_key_parse
from engine.dataplane.triton import TritonLoadSettings
from engine.plans.problem import MAX_QUERY_SIZE
from engine.sharing.partitions import mps_slice_name

from .models import HostDesiredState, HostOperation, RoutingTable, Runtime, SlotChange

ARTIFACT_DOWNLOAD_PATH = "/api/v1/artifacts/{id}/download/"
DEFAULT_QUEUE_ORDER = "fifo"
DEFAULT_DROP_RULE = DropRuleChoices.DEADLINE.value

SPEC_KEYS = frozenset({"host", "version", "gpus", "runtimes"})  # host and version are the server's, ignored
GPU_KEYS = frozenset({"index", "mig_enabled", "layout", "mps_enabled", "mps_layout"})
# The largest max_batch a desired state may ask for: the largest batch size a profile can hold (a
# PositiveIntegerField); a plan never batches beyond its profiles.
MAX_BATCH_LIMIT = 2**31 - 1
RUNTIME_KEYS = frozenset({
    "key", "device", "placement", "cpu_threads", "application", "variant", "max_batch", "batching", "profile",
    "mps_percent", "duty_cycle_ms", "turn_ms",  # models in an MPS partition only
    "vertical",  # CPU runtimes the agent resizes in place (solvers sponge and biscale)
})
VERTICAL_KEYS = frozenset({"policy", "model", "min_cores", "max_cores", "max_batch", "reserve_ms"})
VERTICAL_MODEL_KEYS = ("gamma1", "eps1", "delta1", "eta1")
VERTICAL_POLICIES = ("sponge", "biscale")
BATCHING_KEYS = frozenset({"policy", "params", "drop_rule", "queue_order", "slo_ms"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _user_or_none(actor: Any):
    """Only a real user is recorded as `created_by` (agents and the system are not users)."""
    return actor if getattr(actor, "pk", None) is not None and getattr(actor, "is_authenticated", False) else None


class _Errors:
    """Collects messages per field so one response names every problem, then raises them together."""

    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = defaultdict(list)

    def add(self, field: str, message: str) -> None:
        self.by_field[field].append(message)

    def __bool__(self) -> bool:
        return bool(self.by_field)

    def raise_if_any(self) -> None:
        if self.by_field:
            raise ValidationError(dict(self.by_field))


# --------------------------------------------------------------------------- desired state


@dataclass
class _GpuGeometry:
    accelerator: Accelerator
    mig_enabled: bool
    layout: tuple[str, ...]  # canonical "profile@start", sorted by start
    mps_enabled: bool = False
    mps_layout: tuple[str, ...] = ()  # "mps60@0", ..., by index (largest first)

    def document(self) -> dict:
        """The GPU's entry in a desired state (the MPS keys only on an MPS GPU, so MIG documents are unchanged)."""
        entry: dict[str, Any] = {"index": self.accelerator.index, "mig_enabled": self.mig_enabled, "layout": list(self.layout)}
        if self.mps_enabled:
            entry.update({"mps_enabled": True, "mps_layout": list(self.mps_layout)})
        return entry


def _gpu_spec(accelerator: Accelerator) -> GpuModelSpec | None:
    # The catalogue's model, else the one described from the NVML table its agent reported.
    return accelerator.gpu_model_planned


def _canonical_placement(spec: GpuModelSpec, placement: Placement) -> str:
    profile = spec.profile_find(placement.profile)
    return str(Placement(profile.name if profile else placement.profile, placement.start))


def _mps_layout_validate(accelerator: Accelerator, raw: list[str]) -> tuple[tuple[str, ...] | None, str | None]:
    """An MPS layout ["mps60@0", "mps40@1"] checked against what the GPU allows (sizes, at most 100 %,
    indices 0..n-1, largest first) -> the placements by index, or the problem."""
    layout: dict[int, int] = {}
    for text in raw:
        try:
            percent, index = mps_placement_parse(text)
        except ValueError as exc:
            return None, str(exc)
        if index in layout:
            return None, f"partition {index} is listed twice."
        layout[index] = percent
    problem = mps_partitions_problem(layout, accelerator.mps_partitions_allowed)
    if problem:
        return None, problem
    return tuple(f"mps{layout[i]}@{i}" for i in sorted(layout)), None


def _gpus_validate(gpus: dict[int, Accelerator], raw: Any, errors: _Errors) -> tuple[list[dict], dict[int, _GpuGeometry]]:
    """The GPUs this version sets, checked and canonicalised, and every GPU's geometry as it will be (a GPU
    not listed keeps its current geometry)."""
    geometry = {
        index: _GpuGeometry(
            accelerator,
            accelerator.mig_enabled,
            tuple(f"{gi.profile}@{gi.placement_start}" for gi in sorted(accelerator.gpu_instances.all(), key=lambda g: g.placement_start)),
            accelerator.mps_enabled,
            tuple(p.slot for p in sorted(accelerator.mps_partitions_set.all(), key=lambda p: p.index)),
        )
        for index, accelerator in gpus.items()
    }
    if raw is None:
        return [], geometry
    if not isinstance(raw, list):
        errors.add("gpus", "Expected a list of {index, mig_enabled, layout}.")
        return [], geometry
    known = ", ".join(f"gpu{i}" for i in sorted(gpus)) or "none"
    listed: list[dict] = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            errors.add("gpus", f"gpus[{i}]: expected an object {{index, mig_enabled, layout}}.")
            continue
        unknown = sorted(set(item) - GPU_KEYS)
        index = item.get("index")
        if not _is_int(index) or index < 0:
            errors.add("gpus", f"gpus[{i}]: 'index' must be a GPU index (an integer >= 0).")
            continue
        where = f"gpus[{i}] (gpu{index})"
        if unknown:
            errors.add("gpus", f"{where}: unknown keys {', '.join(unknown)}.")
            continue
        if index in seen:
            errors.add("gpus", f"{where}: listed twice.")
            continue
        seen.add(index)
        accelerator = gpus.get(index)
        if accelerator is None:
            errors.add("gpus", f"{where}: the host has no such GPU (its GPUs: {known}).")
            continue
        mig_enabled = item.get("mig_enabled")
        layout = item.get("layout", [])
        if not isinstance(mig_enabled, bool):
            errors.add("gpus", f"{where}: 'mig_enabled' must be true or false.")
            continue
        if not isinstance(layout, list) or not all(isinstance(p, str) for p in layout):
            errors.add("gpus", f"{where}: 'layout' must be a list of placements such as '3g.20gb@4'.")
            continue
        mps_enabled = item.get("mps_enabled", False)
        mps_layout = item.get("mps_layout", [])
        if not isinstance(mps_enabled, bool):
            errors.add("gpus", f"{where}: 'mps_enabled' must be true or false.")
            continue
        if not isinstance(mps_layout, list) or not all(isinstance(p, str) for p in mps_layout):
            errors.add("gpus", f"{where}: 'mps_layout' must be a list of MPS partitions such as 'mps60@0'.")
            continue
        mps_canonical: tuple[str, ...] = ()
        if mps_enabled:
            if mig_enabled:
                errors.add("gpus", f"{where}: MIG and MPS cannot both be enabled on a GPU; set one of mig_enabled and mps_enabled false.")
                continue
            checked, problem = _mps_layout_validate(accelerator, mps_layout)
            if problem:
                errors.add("gpus", f"{where}: {problem}" if problem.startswith("invalid") else f"{where}: invalid MPS layout: {problem}")
                continue
            mps_canonical = checked
        elif mps_layout:
            errors.add("gpus", f"{where}: an MPS layout needs mps_enabled true.")
            continue
        canonical: tuple[str, ...] = ()
        if mig_enabled:
            spec = _gpu_spec(accelerator)
            if not accelerator.mig_capable or spec is None:
                errors.add("gpus", f"{where}: {accelerator.model_name} is not MIG capable; set mig_enabled false.")
                continue
            try:
                placements = layout_parse(layout)
            except ValueError as exc:
                errors.add("gpus", f"{where}: {exc}")
                continue
            verdict = mig_layout_validate(spec, placements)
            if not verdict.valid:
                errors.add("gpus", f"{where}: invalid MIG layout for {spec.name}: {verdict.reason}")
                continue
            canonical = tuple(_canonical_placement(spec, p) for p in placements)
        elif layout:
            errors.add("gpus", f"{where}: a MIG layout needs mig_enabled true.")
            continue
        geometry[index] = _GpuGeometry(accelerator, mig_enabled, canonical, mps_enabled, mps_canonical)
        listed.append(geometry[index].document())
    listed.sort(key=lambda g: g["index"])
    return listed, geometry


def _artifact_document(variant: ModelVariant) -> dict | None:
    artifact = variant.artifact
    if artifact is None:
        return None
    return {
        "id": artifact.pk,
        "sha256": artifact.sha256,
        "size_bytes": artifact.size_bytes,
        "download": ARTIFACT_DOWNLOAD_PATH.format(id=artifact.pk),
    }


def _gpu_device_types(accelerator: Accelerator) -> list[str]:
    """The spellings a GPU's profiles may be stored under: the catalogue name (what Profile normalises to),
    else the NVML name with and without its vendor prefix."""
    names = [gpu_model_canonical(accelerator.model_name) or ""]
    names += [accelerator.model_name, accelerator.model_name.removeprefix("NVIDIA ").strip()]
    return list(dict.fromkeys(n for n in names if n))


def _profile_points(rows: Iterable[Profile]) -> list[dict]:
    # latency_ms is the p50 batch latency: the figure the planner's problems use as a profile's latency.
    return [{"batch": p.batch_size, "latency_ms": p.latency_p50_ms} for p in sorted(rows, key=lambda p: p.batch_size)]


def _profile_lookup(variant: ModelVariant, accelerator: Accelerator, placement: str | None, cpu_threads: int | None,
                    mps_percent: int | None = None) -> tuple[list[dict], str]:
    """The variant's profile on this slice from the registry, and a description of the slice for errors.
    CPU: the profile at cpu_cores == cpu_threads, else at the nearest profiled core count (the smaller on a
    tie: slower, so the batching policy errs on the safe side). An MPS partition: slice "mps<percent>"."""
    if accelerator.kind == AcceleratorKindChoices.CPU:
        rows = list(Profile.objects.filter(variant=variant, device_type=CPU_DEVICE_TYPE))
        cores = sorted({p.cpu_cores for p in rows if p.cpu_cores})
        if not cores:
            return [], f"cpu ({cpu_threads} cores)"
        best = min(cores, key=lambda c: (abs(c - cpu_threads), c))
        return _profile_points(p for p in rows if p.cpu_cores == best), f"cpu ({cpu_threads} cores)"
    if mps_percent is not None:
        slice_name = mps_slice_name(mps_percent)
    else:
        slice_name = placement_parse(placement).profile if placement else FULL_SLICE
    device_types = _gpu_device_types(accelerator)
    rows = list(Profile.objects.filter(variant=variant, device_type__in=device_types, slice=slice_name))
    for device_type in device_types:  # one spelling only, the catalogue's first
        chosen = [p for p in rows if p.device_type == device_type]
        if chosen:
            return _profile_points(chosen), f"{device_type}/{slice_name}"
    return [], f"{device_types[0]}/{slice_name}"


def _profile_validate(raw: Any) -> tuple[list[dict] | None, str | None]:
    if not isinstance(raw, list) or not raw:
        return None, "'profile' must be a non-empty list of {batch, latency_ms}."
    points, batches = [], set()
    for j, point in enumerate(raw):
        if not isinstance(point, dict) or set(point) - {"batch", "latency_ms"}:
            return None, f"profile[{j}] must be an object {{batch, latency_ms}}."
        batch, latency = point.get("batch"), point.get("latency_ms")
        if not _is_int(batch) or batch < 1:
            return None, f"profile[{j}]: 'batch' must be an integer >= 1."
        if not _is_number(latency) or latency <= 0:
            return None, f"profile[{j}]: 'latency_ms' must be a finite number > 0."
        if batch in batches:
            return None, f"profile[{j}]: batch {batch} is listed twice."
        batches.add(batch)
        points.append({"batch": batch, "latency_ms": float(latency)})
    return sorted(points, key=lambda p: p["batch"]), None


def _vertical_validate(raw: Any, *, cpu_threads: int, max_batch: int, host_cores: int) -> tuple[dict | None, str | None]:
    """A CPU runtime's `vertical` block (engine.plans.problem.VerticalScaling.to_desired): the agent's fast
    loop resizes the runtime in place between min_cores and max_cores (holding its cpu_threads, within the
    host's cores), batch up to max_batch, on the latency model l(b, c) = gamma1*b/c + eps1/c + delta1*b + eta1."""
    if not isinstance(raw, dict):
        return None, "'vertical' must be an object {policy, model, min_cores, max_cores, max_batch, reserve_ms}."
    unknown = sorted(set(raw) - VERTICAL_KEYS)
    if unknown:
        return None, f"vertical: unknown keys {', '.join(unknown)}."
    if raw.get("policy") not in VERTICAL_POLICIES:
        return None, f"vertical: 'policy' must be one of {', '.join(VERTICAL_POLICIES)}."
    model = raw.get("model")
    if not isinstance(model, dict) or set(model) != set(VERTICAL_MODEL_KEYS) or not all(
            _is_number(model[k]) and model[k] >= 0 for k in VERTICAL_MODEL_KEYS) or not any(model[k] for k in VERTICAL_MODEL_KEYS):
        return None, f"vertical: 'model' must hold {', '.join(VERTICAL_MODEL_KEYS)}, finite numbers >= 0, not all zero."
    low, high, batch = raw.get("min_cores"), raw.get("max_cores"), raw.get("max_batch", max_batch)
    if not (_is_int(low) and _is_int(high) and 1 <= low <= cpu_threads <= high <= host_cores):
        return None, (f"vertical: need integers 1 <= min_cores <= cpu_threads ({cpu_threads}) <= max_cores <= the host's {host_cores} cores; "
                      f"got {low!r} and {high!r}.")
    if not _is_int(batch) or not max_batch <= batch <= MAX_BATCH_LIMIT:
        return None, f"vertical: 'max_batch' must be an integer from the runtime's max_batch ({max_batch}) to {MAX_BATCH_LIMIT}."
    reserve = raw.get("reserve_ms", 0.0)
    if not _is_number(reserve) or reserve < 0:
        return None, "vertical: 'reserve_ms' must be a finite number >= 0."
    return {"policy": raw["policy"], "model": {k: float(model[k]) for k in VERTICAL_MODEL_KEYS}, "min_cores": low, "max_cores": high,
            "max_batch": batch, "reserve_ms": float(reserve)}, None


def _batching_validate(raw: Any, application: Application) -> tuple[dict | None, str | None]:
    if not isinstance(raw, dict):
        return None, "'batching' must be an object {policy, params, drop_rule, queue_order, slo_ms}."
    unknown = sorted(set(raw) - BATCHING_KEYS)
    if unknown:
        return None, f"batching: unknown keys {', '.join(unknown)}."
    try:
        slo = application.slo_policy
    except ObjectDoesNotExist:
        slo = None
    policy = raw.get("policy")
    if policy not in BATCHING_POLICIES:
        return None, f"batching.policy {policy!r} is not one of {', '.join(BATCHING_POLICIES)}."
    params = raw.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return None, "batching.params must be an object."
    try:
        batching_policy_make(policy, **params)
    except (ValueError, TypeError) as exc:
        return None, f"batching.params: {exc}"
    drop_rule = raw.get("drop_rule") or (slo.drop_rule if slo else DEFAULT_DROP_RULE)
    if drop_rule not in DROP_RULES:
        return None, f"batching.drop_rule {drop_rule!r} is not one of {', '.join(DROP_RULES)}."
    queue_order = raw.get("queue_order") or DEFAULT_QUEUE_ORDER
    if queue_order not in QUEUE_ORDERS:
        return None, f"batching.queue_order {queue_order!r} is not one of {', '.join(QUEUE_ORDERS)}."
    slo_ms = raw.get("slo_ms")
    if slo_ms is None:
        if slo is None:
            return None, f"batching.slo_ms is needed: {application.name} has no SLO policy to take it from."
        slo_ms = slo.latency_p99_ms
    if not _is_number(slo_ms) or slo_ms <= 0:
        return None, "batching.slo_ms must be a finite number of milliseconds > 0."
    return {"policy": policy, "params": params, "drop_rule": drop_rule, "queue_order": queue_order, "slo_ms": float(slo_ms)}, None


_ID_MAX = 2**63 - 1  # the largest id a (big) auto field holds


def _variant_id(raw: Any) -> int | None:
    """A variant is sent as its id; a filled-in {"id": …, …} (a document read back) is accepted too."""
    if isinstance(raw, dict):
        raw = raw.get("id")
    return raw if _is_int(raw) and 0 < raw <= _ID_MAX else None  # past 64 bits: no row's id, nor a database integer


class _RuntimeChecker:
    def __init__(self, host: Host, geometry: dict[int, _GpuGeometry], cpus: dict[int, Accelerator], raw: list, errors: _Errors):
        self.host, self.geometry, self.cpus, self.errors = host, geometry, cpus, errors
        names = {item.get("application") for item in raw if isinstance(item, dict) and isinstance(item.get("application"), str)}
        ids = {v for item in raw if isinstance(item, dict) and (v := _variant_id(item.get("variant"))) is not None}
        self.applications = {a.name: a for a in Application.objects.filter(name__in=names).select_related("slo_policy")}
        self.variants = {v.pk: v for v in ModelVariant.objects.filter(pk__in=ids).select_related("application", "artifact")}
        self.keys: set[str] = set()
        self.cpu_threads: dict[int, int] = defaultdict(int)
        # MPS partitions: partition key -> (duty_cycle_ms, the first key giving it), and the variants in it.
        self.duty_cycles: dict[str, tuple[float | None, str]] = {}
        self.partition_variants: dict[str, dict[int, str]] = defaultdict(dict)
        self.mps_gpus: set[int] = set()

    def fail(self, where: str, message: str) -> None:
        self.errors.add("runtimes", f"{where}: {message}")

    def _placement(self, where: str, rk: RuntimeKey, item: dict, accelerator: Accelerator) -> tuple[bool, str | None]:
        placement = item.get("placement", rk.placement)
        if rk.placement is None:
            if placement is not None:
                self.fail(where, "'placement' is only for MIG instances (null for a whole GPU and for CPU runtimes).")
                return False, None
            return True, None
        if placement is None or not isinstance(placement, str):
            self.fail(where, f"'placement' must be {rk.placement!r}, the placement in the key.")
            return False, None
        spec = _gpu_spec(accelerator)
        try:
            parsed = placement_parse(placement)
        except ValueError as exc:
            self.fail(where, str(exc))
            return False, None
        canonical = _canonical_placement(spec, parsed) if spec else str(parsed)
        if canonical != rk.placement:
            self.fail(where, f"the key and the placement disagree: for placement {placement!r} write the key as {rk.device}/{canonical}.")
            return False, None
        return True, canonical

    def _mps(self, where: str, rk: RuntimeKey, item: dict, geometry: _GpuGeometry) -> tuple[bool, dict]:
        """A model in an MPS partition (`gpu0/mps60@0/1`): its partition in the GPU's MPS layout as this
        version leaves it, `mps_percent` the key's, `duty_cycle_ms` > 0 or null and the same for every model
        of the partition, `turn_ms` (its planned turn in the round) > 0 or null. Returns (ok, the MPS fields
        of the document)."""
        if rk.slot is None:
            self.fail(where, f"{rk.key} is an MPS partition's own key; a runtime is one model in it: '{rk.key}/<slot>' "
                             "(slot 0, 1, ... its position in the partition).")
            return False, {}
        if item.get("placement") is not None and item["placement"] != rk.placement:
            self.fail(where, f"'placement' must be {rk.placement!r}, the partition in the key (or left out).")
            return False, {}
        if not geometry.mps_enabled:
            self.fail(where, f"MPS is not enabled on {rk.device} in this version; an MPS partition cannot run there.")
            return False, {}
        if rk.placement not in geometry.mps_layout:
            layout = ", ".join(geometry.mps_layout) or "empty"
            self.fail(where, f"{rk.placement} is not in {rk.device}'s MPS layout ({layout}).")
            return False, {}
        percent = item.get("mps_percent", rk.mps_percent)
        if percent is None:
            percent = rk.mps_percent
        if not _is_int(percent) or percent != rk.mps_percent:
            self.fail(where, f"'mps_percent' must be {rk.mps_percent}, the percent in the key; got {percent!r}.")
            return False, {}
        duty = item.get("duty_cycle_ms")
        if duty is not None and (not _is_number(duty) or duty <= 0):
            self.fail(where, f"'duty_cycle_ms' must be a finite number of milliseconds > 0, or null; got {duty!r}.")
            return False, {}
        duty = float(duty) if duty is not None else None
        partition = rk.partition_key
        if partition in self.duty_cycles and self.duty_cycles[partition][0] != duty:
            other_duty, other = self.duty_cycles[partition]
            self.fail(where, f"duty_cycle_ms {duty!r} differs from {other}'s ({other_duty!r}); the models of partition "
                             f"{partition} take turns in one round, so they all carry the same duty cycle.")
            return False, {}
        turn = item.get("turn_ms")
        if turn is not None and (not _is_number(turn) or turn <= 0):
            self.fail(where, f"'turn_ms' must be a finite number of milliseconds > 0, or null; got {turn!r}.")
            return False, {}
        self.duty_cycles.setdefault(partition, (duty, rk.key))
        self.mps_gpus.add(rk.index)
        return True, {"mps_percent": rk.mps_percent, "duty_cycle_ms": duty, "turn_ms": float(turn) if turn is not None else None}

    def _mps_variant_once(self, where: str, rk: RuntimeKey, variant: ModelVariant) -> bool:
        served = self.partition_variants[rk.partition_key]
        if variant.pk in served:
            self.fail(where, f"variant {variant.name} is already served in partition {rk.partition_key} (by {served[variant.pk]}); "
                             "a model has one batcher per partition.")
            return False
        served[variant.pk] = rk.key
        return True

    def check(self, i: int, item: Any) -> dict | None:
        if not isinstance(item, dict):
            self.fail(f"runtimes[{i}]", "expected an object.")
            return None
        try:
            rk = runtime_key_parse(item.get("key"))
        except ValueError as exc:
            self.fail(f"runtimes[{i}]", f"key: {exc}")
            return None
        where = f"runtimes[{i}] ({rk.key})"
        unknown = sorted(set(item) - RUNTIME_KEYS)
        if unknown:
            self.fail(where, f"unknown keys {', '.join(unknown)}.")
            return None
        if rk.key in self.keys:
            self.fail(where, "the key is used twice.")
            return None
        self.keys.add(rk.key)
        device = item.get("device", rk.device)
        if device != rk.device:
            self.fail(where, f"'device' must be {rk.device!r}, the device in the key.")
            return None
        # The device, as it will be.
        cpu_threads = item.get("cpu_threads")
        mps = getattr(rk, "mps_percent", None) is not None
        mps_fields: dict = {}
        if not mps:
            given = [name for name in ("mps_percent", "duty_cycle_ms", "turn_ms") if item.get(name) is not None]
            if given:
                self.fail(where, f"{' and '.join(given)}: only for a model in an MPS partition ('gpu<i>/mps<NN>@<k>/<slot>').")
                return None
        if rk.kind == AcceleratorKindChoices.GPU:
            geometry = self.geometry.get(rk.index)
            if geometry is None:
                self.fail(where, f"the host has no {rk.device} (its GPUs: {', '.join(f'gpu{g}' for g in sorted(self.geometry)) or 'none'}).")
                return None
            accelerator = geometry.accelerator
            if cpu_threads is not None:
                self.fail(where, "'cpu_threads' is only for CPU runtimes.")
                return None
            if mps:
                ok, mps_fields = self._mps(where, rk, item, geometry)
                placement = rk.placement
            else:
                ok, placement = self._placement(where, rk, item, accelerator)
            if not ok:
                return None
            if mps:
                pass  # its partition and fields were checked by _mps
            elif placement is None and geometry.mig_enabled:
                self.fail(where, f"a whole-GPU runtime needs MIG disabled on {rk.device}, and this version has it enabled.")
                return None
            elif placement is None and geometry.mps_enabled:
                self.fail(where, f"a whole-GPU runtime needs MPS disabled on {rk.device}, and this version has it enabled "
                                 f"(give it a partition instead: {rk.device}/mps100@0/0 with mps_layout ['mps100@0']).")
                return None
            elif placement is not None:
                if not geometry.mig_enabled:
                    self.fail(where, f"MIG is disabled on {rk.device} in this version; a MIG instance cannot run there.")
                    return None
                if placement not in geometry.layout:
                    layout = ", ".join(geometry.layout) or "empty"
                    self.fail(where, f"{placement} is not in {rk.device}'s MIG layout ({layout}).")
                    return None
        else:
            accelerator = self.cpus.get(rk.index)
            if accelerator is None:
                self.fail(where, f"the host has no {rk.device} (its CPUs: {', '.join(f'cpu{c}' for c in sorted(self.cpus)) or 'none'}).")
                return None
            placement = None
            if item.get("placement") is not None:
                self.fail(where, "'placement' is only for MIG instances (null for CPU runtimes).")
                return None
            if not _is_int(cpu_threads) or cpu_threads < 1:
                self.fail(where, "'cpu_threads' must be an integer >= 1 on a CPU runtime.")
                return None
            self.cpu_threads[rk.index] += cpu_threads
        # What it serves.
        name = item.get("application")
        application = self.applications.get(name) if isinstance(name, str) else None
        if application is None:
            self.fail(where, f"no application named {item.get('application')!r}.")
            return None
        variant_id = _variant_id(item.get("variant"))
        variant = self.variants.get(variant_id) if variant_id is not None else None
        if variant is None:
            self.fail(where, f"'variant' must be the id of a model variant; {item.get('variant')!r} is not one.")
            return None
        if variant.application_id != application.pk:
            self.fail(where, f"variant {variant.pk} ({variant.name}) belongs to {variant.application.name}, not {application.name}.")
            return None
        if mps and not self._mps_variant_once(where, rk, variant):
            return None
        if variant.artifact_id is None:
            if rk.kind == AcceleratorKindChoices.CPU:
                self.fail(where, f"variant {variant.name} has no artifact; CPU runtimes compute for real and need one.")
                return None
            if not self.host.simulated:
                self.fail(where, f"variant {variant.name} has no artifact; only a simulated host can run a variant without one.")
                return None
        max_batch = item.get("max_batch")
        if not _is_int(max_batch) or not 1 <= max_batch <= MAX_BATCH_LIMIT:
            self.fail(where, f"'max_batch' must be an integer from 1 to {MAX_BATCH_LIMIT}.")
            return None
        batching, problem = _batching_validate(item.get("batching"), application)
        if problem:
            self.fail(where, problem)
            return None
        vertical = None
        if item.get("vertical") is not None:
            if rk.kind != AcceleratorKindChoices.CPU:
                self.fail(where, "'vertical' is only for CPU runtimes (they are resized in place; GPU slices are not).")
                return None
            vertical, problem = _vertical_validate(item["vertical"], cpu_threads=cpu_threads, max_batch=max_batch,
                                                   host_cores=accelerator.cpu_cores or 0)
            if problem:
                self.fail(where, problem)
                return None
        if item.get("profile") is not None:
            profile, problem = _profile_validate(item["profile"])
            if problem:
                self.fail(where, problem)
                return None
        else:
            profile, slice_text = _profile_lookup(variant, accelerator, None if mps else placement, cpu_threads,
                                                  mps_fields.get("mps_percent"))
            if not profile:
                self.fail(where, f"no profile of {variant} on {slice_text}; profile it first or give 'profile'.")
                return None
        return {
            "key": rk.key,
            "device": rk.device,
            "placement": placement,
            "cpu_threads": cpu_threads if rk.kind == AcceleratorKindChoices.CPU else None,
            "application": application.name,
            "variant": {"id": variant.pk, "name": variant.name, "artifact": _artifact_document(variant)},
            "max_batch": max_batch,
            "batching": batching,
            "profile": profile,
            **mps_fields,
            # Only where given: a key on every runtime would change every running runtime's document.
            **({"vertical": vertical} if vertical is not None else {}),
        }

    def check_cpu_threads(self) -> None:
        for index, threads in sorted(self.cpu_threads.items()):
            cores = self.cpus[index].cpu_cores or 0
            if threads > cores:
                self.errors.add("runtimes", f"cpu{index}: the CPU runtimes ask for {threads} threads in all; it has {cores} cores.")


def host_desired_state_validate(*, host: Host, spec: Any) -> dict:
    """Check a desired-state document against the host's inventory and return it filled in (without host
    and version): canonical MIG placements and MPS layouts, variants with their artifacts, batching defaults
    from the application's SLO policy, profiles from the registry where not given, and every GPU whose MPS
    partitions run models listed (the agent runs partitions only on a GPU listed in MPS mode). Raises
    ValidationError."""
    errors = _Errors()
    if not isinstance(spec, dict):
        raise ValidationError({"non_field_errors": "Expected an object {gpus, runtimes}."})
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ValidationError({"non_field_errors": f"Unknown keys {', '.join(unknown)} (expected gpus and runtimes)."})
    accelerators = list(host.accelerators.prefetch_related("gpu_instances", "mps_partitions_set"))
    gpus = {a.index: a for a in accelerators if a.kind == AcceleratorKindChoices.GPU}
    cpus = {a.index: a for a in accelerators if a.kind == AcceleratorKindChoices.CPU}
    listed, geometry = _gpus_validate(gpus, spec.get("gpus"), errors)
    raw_runtimes = spec.get("runtimes", [])
    runtimes: list[dict] = []
    if raw_runtimes is None:
        raw_runtimes = []
    if not isinstance(raw_runtimes, list):
        errors.add("runtimes", "Expected a list of runtimes.")
    elif not errors:  # runtimes are checked against the geometry, which must be valid first
        checker = _RuntimeChecker(host, geometry, cpus, raw_runtimes, errors)
        for i, item in enumerate(raw_runtimes):
            document = checker.check(i, item)
            if document is not None:
                runtimes.append(document)
        checker.check_cpu_threads()
        # A GPU whose MPS partitions run models is listed, as it is when this version does not set it: the
        # agent runs a partition only on a GPU its desired state lists in MPS mode.
        listed_indices = {g["index"] for g in listed}
        listed += [geometry[index].document() for index in sorted(checker.mps_gpus - listed_indices)]
        listed.sort(key=lambda g: g["index"])
    errors.raise_if_any()
    runtimes.sort(key=lambda r: r["key"])
    return {"gpus": listed, "runtimes": runtimes}


@transaction.atomic
def host_desired_state_set(*, host: Host, spec: dict, actor: Any = None) -> HostDesiredState:
    """Store a new version of the host's desired state (the previous version + 1) after validating it
    against the host's inventory (see host_desired_state_validate). Nothing is stored when it is invalid."""
    host = Host.objects.select_for_update(no_key=True).get(pk=host.pk)  # one version at a time per host; FK inserts go on (see _routing_table_activate)
    document = host_desired_state_validate(host=host, spec=spec)
    latest = host.desired_states.aggregate(latest=Max("version"))["latest"] or 0
    version = latest + 1
    SlotChange.objects.filter(host=host).delete()  # the change it announced is now the desired state itself
    return HostDesiredState.objects.create(
        host=host, version=version, spec={"host": host.name, "version": version, **document}, created_by=_user_or_none(actor)
    )


def host_desired_state_latest(*, host: Host) -> HostDesiredState | None:
    return HostDesiredState.objects.filter(host=host).order_by("-version").first()


# --------------------------------------------------------------------------- routing tables


def _routes_validate(*, application: Application, routes: Any) -> list[dict]:
    """[{instance, variant, weight, batch?}] -> the same with weights normalised to sum to 1. `batch` (optional)
    is the instance's planned batch size, which routers show as the model's batching configuration. An
    empty list is a valid table: the application has no capacity (its router answers no_route)."""
    if not isinstance(routes, list):
        raise ValidationError({"routes": "Expected a list of {instance, variant, weight, batch}."})
    errors = _Errors()
    parsed: list[tuple[str, str, int, float]] = []
    batches: dict[str, int] = {}
    for i, route in enumerate(routes):
        if not isinstance(route, dict) or set(route) - {"instance", "variant", "weight", "batch"}:
            errors.add("routes", f"routes[{i}]: expected an object {{instance, variant, weight, batch}}.")
            continue
        batch = route.get("batch")
        if batch is not None:
            if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_QUERY_SIZE:
                errors.add("routes", f"routes[{i}]: 'batch' must be a whole number 1..{MAX_QUERY_SIZE}.")
                continue
            batches[str(route.get("instance"))] = batch
        try:
            host_name, _ = instance_id_parse(route.get("instance"))
        except ValueError as exc:
            errors.add("routes", f"routes[{i}]: {exc}.")
            continue
        variant_id, weight = _variant_id(route.get("variant")), route.get("weight")
        if variant_id is None:
            errors.add("routes", f"routes[{i}] ({route['instance']}): 'variant' must be a model variant's id.")
            continue
        if not _is_number(weight) or weight < 0:
            errors.add("routes", f"routes[{i}] ({route['instance']}): 'weight' must be a finite number >= 0.")
            continue
        parsed.append((route["instance"], host_name, variant_id, float(weight)))
    errors.raise_if_any()
    hosts = set(Host.objects.filter(name__in={p[1] for p in parsed}).values_list("name", flat=True))
    variants = {v.pk: v for v in ModelVariant.objects.filter(pk__in={p[2] for p in parsed}).select_related("application")}
    for i, (instance, host_name, variant_id, _) in enumerate(parsed):
        if host_name not in hosts:
            errors.add("routes", f"routes[{i}] ({instance}): no host named {host_name!r}.")
        variant = variants.get(variant_id)
        if variant is None:
            errors.add("routes", f"routes[{i}] ({instance}): no model variant {variant_id}.")
        elif variant.application_id != application.pk:
            errors.add("routes", f"routes[{i}] ({instance}): variant {variant_id} ({variant.name}) belongs to {variant.application.name}, not {application.name}.")
    errors.raise_if_any()
    try:
        table = EngineRoutingTable(application.name, 0, tuple((instance, weight) for instance, _, _, weight in parsed))
    except RoutingError as exc:
        raise ValidationError({"routes": str(exc)}) from exc
    weights = dict(table.entries)
    return [{"instance": instance, "variant": variant_id, "weight": weights[instance],
             **({"batch": batches[instance]} if instance in batches else {})} for instance, _, variant_id, _ in parsed]


def _routes_slots_check(*, routes: list[dict]) -> None:
    """Refuse routes (being added to a table) to a slot that will not serve their variant: one whose host has
    announced a change of it (SlotChange, unexpired) to another variant or to nothing, or, with none announced,
    whose host's latest desired state serves another variant there or nothing. The hosts are locked (FOR NO KEY
    UPDATE, as `host_desired_state_set` and agents' reports lock them) so that an announcement is either seen
    here or made after this table is active, where the withdrawal that follows it finds the route. Hosts
    without a desired state are not checked (nothing is planned there)."""
    by_host: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for i, route in enumerate(routes):
        host_name, key = instance_id_parse(route["instance"])
        by_host[host_name].append((i, key.key, route["variant"]))
    if not by_host:
        return
    hosts = list(Host.objects.select_for_update(no_key=True).filter(name__in=list(by_host)).order_by("pk"))
    announced = {c.host_id: c.serving for c in SlotChange.objects.filter(host__in=hosts, expires_at__gt=timezone.now())}
    # Each unannounced host's latest desired state, in two queries whatever the number of hosts.
    latest = dict(HostDesiredState.objects.filter(host__in=[h for h in hosts if h.pk not in announced]).values("host_id")
                  .annotate(version=Max("version")).values_list("host_id", "version"))
    states = {d.host_id: d for d in HostDesiredState.objects.filter(host_id__in=list(latest), version__in=set(latest.values()))
              if latest[d.host_id] == d.version}
    errors = _Errors()
    for host in hosts:
        if host.pk in announced:
            serving, why = {k: _variant_id(v) for k, v in announced[host.pk].items()}, "is changing to serve"
        else:
            desired = states.get(host.pk)
            if desired is None:
                continue
            serving = _slots_serving({host.name: desired.spec.get("runtimes", [])})[host.name]
            why = f"serves, in the host's desired state version {desired.version},"
        for i, key, variant in by_host[host.name]:
            if serving.get(key) != variant:
                will = f"variant {serving[key]}" if serving.get(key) is not None else "nothing"
                errors.add("routes", f"routes[{i}] ({host.name}/{key}): the slot {why} {will}, not variant {variant}; "
                                     "publish its route once the host's desired state serves it.")
    errors.raise_if_any()


def _routing_table_activate(*, application: Application, routes: list[dict], actor: Any, check_slots: bool = True) -> RoutingTable:
    # FOR NO KEY UPDATE, not FOR UPDATE: it serialises publishers all the same, but leaves alone the FOR KEY
    # SHARE locks that every insert of a row referring to the application takes (an agent's report storing
    # its runtimes). With FOR UPDATE, a report holding one application's key-share lock and waiting for
    # another's deadlocked a rollout's route withdrawal that locked the two in the other order.
    application = Application.objects.select_for_update(no_key=True).get(pk=application.pk)
    if application.released:
        # Released (the model repository's unload) after the plan being applied was made: the release wins,
        # and the application stays without routes until it is pinned again.
        routes = []
    tables = RoutingTable.objects.filter(application=application)
    if check_slots:
        active = tables.filter(active=True).first()
        held = {(r["instance"], r["variant"]) for r in (active.routes if active else [])}
        _routes_slots_check(routes=[r for r in routes if (r["instance"], r["variant"]) not in held])
    latest = tables.aggregate(latest=Max("version"))["latest"] or 0
    # Deactivate first: at most one active table per application is a database constraint.
    for previous in tables.filter(active=True):
        previous.active = False
        previous.save(update_fields=["active", "last_updated"])
    return RoutingTable.objects.create(
        application=application, version=latest + 1, active=True, routes=routes, created_by=_user_or_none(actor)
    )


@transaction.atomic
def routing_tables_publish(*, tables: Mapping[Application, Any], actor: Any = None, check_slots: bool = True) -> dict[Application, RoutingTable]:
    """Publish a new version of several applications' routing tables and make them the active ones, all in
    one transaction: routers see either every old table or every new one. Every table is validated before
    anything is written; an invalid one refuses them all, and so does a route added to a slot that will not
    serve its variant (`_routes_slots_check`; `check_slots=False` only to put back routes just withdrawn)."""
    validated: dict[Application, list[dict]] = {}
    messages: list[str] = []
    for application, routes in tables.items():
        try:
            validated[application] = _routes_validate(application=application, routes=routes)
        except ValidationError as exc:
            messages += [f"{application.name}: {m}" for m in exc.messages]
    if messages:
        raise ValidationError({"routes": messages})
    # A fixed order (by id) so two publishers lock applications in the same order.
    return {
        application: _routing_table_activate(application=application, routes=validated[application], actor=actor, check_slots=check_slots)
        for application in sorted(validated, key=lambda a: a.pk)
    }


@transaction.atomic
def routing_table_publish(*, application: Application, routes: Any, actor: Any = None) -> RoutingTable:
    """Publish a new version (previous max + 1) of an application's routing table and make it the active
    one in the same transaction. `routes` is [{instance: "<host>/<runtime key>", variant: id, weight}]."""
    validated = _routes_validate(application=application, routes=routes)
    return _routing_table_activate(application=application, routes=validated, actor=actor)


# --------------------------------------------------------------------------- the model repository: pin and release


@transaction.atomic
def application_release(*, application: Application, actor: Any = None) -> RoutingTable | None:
    """The Open Inference Protocol's model unload: take `application` out of service. Its routes are
    withdrawn at once (an empty routing table, which routers hold within their refresh), it stays without
    routes through any plan applied later, and the planner leaves it out, until `application_pin`. Its
    runtimes keep their slots until a plan gives those to others. Releasing a released application changes
    nothing (None)."""
    application = Application.objects.select_for_update(no_key=True).get(pk=application.pk)
    if application.released:
        return None
    application.released = True
    application.save(update_fields=["released", "last_updated"])
    return _routing_table_activate(application=application, routes=[], actor=actor)


@transaction.atomic
def application_pin(*, application: Application, actor: Any = None, settings: TritonLoadSettings | None = None) -> bool:
    """The Open Inference Protocol's model load: put a released `application` back into planning; its routes
    return with the next plan applied (Tessera's plans wait for approval unless the re-planning policy
    applies them itself). `settings`: what the load's configuration maps onto
    (engine.dataplane.triton.triton_load_config_parse), applied in the same transaction; the next plan
    honours them. True when anything changed; pinning an application in service with nothing to change
    changes nothing."""
    application = Application.objects.select_for_update(no_key=True).get(pk=application.pk)
    changed = []
    if application.released:
        application.released, changed = False, ["released"]
    for name in ("max_batch_size", "batching_delay_ms"):
        value = getattr(settings, name, None) if settings is not None else None
        if value is not None and value != getattr(application, name):
            setattr(application, name, value)
            changed.append(name)
    if not changed:
        return False
    application.full_clean(validate_unique=False)
    application.save(update_fields=[*changed, "last_updated"])
    return True


# --------------------------------------------------------------------------- a slot changes what it serves

# A router that reported within this long is live: it must confirm a withdrawal before a slot changes. One
# that stopped reporting drops out of the count after it, so the wait for confirmations must be longer.
ROUTER_LIVE_S = 10.0
ROUTERS_CONFIRM_DEADLINE_S = 30.0
# An announced slot change outlives the routers' deadline by this much: time to store the desired state.
SLOT_CHANGE_MARGIN_S = 30.0
_CONFIRM_POLL_S = 0.2


class RoutersBehind(Exception):
    """Live routers did not confirm a withdrawal of routes in time; nothing was written and the withdrawn
    routes were published again."""

    def __init__(self, message: str, routers: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.routers = routers


def _slots_serving(desired_runtimes: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, dict[str, int | None]]:
    """{host name: {runtime key: variant id}} from desired runtimes (as posted or as filled in)."""
    return {host: {r["key"]: _variant_id(r.get("variant")) for r in runtimes} for host, runtimes in desired_runtimes.items()}


def routers_behind(*, versions: Mapping[str, int], live_s: float | None = None) -> list[str]:
    """The live routers (a report within `live_s`) whose latest report holds an older table than `versions`
    ({application name: version}) for one of those applications. A router that holds no table for an
    application (it reports none, or a null version) cannot route to it, and is not behind."""
    if not versions:
        return []
    cutoff = timezone.now() - timedelta(seconds=ROUTER_LIVE_S if live_s is None else live_s)
    latest: dict[tuple[str, str], int | None] = {}  # (router, application) -> the version its latest report held
    for router, name, held in (ApplicationSample.objects.filter(at__gte=cutoff, application_name__in=list(versions))
                               .order_by("-at", "-id").values_list("router", "application_name", "routing_version")):
        latest.setdefault((router, name), held)
    return sorted({router for (router, name), held in latest.items() if held is not None and held < versions[name]})


def _routes_without(*, desired_runtimes: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[Application, tuple[list[dict], list[dict]]]:
    """The active tables that route to a slot of these hosts which the desired runtimes will not serve with
    the route's variant: {application: (its routes now, its routes without those)}."""
    serving = _slots_serving(desired_runtimes)
    changed: dict[Application, tuple[list[dict], list[dict]]] = {}
    for table in RoutingTable.objects.select_for_update(of=("self",)).filter(active=True).select_related("application"):
        kept = []
        for route in table.routes:
            try:
                host_name, key = instance_id_parse(route["instance"])
            except ValueError:
                kept.append(route)
                continue
            if host_name in serving and serving[host_name].get(key.key) != route["variant"]:
                continue  # the slot will serve another variant, another application, or nothing
            kept.append(route)
        if len(kept) != len(table.routes):
            changed[table.application] = (list(table.routes), kept)
    return changed


@transaction.atomic
def _slot_changes_announce(*, desired_runtimes: Mapping[str, Iterable[Mapping[str, Any]]], expires_in_s: float) -> list[Host]:
    """Announce what these hosts' slots will serve (SlotChange, one per host, replacing any earlier), each host
    locked as `_routes_slots_check` locks it, before their routes are read and withdrawn."""
    serving = _slots_serving(desired_runtimes)
    hosts = list(Host.objects.select_for_update(no_key=True).filter(name__in=list(serving)).order_by("pk"))
    until = timezone.now() + timedelta(seconds=expires_in_s)
    for host in hosts:
        SlotChange.objects.update_or_create(host=host, defaults={"serving": serving[host.name], "expires_at": until})
    return hosts


def routes_withdraw(*, desired_runtimes: Mapping[str, Iterable[Mapping[str, Any]]], actor: Any = None,
                    deadline_s: float | None = None, live_s: float | None = None) -> dict[str, int]:
    """Before a slot changes what it serves: publish every active routing table that routes to a slot of
    these hosts ({host name: its desired runtimes}) that will not serve the route's variant, without those
    routes, and wait (at most `deadline_s`, default ROUTERS_CONFIRM_DEADLINE_S) until no live router holds
    an older version of those tables (`routers_behind`; none live: no wait).
    Returns {application name: the version published} (empty: no route had to go, nothing published).

    Raises RoutersBehind when live routers still hold the old tables at the deadline; the withdrawn routes
    are then published again (the slots did not change). Call it outside a transaction: routers must be able
    to read the published tables while it waits."""
    deadline_s = ROUTERS_CONFIRM_DEADLINE_S if deadline_s is None else deadline_s
    hosts = _slot_changes_announce(desired_runtimes=desired_runtimes, expires_in_s=deadline_s + SLOT_CHANGE_MARGIN_S)
    with transaction.atomic():  # no other publish between reading the active tables and replacing them
        changed = _routes_without(desired_runtimes=desired_runtimes)
        if not changed:
            return {}
        published = routing_tables_publish(tables={app: kept for app, (_routes, kept) in changed.items()}, actor=actor)
    versions = {app.name: table.version for app, table in published.items()}
    deadline = time.monotonic() + deadline_s
    while behind := routers_behind(versions=versions, live_s=live_s):
        if time.monotonic() > deadline:
            with transaction.atomic():  # the change is called off: its announcement goes with the routes' return
                SlotChange.objects.filter(host__in=hosts).delete()
                routing_tables_publish(tables={app: routes for app, (routes, _kept) in changed.items()}, actor=actor, check_slots=False)
            names = ", ".join(sorted(versions))
            raise RoutersBehind(f"routers {', '.join(behind)} did not take the routing tables of {names} without the routes "
                                f"to the slots that change within {deadline_s:g} s; nothing was changed", behind)
        time.sleep(_CONFIRM_POLL_S)
    return versions


def host_desired_state_change(*, host: Host, spec: dict, actor: Any = None, deadline_s: float | None = None) -> HostDesiredState:
    """An operator's new desired state for a host, ordered so that no query is answered by the wrong model:
    validate it (ValidationError, nothing changed), withdraw the routes to the slots it changes and wait for
    the routers to confirm (`routes_withdraw`; RoutersBehind, nothing changed), then store it
    (`host_desired_state_set`). Routes to what the slots serve next are the operator's to publish (a table
    shows such a route's endpoint once the slot's runtime reports the routed variant). Runs outside a
    transaction: it can wait a few seconds for the routers."""
    document = host_desired_state_validate(host=host, spec=spec)
    routes_withdraw(desired_runtimes={host.name: document["runtimes"]}, actor=actor, deadline_s=deadline_s)
    return host_desired_state_set(host=host, spec=spec, actor=actor)


# --------------------------------------------------------------------------- the agent's report


def _runtimes_replace(*, host: Host, reported: list[dict]) -> None:
    """Make the host's Runtime rows exactly the reported ones. An unknown application name or variant id is
    kept as null (the runtime still exists and is still reported)."""
    names = {r.get("application") for r in reported if r.get("application")}
    ids = {r["variant"] for r in reported if r.get("variant") is not None}
    applications = {a.name: a for a in Application.objects.filter(name__in=names)}
    variants = {v.pk: v for v in ModelVariant.objects.filter(pk__in=ids)}
    existing = {r.key: r for r in Runtime.objects.filter(host=host)}
    wanted = {r["key"] for r in reported}
    Runtime.objects.filter(host=host).exclude(key__in=wanted).delete()
    fields = ("application", "variant", "state", "endpoint", "simulated", "error")
    new, unchanged = [], []
    for item in reported:
        variant = variants.get(item.get("variant"))
        application = applications.get(item.get("application")) or (variant.application if variant else None)
        values = {
            "application": application,
            "variant": variant,
            "state": item["state"],
            "endpoint": item.get("endpoint", ""),
            "simulated": item.get("simulated", False),
            "error": item.get("error", ""),
        }
        runtime = existing.get(item["key"])
        if runtime is None:
            new.append(Runtime(host=host, key=item["key"], **values))
        elif any(getattr(runtime, f) != values[f] for f in fields):
            for name, value in values.items():
                setattr(runtime, name, value)
            runtime.save()
        else:
            unchanged.append(runtime.pk)
    Runtime.objects.bulk_create(new)
    # last_updated says when the agent last reported the runtime, changed or not.
    Runtime.objects.filter(pk__in=unchanged).update(last_updated=timezone.now())


def _operations_append(*, host: Host, reported: list[dict]) -> None:
    """Append the agent's operations, skipping any already stored (a report resent after a lost reply)."""
    if not reported:
        return
    fields = ("at", "action", "target", "outcome", "detail")
    stored = set(
        HostOperation.objects.filter(host=host, at__in={r["at"] for r in reported}).values_list(*fields)
    )
    new, seen = [], set()
    for item in reported:
        row = tuple(item.get(f, "") for f in fields)
        if row in stored or row in seen:
            continue
        seen.add(row)
        new.append(HostOperation(host=host, **dict(zip(fields, row))))
    HostOperation.objects.bulk_create(new)


@transaction.atomic
def host_report_apply(*, host: Host, report: dict[str, Any]) -> Host:
    """Apply an agent's whole report, all or nothing: the inventory part (devices, MIG instances, converged
    version, catalogue disagreements: host_actual_state_apply), then its runtimes (which replace the stored
    ones) and its operations (appended). A part left out of the report leaves what is stored alone."""
    host = host_actual_state_apply(host=host, report=report)
    if "runtimes" in report:
        _runtimes_replace(host=host, reported=report["runtimes"])
    if "operations" in report:
        _operations_append(host=host, reported=report["operations"])
    return host

