"""Telemetry services: ingest agents' metrics (also their heartbeat) and routers' reports, and prune old
samples. Ingest runs about a thousand times a second across a fleet, so it takes already-validated data,
maps application names with one query and inserts rows in bulk (COPY on PostgreSQL), with no per-row model
validation; agents' reports come in batches (`host_metrics_ingest_many`, fed by the group-committing
writer of apps/telemetry/ingest.py), one transaction and one query of each kind per batch. Once committed,
what was stored is announced on the live stream (streams.py).

Reports kept by the data plane through a control-plane outage arrive late, oldest first, each with its
original `at`, and are stored under it (views read samples by `at`, never by arrival). A report's
`dropped_reports` (what the sender's outage buffer had to let go since its previous report got through)
is added to the sender's count (`Host.dropped_reports`, `RouterCredential.dropped_reports`) and logged. A
report delivered twice (sent again after a timeout, while the first attempt got through) is stored once:
a sender's reports are ingested one transaction at a time (its row is locked) and one whose `at` is
stored already is acknowledged without writing anything."""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Iterable, Sequence

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.bulk import model_rows_insert
from apps.core.transactions import transaction_retry
from apps.inventory.models import Host, RouterCredential
from apps.registry.models import Application, Pipeline

from apps.core.metrics import agent_reports_ingested

from .models import ApplicationSample, GpuSample, PipelinePathSample, RuntimeResize, RuntimeSample
from .streams import host_metrics_batch_event, host_metrics_event, metrics_publish, router_report_event

log = logging.getLogger("tessera.telemetry")


def _application_ids(names: Iterable[str]) -> dict[str, int]:
    wanted = {n for n in names if n}
    if not wanted:
        return {}
    return dict(Application.objects.filter(name__in=wanted).values_list("name", "pk"))


RUNTIME_FIELDS = ("host_id", "runtime_key", "application_id", "application_name", "variant_name", "at", "interval_s", "arrivals",
                  "served", "late", "dropped", "queue_length", "batches", "batch_size_mean", "latency_p50_ms", "latency_p99_ms",
                  "cores", "batch_cap", "cpus")
GPU_FIELDS = ("host_id", "accelerator_index", "placement", "at", "utilization_pct", "gr_engine_active_pct", "memory_used_mb",
              "power_w", "simulated")


def _runtime_rows(host_id: int, report: dict[str, Any], applications: dict[str, int]) -> list[tuple]:
    at, interval_s = report["at"], report.get("interval_s", 1.0)
    return [
        (host_id, r["key"], applications.get(r.get("application", "")), r.get("application", ""), r.get("variant", ""), at, interval_s,
         r.get("arrivals", 0), r.get("served", 0), r.get("late", 0), r.get("dropped", 0), r.get("queue_length", 0),
         r.get("batches", 0), r.get("batch_size_mean") or 0.0, r.get("latency_p50_ms"), r.get("latency_p99_ms"), r.get("cores"),
         r.get("max_batch"), r.get("cpus"))
        for r in report.get("runtimes", [])
    ]


RESIZE_FIELDS = ("host_id", "runtime_key", "application_id", "application_name", "variant_name", "at", "reported_at", "by", "outcome",
                 "reason", "from_cores", "from_batch_cap", "cores", "batch_cap", "cpus", "resize_ms", "prepared")


def _resize_rows(host_id: int, report: dict[str, Any], applications: dict[str, int]) -> list[tuple]:
    """A RuntimeResize per resize a runtime of the report carries (CPU runtimes, since the previous report)."""
    return [
        (host_id, r["key"], applications.get(r.get("application", "")), r.get("application", ""), r.get("variant", ""), z["at"],
         report["at"], z["by"], z["outcome"], z.get("reason", ""), z.get("from_cores"), z.get("from_max_batch"), z["cores"],
         z.get("max_batch"), z.get("cpus"), z.get("resize_ms"), z.get("prepared"))
        for r in report.get("runtimes", []) for z in r.get("resizes") or ()
    ]


def _gpu_rows(host_id: int, report: dict[str, Any]) -> list[tuple]:
    at, rows = report["at"], []
    for gpu in report.get("gpus", []):
        simulated = gpu.get("simulated", False)
        rows.append((host_id, gpu["index"], "", at, gpu.get("utilization_pct"), gpu.get("gr_engine_active_pct"),
                     gpu.get("memory_used_mb", 0), gpu.get("power_w"), simulated))
        for instance in gpu.get("instances", []):
            rows.append((host_id, gpu["index"], instance["placement"], at, instance.get("utilization_pct"),
                         instance.get("gr_engine_active_pct"), instance.get("memory_used_mb", 0), None, simulated))
    return rows


def host_metrics_ingest(*, host: Host, report: dict[str, Any]) -> dict[str, int]:
    """Store one metrics report of a host's agent (see `host_metrics_ingest_many`). Returns the rows written."""
    return host_metrics_ingest_many(reports=[(host, report)])[0]


@transaction_retry
def host_metrics_ingest_many(*, reports: Sequence[tuple[Host, dict[str, Any]]]) -> list[dict[str, int]]:
    """Store agents' metrics reports, already validated, in one transaction (the ingest endpoint gathers
    the reports that arrive while the previous batch commits: a group commit). Per report: a RuntimeSample
    per runtime (a CPU runtime's cores, batch cap and CPUs included), a RuntimeResize per resize a runtime
    reports, a GpuSample per GPU and one per MIG instance on it; every host is marked seen now
    (metrics are the agent's heartbeat; a late report, sent after an outage, still means the agent is up).
    An application name the registry does not know is kept by name, with no foreign key. A report stored
    already (same host, same `at`), or twice in `reports`, writes nothing. Returns, per report in order,
    the rows written. Once committed, the batch is announced on the live stream as one event."""
    if not reports:
        return []
    host_ids = sorted({host.pk for host, _ in reports})
    applications = _application_ids(r.get("application", "") for _, report in reports for r in report.get("runtimes", []))
    written: list[dict[str, int]] = []
    with transaction.atomic():
        # The hosts' rows are locked, so each host's reports are stored one batch at a time and the
        # duplicate check below holds; several in id order first, so two batches never wait on each other
        # in a cycle (UPDATE locks in no stated order). Then the heartbeat: bookkeeping, not a change
        # (last_seen is excluded from the audit, and update() skips the receivers).
        if len(host_ids) > 1:
            list(Host.objects.select_for_update(no_key=True).filter(pk__in=host_ids).order_by("pk").values_list("pk", flat=True))
        Host.objects.filter(pk__in=host_ids).update(last_seen=timezone.now())
        seen = _stored_already(host_ids, {report["at"] for _, report in reports})
        runtime_rows: list[tuple] = []
        resize_rows: list[tuple] = []
        gpu_rows: list[tuple] = []
        dropped: dict[int, int] = {}
        events = []
        for host, report in reports:
            if (host.pk, report["at"]) in seen:
                written.append({"runtime_samples": 0, "gpu_samples": 0})
                continue
            seen.add((host.pk, report["at"]))
            runtimes, gpus = _runtime_rows(host.pk, report, applications), _gpu_rows(host.pk, report)
            runtime_rows += runtimes
            resize_rows += _resize_rows(host.pk, report, applications)
            gpu_rows += gpus
            written.append({"runtime_samples": len(runtimes), "gpu_samples": len(gpus)})
            if report.get("dropped_reports"):
                dropped[host.pk] = dropped.get(host.pk, 0) + report["dropped_reports"]
                log.warning("host %s: its agent dropped %d metrics reports (outage buffer full)", host.name, report["dropped_reports"])
            events.append(host_metrics_event(host_name=host.name, report=report))
        model_rows_insert(model=RuntimeSample, fields=RUNTIME_FIELDS, rows=runtime_rows)
        model_rows_insert(model=RuntimeResize, fields=RESIZE_FIELDS, rows=resize_rows)
        model_rows_insert(model=GpuSample, fields=GPU_FIELDS, rows=gpu_rows)
        for host_id, count in dropped.items():
            Host.objects.filter(pk=host_id).update(dropped_reports=F("dropped_reports") + count)
        if events:
            transaction.on_commit(lambda: metrics_publish(host_metrics_batch_event(events)))
    agent_reports_ingested.inc(len(events))  # stored: the transaction above has committed (or an outer one holds it)
    return written


def _stored_already(host_ids: list[int], ats: set) -> set[tuple[int, Any]]:
    """The (host, at) pairs among these hosts with samples between the earliest and the latest of `ats`
    (a superset of the pairs asked about: the caller looks its own up). A report can come twice: the
    sender gave up waiting (a control plane too slow to answer, or a network that held the request) and
    sent it again from its buffer while the first attempt still got through. A range on `at`, not a list:
    a parameter per `at` cost more to bind than the query took."""
    window = {"host_id__in": host_ids, "at__range": (min(ats), max(ats))}
    pairs: set[tuple[int, Any]] = set()
    for model in (RuntimeSample, GpuSample):
        pairs.update(model.objects.filter(**window).values_list("host_id", "at").distinct().order_by())
    return pairs


def _delivered_before(*stored) -> bool:
    """Whether a report was stored already (samples of the same sender at the same `at`; see _stored_already)."""
    return any(queryset.exists() for queryset in stored)


def _ensemble_blocks(item: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An application's ensemble counts as stored: one block per scheduler (`ensembles`); a router of the
    version before sends one block (`ensemble`), kept as a list of one."""
    blocks = list(item.get("ensembles") or [])
    if item.get("ensemble"):
        blocks.append(item["ensemble"])
    return blocks or None


@transaction_retry
def router_report_ingest(*, credential: RouterCredential, report: dict[str, Any]) -> dict[str, int]:
    """Store one router report, sent with the router's credential under its own name (the view checks
    `report["router"] == credential.name`): an ApplicationSample per application and a PipelinePathSample
    per pipeline path (with each application's query sizes and ensemble counts where the router sends them).
    Unknown application and pipeline names are kept by name. Returns the rows written."""
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
            query_sizes=a.get("query_sizes") or None,
            ensembles=_ensemble_blocks(a),
        )
        for a in items
    ]
    paths = report.get("pipelines") or []
    pipelines = dict(Pipeline.objects.filter(name__in={p["pipeline"] for p in paths}).values_list("name", "pk")) if paths else {}
    path_rows = [
        PipelinePathSample(
            router=credential.name, pipeline_id=pipelines.get(p["pipeline"]), pipeline_name=p["pipeline"], path=p["path"],
            at=report["at"], interval_s=report.get("interval_s", 1.0), arrivals=p.get("arrivals", 0), served=p.get("served", 0),
            late=p.get("late", 0), dropped=p.get("dropped", 0), failed=p.get("failed", 0), no_route=p.get("no_route", 0),
            latency_p50_ms=p.get("latency_p50_ms"), latency_p99_ms=p.get("latency_p99_ms"),
        )
        for p in paths
    ]
    with transaction.atomic():
        # The credential's row, locked: this router's reports are stored one at a time (see _delivered_before).
        list(RouterCredential.objects.select_for_update().filter(pk=credential.pk).values_list("pk", flat=True))
        if _delivered_before(ApplicationSample.objects.filter(router=credential.name, at=report["at"])):
            return {"application_samples": 0, "pipeline_path_samples": 0}
        ApplicationSample.objects.bulk_create(rows)
        PipelinePathSample.objects.bulk_create(path_rows)
        dropped = report.get("dropped_reports", 0)
        if dropped:
            RouterCredential.objects.filter(pk=credential.pk).update(dropped_reports=F("dropped_reports") + dropped)
            log.warning("router %s dropped %d reports (outage buffer full)", credential.name, dropped)
        event = router_report_event(report=report)
        transaction.on_commit(lambda: metrics_publish(event))
    return {"application_samples": len(rows), "pipeline_path_samples": len(path_rows)}


def telemetry_prune(*, older_than: timedelta) -> dict[str, int]:
    """Delete every sample taken, and every resize made, more than `older_than` ago. Returns the rows
    deleted per model."""
    cutoff = timezone.now() - older_than
    deleted = {}
    for model in (RuntimeSample, GpuSample, ApplicationSample, PipelinePathSample, RuntimeResize):
        # Samples have no dependents and are not audited: one DELETE, without loading the rows (a plain
        # delete() would fetch them all, because the audit receivers listen to every model's deletes).
        queryset = model.objects.filter(at__lt=cutoff)
        deleted[model._meta.model_name] = queryset._raw_delete(queryset.db)
    return deleted
