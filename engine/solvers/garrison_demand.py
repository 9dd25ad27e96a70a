"""`garrison-demand`: a demand-sized variant of Garrison's multi-granularity MIG allocation (Wang et al.,
"Garrison: A High-Performance GPU-Accelerated Inference System for Adversarial Ensemble Defense", DAC'24,
§4 "Multi-Granularity GI Allocation"), mapped onto Tessera's planning problem, plus the packing step the
paper leaves out. Algorithm 1 as the paper writes it is the `garrison` planner (`garrison.py`); this one
is kept as a named option because it plans mixed fleets (whole GPUs, CPUs, fixed layouts) to demand.

What the paper does (cited in docs/references.md):

- §4.1 "Profiling the Sweet Intervals": for each model, offline profiling finds, per query-size (batch
  size) range b, the GPU-instance size GS[m, b] at which the instance is well used: past a "sweet
  interval" of batch sizes a bigger batch adds hardly any throughput while latency grows about linearly
  (Figure 5: batches 16-32 of VGG11 belong on a GI(4)). L[m, b] is the latency there.
- §4.2 "Allocating GPU Instances", Algorithm 1: with sampling probabilities SP[m], the probability D[b]
  that a query falls in size range b and M GPU slices in all,
      IR[m, b] = GS[m, b] * L[m, b] * SP[m]            intermediate ratio
      RR[m, b] = IR[m, b] / sum_m' IR[m', b]            relative ratio, normalised per size range
      AR[m, b] = RR[m, b] * D[b]                        absolute ratio
      P[m, b]  = AR[m, b] * M                           slices for (m, b)
      N[m, b]  = P[m, b] / GS[m, b]                     instances of size GS[m, b]
  so ALL M slices are divided among (model, size range) in proportion to size x latency x sampling
  probability; demand (queries per second) and the SLO do not enter. The GPUs are then re-partitioned
  to these counts (§3, item 7 of Figure 4: only the instances that change; the others keep serving).
- §5.1-5.2 choose each query's ensemble with a PPO agent; §5.3 routes queued queries to instances by a
  min-cost matching (that part is `routing.queries_match_instances`, not this module).

Departure, plainly: this solver sizes instances TO DEMAND (n = ceil(load / capacity) per sweet interval)
instead of dividing all M slices by IR as Algorithm 1 does, and its sweet interval is an argmax of
throughput per GPU share rather than the §4.1 saturation knee (`garrison.py` does both as written).

Algorithm as implemented (`garrison_demand_solve`):

1. Ensemble. Each application is one random ensemble; its members are its *eligible* variants (accuracy at
   least the application's `min_accuracy`, runnable within the SLO on some device of the fleet). Sampling
   probabilities (SP) are the application's ensemble policy's (the problem's `ensemble`), else uniform
   over the members; callers may pass their own (`sampling_probabilities`, per variant, renormalised per
   application). Variant v's load is
   lambda_v = p_v * demand_rps.
2. Sweet intervals (`garrison_demand_sweet_intervals`; stands in for §4.1's GS[m, b]). For every slot kind k (a
   MIG profile of a GPU model in the fleet, or a whole non-MIG GPU) and batch size b, the profile gives
   latency(b) and memory(b), interpolated exactly as the capacity model does. b is feasible on k when
   latency(b) fits the latency budget (`latency_budget_fraction` x SLO) and memory(b) fits k. The
   efficiency of k at b is its throughput b / latency(b) per share of a GPU (compute slices / the GPU's
   compute slices; 1 for a whole GPU). The sweet interval of k is the set of batch sizes at which k is the
   most efficient feasible kind (ties: the smaller kind). Batch sizes run from 1 to B_v, the largest
   batch any kind can serve.
3. Batch-size distribution (stands in for §4.2's D[b]). The fraction of variant v's *queries* that fall in
   k's sweet interval is share_k = sum_{b in I_k} b P(b) / sum_b b P(b) (P is over batches; queries are
   counted one per item). A batch size outside every interval goes to the interval nearest to it.
4. Instance counts (replaces Algorithm 1, lines 1-13). n(v, k) = ceil(lambda_v * share_k / capacity(v, k)),
   where capacity is the shared capacity model's `capacity_for` (largest batch within the latency
   budget, b / latency(b)). Latency L enters only through that capacity, and the fleet size M only
   through the scaling below.

Scaling to the fleet (ours). Where the counts need more compute or memory slices of a GPU model (or more
whole GPUs of a type) than the fleet has, every count of that pool is scaled by the same factor (rounded
down, but at least one instance per variant, on the kind it was given most of, so every ensemble member
stays servable). Without this, first-fit-decreasing would hand a shortage to whichever variant's
instances are largest.

Packing (ours; Algorithm 1 outputs counts N[m, b] and the paper does not say how they are laid out).
Instances of MIG kinds are packed per GPU model by first-fit-decreasing on memory slices (then compute
slices), round-robin across variants within one size so that a shortage is shared: each goes to the first
GPU (fixed-layout GPUs first, then by name) whose instance counts plus this one still admit a valid
placement, as decided by `mig_counts_to_layout` (an exact backtracking search over the catalogue's legal
starts, cached by counts). A fixed-layout GPU only offers its free, existing placements of the same
profile. Whole-GPU kinds take free non-MIG GPUs of that type and memory by name. When every instance is
placed, each non-fixed GPU's counts are turned into a layout by `mig_counts_to_layout` and the instances
take its placements in start order.

Re-homing (ours). Load the packing could not place, and load of variants whose kinds are missing (CPU-only
variants), is re-homed greedily: while a variant's capacity is below its target load lambda_v, add the
cheapest free slot (smallest GPU share, a CPU counting as 0; an already-used GPU before a fresh one) that
covers the remainder, or else the largest one; a slot is any profile a non-fixed MIG GPU can still take, a
free placement of a fixed layout, a free whole GPU or a free CPU (`cpu_slice` cores). Then the same per
application, with any eligible variant (more accurate first on ties), for traffic no variant can take.

Traffic. Variant v gets min(lambda_v, its capacity); what an application still lacks spills onto the spare
capacity of its other members, most accurate first. Within a variant, traffic is spread in proportion to
instance capacity (equal utilisation). Instances left without traffic are dropped (a subset of a valid
layout is valid). The plan goes through `plan_assemble` with the layout of every MIG GPU (empty for unused
ones, the given one for fixed ones); status `feasible` (a heuristic proves no bound: bound and gap are
None), or `infeasible` when demand is positive and nothing can be served. The objective reported is the
accuracy-weighted served traffic (max-accuracy) or the number of GPUs used (min-gpus).

Departures from the paper, and why:
- Sizing (Algorithm 1): demand-driven ceil(lambda * share / capacity) per (variant, kind), then scaled
  down to the fleet, instead of AR[m, b] * M / GS[m, b] over all M slices; so a lightly loaded fleet is
  left partly empty (the paper hands out every slice) and SP enters as load, not as a weight on GS x L.
- Sweet interval (§4.1): the kind with the best throughput per GPU share at each batch size, within the
  latency budget, not the profiled batch range where a given instance's throughput saturates.
- Ensembles (§5.1-5.2): Tessera serves each query with one variant, so an application is a randomized
  ensemble that samples exactly one member per query; the paper's multi-model ensembles chosen by a PPO
  agent, and their weighted vote, have no counterpart here.
- Batch-size distribution (D[b], monitored online per §3, item 4 of Figure 4): Tessera's demand is in
  single queries and its capacity model batches them on the server, so there is no measured client
  batch-size distribution. Without one
  (`batch_distribution`) we take P uniform over 1..B_v (no batch size favoured); a measured distribution
  can be passed per application. Queries are weighted by batch size (b P(b)), where D[b] counts queries.
- Efficiency is compared per share of a GPU across GPU models and whole GPUs (the paper has one GPU model,
  the A100, §6.1).
- The latency bound is the capacity model's budget (a fraction of the SLO), not the SLO itself (the paper
  applies the SLO only when routing, §5.3 Eq. 2), so that every planner in Tessera sizes instances the
  same way.
- Fleet limits (scaling, packing), fixed layouts, CPUs and whole GPUs, re-homing and spill are ours: the
  paper's Algorithm 1 divides MIG slices only.
- The current layout of a non-fixed GPU is not preserved: the paper re-partitions only the instances that
  change (§3, item 7 of Figure 4), which this solver does not attempt.
- Garrison routes each query at run time by matching queued queries to free instances (§5.3); that part
  is `routing.queries_match_instances`. Here the plan's routing weights are the instances' traffic shares.
"""
from __future__ import annotations

import bisect
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from engine.plans.capacity import InstanceCapacity, capacity_for, cpu_slice, profile_interpolate, slice_memory_mb
from engine.plans.problem import DeviceSpec, Plan, Problem, VariantSpec
from engine.solvers.assemble import RPS_EPSILON, plan_assemble
from engine.solvers.garrison_fleet import (
    FleetSlotKinds,
    GarrisonFleet,
    InstanceRequest,
    PlacedInstance,
    SlotKind,
    fleet_finish,
    fleet_rehome,
    fleet_slot_kinds,
    requests_fit_to_fleet,
    requests_pack,
)

__all__ = ["SOLVER_NAME", "SweetInterval", "garrison_demand_solve", "garrison_demand_sweet_intervals"]

SOLVER_NAME = "garrison-demand"
# Load below this share of an instance is rounding noise, not a reason to start one more instance.
_CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class SweetInterval:
    """The batch sizes at which `kind` is the most efficient feasible kind for a variant."""

    kind: SlotKind
    low_batch: int
    high_batch: int
    batch_count: int  # how many batch sizes in [low_batch, high_batch] it owns (normally all of them)
    capacity: InstanceCapacity  # what one instance of the kind serves under the capacity model





@dataclass
class _VariantProfile:
    variant: VariantSpec
    capacities: dict[SlotKind, InstanceCapacity]  # kinds that can run the variant at all
    owner_by_batch: dict[int, SlotKind]  # batch size -> the kind whose sweet interval holds it
    max_batch: int  # B_v: the largest batch any kind serves within the budget

    def owner_of(self, batch: int) -> SlotKind | None:
        """The kind a query batch of this size goes to: its sweet interval, else the nearest one."""
        if batch in self.owner_by_batch:
            return self.owner_by_batch[batch]
        owned = sorted(self.owner_by_batch)
        if not owned:
            return None
        i = bisect.bisect_left(owned, batch)
        candidates = [owned[j] for j in (i - 1, i) if 0 <= j < len(owned)]
        nearest = min(candidates, key=lambda b: (abs(b - batch), b))
        return self.owner_by_batch[nearest]


def _feasible_throughput(problem: Problem, variant: VariantSpec, kind: SlotKind, device: DeviceSpec, batch: int) -> float | None:
    """Throughput of one instance of `kind` at `batch`, or None where the batch misses the latency budget or
    the slice's memory. Same interpolation and rules as `capacity.instance_capacity`, one batch at a time."""
    points = problem.profiles_for(variant.name, kind.device_type, kind.slice)
    latency = profile_interpolate(points, batch, "latency_ms")
    budget = problem.application(variant.application).slo_ms * problem.options.latency_budget_fraction
    if latency is None or latency <= 0 or latency > budget:
        return None
    with_memory = all(p.memory_mb is not None for p in points)
    memory = max((profile_interpolate(points, batch, "memory_mb") if with_memory else None) or 0.0, variant.memory_mb)
    limit = slice_memory_mb(device, kind.slice)
    if limit is not None and memory > limit:
        return None
    return batch * 1000.0 / latency


def _variant_profile(problem: Problem, variant: VariantSpec, fleet: FleetSlotKinds) -> _VariantProfile:
    capacities: dict[SlotKind, InstanceCapacity] = {}
    for kind in fleet.kinds:
        capacity = capacity_for(problem, variant.name, fleet.representative[kind], kind.slice)
        if capacity is not None:
            capacities[kind] = capacity
    max_batch = max((c.batch for c in capacities.values()), default=0)
    owner_by_batch: dict[int, SlotKind] = {}
    for batch in range(1, max_batch + 1):
        best: tuple[float, float, int, SlotKind] | None = None
        for kind in capacities:
            throughput = _feasible_throughput(problem, variant, kind, fleet.representative[kind], batch)
            if throughput is None:
                continue
            # Highest throughput per GPU share wins; on a tie the smaller kind (compute, then memory).
            key = (-throughput / kind.gpu_share, kind.gpu_share, kind.memory_slices, kind)
            if best is None or key < best:
                best = key
        if best is not None:
            owner_by_batch[batch] = best[-1]
    return _VariantProfile(variant, capacities, owner_by_batch, max_batch)


def _sweet_intervals(profile: _VariantProfile) -> tuple[SweetInterval, ...]:
    batches_by_kind: dict[SlotKind, list[int]] = defaultdict(list)
    for batch, kind in sorted(profile.owner_by_batch.items()):
        batches_by_kind[kind].append(batch)
    intervals = [
        SweetInterval(kind, batches[0], batches[-1], len(batches), profile.capacities[kind])
        for kind, batches in batches_by_kind.items()
    ]
    return tuple(sorted(intervals, key=lambda s: (s.low_batch, s.kind)))


def garrison_demand_sweet_intervals(problem: Problem, variant: str) -> tuple[SweetInterval, ...]:
    """Step 2 (in place of Garrison §4.1's profiled GS[m, b]) for one variant on the problem's fleet: each
    kind's sweet interval of batch sizes, ordered by batch size. Kinds that are never the most efficient
    have none."""
    return _sweet_intervals(_variant_profile(problem, problem.variant(variant), fleet_slot_kinds(problem)))


# --------------------------------------------------------------------------- ensembles and distributions


def _runnable_anywhere(problem: Problem, variant: VariantSpec, profile: _VariantProfile) -> bool:
    if profile.capacities:
        return True
    return any(
        (s := cpu_slice(problem, variant.name, d)) is not None and capacity_for(problem, variant.name, d, s) is not None
        for d in problem.devices
        if d.is_cpu
    )


def _sampling_probabilities(
    problem: Problem, eligible: Mapping[str, list[VariantSpec]], given: Mapping[str, float] | None
) -> dict[str, float]:
    """p_v per variant, summing to 1 over each application's eligible members (uniform unless given)."""
    if given is not None:
        for name, p in given.items():
            problem.variant(name)  # KeyError for an unknown variant
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
                raise ValueError(f"sampling probability of {name!r} must be a finite number >= 0, got {p!r}")
    probabilities: dict[str, float] = {}
    for app, members in eligible.items():
        weights = {v.name: float(given.get(v.name, 0.0)) for v in members} if given is not None else {}
        total = sum(weights.values())
        if total <= 0:  # nothing given for this application's eligible members: the uniform ensemble
            weights = {v.name: 1.0 for v in members}
            total = float(len(members))
        for name, w in weights.items():
            probabilities[name] = w / total
    return probabilities


def _batch_shares(profile: _VariantProfile, distribution: Mapping[int, float] | None) -> dict[SlotKind, float]:
    """Step 3: the share of the variant's queries whose batch falls in each kind's sweet interval."""
    if distribution is None:
        distribution = {b: 1.0 for b in range(1, profile.max_batch + 1)}  # uniform over 1..B_v
    weighted: dict[SlotKind, float] = defaultdict(float)
    for batch, probability in distribution.items():
        kind = profile.owner_of(batch)
        if kind is not None and probability > 0:
            weighted[kind] += batch * probability  # a batch of b carries b queries
    total = sum(weighted.values())
    return {k: w / total for k, w in weighted.items()} if total > 0 else {}


def _check_distributions(problem: Problem, given: Mapping[str, Mapping[int, float]] | None) -> None:
    for app, distribution in (given or {}).items():
        problem.application(app)  # KeyError for an unknown application
        for batch, p in distribution.items():
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError(f"batch_distribution[{app!r}]: batch sizes are integers >= 1, got {batch!r}")
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
                raise ValueError(f"batch_distribution[{app!r}][{batch}]: must be a finite number >= 0, got {p!r}")
        if sum(distribution.values()) <= 0:
            raise ValueError(f"batch_distribution[{app!r}]: the probabilities sum to zero")





def _allocate(
    profiles: Mapping[str, _VariantProfile],
    loads: Mapping[str, float],
    distributions: Mapping[str, Mapping[int, float]],
) -> list[InstanceRequest]:
    """Step 4: n(v, k) = ceil(lambda_v * share_k / capacity(v, k)). Sized to demand, unlike Algorithm 1
    (Garrison §4.2), which divides all M slices as N[m, b] = RR[m, b] * D[b] * M / GS[m, b]."""
    requests: list[InstanceRequest] = []
    for name in sorted(loads):
        load = loads[name]
        if load <= 0:
            continue
        profile = profiles[name]
        shares = _batch_shares(profile, distributions.get(profile.variant.application))
        for kind in sorted(shares):
            count = math.ceil(load * shares[kind] / profile.capacities[kind].capacity_rps - _CEIL_SLACK)
            requests.extend(InstanceRequest(name, kind, rank) for rank in range(max(count, 0)))
    return requests





def _assign_traffic(fleet: GarrisonFleet, problem: Problem, loads: Mapping[str, float], eligible: Mapping[str, list[VariantSpec]]) -> None:
    """Each member its sampled share up to its capacity; the rest spills onto members with room, most
    accurate first; within a member, in proportion to instance capacity."""
    by_variant: dict[str, list[PlacedInstance]] = defaultdict(list)
    for instance in fleet.instances():
        by_variant[instance.variant].append(instance)
    for app in problem.applications:
        members = sorted(eligible.get(app.name, []), key=lambda v: (-v.accuracy, v.name))
        capacity = {v.name: sum(i.capacity_rps for i in by_variant.get(v.name, [])) for v in members}
        assigned = {v.name: min(loads.get(v.name, 0.0), capacity[v.name]) for v in members}
        leftover = app.demand_rps - sum(assigned.values())
        for v in members:
            if leftover <= 0:
                break
            extra = min(leftover, capacity[v.name] - assigned[v.name])
            if extra > 0:
                assigned[v.name] += extra
                leftover -= extra
        for v in members:
            if capacity[v.name] > 0:
                utilisation = assigned[v.name] / capacity[v.name]
                for instance in by_variant.get(v.name, []):
                    instance.assigned_rps = instance.capacity_rps * utilisation





def garrison_demand_solve(
    problem: Problem,
    *,
    sampling_probabilities: Mapping[str, float] | None = None,
    batch_distribution: Mapping[str, Mapping[int, float]] | None = None,
) -> Plan:
    """Plan with a demand-driven version of Garrison's multi-granularity allocation (§4; it departs from
    Algorithm 1, see the module docstring) and first-fit-decreasing MIG packing.

    `sampling_probabilities`: variant -> p_v, renormalised over each application's eligible variants
    (default: the problem's ensemble policies; uniform where absent). `batch_distribution`: application ->
    {batch size: probability} of the batches its queries arrive in (default: the problem's query_sizes;
    uniform over 1..B_v where absent). Deterministic: same problem, same plan."""
    started = time.perf_counter()
    # The problem's own ensemble probabilities and query-size distributions, where the caller gives none.
    if sampling_probabilities is None and any(a.ensemble is not None for a in problem.applications):
        sampling_probabilities = {m.variant: m.probability for a in problem.applications if a.ensemble is not None for m in a.ensemble.members}
    if batch_distribution is None and any(a.query_sizes for a in problem.applications):
        batch_distribution = {a.name: dict(a.query_sizes) for a in problem.applications if a.query_sizes}
    _check_distributions(problem, batch_distribution)
    fleet_kinds = fleet_slot_kinds(problem)
    profiles = {v.name: _variant_profile(problem, v, fleet_kinds) for v in problem.variants}

    eligible: dict[str, list[VariantSpec]] = {}
    for app in problem.applications:
        eligible[app.name] = [
            v for v in problem.variants_of(app.name)
            if (app.min_accuracy is None or v.accuracy >= app.min_accuracy) and _runnable_anywhere(problem, v, profiles[v.name])
        ]
    probabilities = _sampling_probabilities(problem, eligible, sampling_probabilities)
    loads = {
        v.name: probabilities[v.name] * problem.application(app).demand_rps
        for app, members in eligible.items() for v in members
    }

    fleet = GarrisonFleet(problem)
    requests = _allocate(profiles, loads, batch_distribution or {})
    fitted, scaling_notes = requests_fit_to_fleet(fleet, requests, solver=SOLVER_NAME)
    unplaced = requests_pack(fleet, fitted)
    added = fleet_rehome(fleet, problem, loads, eligible)
    _assign_traffic(fleet, problem, loads, eligible)
    assignments, layouts = fleet_finish(fleet)

    served = sum(a.assigned_rps for a in assignments)
    status = "infeasible" if problem.total_demand_rps > 0 and served < RPS_EPSILON else "feasible"
    if problem.options.objective == "min-gpus":
        objective = float(len({a.device for a in assignments if not problem.device(a.device).is_cpu}))
    else:
        objective = sum(a.assigned_rps * problem.variant(a.variant).accuracy for a in assignments)

    notes = [
        f"{SOLVER_NAME}: sampling probabilities "
        + "; ".join(f"{app}: " + ", ".join(f"{v.name}={probabilities[v.name]:.3g}" for v in members) for app, members in eligible.items() if members),
        f"{SOLVER_NAME}: batch-size distribution "
        + ("as given for " + ", ".join(sorted(batch_distribution)) + ", " if batch_distribution else "")
        + "uniform over 1..B_v" + (" elsewhere" if batch_distribution else " (none given)"),
    ]
    for name in sorted(loads):
        intervals = _sweet_intervals(profiles[name])
        if loads[name] > 0 and intervals:
            notes.append(f"{SOLVER_NAME}: {name} sweet intervals " + ", ".join(f"{s.kind} [{s.low_batch},{s.high_batch}]" for s in intervals))
    notes += scaling_notes
    notes.append(
        f"{SOLVER_NAME}: allocation asked for {len(requests)} instance(s), {len(fitted)} after scaling to the fleet, "
        f"{unplaced} did not fit; re-homing added {added}"
    )
    for app, members in eligible.items():
        if not members and problem.application(app).demand_rps > 0:
            notes.append(
                f"{SOLVER_NAME}: {app} has no variant that meets its min_accuracy and fits its latency budget and memory "
                "on any device of this fleet"
            )

    return plan_assemble(
        problem, assignments, status=status, solver=SOLVER_NAME, objective=objective, bound=None, gap=None,
        solve_seconds=time.perf_counter() - started, layouts=layouts, notes=notes,
    )


