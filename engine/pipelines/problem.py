"""A pipeline planning problem and its plans, as typed values (FA2, Razavi's thesis P1 §p1.4).

A pipeline is a DAG of stages (DNNs); its execution paths are the routes queries take through it, each
with its own end-to-end SLO and measured rate (thesis Table P1.1: G, S, P, SLA_p, lambda_p). A stage may
be shared by several paths (Table P1.3: OBJD starts three paths, QUAN ends three). Every instance of a
stage is the same size (one CPU core, or a fixed GPU share): scaling is horizontal.

Models (§p1.4.1-p1.4.2), per stage s:
- processing latency d_s(b) = alpha*b^2 + beta*b + gamma (ms), fitted from profiles by robust regression
  (`stage_latency_fit`);
- throughput of one instance h_s(b) = b / d_s(b) (here per second: 1000*b/d_s(b));
- worst-case queueing delay q_s(b) = (b - 1) / lambda_s (P1.2; in ms, 1000*(b - 1)/lambda_s), lambda_s the
  summed rate of the paths through s;
- time spent at s, l_s(b) = d_s(b) + q_s(b); instances needed n_s(b) = ceil(lambda_s / h_s(b)), at least 1
  (b and n are positive integers in P1.3).

The integer programme (P1.3): choose b_s and n_s for every stage to minimise sum n_s + delta * sum b_s,
subject to sum over s in p of l_s(b_s) <= SLA_p for every path p and n_s * h_s(b_s) >= lambda_s.
`delta` (`batch_penalty`) is small enough that it never trades an instance for smaller batches: among
plans with the fewest instances it prefers the smallest batches, as the paper intends.

Two readings of d_s(b), and who uses which:
- the paper's model, the fitted quadratic `StageLatency.d` (`time_at_stage_ms`, `instances_needed`): FA2's
  graph transformation and dynamic programme and the baselines plan with it, as the thesis does;
- the profiled latency, `StageLatency.profiled_ms`: the profile itself, linear between profiled batches,
  as `engine/plans/validate.py` reads profiles (`profiled_time_at_stage_ms`, `profiled_instances_needed`).
  The exact programme (`exact.py`), IPA and the validator (`validate.py`) use it, so that a plan called
  optimal is optimal on the latencies it is checked on. A stage built without a profile (a stated
  quadratic, as Table P1.3's application) reads the quadratic both ways.
Where this departs from P1 §p1.4.1: the thesis plans on the fitted model alone; a fleet's stages are
fitted with `stage_latency_bound` (the fit raised to lie nowhere below the profile), and sizing replicas
from that raised curve cost up to a third more instances than the profile needs (docs/benchmarks.md,
"Pipelines")."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

import numpy as np

# "infeasible": proved that no plan exists; "no-solution": none found in the time limit.
PipelineStatus = Literal["optimal", "feasible", "infeasible", "no-solution"]
INTENSITY_BATCHES = 16  # §p1.4.4: a stage's intensity is its mean latency over batch sizes 1..16


class PipelineProblemError(ValueError):
    """The pipeline problem is malformed or inconsistent; the message names the offending item."""


def queueing_delay_ms(batch: int, rate_rps: float) -> float:
    """The worst-case wait of a batch's first query, (b - 1) / lambda (P1.2, P3.7), in ms; infinite for
    b > 1 without traffic."""
    if batch == 1:
        return 0.0
    return math.inf if rate_rps <= 0 else 1000.0 * (batch - 1) / rate_rps


def instances_for(rate_rps: float, throughput_rps: float) -> int:
    """The fewest instances (replicas) of `throughput_rps` each that serve `rate_rps`: ceil(lambda / h), at
    least 1 (P1.3, P3.10c)."""
    return max(1, math.ceil(rate_rps / throughput_rps - 1e-9))


@dataclass(frozen=True)
class StageLatency:
    """d(b) = alpha*b^2 + beta*b + gamma, in milliseconds (the paper's model), and the profile it was fitted
    to, when known: (batch, latency ms) points by batch (`profile`, empty for a stated model)."""

    alpha: float
    beta: float
    gamma: float
    profile: tuple[tuple[int, float], ...] = ()

    def d(self, batch: int) -> float:
        return (self.alpha * batch + self.beta) * batch + self.gamma

    def throughput_rps(self, batch: int) -> float:
        """h(b): requests per second one instance serves at batch `batch`."""
        return 1000.0 * batch / self.d(batch)

    def profiled_ms(self, batch: int) -> float:
        """The latency a plan is checked on: the profile, linear between the profiled batches around `batch`
        (as engine/plans/capacity.py's `profile_interpolate`), infinite outside the profiled range (no batch
        there is valid); d(b) when there is no profile."""
        if not self.profile:
            return self.d(batch)
        points = self.profile
        if batch < points[0][0] or batch > points[-1][0]:
            return math.inf
        for (b0, ms0), (b1, ms1) in zip(points, points[1:]):
            if b0 <= batch <= b1:
                return ms0 if batch == b0 else ms1 if batch == b1 else ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
        return points[0][1]  # one profiled batch, and `batch` is it

    def profiled_throughput_rps(self, batch: int) -> float:
        """h(b) on the profiled latency: 0 outside the profiled range."""
        ms = self.profiled_ms(batch)
        return 0.0 if not math.isfinite(ms) else 1000.0 * batch / ms


def stage_latency_fit(points: Sequence[tuple[int, float]]) -> StageLatency:
    """Fit d(b) = alpha*b^2 + beta*b + gamma to profiled (batch, latency ms) points, as FA2 does (§p1.4.1:
    robust regression on the profiled tail latencies): SciPy's least squares with a soft-L1 loss, so one
    stray measurement does not bend the curve, started from the ordinary least-squares fit. With fewer than
    three distinct batch sizes the model is linear (one point: constant)."""
    from scipy.optimize import least_squares

    data = sorted((int(b), float(ms)) for b, ms in points)
    if not data:
        raise PipelineProblemError("a stage needs at least one profiled (batch, latency_ms) point")
    for b, ms in data:
        if b < 1 or not math.isfinite(ms) or ms <= 0:
            raise PipelineProblemError(f"profile point (batch {b}, {ms} ms): batch must be >= 1 and latency a finite number > 0")
    b = np.array([p[0] for p in data], dtype=float)
    y = np.array([p[1] for p in data], dtype=float)
    distinct = len(set(b.tolist()))
    degree = min(2, distinct - 1)
    if degree == 0:
        return StageLatency(0.0, 0.0, float(y.mean()))
    start = np.polyfit(b, y, degree)
    coefficients = np.concatenate([np.zeros(3 - len(start)), start])
    if distinct >= 4:  # the robust fit needs more points than parameters to have anything to be robust about
        scale = max(float(np.median(np.abs(y))) * 0.05, 1e-6)
        fit = least_squares(lambda c: np.polyval(c, b) - y, coefficients, loss="soft_l1", f_scale=scale)
        coefficients = fit.x
    alpha, beta, gamma = (float(c) for c in coefficients)
    model = StageLatency(alpha, beta, gamma)
    for batch in range(1, int(b.max()) + 1):
        if model.d(batch) <= 0:
            raise PipelineProblemError(f"the fitted latency model is not positive at batch {batch}: {model}; profile more batch sizes")
    return model


def stage_latency_bound(points: Sequence[tuple[int, float]]) -> StageLatency:
    """`stage_latency_fit`, raised until it is nowhere below the profile: at every whole batch from the
    smallest to the largest profiled one, d(b) >= the profile's latency there, read by linear interpolation
    between profiled batches (as the capacity model and the plan validator read profiles). A plan made
    with it keeps each path's SLO on the profiled latencies, not only on the fitted curve; the raise is the
    fit's largest shortfall, so a good fit moves little. The result carries the profile (`profile`), which
    the exact programme, IPA and the validator read (`StageLatency.profiled_ms`)."""
    model = stage_latency_fit(points)
    data = sorted((int(b), float(ms)) for b, ms in points)
    batches = np.array([b for b, _ in data], dtype=float)
    latencies = np.array([ms for _, ms in data], dtype=float)
    grid = np.arange(int(batches[0]), int(batches[-1]) + 1, dtype=float)
    profiled = np.interp(grid, batches, latencies)
    fitted = (model.alpha * grid + model.beta) * grid + model.gamma
    raise_ms = float(max(0.0, np.max(profiled - fitted)))
    return StageLatency(model.alpha, model.beta, model.gamma + raise_ms, profile=profile_points(data))


def profile_points(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """(batch, latency ms) points sorted by batch, one per batch (the slowest where a batch was profiled
    twice), as `StageLatency.profile` holds them."""
    slowest: dict[int, float] = {}
    for b, ms in points:
        slowest[int(b)] = max(float(ms), slowest.get(int(b), 0.0))
    return tuple(sorted(slowest.items()))


@dataclass(frozen=True)
class PipelineStage:
    """One DNN of the pipeline (an application in Tessera's registry), its latency model on one instance
    and the largest batch it may run."""

    name: str
    latency: StageLatency
    max_batch: int = 64


@dataclass(frozen=True)
class ExecutionPath:
    """A route through the pipeline: its stages in order, end-to-end SLO and rate (requests per second)."""

    name: str
    stages: tuple[str, ...]
    slo_ms: float
    rate_rps: float


@dataclass(frozen=True)
class PipelineProblem:
    stages: tuple[PipelineStage, ...]
    paths: tuple[ExecutionPath, ...]
    # Replicas are sized for this multiple of each stage's rate; queueing delay is the real rate's.
    headroom: float = 1.0
    by_name: Mapping[str, PipelineStage] = field(init=False, repr=False, compare=False)
    rates: Mapping[str, float] = field(init=False, repr=False, compare=False)  # lambda_s per stage

    def __post_init__(self) -> None:
        if not (isinstance(self.headroom, (int, float)) and math.isfinite(self.headroom) and self.headroom >= 1):
            raise PipelineProblemError(f"headroom must be a finite number >= 1, got {self.headroom!r}")
        object.__setattr__(self, "by_name", pipeline_problem_check(self.stages, self.paths))
        object.__setattr__(self, "rates", {s.name: sum(p.rate_rps for p in self.paths if s.name in p.stages) for s in self.stages})

    def stage_rate(self, name: str) -> float:
        """lambda_s: the summed rate of every path through stage `name`."""
        return self.rates[name]

    def edges(self) -> set[tuple[str, str]]:
        return {(p.stages[i], p.stages[i + 1]) for p in self.paths for i in range(len(p.stages) - 1)}

    def stage_order(self) -> list[str]:
        """The stages in a topological order of the DAG the paths draw (ties by name)."""
        edges = self.edges()
        indegree = {s.name: 0 for s in self.stages}
        for _u, v in edges:
            indegree[v] += 1
        ready = sorted(n for n, k in indegree.items() if k == 0)
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for u, v in sorted(edges):
                if u == n:
                    indegree[v] -= 1
                    if indegree[v] == 0:
                        ready.append(v)
                        ready.sort()
        return order

    def queueing_ms(self, name: str, batch: int) -> float:
        """q_s(b) = (b - 1) / lambda_s (P1.2), in ms; infinite for b > 1 at a stage without traffic."""
        return queueing_delay_ms(batch, self.rates[name])

    def time_at_stage_ms(self, name: str, batch: int) -> float:
        """l_s(b) = d_s(b) + q_s(b)."""
        return self.by_name[name].latency.d(batch) + self.queueing_ms(name, batch)

    def instances_needed(self, name: str, batch: int) -> int:
        """n_s(b) = ceil(headroom * lambda_s / h_s(b)), at least 1."""
        return instances_for(self.headroom * self.rates[name], self.by_name[name].latency.throughput_rps(batch))

    def profiled_time_at_stage_ms(self, name: str, batch: int) -> float:
        """l_s(b) on the profiled latency: `StageLatency.profiled_ms` + q_s(b) (infinite outside the profile)."""
        return self.by_name[name].latency.profiled_ms(batch) + self.queueing_ms(name, batch)

    def profiled_instances_needed(self, name: str, batch: int) -> int | None:
        """n_s(b) on the profiled latency: ceil(headroom * lambda_s / h_s(b)), at least 1; None outside the
        profiled range."""
        throughput = self.by_name[name].latency.profiled_throughput_rps(batch)
        return None if throughput <= 0 else instances_for(self.headroom * self.rates[name], throughput)

    def batch_penalty(self) -> float:
        """delta of P1.3: below one instance whatever the batches add up to."""
        return 1.0 / (1.0 + sum(s.max_batch for s in self.stages))


def pipeline_problem_check(stages: Sequence[PipelineStage], paths: Sequence[ExecutionPath]) -> dict[str, PipelineStage]:
    """The stages by name, or PipelineProblemError naming what is wrong: names unique, every path's stages
    exist and appear once on it, SLOs and rates valid, the paths draw a DAG, every stage on some path."""
    by_name: dict[str, PipelineStage] = {}
    for s in stages:
        if not s.name:
            raise PipelineProblemError("a stage needs a name")
        if s.name in by_name:
            raise PipelineProblemError(f"stage {s.name!r} is declared twice")
        if isinstance(s.max_batch, bool) or not isinstance(s.max_batch, int) or s.max_batch < 1:
            raise PipelineProblemError(f"stage {s.name!r}: max_batch must be an integer >= 1, got {s.max_batch!r}")
        if s.latency.d(1) <= 0:
            raise PipelineProblemError(f"stage {s.name!r}: its latency at batch 1 must be > 0")
        by_name[s.name] = s
    if not paths:
        raise PipelineProblemError("a pipeline needs at least one execution path")
    names: set[str] = set()
    used: set[str] = set()
    for p in paths:
        if not p.name or p.name in names:
            raise PipelineProblemError(f"execution path names must be non-empty and unique, got {p.name!r}")
        names.add(p.name)
        if not p.stages:
            raise PipelineProblemError(f"path {p.name!r} has no stages")
        unknown = [s for s in p.stages if s not in by_name]
        if unknown:
            raise PipelineProblemError(f"path {p.name!r} names stages that are not declared: {unknown}")
        if len(set(p.stages)) != len(p.stages):
            raise PipelineProblemError(f"path {p.name!r} visits a stage twice: {list(p.stages)}")
        if not (isinstance(p.slo_ms, (int, float)) and math.isfinite(p.slo_ms) and p.slo_ms > 0):
            raise PipelineProblemError(f"path {p.name!r}: slo_ms must be a finite number > 0, got {p.slo_ms!r}")
        if not (isinstance(p.rate_rps, (int, float)) and math.isfinite(p.rate_rps) and p.rate_rps >= 0):
            raise PipelineProblemError(f"path {p.name!r}: rate_rps must be a finite number >= 0, got {p.rate_rps!r}")
        used.update(p.stages)
    idle = sorted(set(by_name) - used)
    if idle:
        raise PipelineProblemError(f"stages on no execution path: {idle}")
    paths_acyclic_check({(p.stages[i], p.stages[i + 1]) for p in paths for i in range(len(p.stages) - 1)})
    return by_name


def paths_acyclic_check(edges: set[tuple[str, str]]) -> None:
    """PipelineProblemError naming a cycle when the edges (stage, next stage) have one."""
    successors: dict[str, list[str]] = {}
    for u, v in edges:
        successors.setdefault(u, []).append(v)
    state: dict[str, int] = {}  # 1: on the current walk, 2: done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(successors.get(node, ())):
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
                raise PipelineProblemError(f"the execution paths form a cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(successors):
        if node not in state:
            visit(node, [node])


@dataclass(frozen=True)
class StageDecision:
    stage: str
    batch: int
    instances: int


@dataclass(frozen=True)
class PipelinePlan:
    """A solver's answer: per stage its batch and instances, and how the solve went (the objective is
    instances + delta * batches, P1.3; `bound` and `gap` where the solver proves one)."""

    solver: str
    status: PipelineStatus
    decisions: Mapping[str, StageDecision]
    objective: float | None
    bound: float | None = None
    gap: float | None = None
    runtime_s: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def instances(self) -> int:
        return sum(d.instances for d in self.decisions.values())


def plan_objective(problem: PipelineProblem, decisions: Mapping[str, StageDecision]) -> float:
    delta = problem.batch_penalty()
    return float(sum(d.instances + delta * d.batch for d in decisions.values()))


def decisions_from_batches(problem: PipelineProblem, batches: Mapping[str, int]) -> dict[str, StageDecision]:
    """Each stage's fewest instances for its batch: n_s(b)."""
    return {name: StageDecision(name, b, problem.instances_needed(name, b)) for name, b in batches.items()}
