"""Routing for the data plane: which instance serves the next query of an application.

Two mechanisms, both pure Python (no Django) so that routers and workers can import them:

- Weighted routing tables: the request router of Proteus's per-application load balancer (Proteus §3,
  "Load Balancer"), dispatching by the query assignment the controller's MILP chose (§4: y_{d,q}, the
  share of an application's queries sent to each device) from a routing table looked up per query
  (§6.8). A `RoutingTable` is that split over an application's instances, versioned so that a data plane
  can tell which plan it follows. `routing_tables_from_plan` is the one derivation of the tables from a
  plan: the live system (the plan run's translation, whose tables the rollout publishes and the routers
  read back into `RoutingTable`s), the simulator and the plan run's what-if prediction all route with it.
  `WeightedRouter` draws an instance with probability equal to its weight in O(1) per pick (Walker's
  alias method, in Vose's numerically stable construction), and can leave out instances that are
  draining.
  Departs from Proteus: a table is per instance (a MIG slice, a whole GPU or a CPU), not per device and
  variant, and its weights are normalised to sum to 1, so the traffic a plan cannot serve (Proteus's Eq. 2
  lets the shares sum below 1) still goes to the instances, where the drop rule sheds it: the router
  never refuses a query an instance might still serve in time.
- Garrison's instance routing (Garrison §5.3, "Instance Routing for Bounded Latency").
  `queries_match_instances` matches queued queries to instances as a minimum-cost bipartite matching
  solved by a Jonker-Volgenant algorithm (`scipy.optimize.linear_sum_assignment`), as §5.3 reduces it.
  §5.3 (transcribed): for model j with queued queries Q_1..Q_m and its instances GI_1..GI_n, D_{i,k} is
  query i's serving time on instance k (inference latency plus what remains of the query running there),
  U_{i,k} = L_k * D_{i,k} its normalised usage time, L_k the instance's granularity ("one millisecond on
  GI(2) is not equivalent to one millisecond on GI(4)"), and
      min sum_{i,k} U_{i,k} P_{i,k}                                         (1)
      s.t. (D_{i,k} + W_i) P_{i,k} <= SLO                                    (2)
           sum_i P_{i,k} <= 1, sum_k P_{i,k} <= 1                            (3)
           sum_{i,k} P_{i,k} >= min(m, n)                                    (4)
  with W_i the time query i has waited. With `levels` (L_k per instance) and `now_ms`,
  `matching_cost_matrix` is that cost; without them, the predicted completion time (wall clock).
  Departs from Garrison: Eq. 2 (a hard constraint) is a penalty that makes missing a deadline dearer than
  any saving in cost, so that a matching of min(m, n) pairs (Eq. 4) exists even when some query cannot make
  its deadline anywhere; the router then still answers it or drops it by its drop rule.
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from engine.plans.problem import Plan

__all__ = [
    "NoRouteAvailable",
    "RoutingError",
    "RoutingTable",
    "WeightedRouter",
    "matching_cost_matrix",
    "queries_match_instances",
    "routing_tables_from_plan",
]

# Normalised weights must sum to 1 within this (they are divided by their sum, so only non-finite or
# absurdly scaled inputs can miss it).
WEIGHT_SUM_TOLERANCE = 1e-9
# How many exclusion sets a router remembers a table for: draining sets change rarely, so a few suffice.
_EXCLUSION_CACHE_SIZE = 32


class RoutingError(ValueError):
    """A routing table or matching input is malformed; the message says which entry."""


class NoRouteAvailable(LookupError):
    """No instance can take the query: the table is empty or every instance with weight is unavailable."""


# --------------------------------------------------------------------------- routing tables


@dataclass(frozen=True)
class RoutingTable:
    """An application's traffic split: `entries` are (instance id, weight), weights normalised to sum to 1
    (weights that already do, within WEIGHT_SUM_TOLERANCE, are kept as given: normalising is idempotent).
    An empty table is valid and means the application has no capacity."""

    application: str
    version: int
    entries: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.application, str) or not self.application:
            raise RoutingError(f"application must be a non-empty string, got {self.application!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise RoutingError(f"{self.application}: version must be a non-negative integer, got {self.version!r}")
        entries = tuple(self.entries)
        seen: set[str] = set()
        for i, entry in enumerate(entries):
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise RoutingError(f"{self.application}: entries[{i}] must be (instance id, weight), got {entry!r}")
            instance, weight = entry
            if not isinstance(instance, str) or not instance:
                raise RoutingError(f"{self.application}: entries[{i}]: instance id must be a non-empty string, got {instance!r}")
            if instance in seen:
                raise RoutingError(f"{self.application}: instance {instance!r} is listed twice")
            seen.add(instance)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
                raise RoutingError(f"{self.application}: {instance}: weight must be a finite number >= 0, got {weight!r}")
        if not entries:
            object.__setattr__(self, "entries", ())
            return
        largest = max(float(w) for _, w in entries)
        if largest <= 1.0 and abs(math.fsum(float(w) for _, w in entries) - 1.0) <= WEIGHT_SUM_TOLERANCE:
            # Already normalised (a table rebuilt from a published one): kept as given, so every copy of a
            # table, in the control plane, a router or the simulator, holds the same weights bit for bit.
            object.__setattr__(self, "entries", tuple((instance, float(w)) for instance, w in entries))
            return
        if largest <= 0:
            raise RoutingError(f"{self.application}: weights sum to 0; an application without capacity has an empty table")
        # Dividing by the largest weight first keeps the sum finite for any finite weights.
        scaled = [(instance, float(w) / largest) for instance, w in entries]
        total = math.fsum(w for _, w in scaled)
        normalised = tuple((instance, w / total) for instance, w in scaled)
        if abs(math.fsum(w for _, w in normalised) - 1.0) > WEIGHT_SUM_TOLERANCE:
            raise RoutingError(f"{self.application}: weights do not normalise to 1 (sum {total!r})")
        object.__setattr__(self, "entries", normalised)

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(instance for instance, _ in self.entries)

    def weight_of(self, instance: str) -> float:
        """The instance's share of the traffic (0 for an instance not in the table)."""
        return next((w for i, w in self.entries if i == instance), 0.0)

    @property
    def is_empty(self) -> bool:
        return not self.entries


def routing_tables_from_plan(plan: Plan, version: int = 0) -> dict[str, RoutingTable]:
    """The plan's routing tables, all stamped `version`: one per application that the plan routes, serves or
    falls short on (empty where it serves nothing).

    The one derivation of routing tables from a plan. The weights are the plan's route weights (the query
    assignment, `Plan.routing`), never re-derived from the instances' `assigned_rps`: `plan_assemble` makes
    them the instances' traffic shares and the validator holds them to that, but a plan's routing is what
    it routes by (a what-if may change it, as the uniform-routing bench does). Routes with weight 0 are left
    out, the rest normalised by `RoutingTable`."""
    applications: Iterable[str] = sorted(set(plan.routing) | set(plan.served_rps) | set(plan.shortfall_rps))
    tables: dict[str, RoutingTable] = {}
    for application in applications:
        entries = tuple((e.instance, e.weight) for e in plan.routing.get(application, []) if e.weight > 0)
        tables[application] = RoutingTable(application, version, entries)
    return tables


# --------------------------------------------------------------------------- weighted picks


@dataclass(frozen=True)
class AliasTable:
    """Walker's alias table: pick column i uniformly, keep it with probability keep[i], else take alias[i]."""

    instances: tuple[str, ...]
    keep: tuple[float, ...]
    alias: tuple[int, ...]


def alias_table_build(weighted: Sequence[tuple[str, float]]) -> AliasTable:
    """Vose's construction over entries with positive weight (zero-weight ones can never be drawn)."""
    entries = [(instance, w) for instance, w in weighted if w > 0]
    if not entries:
        raise NoRouteAvailable("no instance with a positive weight")
    n = len(entries)
    total = math.fsum(w for _, w in entries)
    scaled = [w * n / total for _, w in entries]
    keep = [0.0] * n
    alias = list(range(n))
    small = [i for i, p in enumerate(scaled) if p < 1.0]
    large = [i for i, p in enumerate(scaled) if p >= 1.0]
    while small and large:
        s, l = small.pop(), large.pop()
        keep[s] = scaled[s]
        alias[s] = l
        scaled[l] = (scaled[l] + scaled[s]) - 1.0
        (small if scaled[l] < 1.0 else large).append(l)
    # What is left holds probability 1 up to rounding (every column left has scaled ~ 1).
    for i in large + small:
        keep[i] = 1.0
    return AliasTable(tuple(i for i, _ in entries), tuple(keep), tuple(alias))


class WeightedRouter:
    """Picks instances of one routing table with probability equal to their weight, O(1) per pick.

    `seed` makes the sequence of picks reproducible. `choose_excluding` renormalises over the instances
    not excluded (draining ones); its alias tables are cached per exclusion set, so a steady drain costs
    O(1) per pick too. Not meant to be shared between threads without a lock (it holds one random stream)."""

    def __init__(self, table: RoutingTable, seed: int | None = None) -> None:
        self.table = table
        self._random = random.Random(seed)  # nosec B311 - picks a route by its weight, not a secret
        self._full = alias_table_build(table.entries) if any(w > 0 for _, w in table.entries) else None
        self._excluding: OrderedDict[frozenset[str], AliasTable | None] = OrderedDict()

    def _draw(self, alias_table: AliasTable) -> str:
        # One uniform draw gives both the column (integer part) and the coin (fractional part).
        u = self._random.random() * len(alias_table.instances)
        column = int(u)
        if column >= len(alias_table.instances):  # u can round up to n
            column = len(alias_table.instances) - 1
        if u - column < alias_table.keep[column]:
            return alias_table.instances[column]
        return alias_table.instances[alias_table.alias[column]]

    def choose(self) -> str:
        if self._full is None:
            raise NoRouteAvailable(f"{self.table.application}: the routing table is empty")
        return self._draw(self._full)

    def choose_excluding(self, unavailable: set[str] | frozenset[str]) -> str:
        """Pick among the instances not in `unavailable`, weights renormalised over them."""
        if not unavailable:
            return self.choose()
        key = frozenset(unavailable)
        if key in self._excluding:
            self._excluding.move_to_end(key)
            alias_table = self._excluding[key]
        else:
            rest = [(i, w) for i, w in self.table.entries if i not in key and w > 0]
            alias_table = alias_table_build(rest) if rest else None
            self._excluding[key] = alias_table
            if len(self._excluding) > _EXCLUSION_CACHE_SIZE:
                self._excluding.popitem(last=False)
        if alias_table is None:
            raise NoRouteAvailable(f"{self.table.application}: every instance with traffic is unavailable")
        return self._draw(alias_table)


# --------------------------------------------------------------------------- Garrison's instance routing


def _as_vector(values: Sequence[float], what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise RoutingError(f"{what} must be a list of numbers")
    if not np.all(np.isfinite(array)):
        raise RoutingError(f"{what} must be finite numbers")
    return array


def matching_cost_matrix(
    query_deadlines_ms: Sequence[float],
    instance_free_at_ms: Sequence[float],
    service_ms: float | Sequence[float] | Sequence[Sequence[float]],
    *,
    levels: Sequence[float] | None = None,
    now_ms: float | None = None,
) -> np.ndarray:
    """Cost of serving query q on instance i, plus a penalty when its predicted completion free_at[i] +
    service[q, i] is later than the query's deadline (Eq. 2). The cost is that completion time; with
    `levels` (Garrison's L_k, the instances' granularity, e.g. their compute slices) and `now_ms`, it is the
    normalised usage time U = L_k * D, D = max(free_at[i], now) - now + service[q, i] (Eq. 1).

    The penalty is (k + 1) * (span + 1) with k = min(queries, instances) and span the spread of the costs,
    so it exceeds the largest total cost any matching can save: the matching first misses as few deadlines
    as it can, then among those costs least in total. `service_ms` is one time for every pair, one per
    instance, or a queries x instances matrix (batches of different sizes)."""
    deadlines = _as_vector(query_deadlines_ms, "query_deadlines_ms")
    free_at = _as_vector(instance_free_at_ms, "instance_free_at_ms")
    if (levels is None) != (now_ms is None):
        raise RoutingError("levels and now_ms are given together (the normalised usage time needs both)")
    service = np.asarray(service_ms, dtype=float)
    shape = (deadlines.size, free_at.size)
    if service.ndim == 0 or (service.ndim == 1 and service.size == free_at.size):
        service = np.broadcast_to(service, shape)
    elif service.shape != shape:
        raise RoutingError(f"service_ms must be a number, one per instance ({free_at.size}) or a {shape[0]}x{shape[1]} matrix, got shape {service.shape}")
    if not np.all(np.isfinite(service)) or np.any(service < 0):
        raise RoutingError("service_ms must be finite numbers >= 0")
    completion = free_at[np.newaxis, :] + service
    if completion.size == 0:
        return completion
    late = completion > deadlines[:, np.newaxis]
    cost = completion
    if levels is not None:
        level = _as_vector(levels, "levels")
        if level.size != free_at.size or np.any(level <= 0) or not math.isfinite(float(now_ms)):  # type: ignore[arg-type]
            raise RoutingError(f"levels must be one number > 0 per instance ({free_at.size}) and now_ms a finite number")
        serving = np.maximum(free_at, float(now_ms))[np.newaxis, :] - float(now_ms) + service  # type: ignore[arg-type]
        cost = level[np.newaxis, :] * serving
    span = float(cost.max() - cost.min())
    penalty = (min(shape) + 1) * (span + 1.0)
    return cost + np.where(late, penalty, 0.0)


def queries_match_instances(
    query_deadlines_ms: Sequence[float],
    instance_free_at_ms: Sequence[float],
    service_ms: float | Sequence[float] | Sequence[Sequence[float]],
    *,
    levels: Sequence[float] | None = None,
    now_ms: float | None = None,
) -> list[tuple[int, int]]:
    """Garrison's instance routing (§5.3): match queued queries to instances at least cost (see
    `matching_cost_matrix`; with `levels` and `now_ms`, the paper's normalised usage time). Deadlines and free times are on one clock, in milliseconds. Returns
    min(queries, instances) pairs (query index, instance index), by query index; when queries outnumber
    instances, the ones left for the next round are those whose matching would cost most (a query that
    misses its deadline anywhere waits before one that can still make it)."""
    cost = matching_cost_matrix(query_deadlines_ms, instance_free_at_ms, service_ms, levels=levels, now_ms=now_ms)
    if cost.size == 0:
        return []
    if cost.shape[0] == 1:  # one query: the matching is the cheapest instance (the first on a tie, as the solver)
        return [(0, int(np.argmin(cost[0])))]
    rows, columns = linear_sum_assignment(cost)
    return sorted((int(q), int(i)) for q, i in zip(rows, columns))
