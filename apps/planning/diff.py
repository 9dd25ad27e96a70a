"""The diff of a plan against what runs now: what applying it changes, per host (MIG instances kept,
destroyed and created, MIG mode changes; MPS partitions kept, destroyed and created, MPS mode changes and
the duty cycles of kept partitions; runtimes added, removed, changed in variant, batch, duty cycle or turn,
resized in place (a CPU runtime's cores or vertical-scaling bounds only: the agent resizes it without a
restart), kept) and per application (routes added, removed and re-weighted), with a summary of counts.

An MPS partition is named by its slot (`mps60@0`): it is kept when the same slot is in both layouts (its
process keeps serving), else destroyed and created. A partition's duty cycle is its models' `duty_cycle_ms`
(one value per partition; null when none of its models gives one).

The baseline is the active plan where it covers a host or an application, else the host's latest desired
state (else its GPUs as they are) and the active routing tables. Route weights are compared as shares of
each application's traffic, whatever scale the tables were written in."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

from apps.deployments.models import HostDesiredState, RoutingTable
from apps.inventory.models import Accelerator, Host
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import mig_layout_diff
from engine.geometry.names import mps_placement_parse, runtime_key_parse

from .models import Plan
from .selectors import plan_active_get
from .translate import gpu_spec_current

__all__ = ["WEIGHT_EPSILON", "plan_diff", "plan_diff_summary_text"]

# Weight changes below this (share of an application's traffic) are not listed in the diff.
WEIGHT_EPSILON = 1e-4


def _variant_of(runtime: Mapping[str, Any]) -> int | None:
    variant = runtime.get("variant")
    if isinstance(variant, Mapping):
        variant = variant.get("id")
    return variant if isinstance(variant, int) and not isinstance(variant, bool) else None


def milliseconds(value: Any) -> float | None:
    """A duration in ms as the diff compares and records it (None when not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return round(float(value), 6)


def _is_mps_key(key: Any) -> bool:
    try:
        return runtime_key_parse(key).is_mps
    except ValueError:
        return False


def _runtime_summary(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """What the diff compares of a runtime; a model on an MPS partition also has its partition's duty
    cycle and its own turn (ms, None where not given)."""
    summary = {"key": runtime.get("key"), "application": runtime.get("application"), "variant": _variant_of(runtime),
               "max_batch": runtime.get("max_batch")}
    if runtime.get("cpu_threads") is not None:  # a CPU runtime: its cores and in-place scaling bounds
        vertical = runtime.get("vertical") or None
        summary.update(cpu_threads=runtime.get("cpu_threads"),
                       vertical=None if vertical is None else {k: vertical.get(k) for k in ("policy", "min_cores", "max_cores")})
    if _is_mps_key(runtime.get("key")):
        summary.update(duty_cycle_ms=milliseconds(runtime.get("duty_cycle_ms")), turn_ms=milliseconds(runtime.get("turn_ms")))
    return summary


def _runtime_signature(summary: Mapping[str, Any]) -> tuple:
    return (summary["variant"], summary["max_batch"], summary["application"], summary.get("duty_cycle_ms"), summary.get("turn_ms"))


def _layout_diff(model_name: str, before: dict, after: dict) -> dict[str, Any]:
    spec = mig_catalogue_load().gpu_model_find(model_name)
    out: dict[str, Any] = {"mig_enabled": {"before": before["mig_enabled"], "after": after["mig_enabled"]},
                           "keep": [], "destroy": [], "create": []}
    old = list(before["layout"]) if before["mig_enabled"] else []
    new = list(after["layout"]) if after["mig_enabled"] else []
    if spec is None:
        return out
    try:
        diff = mig_layout_diff(spec, old, new)
    except ValueError as exc:  # a stored layout the catalogue refuses: say so rather than fail the diff
        out["error"] = str(exc)
        return out
    out.update(keep=[str(p) for p in diff.keep], destroy=[str(p) for p in diff.destroy], create=[str(p) for p in diff.create])
    return out


def partition_order(slot: str) -> tuple[int, str]:
    """Partitions by their index in the layout (a malformed slot last)."""
    try:
        return mps_placement_parse(slot)[1], slot
    except ValueError:
        return 1_000, slot


def mps_layout_slots(gpu: Mapping[str, Any] | None) -> list[str]:
    """A GPU entry's MPS partitions (slots such as "mps60@0"), by index; [] when MPS is off."""
    if not gpu or not gpu.get("mps_enabled"):
        return []
    return sorted((str(p) for p in gpu.get("mps_layout") or []), key=partition_order)


def partition_duty_cycles(runtimes: list[Mapping[str, Any]]) -> dict[tuple[int, str], float | None]:
    """{(gpu index, partition slot): duty cycle in ms} from the runtimes of the models in MPS partitions
    (the first model, by key, that gives one; None when none does)."""
    out: dict[tuple[int, str], float | None] = {}
    for runtime in sorted(runtimes, key=lambda r: str(r.get("key"))):
        try:
            key = runtime_key_parse(runtime.get("key"))
        except ValueError:
            continue
        if not key.is_mps:
            continue
        duty = milliseconds(runtime.get("duty_cycle_ms"))
        if out.get((key.index, key.placement)) is None:
            out[(key.index, key.placement)] = duty
    return out


def _partitions_diff(index: int, before: Mapping[str, Any], after: Mapping[str, Any],
                     duty_before: Mapping[tuple[int, str], float | None], duty_after: Mapping[tuple[int, str], float | None]) -> dict[str, Any]:
    """A GPU's MPS change: mode, partitions kept/destroyed/created (by slot), duty cycles of kept ones."""
    old, new = mps_layout_slots(before), mps_layout_slots(after)
    keep = [p for p in new if p in old]
    duty_cycles = [
        {"partition": p, "before": duty_before.get((index, p)), "after": duty_after.get((index, p))}
        for p in keep if duty_before.get((index, p)) != duty_after.get((index, p))
    ]
    return {"mps_enabled": {"before": bool(before.get("mps_enabled")), "after": bool(after.get("mps_enabled"))},
            "partitions": {"keep": keep, "destroy": [p for p in old if p not in new], "create": [p for p in new if p not in old]},
            "duty_cycles": duty_cycles}


def _routes_by_instance(routes: list[Mapping[str, Any]]) -> dict[str, tuple[int | None, float]]:
    total = sum(max(0.0, float(r.get("weight") or 0.0)) for r in routes)
    return {
        str(r["instance"]): (r.get("variant"), (max(0.0, float(r.get("weight") or 0.0)) / total) if total > 0 else 0.0)
        for r in routes if r.get("instance")
    }


def plan_diff(*, plan: Plan, desired_states: Mapping[str, dict], routing: Mapping[str, list]) -> dict[str, Any]:
    """What applying `desired_states` and `routing` (the plan's translation) changes, against the active plan
    where it covers a host or an application, else against the host's latest desired state and the active
    routing tables: {"against": {plan, description}, "summary": {counts}, "hosts": {...}, "routing": {...}}.

    A host's "gpus" lists each GPU that changes: {"mig_enabled": {before, after}, "keep", "destroy", "create"
    (MIG placements), "mps_enabled": {before, after}, "partitions": {"keep", "destroy", "create"} (MPS slots),
    "duty_cycles": [{"partition", "before", "after"}] (kept partitions whose duty cycle changes)}."""
    active = plan_active_get()
    if active is not None and active.pk == plan.pk:
        active = None
    hosts = {h.name: h for h in Host.objects.filter(name__in=desired_states)}
    latest: dict[int, dict] = {}
    for state in HostDesiredState.objects.filter(host__in=hosts.values()).order_by("host_id", "-version"):
        latest.setdefault(state.host_id, state.spec)
    accelerators = {
        (a.host_id, a.index): a
        for a in Accelerator.objects.filter(host__in=hosts.values(), kind="gpu").prefetch_related("gpu_instances", "mps_partitions_set")
    }
    summary = defaultdict(int)
    host_diffs: dict[str, Any] = {}
    for host_name, after_spec in sorted(desired_states.items()):
        host = hosts.get(host_name)
        if host is None:
            continue
        if active is not None and host_name in active.desired_states:
            before_spec, baseline = active.desired_states[host_name], f"plan {active.pk}"
        elif host.pk in latest:
            before_spec, baseline = latest[host.pk], f"desired state v{latest[host.pk].get('version')}"
        else:
            before_spec, baseline = {"gpus": [], "runtimes": []}, "nothing (no desired state yet)"
        before_gpus = {g["index"]: g for g in before_spec.get("gpus", [])}
        duty_before = partition_duty_cycles(before_spec.get("runtimes", []))
        duty_after = partition_duty_cycles(after_spec.get("runtimes", []))
        gpus: dict[str, Any] = {}
        for gpu in after_spec.get("gpus", []):
            accelerator = accelerators.get((host.pk, gpu["index"]))
            if accelerator is None:
                continue
            before = before_gpus.get(gpu["index"]) or gpu_spec_current(accelerator=accelerator)
            change = _layout_diff(accelerator.model_name, before, gpu)
            change.update(_partitions_diff(gpu["index"], before, gpu, duty_before, duty_after))
            mig_mode_changed = change["mig_enabled"]["before"] != change["mig_enabled"]["after"]
            mps_mode_changed = change["mps_enabled"]["before"] != change["mps_enabled"]["after"]
            partitions = change["partitions"]
            summary["mig_created"] += len(change["create"])
            summary["mig_destroyed"] += len(change["destroy"])
            summary["mig_mode_changes"] += int(mig_mode_changed)
            summary["mps_created"] += len(partitions["create"])
            summary["mps_destroyed"] += len(partitions["destroy"])
            summary["mps_mode_changes"] += int(mps_mode_changed)
            if (change["create"] or change["destroy"] or mig_mode_changed or mps_mode_changed or partitions["create"]
                    or partitions["destroy"] or change["duty_cycles"]):
                gpus[f"gpu{gpu['index']}"] = change
        old = {r["key"]: _runtime_summary(r) for r in before_spec.get("runtimes", []) if r.get("key")}
        new = {r["key"]: _runtime_summary(r) for r in after_spec.get("runtimes", [])}
        added = [new[k] for k in sorted(set(new) - set(old))]
        removed = [old[k] for k in sorted(set(old) - set(new))]
        changed = [
            {"key": k, "before": old[k], "after": new[k]}
            for k in sorted(set(old) & set(new))
            if _runtime_signature(old[k]) != _runtime_signature(new[k])
        ]
        # Only the cores or the in-place bounds of a CPU runtime: the agent resizes it where it runs (a fast
        # kind of change: no restart, its routes stay).
        resized = [
            {"key": k, "before": old[k], "after": new[k]}
            for k in sorted(set(old) & set(new))
            if _runtime_signature(old[k]) == _runtime_signature(new[k])
            and (old[k].get("cpu_threads"), old[k].get("vertical")) != (new[k].get("cpu_threads"), new[k].get("vertical"))
        ]
        kept = len(set(old) & set(new)) - len(changed) - len(resized)
        summary["runtimes_resized"] += len(resized)
        summary["runtimes_added"] += len(added)
        summary["runtimes_removed"] += len(removed)
        summary["runtimes_changed"] += len(changed)
        summary["runtimes_kept"] += kept
        host_changed = bool(gpus or added or removed or changed or resized)
        summary["hosts_changed"] += int(host_changed)
        host_diffs[host_name] = {"baseline": baseline, "changed": host_changed, "gpus": gpus,
                                 "runtimes": {"added": added, "removed": removed, "changed": changed, "resized": resized, "kept": kept}}

    if active is not None:
        routing_before = {name: list(routes) for name, routes in active.routing.items()}
    else:
        routing_before = {}
    tables = {t.application.name: t.routes for t in RoutingTable.objects.filter(active=True).select_related("application")}
    routing_diffs: dict[str, Any] = {}
    for application in sorted(set(routing) | set(routing_before) | set(tables)):
        if application not in routing:
            continue  # not in this plan: its table is not part of the diff
        before_routes = routing_before[application] if application in routing_before else tables.get(application, [])
        old = _routes_by_instance(before_routes)
        new = _routes_by_instance(routing[application])
        added = [{"instance": i, "variant": new[i][0], "weight": round(new[i][1], 6)} for i in sorted(set(new) - set(old))]
        removed = [{"instance": i, "variant": old[i][0], "weight": round(old[i][1], 6)} for i in sorted(set(old) - set(new))]
        reweighted = []
        for i in sorted(set(old) & set(new)):
            delta = new[i][1] - old[i][1]
            if abs(delta) > WEIGHT_EPSILON or old[i][0] != new[i][0]:
                reweighted.append({"instance": i, "variant_before": old[i][0], "variant_after": new[i][0],
                                   "weight_before": round(old[i][1], 6), "weight_after": round(new[i][1], 6), "delta": round(delta, 6)})
        summary["routes_added"] += len(added)
        summary["routes_removed"] += len(removed)
        summary["routes_reweighted"] += len(reweighted)
        changed = bool(added or removed or reweighted)
        summary["applications_rerouted"] += int(changed)
        routing_diffs[application] = {"changed": changed, "added": added, "removed": removed, "reweighted": reweighted}
    summary = {k: summary.get(k, 0) for k in (
        "hosts_changed", "mig_created", "mig_destroyed", "mig_mode_changes", "mps_created", "mps_destroyed", "mps_mode_changes",
        "runtimes_added", "runtimes_removed", "runtimes_changed", "runtimes_resized", "runtimes_kept", "applications_rerouted", "routes_added",
        "routes_removed", "routes_reweighted",
    )}
    summary["changes"] = sum(summary[k] for k in ("mig_created", "mig_destroyed", "mig_mode_changes", "mps_created", "mps_destroyed",
                                                   "mps_mode_changes", "runtimes_added", "runtimes_removed", "runtimes_changed",
                                                   "runtimes_resized", "routes_added", "routes_removed", "routes_reweighted"))
    against = {"plan": active.pk if active is not None else None,
               "description": f"active plan {active.pk}" if active is not None else "the hosts' latest desired states and the active routing tables"}
    return {"against": against, "summary": summary, "hosts": host_diffs, "routing": routing_diffs}


def plan_diff_summary_text(*, summary: Mapping[str, int]) -> str:
    """One line for a diff's summary: "no change", or the counts that are not 0."""
    if not summary.get("changes"):
        return "no change"
    parts = [f"{summary[k]} {label}" for k, label in (
        ("mig_destroyed", "MIG instances destroyed"), ("mig_created", "MIG instances created"),
        ("mig_mode_changes", "MIG mode changes"), ("mps_destroyed", "MPS partitions destroyed"),
        ("mps_created", "MPS partitions created"), ("mps_mode_changes", "MPS mode changes"), ("runtimes_added", "runtimes added"), ("runtimes_removed", "runtimes removed"),
        ("runtimes_changed", "runtimes changed"), ("runtimes_resized", "runtimes resized in place"),
        ("applications_rerouted", "applications rerouted"),
    ) if summary.get(k)]
    return ", ".join(parts)
