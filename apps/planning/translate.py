"""Translating an engine plan into what the fleet runs: each planned host's desired state (the spec the
deployments service takes, `host_desired_state_set`) and each application's routing table (the routes
`routing_tables_publish` takes).

- Desired states: every planned host gets one, with an empty runtime list where the plan runs nothing on
  it. A MIG GPU the plan uses gets the plan's layout (MIG off where it runs a whole-GPU instance); one it
  leaves idle keeps the layout it has; an MPS GPU likewise gets the plan's partitions (`mps_layout`). Each
  plan instance becomes a runtime keyed by where it runs (`runtime_key`), with its variant's id, its batch
  size and the proteus batching policy; on an MPS partition, one runtime per model time-sharing it, with
  the partition's percent and duty cycle and Nexus's policy.
- Routing tables: `engine.dataplane.routing.routing_tables_from_plan`, the same derivation the simulator
  and the plan run's prediction route with, each route's engine instance id replaced by the data plane's
  instance id ("<host>/<runtime key>") and its variant's id. The weights are the engine table's, unchanged:
  what routers draw from is what the prediction simulated.

The translation only reads; every desired state it produces is put through the deployments service's own
check (a dry run), so that a plan that applying would refuse fails its plan run instead."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

from django.core.exceptions import ValidationError

from apps.deployments.services import host_desired_state_validate
from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, Host
from apps.registry.selectors import application_batching_overrides
from engine.dataplane.batching import DEFAULT_BATCHING_POLICY
from engine.dataplane.rounds import ROUND_BATCHING_POLICY
from engine.dataplane.routing import routing_tables_from_plan
from engine.geometry.names import instance_id
from engine.plans.problem import FULL_SLICE, Problem
from engine.plans.problem import Plan as EnginePlan
from engine.sharing.partitions import mps_slice_percent

__all__ = ["PlanTranslation", "gpu_spec_current", "plan_translate", "runtime_key"]


@dataclass(frozen=True)
class PlanTranslation:
    """What applying a plan would write. `desired_states`: {host name: desired-state spec (POST form)};
    `routing`: {application: [{"instance": "<host>/<runtime key>", "variant": id, "weight": w, "batch": b}]}, weights
    summing to 1 (an empty list where the application gets no capacity); `problems`: why applying would
    fail (an empty list when it would not)."""

    desired_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    routing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Target:
    """Where an engine instance runs in the fleet."""

    instance: str  # "<host>/<runtime key>"
    variant: int  # ModelVariant id
    batch: int  # its planned batch size (the runtime's max_batch)


def runtime_key(*, device: Mapping[str, Any], slice_name: str, start: int | None, slot: int | None = None) -> str:
    """The runtime key of an instance on `device` (a plan's `devices` entry): "gpu0/3g.20gb@4" on a MIG
    slice, "gpu0" on a whole GPU, "cpu0/2" for a CPU's instance with index 2 (a host runs several pipeline replicas side by side;
    its only instance is "cpu0/0"), "gpu0/mps60@0/1"
    for the model in `slot` of an MPS partition (several models time-share one)."""
    if device["kind"] == AcceleratorKindChoices.CPU:
        return f"cpu{device['index']}/{start or 0}"
    if mps_slice_percent(slice_name) is not None:
        return f"gpu{device['index']}/{slice_name}@{start}/{slot or 0}"
    if start is not None:
        return f"gpu{device['index']}/{slice_name}@{start}"
    return f"gpu{device['index']}"


def pipeline_stage_slos(engine_plan: EnginePlan) -> dict[str, float]:
    """Per pipeline stage application, the latency its runtimes batch for: its share of the tightest path
    through it, the planned time at the stage (batch latency + queueing) scaled by that path's SLO over its
    planned latency (>= 1), as FA2 splits each path's SLO over its stages. Stages run with no SLO policy of
    their own; this is what their batching policy keeps to."""
    out: dict[str, float] = {}
    for summary in (engine_plan.pipelines or {}).values():
        for app, stage in summary.get("stages", {}).items():
            scales = [q["slo_ms"] / q["latency_ms"] for q in summary.get("paths", {}).values()
                      if app in q["stages"] and q.get("latency_ms")]
            if scales and stage.get("budget_ms"):
                out[app] = round(stage["budget_ms"] * max(1.0, min(scales)), 3)
    return out


def gpu_spec_current(*, accelerator: Accelerator) -> dict[str, Any]:
    """The GPU as it is now, in desired-state form: {index, mig_enabled, layout} and, on an MPS GPU,
    {mps_enabled, mps_layout}."""
    layout = [gi.placement for gi in sorted(accelerator.gpu_instances.all(), key=lambda g: g.placement_start)] if accelerator.mig_enabled else []
    spec: dict[str, Any] = {"index": accelerator.index, "mig_enabled": bool(accelerator.mig_enabled), "layout": layout}
    if accelerator.mps_enabled:
        spec.update(mps_enabled=True, mps_layout=[p.slot for p in sorted(accelerator.mps_partitions_set.all(), key=lambda p: p.index)])
    return spec


def plan_translate(
    *, problem: Problem, engine_plan: EnginePlan, devices: Mapping[str, Mapping[str, Any]], variant_ids: Mapping[str, int],
) -> PlanTranslation:
    """Each planned host's desired state and each application's routes for `engine_plan` (see the module
    docstring). `devices` maps engine device names to {host, host_name, kind, index} (the snapshot's),
    `variant_ids` engine variant names to ModelVariant ids."""
    problems: list[str] = []
    host_ids = sorted({d["host"] for d in devices.values()})
    hosts = {h.pk: h for h in Host.objects.filter(pk__in=host_ids)}
    accelerators = {
        (a.host_id, a.kind, a.index): a
        for a in Accelerator.objects.filter(host_id__in=host_ids).prefetch_related("gpu_instances")
    }
    specs: dict[str, dict[str, Any]] = {}
    for name, info in sorted(devices.items()):
        host = hosts.get(info["host"])
        if host is None:
            problems.append(f"{name}: its host no longer exists")
            continue
        specs.setdefault(host.name, {"gpus": [], "runtimes": []})
    instances_by_device: dict[str, list] = defaultdict(list)
    for inst in engine_plan.instances:
        instances_by_device[inst.device].append(inst)
    stage_slos = pipeline_stage_slos(engine_plan)
    own_batching = application_batching_overrides(names=[a.name for a in problem.applications])
    device_names = {d.name for d in problem.devices}
    targets: dict[str, _Target] = {}  # engine instance id -> where it runs
    for name, info in sorted(devices.items(), key=lambda kv: (kv[1]["host_name"], kv[1]["kind"], kv[1]["index"])):
        host = hosts.get(info["host"])
        if host is None:
            continue
        spec = specs[host.name]
        device = problem.device(name) if name in device_names else None
        if info["kind"] == AcceleratorKindChoices.GPU:
            accelerator = accelerators.get((host.pk, "gpu", info["index"]))
            if accelerator is None:
                problems.append(f"{name}: the GPU is no longer in the inventory")
                continue
            if device is not None and device.mps and not device.mig:
                if name in engine_plan.layouts:
                    gpu = {"index": info["index"], "mig_enabled": False, "layout": [], "mps_enabled": True,
                           "mps_layout": list(engine_plan.layouts[name])}
                else:
                    gpu = gpu_spec_current(accelerator=accelerator)  # idle and left as it is
            elif device is not None and device.mig:
                if name in engine_plan.layouts:
                    layout = list(engine_plan.layouts[name])
                    whole = any(i.slice == FULL_SLICE for i in instances_by_device.get(name, []))
                    gpu = {"index": info["index"], "mig_enabled": (not whole) and (bool(layout) or accelerator.mig_enabled),
                           "layout": [] if whole else layout}
                else:
                    gpu = gpu_spec_current(accelerator=accelerator)  # idle and left as it is
            else:
                gpu = {"index": info["index"], "mig_enabled": False, "layout": []}
            spec["gpus"].append(gpu)
        slots: dict[str, int] = defaultdict(int)  # MPS partition -> models placed in it so far
        for inst in sorted(instances_by_device.get(name, []), key=lambda i: (i.start if i.start is not None else -1, i.slice)):
            variant_id = variant_ids.get(inst.variant)
            if variant_id is None:
                problems.append(f"{inst.id}: variant {inst.variant} is no longer in the registry")
                continue
            mps_percent = mps_slice_percent(inst.slice)
            partition = f"{inst.slice}@{inst.start}"
            cpu = info["kind"] == AcceleratorKindChoices.CPU
            key = runtime_key(device=info, slice_name=inst.slice, start=inst.start, slot=slots[partition])
            slots[partition] += 1
            runtime: dict[str, Any] = {
                "key": key, "device": f"{info['kind']}{info['index']}",
                "placement": partition if inst.start is not None and not cpu else None,
                "cpu_threads": int(inst.slice) if cpu else None,
                "application": problem.variant(inst.variant).application, "variant": variant_id, "max_batch": int(inst.batch),
                # The models of an MPS partition take turns in rounds (gpulets, Nexus's duty cycles): each sizes
                # its batch when its turn comes and drops early what cannot make it, which is Nexus's policy.
                "batching": {"policy": ROUND_BATCHING_POLICY if mps_percent is not None else DEFAULT_BATCHING_POLICY},
            }
            app_name = problem.variant(inst.variant).application
            if mps_percent is None and app_name in own_batching:  # the application's configuration (Triton's delay)
                policy, params = own_batching[app_name]
                runtime["batching"] = {"policy": policy, "params": dict(params)}
            stage_slo = stage_slos.get(app_name)
            if stage_slo is None and problem.pipeline_of(app_name) is not None:
                stage_slo = problem.application(app_name).slo_ms  # a stage planned on its own: its SLO (the path's unless it has one)
            if stage_slo is not None:
                runtime["batching"]["slo_ms"] = stage_slo
            if inst.vertical is not None and cpu:
                runtime["vertical"] = inst.vertical.to_desired()
            if mps_percent is not None:
                # Its slot in the round comes after the planned turns (batch latency, interference included)
                # of the models before it: the live rounds time them as the simulator does.
                runtime.update(mps_percent=mps_percent, duty_cycle_ms=inst.duty_cycle_ms, turn_ms=round(float(inst.latency_ms), 6))
            spec["runtimes"].append(runtime)
            targets[inst.id] = _Target(instance_id(host.name, key), variant_id, int(inst.batch))
    for spec in specs.values():
        spec["gpus"].sort(key=lambda g: g["index"])
        spec["runtimes"].sort(key=lambda r: r["key"])
    # One derivation of the routing tables (the simulator's). A route to an instance that has no runtime
    # above is left out: the plan fails anyway, on a problem recorded above or on the validator's.
    tables = routing_tables_from_plan(engine_plan)
    routing: dict[str, list[dict[str, Any]]] = {}
    for application in problem.applications:
        table = tables.get(application.name)
        routing[application.name] = [
            {"instance": targets[engine_id].instance, "variant": targets[engine_id].variant, "weight": weight,
             "batch": targets[engine_id].batch}
            for engine_id, weight in (table.entries if table is not None else ())
            if engine_id in targets
        ]
    # What applying would write must pass the same checks applying makes (dry run, nothing stored).
    by_name = {h.name: h for h in hosts.values()}
    for host_name, spec in sorted(specs.items()):
        try:
            host_desired_state_validate(host=by_name[host_name], spec=spec)
        except ValidationError as exc:
            problems += [f"desired state of {host_name}: {message}" for message in exc.messages]
    return PlanTranslation(desired_states=specs, routing=routing, problems=problems)
