"""The capacity model every planner and the validator share: Proteus's throughput capacity estimate
(Ahmad et al., ASPLOS'24, §4 "Estimation of throughput capacity"), P_{d,m,q} = maximum allowed batch size /
profiled latency at that batch, the maximum allowed batch being the smaller of the largest batch whose
latency is at most half the SLO (Proteus cites Nexus, SOSP'19: a query arriving just after a batch starts
waits for it and is served in the next, so it may take twice the batch latency) and the largest batch
that fits the device's memory.

An instance of variant v on a slice serves batches of the largest size b such that
- the batch latency is at most `latency_budget_fraction` (1/2 by default) of the application's SLO: a
  query may wait for one batch and then be served in the next (Proteus, after Nexus), and
- the memory at that batch fits the slice.
Its capacity is b / latency(b) queries per second. Latency and memory between two profiled batch sizes are
interpolated linearly; nothing is extrapolated beyond the profiled range. A slice is a MIG profile, `full`
for a whole GPU, "mpsNN" for an MPS partition of NN % of the SMs, or a number of CPU cores; a CPU device
uses the largest profiled core count it has. MPS partitions share their GPU's memory, so the limit for one
instance on an MPS slice is the whole GPU's memory; that the instances of one GPU fit together (and the
slowdown from a co-located partition, and time-sharing a partition) is for the MPS planner and the validator.

Departure: the SLO fraction is a setting (Proteus fixes 1/2), batches between profiled sizes are
interpolated (Proteus profiles at the chosen batch), and the memory limit is the slice's, not the
device's (Proteus has no MIG)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.geometry.catalogue import mig_catalogue_load
from engine.plans.problem import CPU_DEVICE_TYPE, FULL_SLICE, DeviceSpec, Problem, ProfilePoint
from engine.sharing.partitions import mps_slice_percent

MIB_PER_DECIMAL_GB = 1e9 / 2**20


@dataclass(frozen=True)
class InstanceCapacity:
    batch: int
    latency_ms: float
    capacity_rps: float
    memory_mb: float


def profile_interpolate(points: Sequence[ProfilePoint], batch: int, attr: str) -> float | None:
    """Linear between the two profiled batches around `batch`; None outside the profiled range."""
    lower = upper = None
    for p in points:
        if p.batch <= batch:
            lower = p
        if p.batch >= batch and upper is None:
            upper = p
    if lower is None or upper is None:
        return None
    lo, hi = getattr(lower, attr), getattr(upper, attr)
    if lo is None or hi is None:
        return None
    if upper.batch == lower.batch:
        return lo
    return lo + (hi - lo) * (batch - lower.batch) / (upper.batch - lower.batch)


def instance_capacity(
    points: Sequence[ProfilePoint], *, latency_budget_ms: float, memory_limit_mb: float | None, variant_memory_mb: float
) -> InstanceCapacity | None:
    """The largest usable batch and its throughput, or None when not even the smallest batch fits."""
    points = sorted(points, key=lambda p: p.batch)
    if not points:
        return None
    with_memory = all(p.memory_mb is not None for p in points)
    for batch in range(points[-1].batch, points[0].batch - 1, -1):
        latency = profile_interpolate(points, batch, "latency_ms")
        if latency is None or latency > latency_budget_ms:
            continue
        memory = profile_interpolate(points, batch, "memory_mb") if with_memory else variant_memory_mb
        memory = max(memory or 0.0, variant_memory_mb)
        if memory_limit_mb is not None and memory > memory_limit_mb:
            continue
        return InstanceCapacity(batch=batch, latency_ms=latency, capacity_rps=batch * 1000.0 / latency, memory_mb=memory)
    return None


def slice_memory_mb(device: DeviceSpec, slice_name: str) -> float | None:
    """Memory a variant may use on a slice: the MIG instance's memory, the whole GPU's (a whole GPU, or an MPS
    partition: MPS partitions share the GPU's memory), or no limit on a CPU."""
    if device.is_cpu:
        return None
    if slice_name == FULL_SLICE or mps_slice_percent(slice_name) is not None:
        return device.memory_mb
    profile = mig_catalogue_load().gpu_model_get(device.type).profile_get(slice_name)
    # What nvidia-smi -lgip reports where the catalogue has it; else the nominal (decimal) GB in MiB.
    return profile.memory_gib_lgip * 1024 if profile.memory_gib_lgip else profile.memory_gb * MIB_PER_DECIMAL_GB


def cpu_slice(problem: Problem, variant: str, device: DeviceSpec) -> str | None:
    """The core count a CPU device runs `variant` with: the largest profiled one it has."""
    counts = sorted(
        {int(p.slice) for p in problem.profiles if p.variant == variant and p.device_type == CPU_DEVICE_TYPE and int(p.slice) <= (device.cores or 0)}
    )
    return str(counts[-1]) if counts else None


def capacity_for(problem: Problem, variant: str, device: DeviceSpec, slice_name: str) -> InstanceCapacity | None:
    """Capacity of `variant` on `slice_name` of `device` under the problem's SLO and options. Devices of one
    type and memory share the answer, so it is computed once per (variant, type, memory, slice)."""
    key = (variant, device.type, device.memory_mb, slice_name)
    cache = problem.capacity_cache
    if key not in cache:
        spec = problem.variant(variant)
        app = problem.application(spec.application)
        cache[key] = instance_capacity(
            problem.profiles_for(variant, device.type, slice_name),
            latency_budget_ms=app.slo_ms * problem.options.latency_budget_fraction,
            memory_limit_mb=slice_memory_mb(device, slice_name),
            variant_memory_mb=spec.memory_mb,
        )
    return cache[key]
