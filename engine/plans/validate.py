"""An independent check of a plan against its problem.

Nothing here calls solver code, and the capacity model is re-derived from the problem's profiles rather
than read from `capacity.py`: a bug shared by a solver and the code that checks it would otherwise go
unnoticed. Only the MIG geometry rules come from `engine.geometry` (they are data from NVIDIA's tables, tested on
their own against the MIG user guide), and the MPS layout rules (allowed shares, at most 100 % in all) from
`engine.sharing.partitions`. On MPS GPUs the latency is the profile's times the instance's interference
factor, and models time-sharing a partition are checked against its round (duty cycle), Nexus-style.

The verdict lists every problem found, not just the first, each naming the instance, application or device
it is about. Errors make the plan invalid; warnings flag a plan that is legal but wasteful (a batch smaller
than the capacity model allows, a CPU running on fewer cores than it has profiles for)."""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_extended, mig_catalogue_load
from engine.geometry.layout import Placement, layout_parse, mig_layout_validate
from engine.plans.problem import CPU_DEVICE_TYPE, FULL_SLICE, DeviceSpec, Plan, PlanInstance, Problem, ProfilePoint
from engine.sharing.partitions import MpsPartition, mps_layout_format, mps_layout_validate, mps_slice_percent

__all__ = ["PlanVerdict", "plan_validate", "REL_TOL"]

# Relative tolerance for traffic, capacity, weights and accuracy: solvers work in floating point (and LP
# solvers with feasibility tolerances of about 1e-7 relative), so exact equality would reject good plans.
REL_TOL = 1e-6
# Absolute floor under the relative tolerance, in queries per second (or weight / accuracy units).
ABS_TOL = 1e-6
# Plans round latencies to 6 decimals when they are written.
LATENCY_ABS_TOL = 1e-5
# Memory sizes of MIG profiles are nominal decimal GB where nvidia-smi gave no figure.
_MIB_PER_DECIMAL_GB = 1e9 / 2**20
_PLAN_STATUSES = ("optimal", "feasible", "infeasible")
# An MPS partition in a plan's layouts: "mps60@0".
_MPS_SLOT = re.compile(r"\s*mps([0-9]+)\s*@\s*([0-9]+)\s*", re.IGNORECASE)


def _mps_slot(text: object) -> tuple[int, int] | None:
    """ "mps60@0" -> (60, 0); None when it is not an MPS slot."""
    match = _MPS_SLOT.fullmatch(text) if isinstance(text, str) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class PlanVerdict:
    valid: bool
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def __str__(self) -> str:
        head = "valid" if self.valid else f"invalid ({len(self.errors)} error{'s' if len(self.errors) != 1 else ''})"
        lines = [head] + [f"  error: {e}" for e in self.errors] + [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _close(a: float, b: float, *, scale: float | None = None) -> bool:
    """Equal within REL_TOL of the larger magnitude (or of `scale`), with ABS_TOL as a floor."""
    ref = max(abs(a), abs(b)) if scale is None else abs(scale)
    return abs(a - b) <= max(ABS_TOL, REL_TOL * ref)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _lerp(points: Sequence[ProfilePoint], batch: int, attr: str) -> float | None:
    """Linear interpolation of a profile attribute at `batch`; None outside the profiled range.
    Written out again here (not imported from capacity.py) so that the validator cross-checks it."""
    below = [p for p in points if p.batch <= batch]
    above = [p for p in points if p.batch >= batch]
    if not below or not above:
        return None
    lo = max(below, key=lambda p: p.batch)
    hi = min(above, key=lambda p: p.batch)
    y0, y1 = getattr(lo, attr), getattr(hi, attr)
    if y0 is None or y1 is None:
        return None
    if hi.batch == lo.batch:
        return float(y0)
    return y0 + (y1 - y0) * (batch - lo.batch) / (hi.batch - lo.batch)


def _memory_at(points: Sequence[ProfilePoint], batch: int, variant_memory_mb: float) -> float:
    """Memory a variant needs at `batch`: the profiled figure when every point has one, never less than
    the variant's own (batch-1) figure."""
    measured = _lerp(points, batch, "memory_mb") if all(p.memory_mb is not None for p in points) else None
    return max(measured or 0.0, variant_memory_mb)


def _slice_memory(device: DeviceSpec, slice_name: str, model: GpuModelSpec | None) -> float | None:
    """Memory of the slice an instance runs on; None means unlimited (CPU hosts, GPUs of unknown size)."""
    if device.is_cpu:
        return None
    if slice_name == FULL_SLICE:
        return device.memory_mb
    profile = model.profile_find(slice_name) if model is not None else None
    if profile is None:
        return None
    return profile.memory_gib_lgip * 1024 if profile.memory_gib_lgip else profile.memory_gb * _MIB_PER_DECIMAL_GB


def _is_mps(device: DeviceSpec) -> bool:
    """Partitioned with MPS (a device with MIG and MPS both on is treated as MIG and reported)."""
    return device.mps and not device.mig and not device.is_cpu


def _largest_usable_batch(
    points: Sequence[ProfilePoint], budget_ms: float, limit_mb: float | None, variant_memory_mb: float
) -> int | None:
    for batch in range(points[-1].batch, points[0].batch - 1, -1):
        latency = _lerp(points, batch, "latency_ms")
        if latency is None or latency > budget_ms * (1 + 1e-12):
            continue
        if limit_mb is not None and _memory_at(points, batch, variant_memory_mb) > limit_mb:
            continue
        return batch
    return None


class _Checker:
    def __init__(self, problem: Problem, plan: Plan) -> None:
        self.problem = problem
        self.plan = plan
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.catalogue = mig_catalogue_load()
        self.devices = {d.name: d for d in problem.devices}
        self.variants = {v.name: v for v in problem.variants}
        self.apps = {a.name: a for a in problem.applications}
        # Instances that passed the existence checks, keyed by id; later checks look only at these.
        self.known: dict[str, PlanInstance] = {}
        # Traffic per application, summed from the instances (never read from served_rps).
        self.assigned: dict[str, float] = {}
        # MPS instances: latency (interference included) and memory at their batch, re-derived from the
        # profiles by check_batch for the per-partition and per-GPU checks.
        self.mps_latency: dict[str, float] = {}
        self.mps_memory: dict[str, float] = {}
        # Applications that are stages of a pipeline the plan planned as one (plan.pipelines); their
        # instances' profiled batch latency, by instance id (check_pipeline_batch).
        self.pipeline_stages: set[str] = {
            st.application for p in problem.pipelines if p.name in (plan.pipelines or {}) for st in p.stages
        }
        self.stage_latency: dict[str, float] = {}

    def error(self, message: str) -> None:
        self.errors.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def run(self) -> PlanVerdict:
        self.check_header()
        self.check_instances()
        self.check_devices()
        self.check_traffic()
        self.check_routing()
        self.check_accuracy()
        self.check_pipelines()
        return PlanVerdict(valid=not self.errors, errors=tuple(self.errors), warnings=tuple(self.warnings))

    # ------------------------------------------------------------------ header

    def check_header(self) -> None:
        plan = self.plan
        if plan.status not in _PLAN_STATUSES:
            self.error(f"status {plan.status!r} is not one of {', '.join(_PLAN_STATUSES)}")
        if plan.gap is not None and (not _finite(plan.gap) or plan.gap < -ABS_TOL):
            self.error(f"gap {plan.gap!r} must be a non-negative number")
        if plan.status == "infeasible":
            self.warn("the solver reports the problem infeasible")

    # ------------------------------------------------------------------ instances

    def check_instances(self) -> None:
        seen_ids: set[str] = set()
        for inst in self.plan.instances:
            iid = inst.id
            if iid in seen_ids:
                percent = mps_slice_percent(inst.slice)
                if percent is not None:
                    self.error(
                        f"instance {iid}: variant {inst.variant} appears twice in partition mps{percent}@{inst.start} of "
                        f"{inst.device} (a variant runs at most once per partition)"
                    )
                else:
                    self.error(f"instance {iid}: listed twice (two instances on one slice)")
                continue
            seen_ids.add(iid)
            device = self.devices.get(inst.device)
            if device is None:
                self.error(f"instance {iid}: unknown device {inst.device!r}")
                continue
            variant = self.variants.get(inst.variant)
            if variant is None:
                self.error(f"instance {iid}: unknown variant {inst.variant!r}")
                continue
            if not self.check_slice(inst, device):
                continue
            if not _is_mps(device) and (inst.duty_cycle_ms is not None or inst.interference_factor != 1.0):
                kind = "a CPU host" if device.is_cpu else ("a MIG GPU" if device.mig else "a whole GPU")
                self.error(
                    f"instance {iid}: duty_cycle_ms {inst.duty_cycle_ms!r} and interference_factor {inst.interference_factor!r} "
                    f"apply only to MPS partitions, and {device.name} is {kind} (expected null and 1)"
                )
            if inst.vertical is not None:
                self.check_vertical(inst, device)
            self.known[iid] = inst
            self.check_batch(inst, device)

    def check_vertical(self, inst: PlanInstance, device: DeviceSpec) -> None:
        """In-place vertical scaling: CPU instances only, its bounds around the planned size and within the
        host, a latency model that never grows with cores."""
        v = inst.vertical
        iid = inst.id
        if not device.is_cpu:
            self.error(f"instance {iid}: vertical scaling resizes CPU instances in place, and {device.name} is not a CPU host")
            return
        if v.policy not in ("sponge", "biscale"):
            self.error(f"instance {iid}: vertical policy {v.policy!r} is not one of sponge, biscale")
        cores = int(inst.slice) if inst.slice.isdigit() else 0
        if not (1 <= v.min_cores <= cores <= v.max_cores <= (device.cores or 0)):
            self.error(f"instance {iid}: vertical scaling between {v.min_cores} and {v.max_cores} cores must hold its planned {inst.slice} "
                       f"and stay within {device.name}'s {device.cores}")
        if v.max_batch < inst.batch:
            self.error(f"instance {iid}: vertical max_batch {v.max_batch} is below the planned batch {inst.batch}")
        coefficients = (v.gamma1, v.eps1, v.delta1, v.eta1)
        if not all(_finite(x) and x >= 0 for x in coefficients) or not any(coefficients) or not (_finite(v.reserve_ms) and v.reserve_ms >= 0):
            self.error(f"instance {iid}: the vertical latency model {coefficients} needs finite coefficients >= 0, not all zero, "
                       f"and reserve_ms a finite number >= 0")

    def check_slice(self, inst: PlanInstance, device: DeviceSpec) -> bool:
        """The slice exists on the device's type and is written the way that kind of device needs."""
        iid = inst.id
        if device.is_cpu:
            # start: the instance's index on a host that runs several side by side (pipeline replicas); None
            # for a host's only instance.
            if inst.start is not None and (not isinstance(inst.start, int) or isinstance(inst.start, bool) or inst.start < 0):
                self.error(f"instance {iid}: a CPU instance's start is its index on the host (an integer >= 0) or null, got {inst.start!r}")
                return False
            if not inst.slice.isdigit() or int(inst.slice) < 1:
                self.error(f"instance {iid}: a CPU instance's slice is its number of cores, got {inst.slice!r}")
                return False
            if int(inst.slice) > (device.cores or 0):
                self.error(f"instance {iid}: uses {inst.slice} cores but {device.name} has {device.cores}")
                return False
            return True
        if _is_mps(device):
            return self.check_mps_slice(inst, device)
        if not device.mig:
            if inst.slice != FULL_SLICE or inst.start is not None:
                self.error(f"instance {iid}: {device.name} is a whole GPU (MIG off); its only slice is '{FULL_SLICE}'")
                return False
            return True
        model = self.catalogue.gpu_model_find(device.type)
        if model is None:  # problem_from_dict refuses this, but a Problem may be built by hand
            self.error(f"instance {iid}: {device.name} has MIG on but {device.type!r} is not in the MIG catalogue")
            return False
        if inst.slice == FULL_SLICE:
            # A planner free to choose the geometry may switch MIG off and run the GPU whole (the device
            # check below then wants it alone, with an empty layout); a fixed layout rules that out.
            if device.fixed_layout:
                self.error(f"instance {iid}: {device.name} has a fixed MIG layout, so it cannot run as a whole GPU")
                return False
            if inst.start is not None:
                self.error(f"instance {iid}: a whole-GPU instance has no MIG start (got {inst.start})")
                return False
            return True
        if model.profile_find(inst.slice) is None:
            self.error(f"instance {iid}: {inst.slice!r} is not a MIG profile of {model.name} (known: {', '.join(model.profile_names)})")
            return False
        if not isinstance(inst.start, int) or isinstance(inst.start, bool) or inst.start < 0:
            self.error(f"instance {iid}: a MIG instance needs a start memory slice, got {inst.start!r}")
            return False
        return True

    def check_mps_slice(self, inst: PlanInstance, device: DeviceSpec) -> bool:
        """An MPS GPU: the slice is an allowed share, and its partition is in the plan's layout."""
        iid = inst.id
        percent = mps_slice_percent(inst.slice)
        allowed = ", ".join(f"mps{p}" for p in device.mps_partitions)
        if percent is None:
            if inst.slice == FULL_SLICE:
                self.error(
                    f"instance {iid}: {device.name} is partitioned with MPS, so it cannot run a whole-GPU '{FULL_SLICE}' "
                    f"instance (its slices: {allowed})"
                )
            elif any(model.profile_find(inst.slice) is not None for model in self.catalogue.gpu_models):
                self.error(f"instance {iid}: {inst.slice!r} is a MIG profile but {device.name} is partitioned with MPS, not MIG (its slices: {allowed})")
            else:
                self.error(f"instance {iid}: {inst.slice!r} is not an MPS slice of {device.name} (its slices: {allowed})")
            return False
        if percent not in device.mps_partitions:
            self.error(f"instance {iid}: {device.name} does not allow {percent} % MPS partitions (allowed: {allowed})")
            return False
        if not isinstance(inst.start, int) or isinstance(inst.start, bool) or inst.start < 0:
            self.error(f"instance {iid}: an MPS instance needs its partition's index in the layout as start, got {inst.start!r}")
            return False
        wanted = self.plan.layouts.get(device.name)
        # A missing layouts entry is reported once, by check_devices.
        if wanted is not None and (percent, inst.start) not in {_mps_slot(w) for w in wanted}:
            self.error(
                f"instance {iid}: partition mps{percent}@{inst.start} is not in the plan's layout for {device.name} "
                f"({' '.join(map(str, wanted)) or 'empty'})"
            )
        return True

    def check_batch(self, inst: PlanInstance, device: DeviceSpec) -> None:
        """Latency and memory at the batch, re-derived from the profiles; the capacity that follows."""
        iid = inst.id
        variant = self.variants[inst.variant]
        app = self.apps.get(variant.application)
        if app is None:
            self.error(f"instance {iid}: variant {variant.name} belongs to unknown application {variant.application!r}")
            return
        points = sorted(self.problem.profiles_for(variant.name, device.type, inst.slice), key=lambda p: p.batch)
        if not points:
            self.error(f"instance {iid}: no latency profile for {variant.name} on {device.type}/{inst.slice}")
            return
        if device.is_cpu and app.name not in self.pipeline_stages:
            self.check_cpu_cores(inst, device)
        if _is_mps(device):
            self.check_mps_batch(inst, device, points)
            return
        if app.name in self.pipeline_stages:
            self.check_pipeline_batch(inst, device, points)
            return
        budget = app.slo_ms * self.problem.options.latency_budget_fraction
        limit = _slice_memory(device, inst.slice, self.catalogue.gpu_model_find(device.type) if device.mig else None)
        batch = inst.batch
        latency = self.profiled_latency(inst, device, points)
        if latency is None:
            return
        ok = True
        if latency > budget * (1 + 1e-9):
            ok = False
            self.error(
                f"instance {iid}: batch {batch} of {variant.name} takes {latency:.4g} ms, over the latency budget "
                f"{budget:.4g} ms ({self.problem.options.latency_budget_fraction:g} x SLO {app.slo_ms:g} ms of {app.name})"
            )
        memory = _memory_at(points, batch, variant.memory_mb)
        if limit is not None and memory > limit * (1 + 1e-9):
            ok = False
            self.error(f"instance {iid}: {variant.name} needs {memory:.0f} MB at batch {batch} but the {inst.slice} slice has {limit:.0f} MB")
        if not _finite(inst.latency_ms) or abs(inst.latency_ms - latency) > max(LATENCY_ABS_TOL, REL_TOL * latency):
            self.error(f"instance {iid}: latency_ms {inst.latency_ms!r} does not match the profile's {latency:.6g} ms at batch {batch}")
        capacity = batch * 1000.0 / latency
        if not _finite(inst.capacity_rps) or not _close(inst.capacity_rps, capacity):
            self.error(f"instance {iid}: capacity_rps {inst.capacity_rps!r} does not match batch/latency = {capacity:.6g} rps")
        if ok:
            best = _largest_usable_batch(points, budget, limit, variant.memory_mb)
            if best is not None and best > batch:
                self.warn(f"instance {iid}: batch {batch} is smaller than the largest usable batch {best} (capacity left unused)")
        # Traffic is checked against the capacity recomputed here, not the one the plan claims.
        self.check_assigned(inst, capacity if ok else None)

    def check_pipeline_batch(self, inst: PlanInstance, device: DeviceSpec, points: Sequence[ProfilePoint]) -> None:
        """A pipeline stage's instance: its latency and capacity from the profile at its batch. Its time is
        checked along each path (check_pipelines), not against a fraction of the application's own SLO."""
        latency = self.profiled_latency(inst, device, points)
        if latency is None:
            return
        iid = inst.id
        if not _finite(inst.latency_ms) or abs(inst.latency_ms - latency) > max(LATENCY_ABS_TOL, REL_TOL * latency):
            self.error(f"instance {iid}: latency_ms {inst.latency_ms!r} does not match the profile's {latency:.6g} ms at batch {inst.batch}")
        capacity = inst.batch * 1000.0 / latency
        if not _finite(inst.capacity_rps) or not _close(inst.capacity_rps, capacity):
            self.error(f"instance {iid}: capacity_rps {inst.capacity_rps!r} does not match batch/latency = {capacity:.6g} rps")
        self.stage_latency[iid] = latency
        self.check_assigned(inst, capacity)

    def profiled_latency(self, inst: PlanInstance, device: DeviceSpec, points: Sequence[ProfilePoint]) -> float | None:
        """The profile's latency at the instance's batch, or None after naming what is wrong with the batch."""
        batch = inst.batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            self.error(f"instance {inst.id}: batch must be a positive whole number, got {batch!r}")
            return None
        latency = _lerp(points, batch, "latency_ms")
        if latency is None:
            self.error(f"instance {inst.id}: batch {batch} is outside the profiled range {points[0].batch}..{points[-1].batch} "
                       f"of {inst.variant} on {device.type}/{inst.slice}")
        return latency

    def check_assigned(self, inst: PlanInstance, capacity: float | None) -> None:
        """Traffic against the capacity recomputed here (None: not checked, the batch already failed)."""
        assigned = inst.assigned_rps
        if not _finite(assigned) or assigned < -ABS_TOL:
            self.error(f"instance {inst.id}: assigned_rps must be a non-negative number, got {assigned!r}")
        elif capacity is not None and assigned > capacity * (1 + REL_TOL) + ABS_TOL:
            self.error(f"instance {inst.id}: assigned {assigned:.6g} rps exceeds its capacity {capacity:.6g} rps")

    def check_mps_batch(self, inst: PlanInstance, device: DeviceSpec, points: Sequence[ProfilePoint]) -> None:
        """An MPS partition: the profile's latency times the interference factor; alone (no duty cycle) it must
        fit the latency budget, time-shared it must fit its round and a query may wait one round, then run in the
        next batch (Nexus); capacity is a batch per round."""
        iid = inst.id
        variant = self.variants[inst.variant]
        app = self.apps[variant.application]
        fraction = self.problem.options.latency_budget_fraction
        batch = inst.batch
        profiled = self.profiled_latency(inst, device, points)
        if profiled is None:
            return
        self.mps_memory[iid] = _memory_at(points, batch, variant.memory_mb)  # summed per GPU by check_devices
        factor = inst.interference_factor
        if not _finite(factor) or factor < 1:
            self.error(
                f"instance {iid}: interference_factor {factor!r} must be a finite number >= 1 "
                f"(the model on {device.name}'s other partition can only slow this one down)"
            )
            return
        latency = profiled * factor
        self.mps_latency[iid] = latency
        derived = f"{profiled:.6g} ms at batch {batch}" + (f" x interference_factor {factor:g} = {latency:.6g} ms" if factor != 1 else "")
        if not _finite(inst.latency_ms) or abs(inst.latency_ms - latency) > max(LATENCY_ABS_TOL, REL_TOL * latency):
            self.error(f"instance {iid}: latency_ms {inst.latency_ms!r} does not match the profile's {derived}")
        duty = inst.duty_cycle_ms
        ok = True
        budget = app.slo_ms * fraction
        if duty is None:
            if latency > budget * (1 + 1e-9):
                ok = False
                self.error(
                    f"instance {iid}: batch {batch} of {variant.name} takes {latency:.4g} ms (interference included), over the "
                    f"latency budget {budget:.4g} ms ({fraction:g} x SLO {app.slo_ms:g} ms of {app.name})"
                )
            capacity = batch * 1000.0 / latency
            if not _finite(inst.capacity_rps) or not _close(inst.capacity_rps, capacity):
                self.error(f"instance {iid}: capacity_rps {inst.capacity_rps!r} does not match batch/latency = {capacity:.6g} rps")
        else:
            if not _finite(duty) or duty <= 0:
                self.error(f"instance {iid}: duty_cycle_ms must be a positive number, got {duty!r}")
                return
            if latency > duty + max(LATENCY_ABS_TOL, REL_TOL * duty):
                ok = False
                self.error(
                    f"instance {iid}: batch {batch} of {variant.name} takes {latency:.4g} ms, longer than its duty cycle "
                    f"{duty:g} ms (it runs one batch every round)"
                )
            bound = 2 * budget
            if duty + latency > bound * (1 + 1e-9):
                ok = False
                self.error(
                    f"instance {iid}: duty cycle {duty:g} ms + batch latency {latency:.4g} ms = {duty + latency:.4g} ms is over "
                    f"{bound:.4g} ms (2 x {fraction:g} x SLO {app.slo_ms:g} ms of {app.name}: a query waits at most one round, "
                    f"then runs in the next batch)"
                )
            capacity = batch * 1000.0 / duty
            if not _finite(inst.capacity_rps) or not _close(inst.capacity_rps, capacity):
                self.error(f"instance {iid}: capacity_rps {inst.capacity_rps!r} does not match batch/duty cycle = {capacity:.6g} rps")
        if ok and duty is None:
            # Alone on its partition; the GPU's memory bounds one instance (check_devices sums them).
            best = _largest_usable_batch(points, budget / factor, device.memory_mb, variant.memory_mb)
            if best is not None and best > batch:
                self.warn(f"instance {iid}: batch {batch} is smaller than the largest usable batch {best} (capacity left unused)")
        self.check_assigned(inst, capacity if ok else None)

    def check_cpu_cores(self, inst: PlanInstance, device: DeviceSpec) -> None:
        counts = [
            int(p.slice) for p in self.problem.profiles
            if p.variant == inst.variant and p.device_type == CPU_DEVICE_TYPE and p.slice.isdigit() and int(p.slice) <= (device.cores or 0)
        ]
        if counts and max(counts) > int(inst.slice):
            self.warn(f"instance {inst.id}: runs on {inst.slice} cores but {device.name} has a profile for {max(counts)}")

    # ------------------------------------------------------------------ devices

    def check_devices(self) -> None:
        by_device: dict[str, list[PlanInstance]] = defaultdict(list)
        for inst in self.known.values():
            by_device[inst.device].append(inst)
        for name in self.plan.layouts:
            device = self.devices.get(name)
            if device is None:
                self.error(f"layouts: unknown device {name!r}")
            elif not device.mig and not device.mps:
                self.error(f"layouts: {name} does not use MIG; it has no partitions (neither MIG nor MPS), so it has no layout")
        for device in self.problem.devices:
            instances = by_device.get(device.name, [])
            if device.mig and device.mps:  # problem_from_dict refuses this, but a Problem may be built by hand
                self.error(f"device {device.name}: both MIG and MPS are on; a GPU is partitioned with one or the other")
            if device.mig:
                self.check_mig_device(device, instances)
            elif device.mps:
                self.check_mps_device(device, instances)
            elif device.is_cpu:
                self.check_cpu_device(device, instances)
            elif len(instances) > 1:
                self.error(f"device {device.name}: {len(instances)} instances ({', '.join(i.id for i in instances)}) on one whole GPU; at most one may run")

    def check_cpu_device(self, device: DeviceSpec, instances: list[PlanInstance]) -> None:
        """A CPU host runs one instance on some of its cores, or several, each with its index (start), whose
        cores add up to at most the host's."""
        if len(instances) > 1 and any(i.start is None for i in instances):
            self.error(
                f"device {device.name}: {len(instances)} instances ({', '.join(i.id for i in instances)}) on one CPU host, "
                f"and not every one has its index on the host (start); several instances on a host each need one"
            )
        cores = sum(int(i.slice) for i in instances)
        if cores > (device.cores or 0):
            self.error(
                f"device {device.name}: its instances take {cores} cores in all "
                f"({', '.join(f'{i.id}: {i.slice}' for i in instances)}) but it has {device.cores}"
            )

    def check_mig_device(self, device: DeviceSpec, instances: list[PlanInstance]) -> None:
        model = self.catalogue.gpu_model_find(device.type)
        if model is None:
            return  # reported per instance
        wanted = self.plan.layouts.get(device.name)
        whole = [i for i in instances if i.slice == FULL_SLICE]
        if whole:
            # MIG switched off: the whole GPU runs one instance, and no MIG instance may remain.
            if len(instances) > 1:
                self.error(f"device {device.name}: {whole[0].id} runs the whole GPU (MIG off) alongside {', '.join(i.id for i in instances if i is not whole[0])}")
            if wanted:
                self.error(f"device {device.name}: {whole[0].id} runs the whole GPU (MIG off) but the plan wants the layout {' '.join(wanted)}")
            return
        placements = [Placement(model.profile_get(i.slice).name, i.start) for i in instances]  # type: ignore[arg-type]
        if wanted is not None:
            try:
                layout = layout_parse(wanted)
            except ValueError as exc:
                self.error(f"layouts[{device.name}]: {exc}")
                return
            available = list(layout)
            for inst, placement in zip(instances, placements):
                if placement in available:
                    available.remove(placement)
                else:
                    self.error(f"instance {inst.id}: {placement} is not in the plan's layout for {device.name} ({' '.join(map(str, layout)) or 'empty'})")
        elif device.fixed_layout:
            layout = tuple(device.layout or ())  # the plan keeps the layout it was given
            for inst, placement in zip(instances, placements):
                if placement not in layout:
                    self.error(f"instance {inst.id}: {placement} is not in the fixed layout of {device.name} ({' '.join(map(str, layout)) or 'empty'})")
            layout = layout_parse(list(layout) + [p for p in placements if p not in layout])
        else:
            layout = layout_parse(placements)
        verdict = mig_layout_validate(model, layout)
        if not verdict.valid:
            self.error(f"device {device.name}: layout {' '.join(map(str, layout))} is not a valid {model.name} layout: {verdict.reason}")
        if device.fixed_layout and wanted is not None and tuple(layout) != tuple(sorted(device.layout or ())):
            self.error(
                f"device {device.name}: the layout is fixed at {' '.join(map(str, sorted(device.layout or ())))} "
                f"but the plan wants {' '.join(map(str, layout)) or 'no instances'}"
            )

    def check_mps_device(self, device: DeviceSpec, instances: list[PlanInstance]) -> None:
        """An MPS GPU: the layout the plan wants, the models time-sharing each partition, the memory they share."""
        wanted = self.plan.layouts.get(device.name)
        if wanted is None:
            if instances:
                self.error(
                    f"device {device.name}: {len(instances)} MPS instance(s) ({', '.join(i.id for i in instances)}) but the plan "
                    f"has no layouts entry for it (its partitions, e.g. ['mps60@0', 'mps40@1'])"
                )
        else:
            self.check_mps_layout(device, wanted)
        self.check_mps_partitions(device, instances)
        if device.memory_mb is not None and instances:
            needs = [(i.id, self.mps_memory.get(i.id, self.variants[i.variant].memory_mb)) for i in instances]
            total = sum(mb for _, mb in needs)
            if total > device.memory_mb * (1 + 1e-9):
                self.error(
                    f"device {device.name}: its MPS instances need {total:.0f} MB in all "
                    f"({', '.join(f'{iid}: {mb:.0f} MB' for iid, mb in needs)}) but it has {device.memory_mb:.0f} MB "
                    f"(MPS partitions share the GPU's memory)"
                )

    def check_mps_layout(self, device: DeviceSpec, wanted: Sequence[str]) -> None:
        text = " ".join(map(str, wanted)) or "empty"
        bad = [w for w in wanted if _mps_slot(w) is None]
        if bad:
            verb = "is not an MPS partition" if len(bad) == 1 else "are not MPS partitions"
            self.error(f"layouts[{device.name}]: {', '.join(map(repr, bad))} {verb} such as 'mps60@0' ({device.name} is partitioned with MPS)")
            return
        slots = [_mps_slot(w) for w in wanted]
        for problem in mps_layout_validate([MpsPartition(p, i) for p, i in slots], allowed=device.mps_partitions):  # type: ignore[misc]
            self.error(f"device {device.name}: layout {text} is not a valid MPS layout: {problem}")
        by_index = sorted(slots, key=lambda s: s[1])  # type: ignore[index]
        if any(a[0] < b[0] for a, b in zip(by_index, by_index[1:])):  # type: ignore[index]
            self.error(f"device {device.name}: layout {text} is not largest first (index 0 is the largest partition, then in order)")
        if device.fixed_layout and device.mps_layout is not None:
            percents = sorted((p for p, _ in slots), reverse=True)  # type: ignore[misc]
            if percents != sorted(device.mps_layout, reverse=True):
                self.error(
                    f"device {device.name}: the MPS layout is fixed at {mps_layout_format(device.mps_layout) or 'no partition'} "
                    f"but the plan wants {mps_layout_format(percents) or 'no partition'} ({text})"
                )

    def check_mps_partitions(self, device: DeviceSpec, instances: list[PlanInstance]) -> None:
        """Models time-sharing a partition run in rounds of one duty cycle, one batch each, and the round must fit."""
        groups: dict[str, list[PlanInstance]] = defaultdict(list)
        for inst in instances:
            groups[f"{inst.slice}@{inst.start}"].append(inst)
        for slot, members in sorted(groups.items()):
            where = f"partition {slot} of {device.name}"
            if len(members) > 1:
                missing = [i.id for i in members if i.duty_cycle_ms is None]
                if missing:
                    self.error(
                        f"{where}: {len(members)} models time-share it ({', '.join(i.id for i in members)}) but "
                        f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no duty_cycle_ms (time-sharing models run in rounds of one duty cycle)"
                    )
                    continue
            duties = [i.duty_cycle_ms for i in members if i.duty_cycle_ms is not None]
            if not duties or not all(_finite(d) and d > 0 for d in duties):
                continue  # alone with no duty cycle, or a bad duty cycle already reported per instance
            if len(members) != len(duties) or max(duties) - min(duties) > max(LATENCY_ABS_TOL, REL_TOL * max(duties)):
                self.error(
                    f"{where}: its models carry different duty cycles ("
                    + ", ".join(f"{i.id}: {'none' if i.duty_cycle_ms is None else f'{i.duty_cycle_ms:g} ms'}" for i in members)
                    + "); models time-sharing a partition share one round"
                )
                continue
            if len(members) < 2:
                continue  # alone: latency <= duty cycle is checked per instance
            latencies = [self.mps_latency.get(i.id) for i in members]
            if any(lat is None for lat in latencies):
                continue  # reported per instance
            duty = duties[0]
            total = sum(latencies)  # type: ignore[arg-type]
            if total > duty + max(LATENCY_ABS_TOL, REL_TOL * duty):
                parts = " + ".join(f"{lat:.4g} ({i.variant})" for i, lat in zip(members, latencies))
                self.error(
                    f"{where}: the round does not fit: its batches take {parts} = {total:.4g} ms but the duty cycle is {duty:g} ms "
                    f"(every model runs one batch per round)"
                )

    # ------------------------------------------------------------------ traffic

    def app_of(self, inst: PlanInstance) -> str:
        return self.variants[inst.variant].application

    def check_traffic(self) -> None:
        plan = self.plan
        assigned: dict[str, float] = defaultdict(float)
        for inst in self.known.values():
            if _finite(inst.assigned_rps):
                assigned[self.app_of(inst)] += max(0.0, inst.assigned_rps)
        self.assigned = assigned
        for key in set(plan.served_rps) | set(plan.shortfall_rps):
            if key not in self.apps:
                self.error(f"served_rps/shortfall_rps: unknown application {key!r}")
        for app in self.problem.applications:
            traffic = assigned.get(app.name, 0.0) / app.load_factor  # queries: rows over rows per query
            served = plan.served_rps.get(app.name, 0.0)
            shortfall = plan.shortfall_rps.get(app.name, 0.0)
            tol = max(ABS_TOL, REL_TOL * max(1.0, app.demand_rps))
            if not _finite(served) or not _finite(shortfall):
                self.error(f"application {app.name}: served_rps {served!r} and shortfall_rps {shortfall!r} must be numbers")
                continue
            if abs(served - traffic) > tol:
                self.error(f"application {app.name}: served_rps {served:.6g} does not equal the traffic assigned to its instances, {traffic:.6g}")
            if traffic > app.demand_rps + tol:
                self.error(f"application {app.name}: {traffic:.6g} rps assigned but its demand is {app.demand_rps:.6g} rps")
            if shortfall < -tol:
                self.error(f"application {app.name}: negative shortfall {shortfall:.6g}")
            # Solvers and plan assembly may round a shortfall within the tolerance to zero; allow for it.
            if traffic <= app.demand_rps + tol and abs(traffic + shortfall - app.demand_rps) > 2 * tol:
                self.error(
                    f"application {app.name}: shortfall misreported: served {traffic:.6g} + shortfall {shortfall:.6g} "
                    f"!= demand {app.demand_rps:.6g} (shortfall should be {max(0.0, app.demand_rps - traffic):.6g})"
                )
        if _finite(plan.gpus_used):
            used = {i.device for i in self.known.values() if not self.devices[i.device].is_cpu}
            if plan.gpus_used != len(used):
                self.error(f"gpus_used {plan.gpus_used} but instances run on {len(used)} GPU(s)")

    # ------------------------------------------------------------------ routing

    def check_routing(self) -> None:
        plan = self.plan
        # The instance that passed the checks wins over a later duplicate with the same id.
        ids = {**{i.id: i for i in reversed(plan.instances)}, **self.known}
        for app_name, entries in plan.routing.items():
            if app_name not in self.apps:
                self.error(f"routing: unknown application {app_name!r}")
                continue
            served = self.assigned.get(app_name, 0.0)
            total = 0.0
            routed: set[str] = set()
            for entry in entries:
                where = f"routing[{app_name}] -> {entry.instance}"
                if not _finite(entry.weight) or entry.weight < 0:
                    self.error(f"{where}: weight must be a non-negative number, got {entry.weight!r}")
                    continue
                total += entry.weight
                inst = ids.get(entry.instance)
                if inst is None:
                    self.error(f"{where}: no such instance in the plan")
                    continue
                if entry.instance in routed:
                    self.error(f"{where}: instance listed twice")
                    continue
                routed.add(entry.instance)
                variant = self.variants.get(inst.variant)
                if variant is not None and variant.application != app_name:
                    self.error(f"{where}: the instance runs {inst.variant}, a variant of {variant.application}, not of {app_name}")
                    continue
                if served > 0 and entry.instance in self.known and _finite(inst.assigned_rps):
                    share = max(0.0, inst.assigned_rps) / served
                    if not _close(entry.weight, share, scale=1.0):
                        self.error(f"{where}: weight {entry.weight:.6g} does not match the instance's share {share:.6g} of the traffic")
            if served > 0:
                if not _close(total, 1.0, scale=1.0):
                    self.error(f"routing[{app_name}]: weights sum to {total:.6g}, not 1")
            elif total > ABS_TOL:
                self.error(f"routing[{app_name}]: routes traffic (weights sum to {total:.6g}) but no instance is assigned any")
        for inst in self.known.values():
            app_name = self.app_of(inst)
            if inst.assigned_rps > ABS_TOL and inst.id not in {e.instance for e in plan.routing.get(app_name, [])}:
                self.error(f"instance {inst.id}: assigned {inst.assigned_rps:.6g} rps of {app_name} but missing from its routing")

    # ------------------------------------------------------------------ accuracy

    def check_accuracy(self) -> None:
        plan = self.plan
        weighted: dict[str, float] = defaultdict(float)
        for inst in self.known.values():
            if _finite(inst.assigned_rps) and inst.assigned_rps > 0:
                weighted[self.app_of(inst)] += inst.assigned_rps * self.variants[inst.variant].accuracy
        total_traffic = sum(self.assigned.values())
        for app in self.problem.applications:
            traffic = self.assigned.get(app.name, 0.0)
            claimed = plan.accuracy_by_application.get(app.name)
            if traffic <= 0:
                continue  # an accuracy claimed for an unserved application is meaningless but harmless
            accuracy = weighted[app.name] / traffic
            if claimed is not None and (not _finite(claimed) or not _close(claimed, accuracy, scale=1.0)):
                self.error(f"application {app.name}: accuracy_by_application {claimed!r} does not match the recomputed {accuracy:.6g}")
            if app.min_accuracy is not None and accuracy < app.min_accuracy - ABS_TOL:
                shortfall = plan.shortfall_rps.get(app.name, 0.0)
                message = f"application {app.name}: accuracy {accuracy:.6g} is below its min_accuracy {app.min_accuracy:g}"
                if _finite(shortfall) and shortfall <= max(ABS_TOL, REL_TOL * app.demand_rps):
                    self.error(message + " although the plan claims full service")
                else:
                    self.warn(message + " (the plan reports a shortfall)")
        for key in plan.accuracy_by_application:
            if key not in self.apps:
                self.error(f"accuracy_by_application: unknown application {key!r}")
        effective = sum(weighted.values()) / total_traffic if total_traffic > 0 else None
        claimed = plan.effective_accuracy
        if effective is None:
            if claimed is not None:
                self.error(f"effective_accuracy {claimed!r} but no traffic is served")
        elif claimed is None or not _finite(claimed) or not _close(claimed, effective, scale=1.0):
            self.error(f"effective_accuracy {claimed!r} does not match the recomputed {effective:.6g}")

    # ------------------------------------------------------------------ pipelines

    def check_pipelines(self) -> None:
        """Every pipeline the plan planned as one: each stage runs one variant at one batch on all its
        instances (P1.3, P3.10d), as the plan's summary says; every path's end-to-end time, the sum over its
        stages of the profiled batch latency and the worst-case wait (b - 1) / lambda_s (P1.2, P3.7, lambda_s
        the demand of every path through the stage), is within its SLO; the stage's capacity covers its
        rate, or the shortfall says it does not."""
        summaries = self.plan.pipelines or {}
        if not isinstance(summaries, dict):
            self.error(f"pipelines: expected an object of pipeline -> summary, got {type(summaries).__name__}")
            return
        known = {p.name: p for p in self.problem.pipelines}
        for name in summaries:
            if name not in known:
                self.error(f"pipelines: unknown pipeline {name!r}")
        by_app: dict[str, list[PlanInstance]] = defaultdict(list)
        for inst in self.known.values():
            by_app[self.app_of(inst)].append(inst)
        for name, spec in known.items():
            summary = summaries.get(name)
            if summary is None:
                continue
            stages = summary.get("stages") if isinstance(summary, dict) else None
            if not isinstance(stages, dict):
                self.error(f"pipelines[{name}]: expected a summary with 'stages'")
                continue
            time_at: dict[str, float] = {}
            for st in spec.stages:
                app = st.application
                instances = by_app.get(app, [])
                stated = stages.get(app)
                if not instances:
                    if isinstance(stated, dict) and stated.get("replicas_placed"):
                        self.error(f"pipelines[{name}].stages[{app}]: {stated['replicas_placed']} replicas placed but the plan has no instance of {app}")
                    continue
                pairs = sorted({(i.variant, i.batch) for i in instances})
                if len(pairs) > 1:
                    self.error(f"pipeline {name}, stage {app}: its instances run {', '.join(f'{v} at batch {b}' for v, b in pairs)}; "
                               f"a stage runs one variant at one batch")
                    continue
                variant, batch = pairs[0]
                if st.variant is not None and variant != st.variant:
                    self.error(f"pipeline {name}, stage {app}: runs {variant} but the pipeline pins {st.variant}")
                if not isinstance(stated, dict) or stated.get("variant") != variant or stated.get("batch") != batch:
                    self.error(f"pipelines[{name}].stages[{app}]: the summary says {stated!r} but the instances run {variant} at batch {batch}")
                latencies = [self.stage_latency[i.id] for i in instances if i.id in self.stage_latency]
                if len(latencies) != len(instances):
                    continue  # reported per instance
                rate = sum(q.demand_rps for q in spec.paths if app in q.stages)
                wait = 0.0 if batch == 1 else (math.inf if rate <= 0 else 1000.0 * (batch - 1) / rate)
                time_at[app] = max(latencies) + wait
                capacity = sum(i.batch * 1000.0 / lat for i, lat in zip(instances, latencies))
                shortfall = self.plan.shortfall_rps.get(app, 0.0)
                if capacity < rate * (1 - REL_TOL) - ABS_TOL and not (_finite(shortfall) and shortfall > ABS_TOL):
                    self.error(f"pipeline {name}, stage {app}: its instances serve {capacity:.6g} rps but the paths through it bring "
                               f"{rate:.6g} rps, and the plan reports no shortfall")
            for q in spec.paths:
                if not all(s in time_at for s in q.stages):
                    continue
                total = sum(time_at[s] for s in q.stages)
                if total > q.slo_ms * (1 + 1e-9):
                    parts = " + ".join(f"{time_at[s]:.4g} ({s})" for s in q.stages)
                    self.error(f"pipeline {name}, path {q.name}: {parts} = {total:.4g} ms is over its SLO {q.slo_ms:g} ms "
                               f"(each stage: profiled batch latency + (b - 1) / rate)")


def plan_validate(problem: Problem, plan: Plan) -> PlanVerdict:
    """Check `plan` against `problem` without trusting any of the plan's derived figures: every device,
    variant and slice exists; MIG layouts are legal (and unchanged on fixed-layout GPUs); one instance per
    whole GPU, a CPU host's instances within its cores; each batch fits the latency budget and the slice's memory (warning when a larger batch
    would); traffic stays within capacity; routing weights are consistent; served, shortfall and accuracy
    figures add up. On MPS GPUs: the layout is legal (allowed shares, at most 100 %, largest first, unchanged
    when fixed), latencies include the interference factor, the models time-sharing a partition share one
    duty cycle that their batches fit in and that leaves each query its SLO, and the instances fit the GPU's
    memory together. The problem's GPU models described from NVML are checked like catalogue models."""
    with mig_catalogue_extended(problem.gpu_models):
        return _Checker(problem, plan).run()
