"""Live roll-ups of telemetry, for the dashboard: what each application is asked for and gets, its p99
against its SLO, the accuracy it is served at and how often the SLO is violated; what each GPU instance
carries. Pure Python (no Django): the overview page's history (from stored samples) and the WebSocket's
live feed (from reports as they arrive) call the same `application_rollup`.

Definitions (one place):
- demand: requests/s the routers received; served: answered (on time or late) per second;
- violation ratio: (late + dropped + no_route) / arrivals, at the routers (what the caller saw);
- p99: the highest p99 of the routers that had traffic (a conservative merge: tail latencies of
  different routers cannot be combined exactly from their percentiles);
- effective accuracy: the mean of the variants' accuracies weighted by what each served, from the
  runtimes' reports (the routers do not know which variant answered)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class RouterCounts:
    """One router's counts for one application over one interval."""

    router: str
    application: str
    at: float  # end of the interval, epoch seconds
    interval_s: float
    arrivals: int
    served: int
    late: int
    dropped: int
    no_route: int
    p99_ms: float | None


@dataclass(frozen=True)
class VariantServed:
    """Requests a variant served for an application over one interval (summed over its runtimes)."""

    application: str
    variant: str
    served: int


@dataclass(frozen=True)
class ApplicationCatalogue:
    """What the roll-up needs to know about an application besides its telemetry."""

    slo_ms: float | None
    accuracies: Mapping[str, float]  # variant name -> accuracy


@dataclass
class ApplicationRollup:
    application: str
    demand_rps: float = 0.0
    served_rps: float = 0.0
    p99_ms: float | None = None
    slo_ms: float | None = None
    accuracy: float | None = None
    violation_ratio: float | None = None
    routers: int = 0

    @property
    def slo_met(self) -> bool | None:
        if self.p99_ms is None or self.slo_ms is None:
            return None
        return self.p99_ms <= self.slo_ms

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "slo_met": self.slo_met}


def application_rollup(
    *,
    routers: Iterable[RouterCounts],
    variants: Iterable[VariantServed],
    catalogue: Mapping[str, ApplicationCatalogue],
) -> dict[str, ApplicationRollup]:
    """Roll one interval's router counts and per-variant served counts up per application. Every
    application of the catalogue appears, with zeros when nothing was reported for it."""
    out = {name: ApplicationRollup(application=name, slo_ms=entry.slo_ms) for name, entry in catalogue.items()}
    bad: dict[str, int] = {}
    arrivals: dict[str, int] = {}
    for r in routers:
        roll = out.get(r.application) or out.setdefault(r.application, ApplicationRollup(application=r.application))
        interval = r.interval_s if r.interval_s > 0 else 1.0
        roll.demand_rps += r.arrivals / interval
        roll.served_rps += r.served / interval
        roll.routers += 1
        arrivals[r.application] = arrivals.get(r.application, 0) + r.arrivals
        bad[r.application] = bad.get(r.application, 0) + r.late + r.dropped + r.no_route
        if r.arrivals > 0 and r.p99_ms is not None:
            roll.p99_ms = r.p99_ms if roll.p99_ms is None else max(roll.p99_ms, r.p99_ms)
    for name, total in arrivals.items():
        if total > 0:
            out[name].violation_ratio = bad[name] / total
    weighted: dict[str, float] = {}
    served: dict[str, int] = {}
    for v in variants:
        entry = catalogue.get(v.application)
        accuracy = entry.accuracies.get(v.variant) if entry else None
        if accuracy is None or v.served <= 0:
            continue  # a variant the registry does not know has no accuracy to weigh
        weighted[v.application] = weighted.get(v.application, 0.0) + accuracy * v.served
        served[v.application] = served.get(v.application, 0) + v.served
    for name, count in served.items():
        roll = out.get(name) or out.setdefault(name, ApplicationRollup(application=name))
        roll.accuracy = weighted[name] / count
    return out


@dataclass
class _Latest:
    at: float
    data: dict


def _keep_latest(table: dict, key: Any, report: _Latest) -> None:
    """Hold `report` under `key` unless a fresher one is held: reports kept through an outage arrive late,
    with their original times, and must not replace what is newer."""
    held = table.get(key)
    if held is None or report.at >= held.at:
        table[key] = report


@dataclass
class LiveWindow:
    """The latest report of every router, runtime and GPU instance, as they stream in (by their `at`: a
    late report, sent after an outage, never replaces a fresher one); a source that has not reported for
    `horizon_s` drops out. `snapshot()` rolls them up for the browser."""

    horizon_s: float = 3.0
    routers: dict[tuple[str, str], _Latest] = field(default_factory=dict)
    runtimes: dict[str, _Latest] = field(default_factory=dict)  # "<host>/<runtime key>"
    instances: dict[str, _Latest] = field(default_factory=dict)  # "<host>/gpu<i>[/<placement>]"
    hosts: dict[str, float] = field(default_factory=dict)  # host -> `at` of its last agent report
    fresh_hosts: dict[str, float] = field(default_factory=dict)  # reports since the last snapshot
    last_report_at: float | None = None

    def host_report(self, event: Mapping[str, Any]) -> None:
        """An agent's metrics report (see `apps.telemetry.streams.host_metrics_event`)."""
        host, at = event["host"], float(event["at"])
        self.hosts[host] = max(self.hosts.get(host, at), at)
        self.fresh_hosts[host] = max(self.fresh_hosts.get(host, at), at)
        self.last_report_at = max(self.last_report_at or at, at)
        interval = float(event.get("interval_s") or 1.0)
        for r in event.get("runtimes", ()):
            _keep_latest(self.runtimes, f"{host}/{r['key']}", _Latest(at, {**r, "interval_s": interval}))
        for i in event.get("instances", ()):
            _keep_latest(self.instances, f"{host}/{i['device']}", _Latest(at, i))

    def router_report(self, event: Mapping[str, Any]) -> None:
        """A router's per-application report (see `apps.telemetry.streams.router_report_event`)."""
        at = float(event["at"])
        self.last_report_at = max(self.last_report_at or at, at)
        interval = float(event.get("interval_s") or 1.0)
        for a in event.get("applications", ()):
            _keep_latest(self.routers, (event["router"], a["application"]), _Latest(at, {**a, "interval_s": interval}))

    def _expire(self, now: float) -> None:
        cutoff = now - self.horizon_s
        for table in (self.routers, self.runtimes, self.instances):
            for key in [k for k, v in table.items() if v.at < cutoff]:
                del table[key]

    def _per_instance(self) -> dict[str, dict[str, Any]]:
        """Every GPU slice's utilisation and memory, and every runtime's load, keyed by instance id."""
        out = {
            instance_id: {"utilization_pct": latest.data.get("utilization_pct"), "memory_used_mb": latest.data.get("memory_used_mb")}
            for instance_id, latest in self.instances.items()
        }
        for runtime_id, latest in self.runtimes.items():
            r = latest.data
            out.setdefault(runtime_id, {"utilization_pct": None, "memory_used_mb": None}).update({
                "application": r.get("application", ""), "variant": r.get("variant", ""),
                "load_rps": round(r.get("arrivals", 0) / r["interval_s"], 2), "queue": r.get("queue_length", 0),
                "p99_ms": r.get("latency_p99_ms"), "cores": r.get("cores"), "max_batch": r.get("max_batch"),
            })
        return out

    def snapshot(self, *, now: float, catalogue: Mapping[str, ApplicationCatalogue], instances: bool = True) -> dict[str, Any]:
        """The JSON the dashboard draws from: per application roll-ups, fleet totals, which hosts reported
        since the previous snapshot (with their reports' times) and, with `instances`, every instance's load
        and utilisation (the fleet page's; for a large fleet it is most of the message, so pages that do not
        draw instances go without)."""
        return self.snapshots(now=now, views=[(catalogue, instances)])[0]

    def snapshots(self, *, now: float, views: Sequence[tuple[Mapping[str, ApplicationCatalogue], bool]]) -> list[dict[str, Any]]:
        """`snapshot` for several views of the same moment at once, one per (catalogue, instances): what the
        window holds is read once and rolled up once per catalogue, not once per browser (issue 43; the
        dashboard's hub sends each result to every socket that shares it). The hosts that reported since
        the previous call are in every view's "reports"."""
        self._expire(now)
        routers = [
            RouterCounts(
                router=router, application=application, at=latest.at, interval_s=latest.data["interval_s"],
                arrivals=latest.data.get("arrivals", 0), served=latest.data.get("served", 0),
                late=latest.data.get("late", 0), dropped=latest.data.get("dropped", 0),
                no_route=latest.data.get("no_route", 0), p99_ms=latest.data.get("latency_p99_ms"),
            )
            for (router, application), latest in self.routers.items()
        ]
        served: dict[tuple[str, str], int] = {}
        for latest in self.runtimes.values():
            key = (latest.data.get("application", ""), latest.data.get("variant", ""))
            served[key] = served.get(key, 0) + int(latest.data.get("served", 0))
        variants = [VariantServed(application=a, variant=v, served=n) for (a, v), n in served.items()]
        utilisations = [u for u in (latest.data.get("utilization_pct") for latest in self.instances.values()) if u is not None]
        per_instance = self._per_instance() if any(instances for _catalogue, instances in views) else {}
        fresh, self.fresh_hosts = self.fresh_hosts, {}
        fleet = {
            "hosts_reporting": sum(1 for at in self.hosts.values() if at >= now - self.horizon_s),
            "runtimes": len(self.runtimes),
            "gpu_slices": len(self.instances),  # MIG instances, and whole GPUs without MIG
            "gpu_utilization_mean_pct": round(sum(utilisations) / len(utilisations), 1) if utilisations else None,
        }
        report_age = None if self.last_report_at is None else max(0.0, now - self.last_report_at)
        out = []
        for catalogue, instances in views:
            applications = application_rollup(routers=routers, variants=variants, catalogue=catalogue)
            out.append({
                "at": now,
                "report_age_s": report_age,
                "applications": {name: roll.as_dict() for name, roll in sorted(applications.items())},
                "instances": per_instance if instances else {},
                "fleet": {
                    **fleet,
                    "demand_rps": round(sum(a.demand_rps for a in applications.values()), 2),
                    "served_rps": round(sum(a.served_rps for a in applications.values()), 2),
                },
                "reports": fresh,
            })
        return out
