"""Telemetry read for the dashboard and for planning: the catalogue the roll-ups weigh accuracy and SLOs
with, the recent history of every application, rolled up per second by the same `application_rollup` the
live feed uses, and what the routers counted of each application's query sizes and random ensembles."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Max, Sum
from django.db.models.functions import TruncSecond
from django.utils import timezone

from apps.registry.models import Application, ModelVariant
from engine.ensembles.sampling import randomness_bias

from .models import ApplicationSample, PipelinePathSample, RuntimeSample
from .rollup import ApplicationCatalogue, RouterCounts, VariantServed, application_rollup


def application_catalogue_for(user: Any) -> dict[str, ApplicationCatalogue]:
    """The applications `user` may view, with their SLO (p99 ms, None without a policy) and their variants'
    accuracies. Two queries."""
    applications = Application.objects.restrict(user, "view").select_related("slo_policy")
    catalogue: dict[str, dict[str, float]] = {}
    slos: dict[str, float | None] = {}
    for application in applications:
        policy = getattr(application, "slo_policy", None)
        slos[application.name] = policy.latency_p99_ms if policy is not None else None
        catalogue[application.name] = {}
    variants = ModelVariant.objects.filter(application__name__in=list(slos)).values_list("application__name", "name", "accuracy")
    for application, name, accuracy in variants:
        catalogue[application][name] = accuracy
    return {name: ApplicationCatalogue(slo_ms=slos[name], accuracies=catalogue[name]) for name in slos}


def application_history(*, catalogue: dict[str, ApplicationCatalogue], seconds: int = 120) -> dict[str, Any]:
    """Per second over the last `seconds`: each application's roll-up, as parallel arrays for sparklines
    ({"t": [epoch s...], "applications": {name: {"demand_rps": [...], ...}}}). Router samples are read one
    row per router and second; runtime samples are summed per variant and second in the database, so the
    cost grows with applications and variants, not with the fleet's size."""
    since = timezone.now() - timedelta(seconds=seconds)
    names = list(catalogue)
    routers: dict[float, list[RouterCounts]] = {}
    for row in (
        ApplicationSample.objects.filter(at__gte=since, application_name__in=names)
        .values_list("router", "application_name", "at", "interval_s", "arrivals", "served", "late", "dropped", "no_route", "latency_p99_ms")
    ):
        router, application, at, interval_s, arrivals, served, late, dropped, no_route, p99 = row
        second = float(int(at.timestamp()))
        routers.setdefault(second, []).append(RouterCounts(router, application, second, interval_s, arrivals, served, late, dropped, no_route, p99))
    variants: dict[float, list[VariantServed]] = {}
    for application, variant, second, served in (
        RuntimeSample.objects.filter(at__gte=since, application_name__in=names)
        .annotate(second=TruncSecond("at"))
        .values("application_name", "variant_name", "second")
        .annotate(served=Sum("served"))
        .values_list("application_name", "variant_name", "second", "served")
    ):
        variants.setdefault(float(int(second.timestamp())), []).append(VariantServed(application, variant, served or 0))
    seconds_seen = sorted(set(routers) | set(variants))
    fields = ("demand_rps", "served_rps", "p99_ms", "accuracy", "violation_ratio")
    series = {name: {f: [] for f in fields} for name in names}
    for second in seconds_seen:
        rolled = application_rollup(routers=routers.get(second, ()), variants=variants.get(second, ()), catalogue=catalogue)
        for name in names:
            roll = rolled[name]
            for f in fields:
                series[name][f].append(getattr(roll, f))
    return {"t": seconds_seen, "applications": series}


def pipeline_paths_live(*, seconds: int = 60, now=None) -> dict[tuple[str, str], dict[str, Any]]:
    """Each pipeline path's end-to-end traffic over the last `seconds`, summed over the routers: queries,
    answered, violation ratio ((late + dropped + failed + no_route) / arrivals, what callers saw) and p99
    (the highest per-interval p99 of any router: a conservative merge, as for applications)."""
    since = (now or timezone.now()) - timedelta(seconds=seconds)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in PipelinePathSample.objects.filter(at__gt=since).values(
        "pipeline_name", "path", "arrivals", "served", "late", "dropped", "failed", "no_route", "latency_p99_ms"
    ):
        key = (row["pipeline_name"], row["path"])
        agg = out.setdefault(key, {"arrivals": 0, "served": 0, "bad": 0, "p99_ms": None})
        agg["arrivals"] += row["arrivals"]
        agg["served"] += row["served"]
        agg["bad"] += row["late"] + row["dropped"] + row["failed"] + row["no_route"]
        if row["latency_p99_ms"] is not None:
            agg["p99_ms"] = max(agg["p99_ms"] or 0.0, row["latency_p99_ms"])
    for agg in out.values():
        agg["violation_ratio"] = agg.pop("bad") / agg["arrivals"] if agg["arrivals"] else None
        agg["window_s"] = seconds
    return out


def application_latency_window(*, application_name: str, seconds: float, now=None) -> dict[str, Any] | None:
    """An application's traffic over the last `seconds`, summed over the routers: queries, answered,
    violation ratio ((late + dropped + no_route) / arrivals) and p99 (the highest per-interval p99 of any
    router: a conservative merge, as for pipeline paths). None when no router reported it."""
    since = (now or timezone.now()) - timedelta(seconds=seconds)
    agg: dict[str, Any] = {"arrivals": 0, "served": 0, "bad": 0, "p99_ms": None}
    rows = 0
    for row in ApplicationSample.objects.filter(at__gt=since, application_name=application_name).values(
        "arrivals", "served", "late", "dropped", "no_route", "latency_p99_ms"
    ):
        rows += 1
        agg["arrivals"] += row["arrivals"]
        agg["served"] += row["served"]
        agg["bad"] += row["late"] + row["dropped"] + row["no_route"]
        if row["latency_p99_ms"] is not None:
            agg["p99_ms"] = max(agg["p99_ms"] or 0.0, row["latency_p99_ms"])
    if not rows:
        return None
    agg["violation_ratio"] = agg.pop("bad") / agg["arrivals"] if agg["arrivals"] else None
    agg["window_s"] = seconds
    return agg


def applications_traffic_window(*, names: list[str], seconds: float, now=None) -> dict[str, dict[str, Any]]:
    """`application_latency_window` for many applications in one query: {name: {"arrivals", "served",
    "violation_ratio", "p99_ms", "window_s"}} for those a router reported in the last `seconds`."""
    since = (now or timezone.now()) - timedelta(seconds=seconds)
    rows = (ApplicationSample.objects.filter(at__gt=since, application_name__in=names).values("application_name")
            .annotate(arrivals=Sum("arrivals"), served=Sum("served"), bad=Sum(F("late") + F("dropped") + F("no_route")),
                      p99_ms=Max("latency_p99_ms")))
    return {
        row["application_name"]: {"arrivals": row["arrivals"] or 0, "served": row["served"] or 0, "p99_ms": row["p99_ms"],
                                  "violation_ratio": (row["bad"] or 0) / row["arrivals"] if row["arrivals"] else None, "window_s": seconds}
        for row in rows
    }


def runtime_cores_history(*, host_ids: list[int], seconds: int = 300, now=None) -> dict[tuple[int, str], list[tuple[float, int]]]:
    """Each CPU runtime's cores over the last `seconds` on the given hosts, as the agents reported them
    (epoch seconds, cores), oldest first: what the fleet page's cores chart starts from (vertical scaling
    resizes runtimes in place, issue 19). Runtimes that never reported cores are not listed. One query."""
    since = (now or timezone.now()) - timedelta(seconds=seconds)
    out: dict[tuple[int, str], list[tuple[float, int]]] = {}
    rows = (RuntimeSample.objects.filter(host_id__in=host_ids, at__gte=since, cores__isnull=False)
            .order_by("at").values_list("host_id", "runtime_key", "at", "cores"))
    for host_id, key, at, cores in rows:
        out.setdefault((host_id, key), []).append((round(at.timestamp(), 3), int(cores)))
    return out


# --------------------------------------------------------------------------- query sizes and ensembles


def _size_counts_add(total: Counter, counts: Any) -> None:
    """Add a stored {"<size>": count} to `total` (by int size); anything else stored there is passed over."""
    if not isinstance(counts, dict):
        return
    for size, count in counts.items():
        try:
            size, count = int(size), int(count)
        except (TypeError, ValueError):
            continue
        if size >= 1 and count > 0:
            total[size] += count


def _recent_samples(application: Application, window_s: float, now: datetime | None, field: str):
    since = (now or timezone.now()) - timedelta(seconds=window_s)
    return (ApplicationSample.objects.filter(application=application, at__gt=since, **{f"{field}__isnull": False})
            .values_list(field, flat=True))


def application_query_sizes(*, application: Application, window_s: float, now: datetime | None = None) -> tuple[tuple[int, float], ...] | None:
    """The distribution of `application`'s query sizes (rows per request; Garrison's D[b]) over the last
    `window_s` seconds, summed over every router's reports: ((size, probability), ...) by size, the
    probabilities summing to 1, as the planning problem's `query_sizes` takes it; None when no router
    counted any request in the window."""
    total: Counter = Counter()
    for counts in _recent_samples(application, window_s, now, "query_sizes"):
        _size_counts_add(total, counts)
    requests = sum(total.values())
    if not requests:
        return None
    return tuple((size, count / requests) for size, count in sorted(total.items()))


@dataclass(frozen=True)
class EnsembleMemberFrequency:
    variant: str
    chosen: int  # times drawn into a query's ensemble
    voted: int  # times its answer counted in the vote (it answered in time)
    share: float | None  # its share of the votes cast (voted / all members' votes); None when none was cast
    chosen_share: float | None  # its share of the draws (chosen / all members' draws)
    probability: float | None  # its configured sampling probability; None when it is no member of the policy now


@dataclass(frozen=True)
class EnsembleSchedulerCount:
    """Queries one scheduler drew ensembles for within a window, and when it last did."""

    scheduler: str  # as the routers named it ("random ensemble ...", "learned (<policy>)")
    queries: int
    last_at: datetime


@dataclass(frozen=True)
class EnsembleFrequencies:
    """What the routers counted of an application's random ensembles over a window (Garrison's frequency
    table), of the draws of one scheduler or of all. `bias` is the randomness bias
    (engine.ensembles.sampling.randomness_bias: the RMS over the configured members of frequency -
    probability) of the draws, the sampler's fidelity; `voted_bias` the same of the votes cast, which members
    that miss the deadline move away from the probabilities. Both None without a policy to compare with."""

    window_s: float
    queries: int
    mean_size: float | None  # members drawn per query, from the reported ensemble sizes (else chosen / queries)
    members: tuple[EnsembleMemberFrequency, ...]
    bias: float | None
    voted_bias: float | None
    scheduler: str | None  # whose draws these are; None: every scheduler's in the window
    schedulers: tuple[EnsembleSchedulerCount, ...]  # every scheduler that drew in the window, the latest first


def _ensemble_blocks(value) -> list[dict]:
    """A sample's stored ensemble blocks (apps.telemetry.models.ApplicationSample.ensembles)."""
    blocks = value if isinstance(value, list) else [value]
    return [b for b in blocks if isinstance(b, dict)]


def application_ensemble_frequencies(*, application: Application, window_s: float, now: datetime | None = None,
                                     scheduler: str | None = None, latest: bool = False) -> EnsembleFrequencies | None:
    """`application`'s random ensembles over the last `window_s` seconds, summed over every router's
    reports: per member (the policy's members in its order, then any other variant reported) how often it
    was drawn and how often it voted, its share of the votes cast and its configured probability; the
    queries, the mean ensemble size and the randomness bias. Of the draws of `scheduler` only when named, of
    the scheduler that drew last when `latest` (so that after a policy change the table shows the new
    policy's draws, not a mixture), else of all. None when no router reported an ensemble in the window (or
    none of that scheduler's)."""
    since = (now or timezone.now()) - timedelta(seconds=window_s)
    rows = (ApplicationSample.objects.filter(application=application, at__gt=since, ensembles__isnull=False)
            .order_by("at").values_list("at", "ensembles"))
    samples = [(at, block) for at, value in rows for block in _ensemble_blocks(value)]
    if not samples:
        return None
    counts: dict[str, list] = {}
    for at, block in samples:
        name = str(block.get("scheduler") or "")
        entry = counts.setdefault(name, [0, at])
        entry[0] += int(block.get("queries") or 0)
        entry[1] = max(entry[1], at)
    schedulers = tuple(sorted((EnsembleSchedulerCount(scheduler=name, queries=n, last_at=at) for name, (n, at) in counts.items()),
                              key=lambda c: c.last_at, reverse=True))
    if latest:
        scheduler = schedulers[0].scheduler
    if scheduler is not None:
        samples = [(at, block) for at, block in samples if str(block.get("scheduler") or "") == scheduler]
        if not samples:
            return None
    chosen: Counter = Counter()
    voted: Counter = Counter()
    sizes: Counter = Counter()
    queries = 0
    for _, block in samples:
        queries += int(block.get("queries") or 0)
        for total, key in ((chosen, "chosen"), (voted, "voted")):
            for name, count in (block.get(key) or {}).items():
                total[name] += int(count)
        _size_counts_add(sizes, block.get("sizes"))
    policy = getattr(application, "ensemble_policy", None)
    probabilities = {m.variant.name: m.probability for m in policy.member_list()} if policy is not None else {}
    names = list(probabilities) + sorted((set(chosen) | set(voted)) - set(probabilities))
    votes, draws = sum(voted.values()), sum(chosen.values())
    members = tuple(
        EnsembleMemberFrequency(
            variant=name, chosen=chosen[name], voted=voted[name], share=voted[name] / votes if votes else None,
            chosen_share=chosen[name] / draws if draws else None, probability=probabilities.get(name),
        )
        for name in names
    )
    drawn = sum(sizes.values())
    mean_size = sum(k * n for k, n in sizes.items()) / drawn if drawn else (draws / queries if queries else None)

    def bias(total: Counter, n: int) -> float | None:
        if not probabilities or not n:
            return None
        return randomness_bias({name: total[name] / n for name in names}, probabilities)

    return EnsembleFrequencies(window_s=float(window_s), queries=queries, mean_size=mean_size, members=members,
                               bias=bias(chosen, draws), voted_bias=bias(voted, votes), scheduler=scheduler, schedulers=schedulers)
