"""The reference the pipeline solvers are checked against: random pipelines with profiled latencies
(chains, forks, joins, DAGs; seeded), and the optimum of P1.3 (Razavi's thesis, P1 §p1.4.3) found by
enumerating every batch size of every stage.

It is written apart from the solvers on purpose: it reads each stage's latency from the raw profile
points with its own linear interpolation between profiled batches (as `engine/plans/validate.py` reads
profiles), sizes instances as ceil(headroom * lambda_s * d_s(b) / (1000 b)) (at least 1) and charges the
wait (b - 1) / lambda_s, and shares no code with `exact.py`, `fa2.py` or `StageLatency`. Small pipelines
only: the enumeration is prod_s max_batch_s combinations (benches/pipelines.py, tests/engine/
test_pipelines_exact.py)."""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Literal, Mapping

from engine.pipelines.problem import ExecutionPath, PipelineProblem, PipelineStage, stage_latency_bound

__all__ = ["BruteForceOptimum", "ProfiledPipeline", "SHAPES", "p13_brute_force", "profiled_pipeline_random"]

Shape = Literal["chain", "fork", "join", "dag"]
SHAPES: tuple[Shape, ...] = ("chain", "fork", "join", "dag")
PROFILED_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ProfiledPipeline:
    """A pipeline as its profiles give it: per stage the profiled (batch, latency ms) points and the largest
    batch (the largest profiled one), and the execution paths."""

    name: str
    shape: str
    profiles: Mapping[str, tuple[tuple[int, float], ...]]
    max_batch: Mapping[str, int]
    paths: tuple[ExecutionPath, ...]
    headroom: float = 1.0

    def problem(self) -> PipelineProblem:
        """The pipeline problem as the fleet planner builds it (engine/solvers/pipelines.py): each stage's
        latency `stage_latency_bound` of its profile, batches up to the largest profiled one."""
        stages = tuple(PipelineStage(name, stage_latency_bound(points), self.max_batch[name]) for name, points in self.profiles.items())
        return PipelineProblem(stages, self.paths, headroom=self.headroom)


@dataclass(frozen=True)
class BruteForceOptimum:
    """The optimum of P1.3: per stage (batch, instances); the instances in all and the objective
    (instances + delta * batches, delta = 1 / (1 + sum of max batches), as `PipelineProblem`'s)."""

    batches: Mapping[str, int]
    instances_per_stage: Mapping[str, int]
    instances: int
    objective: float


def _lerp(points: tuple[tuple[int, float], ...], batch: int) -> float | None:
    """Linear between the profiled batches around `batch`; None outside the profiled range."""
    for (b0, ms0), (b1, ms1) in zip(points, points[1:]):
        if b0 <= batch <= b1:
            return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
    if len(points) == 1 and points[0][0] == batch:
        return points[0][1]
    return None


def p13_brute_force(pipeline: ProfiledPipeline) -> BruteForceOptimum | None:
    """The optimum of P1.3 on the profiled latencies, by enumerating every combination of batch sizes (the
    fewest instances follow from each batch); None when no combination meets every path's SLO."""
    names = list(pipeline.profiles)
    rate = {s: sum(p.rate_rps for p in pipeline.paths if s in p.stages) for s in names}
    options: list[list[tuple[int, float, int]]] = []  # per stage: (batch, time at the stage, instances)
    for s in names:
        points = tuple(sorted(pipeline.profiles[s]))
        mine = []
        for b in range(1, pipeline.max_batch[s] + 1):
            latency = _lerp(points, b)
            if latency is None:
                continue
            if b > 1 and rate[s] <= 0:
                continue
            wait = 0.0 if b == 1 else 1000.0 * (b - 1) / rate[s]
            instances = max(1, math.ceil(pipeline.headroom * rate[s] * latency / (1000.0 * b) - 1e-9))
            mine.append((b, latency + wait, instances))
        options.append(mine)
    index = {s: i for i, s in enumerate(names)}
    on_path = [[index[s] for s in p.stages] for p in pipeline.paths]
    delta = 1.0 / (1.0 + sum(pipeline.max_batch[s] for s in names))
    best: tuple[float, tuple] | None = None
    for combo in itertools.product(*options):
        if any(sum(combo[i][1] for i in stages) > p.slo_ms + 1e-6 for stages, p in zip(on_path, pipeline.paths)):
            continue
        value = sum(n + delta * b for b, _t, n in combo)
        if best is None or value < best[0] - 1e-12:
            best = (value, combo)
    if best is None:
        return None
    value, combo = best
    return BruteForceOptimum({s: c[0] for s, c in zip(names, combo)}, {s: c[2] for s, c in zip(names, combo)},
                             sum(c[2] for c in combo), value)


def _profile(rng: random.Random) -> tuple[tuple[int, float], ...]:
    """A CPU-like profile: batch-1 latency 5-60 ms, growing sublinearly or about linearly in the batch with a
    few per cent of noise (non-decreasing), the shapes a quadratic fits only roughly."""
    d1 = rng.uniform(5.0, 60.0)
    fixed = rng.uniform(0.2, 0.7)
    power = rng.uniform(0.6, 1.15)
    out, last = [], 0.0
    for b in PROFILED_BATCHES:
        ms = d1 * (fixed + (1 - fixed) * b ** power) * (1 + rng.uniform(-0.06, 0.06))
        last = max(last, ms)
        out.append((b, round(last, 3)))
    return tuple(out)


def _shape_paths(shape: Shape, rng: random.Random) -> tuple[list[str], list[tuple[str, ...]]]:
    """Stage names and the stage sequences of the paths, for a shape: a chain of 2-5 stages; a fork (one
    entry, two or three branches of one or two stages); a join (two or three entries into a shared tail of
    one or two stages); a DAG (a diamond a -> b | c -> d, with a third path a -> d or an extra stage)."""
    if shape == "chain":
        n = rng.randint(2, 5)
        stages = [f"s{i}" for i in range(n)]
        return stages, [tuple(stages)]
    if shape == "fork":
        branches = [[f"b{k}{j}" for j in range(rng.randint(1, 2))] for k in range(rng.randint(2, 3))]
        return ["root"] + [s for br in branches for s in br], [("root", *br) for br in branches]
    if shape == "join":
        entries = [f"in{k}" for k in range(rng.randint(2, 3))]
        tail = [f"t{j}" for j in range(rng.randint(1, 2))]
        return entries + tail, [(e, *tail) for e in entries]
    paths = [("a", "b", "d"), ("a", "c", "d")]
    if rng.random() < 0.5:
        paths.append(("a", "d"))
        return ["a", "b", "c", "d"], paths
    paths.append(("a", "c", "e"))
    return ["a", "b", "c", "d", "e"], paths


def profiled_pipeline_random(seed: int, shape: Shape, *, headroom: float = 1.0) -> ProfiledPipeline:
    """A random pipeline of `shape` (see `_shape_paths`) with profiled latencies at batches 1, 2, 4, 8 and
    batches up to 8; each path's rate 5-60 requests/s and its SLO 1.5-5 times the sum of its stages'
    batch-1 latencies (tight enough that batches and SLOs trade against each other)."""
    rng = random.Random(f"{shape}-{seed}")  # nosec B311 - seeded test instances, not a secret
    names, sequences = _shape_paths(shape, rng)
    profiles = {s: _profile(rng) for s in names}
    paths = tuple(ExecutionPath(f"p{i}", seq, round(sum(profiles[s][0][1] for s in seq) * rng.uniform(1.5, 5.0), 2),
                                round(rng.uniform(5.0, 60.0), 2)) for i, seq in enumerate(sequences))
    return ProfiledPipeline(f"{shape}-{seed}", shape, profiles, {s: PROFILED_BATCHES[-1] for s in names}, paths, headroom)
