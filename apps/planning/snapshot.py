"""The fleet as the planning engine sees it: inventory, registry and policies read once and turned into an
engine `Problem` (docs/planning.md), with the map back from the engine's names to the inventory.

What is planned:

- Hosts. Only hosts whose status is `online` (their agent has reported, so their devices and MIG geometry
  are what the agent saw). `maintenance` and `offline` hosts are left out: the operator took them out, or
  they are away. `registered` hosts (an agent has never reported) are left out too by default: their
  devices are only declared, and a plan that routed traffic there would send it to runtimes nobody runs;
  `include_registered=True` plans them as declared (planning ahead of bringing the agents up). Every host
  left out is named in `left_out["hosts"]` with the reason, and its desired state is not touched.
- Devices (`<host>/gpu<i>`, `<host>/cpu<i>`). A GPU in MPS mode (`mps_enabled`) is an MPS device (gpulets)
  of its type with the partition sizes it allows (`mps_partitions`, when set) and its current layout: its
  MpsPartition rows, else the layout of its latest desired state, else unknown. A MIG-capable GPU of the MIG
  catalogue is a MIG device of its
  catalogue model with its current layout (the GpuInstance rows), or without a layout when MIG is off or no
  instance exists (the planners then run it whole). A MIG GPU the catalogue lacks, with MIG on and the NVML
  profile table its agent reported, is a MIG device of a model described from that table (the problem's
  `gpu_models`, labelled "from NVML, not in the catalogue", with a note). Other GPUs are whole GPUs of their NVML name (without
  the "NVIDIA " prefix, as profiles of GPUs outside the catalogue are usually stored). CPUs are CPU devices
  with their cores. `running` (slot -> variant; on an MPS partition "mps60@0" -> the variants time-sharing
  it) comes from the host's latest desired state, so planners keep what runs where that costs nothing.
- Applications: those with an SLO policy (p99 target = `slo_ms`, `min_accuracy`, `priority`) and at least one variant
  profiled on a device type of the fleet; demand from the `demand` argument (0 when not given). Each carries
  its ensemble policy when it answers by random ensembles (mode random or learned; members by engine variant
  name: members without a variant in the problem are left out, the others' probabilities renormalised, and
  a note says so) and the distribution of its query sizes (D[b]) the routers counted over the last
  `query_sizes_window_s` seconds (apps/telemetry/selectors.py), where they counted any.
- Pipelines: every pipeline whose stages all have a variant profiled on the fleet, with its paths' SLOs
  and demand (the declared demand, scaled to the demand measured at its entry application when there is
  one); its stage applications are planned through it, with or without an SLO policy of their own.
- Variants: every variant of a planned application with a profile on a device type of the fleet, named
  `<application>/<variant>` in the engine (variant names are unique per application only). Variants
  without an artifact cannot run on CPUs, nor on the GPUs of non-simulated hosts (the desired state would
  refuse them): their profile points there are left out.
- Profiles: the p50 batch latency (what the capacity model and the desired state's profile use) and the
  memory where measured; CPU slices are the core count as text. MPS points ("mpsNN") are given only for
  device types with an MPS device, with their L2 and DRAM utilisation where stored.
- Interference: when co-run measurements (CorunMeasurement) exist for the type of the fleet's MPS GPUs (the
  type most of them have, as the MPS planners choose), the interference model
  (engine.sharing.interference, the default form) is fitted to them, joined with the solo profiles and
  their utilisations, and given to the problem; a note says on how many samples."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from apps.deployments.models import HostDesiredState
from apps.inventory.choices import AcceleratorKindChoices, HostStatusChoices
from apps.inventory.models import Accelerator, Host
from apps.policies.choices import EnsembleModeChoices
from apps.policies.models import EnsemblePolicy, SloPolicy
from apps.registry.models import CorunMeasurement, ModelVariant, PipelineStage, Profile
from apps.telemetry.selectors import application_query_sizes
from engine.ensembles.policy import ensemble_policy_to_dict
from engine.geometry.catalogue import gpu_model_canonical, mig_catalogue_load
from engine.geometry.names import mps_placement_parse, runtime_key_parse
from engine.plans.problem import CPU_DEVICE_TYPE, FULL_SLICE, Problem, SolveOptions, gpu_model_to_dict, problem_from_dict
from engine.reference.profiles import GpuletCorun, GpuletMemUtil, GpuletPoint
from engine.sharing.interference import INTERFERENCE_FORM_DEFAULT, interference_model_fit, interference_samples_build
from engine.sharing.partitions import mps_layout_validate, mps_slice_percent

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


def _pipelines_planned(snapshot: FleetSnapshot, planned_apps: dict[int, Any], demand: dict[str, float]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The registry's pipelines in the problem's format, and per stage application its pipeline, demand and
    SLO. A pipeline is planned when every stage has a variant profiled on the fleet (else it is left out,
    named in the notes). Its paths' demand is what the pipeline declares, unless `demand` measured its
    entry application: then the paths are scaled to add up to that (split evenly where nothing is
    declared), since every query of the pipeline enters there."""
    from apps.registry.models import Pipeline

    planned_names = {a.name for a in planned_apps.values()}
    raw_pipelines: list[dict[str, Any]] = []
    staged: dict[str, dict[str, Any]] = {}
    for pipeline in Pipeline.objects.order_by("name"):
        if not pipeline.stages or not pipeline.paths:
            continue
        missing = [s["application"] for s in pipeline.stages if s["application"] not in planned_names]
        if missing:
            snapshot.notes.append(f"pipeline {pipeline.name} left out: no variant profiled on this fleet for {', '.join(missing)}")
            continue
        raw = pipeline.engine_dict()
        raw["stages"] = [{**s, "variant": variant_engine_name(s["application"], s["variant"])} if s.get("variant") else dict(s)
                         for s in raw["stages"]]
        paths = [dict(q) for q in raw["paths"]]
        measured = demand.get(paths[0]["stages"][0])
        if measured is not None and measured > 0:
            declared = sum(q["demand_rps"] for q in paths)
            for q in paths:
                q["demand_rps"] = measured * (q["demand_rps"] / declared if declared > 0 else 1.0 / len(paths))
            snapshot.notes.append(f"pipeline {pipeline.name}: paths sized to the {measured:.4g} rps measured at {paths[0]['stages'][0]}")
        raw["paths"] = paths
        raw_pipelines.append(raw)
        for s in pipeline.stages:
            app = s["application"]
            through = [q for q in paths if app in q["stages"]]
            staged[app] = {"pipeline": pipeline.name, "slo_ms": min(q["slo_ms"] for q in through),
                           "demand_rps": sum(q["demand_rps"] for q in through)}
    return raw_pipelines, staged


def variant_engine_name(application: str, variant: str) -> str:
    return f"{application}/{variant}"


# How far back the routers' counts of query sizes are read for a problem's `query_sizes` (a distribution:
# longer than the demand's window, so that rare sizes are seen).
QUERY_SIZES_WINDOW_S = 600.0


def _ensemble_planned(snapshot: "FleetSnapshot", name: str, policy: EnsemblePolicy | None) -> dict[str, Any] | None:
    """`name`'s ensemble policy in the problem's form (engine variant names) when it answers by random
    ensembles; None for no policy, a `single` one, or none whose members with a probability > 0 are in
    the problem. Members without a variant in the problem are left out, with a note, and the probabilities
    of the others renormalised (the size bounds capped at what is left to draw)."""
    if policy is None or policy.mode == EnsembleModeChoices.SINGLE:
        return None
    raw = ensemble_policy_to_dict(policy.engine_policy())
    planned = [dict(m, variant=variant_engine_name(name, m["variant"])) for m in raw["members"]]
    missing = [m["variant"] for m, p in zip(raw["members"], planned) if p["variant"] not in snapshot.variants]
    planned = [m for m in planned if m["variant"] in snapshot.variants]
    mass = sum(m["probability"] for m in planned)
    drawable = sum(1 for m in planned if m["probability"] > 0)
    if missing:
        if not drawable:
            snapshot.notes.append(f"ensemble of {name} left out (planned one variant per query): none of its members with a "
                                  f"probability > 0 is planned ({', '.join(missing)} not in the problem)")
            return None
        snapshot.notes.append(f"ensemble of {name}: members {', '.join(missing)} are not in the problem (no profile on this fleet) "
                              f"and are left out; the others' probabilities are renormalised")
        for m in planned:
            m["probability"] = m["probability"] / mass
    raw["members"] = planned
    raw["max_size"] = min(raw["max_size"], drawable)
    raw["min_size"] = min(raw["min_size"], raw["max_size"])
    return raw


def gpu_device_type(model_name: str) -> str:
    """The device type of a GPU in problems and profiles: its MIG catalogue name or that of a known GPU
    without MIG (NVML's "NVIDIA GeForce RTX 2080 Ti" is RTX-2080Ti), else its NVML name without the vendor
    prefix."""
    return gpu_model_canonical(model_name) or model_name.removeprefix("NVIDIA ").strip()


def _profile_device_type(device_type: str) -> str:
    return CPU_DEVICE_TYPE if device_type == CPU_DEVICE_TYPE else gpu_device_type(device_type)


def _running_slots(spec: dict, device_layouts: dict[str, tuple[str, ...] | None], variant_names: dict[int, str],
                   mps_layouts: dict[str, tuple[str, ...]] | None = None) -> dict[str, dict[str, Any]]:
    """What the host's desired state runs, per engine-local device ("gpu0", "cpu0"): slot -> engine variant.
    Only slots that exist on the device as planned count; on a CPU the first runtime by key stands for it.
    On an MPS device (`mps_layouts`: device -> its partitions "mps60@0", ...) a partition's slot holds the
    list of the variants time-sharing it (runtime keys `gpu0/mps60@0/<slot>`, in slot order)."""
    mps_layouts = mps_layouts or {}
    running: dict[str, dict[str, Any]] = {}
    shared: dict[str, dict[str, list[tuple[int, str]]]] = {}
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
        if rk.device in mps_layouts or getattr(rk, "mps_percent", None) is not None:
            # An MPS partition's model: only on an MPS device, in a partition it has.
            if rk.device in mps_layouts and getattr(rk, "mps_percent", None) is not None and rk.slot is not None \
                    and rk.placement in mps_layouts[rk.device]:
                shared.setdefault(rk.device, {}).setdefault(rk.placement, []).append((rk.slot, variant))
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
    for device, slots in shared.items():
        for slot, items in slots.items():
            variants = list(dict.fromkeys(v for _, v in sorted(items)))  # a variant once per partition
            running.setdefault(device, {})[slot] = variants
    return running


def _desired_mps_layout(spec: dict | None, index: int) -> list[str] | None:
    """The MPS layout ("mps60@0", ...) the desired state gives GPU `index`, or None when it gives none."""
    for gpu in (spec or {}).get("gpus", []):
        if isinstance(gpu, dict) and gpu.get("index") == index:
            if gpu.get("mps_enabled") and isinstance(gpu.get("mps_layout"), list):
                return list(gpu["mps_layout"])
            return None
    return None


def _mps_layout_percents(slots: list[str], allowed: tuple[int, ...]) -> list[int] | None:
    """["mps60@0", "mps40@1"] -> [60, 40] when it is a valid layout on a GPU allowing `allowed`, else None."""
    try:
        parsed = sorted((index, percent) for percent, index in (mps_placement_parse(s) for s in slots))
    except (ValueError, TypeError):
        return None
    percents = [percent for _, percent in parsed]
    if [i for i, _ in parsed] != list(range(len(parsed))) or percents != sorted(percents, reverse=True):
        return None
    return percents if not mps_layout_validate(percents, allowed=allowed) else None


def _interference(device_type: str) -> tuple[dict[str, Any] | None, str]:
    """The interference model fitted to the co-run measurements on `device_type` (with the solo profiles
    and utilisations of every variant measured, planned or not: the fit is of the GPU, not of a plan), as
    the problem's "interference", and a note; (None, note) when nothing can be fitted."""
    # Rows stored under another spelling of the type count too (as profiles do, `_profile_device_type`).
    spellings = [t for t in CorunMeasurement.objects.values_list("device_type", flat=True).distinct()
                 if _profile_device_type(t) == device_type]
    rows = list(CorunMeasurement.objects.filter(device_type__in=spellings).values_list(
        "variant_id", "batch", "partition_pct", "corunner_id", "corunner_batch", "throughput_rps", "latency_ms"))
    if not rows:
        return None, ""
    ids = {r[0] for r in rows} | {r[3] for r in rows}
    inference, mem_util = [], []
    for variant_id, slice_name, batch, latency, throughput, l2, dram in Profile.objects.filter(
            variant_id__in=ids, device_type__in=spellings, slice__startswith="mps").values_list(
            "variant_id", "slice", "batch_size", "latency_p50_ms", "throughput_rps", "l2_util_pct", "dram_util_pct"):
        percent = mps_slice_percent(slice_name)
        if percent is None:
            continue
        inference.append(GpuletPoint(str(variant_id), batch, percent, float(throughput or 0.0), float(latency)))
        if l2 is not None and dram is not None:
            mem_util.append(GpuletMemUtil(str(variant_id), batch, percent, float(dram), float(l2)))
    coruns = [GpuletCorun(str(a), batch, pct, str(b), b_batch, float(throughput or 0.0), float(latency))
              for a, batch, pct, b, b_batch, throughput, latency in rows]
    build = interference_samples_build(inference, coruns, mem_util)
    unjoined = "; ".join(f"{n} {reason}" for reason, n in sorted(build.unjoined.items()))
    if not build.samples:
        return None, (f"{len(rows)} co-run measurements on {device_type}, none joined with solo MPS profiles and their "
                      f"utilisations ({unjoined}): MPS partitions planned without an interference model")
    model = interference_model_fit(build.samples, form=INTERFERENCE_FORM_DEFAULT)
    note = (f"interference model ({model.form}) fitted to {len(build.samples)} co-run samples on {device_type}"
            + (f" ({len(rows) - len(build.samples)} measurements not joined: {unjoined})" if unjoined else ""))
    return {"form": model.form, "coefficients": list(model.coefficients)}, note


@dataclass
class _DeviceSection:
    """The fleet's planned devices in the problem's form, and what the other sections read of them."""

    raw: list[dict[str, Any]] = field(default_factory=list)
    nvml_models: list = field(default_factory=list)  # GpuModelSpec described from NVML, for MIG GPUs the catalogue lacks
    layouts: dict[int, dict[str, tuple[str, ...] | None]] = field(default_factory=dict)  # host id -> local device -> MIG layout
    mps_layouts: dict[int, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # host id -> local device -> MPS slots
    types: set[str] = field(default_factory=set)
    mps_types: list[str] = field(default_factory=list)  # the type of each MPS device, in device order
    artifact_types: set[str] = field(default_factory=lambda: {CPU_DEVICE_TYPE})  # device types whose runtimes need an artifact
    latest_specs: dict[int, dict] = field(default_factory=dict)  # host id -> its latest desired state


@dataclass
class _VariantSection:
    """The planned variants and their profile points in the problem's form, and the applications seen."""

    raw_variants: list[dict[str, Any]] = field(default_factory=list)
    raw_profiles: list[dict[str, Any]] = field(default_factory=list)
    planned_apps: dict[int, Any] = field(default_factory=dict)  # applications with at least one planned variant
    seen_apps: dict[int, Any] = field(default_factory=dict)  # applications with at least one variant
    policies: dict[int, SloPolicy] = field(default_factory=dict)


def fleet_problem_build(
    *, demand: dict[str, float], options: SolveOptions | None = None, include_registered: bool = False,
    query_sizes_window_s: float = QUERY_SIZES_WINDOW_S,
) -> FleetSnapshot:
    """The planning problem of the fleet as it is now, for `demand` ({application name: rps}), with the query
    sizes the routers counted over the last `query_sizes_window_s` seconds: each section of the problem
    built by its own builder, in this order (see the module docstring for what each plans)."""
    snapshot = FleetSnapshot(problem=None)
    statuses = set(PLANNED_HOST_STATUSES) | ({HostStatusChoices.REGISTERED} if include_registered else set())
    devices = _devices_build(snapshot, statuses)
    variants = _variants_build(snapshot, devices)
    raw_pipelines, staged = _pipelines_planned(snapshot, variants.planned_apps, demand)
    raw_applications = _applications_build(snapshot, variants, staged, demand, query_sizes_window_s)
    _left_out_notes(snapshot, demand)
    if not devices.raw:
        snapshot.notes.append("nothing to plan: no host with devices is online" + (" or registered" if include_registered else ""))
        snapshot.devices, snapshot.hosts = {}, {}
        return snapshot
    if not raw_applications:
        snapshot.notes.append("nothing to plan: no application has an SLO policy and a variant profiled on this fleet")
        return snapshot
    _running_set(snapshot, devices)
    problem_raw = {
        "format_version": 1, "applications": raw_applications, "variants": variants.raw_variants, "devices": devices.raw,
        "profiles": variants.raw_profiles, "options": dataclasses.asdict(options or SolveOptions()),
    }
    if raw_pipelines:
        problem_raw["pipelines"] = raw_pipelines
    if devices.nvml_models:
        problem_raw["gpu_models"] = [gpu_model_to_dict(m) for m in devices.nvml_models]
    if devices.mps_types:
        # The MPS planners plan the type most MPS GPUs have (engine/solvers/gpulets.py): fit to its co-runs.
        interference, note = _interference(Counter(devices.mps_types).most_common(1)[0][0])
        if interference is not None:
            problem_raw["interference"] = interference
        if note:
            snapshot.notes.append(note)
    snapshot.problem = problem_from_dict(problem_raw)
    return snapshot


def _devices_build(snapshot: FleetSnapshot, statuses: set[str]) -> _DeviceSection:
    """Every device of the hosts planned (`statuses`), in the problem's form; the hosts left out, with why."""
    catalogue = mig_catalogue_load()
    section = _DeviceSection()
    hosts = list(Host.objects.order_by("name"))
    planned_hosts = [h for h in hosts if h.status in statuses]
    accelerators: dict[int, list[Accelerator]] = {}
    for accelerator in (Accelerator.objects.filter(host__in=planned_hosts)
                        .prefetch_related("gpu_instances", "mps_partitions_set").order_by("kind", "index")):
        accelerators.setdefault(accelerator.host_id, []).append(accelerator)
    for state in HostDesiredState.objects.filter(host__in=planned_hosts).order_by("host_id", "-version"):
        section.latest_specs.setdefault(state.host_id, state.spec)
    for host in hosts:
        if host.status not in statuses:
            snapshot.left_out["hosts"][host.name] = HOST_LEFT_OUT_REASONS.get(host.status, host.status)
            continue
        items = accelerators.get(host.pk, [])
        if not items:
            snapshot.left_out["hosts"][host.name] = "it has no devices"
            continue
        layouts: dict[str, tuple[str, ...] | None] = {}
        mps_layouts: dict[str, tuple[str, ...]] = {}
        for accelerator in items:
            local = f"{accelerator.kind}{accelerator.index}"
            name = f"{host.name}/{local}"
            layouts[local] = None
            if accelerator.kind == AcceleratorKindChoices.CPU:
                raw, device_type = {"name": name, "type": CPU_DEVICE_TYPE, "cores": int(accelerator.cpu_cores or 1)}, CPU_DEVICE_TYPE
            else:
                raw, device_type = _gpu_device(snapshot, section, catalogue, host, accelerator, name, layouts, mps_layouts)
                if not host.simulated:
                    section.artifact_types.add(device_type)
            section.types.add(device_type)
            section.raw.append(raw)
            snapshot.devices[name] = {"host": host.pk, "host_name": host.name, "kind": accelerator.kind, "index": accelerator.index}
        snapshot.hosts[host.name] = host.pk
        section.layouts[host.pk] = layouts
        section.mps_layouts[host.pk] = mps_layouts
    return section


def _gpu_device(snapshot: FleetSnapshot, section: _DeviceSection, catalogue, host: Host, accelerator: Accelerator, name: str,
                layouts: dict[str, tuple[str, ...] | None], mps_layouts: dict[str, tuple[str, ...]]) -> tuple[dict[str, Any], str]:
    """One GPU in the problem's form and its device type: an MPS GPU, a MIG GPU with its layout, or a whole GPU."""
    local = f"{accelerator.kind}{accelerator.index}"
    spec = catalogue.gpu_model_find(accelerator.model_name)
    if spec is None and accelerator.mig_capable and accelerator.mig_enabled:
        # A MIG GPU the catalogue lacks (or knows by its board's PCI id only): planned from
        # its catalogue model, else from the NVML profile table its agent reported.
        spec = accelerator.gpu_model_planned
        if spec is not None and spec.from_nvml and all(m.name != spec.name for m in section.nvml_models):
            section.nvml_models.append(spec)
            snapshot.notes.append(f"{name}: {spec.label}: planned from the profile table NVML reports on it")
    if accelerator.mps_enabled and not accelerator.mig_enabled:
        device_type = spec.name if spec is not None else gpu_device_type(accelerator.model_name)
        raw: dict[str, Any] = {"name": name, "type": device_type, "mig": False, "mps": True}
        memory = accelerator.memory_mb or (spec.memory_mib if spec is not None else 0)
        if memory:
            raw["memory_mb"] = float(memory)
        if accelerator.mps_partitions:
            raw["mps_partitions"] = sorted(accelerator.mps_partitions)
        partitions = sorted(accelerator.mps_partitions_set.all(), key=lambda p: p.index)
        percents: list[int] | None = [p.percent for p in partitions] if partitions else None
        if percents is None:
            desired = _desired_mps_layout(section.latest_specs.get(host.pk), accelerator.index)
            if desired is not None:
                percents = _mps_layout_percents(desired, accelerator.mps_partitions_allowed)
                if percents is None:
                    snapshot.notes.append(f"{name}: the MPS layout of its latest desired state is not valid on it now; "
                                          "planned with its layout unknown")
        if percents is not None:
            raw["mps_layout"] = percents
        mps_layouts[local] = tuple(f"mps{p}@{i}" for i, p in enumerate(percents or []))
        section.mps_types.append(device_type)
        return raw, device_type
    if spec is not None and accelerator.mig_capable:
        placements = sorted((gi.placement_start, gi.profile) for gi in accelerator.gpu_instances.all())
        layout = tuple(f"{profile}@{start}" for start, profile in placements) if accelerator.mig_enabled and placements else None
        raw = {"name": name, "type": spec.name, "mig": True, "memory_mb": float(spec.memory_mib)}
        if layout is not None:
            raw["layout"] = list(layout)
        elif accelerator.mig_enabled:
            snapshot.notes.append(f"{name}: MIG is enabled with no instance; planned as a whole GPU")
        layouts[local] = layout
        return raw, spec.name
    device_type = gpu_device_type(accelerator.model_name)
    raw = {"name": name, "type": device_type, "mig": False}
    memory = accelerator.memory_mb or (spec.memory_mib if spec is not None else 0)
    if memory:
        raw["memory_mb"] = float(memory)
    return raw, device_type


def _variants_build(snapshot: FleetSnapshot, devices: _DeviceSection) -> _VariantSection:
    """Every variant of an application with an SLO policy or in a pipeline that has a profile point on a
    device type of the fleet (and can run there: an artifact where its runtime needs one), with those points."""
    section = _VariantSection(policies={p.application_id: p for p in SloPolicy.objects.select_related("application")})
    variants = list(ModelVariant.objects.select_related("application").order_by("application__name", "name"))
    profiles: dict[int, list[Profile]] = {}
    for row in Profile.objects.filter(variant__in=variants).order_by("variant_id", "device_type", "slice", "cpu_cores", "batch_size"):
        profiles.setdefault(row.variant_id, []).append(row)
    # Pipeline stages are planned through their pipeline, with or without an SLO policy of their own.
    stage_apps = set(PipelineStage.objects.values_list("application_id", flat=True))
    for variant in variants:
        application = variant.application
        section.seen_apps[application.pk] = application
        if application.pk not in section.policies and application.pk not in stage_apps:
            continue
        engine_name = variant_engine_name(application.name, variant.name)
        points = [p for p in (_profile_point(row, engine_name, variant, devices) for row in profiles.get(variant.pk, [])) if p is not None]
        if not points:
            reason = "no profile on a device type of the planned fleet"
            if variant.artifact_id is None and profiles.get(variant.pk):
                reason += " that it can run on without an artifact"
            cap = application.max_batch_size
            if cap is not None and profiles.get(variant.pk) and all(row.batch_size > cap for row in profiles[variant.pk]):
                reason = f"no profile at a batch within its application's max_batch_size ({cap})"
            snapshot.left_out["variants"][engine_name] = reason
            continue
        # One point per (device type, slice, batch): the first, should two spellings map to one type.
        unique: dict[tuple, dict[str, Any]] = {}
        for point in points:
            unique.setdefault((point["device_type"], point["slice"], point["batch"]), point)
        section.raw_profiles.extend(unique.values())
        section.raw_variants.append({"name": engine_name, "application": application.name, "accuracy": float(variant.accuracy),
                                     "memory_mb": float(variant.memory_mb or 0)})
        snapshot.variants[engine_name] = {"id": variant.pk, "application": application.name, "name": variant.name}
        section.planned_apps[application.pk] = application
    return section


def _profile_point(row: Profile, engine_name: str, variant: ModelVariant, devices: _DeviceSection) -> dict[str, Any] | None:
    """A stored profile row as the problem's profile point; None when the fleet cannot use it."""
    device_type = _profile_device_type(row.device_type)
    if device_type not in devices.types or (variant.artifact_id is None and device_type in devices.artifact_types):
        return None
    cap = variant.application.max_batch_size
    if cap is not None and row.batch_size > cap:
        return None  # the application's configuration caps its batch (Triton's max_batch_size)
    if device_type == CPU_DEVICE_TYPE:
        if not row.cpu_cores:
            return None
        slice_name = str(int(row.cpu_cores))
    else:
        slice_name = row.slice or FULL_SLICE
        if mps_slice_percent(slice_name) is not None and device_type not in devices.mps_types:
            return None  # an MPS partition's point, on a type no MPS GPU of the fleet has
    point: dict[str, Any] = {"variant": engine_name, "device_type": device_type, "slice": slice_name, "batch": int(row.batch_size),
                             "latency_ms": float(row.latency_p50_ms)}
    if row.memory_mb is not None:
        point["memory_mb"] = float(row.memory_mb)
    for name in ("l2_util_pct", "dram_util_pct"):
        if getattr(row, name) is not None:
            point[name] = float(getattr(row, name))
    return point


def _applications_build(snapshot: FleetSnapshot, variants: _VariantSection, staged: dict[str, dict[str, Any]], demand: dict[str, float],
                        query_sizes_window_s: float) -> list[dict[str, Any]]:
    """Every planned application in the problem's form: pipeline stages with their pipeline's demand and SLO,
    the others with the SLO policy's and `demand`; each with its ensemble policy and measured query sizes.
    The applications left out are named in `snapshot.left_out` with why."""
    raw_applications: list[dict[str, Any]] = []
    ensembles = {p.application_id: p for p in EnsemblePolicy.objects.prefetch_related("members__variant")}

    def answered_how(raw_app: dict[str, Any], application) -> dict[str, Any]:
        """`raw_app` with the application's ensemble policy and measured query sizes, where it has them."""
        ensemble = _ensemble_planned(snapshot, application.name, ensembles.get(application.pk))
        if ensemble is not None:
            raw_app["ensemble"] = ensemble
        sizes = application_query_sizes(application=application, window_s=query_sizes_window_s)
        if sizes is not None:
            raw_app["query_sizes"] = {str(size): p for size, p in sizes}
        return raw_app

    for app_id, application in sorted(variants.seen_apps.items(), key=lambda kv: kv[1].name):
        policy = variants.policies.get(app_id)
        if application.name in staged:
            # A pipeline stage: its demand and SLO follow from the pipeline's paths.
            raw_app: dict[str, Any] = {"name": application.name}
            if policy is not None:
                # Its own SLO stays for the queries sent to it alone (the pipeline planners use the paths').
                raw_app["slo_ms"] = float(policy.latency_p99_ms)
                if policy.min_accuracy is not None:
                    raw_app["min_accuracy"] = float(policy.min_accuracy)
                raw_app["priority"] = int(policy.priority)
            raw_applications.append(answered_how(raw_app, application))
            snapshot.applications[application.name] = {
                "id": application.pk, "slo_ms": float(policy.latency_p99_ms) if policy is not None else staged[application.name]["slo_ms"],
                "min_accuracy": policy.min_accuracy if policy is not None else None,
                "drop_rule": policy.drop_rule if policy is not None else "deadline", "demand_rps": staged[application.name]["demand_rps"],
                "pipeline": staged[application.name]["pipeline"],
            }
            continue
        if application.released:
            snapshot.left_out["applications"][application.name] = "released (the model repository's unload); load it to plan it again"
            continue
        if policy is None:
            snapshot.left_out["applications"][application.name] = "no SLO policy"
            continue
        if app_id not in variants.planned_apps:
            snapshot.left_out["applications"][application.name] = "no variant is profiled on a device type of the planned fleet"
            continue
        rps = float(demand.get(application.name, 0.0) or 0.0)
        raw_app = {"name": application.name, "slo_ms": float(policy.latency_p99_ms), "demand_rps": max(0.0, rps)}
        if policy.min_accuracy is not None:
            raw_app["min_accuracy"] = float(policy.min_accuracy)
        raw_app["priority"] = int(policy.priority)  # who is served first when demand exceeds capacity
        raw_applications.append(answered_how(raw_app, application))
        snapshot.applications[application.name] = {
            "id": application.pk, "slo_ms": float(policy.latency_p99_ms), "min_accuracy": policy.min_accuracy,
            "drop_rule": policy.drop_rule, "demand_rps": max(0.0, rps),
        }
    for app_id, policy in variants.policies.items():
        if app_id not in variants.seen_apps:
            snapshot.left_out["applications"][policy.application.name] = "no model variant"
    return raw_applications


def _left_out_notes(snapshot: FleetSnapshot, demand: dict[str, float]) -> None:
    unknown = sorted(set(demand) - set(snapshot.applications) - set(snapshot.left_out["applications"]))
    if unknown:
        snapshot.notes.append(f"demand for unknown applications ignored: {', '.join(unknown)}")
    if snapshot.left_out["hosts"]:
        snapshot.notes.append("hosts left out: " + "; ".join(f"{n} ({r})" for n, r in sorted(snapshot.left_out["hosts"].items())))
    if snapshot.left_out["applications"]:
        snapshot.notes.append(
            "applications left out: " + "; ".join(f"{n} ({r})" for n, r in sorted(snapshot.left_out["applications"].items()))
        )


def _running_set(snapshot: FleetSnapshot, devices: _DeviceSection) -> None:
    """What runs now on each device, from its host's latest desired state (only variants in the problem, on
    slots that exist), as the device's `running`."""
    variant_by_id = {info["id"]: name for name, info in snapshot.variants.items()}
    for raw in devices.raw:
        info = snapshot.devices[raw["name"]]
        local = f"{info['kind']}{info['index']}"
        spec = devices.latest_specs.get(info["host"])
        if spec:
            running = _running_slots(spec, devices.layouts[info["host"]], variant_by_id, devices.mps_layouts[info["host"]]).get(local)
            if running:
                raw["running"] = running
