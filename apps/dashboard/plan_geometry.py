"""The plan page's "Geometry" section: per host and per GPU, the layout before the plan and the layout it
wants, drawn like the fleet page draws a GPU (the same `BlockView`/`AcceleratorView` and `block_view`
geometry of `selectors`, the same `_mig_gpu.html` markup).

Where "before" comes from. "After" is the plan's `desired_states`. "Before" is read from the plan's own
`diff`, not from the live fleet (which changes once the plan is applied) nor from `rollout["hosts"][…]
["before"]` (written only when the plan is applied, possibly long after it was made, and absent for plans
never applied). The diff was computed when the plan was made against exactly what the plan replaces (the
active plan's desired state for the host, else the host's latest desired state: its `baseline`), it is
stored with the plan and never changes, and it is what the page's Diff section lists, so the drawings and
the list always agree. A GPU the diff does not list kept its MIG mode and layout; one it lists had
`keep + destroy` (with MIG on, `mig_enabled.before`). Runtimes before = the plan's, less `added`, with
`changed` ones as they were, plus `removed`. Where the diff does not record a host or a GPU (a catalogue
error), "before" is shown as not recorded rather than guessed.

An MPS GPU (gpulets) is drawn as its partitions (`selectors.partition_view`, the same `_mps_gpu.html` as
the fleet page), each with the models time-sharing it and its duty cycle from those models' runtimes.
Before, it had the partitions `partitions.keep + partitions.destroy` of its diff entry (with MPS on,
`mps_enabled.before`); a GPU the diff does not list kept its MPS mode and partitions. A diff made before
the diff knew MPS (no `mps_created` in its summary, no `mps_enabled` in a GPU's entry) does not record an
MPS GPU's "before", so it is shown as not recorded."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator
from apps.planning.diff import milliseconds, mps_layout_slots, partition_order
from apps.registry.models import ModelVariant
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import placement_parse
from engine.geometry.names import mps_placement_parse, runtime_key_parse

from .selectors import AcceleratorView, RuntimeView, application_colour, block_view, gpu_memory_slices, mps_partitions_draw

__all__ = ["GpuGeometry", "HostGeometry", "LegendEntry", "PlanGeometry", "plan_geometry"]


@dataclass
class GpuGeometry:
    name: str  # "gpu0"
    accelerator: str  # "<host>/gpu0"
    before: AcceleratorView | None  # None: the plan does not record it
    after: AcceleratorView
    layout_changed: bool  # MIG or MPS mode, GPU instances or MPS partitions change (or "before" is not recorded)
    runtimes_changed: bool  # what runs on it changes (an MPS partition's duty cycle included)
    created: list[str] = field(default_factory=list)  # MIG instances
    destroyed: list[str] = field(default_factory=list)
    partitions_created: list[str] = field(default_factory=list)  # MPS partitions ("mps60@0"), by index
    partitions_destroyed: list[str] = field(default_factory=list)
    duty_cycle_changes: list[str] = field(default_factory=list)  # "mps60@0 round 40 → 25 ms", kept partitions

    @property
    def changed(self) -> bool:
        return self.layout_changed or self.runtimes_changed


@dataclass
class HostGeometry:
    name: str
    baseline: str  # what "before" is, as the diff names it ("desired state v3", "plan 12")
    gpus: list[GpuGeometry]

    @property
    def changed_gpus(self) -> list[GpuGeometry]:
        return [g for g in self.gpus if g.changed]

    @property
    def unchanged_gpus(self) -> list[GpuGeometry]:
        return [g for g in self.gpus if not g.changed]

    @property
    def layout_changes(self) -> int:
        return sum(g.layout_changed for g in self.gpus)


@dataclass
class LegendEntry:
    name: str
    colour: str


@dataclass
class PlanGeometry:
    hosts: list[HostGeometry]
    legend: list[LegendEntry]

    @property
    def layout_changes(self) -> int:
        return sum(h.layout_changes for h in self.hosts)


def _variant_id(runtime: Mapping[str, Any]) -> int | None:
    variant = runtime.get("variant")
    if isinstance(variant, Mapping):  # a stored desired state's document form
        variant = variant.get("id")
    return variant if isinstance(variant, int) and not isinstance(variant, bool) else None


def _active_layout(gpu: Mapping[str, Any] | None) -> list[str]:
    if not gpu or not gpu.get("mig_enabled"):
        return []
    return [str(p) for p in gpu.get("layout") or []]


def _before_state(after: Mapping[str, Any], host_diff: Mapping[str, Any], *, mps_recorded: bool = True,
                  ) -> tuple[dict[int, dict | None], list[dict]]:
    """({gpu index: {"mig_enabled", "layout", "mps_enabled", "mps_layout"} or None where not recorded},
    runtimes) before the plan, from its diff (see the module docstring). `mps_recorded`: the diff knows MPS."""
    changes = host_diff.get("gpus") or {}
    gpus: dict[int, dict | None] = {}
    for gpu in after.get("gpus", []):
        change = changes.get(f"gpu{gpu['index']}")
        if change is None:
            if gpu.get("mps_enabled") and not mps_recorded:
                gpus[gpu["index"]] = None
                continue
            gpus[gpu["index"]] = {"mig_enabled": bool(gpu.get("mig_enabled")), "layout": list(gpu.get("layout") or []),
                                  "mps_enabled": bool(gpu.get("mps_enabled")), "mps_layout": mps_layout_slots(gpu)}
        elif change.get("error") or ("mps_enabled" not in change and gpu.get("mps_enabled")):
            gpus[gpu["index"]] = None
        else:
            mig = bool((change.get("mig_enabled") or {}).get("before"))
            layout = list(change.get("keep", [])) + list(change.get("destroy", [])) if mig else []
            mps = bool((change.get("mps_enabled") or {}).get("before"))
            partitions = change.get("partitions") or {}
            mps_layout = sorted(list(partitions.get("keep", [])) + list(partitions.get("destroy", [])), key=partition_order) if mps else []
            gpus[gpu["index"]] = {"mig_enabled": mig, "layout": layout, "mps_enabled": mps, "mps_layout": mps_layout}
    rts = host_diff.get("runtimes") or {}
    added = {r.get("key") for r in rts.get("added", [])}
    changed = {c.get("key"): c.get("before") or {} for c in rts.get("changed", [])}
    runtimes = [changed.get(r.get("key"), r) for r in after.get("runtimes", []) if r.get("key") not in added]
    runtimes += list(rts.get("removed", []))
    return gpus, runtimes


def _runtimes_by_gpu(runtimes: list[Mapping[str, Any]]) -> dict[int, dict[str | None, Mapping[str, Any]]]:
    """{gpu index: {placement (None: the whole GPU; "mps60@0/1" for the model in slot 1 of an MPS
    partition): runtime}}; CPU runtimes are not drawn here."""
    out: dict[int, dict[str | None, Mapping[str, Any]]] = {}
    for runtime in runtimes:
        try:
            key = runtime_key_parse(runtime.get("key"))
        except ValueError:
            continue
        if key.kind != AcceleratorKindChoices.GPU:
            continue
        place = f"{key.placement}/{key.slot}" if key.is_mps and key.slot is not None else key.placement
        out.setdefault(key.index, {}).setdefault(place, runtime)
    return out


def _runtime_signature(slots: Mapping[str | None, Mapping[str, Any]]) -> set[tuple]:
    return {(slot, r.get("application"), _variant_id(r), r.get("max_batch"), milliseconds(r.get("duty_cycle_ms")), milliseconds(r.get("turn_ms")))
            for slot, r in slots.items()}


def _runtime_view(runtime: Mapping[str, Any] | None, variant_names: Mapping[int, str]) -> RuntimeView | None:
    if runtime is None:
        return None
    application = runtime.get("application") or None
    variant = variant_names.get(_variant_id(runtime))
    batch = runtime.get("max_batch")
    state = f"max batch {batch}" if batch else ""
    turn = milliseconds(runtime.get("turn_ms"))
    if turn is not None:  # a model in an MPS partition: its turn in the partition's round
        state = f"{state}, turn {turn:g} ms" if state else f"turn {turn:g} ms"
    return RuntimeView(key=str(runtime.get("key")), application=application, variant=variant,
                       state=state, simulated=False, colour=application_colour(application))


def _partition_models(slots: Mapping[str | None, Mapping[str, Any]], slot: str) -> list[Mapping[str, Any]]:
    """The runtimes of the models in MPS partition `slot`, by their slot in it."""
    models = []
    for place, runtime in slots.items():
        if place and place.startswith(slot + "/") and place.rsplit("/", 1)[1].isdigit():
            models.append((int(place.rsplit("/", 1)[1]), runtime))
    return [runtime for _, runtime in sorted(models, key=lambda m: m[0])]


def _duty_cycle(models: list[Mapping[str, Any]]) -> float | None:
    """A partition's duty cycle: its models' `duty_cycle_ms` (the first that gives one)."""
    return next((d for d in (milliseconds(m.get("duty_cycle_ms")) for m in models) if d is not None), None)


def _mps_partitions(*, gpu: Mapping[str, Any], slots: Mapping[str | None, Mapping[str, Any]], other: Mapping[str, Any] | None,
                    change: str, variant_names: Mapping[int, str]) -> list[dict]:
    """One side's MPS partitions as `selectors.mps_partitions_draw` takes them; those missing from `other`
    (the other side) are marked `change`."""
    other_layout = set(mps_layout_slots(other)) if other is not None else None
    partitions = []
    for slot in mps_layout_slots(gpu):
        try:
            percent, index = mps_placement_parse(slot)
        except ValueError:
            continue
        models = _partition_models(slots, slot)
        marked = other_layout is not None and slot not in other_layout
        partitions.append({
            "slot": slot, "percent": percent, "index": index,
            "state": change if marked else ("kept" if other_layout is not None else "planned"),
            "runtimes": [_runtime_view(m, variant_names) for m in models], "duty_cycle_ms": _duty_cycle(models),
            "change": change if marked else "",
        })
    return partitions


def _duty_cycle_changes(before: AcceleratorView | None, after: AcceleratorView) -> list[str]:
    """The kept MPS partitions whose duty cycle changes: "mps60@0 round 40 → 25 ms"."""
    if before is None:
        return []
    old = {p.slot: p.duty_cycle_ms for p in before.partitions}
    text = lambda v: "none" if v is None else f"{v:g}"  # noqa: E731
    return [f"{p.slot} round {text(old[p.slot])} → {text(p.duty_cycle_ms)} ms"
            for p in after.partitions if p.slot in old and old[p.slot] != p.duty_cycle_ms]


def _gpu_view(*, catalogue, index: int, model_name: str, memory_mb: int, gpu: Mapping[str, Any],
              slots: Mapping[str | None, Mapping[str, Any]], other: Mapping[str, Any] | None, change: str,
              variant_names: Mapping[int, str]) -> AcceleratorView:
    """One side of a GPU's drawing. Blocks (and MPS partitions) missing from `other` (the other side) are
    marked `change`."""
    spec = catalogue.gpu_model_find(model_name)
    mig = bool(gpu.get("mig_enabled"))
    view = AcceleratorView(name=f"gpu{index}", kind=AcceleratorKindChoices.GPU, model_name=model_name, memory_mb=memory_mb,
                           mig_enabled=mig, memory_slices=gpu_memory_slices(catalogue, model_name))
    if gpu.get("mps_enabled") and not mig:
        mps_partitions_draw(view, _mps_partitions(gpu=gpu, slots=slots, other=other, change=change, variant_names=variant_names))
        return view
    if not mig:
        view.whole_runtime = _runtime_view(slots.get(None), variant_names)
        return view
    other_layout = set(_active_layout(other)) if other is not None else None
    for text in _active_layout(gpu):
        try:
            placement = placement_parse(text)
        except ValueError:
            continue
        profile = spec.profile_find(placement.profile) if spec is not None else None
        marked = other_layout is not None and str(placement) not in other_layout
        view.blocks.append(block_view(
            placement=str(placement), profile=placement.profile, start=placement.start,
            size=profile.memory_slices if profile is not None else 1,
            state=change if marked else ("kept" if other_layout is not None else "planned"),
            runtime=_runtime_view(slots.get(str(placement)), variant_names), change=change if marked else "",
        ))
    view.blocks.sort(key=lambda b: b.start)
    return view


def plan_geometry(plan, user=None) -> PlanGeometry:
    """Per host of the plan's desired states and per GPU, the (before, after) drawings, GPUs whose layout
    or runtimes change marked, and a legend of the application colours drawn. Two queries whatever the
    size of the plan (the hosts' GPUs; the variants' names); accelerators restricted to `user` when given
    (a GPU they may not see is drawn from the plan's own snapshot)."""
    catalogue = mig_catalogue_load()
    desired = plan.desired_states or {}
    diff_hosts = (plan.diff or {}).get("hosts") or {}
    if not desired:
        return PlanGeometry(hosts=[], legend=[])
    mps_recorded = "mps_created" in ((plan.diff or {}).get("summary") or {})
    befores = {name: _before_state(spec, diff_hosts[name], mps_recorded=mps_recorded) for name, spec in desired.items() if name in diff_hosts}

    accelerators = Accelerator.objects.restrict(user, "view") if user is not None else Accelerator.objects.all()
    models = {
        (a.host.name, a.index): (a.model_name, a.memory_mb)
        for a in accelerators.filter(host__name__in=list(desired), kind=AcceleratorKindChoices.GPU).select_related("host")
    }
    # A GPU gone from the inventory since: its type as the plan's snapshot (problem) recorded it.
    snapshot_types = {d.get("name"): (d.get("type") or "", int(d.get("memory_mb") or 0))
                      for d in (plan.problem or {}).get("devices", []) if isinstance(d, Mapping)}

    variant_ids = {_variant_id(r) for spec in desired.values() for r in spec.get("runtimes", [])}
    variant_ids |= {_variant_id(r) for _gpus, runtimes in befores.values() for r in runtimes}
    variant_ids.discard(None)
    variant_names = dict(ModelVariant.objects.filter(pk__in=variant_ids).values_list("pk", "name")) if variant_ids else {}

    hosts: list[HostGeometry] = []
    applications: set[str] = set()
    for host_name, spec in sorted(desired.items()):
        before_gpus, before_runtimes = befores.get(host_name, (None, []))
        after_slots = _runtimes_by_gpu(spec.get("runtimes", []))
        before_slots = _runtimes_by_gpu(before_runtimes)
        gpus: list[GpuGeometry] = []
        for gpu in sorted(spec.get("gpus", []), key=lambda g: g["index"]):
            index = gpu["index"]
            model_name, memory_mb = models.get((host_name, index)) or snapshot_types.get(f"{host_name}/gpu{index}", ("", 0))
            before_gpu = before_gpus.get(index) if before_gpus is not None else None
            common = dict(catalogue=catalogue, index=index, model_name=model_name, memory_mb=memory_mb, variant_names=variant_names)
            after_view = _gpu_view(gpu=gpu, slots=after_slots.get(index, {}), other=before_gpu, change="created", **common)
            before_view = None
            if before_gpu is not None:
                before_view = _gpu_view(gpu=before_gpu, slots=before_slots.get(index, {}), other=gpu, change="destroyed", **common)
            after_layout, before_layout = _active_layout(gpu), _active_layout(before_gpu)
            after_partitions, before_partitions = mps_layout_slots(gpu), mps_layout_slots(before_gpu)
            layout_changed = before_gpu is None or (
                bool(gpu.get("mig_enabled")) != bool(before_gpu.get("mig_enabled")) or set(after_layout) != set(before_layout)
                or bool(gpu.get("mps_enabled")) != bool(before_gpu.get("mps_enabled")) or set(after_partitions) != set(before_partitions)
            )
            runtimes_changed = before_gpus is None or (
                _runtime_signature(after_slots.get(index, {})) != _runtime_signature(before_slots.get(index, {}))
            )
            for view in (before_view, after_view):
                if view is None:
                    continue
                applications.update(b.runtime.application for b in view.blocks if b.runtime and b.runtime.application)
                applications.update(r.application for r in view.mps_runtimes if r.application)
                if view.whole_runtime and view.whole_runtime.application:
                    applications.add(view.whole_runtime.application)
            gpus.append(GpuGeometry(
                name=f"gpu{index}", accelerator=f"{host_name}/gpu{index}", before=before_view, after=after_view,
                layout_changed=layout_changed, runtimes_changed=runtimes_changed,
                created=sorted(set(after_layout) - set(before_layout), key=lambda p: placement_parse(p).start) if before_gpu is not None else [],
                destroyed=sorted(set(before_layout) - set(after_layout), key=lambda p: placement_parse(p).start),
                partitions_created=[p for p in after_partitions if p not in before_partitions] if before_gpu is not None else [],
                partitions_destroyed=[p for p in before_partitions if p not in after_partitions],
                duty_cycle_changes=_duty_cycle_changes(before_view, after_view),
            ))
        if gpus:
            baseline = (diff_hosts.get(host_name) or {}).get("baseline") or "not recorded"
            hosts.append(HostGeometry(name=host_name, baseline=baseline, gpus=gpus))
    legend = [LegendEntry(name=name, colour=application_colour(name)) for name in sorted(applications)]
    return PlanGeometry(hosts=hosts, legend=legend)
