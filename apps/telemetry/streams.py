"""Telemetry on the live stream: ingested reports are announced, once committed, on one channel-layer
group as compact events (agents' reports one event per committed batch); the dashboard's consumers fold the events into a `LiveWindow`
(apps/telemetry/rollup.py) and push roll-ups to browsers."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.core.streams import group_publish

METRICS_GROUP = "tessera.metrics"


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def host_metrics_event(*, host_name: str, report: dict[str, Any]) -> dict[str, Any]:
    """An agent's report as the live window reads it: per runtime its counts, per GPU slice (a MIG
    instance, or a whole GPU without instances) its utilisation and memory."""
    instances = []
    for gpu in report.get("gpus", []):
        members = gpu.get("instances", [])
        for i in members:
            instances.append({
                "device": f"gpu{gpu['index']}/{i['placement']}",
                "utilization_pct": i.get("gr_engine_active_pct", i.get("utilization_pct")),
                "memory_used_mb": i.get("memory_used_mb", 0),
            })
        if not members:
            instances.append({
                "device": f"gpu{gpu['index']}", "utilization_pct": gpu.get("utilization_pct"),
                "memory_used_mb": gpu.get("memory_used_mb", 0),
            })
    return {
        "host": host_name,
        "at": _epoch(report["at"]),
        "interval_s": report.get("interval_s", 1.0),
        "runtimes": [
            {
                "key": r["key"], "application": r.get("application", ""), "variant": r.get("variant", ""),
                "arrivals": r.get("arrivals", 0), "served": r.get("served", 0), "late": r.get("late", 0),
                "dropped": r.get("dropped", 0), "queue_length": r.get("queue_length", 0),
                "latency_p99_ms": r.get("latency_p99_ms"), "cores": r.get("cores"), "max_batch": r.get("max_batch"),
            }
            for r in report.get("runtimes", [])
        ],
        "instances": instances,
    }


def host_metrics_batch_event(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Agents' reports stored in one commit (`host_metrics_event` each), as one event: at a thousand
    reports a second, one channel-layer send per report would be a thousand sends to every subscriber."""
    return {"type": "metrics.hosts", "reports": reports}  # dispatched to the consumers' metrics_hosts


def router_report_event(*, report: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "metrics.router",  # dispatched to the consumers' metrics_router
        "router": report["router"],
        "at": _epoch(report["at"]),
        "interval_s": report.get("interval_s", 1.0),
        "applications": [
            {
                "application": a["application"], "arrivals": a.get("arrivals", 0), "served": a.get("served", 0),
                "late": a.get("late", 0), "dropped": a.get("dropped", 0), "no_route": a.get("no_route", 0),
                "latency_p99_ms": a.get("latency_p99_ms"),
            }
            for a in report.get("applications", [])
        ],
    }


def metrics_publish(event: dict[str, Any]) -> None:
    group_publish(METRICS_GROUP, event)
