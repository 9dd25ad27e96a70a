"""Query sizes (the rows of one client request): the ranges b of Garrison's Algorithm 1 and their shares
D[b] (DAC'24 §4.2: "cumulative probability density D[b] of query_size_range b"; cited
in docs/references.md). The paper does not give its ranges; we take powers of two (1, 2-3,
4-7, ...), which its size axis (1-64, log-normal, §6.1) suggests. Shared by the `garrison` planner, the
ensemble simulator and the learned scheduler's state."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

__all__ = ["QuerySizeRange", "query_size_ranges"]


@dataclass(frozen=True)
class QuerySizeRange:
    """A query_size_range b of Algorithm 1: sizes low..high, D[b] the share of queries in it, `size` the
    largest size in it that queries take (its GS and L are read there: the range's worst case)."""

    low: int
    high: int
    share: float
    size: int

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def query_size_ranges(query_sizes: Sequence[tuple[int, float]] | None) -> tuple[QuerySizeRange, ...]:
    """Power-of-two ranges (1, 2-3, 4-7, ...) with D[b] from an application's query-size distribution
    (every query one row when None); ranges no query falls in are left out."""
    sizes = tuple(query_sizes) if query_sizes else ((1, 1.0),)
    ranges: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for size, p in sizes:
        if p > 0:
            ranges[int(math.log2(size))].append((size, p))
    out = []
    for exponent in sorted(ranges):
        members = ranges[exponent]
        out.append(QuerySizeRange(2 ** exponent, 2 ** (exponent + 1) - 1, sum(p for _, p in members), max(s for s, _ in members)))
    return tuple(out)
