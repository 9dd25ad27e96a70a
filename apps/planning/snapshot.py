"""The fleet as the planning engine sees it: inventory, registry and policies read once and turned into an
engine `Problem` (docs/planning.md), with the map back from the engine's names to the inventory.

What is planned:

- Hosts. Only hosts whose status is `online` (their agent has reported, so their devices and MIG geometry
  are what the agent saw). `maintenance` and `offline` hosts are left out: the operator took them out, or
  they are away. `registered` hosts (an agent has never reported) are left out too by default: their
  devices are only declared, and a plan that routed traffic there would send it to runtimes nobody runs;
  `include_registered=True` plans them as declared (planning ahead of bringing the agents up). Every host
  left out is named in `left_out["hosts"]` with the reason, and its desired state is not touched.
- Devices (`<host>/gpu<i>`, `<host>/cpu<i>`). A MIG-capable GPU of the MIG catalogue is a MIG device of its
  catalogue model with its current layout (the GpuInstance rows), or without a layout when MIG is off or no
  instance exists (the planners then run it whole). Other GPUs are whole GPUs of their NVML name (without
  the "NVIDIA " prefix, as profiles of GPUs outside the catalogue are usually stored). CPUs are CPU devices
  with their cores. `running` (slot -> variant) comes from the host's latest desired state, so planners
  keep what runs where that costs nothing.
- Applications: those with an SLO policy (p99 target = `slo_ms`, `min_accuracy`, `priority`) and at least one variant
  profiled on a device type of the fleet; demand from the `demand` argument (0 when not given).
- Variants: every variant of a planned application with a profile on a device type of the fleet, named
  `<application>/<variant>` in the engine (variant names are unique per application only). Variants
  without an artifact cannot run on CPUs, nor on the GPUs of non-simulated hosts (the desired state would
  refuse them): their profile points there are left out.
- Profiles: the p50 batch latency (what the capacity model and the desired state's profile use) and the
  memory where measured; CPU slices are the core count as text."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from apps.deployments.models import HostDesiredState
from apps.inventory.choices import AcceleratorKindChoices, HostStatusChoices
from apps.inventory.models import Accelerator, Host
from apps.policies.models import SloPolicy
from apps.registry.models import ModelVariant, Profile
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.names import runtime_key_parse
from engine.plans.problem import CPU_DEVICE_TYPE, FULL_SLICE, Problem, SolveOptions, problem_from_dict

__all__ = ["FleetSnapshot", "PLANNED_HOST_STATUSES", "fleet_problem_build", "gpu_device_type", "variant_engine_name"]

# Hosts whose devices are planned (see the module docstring); `registered` too with include_registered.
PLANNED_HOST_STATUSES = (HostStatusChoices.ONLINE,)
HOST_LEFT_OUT_REASONS = {
    HostStatusChoices.REGISTERED: "registered: its agent has never reported, so its devices are only declared",
    HostStatusChoices.OFFLINE: "offline",
    HostStatusChoices.MAINTENANCE: "in maintenance",
}


@dataclass
class FleetSnapshot:
    """An engine problem and how its names map back to Tessera's records.

    `problem` is None when there is nothing to plan (no device, or no application that can be planned);
    `notes` then say why. `devices`: engine device name -> {"host": id, "host_name", "kind": "gpu"|"cpu",
    "index"}. `hosts`: name -> id of every host whose devices are planned. `variants`: engine variant name
    -> {"id", "application", "name"}. `applications`: name -> {"id", "slo_ms", "min_accuracy", "drop_rule",
    "demand_rps"}. `left_out`: {"hosts": {name: reason}, "applications": {name: reason}, "variants":
    {engine name: reason}}."""

    problem: Problem | None
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    hosts: dict[str, int] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    applications: dict[str, dict[str, Any]] = field(default_factory=dict)
    left_out: dict[str, dict[str, str]] = field(default_factory=lambda: {"hosts": {}, "applications": {}, "variants": {}})
    notes: list[str] = field(default_factory=list)

    @property
    def variant_ids(self) -> dict[str, int]:
        return {name: info["id"] for name, info in self.variants.items()}


def variant_engine_name(application: str, variant: str) -> str:
    return f"{application}/{variant}"


def gpu_device_type(model_name: str) -> str:
    """The device type of a GPU in problems and profiles: its MIG catalogue name, else its NVML name
    without the vendor prefix."""
    spec = mig_catalogue_load().gpu_model_find(model_name)
    return spec.name if spec is not None else model_name.removeprefix("NVIDIA ").strip()


def _profile_device_type(device_type: str) -> str:
    return CPU_DEVICE_TYPE if device_type == CPU_DEVICE_TYPE else gpu_device_type(device_type)


def _running_slots(spec: dict, device_layouts: dict[str, tuple[str, ...] | None], variant_names: dict[int, str]) -> dict[str, dict[str, str]]:
    """What the host's desired state runs, per engine-local device ("gpu0", "cpu0"): slot -> engine variant.
    Only slots that exist on the device as planned count; on a CPU the first runtime by key stands for it."""
    running: dict[str, dict[str, str]] = {}
    for runtime in sorted(spec.get("runtimes", []), key=lambda r: str(r.get("key"))):
        try:
            rk = runtime_key_parse(runtime.get("key"))
        except ValueError:
            continue
        raw_variant = runtime.get("variant")
        variant_id = raw_variant.get("id") if isinstance(raw_variant, dict) else raw_variant
        variant = variant_names.get(variant_id)
        if variant is None or rk.device not in device_layouts:
            continue
        layout = device_layouts[rk.device]
        if rk.kind == AcceleratorKindChoices.CPU:
            slot = CPU_DEVICE_TYPE
        elif rk.placement is not None:
            if layout is None or rk.placement not in layout:
                continue
            slot = rk.placement
        else:
            if layout is not None:
                continue
            slot = FULL_SLICE
        running.setdefault(rk.device, {}).setdefault(slot, variant)
    return running


def fleet_problem_build(
    *, demand: dict[str, float], options: SolveOptions | None = None, include_registered: bool = False
) -> FleetSnapshot:
    """The planning problem of the fleet as it is now, for `demand` ({application name: rps})."""
    catalogue = mig_catalogue_load()
    options = options or SolveOptions()
    snapshot = FleetSnapshot(problem=None)
    statuses = set(PLANNED_HOST_STATUSES) | ({HostStatusChoices.REGISTERED} if include_registered else set())

    # ----------------------------------------------------------------- devices
    hosts = list(Host.objects.order_by("name"))
    accelerators: dict[int, list[Accelerator]] = {}
    for accelerator in Accelerator.objects.filter(host__in=[h for h in hosts if h.status in statuses]).prefetch_related("gpu_instances").order_by("kind", "index"):
        accelerators.setdefault(accelerator.host_id, []).append(accelerator)
    latest_specs: dict[int, dict] = {}
    for state in HostDesiredState.objects.filter(host__in=[h for h in hosts if h.status in statuses]).order_by("host_id", "-version"):
        latest_specs.setdefault(state.host_id, state.spec)

    raw_devices: list[dict[str, Any]] = []
    host_device_layouts: dict[int, dict[str, tuple[str, ...] | None]] = {}
    device_types: set[str] = set()
    artifact_types: set[str] = {CPU_DEVICE_TYPE}  # device types whose runtimes need an artifact
    for host in hosts:
        if host.status not in statuses:
            snapshot.left_out["hosts"][host.name] = HOST_LEFT_OUT_REASONS.get(host.status, host.status)
            continue
        items = accelerators.get(host.pk, [])
        if not items:
            snapshot.left_out["hosts"][host.name] = "it has no devices"
            continue
        layouts: dict[str, tuple[str, ...] | None] = {}
        for accelerator in items:
            local = f"{accelerator.kind}{accelerator.index}"
            name = f"{host.name}/{local}"
            if accelerator.kind == AcceleratorKindChoices.CPU:
                raw = {"name": name, "type": CPU_DEVICE_TYPE, "cores": int(accelerator.cpu_cores or 1)}
                layouts[local] = None
                device_type = CPU_DEVICE_TYPE
            else:
                spec = catalogue.gpu_model_find(accelerator.model_name)
                if spec is not None and accelerator.mig_capable:
                    placements = sorted((gi.placement_start, gi.profile) for gi in accelerator.gpu_instances.all())
                    layout = tuple(f"{profile}@{start}" for start, profile in placements) if accelerator.mig_enabled and placements else None
                    raw = {"name": name, "type": spec.name, "mig": True, "memory_mb": float(spec.memory_mib)}
                    if layout is not None:
                        raw["layout"] = list(layout)
                    elif accelerator.mig_enabled:
                        snapshot.notes.append(f"{name}: MIG is enabled with no instance; planned as a whole GPU")
                    layouts[local] = layout
                    device_type = spec.name
                else:
                    device_type = gpu_device_type(accelerator.model_name)
                    raw = {"name": name, "type": device_type, "mig": False}
                    memory = accelerator.memory_mb or (spec.memory_mib if spec is not None else 0)
                    if memory:
                        raw["memory_mb"] = float(memory)
                    layouts[local] = None
                if not host.simulated:
                    artifact_types.add(device_type)
            device_types.add(device_type)
            raw_devices.append(raw)
            snapshot.devices[name] = {"host": host.pk, "host_name": host.name, "kind": accelerator.kind, "index": accelerator.index}
        snapshot.hosts[host.name] = host.pk
        host_device_layouts[host.pk] = layouts

    # ----------------------------------------------------------------- applications, variants, profiles
    policies = {p.application_id: p for p in SloPolicy.objects.select_related("application")}
    variants = list(ModelVariant.objects.select_related("application").order_by("application__name", "name"))
    profiles: dict[int, list[Profile]] = {}
    for row in Profile.objects.filter(variant__in=variants).order_by("variant_id", "device_type", "slice", "cpu_cores", "batch_size"):
        profiles.setdefault(row.variant_id, []).append(row)

    raw_variants: list[dict[str, Any]] = []
    raw_profiles: list[dict[str, Any]] = []
    planned_apps: dict[int, Any] = {}
    seen_apps: dict[int, Any] = {}
    for variant in variants:
        application = variant.application
        seen_apps[application.pk] = application
        if application.pk not in policies:
            continue
        engine_name = variant_engine_name(application.name, variant.name)
        points = []
        for row in profiles.get(variant.pk, []):
            device_type = _profile_device_type(row.device_type)
            if device_type not in device_types:
                continue
            if variant.artifact_id is None and device_type in artifact_types:
                continue
            if device_type == CPU_DEVICE_TYPE:
                if not row.cpu_cores:
                    continue
                slice_name = str(int(row.cpu_cores))
            else:
                slice_name = row.slice or FULL_SLICE
            point = {"variant": engine_name, "device_type": device_type, "slice": slice_name, "batch": int(row.batch_size),
                     "latency_ms": float(row.latency_p50_ms)}
            if row.memory_mb is not None:
                point["memory_mb"] = float(row.memory_mb)
            points.append(point)
        if not points:
            reason = "no profile on a device type of the planned fleet"
            if variant.artifact_id is None and profiles.get(variant.pk):
                reason += " that it can run on without an artifact"
            snapshot.left_out["variants"][engine_name] = reason
            continue
        # One point per (device type, slice, batch): the first, should two spellings map to one type.
        unique = {}
        for point in points:
            unique.setdefault((point["device_type"], point["slice"], point["batch"]), point)
        raw_profiles.extend(unique.values())
        raw_variants.append({"name": engine_name, "application": application.name, "accuracy": float(variant.accuracy),
                             "memory_mb": float(variant.memory_mb or 0)})
        snapshot.variants[engine_name] = {"id": variant.pk, "application": application.name, "name": variant.name}
        planned_apps[application.pk] = application

    raw_applications: list[dict[str, Any]] = []
    for app_id, application in sorted(seen_apps.items(), key=lambda kv: kv[1].name):
        if app_id not in policies:
            snapshot.left_out["applications"][application.name] = "no SLO policy"
            continue
        if app_id not in planned_apps:
            snapshot.left_out["applications"][application.name] = "no variant is profiled on a device type of the planned fleet"
            continue
        policy = policies[app_id]
        rps = float(demand.get(application.name, 0.0) or 0.0)
        raw_app: dict[str, Any] = {"name": application.name, "slo_ms": float(policy.latency_p99_ms), "demand_rps": max(0.0, rps)}
        if policy.min_accuracy is not None:
            raw_app["min_accuracy"] = float(policy.min_accuracy)
        raw_app["priority"] = int(policy.priority)  # who is served first when demand exceeds capacity
        raw_applications.append(raw_app)
        snapshot.applications[application.name] = {
            "id": application.pk, "slo_ms": float(policy.latency_p99_ms), "min_accuracy": policy.min_accuracy,
            "drop_rule": policy.drop_rule, "demand_rps": max(0.0, rps),
        }
    for app_id, policy in policies.items():
        if app_id not in seen_apps:
            snapshot.left_out["applications"][policy.application.name] = "no model variant"
    unknown = sorted(set(demand) - set(snapshot.applications) - set(snapshot.left_out["applications"]))
    if unknown:
        snapshot.notes.append(f"demand for unknown applications ignored: {', '.join(unknown)}")
    if snapshot.left_out["hosts"]:
        snapshot.notes.append("hosts left out: " + "; ".join(f"{n} ({r})" for n, r in sorted(snapshot.left_out["hosts"].items())))
    if snapshot.left_out["applications"]:
        snapshot.notes.append(
            "applications left out: " + "; ".join(f"{n} ({r})" for n, r in sorted(snapshot.left_out["applications"].items()))
        )

    if not raw_devices:
        snapshot.notes.append("nothing to plan: no host with devices is online" + (" or registered" if include_registered else ""))
        snapshot.devices, snapshot.hosts = {}, {}
        return snapshot
    if not raw_applications:
        snapshot.notes.append("nothing to plan: no application has an SLO policy and a variant profiled on this fleet")
        return snapshot

    # What runs now, from each host's latest desired state (only variants in the problem, on slots that exist).
    variant_by_id = {info["id"]: name for name, info in snapshot.variants.items()}
    for raw in raw_devices:
        info = snapshot.devices[raw["name"]]
        local = f"{info['kind']}{info['index']}"
        spec = latest_specs.get(info["host"])
        if spec:
            running = _running_slots(spec, host_device_layouts[info["host"]], variant_by_id).get(local)
            if running:
                raw["running"] = running

    problem_raw = {
        "format_version": 1, "applications": raw_applications, "variants": raw_variants, "devices": raw_devices,
        "profiles": raw_profiles, "options": dataclasses.asdict(options),
    }
    snapshot.problem = problem_from_dict(problem_raw)
    return snapshot
