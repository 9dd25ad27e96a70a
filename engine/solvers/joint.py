"""Joint planner: the Proteus accuracy-scaling model, with the MIG geometry of every GPU that has no
`fixed_layout` chosen by the solver as well.

Sources: the model is Proteus's MILP (ASPLOS'24, §4, Eq. (1)-(7); see `model.py`), whose devices are
fixed; the geometry choice answers the question Garrison (DAC'24) answers with Algorithm 1 (§4.2: how many
GPU instances of each size), and keeping unchanged instances where they are follows Garrison's partial
reconfiguration (§3, item 7 of Figure 4: only the instances that change are re-partitioned).
Departure: neither paper chooses MIG geometry, variants and traffic in one MILP; the geometry here is the
one that maximises accuracy at the demand, not Garrison's proportional split of the slices (Algorithm 1).

Per GPU class (type, memory, current layout) a candidate configuration is one of:
- the current layout;
- a MIG geometry, as a vector of instance counts per profile (`candidate_layouts`): without a
  reconfiguration penalty the distinct count vectors of the maximal valid layouts without `+me` profiles
  (38 on an A100); with a penalty those of every valid layout (77 on an A100, non-maximal ones and the
  current layout plus any instances beside it included), less those another candidate dominates;
- the whole GPU (MIG off, slice `full`);
- unused (left as it is, running nothing).
Integer variables count how many GPUs of the class take each candidate (see `model.py`), so identical GPUs
are never told apart inside the solver. Each candidate's concrete layout is the one with its counts that is
closest to the current layout (fewest instances destroyed plus created, by `mig_layout_diff`), so
instances that can stay where they are do; with `reconfiguration_penalty` > 0 each destroyed or created
instance costs that much in the objective, and keeping the current geometry (or leaving the GPU unused)
costs nothing. With every superset of the current layout a candidate, an optimal penalised plan never
scores worse than the best plan that keeps every current instance. Departure (from the maximal layouts
alone): with a penalty, a maximal layout can add several instances where one would do."""
from __future__ import annotations

import functools
from collections import Counter, defaultdict
from typing import Mapping

from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_load
from engine.geometry.layout import Layout, layout_counts, mig_counts_to_layout, mig_layouts_enumerate
from engine.plans.problem import DeviceSpec, Plan, Problem
from engine.solvers.model import (
    DeviceClass,
    DeviceConfig,
    Fleet,
    SlotClass,
    SlotKey,
    cpu_config,
    devices_group,
    fleet_solve,
    layout_config,
    realisation_pick,
    unused_config,
    whole_config,
)

CountsKey = tuple[tuple[str, int], ...]  # sorted (profile, count) pairs


def _counts_key(layout: Layout) -> CountsKey:
    return tuple(sorted(layout_counts(layout).items()))


@functools.lru_cache(maxsize=16)
def _layouts_by_counts(spec: GpuModelSpec) -> dict[CountsKey, tuple[Layout, ...]]:
    """Every valid layout, grouped by its instance counts: the realisations to choose a closest one from."""
    grouped: dict[CountsKey, list[Layout]] = defaultdict(list)
    for layout in mig_layouts_enumerate(spec):
        if layout:
            grouped[_counts_key(layout)].append(layout)
    return {k: tuple(v) for k, v in grouped.items()}


def _media_profiles(spec: GpuModelSpec) -> frozenset[str]:
    return frozenset(p.name for p in spec.profiles if p.media_extensions)


@functools.lru_cache(maxsize=16)
def candidate_counts(spec: GpuModelSpec) -> tuple[CountsKey, ...]:
    """Distinct instance-count vectors of the maximal layouts without media-extension (`+me`) profiles:
    a `+me` instance is a 1g instance with the media engines, which no profile here asks for."""
    media = _media_profiles(spec)
    keys = {_counts_key(layout) for layout in mig_layouts_enumerate(spec, maximal=True) if not any(p.profile in media for p in layout)}
    return tuple(sorted(keys))


def _instances_changed(current: Layout, target: Layout) -> int:
    """MIG instances destroyed plus created to go from one valid layout to another: what `mig_layout_diff`
    counts (an instance survives when profile and start match), without re-validating both layouts."""
    kept = sum((Counter(current) & Counter(target)).values())
    return len(current) + len(target) - 2 * kept


def _dominates(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return all(a.get(profile, 0) >= count for profile, count in b.items())


@functools.lru_cache(maxsize=64)
def candidate_layouts(spec: GpuModelSpec, current: Layout | None, penalised: bool) -> tuple[tuple[Layout, int], ...]:
    """The MIG geometries a GPU with layout `current` may take besides `current` itself, each as its concrete
    layout and the instances destroyed plus created to reach it.

    Without a reconfiguration penalty every change is free, and a maximal layout offers at least the slots
    of any layout inside it, so the maximal count vectors suffice (`candidate_counts`). With a penalty a
    smaller change can be worth more than a bigger geometry: every count vector of a valid layout is a
    candidate (supersets of `current` included, so adding one instance beside the kept ones is one
    change, not the several a maximal layout may need), dropping only those another candidate dominates
    (at least as many instances of every profile for no more changes): more slots at no more cost never
    make a plan worse under any objective. `+me` profiles appear only as far as `current` has them."""
    realisations = _layouts_by_counts(spec)
    current_counts = layout_counts(current) if current else {}
    current_key = _counts_key(current) if current else None
    if not penalised:
        keys = [k for k in candidate_counts(spec) if k != current_key]
    else:
        media = _media_profiles(spec)
        keys = [k for k in realisations if k != current_key and all(n <= current_counts.get(p, 0) for p, n in k if p in media)]
    picked: list[tuple[CountsKey, Layout, int]] = []
    for key in keys:
        if current:
            layout, changed = realisation_pick(realisations[key], current, _instances_changed)
        else:
            found = mig_counts_to_layout(spec, dict(key))
            assert found is not None  # the counts come from a valid layout
            layout, changed = found, 0
        picked.append((key, layout, changed))
    if penalised:
        rivals = picked + ([(current_key, current, 0)] if current else [])
        picked = [
            (key, layout, changed) for key, layout, changed in picked
            if not any(
                other != key and changed_other <= changed and _dominates(dict(other), dict(key))
                for other, _, changed_other in rivals
            )
        ]
    return tuple((layout, changed) for _, layout, changed in picked)


def _mig_configs(slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec) -> tuple[DeviceConfig, ...]:
    spec = mig_catalogue_load().gpu_model_get(device.type)
    current = tuple(sorted(device.layout)) if device.layout is not None else None
    configs: list[DeviceConfig] = [unused_config(current)]
    configs.append(whole_config(slots, problem, device, mig_off=True, instances_changed=len(current) if current else 0))
    if current:
        configs.append(layout_config(slots, problem, device, current, name="current"))
    penalised = problem.options.reconfiguration_penalty > 0
    for layout, changed in candidate_layouts(spec, current or None, penalised):
        configs.append(layout_config(slots, problem, device, layout, instances_changed=changed))
    return tuple(configs)


def joint_device_key(device: DeviceSpec) -> tuple:
    """What makes devices identical to the joint model (and the fleet model): they are counted together."""
    return (device.type, device.memory_mb, device.cores, device.mig, device.mps, device.fixed_layout,
            tuple(sorted(device.layout)) if device.layout is not None else None, device.mps_partitions, device.mps_layout)


def joint_device_class(slots: dict[SlotKey, SlotClass], problem: Problem, devices: tuple[DeviceSpec, ...]) -> DeviceClass:
    """The configurations of identical devices: a CPU host's one, a whole GPU or unused, a MIG GPU's fixed
    layout or every candidate geometry."""
    device = devices[0]
    if device.is_cpu:
        return DeviceClass(devices, (cpu_config(slots, problem, device),), is_gpu=False)
    if not device.mig:
        return DeviceClass(devices, (whole_config(slots, problem, device), unused_config()), is_gpu=True)
    if device.fixed_layout and device.layout is not None:
        layout = tuple(sorted(device.layout))
        return DeviceClass(devices, (layout_config(slots, problem, device, layout, name="fixed"), unused_config(layout)), is_gpu=True)
    return DeviceClass(devices, _mig_configs(slots, problem, device), is_gpu=True)


def joint_fleet(problem: Problem) -> Fleet:
    slots: dict[SlotKey, SlotClass] = {}
    classes = [joint_device_class(slots, problem, devices) for devices in devices_group(problem.devices, joint_device_key)]
    return Fleet(problem=problem, device_classes=classes, slot_classes=slots)


def joint_solve(problem: Problem) -> Plan:
    return fleet_solve(joint_fleet(problem), solver_name="joint")
