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
error), "before" is shown as not recorded rather than guessed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator
from apps.registry.models import ModelVariant
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import placement_parse
from engine.geometry.names import runtime_key_parse

from .selectors import AcceleratorView, RuntimeView, application_colour, block_view, gpu_memory_slices

__all__ = ["GpuGeometry", "HostGeometry", "LegendEntry", "PlanGeometry", "plan_geometry"]


@dataclass
class GpuGeometry:
    name: str  # "gpu0"
    accelerator: str  # "<host>/gpu0"
    before: AcceleratorView | None  # None: the plan does not record it
    after: AcceleratorView
    layout_changed: bool  # MIG mode or GPU instances change (or "before" is not recorded)
    runtimes_changed: bool  # what runs on it changes
    created: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)

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


def _before_state(after: Mapping[str, Any], host_diff: Mapping[str, Any]) -> tuple[dict[int, dict | None], list[dict]]:
    """({gpu index: {"mig_enabled", "layout"} or None where not recorded}, runtimes) before the plan, from
    its diff (see the module docstring)."""
    changes = host_diff.get("gpus") or {}
    gpus: dict[int, dict | None] = {}
    for gpu in after.get("gpus", []):
        change = changes.get(f"gpu{gpu['index']}")
        if change is None:
            gpus[gpu["index"]] = {"mig_enabled": bool(gpu.get("mig_enabled")), "layout": list(gpu.get("layout") or [])}
        elif change.get("error"):
            gpus[gpu["index"]] = None
        else:
            mig = bool((change.get("mig_enabled") or {}).get("before"))
            layout = list(change.get("keep", [])) + list(change.get("destroy", [])) if mig else []
            gpus[gpu["index"]] = {"mig_enabled": mig, "layout": layout}
    rts = host_diff.get("runtimes") or {}
    added = {r.get("key") for r in rts.get("added", [])}
    changed = {c.get("key"): c.get("before") or {} for c in rts.get("changed", [])}
    runtimes = [changed.get(r.get("key"), r) for r in after.get("runtimes", []) if r.get("key") not in added]
    runtimes += list(rts.get("removed", []))
    return gpus, runtimes


def _runtimes_by_gpu(runtimes: list[Mapping[str, Any]]) -> dict[int, dict[str | None, Mapping[str, Any]]]:
    """{gpu index: {placement (None: the whole GPU): runtime}}; CPU runtimes are not drawn here."""
    out: dict[int, dict[str | None, Mapping[str, Any]]] = {}
    for runtime in runtimes:
        try:
            key = runtime_key_parse(runtime.get("key"))
        except ValueError:
            continue
        if key.kind != AcceleratorKindChoices.GPU:
            continue
        out.setdefault(key.index, {}).setdefault(key.placement, runtime)
    return out


def _runtime_signature(slots: Mapping[str | None, Mapping[str, Any]]) -> set[tuple]:
    return {(slot, r.get("application"), _variant_id(r), r.get("max_batch")) for slot, r in slots.items()}


def _runtime_view(runtime: Mapping[str, Any] | None, variant_names: Mapping[int, str]) -> RuntimeView | None:
    if runtime is None:
        return None
    application = runtime.get("application") or None
    variant = variant_names.get(_variant_id(runtime))
    batch = runtime.get("max_batch")
    return RuntimeView(key=str(runtime.get("key")), application=application, variant=variant,
                       state=f"max batch {batch}" if batch else "", simulated=False, colour=application_colour(application))


def _gpu_view(*, catalogue, index: int, model_name: str, memory_mb: int, gpu: Mapping[str, Any],
              slots: Mapping[str | None, Mapping[str, Any]], other: Mapping[str, Any] | None, change: str,
              variant_names: Mapping[int, str]) -> AcceleratorView:
    """One side of a GPU's drawing. Blocks missing from `other` (the other side) are marked `change`."""
    spec = catalogue.gpu_model_find(model_name)
    mig = bool(gpu.get("mig_enabled"))
    view = AcceleratorView(name=f"gpu{index}", kind=AcceleratorKindChoices.GPU, model_name=model_name, memory_mb=memory_mb,
                           mig_enabled=mig, memory_slices=gpu_memory_slices(catalogue, model_name))
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
    befores = {name: _before_state(spec, diff_hosts[name]) for name, spec in desired.items() if name in diff_hosts}

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
            layout_changed = before_gpu is None or (
                bool(gpu.get("mig_enabled")) != bool(before_gpu.get("mig_enabled")) or set(after_layout) != set(before_layout)
            )
            runtimes_changed = before_gpus is None or (
                _runtime_signature(after_slots.get(index, {})) != _runtime_signature(before_slots.get(index, {}))
            )
            for view in (before_view, after_view):
                if view is None:
                    continue
                applications.update(b.runtime.application for b in view.blocks if b.runtime and b.runtime.application)
                if view.whole_runtime and view.whole_runtime.application:
                    applications.add(view.whole_runtime.application)
            gpus.append(GpuGeometry(
                name=f"gpu{index}", accelerator=f"{host_name}/gpu{index}", before=before_view, after=after_view,
                layout_changed=layout_changed, runtimes_changed=runtimes_changed,
                created=sorted(set(after_layout) - set(before_layout), key=lambda p: placement_parse(p).start) if before_gpu is not None else [],
                destroyed=sorted(set(before_layout) - set(after_layout), key=lambda p: placement_parse(p).start),
            ))
        if gpus:
            baseline = (diff_hosts.get(host_name) or {}).get("baseline") or "not recorded"
            hosts.append(HostGeometry(name=host_name, baseline=baseline, gpus=gpus))
    legend = [LegendEntry(name=name, colour=application_colour(name)) for name in sorted(applications)]
    return PlanGeometry(hosts=hosts, legend=legend)
