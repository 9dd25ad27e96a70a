"""Sponge (Razavi's thesis P2 §p2.3): the cores and batch size of one CPU instance such that every queued
request meets its remaining latency budget, with the fewest cores.

Transcribed from §p2.3.2-p2.3.4:
- performance model (P2.2): l(b, c) = gamma1*b/c + eps1/c + delta1*b + eta1 ms, Amdahl's law in the cores
  (P2.1) combined with a latency linear in the batch; throughput h(b, c) = b / l(b, c);
- the integer programme (P2.3): minimise c + delta*b subject to l(b, c) + q_r(b, c) + cl_max <= SLO for
  every request r in the queue, h(b, c) >= lambda, b and c positive integers; q_r is the wait of r in the
  earliest-deadline-first queue: the requests, ordered by deadline, are served in consecutive batches of
  b, so the k-th batch (from 0) finishes (k + 1) * l(b, c) after now, and a batch is held to the smallest
  remaining SLO in it;
- the solution (Algorithm 2): brute force over c = 1..c_max and b = 1..b_max (c outer, b inner), the first
  configuration that meets every constraint, i.e. the fewest cores and, with them, the smallest batch.

Where this departs, and why: a request with no budget left when it arrives (the network took its whole
SLO) is dropped and counted (`expired`), not used to size the instance: no configuration could serve it.
A request's remaining budget (its SLO less what the network already took,
`X-Tessera-Deadline-Ms` on the wire) is given per request rather than as one SLO less the largest
communication latency cl_max, which the thesis uses as a safe bound when it knows only the latencies;
with the budgets known, each batch is held to its own tightest one. The model is fitted by non-negative
least squares (`vertical_latency_fit`) rather than the thesis's robust regression, so that latency never
grows with cores nor falls with the batch. `sponge_ip_solve` writes P2.3 for HiGHS over one binary per
(c, b) configuration, the non-linear l(b, c) evaluated per configuration: the same optimum as the brute
force, which the tests check, as an independent cross-check."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["SpongeDecision", "VerticalLatency", "arrivals_late", "edf_late", "sponge_brute_force", "sponge_decision_validate", "sponge_ip_solve",
           "vertical_latency_fit"]

CORES_MAX = 16  # the thesis's c_max and b_max: no significant gain beyond (§p2.4)
BATCH_MAX = 16


@dataclass(frozen=True)
class VerticalLatency:
    """l(b, c) = gamma1*b/c + eps1/c + delta1*b + eta1, in milliseconds (P2.2)."""

    gamma1: float
    eps1: float
    delta1: float
    eta1: float

    def l(self, batch: int, cores: int) -> float:
        return self.gamma1 * batch / cores + self.eps1 / cores + self.delta1 * batch + self.eta1

    def throughput_rps(self, batch: int, cores: int) -> float:
        """h(b, c) = b / l(b, c), per second."""
        return 1000.0 * batch / self.l(batch, cores)


def vertical_latency_fit(points: Sequence[tuple[int, int, float]]) -> VerticalLatency:
    """Fit P2.2 to profiled (batch, cores, latency ms) points by non-negative least squares (SciPy)."""
    from scipy.optimize import nnls

    data = [(int(b), int(c), float(ms)) for b, c, ms in points]
    if len({(b, c) for b, c, _ in data}) < 4:
        raise ValueError("fitting l(b, c) needs profiles at 4 or more distinct (batch, cores) points")
    for b, c, ms in data:
        if b < 1 or c < 1 or not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"profile point (batch {b}, cores {c}, {ms} ms): batch and cores >= 1, latency a finite number > 0")
    design = np.array([[b / c, 1.0 / c, b, 1.0] for b, c, _ in data])
    target = np.array([ms for _, _, ms in data])
    coefficients, _residual = nnls(design, target)
    model = VerticalLatency(*(float(x) for x in coefficients))
    if model.l(1, max(c for _, c, _ in data)) <= 0:
        raise ValueError(f"the fitted model is not positive: {model}; profile more points")
    return model


@dataclass(frozen=True)
class SpongeDecision:
    solver: str
    status: str  # "optimal" or "infeasible" (no configuration up to c_max, b_max meets every constraint)
    cores: int
    batch: int
    objective: float | None
    runtime_s: float
    late: int = 0  # requests the decision cannot serve in time (infeasible decisions only)
    expired: int = 0  # requests with no budget left on arrival: dropped, not counted against the decision
    notes: tuple[str, ...] = ()


def edf_late(model: VerticalLatency, budgets: Sequence[float], batch: int, cores: int) -> int:
    """Requests, in deadline order served b at a time, whose batch finishes after the tightest remaining
    budget in it (then every request of that batch counts as late)."""
    latency = model.l(batch, cores)
    late = 0
    for k in range(0, len(budgets), batch):
        group = budgets[k:k + batch]
        if (k // batch + 1) * latency > group[0] + 1e-9:  # group[0]: the tightest, budgets are sorted
            late += len(group)
    return late


def _feasible(model: VerticalLatency, budgets: Sequence[float], rate_rps: float, batch: int, cores: int, arrivals: Sequence[float] = ()) -> bool:
    return (model.throughput_rps(batch, cores) >= rate_rps - 1e-9 and edf_late(model, budgets, batch, cores) == 0
            and arrivals_late(model, arrivals, batch, cores) == 0)


def arrivals_late(model: VerticalLatency, arrivals: Sequence[float], batch: int, cores: int) -> int:
    """Of the arrivals' budgets (sorted), how many the worst a new request meets at this size would miss:
    the batch in service, then its own batch, 2 l(b, c)."""
    worst = 2.0 * model.l(batch, cores)
    late = 0
    for budget in arrivals:
        if worst <= budget + 1e-9:
            break
        late += 1
    return late


def _inputs_check(budgets: Sequence[float], rate_rps: float, max_cores: int, max_batch: int) -> list[float]:
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        raise ValueError(f"rate_rps must be a finite number >= 0, got {rate_rps!r}")
    if max_cores < 1 or max_batch < 1:
        raise ValueError("max_cores and max_batch must be >= 1")
    ordered = sorted(float(x) for x in budgets)  # earliest deadline first
    if any(not math.isfinite(x) for x in ordered):
        raise ValueError("remaining budgets must be finite numbers (ms)")
    # A request with nothing left is late whatever the instance does (the network took its SLO): it is
    # dropped, as the drop rule does, and does not size the instance.
    return [x for x in ordered if x > 0]


def _arrivals_servable(model: VerticalLatency, arrival_budgets_ms: Sequence[float], max_cores: int) -> tuple[list[float], int]:
    """The arrivals' budgets some size could meet (sorted), and how many none could (2 l(1, c_max) > budget)."""
    arrivals = _inputs_check(arrival_budgets_ms, 0.0, max_cores, 1)
    floor = 2.0 * model.l(1, max_cores)
    servable = [a for a in arrivals if a + 1e-9 >= floor]
    return servable, len(arrival_budgets_ms) - len(servable)


def sponge_brute_force(model: VerticalLatency, budgets_ms: Sequence[float], rate_rps: float, *, max_cores: int = CORES_MAX,
                       max_batch: int = BATCH_MAX, delta: float = 1e-3, arrival_budgets_ms: Sequence[float] = ()) -> SpongeDecision:
    """Algorithm 2: the first (c, b), c ascending then b ascending, that keeps every queued request within
    its remaining budget (`budgets_ms`, one per request, in any order) and serves `rate_rps`. With
    `arrival_budgets_ms` (what recent requests had left on arrival: what the next ones will bring), also
    each of those within the worst a new request meets, 2 l(b, c); arrivals no size could serve are left
    out and counted in `expired`. Infeasible: the configuration with the fewest late requests (then fewest
    cores, smallest batch), status "infeasible", so the caller still gets the best it can do (and may
    scale out for the rest)."""
    started = time.perf_counter()
    budgets = _inputs_check(budgets_ms, rate_rps, max_cores, max_batch)
    arrivals, unservable = _arrivals_servable(model, arrival_budgets_ms, max_cores)
    expired = len(budgets_ms) - len(budgets) + unservable
    for cores in range(1, max_cores + 1):
        for batch in range(1, max_batch + 1):
            if _feasible(model, budgets, rate_rps, batch, cores, arrivals):
                return SpongeDecision("sponge", "optimal", cores, batch, cores + delta * batch, time.perf_counter() - started, expired=expired)
    everyone = len(budgets) + len(arrivals)
    best = min(((edf_late(model, budgets, b, c) + arrivals_late(model, arrivals, b, c) + (0 if model.throughput_rps(b, c) >= rate_rps else everyone + 1),
                 c, b) for c in range(1, max_cores + 1) for b in range(1, max_batch + 1)))
    late, cores, batch = best
    return SpongeDecision("sponge", "infeasible", cores, batch, None, time.perf_counter() - started, late=min(late, everyone),
                          expired=expired, notes=(f"no configuration up to {max_cores} cores and batch {max_batch} keeps every request within its budget "
                                 f"and serves {rate_rps:g} rps",))


def sponge_ip_solve(model: VerticalLatency, budgets_ms: Sequence[float], rate_rps: float, *, max_cores: int = CORES_MAX,
                    max_batch: int = BATCH_MAX, delta: float = 1e-3, time_limit_s: float = 10.0,
                    arrival_budgets_ms: Sequence[float] = ()) -> SpongeDecision:
    """P2.3 as an integer programme for HiGHS: one binary x[c, b] per configuration, exactly one chosen,
    minimise sum (c + delta*b) x[c, b] subject to sum late(c, b) x[c, b] = 0 (the EDF queue check, per
    configuration) and sum h(b, c) x[c, b] >= lambda."""
    import pulp

    from engine.plans.problem import SolveOptions
    from engine.solvers.milp import milp_solve

    started = time.perf_counter()
    budgets = _inputs_check(budgets_ms, rate_rps, max_cores, max_batch)
    arrivals, unservable = _arrivals_servable(model, arrival_budgets_ms, max_cores)
    configs = [(c, b) for c in range(1, max_cores + 1) for b in range(1, max_batch + 1)]
    x = {cb: pulp.LpVariable(f"x_{cb[0]}_{cb[1]}", cat="Binary") for cb in configs}
    lp = pulp.LpProblem("sponge", pulp.LpMinimize)
    lp += pulp.lpSum((c + delta * b) * x[(c, b)] for c, b in configs)
    lp += pulp.lpSum(x.values()) == 1, "one_configuration"
    lp += pulp.lpSum(edf_late(model, budgets, b, c) * x[(c, b)] for c, b in configs) == 0, "every_request_in_time"
    lp += pulp.lpSum(arrivals_late(model, arrivals, b, c) * x[(c, b)] for c, b in configs) == 0, "every_arrival_in_time"
    lp += pulp.lpSum(model.throughput_rps(b, c) * x[(c, b)] for c, b in configs) >= rate_rps, "throughput_covers_rate"
    result = milp_solve(lp, SolveOptions(threads=1), time_limit_s=time_limit_s)
    chosen = [cb for cb, var in x.items() if (var.value() or 0) > 0.5]
    if not result.has_solution or not chosen:
        fallback = sponge_brute_force(model, budgets, rate_rps, max_cores=max_cores, max_batch=max_batch, delta=delta, arrival_budgets_ms=arrivals)
        return SpongeDecision("sponge-ip", "infeasible", fallback.cores, fallback.batch, None, time.perf_counter() - started,
                              late=fallback.late, expired=len(budgets_ms) - len(budgets) + unservable, notes=(f"{result.backend}: {result.state}",))
    cores, batch = chosen[0]
    return SpongeDecision("sponge-ip", "optimal", cores, batch, cores + delta * batch, time.perf_counter() - started,
                          expired=len(budgets_ms) - len(budgets) + unservable)


def sponge_decision_validate(model: VerticalLatency, budgets_ms: Sequence[float], rate_rps: float, decision: SpongeDecision) -> list[str]:
    """Independent check of an "optimal" decision: it serves the rate and keeps every request within its
    budget; nothing is checked about optimality (the brute force and the IP cross-check that)."""
    errors = []
    budgets = sorted(float(x) for x in budgets_ms if x > 0)  # expired requests are dropped, not served
    if decision.status != "optimal":
        return errors
    latency = model.l(decision.batch, decision.cores)
    if 1000.0 * decision.batch / latency < rate_rps - 1e-9:
        errors.append(f"{decision.cores} cores at batch {decision.batch} serve {1000.0 * decision.batch / latency:.4g} rps < {rate_rps:g}")
    for k in range(0, len(budgets), decision.batch):
        done = (k // decision.batch + 1) * latency
        if done > min(budgets[k:k + decision.batch]) + 1e-9:
            errors.append(f"batch {k // decision.batch} finishes at {done:.4g} ms, after its tightest budget {min(budgets[k:k + decision.batch]):.4g} ms")
    return errors
