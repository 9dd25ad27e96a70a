"""Telemetry read for the dashboard: the catalogue the roll-ups weigh accuracy and SLOs with, and the
recent history of every application, rolled up per second by the same `application_rollup` the live feed
uses."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncSecond
from django.utils import timezone

from apps.registry.models import Application, ModelVariant

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
