"""The control plane's own Prometheus metrics, served at `GET /metrics` (issue 21, section 4).

Process-local counters and gauges, counted where things happen:
- `tessera_agent_reports_ingested_total`: agents' metrics reports stored (a report delivered twice counts once);
- `tessera_agent_reports_rejected_total{reason}`: reports refused (`invalid`: the body failed validation);
- `tessera_live_sockets`: dashboard WebSockets open in this process.

And, read from the database and the broker at each scrape (`FleetCollector`), so that every process
answers the same:
- `tessera_plans{status}`: plans by status;
- `tessera_plan_solve_seconds` (a summary: `_sum` and `_count` over every plan, the solver's time);
- `tessera_plan_last_solve_seconds`: the newest plan's;
- `tessera_hosts{status}`: hosts by status;
- `tessera_celery_queue_length{queue}`: tasks waiting in the broker (Redis only; absent otherwise);
- `tessera_database_up`, `tessera_broker_up`: whether this scrape could read them (a scrape never fails
  because one is away: monitoring needs the endpoint most then).

Names follow Prometheus's conventions (`promtool check metrics`): counters end in `_total`, times are in
seconds, and nothing else carries a unit suffix it does not have."""
from __future__ import annotations

import logging
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

__all__ = ["CONTROL_PLANE_REGISTRY", "FleetCollector", "agent_reports_ingested", "agent_reports_rejected", "live_sockets"]

log = logging.getLogger("tessera.metrics")

CONTROL_PLANE_REGISTRY = CollectorRegistry(auto_describe=True)

agent_reports_ingested = Counter("tessera_agent_reports_ingested", "Agents' metrics reports stored by this process",
                                 registry=CONTROL_PLANE_REGISTRY)
agent_reports_rejected = Counter("tessera_agent_reports_rejected", "Agents' metrics reports refused by this process",
                                 ["reason"], registry=CONTROL_PLANE_REGISTRY)
live_sockets = Gauge("tessera_live_sockets", "Dashboard WebSockets open in this process", registry=CONTROL_PLANE_REGISTRY)

# Broker queues whose length is exported: Celery's default queue (the only one Tessera routes to).
CELERY_QUEUES = ("celery",)


class FleetCollector:
    """Figures read at scrape time from the database and the broker (see the module docstring)."""

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        yield from self._database()
        yield from self._broker()

    def _database(self) -> Iterable[Metric]:
        from django.db import DatabaseError
        from django.db.models import Count, Sum

        from apps.inventory.models import Host
        from apps.planning.models import Plan, PredictionCheck

        try:
            plans = list(Plan.objects.values("status").annotate(n=Count("id")))
            totals = Plan.objects.aggregate(n=Count("id"), seconds=Sum("solve_seconds"))
            newest = Plan.objects.order_by("-id").values_list("solve_seconds", flat=True).first()
            hosts = list(Host.objects.values("status").annotate(n=Count("id")))
            checked = Plan.objects.filter(prediction_checked_at__isnull=False).order_by("-prediction_checked_at").values_list("pk", flat=True).first()
            checks = list(PredictionCheck.objects.filter(plan_id=checked).values("target", "violation_error", "p99_error")) if checked else []
        except DatabaseError as exc:
            yield _up("database", exc)
            return
        yield _up("database")
        by_status = GaugeMetricFamily("tessera_plans", "Plans by status", labels=["status"])
        for row in plans:
            by_status.add_metric([row["status"]], row["n"])
        yield by_status
        solve = SummaryMetricFamily("tessera_plan_solve_seconds", "The solver's time of every plan")
        solve.add_metric([], count_value=totals["n"] or 0, sum_value=float(totals["seconds"] or 0.0))
        yield solve
        if newest is not None:
            last = GaugeMetricFamily("tessera_plan_last_solve_seconds", "The newest plan's solver time")
            last.add_metric([], float(newest))
            yield last
        if checks:
            # The latest checked plan's prediction against what was measured (apps.planning.prediction).
            # No plan label: a re-plan a minute would make a series a minute. The plan is its own gauge.
            error = GaugeMetricFamily("tessera_plan_prediction_error", "The last checked plan's prediction error per target: violation "
                                      "(measured - predicted ratio) and p99 ((measured - predicted) / predicted)", labels=["target", "measure"])
            for c in checks:
                for measure, value in (("violation", c["violation_error"]), ("p99", c["p99_error"])):
                    if value is not None:
                        error.add_metric([c["target"], measure], float(value))
            yield error
            which = GaugeMetricFamily("tessera_plan_prediction_checked_plan", "The plan tessera_plan_prediction_error is of")
            which.add_metric([], float(checked))
            yield which
        host_status = GaugeMetricFamily("tessera_hosts", "Hosts by status", labels=["status"])
        for row in hosts:
            host_status.add_metric([row["status"]], row["n"])
        yield host_status

    def _broker(self) -> Iterable[Metric]:
        from django.conf import settings

        url = getattr(settings, "CELERY_BROKER_URL", "") or ""
        if not url.startswith(("redis://", "rediss://")):
            return  # in-process tasks (the embedded defaults) or another broker: no queue to read
        try:
            import redis

            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
            lengths = {queue: client.llen(queue) for queue in CELERY_QUEUES}
        except Exception as exc:  # any failure of the broker: report it away, never fail the scrape
            yield _up("broker", exc)
            return
        yield _up("broker")
        depth = GaugeMetricFamily("tessera_celery_queue_length", "Tasks waiting in the broker", labels=["queue"])
        for queue, length in lengths.items():
            depth.add_metric([queue], length)
        yield depth


def _up(service: str, error: Exception | None = None) -> GaugeMetricFamily:
    """`tessera_<service>_up`: 1, or 0 with the error logged."""
    if error is not None:
        log.warning("metrics: the %s is away: %s", service, error)
    up = GaugeMetricFamily(f"tessera_{service}_up", f"1 when this scrape could read the {service}")
    up.add_metric([], 0 if error is not None else 1)
    return up


CONTROL_PLANE_REGISTRY.register(FleetCollector())
