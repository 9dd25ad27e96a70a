"""Proteus (Ahmad et al., "Proteus: A High-Throughput Inference-Serving System with Accuracy Scaling",
ASPLOS'24): choose one model variant per device and split each application's traffic over the devices
so that all demand is served at the highest effective accuracy.

As in the paper, devices are fixed and each runs at most one variant at its largest batch within the SLO
budget; traffic splits are continuous; the objective is accuracy-weighted served traffic over total
demand. Where the paper lowers its throughput target (beta) until its MILP becomes feasible, this solver
maximises served throughput first and then accuracy at that throughput (the same limit, reached in two
exact solves rather than a descending search). Per-application `min_accuracy` is an extra constraint.

Devices here: whole GPUs (slice `full`), MIG GPUs with their current layout treated as fixed instances (a
MIG GPU without a layout runs whole as `full`), and CPU hosts (one instance on the core count `cpu_slice`
picks). Identical devices are grouped and counted (see `model.py`)."""
from __future__ import annotations

from engine.plans.problem import Plan, Problem
from engine.solvers.model import (
    DeviceClass,
    Fleet,
    SlotClass,
    SlotKey,
    cpu_config,
    devices_group,
    fleet_solve,
    layout_config,
    unused_config,
    whole_config,
)


def proteus_fleet(problem: Problem) -> Fleet:
    """Device classes with the one configuration each device has (plus `unused`, so min-gpus can count)."""
    slots: dict[SlotKey, SlotClass] = {}
    classes: list[DeviceClass] = []
    whole_mig: list[str] = []
    groups = devices_group(problem.devices, lambda d: (d.type, d.memory_mb, d.cores, d.mig, tuple(sorted(d.layout)) if d.layout is not None else None))
    for devices in groups:
        device = devices[0]
        if device.is_cpu:
            classes.append(DeviceClass(devices, (cpu_config(slots, problem, device),), is_gpu=False))
        elif device.mig and device.layout is not None:
            layout = tuple(sorted(device.layout))
            classes.append(DeviceClass(devices, (layout_config(slots, problem, device, layout), unused_config(layout)), is_gpu=True))
        else:
            if device.mig:
                whole_mig.extend(d.name for d in devices)
            classes.append(DeviceClass(devices, (whole_config(slots, problem, device, mig_off=device.mig), unused_config()), is_gpu=True))
    notes = []
    if whole_mig:
        notes.append(f"MIG GPUs without a layout run whole (slice 'full'): {', '.join(sorted(whole_mig))}")
    return Fleet(problem=problem, device_classes=classes, slot_classes=slots, notes=notes)


def proteus_solve(problem: Problem) -> Plan:
    return fleet_solve(proteus_fleet(problem), solver_name="proteus")
