"""FA2's graph transformation (Razavi's thesis P1 §p1.4.4), transcribed.

"If an application's dataflow graph [...] does not contain both ingress and egress aggregators at more than
one DNN", the scaling problem decomposes; FA2 removes ingress aggregators (a DNN that receives requests
from several preceding DNNs). The *sharing degree* of an edge is the number of execution paths using it.
"We loop through all the ingress aggregator DNNs and pick the edge with the lowest sharing degree to
remove." Each path using the removed edge is split into two segments, p1 before the edge and p2 after it,
which are then planned as independent paths; the SLO is split in proportion to the segments' *intensity*,
a DNN's intensity Int_s being its processing time averaged over batch sizes 1..16 (P1.4):

    SLA_p1 = sum_{s in p1} Int_s / sum_{s in p} Int_s * SLA_p,   SLA_p2 = SLA_p - SLA_p1.

"We repeat the above procedure until no ingress aggregators can be found." The rate at each DNN stays the
sum over the original paths (`PipelineProblem.stage_rate`).

Where this departs: ties between edges of equal sharing degree, which the paper leaves open, go to the
edge whose predecessor's name sorts first, and the aggregators are handled in name order, one edge at a
time (the sharing degrees are counted again after each removal), so that the result is reproducible. A
stage whose `max_batch` is below 16 averages over 1..max_batch."""
from __future__ import annotations

from dataclasses import dataclass

from engine.pipelines.problem import INTENSITY_BATCHES, PipelineProblem


@dataclass(frozen=True)
class PathSegment:
    """An execution path, or the part of one that a removed edge cut off, with its share of the SLO."""

    path: str  # the original execution path it comes from
    stages: tuple[str, ...]
    slo_ms: float


@dataclass(frozen=True)
class TransformedGraph:
    """A forest: every stage has at most one predecessor (`parent`), and the segments that must each fit
    their SLO. `removed` lists the edges taken out, in order."""

    segments: tuple[PathSegment, ...]
    parent: dict[str, str | None]
    children: dict[str, tuple[str, ...]]
    removed: tuple[tuple[str, str], ...]

    def roots(self) -> list[str]:
        return sorted(s for s, p in self.parent.items() if p is None)


def stage_intensity(problem: PipelineProblem, name: str) -> float:
    """Int_s: the stage's processing time averaged over batch sizes 1..16 (§p1.4.4)."""
    stage = problem.by_name[name]
    top = min(INTENSITY_BATCHES, stage.max_batch)
    return sum(stage.latency.d(b) for b in range(1, top + 1)) / top


def edge_sharing_degree(segments: tuple[PathSegment, ...] | list[PathSegment]) -> dict[tuple[str, str], int]:
    """How many segments use each edge."""
    degree: dict[tuple[str, str], int] = {}
    for seg in segments:
        for edge in zip(seg.stages, seg.stages[1:]):
            degree[edge] = degree.get(edge, 0) + 1
    return degree


def segment_split(problem: PipelineProblem, segment: PathSegment, at: int) -> tuple[PathSegment, PathSegment]:
    """Cut `segment` before its stage number `at` (1 <= at < len), the SLO shared by intensity (P1.4)."""
    first, second = segment.stages[:at], segment.stages[at:]
    total = sum(stage_intensity(problem, s) for s in segment.stages)
    share = sum(stage_intensity(problem, s) for s in first) / total
    slo_first = share * segment.slo_ms
    return (PathSegment(segment.path, first, slo_first), PathSegment(segment.path, second, segment.slo_ms - slo_first))


def fa2_graph_transform(problem: PipelineProblem) -> TransformedGraph:
    """Remove ingress aggregators as the module docstring says; the forest that remains."""
    segments = [PathSegment(p.name, p.stages, float(p.slo_ms)) for p in problem.paths]
    removed: list[tuple[str, str]] = []
    while True:
        degree = edge_sharing_degree(segments)
        predecessors: dict[str, set[str]] = {}
        for u, v in degree:
            predecessors.setdefault(v, set()).add(u)
        aggregators = sorted(v for v, preds in predecessors.items() if len(preds) > 1)
        if not aggregators:
            break
        target = aggregators[0]
        u = min(predecessors[target], key=lambda pred: (degree[(pred, target)], pred))
        removed.append((u, target))
        cut: list[PathSegment] = []
        for seg in segments:
            pairs = list(zip(seg.stages, seg.stages[1:]))
            if (u, target) in pairs:
                cut.extend(segment_split(problem, seg, pairs.index((u, target)) + 1))
            else:
                cut.append(seg)
        segments = cut
    parent: dict[str, str | None] = {s.name: None for s in problem.stages}
    children: dict[str, list[str]] = {s.name: [] for s in problem.stages}
    for u, v in sorted(edge_sharing_degree(segments)):
        parent[v] = u
        children[u].append(v)
    return TransformedGraph(segments=tuple(segments), parent=parent, children={k: tuple(v) for k, v in children.items()},
                            removed=tuple(removed))
