"""Latency of a model on an MPS partition, L(b, p), and the two partition sizes Algorithm 1 of gpulets
(ATC'22, §4.3) picks from: p_eff and p_req.

Transcribed from §4.3: "p_eff is the partition size that yields the highest performance per resource,
which is the knee point in Figure 4. It is determined during profiling. p_req is the partition size
satisfying SLO with the batch size that can handle the input rate. [...] The scheduler picks the minimum
of p_eff and p_req as the ideal partition size p_ideal. [...] for a given model, a matching batch size is
fixed for the p_eff of the model." And line 20 of Algorithm 1: b <- argmax_k (L(k, gpulet.size) + intf
<= SLO), the largest batch that meets the SLO with the interference overhead.

Here "performance per resource" is throughput (b / L(b, p)) per percent of the GPU, over the batches whose
latency meets the SLO; a tie goes to the smaller partition. Between measured batch sizes L is linear in
the batch (the measured curves are close to linear; the paper profiles batches, not a formula). Departures:
partitions are only those measured (no interpolation across partition sizes: the scheduler only uses the
profiled sizes), a batch outside the measured range is refused, not extrapolated; and the interference
overhead is a factor on L (engine/sharing/interference.py) where the paper adds `intf`."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from engine.reference.profiles import GpuletPoint


class LatencyUnknown(ValueError):
    """No profile covers the asked model, partition or batch."""


@dataclass(frozen=True)
class PartitionChoice:
    """A partition size and the largest batch that meets the SLO on it, with that batch's latency and
    throughput."""

    percent: int
    batch: int
    latency_ms: float
    throughput_rps: float


@dataclass
class PartitionLatencyModel:
    """Profiled latency (ms, whole batch) per model, partition percent and batch size."""

    points: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)  # (model, percent) -> [(batch, ms)]

    @classmethod
    def from_points(cls, points: Iterable[tuple[str, int, int, float]]) -> "PartitionLatencyModel":
        """From (model, batch, percent, latency_ms) tuples."""
        table: dict[tuple[str, int], dict[int, float]] = {}
        for model, batch, percent, latency_ms in points:
            table.setdefault((model, percent), {})[batch] = latency_ms
        return cls({key: sorted(batches.items()) for key, batches in table.items()})

    def models(self) -> list[str]:
        return sorted({model for model, _ in self.points})

    def partitions(self, model: str) -> list[int]:
        return sorted(percent for m, percent in self.points if m == model)

    def batches(self, model: str, percent: int) -> list[int]:
        return [b for b, _ in self._curve(model, percent)]

    def _curve(self, model: str, percent: int) -> list[tuple[int, float]]:
        curve = self.points.get((model, percent))
        if not curve:
            known = self.partitions(model)
            raise LatencyUnknown(f"no profile of {model} on {percent} % of the GPU" + (f" (profiled: {known})" if known else " (model unknown)"))
        return curve

    def latency_ms(self, model: str, batch: int, percent: int) -> float:
        """L(batch, percent): measured, or linear between the two measured batches around it."""
        curve = self._curve(model, percent)
        batches = [b for b, _ in curve]
        if not batches[0] <= batch <= batches[-1]:
            raise LatencyUnknown(f"{model} on {percent} %: batch {batch} is outside the profiled {batches[0]}..{batches[-1]}")
        i = bisect.bisect_left(batches, batch)
        if batches[i] == batch:
            return curve[i][1]
        (b0, l0), (b1, l1) = curve[i - 1], curve[i]
        return l0 + (l1 - l0) * (batch - b0) / (b1 - b0)

    def throughput_rps(self, model: str, batch: int, percent: int) -> float:
        return batch * 1000.0 / self.latency_ms(model, batch, percent)

    def largest_batch_within(self, model: str, percent: int, budget_ms: float, *, interference: float = 1.0) -> PartitionChoice | None:
        """Algorithm 1, line 20: the largest batch whose latency, times the interference factor, fits the
        budget (None: not even the smallest profiled batch does)."""
        curve = self._curve(model, percent)
        best = None
        for batch in range(curve[0][0], curve[-1][0] + 1):
            latency = self.latency_ms(model, batch, percent) * interference
            if latency <= budget_ms:
                best = PartitionChoice(percent, batch, latency, batch * 1000.0 / latency)
        return best

    def partition_efficient(self, model: str, slo_ms: float, *, partitions: Sequence[int] | None = None,
                            interference: float = 1.0) -> PartitionChoice | None:
        """p_eff: the partition with the highest throughput per percent of the GPU, each at its largest
        batch within the SLO; a tie goes to the smaller partition (None: no partition meets the SLO)."""
        best: PartitionChoice | None = None
        for percent in sorted(partitions or self.partitions(model)):
            choice = self.largest_batch_within(model, percent, slo_ms, interference=interference)
            if choice is not None and (best is None or choice.throughput_rps / percent > best.throughput_rps / best.percent * (1 + 1e-9)):
                best = choice
        return best

    def partition_required(self, model: str, rate_rps: float, slo_ms: float, *, partitions: Sequence[int] | None = None,
                           interference: float = 1.0) -> PartitionChoice | None:
        """p_req: the smallest partition whose largest batch within the SLO serves `rate_rps` (None: no
        single partition does; the rate needs several gpulets)."""
        for percent in sorted(partitions or self.partitions(model)):
            choice = self.largest_batch_within(model, percent, slo_ms, interference=interference)
            if choice is not None and choice.throughput_rps >= rate_rps:
                return choice
        return None

    def partition_ideal(self, model: str, rate_rps: float, slo_ms: float, *, partitions: Sequence[int] | None = None,
                        interference: float = 1.0) -> PartitionChoice | None:
        """p_ideal = min(p_eff, p_req) (Algorithm 1, line 8); p_eff when no single partition serves the rate."""
        efficient = self.partition_efficient(model, slo_ms, partitions=partitions, interference=interference)
        required = self.partition_required(model, rate_rps, slo_ms, partitions=partitions, interference=interference)
        if efficient is None or required is None:
            return efficient
        return required if required.percent < efficient.percent else efficient


def partition_latency_model_from_gpulet(points: Iterable[GpuletPoint]) -> PartitionLatencyModel:
    """The model of shared/data/gpulet/inference.csv (`engine.reference.profiles.gpulet_inference_read`)."""
    return PartitionLatencyModel.from_points((p.model, p.batch, p.partition_pct, p.latency_ms) for p in points)
