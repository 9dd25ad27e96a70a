"""Demand for planning (selectors): what each application's demand is taken to be when the fleet is
planned, from what the routers report (ApplicationSample), and the re-planning policy that governs the
automatic triggers.

`demand_for_planning` sizes each application for max(peak of the last W seconds, Holt forecast H seconds
ahead) of its per-second arrival rate (engine/forecasting/holt.py explains the forecast and why the
maximum; benches/forecast.py measures it). W and H default to the governing ReplanPolicy's
`demand_window_seconds` and `forecast_horizon_seconds`.

Per-second rates. Each router reports each application's arrivals over an interval (about a second)
ending at `at`. One aggregate query groups the window's samples by (application, router, second of `at`)
and sums arrivals and interval lengths; a router's rate in a second is arrivals / interval (so two reports
landing in one second, or a report over 0.5 s, still give a rate per second). An application's rate in a
second is the sum over its routers. A second where a router did not report (late, or its report landed in
the next second) holds that router's previous rate; a router whose reports stop more than
`ROUTER_STALE_S` before the application's newest second (or start more than that after its oldest)
contributes nothing beyond them (it went away, or it is new). The forecast starts from the newest second
seen, so it looks H seconds plus however far that second is behind `now` ahead.

Applications: every application with an SLO policy (the ones a plan can serve), keyed by name. One with no
samples in the window (no router reported it) keeps the demand the active plan assumed for it (its
`demand["observed"]`, before headroom; `fallback` says "active plan"), or 0 ("none") when there is no
active plan or it had none.

What an application is planned for is the largest of (issue 38, "into service without traffic"):
- that recent estimate;
- its memory: the mean rate over the last `demand_memory_seconds` (ReplanPolicy, 15 minutes by default),
  so that a quiet minute does not take its capacity away (a minute's silence after 15 at r leaves 14/15 r);
- what its SLO policy declares (`expected_rps`): how a new application gets capacity before its first
  query, and a floor an operator sets for one that must stay ready;
- the idle floor, `IDLE_FLOOR_RPS` (1 query per second: at least one instance), when all of the above are 0
  and its policy does not ask to scale to zero (`scale_to_zero`).
`basis` says which decided, per application: "observed", "memory", "declared" or "idle floor".
"""
from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncSecond
from django.utils import timezone

from apps.policies.models import ReplanPolicy, SloPolicy
from apps.telemetry.models import ApplicationSample
from engine.forecasting.holt import peak_forecast_estimate

from .choices import PlanStatusChoices
from .models import Plan

__all__ = [
    "DEFAULT_HORIZON_S",
    "DEFAULT_MEMORY_S",
    "DEFAULT_WINDOW_S",
    "IDLE_FLOOR_RPS",
    "demand_for_planning",
    "plan_assumed_rps",
    "replan_policy_current",
]

DEFAULT_WINDOW_S = float(ReplanPolicy._meta.get_field("demand_window_seconds").default)
DEFAULT_HORIZON_S = float(ReplanPolicy._meta.get_field("forecast_horizon_seconds").default)
# A router whose reports end (or begin) at most this many seconds before (after) the application's
# newest (oldest) second is held at its last (first) rate up to it: its report is late, not missing.
ROUTER_STALE_S = 2
FALLBACK_ACTIVE_PLAN = "active plan"
FALLBACK_NONE = "none"
DEFAULT_MEMORY_S = float(ReplanPolicy._meta.get_field("demand_memory_seconds").default)
# What an idle application is planned for unless its policy scales it to zero: a query a second, so every
# planner gives it one instance and its next query finds capacity.
IDLE_FLOOR_RPS = 1.0


def replan_policy_current() -> ReplanPolicy | None:
    """The policy that governs automatic re-planning: the first enabled one by name, or None (then
    nothing re-plans by itself)."""
    return ReplanPolicy.objects.filter(enabled=True).order_by("name").first()


def plan_assumed_rps(plan: Plan | None) -> dict[str, float]:
    """{application: rps} a plan was made for, before any headroom: `demand["observed"]` (what plan runs
    store: this module's estimate), else `demand["rps"]`, else `demand` itself when it is a flat
    {application: rps}."""
    if plan is None or not isinstance(plan.demand, dict):
        return {}
    demand = plan.demand
    for key in ("observed", "rps"):
        if key in demand:
            values = demand[key] if isinstance(demand[key], dict) else {}
            break
    else:
        values = demand
    return {
        str(name): float(rps) for name, rps in values.items()
        if isinstance(rps, (int, float)) and not isinstance(rps, bool) and math.isfinite(rps) and rps >= 0
    }


def _plan_observed_rps(plan: Plan | None) -> dict[str, float]:
    """What `plan` assumed for the applications whose demand was observed (or remembered), not declared or the
    idle floor: those would otherwise outlive the policy that set them."""
    assumed = plan_assumed_rps(plan)
    details = plan.demand.get("details") if plan is not None and isinstance(plan.demand, dict) else None
    basis = details.get("basis") if isinstance(details, dict) else None
    if not isinstance(basis, dict):
        return assumed
    return {name: rps for name, rps in assumed.items() if basis.get(name, "observed") in ("observed", "memory")}


def _positive(value: float, what: str, *, zero_ok: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{what} must be a {'non-negative' if zero_ok else 'positive'} number of seconds, got {value!r}")
    return value


def _per_second_series(per_router: dict[str, dict[int, float]]) -> tuple[list[float], int, int]:
    """An application's per-second rates (sum over routers) from its first to its last second seen, that
    last second's index, and how many seconds some router reported."""
    first = min(min(seconds) for seconds in per_router.values())
    last = max(max(seconds) for seconds in per_router.values())
    total = [0.0] * (last - first + 1)
    for rates in per_router.values():
        r_first, r_last = min(rates), max(rates)
        lo = first if r_first - first <= ROUTER_STALE_S else r_first
        hi = last if last - r_last <= ROUTER_STALE_S else r_last
        value = rates[r_first]
        for second in range(lo, hi + 1):
            value = rates.get(second, value)
            total[second - first] += value
    observed = len(set().union(*(rates.keys() for rates in per_router.values())))
    return total, last, observed


def demand_for_planning(*, now: datetime | None = None, window_s: float | None = None, horizon_s: float | None = None,
                        memory_s: float | None = None) -> dict[str, Any]:
    """The demand to plan for, per application (see the module docstring)::

        {"rps": {application: float},                 # the largest of the four below
         "method": "max(peak of the last 60 s, Holt forecast 30 s ahead, mean of the last 900 s, declared, idle floor)",
         "window_s": 60.0, "horizon_s": 30.0, "memory_s": 900.0, "at": "2026-...Z",
         "recent_peak": {application: float},         # applications with samples only
         "recent_mean": {application: float},         # ditto
         "forecast": {application: float},            # ditto
         "memory_mean": {application: float},         # applications with samples in the memory window only
         "declared": {application: float},            # applications whose policy declares expected_rps only
         "samples": {application: int},               # seconds in the window some router reported it
         "fallback": {application: "active plan" | "none"},   # applications without samples only
         "basis": {application: "observed" | "memory" | "declared" | "idle floor" | "none"}}
    """
    now = now or timezone.now()
    if window_s is None or horizon_s is None or memory_s is None:
        policy = replan_policy_current()
        if window_s is None:
            window_s = policy.demand_window_seconds if policy else DEFAULT_WINDOW_S
        if horizon_s is None:
            horizon_s = policy.forecast_horizon_seconds if policy else DEFAULT_HORIZON_S
        if memory_s is None:
            memory_s = policy.demand_memory_seconds if policy else DEFAULT_MEMORY_S
    window_s = _positive(window_s, "window_s")
    horizon_s = _positive(horizon_s, "horizon_s", zero_ok=True)
    memory_s = _positive(memory_s, "memory_s")

    policies = {row[0]: row for row in SloPolicy.objects.values_list("application_id", "application__name", "expected_rps", "scale_to_zero")}
    names = {app_id: row[1] for app_id, row in policies.items()}
    start = now - timedelta(seconds=window_s)
    base = start.replace(microsecond=0)
    rows = (
        ApplicationSample.objects.filter(application_id__in=list(names), at__gt=start, at__lte=now)
        .annotate(second=TruncSecond("at"))
        .values("application_id", "router", "second")
        .annotate(arrivals=Sum("arrivals"), interval=Sum("interval_s"))
        .order_by()
    )
    rates: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        index = int((row["second"] - base).total_seconds())
        interval = row["interval"] or 0.0
        rates[row["application_id"]][row["router"]][index] = row["arrivals"] / interval if interval > 0 else float(row["arrivals"])

    remembered = dict(
        ApplicationSample.objects.filter(application_id__in=list(names), at__gt=now - timedelta(seconds=memory_s), at__lte=now)
        .values("application_id").annotate(arrivals=Sum("arrivals")).order_by().values_list("application_id", "arrivals")
    )

    result: dict[str, Any] = {
        "rps": {}, "method": f"max(peak of the last {window_s:g} s, Holt forecast {horizon_s:g} s ahead, mean of the last "
                             f"{memory_s:g} s, declared, idle floor {IDLE_FLOOR_RPS:g})",
        "window_s": window_s, "horizon_s": horizon_s, "memory_s": memory_s, "at": now.isoformat(),
        "recent_peak": {}, "recent_mean": {}, "forecast": {}, "memory_mean": {}, "declared": {}, "samples": {}, "fallback": {},
        "basis": {},
    }
    assumed: dict[str, float] | None = None
    for app_id, name in sorted(names.items(), key=lambda item: item[1]):
        per_router = rates.get(app_id)
        if not per_router:
            if assumed is None:  # only read the active plan when some application needs it
                assumed = _plan_observed_rps(Plan.objects.filter(status=PlanStatusChoices.ACTIVE).first())
            result["samples"][name] = 0
            result["rps"][name] = assumed.get(name, 0.0)
            result["fallback"][name] = FALLBACK_ACTIVE_PLAN if name in assumed else FALLBACK_NONE
            continue
        series, last, observed = _per_second_series(per_router)
        # The last second's rates cover [base + last, base + last + 1): the forecast looks from its end.
        behind_s = max((now - (base + timedelta(seconds=last + 1))).total_seconds(), 0.0)
        peak, forecast, estimate = peak_forecast_estimate(series, horizon_s + behind_s)
        result["samples"][name] = observed
        result["recent_peak"][name] = round(peak, 3)
        result["recent_mean"][name] = round(sum(series) / len(series), 3)
        result["forecast"][name] = round(forecast, 3)
        result["rps"][name] = round(estimate, 3)
    for app_id, (_, name, expected, scale_to_zero) in policies.items():
        candidates = [("observed", result["rps"][name])]
        if remembered.get(app_id):
            result["memory_mean"][name] = round(remembered[app_id] / memory_s, 3)
            candidates.append(("memory", result["memory_mean"][name]))
        if expected is not None:
            result["declared"][name] = float(expected)
            candidates.append(("declared", float(expected)))
        basis, rps = max(candidates, key=lambda c: c[1])  # the first of equals: observed before memory before declared
        if rps <= 0:
            basis, rps = ("none", 0.0) if scale_to_zero else ("idle floor", IDLE_FLOOR_RPS)
        result["rps"][name] = rps
        result["basis"][name] = basis
    return result
