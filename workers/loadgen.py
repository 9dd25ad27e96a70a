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
`load_run_targets` sends several streams (applications, pipelines) in one run on one clock and can keep
every request as the client saw it (`LoadQuery`), for comparing a run with the simulator's prediction
(benches/fidelity.py).

Used by `tessera load` (a burst against the demo's router) and by benches/vertical.py's real run."""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["LoadQuery", "LoadResult", "LoadSecond", "LoadTarget", "answer_parameters", "load_budgets", "load_run", "load_run_targets", "load_schedule"]


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
class LoadQuery:
    """One request as the client saw it: when it was due and sent (s from the start), its budget, the
    status (0: no answer, a transport error; -1: not sent, no budget left when due), the whole exchange's
    latency, and what the router said served it (`parameters.variant` and `routing_version`, where the
    answer was a 200 that carried them)."""
    target: str
    arrival_s: float
    sent_s: float
    budget_ms: float
    status: int
    latency_ms: float
    variant: str = ""
    routing_version: int | None = None

    @property
    def in_time(self) -> bool:
        return self.status == 200 and self.latency_ms <= self.budget_ms


@dataclass
class LoadResult:
    seconds: list[LoadSecond]
    wall_s: float
    queries: list[LoadQuery] = field(default_factory=list)  # filled by load_run_targets(record=True)

    @property
    def totals(self) -> dict[str, int]:
        return {k: sum(getattr(s, k) for s in self.seconds) for k in ("sent", "ok", "late", "errors", "expired")}


@dataclass(frozen=True)
class LoadTarget:
    """What one stream of requests sends: to `url`, `body`, at `arrivals` (s from the start) with `budgets_ms`."""
    name: str
    url: str
    body: bytes
    arrivals: Sequence[float]
    budgets_ms: Sequence[float]
    headers: Mapping[str, str] = field(default_factory=dict)


def answer_parameters(content: bytes) -> tuple[str, int | None]:
    """What a router's 200 says served it: (`parameters.variant`, `parameters.routing_version`), ("", None)
    where the body does not carry them."""
    try:
        params = json.loads(content).get("parameters") or {}
    except (ValueError, AttributeError):
        return "", None
    version = params.get("routing_version")
    return str(params.get("variant", "")), version if isinstance(version, int) else None


async def _send_all(targets: Sequence[LoadTarget], *, concurrency: int, timeout_s: float, record: bool) -> dict[str, LoadResult]:
    import httpx

    seconds: dict[str, dict[int, LoadSecond]] = {t.name: {} for t in targets}
    queries: dict[str, list[LoadQuery]] = {t.name: [] for t in targets}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def one(client: httpx.AsyncClient, target: LoadTarget, at: float, budget: float) -> None:
        bucket = seconds[target.name].setdefault(int(at), LoadSecond(int(at)))
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        async with gate:
            sent = time.perf_counter()
            left = budget - max(0.0, (sent - start) - at) * 1000.0
            if left <= 0:
                bucket.expired += 1
                if record:
                    queries[target.name].append(LoadQuery(target.name, at, sent - start, budget, -1, 0.0))
                return
            bucket.sent += 1
            headers = {"Content-Type": "application/json", "X-Tessera-Deadline-Ms": f"{left:.3f}", **target.headers}
            try:
                response = await client.post(target.url, content=target.body, headers=headers)
            except httpx.HTTPError:
                bucket.errors += 1
                if record:
                    queries[target.name].append(LoadQuery(target.name, at, sent - start, left, 0, (time.perf_counter() - sent) * 1000.0))
                return
            took = (time.perf_counter() - sent) * 1000.0
            if response.status_code == 200 and took <= left:
                bucket.ok += 1
                bucket.latencies_ms.append(took)
            elif response.status_code in (200, 504):
                bucket.late += 1
            else:
                bucket.errors += 1
            if record:
                variant, version = answer_parameters(response.content) if response.status_code == 200 else ("", None)
                queries[target.name].append(LoadQuery(target.name, at, sent - start, left, response.status_code, took, variant, version))

    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        await asyncio.gather(*(one(client, t, float(a), float(b)) for t in targets for a, b in zip(t.arrivals, t.budgets_ms)))
    wall = time.perf_counter() - start
    return {t.name: LoadResult([seconds[t.name][k] for k in sorted(seconds[t.name])], wall,
                               sorted(queries[t.name], key=lambda q: q.arrival_s)) for t in targets}


def load_run_targets(targets: Sequence[LoadTarget], *, concurrency: int = 64, timeout_s: float = 10.0,
                     record: bool = False) -> dict[str, LoadResult]:
    """Send every target's requests in one run (one clock, one connection pool, at most `concurrency` in
    flight in all); with `record`, each result keeps every request (`LoadResult.queries`)."""
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError("target names must be distinct")
    for t in targets:
        if len(t.arrivals) != len(t.budgets_ms):
            raise ValueError(f"{t.name}: one budget per arrival")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return asyncio.run(_send_all(targets, concurrency=concurrency, timeout_s=timeout_s, record=record))


def load_run(url: str, body: bytes, arrivals: Sequence[float], budgets_ms: Sequence[float], *, concurrency: int = 64,
             timeout_s: float = 10.0) -> LoadResult:
    """Send one request per arrival to `url` (see the module docstring)."""
    return load_run_targets([LoadTarget("load", url, body, arrivals, budgets_ms)], concurrency=concurrency, timeout_s=timeout_s)["load"]
