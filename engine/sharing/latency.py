"""Latency of a model on an MPS partition, L(b, p), and the partition sizes Algorithm 1 of gpulets (ATC'22,
§4.3) picks from: p_eff (the knee), p_req and p_ideal.

Transcribed from §4.3: "p_eff is the partition size that yields the highest performance per resource,
which is the knee point in Figure 4. It is determined during profiling. p_req is the partition size
satisfying SLO with the batch size that can handle the input rate. [...] The scheduler picks the minimum
of p_eff and p_req as the ideal partition size p_ideal. [...] for a given model, a matching batch size is
fixed for the p_eff of the model." §5.2: "models show diminishing returns (over increasing GPU partitions)
beyond a knee point. Note that different batch sizes can have different knee points." And line 20 of
Algorithm 1: b <- argmax_k (L(k, gpulet.size) + intf <= SLO), the largest batch that meets the SLO with the
interference overhead.

Interpolation (measured points are returned exactly):
- across partitions, linear in 1/p between the two measured partitions around p. A compute-bound batch
  runs in L ~ W / p (vgg19 at batch 64 on engine/reference/data/gpulet: L x p within 10 % from 20 % to 60 %) and a
  small batch in a flat L; a line in 1/p is exact for both. Leaving each inner partition out of
  engine/reference/data/gpulet and predicting it from its neighbours: 1.5 % / 4.8 % / 10 % error (p50 / p90 / max)
  in 1/p, 2.0 % / 19 % / 24 % linear in p.
- across batches, linear in b between the two measured batches around b (the same test, batches 2..32
  from their neighbours: 1.5 % / 13 % linear in b, 2.7 % / 19 % log-log).
A batch or a partition outside the measured range is refused (`LatencyUnknown`), never extrapolated.
Departure: the interference overhead is a factor on L (engine/sharing/interference.py predicts co-run over
solo latency) where the paper adds `intf`."""
from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engine.reference.profiles import GpuletPoint
from engine.sharing.partitions import MPS_PARTITIONS_DEFAULT

__all__ = [
    "KNEE_TOLERANCE_DEFAULT",
    "LatencyUnknown",
    "PartitionChoice",
    "PartitionLatencyModel",
    "partition_latency_model_from_gpulet",
]

# Throughput per percent within 10 % of the best counts as "the highest": latencies that should be equal (a
# small batch across partitions) scatter by about 2 % on engine/reference/data/gpulet, and a measured curve bends into
# its knee, not at a corner.
KNEE_TOLERANCE_DEFAULT = 0.1


class LatencyUnknown(ValueError):
    """No profile covers the asked model, partition or batch."""


@dataclass(frozen=True)
class PartitionChoice:
    """A partition size, a batch on it, that batch's latency (times the interference factor, if one was
    given) and its throughput."""

    percent: int
    batch: int
    latency_ms: float
    throughput_rps: float

    @property
    def throughput_per_percent(self) -> float:
        """gpulets' "performance per resource" (§4.3): requests per second per percent of the GPU."""
        return self.throughput_rps / self.percent


@dataclass(frozen=True)
class PartitionLatencyModel:
    """Profiled latency (ms, whole batch) per model, partition percent and batch size."""

    points: dict[tuple[str, int], list[tuple[int, float]]]  # (model, percent) -> [(batch, ms)], batch ascending
    _partitions: dict[str, list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_model: dict[str, list[int]] = {}
        for model, percent in self.points:
            by_model.setdefault(model, []).append(percent)
        object.__setattr__(self, "_partitions", {model: sorted(percents) for model, percents in by_model.items()})

    @classmethod
    def from_points(cls, points: Iterable[tuple[str, int, int, float]]) -> PartitionLatencyModel:
        """From (model, batch, percent, latency_ms) tuples; a point that cannot be a measurement, or one
        measured twice with two latencies, is a ValueError naming it."""
        table: dict[tuple[str, int], dict[int, float]] = {}
        for model, batch, percent, latency_ms in points:
            where = f"profile point ({model}, batch {batch}, {percent} %)"
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError(f"{where}: batch must be a whole number >= 1")
            if isinstance(percent, bool) or not isinstance(percent, int) or not 0 < percent <= 100:
                raise ValueError(f"{where}: partition must be a whole percent in 1..100")
            if not math.isfinite(latency_ms) or latency_ms <= 0:
                raise ValueError(f"{where}: latency must be a positive number of ms, got {latency_ms!r}")
            known = table.setdefault((model, percent), {})
            if batch in known and known[batch] != latency_ms:
                raise ValueError(f"{where}: measured twice ({known[batch]} ms and {latency_ms} ms)")
            known[batch] = float(latency_ms)
        return cls({key: sorted(batches.items()) for key, batches in table.items()})

    # ----------------------------------------------------------------- what was measured

    def models(self) -> list[str]:
        return sorted(self._partitions)

    def partitions(self, model: str) -> list[int]:
        """The measured partitions of `model`, ascending."""
        return list(self._partitions.get(model, ()))

    def batches(self, model: str, percent: int) -> list[int]:
        """The measured batches of `model` on a measured partition."""
        return [b for b, _ in self._curve(model, percent)]

    def _curve(self, model: str, percent: int) -> list[tuple[int, float]]:
        curve = self.points.get((model, percent))
        if not curve:
            known = self.partitions(model)
            detail = f"profiled: {known}" if known else "model unknown"
            raise LatencyUnknown(f"no profile of {model} on {percent} % of the GPU ({detail})")
        return curve

    def _bracket(self, model: str, percent: float) -> tuple[int, int]:
        """The measured partitions around `percent` (the same one twice if it was measured)."""
        known = self._partitions.get(model)
        if not known:
            raise LatencyUnknown(f"no profile of {model} (model unknown; profiled: {', '.join(self.models())})")
        if not known[0] <= percent <= known[-1]:
            raise LatencyUnknown(f"{model}: {percent} % of the GPU is outside the profiled partitions {known[0]}..{known[-1]} %")
        i = bisect.bisect_left(known, percent)
        return (known[i], known[i]) if known[i] == percent else (known[i - 1], known[i])

    def batch_range(self, model: str, percent: float) -> tuple[int, int]:
        """The smallest and largest batch known on `percent` (on both measured partitions around it)."""
        low, high = self._bracket(model, percent)
        curves = (self._curve(model, low), self._curve(model, high))
        first, last = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
        if first > last:
            raise LatencyUnknown(f"{model}: no batch is profiled on both {low} % and {high} %")
        return first, last

    # ----------------------------------------------------------------- L(b, p)

    def latency_ms(self, model: str, batch: int, percent: float) -> float:
        """L(batch, percent): measured, or interpolated (linear in the batch, linear in 1 / percent; see the
        module's docstring); LatencyUnknown outside the profiled batches or partitions."""
        low, high = self._bracket(model, percent)
        first, last = self.batch_range(model, percent)
        if not first <= batch <= last:
            where = f"{percent} %" if low == high else f"{percent} % (between the profiled {low} % and {high} %)"
            raise LatencyUnknown(f"{model} on {where}: batch {batch} is outside the profiled {first}..{last}")
        at_low = _along_batches(self._curve(model, low), batch)
        if low == high:
            return at_low
        at_high = _along_batches(self._curve(model, high), batch)
        weight = (1 / percent - 1 / low) / (1 / high - 1 / low)
        return at_low + (at_high - at_low) * weight

    def throughput_rps(self, model: str, batch: int, percent: float) -> float:
        """Requests per second at `batch` on `percent`, run back to back: batch / L(b, p)."""
        return batch * 1000.0 / self.latency_ms(model, batch, percent)

    def _choice(self, model: str, batch: int, percent: int, interference: float) -> PartitionChoice:
        latency = self.latency_ms(model, batch, percent) * interference
        return PartitionChoice(percent, batch, latency, batch * 1000.0 / latency)

    def largest_batch_within(self, model: str, percent: int, budget_ms: float, *, batches: Iterable[int] | None = None,
                             interference: float = 1.0) -> PartitionChoice | None:
        """Algorithm 1, line 20: the largest batch whose L(b, percent) times the interference factor fits
        `budget_ms` (None: no candidate fits). Candidates: `batches`, else every whole batch in the profiled
        range; a candidate outside that range is refused (LatencyUnknown). Every candidate is tried, since a
        measured curve is not always monotone at small batches."""
        _interference_check(interference)
        if batches is None:
            first, last = self.batch_range(model, percent)
            candidates = range(last, first - 1, -1)
        else:
            candidates = sorted(set(batches), reverse=True)
        for batch in candidates:
            choice = self._choice(model, batch, percent, interference)
            if choice.latency_ms <= budget_ms:
                return choice
        return None

    # ----------------------------------------------------------------- p_eff, p_req, p_ideal

    def partition_knee(self, model: str, batch: int | None, *, slo_ms: float | None = None,
                       partitions: Sequence[int] = MPS_PARTITIONS_DEFAULT, interference: float = 1.0,
                       tolerance: float = KNEE_TOLERANCE_DEFAULT) -> PartitionChoice | None:
        """p_eff (gpulets §4.3, "the partition size that yields the highest performance per resource, which
        is the knee point in Figure 4"): among `partitions`, the largest whose throughput per percent is
        within `tolerance` of the best. Chosen where the paper is vague: performance per resource is
        throughput / percent, and the knee is the *largest* partition of (near) best efficiency, since for a
        curve L = max(L_floor, W / p) the efficiency is flat up to the knee and falls beyond it.

        `batch` fixes the batch (one curve of Figure 4; §5.2: "different batch sizes can have different knee
        points"); None lets each partition take its largest batch within `slo_ms` (the "matching batch size"
        of §4.3). With `slo_ms`, only partitions whose latency (times `interference`) meets it count. None:
        no partition meets the SLO."""
        _interference_check(interference)
        if not 0 <= tolerance < 1:
            raise ValueError(f"knee tolerance must be in [0, 1), got {tolerance!r}")
        if batch is None and slo_ms is None:
            raise ValueError("partition_knee needs a batch or an SLO (the batch is then the largest within it)")
        candidates = []
        for percent in sorted(set(partitions)):
            if batch is None:
                choice = self.largest_batch_within(model, percent, slo_ms, interference=interference)
            else:
                choice = self._choice(model, batch, percent, interference)
                if slo_ms is not None and choice.latency_ms > slo_ms:
                    choice = None
            if choice is not None:
                candidates.append(choice)
        if not candidates:
            return None
        floor = max(choice.throughput_per_percent for choice in candidates) * (1 - tolerance) * (1 - 1e-12)  # 1e-12: exact ties
        return max((c for c in candidates if c.throughput_per_percent >= floor), key=lambda c: c.percent)

    def partition_efficient(self, model: str, slo_ms: float, *, partitions: Sequence[int] = MPS_PARTITIONS_DEFAULT,
                            interference: float = 1.0, tolerance: float = KNEE_TOLERANCE_DEFAULT) -> PartitionChoice | None:
        """p_eff as Algorithm 1 line 6 (MAXEFFICIENTPARTITION) uses it: the knee with each partition at its
        largest batch within the SLO (`partition_knee` with batch None)."""
        return self.partition_knee(model, None, slo_ms=slo_ms, partitions=partitions, interference=interference,
                                   tolerance=tolerance)

    def partition_required(self, model: str, rate_rps: float, slo_ms: float, *, partitions: Sequence[int] = MPS_PARTITIONS_DEFAULT,
                           interference: float = 1.0) -> PartitionChoice | None:
        """p_req (Algorithm 1 line 7, MINREQUIREDPARTITION): the smallest partition whose largest batch
        within the SLO serves `rate_rps` run back to back (None: no single partition does; the rate needs
        several gpulets)."""
        for percent in sorted(set(partitions)):
            choice = self.largest_batch_within(model, percent, slo_ms, interference=interference)
            if choice is not None and choice.throughput_rps >= rate_rps:
                return choice
        return None

    def partition_ideal(self, model: str, rate_rps: float, slo_ms: float, *, partitions: Sequence[int] = MPS_PARTITIONS_DEFAULT,
                        interference: float = 1.0, tolerance: float = KNEE_TOLERANCE_DEFAULT) -> PartitionChoice | None:
        """p_ideal = min(p_eff, p_req) (Algorithm 1, line 8); p_eff when no single partition serves the rate."""
        efficient = self.partition_efficient(model, slo_ms, partitions=partitions, interference=interference, tolerance=tolerance)
        required = self.partition_required(model, rate_rps, slo_ms, partitions=partitions, interference=interference)
        if efficient is None or required is None:
            return efficient
        return required if required.percent < efficient.percent else efficient


def _along_batches(curve: list[tuple[int, float]], batch: int) -> float:
    """The latency at `batch` on one measured partition: measured, or linear between its two neighbours."""
    batches = [b for b, _ in curve]
    i = bisect.bisect_left(batches, batch)
    if batches[i] == batch:
        return curve[i][1]
    (b0, l0), (b1, l1) = curve[i - 1], curve[i]
    return l0 + (l1 - l0) * (batch - b0) / (b1 - b0)


def _interference_check(factor: float) -> None:
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"interference factor must be a positive number (1: none), got {factor!r}")


def partition_latency_model_from_gpulet(points: Iterable[GpuletPoint]) -> PartitionLatencyModel:
    """The model of engine/reference/data/gpulet/inference.csv (`engine.reference.profiles.gpulet_inference_read`)."""
    return PartitionLatencyModel.from_points((p.model, p.batch, p.partition_pct, p.latency_ms) for p in points)
