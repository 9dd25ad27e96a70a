"""A load generator for a router: Poisson arrivals at a rate that may burst, each request carrying its
remaining latency budget in `X-Tessera-Deadline-Ms`, as Sponge's evaluation sends them (thesis P2 §p2.4).

`load_schedule` draws the arrival times (a base rate, optionally a burst window at a higher rate);
`load_budgets` gives each request what is left of the SLO after its time on the network, from the
synthetic bandwidth trace of `engine.vertical.workload` (a two-state Markov chain, stated there; the
payload's size over the second's bandwidth plus a round trip). The generator does not wait out that
network time: it sends at the arrival time with the smaller budget, as if the request had spent it on the
way. `load_run` sends them (httpx, one connection pool, at most `concurrency` in flight; a request due
while the pool is full waits, and its wait is taken from its budget) and counts per second: sent, answered
in time, late (504 or answered after the budget), other errors, and latency percentiles.

Used by `tessera load` (a burst against the demo's router) and by benches/vertical.py's real run."""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

__all__ = ["LoadResult", "LoadSecond", "load_budgets", "load_run", "load_schedule"]


def load_schedule(*, rate_rps: float, duration_s: float, burst_at_s: float | None = None, burst_for_s: float = 0.0,
                  burst_rps: float | None = None, seed: int = 0) -> np.ndarray:
    """Poisson arrival times (s from the start) at `rate_rps`, and at `burst_rps` within [burst_at_s,
    burst_at_s + burst_for_s)."""
    if not (rate_rps > 0 and duration_s > 0) or (burst_rps is not None and burst_rps <= 0) or burst_for_s < 0:
        raise ValueError("rate_rps and duration_s must be > 0, burst_rps > 0 and burst_for_s >= 0")
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while True:
        in_burst = burst_rps is not None and burst_at_s is not None and burst_at_s <= t < burst_at_s + burst_for_s
        t += rng.exponential(1.0 / (burst_rps if in_burst else rate_rps))
        if t >= duration_s:
            return np.array(out)
        out.append(t)


def load_budgets(arrivals: np.ndarray, *, slo_ms: float, payload_kb: float, rtt_ms: float, seed: int = 0, dips: bool = True) -> np.ndarray:
    """What each request has left of `slo_ms` after the network (ms; <= 0: the network took it all). Without
    `dips` the bandwidth stays good."""
    from engine.vertical.workload import bandwidth_trace

    if slo_ms <= 0 or payload_kb <= 0 or rtt_ms < 0:
        raise ValueError("slo_ms and payload_kb must be > 0 and rtt_ms >= 0")
    seconds = int(math.ceil(float(arrivals.max()) if len(arrivals) else 0.0)) + 1
    bandwidth = bandwidth_trace(seconds, seed=seed, p_dip=0.05 if dips else 0.0)
    rng = np.random.default_rng(seed + 1)
    sizes_kbit = 8.0 * payload_kb * np.exp(rng.normal(-0.125, 0.5, len(arrivals)))
    network_ms = sizes_kbit / bandwidth[arrivals.astype(int)] + rtt_ms
    return slo_ms - network_ms


@dataclass
class LoadSecond:
    second: int
    sent: int = 0
    ok: int = 0
    late: int = 0
    errors: int = 0
    expired: int = 0  # nothing left of the budget when it was due: not sent, counted late
    latencies_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {"second": self.second, "sent": self.sent, "ok": self.ok, "late": self.late + self.expired, "errors": self.errors,
                "p50_ms": float(np.percentile(lat, 50)) if lat else None, "p99_ms": float(np.percentile(lat, 99)) if lat else None}


@dataclass
class LoadResult:
    seconds: list[LoadSecond]
    wall_s: float

    @property
    def totals(self) -> dict[str, int]:
        return {k: sum(getattr(s, k) for s in self.seconds) for k in ("sent", "ok", "late", "errors", "expired")}


async def _send_all(url: str, body: bytes, arrivals: Sequence[float], budgets_ms: Sequence[float], *, concurrency: int,
                    timeout_s: float) -> LoadResult:
    import httpx

    seconds: dict[int, LoadSecond] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def one(client: httpx.AsyncClient, at: float, budget: float) -> None:
        bucket = seconds.setdefault(int(at), LoadSecond(int(at)))
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        async with gate:
            left = budget - max(0.0, (time.perf_counter() - start) - at) * 1000.0
            if left <= 0:
                bucket.expired += 1
                return
            bucket.sent += 1
            sent = time.perf_counter()
            try:
                response = await client.post(url, content=body, headers={"Content-Type": "application/json", "X-Tessera-Deadline-Ms": f"{left:.3f}"})
            except httpx.HTTPError:
                bucket.errors += 1
                return
            took = (time.perf_counter() - sent) * 1000.0
            if response.status_code == 200 and took <= left:
                bucket.ok += 1
                bucket.latencies_ms.append(took)
            elif response.status_code in (200, 504):
                bucket.late += 1
            else:
                bucket.errors += 1

    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        await asyncio.gather(*(one(client, float(a), float(b)) for a, b in zip(arrivals, budgets_ms)))
    wall = time.perf_counter() - start
    return LoadResult([seconds[k] for k in sorted(seconds)], wall)


def load_run(url: str, body: bytes, arrivals: Sequence[float], budgets_ms: Sequence[float], *, concurrency: int = 64,
             timeout_s: float = 10.0) -> LoadResult:
    """Send one request per arrival to `url` (see the module docstring)."""
    if len(arrivals) != len(budgets_ms):
        raise ValueError("one budget per arrival")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return asyncio.run(_send_all(url, body, arrivals, budgets_ms, concurrency=concurrency, timeout_s=timeout_s))
