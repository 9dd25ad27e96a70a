"""Proteus's resource manager (Ahmad et al., "Proteus: A High-Throughput Inference-Serving System with
Accuracy Scaling", ASPLOS'24, §4 "Resource Management", Eq. (1)-(7)): choose one model variant per device
and split each application's traffic over the devices so that all demand is served at the highest
effective accuracy.

The paper's MILP (§4, Table 1): x_{d,m} in {0, 1} hosts variant m on device d, y_{d,q} in [0, 1] is the
share of query type q sent to d, z_{d,q} the rate of q that d serves.
    (1) sum_m x_{d,m} <= 1                     at most one variant per device
    (2) sum_d y_{d,q} <= 1                     shares of a query type sum to at most 1
    (3) sum_{m,d} B_{m,q} x_{d,m} y_{d,q} = sum_d y_{d,q}    a device only gets types its variant serves
    (4) sum_q z_{d,q} <= sum_q y_{d,q} s_q     served <= assigned
    (5) z_{d,q} <= sum_m P_{d,m,q} x_{d,m}     served <= the variant's peak throughput on d
    (6) sum_d z_{d,q} = s_q                    all demand served
    (7) max sum_q a_q, a_q the accuracy-weighted traffic of q (effective accuracy)
P_{d,m,q} is the capacity estimate of §4 ("Estimation of throughput capacity", see
`engine/plans/capacity.py`). When (6) is infeasible, the paper lowers s_q a little and solves again
("Solving the MILP").

Departure: the model is linearised and counted by identical slots (`model.py`), and infeasible demand is
handled by exact lexicographic solves (max-min served fraction per priority tier, then served traffic, then
accuracy; see `model._fair_shares_solve`) instead of lowering s_q step by step, so that no application is
starved for another's throughput; per-application `min_accuracy` is an extra constraint.

Devices here: whole GPUs (slice `full`), MIG GPUs with their current layout treated as fixed instances (a
MIG GPU without a layout runs whole as `full`; Eq. (1) then holds per MIG instance, not per GPU), and CPU
hosts (one instance on the core count `cpu_slice` picks). Identical devices are grouped and counted (see
`model.py`)."""
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
