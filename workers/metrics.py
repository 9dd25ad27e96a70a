"""The data plane's counters: per-interval reports (docs/dataplane.md, agent metrics and router reports) and
cumulative Prometheus metrics, from the same thread-safe events.

Runtimes: `RuntimeStats(registry=None)` owns a `CollectorRegistry` (never the global one) and one
`InstanceStats` per serving instance (`stats.instance(key=..., application=..., variant=...,
instance=..., simulated=...)`). The runtime calls, per query, `arrival()` then one of `served(latency_ms,
queue_ms, compute_ms, late)`, `dropped(latency_ms)` (the drop rule gave up on it), `failed(latency_ms)`
(an error), and per batch `batch(size, compute_ms)`; `queue_length_source(fn)` says how to read the queue.

- `InstanceStats.snapshot_and_reset()` is one item of the agent's `runtimes[]`: key, application, variant,
  arrivals, served (on time and late), late, dropped, queue_length, batches, batch_size_mean,
  latency_p50_ms, latency_p99_ms (null when nothing was served), plus busy_ms (time spent running batches,
  what a simulated GPU's utilisation is made of) and failed. Counts are for the interval since the last call.
- `InstanceStats.totals()`: the same counts since the start (health checks).
- Prometheus (`RuntimeStats.exposition()`, text format), cumulative, Triton names, types and HELP texts
  where Triton has them (triton-inference-server/core, src/metrics.cc), labels `model` (application),
  `version` (variant), `instance`, `simulated` ("true"/"false"): `nv_inference_request_success`,
  `nv_inference_request_failure` (with Triton's `reason`: REJECTED for queries the drop rule gave up on,
  BACKEND for the model's errors, OTHER for the rest, CANCELED never; all four always present, as
  Triton initialises them), `nv_inference_count` (queries), `nv_inference_exec_count` (batches),
  `nv_inference_request_duration_us`, `nv_inference_queue_duration_us`,
  `nv_inference_compute_infer_duration_us` (cumulative microseconds of successful requests only, as
  Triton's counters; exposed without a `_total` suffix, as Triton names them), the gauge
  `nv_inference_pending_request_count` (queued, not yet in a batch); and with labels `application`, `variant`, `instance`,
  `simulated`: `tessera_queries_total{outcome="served"|"late"|"dropped"|"failed"}` (the outcomes partition
  the answered queries: "served" here is on time, unlike the report's `served`), `tessera_queue_length`,
  `tessera_batch_size` (histogram), `tessera_query_latency_seconds` (histogram).

Routers: `RouterStats(router, registry=None)`, per application (`stats.application(name)`), events
`arrival()`, `served(latency_ms, late, variant=..., instance=..., simulated=...)`, `dropped(latency_ms, ...)`
(504), `no_route()` (503), `failed(...)` (any other error); `RouterStats.snapshot_and_reset(versions)` is
the router report (`{"router", "at", "interval_s", "applications": [...]}`) and its Prometheus metrics are
`tessera_router_queries_total{application, outcome}`, `tessera_router_latency_seconds{application}`,
`tessera_routing_table_version{application}`, `tessera_router_control_plane_up`, and the Triton request
counters per (model, version, instance, simulated) as the router sees them.

Report buffers (`workers.client.ReportBacklog`, what an agent or a router keeps through a control-plane
outage): `ReportBacklogCollector(prefix, backlog)` registered on the component's registry exposes
`<prefix>_reports_dropped_total` (let go because the buffer was full), `<prefix>_reports_rejected_total`
(refused by the control plane for good), `<prefix>_reports_sent_late_total` and `<prefix>_reports_pending`
(kept now), with prefix `tessera_agent` or `tessera_router`.

`exposition_merge(texts)` merges Prometheus texts whose families overlap (an agent exposing the metrics of
several runtime processes under one /metrics).

Hot path: one lock per instance (or application), a few integer additions and one bisect per histogram;
the Prometheus families are built only when scraped. Latency percentiles are over at most
`MAX_LATENCY_SAMPLES` samples per interval (a uniform reservoir beyond that).
"""
from __future__ import annotations

import math
import random
import re
import threading
import time
from bisect import bisect_left
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "FAILURE_REASONS",
    "LATENCY_BUCKETS_S",
    "MAX_LATENCY_SAMPLES",
    "PROMETHEUS_CONTENT_TYPE",
    "ApplicationStats",
    "ReportBacklogCollector",
    "InstanceStats",
    "RouterStats",
    "RuntimeStats",
    "exposition",
    "exposition_merge",
    "percentile",
    "utc_now_iso",
]

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MAX_LATENCY_SAMPLES = 20_000
# The control plane keeps a scheduler's name to this many characters (a router's report, apps/telemetry).
ENSEMBLE_SCHEDULER_MAX = 200
# Triton's failure reasons, the `reason` label of nv_inference_request_failure (core, src/infer_stats.h).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# Triton's counters carry no `_total` suffix; prometheus_client adds one to every counter family's HELP and
# TYPE lines, so `exposition` takes it off again for these names.
TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)
_TRITON_FIX = re.compile(rb"^(# (?:HELP|TYPE) )(" + b"|".join(n.encode() for n in TRITON_COUNTERS) + rb")_total ", re.M)


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of already sorted values; None when there are none."""
    n = len(sorted_values)
    if not n:
        return None
    rank = max(1, math.ceil(q / 100.0 * n))
    return float(sorted_values[min(rank, n) - 1])


def _label(flag: bool) -> str:
    return "true" if flag else "false"


class _Histogram:
    """Cumulative buckets (the last one is +Inf) and sum; the caller holds the lock."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts):
            running += count
            out.append((_float_str(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


def _float_str(value: float) -> str:
    return repr(float(value))


class _Samples:
    """An interval's latency samples: all of them up to a cap, then a uniform reservoir."""

    __slots__ = ("values", "seen", "_random")

    def __init__(self) -> None:
        self.values: list[float] = []
        self.seen = 0
        self._random = random.Random(0)  # nosec B311 - which samples a reservoir keeps, not a secret

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < MAX_LATENCY_SAMPLES:
            self.values.append(value)
        else:
            j = self._random.randrange(self.seen)
            if j < MAX_LATENCY_SAMPLES:
                self.values[j] = value

    def take(self) -> tuple[float | None, float | None]:
        values = sorted(self.values)
        self.values = []
        self.seen = 0
        return percentile(values, 50), percentile(values, 99)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- runtimes


class InstanceStats:
    """One serving instance's counters. See the module docstring."""

    def __init__(self, *, key: str, application: str, variant: str, instance: str | None = None, simulated: bool = False) -> None:
        self.key = key
        self.application = application
        self.variant = variant
        self.instance = instance or key
        self.simulated = bool(simulated)
        self._lock = threading.Lock()
        self._queue_length: Callable[[], int] | None = None
        self._queue_value = 0
        # the interval
        self._arrivals = self._served = self._late = self._dropped = self._failed = self._batches = self._batched = 0
        self._busy_ms = 0.0
        self._samples = _Samples()
        self._since = time.monotonic()
        # cumulative (Prometheus, health)
        self.c_arrivals = self.c_on_time = self.c_late = self.c_dropped = self.c_failed = self.c_batches = self.c_batched = 0
        self.c_failed_by_reason = {reason: 0 for reason in FAILURE_REASONS if reason != "REJECTED"}  # the drops are REJECTED
        self.c_request_us = self.c_queue_us = self.c_compute_us = 0.0
        self.h_latency = _Histogram(LATENCY_BUCKETS_S)
        self.h_batch = _Histogram(BATCH_SIZE_BUCKETS)

    # ------------------------------------------------------------------ events

    def queue_length_source(self, fn: Callable[[], int] | None) -> None:
        """How to read the current queue length (sampled at snapshots and scrapes)."""
        self._queue_length = fn

    def queue_length_set(self, n: int) -> None:
        self._queue_value = int(n)

    def arrival(self, n: int = 1) -> None:
        with self._lock:
            self._arrivals += n
            self.c_arrivals += n

    def served(self, latency_ms: float, queue_ms: float = 0.0, compute_ms: float = 0.0, late: bool = False) -> None:
        with self._lock:
            self._served += 1
            if late:
                self._late += 1
                self.c_late += 1
            else:
                self.c_on_time += 1
            self._samples.add(latency_ms)
            self.h_latency.observe(latency_ms / 1000.0)
            self.c_request_us += latency_ms * 1000.0
            self.c_queue_us += queue_ms * 1000.0
            self.c_compute_us += compute_ms * 1000.0

    # A failure's times go into no duration counter: Triton's cover successful requests only
    # (core, src/infer_stats.cc, UpdateFailure), so duration / success is the mean latency of answers.
    def dropped(self, latency_ms: float = 0.0, queue_ms: float = 0.0) -> None:
        """The drop rule gave up on a query (Triton's REJECTED: a timeout in the scheduler)."""
        with self._lock:
            self._dropped += 1
            self.c_dropped += 1

    def failed(self, latency_ms: float = 0.0, *, reason: str = "OTHER") -> None:
        """A query answered with an error: `reason` "BACKEND" when the model failed, else "OTHER"."""
        if reason not in self.c_failed_by_reason:
            raise ValueError(f"failure reason {reason!r}: one of {sorted(self.c_failed_by_reason)}")
        with self._lock:
            self._failed += 1
            self.c_failed += 1
            self.c_failed_by_reason[reason] += 1

    def batch(self, size: int, compute_ms: float) -> None:
        with self._lock:
            self._batches += 1
            self._batched += size
            self._busy_ms += compute_ms
            self.c_batches += 1
            self.c_batched += size
            self.h_batch.observe(size)

    # ------------------------------------------------------------------ reading

    def queue_length(self) -> int:
        fn = self._queue_length
        if fn is None:
            return self._queue_value
        try:
            return int(fn())
        except Exception:  # a closed batcher: nothing queued
            return 0

    def snapshot_and_reset(self) -> dict[str, Any]:
        """This interval's report (see the module docstring); the interval counters start again at 0."""
        queue_length = self.queue_length()
        with self._lock:
            now = time.monotonic()
            p50, p99 = self._samples.take()
            out = {
                "key": self.key, "application": self.application, "variant": self.variant,
                "arrivals": self._arrivals, "served": self._served, "late": self._late, "dropped": self._dropped,
                "queue_length": queue_length, "batches": self._batches,
                "batch_size_mean": _round(self._batched / self._batches) if self._batches else None,
                "latency_p50_ms": _round(p50), "latency_p99_ms": _round(p99),
                "busy_ms": round(self._busy_ms, 3), "failed": self._failed,
                "interval_s": round(now - self._since, 6),
            }
            self._arrivals = self._served = self._late = self._dropped = self._failed = self._batches = self._batched = 0
            self._busy_ms = 0.0
            self._since = now
        return out

    def totals(self) -> dict[str, Any]:
        """Counts since the start."""
        with self._lock:
            return {
                "arrivals": self.c_arrivals, "served": self.c_on_time + self.c_late, "late": self.c_late,
                "dropped": self.c_dropped, "failed": self.c_failed, "batches": self.c_batches,
                "queue_length": self.queue_length(),
            }

    def _families(self, fams: dict[str, Metric]) -> None:
        queue_length = self.queue_length()
        sim = _label(self.simulated)
        triton = [self.application, self.variant, self.instance, sim]
        tessera = [self.application, self.variant, self.instance, sim]
        with self._lock:
            failures = {"REJECTED": self.c_dropped, **self.c_failed_by_reason}
            values = {
                "nv_inference_request_success": self.c_on_time + self.c_late,
                "nv_inference_count": self.c_batched,
                "nv_inference_exec_count": self.c_batches,
                "nv_inference_request_duration_us": self.c_request_us,
                "nv_inference_queue_duration_us": self.c_queue_us,
                "nv_inference_compute_infer_duration_us": self.c_compute_us,
            }
            outcomes = (("served", self.c_on_time), ("late", self.c_late), ("dropped", self.c_dropped), ("failed", self.c_failed))
            h_latency = (self.h_latency.buckets(), self.h_latency.sum)
            h_batch = (self.h_batch.buckets(), self.h_batch.sum)
        labels = dict(zip(_TRITON_LABELS, triton))
        for name, value in values.items():
            fams[name].add_sample(name, labels, float(value))
        for reason in FAILURE_REASONS:
            fams["nv_inference_request_failure"].add_sample("nv_inference_request_failure", {**labels, "reason": reason},
                                                            float(failures[reason]))
        fams["nv_inference_pending_request_count"].add_sample("nv_inference_pending_request_count", labels, float(queue_length))
        for outcome, value in outcomes:
            fams["tessera_queries"].add_metric(tessera + [outcome], float(value))
        fams["tessera_queue_length"].add_metric(tessera, float(queue_length))
        fams["tessera_batch_size"].add_metric(tessera, h_batch[0], h_batch[1])
        fams["tessera_query_latency_seconds"].add_metric(tessera, h_latency[0], h_latency[1])


_TRITON_LABELS = ("model", "version", "instance", "simulated")
_TESSERA_LABELS = ["application", "variant", "instance", "simulated"]
# Triton's own HELP texts (core, src/metrics.cc); a Tessera query is Triton's request, its batch an execution.
_TRITON_HELP = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (does not include cached requests)",
    "nv_inference_exec_count": "Number of model executions performed (does not include cached requests)",
    "nv_inference_request_duration_us": "Cumulative inference request duration in microseconds (includes cached requests)",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds (includes cached requests)",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in microseconds (does not include cached requests)",
    "nv_inference_pending_request_count": "Instantaneous number of pending requests awaiting execution per-model.",
}


def _triton_family(name: str, help_text: str | None = None) -> Metric:
    return Metric(name, help_text or _TRITON_HELP[name], "counter")


class _RuntimeCollector:
    def __init__(self, stats: "RuntimeStats") -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        fams: dict[str, Metric] = {name: _triton_family(name) for name in TRITON_COUNTERS}
        fams["nv_inference_pending_request_count"] = Metric(
            "nv_inference_pending_request_count", _TRITON_HELP["nv_inference_pending_request_count"], "gauge")
        fams["tessera_queries"] = CounterMetricFamily(
            "tessera_queries", "Queries answered by the runtime, by outcome (served = on time)", labels=_TESSERA_LABELS + ["outcome"])
        fams["tessera_queue_length"] = GaugeMetricFamily("tessera_queue_length", "Queries queued at the instance", labels=_TESSERA_LABELS)
        fams["tessera_batch_size"] = HistogramMetricFamily("tessera_batch_size", "Queries per batch", labels=_TESSERA_LABELS)
        fams["tessera_query_latency_seconds"] = HistogramMetricFamily(
            "tessera_query_latency_seconds", "Query latency at the runtime, arrival to answer, served queries", labels=_TESSERA_LABELS)
        for inst in self._stats.instances():
            inst._families(fams)
        return list(fams.values())


class RuntimeStats:
    """The instances of one component (a runtime process: one) and their Prometheus registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._instances: dict[str, InstanceStats] = {}
        self.registry.register(_RuntimeCollector(self))

    def instance(self, *, key: str, application: str, variant: str, instance: str | None = None, simulated: bool = False) -> InstanceStats:
        """The stats of instance `key`, created on first use (later calls return the same object)."""
        with self._lock:
            stats = self._instances.get(key)
            if stats is None:
                stats = InstanceStats(key=key, application=application, variant=variant, instance=instance, simulated=simulated)
                self._instances[key] = stats
            return stats

    def remove(self, key: str) -> None:
        with self._lock:
            self._instances.pop(key, None)

    def instances(self) -> list[InstanceStats]:
        with self._lock:
            return list(self._instances.values())

    def snapshot_and_reset(self) -> list[dict[str, Any]]:
        return [inst.snapshot_and_reset() for inst in self.instances()]

    def exposition(self) -> bytes:
        return exposition(self.registry)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format, with Triton's counter names exactly as Triton has them."""
    return _TRITON_FIX.sub(rb"\1\2 ", generate_latest(registry))


def exposition_merge(texts: Iterable[bytes | str]) -> bytes:
    """Several Prometheus texts as one: families with the same name are merged (their samples must differ
    in labels, e.g. one `instance` per runtime), HELP and TYPE written once."""
    families: dict[str, Metric] = {}
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode()
        for family in text_string_to_metric_families(text):
            name = family.name
            held = families.get(name)
            if held is None:
                held = families[name] = Metric(name, family.documentation, family.type)
            if name in TRITON_COUNTERS:  # the parser gives every counter sample a `_total`; Triton's have none
                held.samples.extend(s._replace(name=name) if s.name == name + "_total" else s for s in family.samples)
            else:
                held.samples.extend(family.samples)

    class _Merged:
        def collect(self) -> Iterable[Metric]:
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return exposition(registry)


# --------------------------------------------------------------------------- report buffers


class ReportBacklogCollector:
    """A report buffer's counters (any object with `dropped_total`, `rejected_total`, `sent_late_total` and
    `pending`, i.e. `workers.client.ReportBacklog`) under `prefix`; see the module docstring."""

    def __init__(self, prefix: str, backlog: Any) -> None:
        self.prefix = prefix
        self.backlog = backlog

    def collect(self) -> Iterable[Metric]:
        p, b = self.prefix, self.backlog
        dropped = CounterMetricFamily(f"{p}_reports_dropped", "Reports let go because the outage buffer was full (oldest first)")
        dropped.add_metric([], float(b.dropped_total))
        rejected = CounterMetricFamily(f"{p}_reports_rejected", "Reports the control plane refused for good (4xx), not sent again")
        rejected.add_metric([], float(b.rejected_total))
        late = CounterMetricFamily(f"{p}_reports_sent_late", "Reports kept through an outage and delivered afterwards")
        late.add_metric([], float(b.sent_late_total))
        pending = GaugeMetricFamily(f"{p}_reports_pending", "Reports kept now, waiting for the control plane")
        pending.add_metric([], float(b.pending))
        return [dropped, rejected, late, pending]


# --------------------------------------------------------------------------- routers


class ApplicationStats:
    """One application's counters at a router."""

    def __init__(self, application: str) -> None:
        self.application = application
        self._lock = threading.Lock()
        self._arrivals = self._served = self._late = self._dropped = self._no_route = self._failed = 0
        self._samples = _Samples()
        self.c = {"served": 0, "late": 0, "dropped": 0, "no_route": 0, "failed": 0}
        self.h_latency = _Histogram(LATENCY_BUCKETS_S)
        # (variant, instance, simulated) -> [success, failure, duration_us, success duration_us, last answer (epoch ms),
        #   queue_us, compute_us (of the successes, as their runtimes measured them)]
        self.per_instance: dict[tuple[str, str, bool], list[float]] = {}
        # This interval's query sizes (rows per request: the planner's D[b]) and, for an ensemble, its counts
        # per scheduler that drew them (a policy changed within the interval gives two).
        self._query_sizes: dict[int, int] = {}
        self._ensembles: dict[str, dict[str, Any]] = {}

    def arrival(self) -> None:
        with self._lock:
            self._arrivals += 1

    def _instance(self, variant: str, instance: str, simulated: bool) -> list[float]:
        key = (variant, instance, simulated)
        row = self.per_instance.get(key)
        if row is None:
            row = self.per_instance[key] = [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0]
        row[4] = time.time() * 1000.0
        return row

    def _answer_count(self, latency_ms: float, late: bool) -> None:
        """A query answered (on time or late), lock held."""
        self._served += 1
        if late:
            self._late += 1
            self.c["late"] += 1
        else:
            self.c["served"] += 1
        self._samples.add(latency_ms)
        self.h_latency.observe(latency_ms / 1000.0)

    def _instance_count(self, ok: bool, latency_ms: float, variant: str, instance: str, simulated: bool,
                        queue_us: float = 0.0, compute_us: float = 0.0) -> None:
        """An instance's answer (ok) or failure, lock held."""
        row = self._instance(variant, instance, simulated)
        if ok:
            row[0] += 1
            row[3] += latency_ms * 1000.0
            row[5] += queue_us
            row[6] += compute_us
        else:
            row[1] += 1
        row[2] += latency_ms * 1000.0

    def served(self, latency_ms: float, late: bool, *, variant: str = "", instance: str = "", simulated: bool = False,
               queue_us: float = 0.0, compute_us: float = 0.0) -> None:
        with self._lock:
            self._answer_count(latency_ms, late)
            self._instance_count(True, latency_ms, variant, instance, simulated, queue_us, compute_us)

    def query_size(self, rows: int) -> None:
        with self._lock:
            self._query_sizes[rows] = self._query_sizes.get(rows, 0) + 1

    def ensemble_answered(self, chosen: Iterable[str], voted: Iterable[str], scheduler: str) -> None:
        """One ensemble query: the members chosen and those that voted (answered in time), counted under the
        scheduler that drew them, so that draws made before a policy change are never counted under the new
        one."""
        chosen, voted = tuple(chosen), tuple(voted)
        scheduler = scheduler[:ENSEMBLE_SCHEDULER_MAX]
        with self._lock:
            e = self._ensembles.get(scheduler)
            if e is None:
                e = self._ensembles[scheduler] = {"scheduler": scheduler, "queries": 0, "chosen": {}, "voted": {}, "sizes": {}}
            e["queries"] += 1
            for m in chosen:
                e["chosen"][m] = e["chosen"].get(m, 0) + 1
            for m in voted:
                e["voted"][m] = e["voted"].get(m, 0) + 1
            key = str(len(chosen))
            e["sizes"][key] = e["sizes"].get(key, 0) + 1

    def answered(self, latency_ms: float, late: bool) -> None:
        """An ensemble query answered (the members are counted at their instances by `member_outcome`)."""
        with self._lock:
            self._answer_count(latency_ms, late)

    def member_outcome(self, ok: bool, latency_ms: float, *, variant: str = "", instance: str = "", simulated: bool = False,
                       queue_us: float = 0.0, compute_us: float = 0.0) -> None:
        """An ensemble member's answer (ok) or failure at its instance: the per-instance counters only."""
        if instance:
            with self._lock:
                self._instance_count(ok, latency_ms, variant, instance, simulated, queue_us, compute_us)

    def dropped(self, latency_ms: float, *, variant: str = "", instance: str = "", simulated: bool = False) -> None:
        with self._lock:
            self._dropped += 1
            self.c["dropped"] += 1
            self.h_latency.observe(latency_ms / 1000.0)
            if instance:
                self._instance_count(False, latency_ms, variant, instance, simulated)

    def no_route(self) -> None:
        with self._lock:
            self._no_route += 1
            self.c["no_route"] += 1

    def failed(self, latency_ms: float = 0.0, *, variant: str = "", instance: str = "", simulated: bool = False) -> None:
        with self._lock:
            self._failed += 1
            self.c["failed"] += 1
            if instance:
                self._instance_count(False, latency_ms, variant, instance, simulated)

    def per_variant(self) -> dict[str, dict[str, float]]:
        """Since the start, per variant: answers (`success`, `success_us`, and of those the runtimes' `queue_us`
        and `compute_us`), failures (`failure`, `failure_us`) and the last answer's time (`last_ms`, epoch ms):
        the protocol's model statistics."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            rows = [(k[0], list(v)) for k, v in self.per_instance.items()]
        for variant, (ok, bad, us, ok_us, last, queue_us, compute_us) in rows:
            agg = out.setdefault(variant, {"success": 0, "success_us": 0.0, "failure": 0, "failure_us": 0.0, "last_ms": 0.0,
                                           "queue_us": 0.0, "compute_us": 0.0})
            agg["queue_us"] += queue_us
            agg["compute_us"] += compute_us
            agg["success"] += ok
            agg["success_us"] += ok_us
            agg["failure"] += bad
            agg["failure_us"] += us - ok_us
            agg["last_ms"] = max(agg["last_ms"], last)
        return out

    def snapshot_and_reset(self, routing_version: int | None) -> dict[str, Any]:
        with self._lock:
            p50, p99 = self._samples.take()
            out = {
                "application": self.application, "routing_version": routing_version,
                "arrivals": self._arrivals, "served": self._served, "late": self._late, "dropped": self._dropped,
                "no_route": self._no_route, "latency_p50_ms": _round(p50), "latency_p99_ms": _round(p99),
            }
            if self._query_sizes:
                out["query_sizes"] = {str(k): v for k, v in sorted(self._query_sizes.items())}
                self._query_sizes = {}
            if self._ensembles:
                out["ensembles"], self._ensembles = list(self._ensembles.values()), {}
            self._arrivals = self._served = self._late = self._dropped = self._no_route = self._failed = 0
        return out


class PathStats:
    """One pipeline path's end-to-end counters at a router: answered on time or late, dropped (past its
    deadline before a stage, or by a stage's runtime), failed; latency from arrival to the last stage's
    answer. Each stage is also counted as its own application (`ApplicationStats`)."""

    OUTCOMES = ("served", "late", "dropped", "failed", "no_route")

    def __init__(self, pipeline: str, path: str) -> None:
        self.pipeline, self.path = pipeline, path
        self._lock = threading.Lock()
        self.c = {outcome: 0 for outcome in self.OUTCOMES}  # since the start (Prometheus)
        self.dropped_at: dict[str, int] = {}  # stage -> queries dropped there
        self.h_latency = _Histogram(LATENCY_BUCKETS_S)
        self._arrivals = 0
        self._interval = {outcome: 0 for outcome in self.OUTCOMES}  # this report's interval
        self._samples = _Samples()

    def arrival(self) -> None:
        with self._lock:
            self._arrivals += 1

    def outcome(self, outcome: str, latency_ms: float, *, stage: str | None = None) -> None:
        with self._lock:
            self.c[outcome] += 1
            self._interval[outcome] += 1
            if outcome in ("served", "late"):
                self.h_latency.observe(latency_ms / 1000.0)
                self._samples.add(latency_ms)
            if outcome == "dropped" and stage is not None:
                self.dropped_at[stage] = self.dropped_at.get(stage, 0) + 1

    def snapshot_and_reset(self) -> dict[str, Any] | None:
        """This interval's counts (served = answered, on time or late, as for applications), None when the
        path saw nothing."""
        with self._lock:
            counts, arrivals = self._interval, self._arrivals
            if not arrivals and not any(counts.values()):
                return None
            p50, p99 = self._samples.take()
            self._interval = {outcome: 0 for outcome in self.OUTCOMES}
            self._arrivals = 0
        return {"pipeline": self.pipeline, "path": self.path, "arrivals": arrivals, "served": counts["served"] + counts["late"],
                "late": counts["late"], "dropped": counts["dropped"], "failed": counts["failed"], "no_route": counts["no_route"],
                "latency_p50_ms": _round(p50), "latency_p99_ms": _round(p99)}


class _RouterCollector:
    def __init__(self, stats: "RouterStats") -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        queries = CounterMetricFamily("tessera_router_queries", "Queries the router answered, by outcome (served = on time)",
                                      labels=["application", "outcome"])
        latency = HistogramMetricFamily("tessera_router_latency_seconds", "Query latency at the router (served and dropped)",
                                        labels=["application"])
        version = GaugeMetricFamily("tessera_routing_table_version", "Version of the routing table the router follows",
                                    labels=["application"])
        up = GaugeMetricFamily("tessera_router_control_plane_up", "1 when the last routing-table fetch succeeded")
        up.add_metric([], 1.0 if self._stats.control_plane_up else 0.0)
        triton = {name: _triton_family(name, help_text) for name, help_text in (
            ("nv_inference_request_success", "Successful inference requests through the router"),
            ("nv_inference_request_failure", "Failed inference requests through the router (dropped or errors at an instance)"),
            ("nv_inference_request_duration_us", "Cumulative request duration at the router in microseconds (successful requests)"),
        )}
        versions = self._stats.versions()
        for app in self._stats.applications():
            with app._lock:
                counts = dict(app.c)
                buckets, total = app.h_latency.buckets(), app.h_latency.sum
                rows = [(k, list(v)) for k, v in app.per_instance.items()]
            for outcome, value in counts.items():
                queries.add_metric([app.application, outcome], float(value))
            latency.add_metric([app.application], buckets, total)
            # As Triton's, the duration counter covers successful requests only: duration / success is their mean.
            for (variant, instance, simulated), (ok, bad, _us, ok_us, *_rest) in rows:
                labels = {"model": app.application, "version": variant, "instance": instance, "simulated": _label(simulated)}
                triton["nv_inference_request_success"].add_sample("nv_inference_request_success", labels, float(ok))
                triton["nv_inference_request_failure"].add_sample("nv_inference_request_failure", labels, float(bad))
                triton["nv_inference_request_duration_us"].add_sample("nv_inference_request_duration_us", labels, float(ok_us))
        for application, v in versions.items():
            if v is not None:
                version.add_metric([application], float(v))
        paths = CounterMetricFamily("tessera_router_pipeline_queries", "Pipeline queries by path and end-to-end outcome (served = on time)",
                                    labels=["pipeline", "path", "outcome"])
        path_latency = HistogramMetricFamily("tessera_router_pipeline_latency_seconds", "End-to-end latency of answered pipeline queries",
                                             labels=["pipeline", "path"])
        drops = CounterMetricFamily("tessera_router_pipeline_stage_drops", "Pipeline queries dropped at a stage, past their deadline",
                                    labels=["pipeline", "path", "stage"])
        for p in self._stats.paths():
            with p._lock:
                counts, dropped_at = dict(p.c), dict(p.dropped_at)
                buckets, total = p.h_latency.buckets(), p.h_latency.sum
            for outcome, value in counts.items():
                paths.add_metric([p.pipeline, p.path, outcome], float(value))
            path_latency.add_metric([p.pipeline, p.path], buckets, total)
            for stage, value in dropped_at.items():
                drops.add_metric([p.pipeline, p.path, stage], float(value))
        return [queries, latency, version, up, *triton.values(), paths, path_latency, drops]


class RouterStats:
    """A router's per-application counters and its Prometheus registry. See the module docstring."""

    def __init__(self, router: str, registry: CollectorRegistry | None = None) -> None:
        self.router = router
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.control_plane_up = False
        self._lock = threading.Lock()
        self._apps: dict[str, ApplicationStats] = {}
        self._paths: dict[tuple[str, str], PathStats] = {}
        self._versions: dict[str, int | None] = {}
        self._since = time.monotonic()
        self.registry.register(_RouterCollector(self))

    def application(self, name: str) -> ApplicationStats:
        app = self._apps.get(name)
        if app is None:
            with self._lock:
                app = self._apps.get(name)
                if app is None:
                    app = self._apps[name] = ApplicationStats(name)
        return app

    def applications(self) -> list[ApplicationStats]:
        with self._lock:
            return list(self._apps.values())

    def path(self, pipeline: str, path: str) -> PathStats:
        key = (pipeline, path)
        stats = self._paths.get(key)
        if stats is None:
            with self._lock:
                stats = self._paths.setdefault(key, PathStats(pipeline, path))
        return stats

    def paths(self) -> list[PathStats]:
        with self._lock:
            return list(self._paths.values())

    def versions_set(self, versions: dict[str, int | None]) -> None:
        """The routing-table version per application (the gauge, and the reports' routing_version)."""
        with self._lock:
            self._versions = dict(versions)

    def versions(self) -> dict[str, int | None]:
        with self._lock:
            return dict(self._versions)

    def snapshot_and_reset(self) -> dict[str, Any]:
        """The router report for the interval since the previous call."""
        now = time.monotonic()
        versions = self.versions()
        for name in versions:
            self.application(name)
        apps = [app.snapshot_and_reset(versions.get(app.application)) for app in self.applications()]
        with self._lock:
            interval, self._since = now - self._since, now
        paths = [row for row in (p.snapshot_and_reset() for p in self.paths()) if row is not None]
        report = {"router": self.router, "at": utc_now_iso(), "interval_s": round(interval, 6),
                  "applications": sorted(apps, key=lambda a: a["application"])}
        if paths:
            report["pipelines"] = sorted(paths, key=lambda p: (p["pipeline"], p["path"]))
        return report

    def exposition(self) -> bytes:
        return exposition(self.registry)
