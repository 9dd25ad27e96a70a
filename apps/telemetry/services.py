"""Telemetry services: ingest an agent's metrics (also its heartbeat) and a router's report, and prune old
samples. Ingest runs about a thousand times a second across a fleet, so it takes already-validated data
(plain serializers in the view), maps application names with one query and bulk-inserts; there is no
per-row model validation. Once committed, each report is announced on the live stream (streams.py).

Reports kept by the data plane through a control-plane outage arrive late, oldest first, each with its
original `at`, and are stored under it (views read samples by `at`, never by arrival). A report's
`dropped_reports` (what the sender's outage buffer had to let go since its previous report got through)
is added to the sender's count (`Host.dropped_reports`, `RouterCredential.dropped_reports`) and logged. A
report delivered twice (sent again after a timeout, while the first attempt got through) is stored once:
a sender's reports are ingested one at a time (its row is locked) and one whose `at` is stored already
is acknowledged without writing anything."""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Iterable

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.transactions import transaction_retry
from apps.inventory.models import Host, RouterCredential
from apps.registry.models import Application

from .models import ApplicationSample, GpuSample, RuntimeSample
from .streams import host_metrics_event, metrics_publish, router_report_event

log = logging.getLogger("tessera.telemetry")


def _application_ids(names: Iterable[str]) -> dict[str, int]:
    wanted = {n for n in names if n}
    if not wanted:
        return {}
    return dict(Application.objects.filter(name__in=wanted).values_list("name", "pk"))


@transaction_retry
def host_metrics_ingest(*, host: Host, report: dict[str, Any]) -> dict[str, int]:
    """Store one metrics report of a host's agent: a RuntimeSample per runtime, a GpuSample per GPU and one
    per MIG instance on it; then mark the host seen now (metrics are the agent's heartbeat). An application
    name the registry does not know is kept by name, with no foreign key. Returns the rows written."""
    at = report["at"]
    interval_s = report.get("interval_s", 1.0)
    runtimes = report.get("runtimes", [])
    applications = _application_ids(r.get("application", "") for r in runtimes)
    runtime_rows = [
        RuntimeSample(
            host_id=host.pk,
            runtime_key=r["key"],
            application_id=applications.get(r.get("application", "")),
            application_name=r.get("application", ""),
            variant_name=r.get("variant", ""),
            at=at,
            interval_s=interval_s,
            arrivals=r.get("arrivals", 0),
            served=r.get("served", 0),
            late=r.get("late", 0),
            dropped=r.get("dropped", 0),
            queue_length=r.get("queue_length", 0),
            batches=r.get("batches", 0),
            batch_size_mean=r.get("batch_size_mean") or 0.0,
            latency_p50_ms=r.get("latency_p50_ms"),
            latency_p99_ms=r.get("latency_p99_ms"),
        )
        for r in runtimes
    ]
    gpu_rows = []
    for gpu in report.get("gpus", []):
        simulated = gpu.get("simulated", False)
        gpu_rows.append(GpuSample(
            host_id=host.pk, accelerator_index=gpu["index"], placement="", at=at,
            utilization_pct=gpu.get("utilization_pct"), gr_engine_active_pct=gpu.get("gr_engine_active_pct"),
            memory_used_mb=gpu.get("memory_used_mb", 0), power_w=gpu.get("power_w"), simulated=simulated,
        ))
        for instance in gpu.get("instances", []):
            gpu_rows.append(GpuSample(
                host_id=host.pk, accelerator_index=gpu["index"], placement=instance["placement"], at=at,
                utilization_pct=instance.get("utilization_pct"), gr_engine_active_pct=instance.get("gr_engine_active_pct"),
                memory_used_mb=instance.get("memory_used_mb", 0), power_w=None, simulated=simulated,
            ))
    with transaction.atomic():
        # Bookkeeping, not a change: last_seen is excluded from the audit, and update() skips the receivers.
        # A late report (sent after an outage) still means the agent is up now. The update also locks the
        # host's row, so this host's reports are stored one at a time and the duplicate check below holds.
        Host.objects.filter(pk=host.pk).update(last_seen=timezone.now())
        if _delivered_before(RuntimeSample.objects.filter(host_id=host.pk, at=at), GpuSample.objects.filter(host_id=host.pk, at=at)):
            return {"runtime_samples": 0, "gpu_samples": 0}
        RuntimeSample.objects.bulk_create(runtime_rows)
        GpuSample.objects.bulk_create(gpu_rows)
        dropped = report.get("dropped_reports", 0)
        if dropped:
            Host.objects.filter(pk=host.pk).update(dropped_reports=F("dropped_reports") + dropped)
            log.warning("host %s: its agent dropped %d metrics reports (outage buffer full)", host.name, dropped)
        event = host_metrics_event(host_name=host.name, report=report)
        transaction.on_commit(lambda: metrics_publish(event))
    return {"runtime_samples": len(runtime_rows), "gpu_samples": len(gpu_rows)}


def _delivered_before(*stored) -> bool:
    """Whether a report was stored already (samples of the same sender at the same `at`). A report can come
    twice: the sender gave up waiting (a control plane too slow to answer, or a network that held the
    request) and sent it again from its buffer while the first attempt still got through."""
    return any(queryset.exists() for queryset in stored)


@transaction_retry
def router_report_ingest(*, credential: RouterCredential, report: dict[str, Any]) -> dict[str, int]:
    """Store one router report, sent with the router's credential under its own name (the view checks
    `report["router"] == credential.name`): an ApplicationSample per application. Unknown application names
    are kept by name. Returns the rows written."""
    items = report.get("applications", [])
    applications = _application_ids(a["application"] for a in items)
    rows = [
        ApplicationSample(
            host_id=None,
            router=credential.name,
            application_id=applications.get(a["application"]),
            application_name=a["application"],
            routing_version=a.get("routing_version"),
            at=report["at"],
            interval_s=report.get("interval_s", 1.0),
            arrivals=a.get("arrivals", 0),
            served=a.get("served", 0),
            late=a.get("late", 0),
            dropped=a.get("dropped", 0),
            no_route=a.get("no_route", 0),
            latency_p50_ms=a.get("latency_p50_ms"),
            latency_p99_ms=a.get("latency_p99_ms"),
        )
        for a in items
    ]
    with transaction.atomic():
        # The credential's row, locked: this router's reports are stored one at a time (see _delivered_before).
        list(RouterCredential.objects.select_for_update().filter(pk=credential.pk).values_list("pk", flat=True))
        if _delivered_before(ApplicationSample.objects.filter(router=credential.name, at=report["at"])):
            return {"application_samples": 0}
        ApplicationSample.objects.bulk_create(rows)
        dropped = report.get("dropped_reports", 0)
        if dropped:
            RouterCredential.objects.filter(pk=credential.pk).update(dropped_reports=F("dropped_reports") + dropped)
            log.warning("router %s dropped %d reports (outage buffer full)", credential.name, dropped)
        event = router_report_event(report=report)
        transaction.on_commit(lambda: metrics_publish(event))
    return {"application_samples": len(rows)}


def telemetry_prune(*, older_than: timedelta) -> dict[str, int]:
    """Delete every sample taken more than `older_than` ago. Returns the rows deleted per model."""
    cutoff = timezone.now() - older_than
    deleted = {}
    for model in (RuntimeSample, GpuSample, ApplicationSample):
        # Samples have no dependents and are not audited: one DELETE, without loading the rows (a plain
        # delete() would fetch them all, because the audit receivers listen to every model's deletes).
        queryset = model.objects.filter(at__lt=cutoff)
        deleted[model._meta.model_name] = queryset._raw_delete(queryset.db)
    return deleted
