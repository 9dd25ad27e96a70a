"""Reference pipelines for tests and benches.

`fa2_table_p13_problem`: the application of FA2's evaluation (Razavi's thesis P1 §p1.6.1) as a pipeline
problem: its ten DNNs (Table P1.2) and six execution paths with their SLAs on CPUs and GPUs (Table P1.3).

The thesis gives the paths and SLAs but only plots the DNNs' latencies (Figures P1.6-P1.7), so the
profiles here are stated, not measured: each DNN's latency at batch 1 is chosen so that every path's SLA
is five times the sum of its DNNs' batch-1 latencies, which is how the thesis set its SLAs ("the tail
processing time [...] under batch size b = 1 [...] multiplied by a factor of five"); the batch curve is
d(b) = d(1) * (g + k*b + a*b^2) / (g + k + a), with (g, k, a) = (0.5, 0.5, 0.002) on a CPU core (the
throughput of an instance grows up to a batch of about 16) and (0.8, 0.2, 0.001) on a 10 % GPU share
(batching pays more). `seed` perturbs every d(1) by up to +-`spread` and the curve's shape, for many
distinct instances of the same structure."""
from __future__ import annotations

import random

from engine.pipelines.ipa import IpaPipeline, IpaStage, IpaVariant
from engine.pipelines.problem import ExecutionPath, PipelineProblem, PipelineStage, StageLatency

TABLE_P13_PATHS: tuple[tuple[str, float, float], ...] = (
    # (stages, SLA on CPU ms, SLA on GPU ms)
    ("OBJD ALPR QUAN", 3020, 1205),
    ("OBJD NSFW FACR", 3505, 1670),
    ("OBJD OBIR IMGS", 3095, 960),
    ("SUMR QUAN", 13580, 2200),
    ("AUTT QUAN", 12245, 3005),
    ("AUTT SUMR TCLS", 25710, 4815),
)
# Batch-1 latencies (ms) that make each SLA five times its path's sum (stated; see the module docstring).
BATCH1_MS = {
    "cpu": dict(OBJD=150, ALPR=200, QUAN=254, NSFW=100, FACR=451, OBIR=300, IMGS=169, SUMR=2462, AUTT=2195, TCLS=485),
    "gpu": dict(OBJD=60, ALPR=101, QUAN=80, NSFW=74, FACR=200, OBIR=72, IMGS=60, SUMR=360, AUTT=521, TCLS=82),
}
CURVE = {"cpu": (0.5, 0.5, 0.002), "gpu": (0.8, 0.2, 0.001)}


def fa2_table_p13_problem(rate_rps: float, *, device: str = "cpu", max_batch: int = 32, seed: int | None = None,
                          spread: float = 0.3, path_weights: tuple[float, ...] | None = None) -> PipelineProblem:
    """Table P1.3's application at `rate_rps` requests per second in all, split over the six paths evenly
    (or by `path_weights`)."""
    if device not in BATCH1_MS:
        raise ValueError(f"device must be one of {sorted(BATCH1_MS)}, got {device!r}")
    rng = random.Random(seed) if seed is not None else None  # nosec B311 - seeded reference data, not a secret
    g, k, a = CURVE[device]
    stages = []
    for name, d1 in BATCH1_MS[device].items():
        gg, kk, aa = g, k, a
        if rng is not None:
            d1 *= rng.uniform(1 - spread, 1 + spread)
            kk *= rng.uniform(0.7, 1.3)
            aa *= rng.uniform(0.5, 2.0)
        total = gg + kk + aa
        stages.append(PipelineStage(name, StageLatency(d1 * aa / total, d1 * kk / total, d1 * gg / total), max_batch))
    weights = path_weights or tuple(1.0 for _ in TABLE_P13_PATHS)
    if len(weights) != len(TABLE_P13_PATHS) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError("path_weights: one non-negative weight per path of Table P1.3, not all zero")
    column = 1 if device == "cpu" else 2
    paths = tuple(
        ExecutionPath(f"p{i + 1}", tuple(row[0].split()), float(row[column]), rate_rps * w / sum(weights))
        for i, (row, w) in enumerate(zip(TABLE_P13_PATHS, weights))
    )
    return PipelineProblem(tuple(stages), paths)


def ipa_random_pipeline(seed: int, stages: int, variants: int, *, max_batch: int = 16, alpha: float = 20.0, beta: float = 0.02,
                        slo_factor: tuple[float, float] = (3.0, 8.0), rate_rps: tuple[float, float] = (5.0, 80.0)) -> IpaPipeline:
    """A linear pipeline for IPA (thesis P3) with the trade-off IPA is about, stated: variant m of a stage is
    about 1 + m times slower than variant 0, takes 1 + m cores and is 0.1 * m more accurate (from 0.5, at
    most 1); latencies d(b) = a*b^2 + k*b + g with k in 2..6 ms and g in 5..20 ms (times the slowdown); the
    SLO is `slo_factor` (drawn) times the sum of the stages' fastest batch-1 latencies, the rate drawn from
    `rate_rps`."""
    rng = random.Random(seed)  # nosec B311 - seeded reference data, not a secret
    built = []
    for s in range(stages):
        vs = []
        for m in range(variants):
            speed = 1 + m + rng.uniform(-0.3, 0.3)
            vs.append(IpaVariant(f"v{m}", accuracy=min(1.0, 0.5 + 0.1 * m + rng.uniform(0, 0.05)), cores=1 + m,
                                 latency=StageLatency(rng.uniform(0, 0.05) * speed, rng.uniform(2, 6) * speed, rng.uniform(5, 20) * speed)))
        built.append(IpaStage(f"s{s}", tuple(vs), max_batch))
    base = sum(min(v.latency.d(1) for v in st.variants) for st in built)
    return IpaPipeline(f"random-{seed}", tuple(built), slo_ms=base * rng.uniform(*slo_factor), rate_rps=rng.uniform(*rate_rps), alpha=alpha, beta=beta)
