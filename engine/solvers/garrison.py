"""`garrison`: Garrison's multi-granularity GI allocation as the paper writes it (Wang et al., "Garrison: A
High-Performance GPU-Accelerated Inference System for Adversarial Ensemble Defense", DAC'24, §4; cited
in docs/references.md). The demand-sized variant Tessera had before is `garrison-demand`
(`garrison_demand.py`).

§4.1 "Profiling the Sweet Intervals" (transcribed): "after GIs reach a specific utilization range with the
increasing batch size, expanding the batch size hardly brings any further growth in throughput, while the
latency increases nearly linearly ... This range is referred to as the 'sweet interval.' ... the sweet
interval (16, 32) implies that the scheduler should distribute queries in the range to a GI(4)".
`garrison_sweet_intervals`: for each GI size g (a MIG profile, by its compute slices) the throughput
T_g(s) = s / L_g(s) over query sizes s within the SLO, and its knee K_g, the smallest s at which T_g reaches
`SATURATION` of its largest value. A query of size s belongs on the smallest GI that has not saturated
at s (K_g >= s), or, past every knee, on the GI whose knee is largest. GS[m, b] is that GI for the range's
largest size, L[m, b] its latency there.

§4.2 Algorithm 1 (transcribed; `garrison_allocate`). Input: GS[m, b], L[m, b], D[b] (the share of queries
whose size falls in range b), SP[m] (sampling probability), M (GPU slices in all). Output: N[m, b].

    1: for each model m in updated_model_pool do
    2:   for each query_size_range b do
    3:     IR[m, b] = GS[m, b] * L[m, b] * SP[m]
    6: for each model m in updated_model_pool do
    7:   for each query_size_range b do
    8:     RR[m, b] = IR[m, b] / SUM(IR[:, b])
    9:     AR[m, b] = RR[m, b] * D[b]
    10:    P[m, b] = AR[m, b] * M
    11:    N[m, b] = P[m, b] / GS[m, b]

"With one traversal of N, we can collect the demand of each model for different granularities of GIs,
which are used to reconfigure the hardware resources of the system."

The planner (`garrison_solve`): per application, the model pool is its ensemble policy's members with a
probability > 0 (SP = their probabilities), else every variant that meets min_accuracy (uniform SP); the
query-size ranges b are powers of two (1, 2-3, 4-7, ..., `query_size_ranges`) and D[b] comes from the
application's `query_sizes` (every query one row when it has none); M is the compute slices of the fleet's
MIG GPUs. N is rounded to whole instances (`allocation_round`), packed into valid MIG layouts, and each
member's instances take its share of the traffic (its inclusion rate in the ensemble times the demand, in
rows).

Where this departs, and why:
- Rounding and packing are ours: Algorithm 1 yields real N[m, b] and the paper does not say how they
  become instances; we round by largest remainder within M (every member keeps one instance) and pack by
  first-fit-decreasing into layouts `mig_counts_to_layout` accepts (garrison_fleet.py).
- Several applications (the paper serves one ensemble): M is split among applications in proportion to
  their demand in rows (equally when none has demand), and Algorithm 1 runs within each share.
- Several GPU models (the paper has A100s only): each MIG GPU model is its own pool, with its own GS and L.
- A GI size is a profile's compute slices; of the profiles with that many, the one with the fewest memory
  slices that holds the model. A GI must also serve the model under Tessera's capacity model (a batch
  within `latency_budget_fraction` of the SLO), so that every instance the plan starts can batch.
- Whole GPUs, MPS GPUs and CPUs are not allocated (Algorithm 1 divides MIG slices); `garrison-demand`
  plans those.
- Local re-partition (§3, item 7 of Figure 4: "a subset of a GPU's instances can be re-partitioned
  on-the-fly for model replacement without affecting other working instances") is done when the problem
  says what runs now (a GPU's `layout` and `running`): an instance the new allocation still asks for keeps
  its placement and the rest is packed around it (`_instances_keep`); the rollout then touches only the
  slots whose model changes. Where no valid layout holds a kept instance with the new counts it moves.
"""
from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

from engine.ensembles.sampling import inclusion_probabilities
from engine.ensembles.sizes import QuerySizeRange, query_size_ranges
from engine.geometry.catalogue import GpuModelSpec, mig_catalogue_load
from engine.plans.capacity import capacity_for, profile_interpolate, slice_memory_mb
from engine.plans.problem import ApplicationSpec, DeviceSpec, Plan, Problem, VariantSpec
from engine.solvers.assemble import RPS_EPSILON, plan_assemble
from engine.solvers.garrison_fleet import (
    GarrisonFleet,
    InstanceRequest,
    SlotKind,
    fleet_finish,
    requests_pack,
)

__all__ = [
    "SATURATION",
    "SOLVER_NAME",
    "QuerySizeRange",
    "SweetInterval",
    "allocation_round",
    "garrison_allocate",
    "garrison_solve",
    "garrison_sweet_intervals",
    "query_size_ranges",
]

SOLVER_NAME = "garrison"
# §4.1's knee: a GI has saturated at the smallest query size whose throughput is within 10 % of the most
# it reaches within the SLO ("expanding the batch size hardly brings any further growth in throughput").
SATURATION = 0.9
# Query sizes considered when finding a knee: Garrison's evaluation uses 1-64 (§6.1).
KNEE_MAX_SIZE = 64


@dataclass(frozen=True)
class SweetInterval:
    """One GI kind's sweet interval for a model (§4.1): the query sizes low..high that belong on it, its
    knee (where its throughput saturates) and its latency at `high`."""

    kind: SlotKind
    low: int
    high: int
    knee: int
    latency_ms: float


@dataclass
class _GiCurve:
    kind: SlotKind
    latency_ms: dict[int, float]  # size -> latency, only sizes within the SLO and memory
    knee: int


def _gi_curves(problem: Problem, variant: VariantSpec, spec: GpuModelSpec, device: DeviceSpec, max_size: int) -> list[_GiCurve]:
    """One curve per GI size (compute slices) the model runs on: its profile with the fewest memory slices
    that holds the model and serves it under the capacity model."""
    slo = problem.application(variant.application).slo_ms
    by_size: dict[int, _GiCurve] = {}
    for profile in sorted(spec.profiles, key=lambda p: (p.compute_slices, p.memory_slices, p.name)):
        if profile.compute_slices in by_size or capacity_for(problem, variant.name, device, profile.name) is None:
            continue
        points = problem.profiles_for(variant.name, spec.name, profile.name)
        limit = slice_memory_mb(device, profile.name)
        latency: dict[int, float] = {}
        for size in range(1, max_size + 1):
            value = profile_interpolate(points, size, "latency_ms")
            memory = max(profile_interpolate(points, size, "memory_mb") or 0.0, variant.memory_mb)
            if value is None or value <= 0 or value > slo or (limit is not None and memory > limit):
                continue
            latency[size] = value
        if not latency:
            continue
        throughput = {s: s / latency[s] for s in latency}
        best = max(throughput.values())
        knee = min(s for s, t in throughput.items() if t >= SATURATION * best)
        kind = SlotKind(spec.name, profile.name, profile.compute_slices / spec.compute_slices, profile.memory_slices)
        by_size[profile.compute_slices] = _GiCurve(kind, latency, knee)
    return [by_size[g] for g in sorted(by_size)]


def _gi_for(curves: Sequence[_GiCurve], size: int) -> _GiCurve | None:
    """The GI a query of `size` belongs on: the smallest not saturated at it, else the one whose knee is
    largest (the smaller on a tie); only GIs that serve `size` within the SLO."""
    able = [c for c in curves if size in c.latency_ms]
    if not able:
        return None
    unsaturated = [c for c in able if c.knee >= size]
    if unsaturated:
        return unsaturated[0]
    return max(able, key=lambda c: (c.knee, -c.kind.gpu_share))


def garrison_sweet_intervals(problem: Problem, variant: str, gpu_model: str | None = None) -> tuple[SweetInterval, ...]:
    """§4.1 for one variant on one MIG GPU model of the fleet (the first one when None): each GI kind's
    sweet interval over sizes 1..max(64, the application's largest query size), by size."""
    spec, device = _pools(problem)[gpu_model] if gpu_model else next(iter(_pools(problem).values()))
    v = problem.variant(variant)
    app = problem.application(v.application)
    max_size = max([KNEE_MAX_SIZE] + [s for s, _ in app.query_sizes or ()])
    curves = _gi_curves(problem, v, spec, device, max_size)
    owner: dict[int, _GiCurve] = {}
    for size in range(1, max_size + 1):
        curve = _gi_for(curves, size)
        if curve is not None:
            owner[size] = curve
    out: list[SweetInterval] = []
    for size in sorted(owner):
        curve = owner[size]
        if out and out[-1].kind == curve.kind and out[-1].high == size - 1:
            out[-1] = SweetInterval(curve.kind, out[-1].low, size, curve.knee, curve.latency_ms[size])
        else:
            out.append(SweetInterval(curve.kind, size, size, curve.knee, curve.latency_ms[size]))
    return tuple(out)


def garrison_allocate(gi_size: Mapping[tuple[str, int], float], latency_ms: Mapping[tuple[str, int], float],
                      share: Mapping[int, float], sampling: Mapping[str, float], slices: float) -> dict[tuple[str, int], float]:
    """Algorithm 1, lines 1-13, over models m and ranges b (keys (m, b) of `gi_size` and `latency_ms`;
    `share` is D[b], `sampling` SP[m], `slices` M). A (m, b) absent from `gi_size` (the model cannot serve
    range b) has IR 0; a range no model serves keeps its share of M unallocated. Returns N[m, b], real."""
    ir = {(m, b): gi_size[m, b] * latency_ms[m, b] * sampling.get(m, 0.0) for (m, b) in gi_size}  # line 3
    column = defaultdict(float)
    for (m, b), value in ir.items():
        column[b] += value
    n: dict[tuple[str, int], float] = {}
    for (m, b), value in ir.items():
        if column[b] <= 0:
            continue
        rr = value / column[b]  # line 8
        ar = rr * share.get(b, 0.0)  # line 9
        p = ar * slices  # line 10
        n[m, b] = p / gi_size[m, b]  # line 11
    return n


def allocation_round(wanted: Mapping[tuple[str, SlotKind], float], slices: int, keep: Sequence[str]) -> dict[tuple[str, SlotKind], int]:
    """Whole instances from Algorithm 1's real counts (ours; see the module docstring): floors first, one
    instance for each model in `keep` that has none (on its most wanted kind), then, while more than
    `slices` compute slices are taken, one fewer of the most over-served count; then the largest
    remainders while they fit. Deterministic."""
    cost = _compute_slices
    counts = {key: math.floor(value + 1e-9) for key, value in wanted.items()}
    for model in keep:
        own = [key for key in wanted if key[0] == model]
        if own and not any(counts[key] for key in own):
            counts[max(own, key=lambda key: (wanted[key], -cost(key[1])))] = 1
    while sum(n * cost(k) for (_, k), n in counts.items()) > slices:
        sole = {m for m in keep if sum(n for (mm, _), n in counts.items() if mm == m) == 1}
        cut = [key for key, n in counts.items() if n > 0 and not (key[0] in sole and n == 1)]
        if not cut:
            break
        key = max(cut, key=lambda key: (counts[key] - wanted[key], cost(key[1]), key[0]))
        counts[key] -= 1
    used = sum(n * cost(k) for (_, k), n in counts.items())
    for key in sorted(wanted, key=lambda key: (-(wanted[key] - counts[key]), key[0], key[1])):
        if wanted[key] - counts[key] <= 1e-9:
            break
        if used + cost(key[1]) <= slices:
            counts[key] += 1
            used += cost(key[1])
    return {key: n for key, n in counts.items() if n > 0}


def _compute_slices(kind: SlotKind) -> int:
    return mig_catalogue_load().gpu_model_get(kind.device_type).profile_get(kind.slice).compute_slices


def _pools(problem: Problem) -> dict[str, tuple[GpuModelSpec, DeviceSpec]]:
    """The fleet's MIG GPU models, each with a representative device (all of a model answer alike)."""
    catalogue = mig_catalogue_load()
    pools: dict[str, tuple[GpuModelSpec, DeviceSpec]] = {}
    for device in sorted(problem.devices, key=lambda d: d.name):
        if device.mig and device.type not in pools:
            pools[device.type] = (catalogue.gpu_model_get(device.type), device)
    return pools


def _pool_slices(problem: Problem, gpu_model: str) -> int:
    spec = mig_catalogue_load().gpu_model_get(gpu_model)
    total = 0
    for device in problem.devices:
        if device.mig and device.type == gpu_model:
            if device.fixed_layout:
                total += sum(spec.profile_get(p.profile).compute_slices for p in device.layout or ())
            else:
                total += spec.compute_slices
    return total


def _model_pool(problem: Problem, app: ApplicationSpec) -> dict[str, float]:
    """SP over the application's pool: its ensemble's members with p > 0, else its variants that meet
    min_accuracy, uniformly."""
    if app.ensemble is not None:
        return {m.variant: m.probability for m in app.ensemble.members if m.probability > 0}
    members = [v.name for v in problem.variants_of(app.name) if app.min_accuracy is None or v.accuracy >= app.min_accuracy]
    return {name: 1.0 / len(members) for name in members} if members else {}


def _inclusion_rates(app: ApplicationSpec, sampling: Mapping[str, float]) -> dict[str, float]:
    """Each member's share of the queries it answers: p_i for one variant per query; for a random ensemble the
    mean over its sizes of the inclusion probabilities (engine/ensembles/sampling.py)."""
    names = list(sampling)
    if app.ensemble is None or app.ensemble.mode == "single":
        return dict(sampling)
    sizes = range(app.ensemble.min_size, app.ensemble.max_size + 1)
    rates = sum(inclusion_probabilities([sampling[n] for n in names], k) for k in sizes) / len(sizes)
    return {n: float(r) for n, r in zip(names, rates)}


def _instances_keep(fleet: GarrisonFleet, requests: list[InstanceRequest]) -> tuple[list[InstanceRequest], int]:
    """Local re-partition (§3 item 7: "a subset of a GPU's instances can be re-partitioned on-the-fly for model
    replacement without affecting other working instances on the same GPU"): an instance that runs now (the
    problem's `layout` and `running` of a GPU without a fixed layout) and that the allocation still asks for
    (its member on that GI kind) keeps its placement, as long as a valid layout holds it with what is kept
    before it; the requests left are packed around the kept ones. Returns the requests left and how many
    instances were kept."""
    wanted = Counter((r.variant, r.kind.device_type, r.kind.slice) for r in requests)
    kept = 0
    for gpu in fleet.mig_gpus:
        device = gpu.device
        if device.fixed_layout or not device.layout or not device.running:
            continue
        running = dict(device.running)
        for placement in sorted(device.layout):
            variant = running.get(str(placement))
            key = (variant, device.type, placement.profile)
            if not variant or wanted[key] <= 0:
                continue
            counts = Counter(gpu.counts)
            counts[placement.profile] += 1
            if fleet.layout_for(gpu.spec, counts, tuple(sorted((*fleet.kept_placements(gpu), placement)))) is None:
                continue
            fleet.mig_place(gpu, variant, placement.profile, start=placement.start)
            wanted[key] -= 1
            kept += 1
    left: list[InstanceRequest] = []
    for r in requests:
        key = (r.variant, r.kind.device_type, r.kind.slice)
        if wanted[key] > 0:
            wanted[key] -= 1
            left.append(r)
    return left, kept


def garrison_solve(problem: Problem) -> Plan:
    """Algorithm 1 as written (see the module docstring), packed into MIG layouts. Status `feasible` (a
    heuristic proves no bound) or `infeasible` when demand is positive and nothing is served."""
    started = time.perf_counter()
    pools = _pools(problem)
    notes: list[str] = []
    # Each application's share of M, by its demand in rows (equal shares when none has demand).
    rows = {a.name: a.demand_rps * a.load_factor for a in problem.applications}
    total_rows = sum(rows.values())
    app_share = {a.name: (rows[a.name] / total_rows if total_rows > 0 else 1.0 / len(problem.applications)) for a in problem.applications}

    requests: list[InstanceRequest] = []
    member_rates: dict[str, float] = {}
    for app in problem.applications:
        sampling = _model_pool(problem, app)
        if not sampling:
            notes.append(f"{SOLVER_NAME}: {app.name} has no variant that meets its min_accuracy")
            continue
        rates = _inclusion_rates(app, sampling)
        for name, rate in rates.items():
            member_rates[name] = rate * app.demand_rps * app.mean_query_size
        ranges = query_size_ranges(app.query_sizes)
        max_size = max([KNEE_MAX_SIZE] + [r.size for r in ranges])
        share = {i: r.share for i, r in enumerate(ranges)}
        for gpu_model, (spec, device) in pools.items():
            slices = _pool_slices(problem, gpu_model) * app_share[app.name]
            gi_size: dict[tuple[str, int], float] = {}
            latency: dict[tuple[str, int], float] = {}
            kinds: dict[tuple[str, int], SlotKind] = {}
            for name in sampling:
                curves = _gi_curves(problem, problem.variant(name), spec, device, max_size)
                for i, r in enumerate(ranges):
                    curve = _gi_for(curves, r.size)
                    if curve is None:
                        continue
                    gi_size[name, i] = _compute_slices(curve.kind)
                    latency[name, i] = curve.latency_ms[r.size]
                    kinds[name, i] = curve.kind
            n = garrison_allocate(gi_size, latency, share, sampling, slices)
            unserved = [str(r) for i, r in enumerate(ranges) if not any((m, i) in gi_size for m in sampling)]
            if unserved:
                notes.append(f"{SOLVER_NAME}: {app.name} on {gpu_model}: no member serves query sizes {', '.join(unserved)} within the SLO")
            wanted: dict[tuple[str, SlotKind], float] = defaultdict(float)
            for (m, i), value in n.items():
                wanted[m, kinds[m, i]] += value  # one traversal of N: demand per model and granularity
            counts = allocation_round(wanted, math.floor(slices + 1e-9), [m for m in sampling if any(k[0] == m for k in wanted)])
            notes.append(f"{SOLVER_NAME}: {app.name} on {gpu_model} ({slices:.3g} slices): N = " + ", ".join(
                f"{m} {kind.slice} {wanted[m, kind]:.3g}->{counts.get((m, kind), 0)}" for (m, kind) in sorted(wanted)))
            for (m, kind), count in sorted(counts.items()):
                requests.extend(InstanceRequest(m, kind, rank) for rank in range(count))

    fleet = GarrisonFleet(problem)
    requests, kept = _instances_keep(fleet, requests)
    if kept:
        notes.append(f"{SOLVER_NAME}: {kept} instance(s) keep serving where they run; only the rest of their GPUs is re-partitioned "
                     "(MIG's local reconfiguration, §3 item 7)")
    unplaced = requests_pack(fleet, requests)
    if unplaced:
        notes.append(f"{SOLVER_NAME}: {unplaced} of {len(requests)} instance(s) found no room in a valid MIG layout")
    if any(not d.mig for d in problem.devices):
        notes.append(f"{SOLVER_NAME}: whole GPUs, MPS GPUs and CPUs are not allocated by Algorithm 1 (use garrison-demand)")
    # Traffic: each member its rows, up to what its instances serve, spread in proportion to capacity.
    by_variant = defaultdict(list)
    for instance in fleet.instances():
        by_variant[instance.variant].append(instance)
    for name, instances in by_variant.items():
        capacity = sum(i.capacity_rps for i in instances)
        load = min(member_rates.get(name, 0.0), capacity)
        for instance in instances:
            instance.assigned_rps = instance.capacity_rps * (load / capacity) if capacity > 0 else 0.0
        if member_rates.get(name, 0.0) > capacity + RPS_EPSILON:
            notes.append(f"{SOLVER_NAME}: {name} needs {member_rates[name]:.4g} rows/s, its instances serve {capacity:.4g}")
    assignments, layouts = fleet_finish(fleet)
    served = sum(a.assigned_rps for a in assignments)
    status = "infeasible" if problem.total_demand_rps > 0 and served < RPS_EPSILON else "feasible"
    if problem.options.objective == "min-gpus":
        objective = float(len({a.device for a in assignments}))
    else:
        objective = sum(a.assigned_rps * problem.variant(a.variant).accuracy for a in assignments)
    return plan_assemble(problem, assignments, status=status, solver=SOLVER_NAME, objective=objective, bound=None, gap=None,
                         solve_seconds=time.perf_counter() - started, layouts=layouts, notes=notes)
