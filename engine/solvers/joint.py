"""Joint planner: the Proteus accuracy-scaling model, with the MIG geometry of every GPU that has no
`fixed_layout` chosen by the solver as well.

Sources: the model is Proteus's MILP (ASPLOS'24, §4, Eq. (1)-(7); see `model.py`), whose devices are
fixed; the geometry choice answers the question Garrison (DAC'24) answers with Algorithm 1 (§4.2: how many
GPU instances of each size), and keeping unchanged instances where they are follows Garrison's partial
reconfiguration (§3, item 7 of Figure 4: only the instances that change are re-partitioned).
Departure: neither paper chooses MIG geometry, variants and traffic in one MILP; the geometry here is the
one that maximises accuracy at the demand, not Garrison's proportional split of the slices (Algorithm 1).

Per GPU class (type, memory, current layout) a candidate configuration is one of:
- a MIG geometry, as a vector of instance counts per profile: the distinct count vectors of the maximal
  valid layouts without `+me` profiles (38 on an A100), plus the current layout's own counts;
- the whole GPU (MIG off, slice `full`);
- unused (left as it is, running nothing).
Integer variables count how many GPUs of the class take each candidate (see `model.py`), so identical GPUs
are never told apart inside the solver. Each candidate's concrete layout is the one with its counts that is
closest to the current layout (fewest instances destroyed plus created, by `mig_layout_diff`), so
instances that can stay where they are do; with `reconfiguration_penalty` > 0 each destroyed or created
instance costs that much in the objective, and keeping the current geometry (or leaving the GPU unused)
costs nothing."""
from __future__ import annotations

import functools
from collections import defaultdict

from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_load
from engine.geometry.layout import Layout, layout_counts, mig_counts_to_layout, mig_layout_diff, mig_layouts_enumerate
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


@functools.lru_cache(maxsize=16)
def candidate_counts(spec: GpuModelSpec) -> tuple[CountsKey, ...]:
    """Distinct instance-count vectors of the maximal layouts without media-extension (`+me`) profiles:
    a `+me` instance is a 1g instance with the media engines, which no profile here asks for."""
    media = {p.name for p in spec.profiles if p.media_extensions}
    keys = {_counts_key(layout) for layout in mig_layouts_enumerate(spec, maximal=True) if not any(p.profile in media for p in layout)}
    return tuple(sorted(keys))


def _instances_changed(spec: GpuModelSpec, current: Layout, target: Layout) -> int:
    diff = mig_layout_diff(spec, current, target)
    return len(diff.destroy) + len(diff.create)


def _mig_configs(slots: dict[SlotKey, SlotClass], problem: Problem, device: DeviceSpec) -> tuple[DeviceConfig, ...]:
    spec = mig_catalogue_load().gpu_model_get(device.type)
    current = tuple(sorted(device.layout)) if device.layout is not None else None
    configs: list[DeviceConfig] = [unused_config(current)]
    configs.append(whole_config(slots, problem, device, mig_off=True, instances_changed=len(current) if current else 0))
    keys = list(candidate_counts(spec))
    if current:
        configs.append(layout_config(slots, problem, device, current, name="current"))
        keys = [k for k in keys if k != _counts_key(current)]
    realisations = _layouts_by_counts(spec)
    for key in keys:
        if current:
            layout, changed = realisation_pick(realisations[key], current, lambda a, b: _instances_changed(spec, a, b))
        else:
            found = mig_counts_to_layout(spec, dict(key))
            assert found is not None  # the counts come from a valid layout
            layout, changed = found, 0
        configs.append(layout_config(slots, problem, device, layout, instances_changed=changed))
    return tuple(configs)


def joint_fleet(problem: Problem) -> Fleet:
    slots: dict[SlotKey, SlotClass] = {}
    classes: list[DeviceClass] = []
    groups = devices_group(
        problem.devices,
        lambda d: (d.type, d.memory_mb, d.cores, d.mig, d.fixed_layout, tuple(sorted(d.layout)) if d.layout is not None else None),
    )
    for devices in groups:
        device = devices[0]
        if device.is_cpu:
            classes.append(DeviceClass(devices, (cpu_config(slots, problem, device),), is_gpu=False))
        elif not device.mig:
            classes.append(DeviceClass(devices, (whole_config(slots, problem, device), unused_config()), is_gpu=True))
        elif device.fixed_layout and device.layout is not None:
            layout = tuple(sorted(device.layout))
            classes.append(DeviceClass(devices, (layout_config(slots, problem, device, layout, name="fixed"), unused_config(layout)), is_gpu=True))
        else:
            classes.append(DeviceClass(devices, _mig_configs(slots, problem, device), is_gpu=True))
    return Fleet(problem=problem, device_classes=classes, slot_classes=slots)


def joint_solve(problem: Problem) -> Plan:
    return fleet_solve(joint_fleet(problem), solver_name="joint")
