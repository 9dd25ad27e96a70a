"""Requests with per-request remaining budgets, as Sponge's evaluation makes them (thesis P2 §p2.2.1,
§p2.4): a user's image reaches the server over a network whose bandwidth changes every second, so the
time it spends on the way (its communication latency cl_r = size / bandwidth + round trip) is taken from
its SLO before it is queued, and the server has only SLO - cl_r left.

The thesis replays a measured 4G/5G bandwidth trace; this generator is synthetic and says so: bandwidth
follows a two-state Markov chain per second ("good": around `good_mbps`, "dip": around `dip_mbps`, each
second switching with the stated probabilities, log-normal noise), image sizes are log-normal around
`image_kb`, arrivals are Poisson at `rate_rps`. Seeded: the same arguments give the same requests."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BudgetedRequest", "bandwidth_trace", "requests_with_budgets"]


@dataclass(frozen=True)
class BudgetedRequest:
    arrival_s: float  # when it reaches the server
    communication_ms: float
    remaining_ms: float  # SLO - communication latency: what the server has left


def bandwidth_trace(seconds: int, *, good_mbps: float = 40.0, dip_mbps: float = 4.0, p_dip: float = 0.05, p_recover: float = 0.25,
                    noise: float = 0.2, seed: int = 0) -> np.ndarray:
    """Bandwidth in Mbit/s for each second (synthetic, see the module docstring)."""
    if seconds < 1 or not (0 <= p_dip <= 1 and 0 <= p_recover <= 1) or good_mbps <= 0 or dip_mbps <= 0:
        raise ValueError("seconds >= 1, probabilities in [0, 1] and bandwidths > 0")
    rng = np.random.default_rng(seed)
    out = np.empty(seconds)
    dip = False
    for t in range(seconds):
        dip = (rng.random() < p_dip) if not dip else (rng.random() >= p_recover)
        base = dip_mbps if dip else good_mbps
        out[t] = base * math.exp(rng.normal(-noise * noise / 2, noise))
    return out


def requests_with_budgets(bandwidth_mbps: np.ndarray, *, rate_rps: float, slo_ms: float, image_kb: float = 200.0,
                          rtt_ms: float = 20.0, seed: int = 0) -> list[BudgetedRequest]:
    """Poisson arrivals over the trace's seconds, each with its communication latency and remaining budget
    (negative when the network alone took more than the SLO: such a request is late on arrival)."""
    if rate_rps <= 0 or slo_ms <= 0 or image_kb <= 0 or rtt_ms < 0:
        raise ValueError("rate_rps, slo_ms and image_kb must be > 0 and rtt_ms >= 0")
    rng = np.random.default_rng(seed)
    horizon = float(len(bandwidth_mbps))
    out = []
    t = rng.exponential(1.0 / rate_rps)
    while t < horizon:
        size_kbit = 8.0 * image_kb * math.exp(rng.normal(-0.125, 0.5))
        communication = size_kbit / float(bandwidth_mbps[int(t)]) + rtt_ms  # kbit / (Mbit/s) = ms
        out.append(BudgetedRequest(t, communication, slo_ms - communication))
        t += rng.exponential(1.0 / rate_rps)
    return out
