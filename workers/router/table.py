"""The router's routing state: each application's published routing table parsed into the router's view
(`Application`, drawn by the engine's `WeightedRouter`), the tables held and their refresh, and table sources."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from engine.dataplane.routing import RoutingTable, WeightedRouter
from workers.metrics import RouterStats, utc_now_iso
from workers.router.ensembles import RouterEnsemble, ensemble_build
from workers.router.pipelines import RouterPipeline, pipelines_from_apps
from workers.router.upstream import endpoint_parse

__all__ = ["Application", "Route", "RoutingTables", "application_build", "tables_file_reader"]

log = logging.getLogger("tessera.router")


@dataclass
class Route:
    instance: str
    variant: str
    endpoint: str | None
    state: str
    weight: float
    batch: int | None = None  # the instance's planned batch size, where the table gives it


@dataclass
class Application:
    name: str
    version: int
    slo_ms: float
    drop_rule: str
    table: dict
    routes: dict[str, Route]
    picker: WeightedRouter | None
    excluded: frozenset[str]
    ensemble: "RouterEnsemble | None" = None  # a random ensemble per query (workers/router/ensembles.py)
    _others: dict[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    def others(self, variant: str) -> frozenset[str]:
        """The instances that serve another variant than `variant` (not drawn for a query that names it)."""
        found = self._others.get(variant)
        if found is None:
            found = self._others[variant] = frozenset(i for i, r in self.routes.items() if r.variant != variant)
        return found


def application_build(table: dict, previous: Application | None = None) -> Application:
    """A routing table as the API lists it -> the router's view (raises ValueError when it does not parse).
    `previous` (the application's view before this refresh) keeps its ensemble's frequency table and
    estimator when the table's ensemble block is unchanged."""
    if not isinstance(table, dict):
        raise ValueError(f"a routing table must be an object, got {type(table).__name__}")
    name = table.get("application")
    version = table.get("version")
    slo = table.get("slo_ms")
    if not isinstance(name, str) or not name:
        raise ValueError(f"routing table without an application: {table!r:.200}")
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not slo > 0:
        raise ValueError(f"{name}: slo_ms must be a number > 0, got {slo!r}")
    routes: dict[str, Route] = {}
    entries = []
    for i, r in enumerate(table.get("routes") or []):
        if not isinstance(r, dict) or not isinstance(r.get("instance"), str):
            raise ValueError(f"{name}: routes[{i}] must be an object with an instance")
        weight = r.get("weight", 0.0)
        batch = r.get("batch")
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise ValueError(f"{name}: routes[{i}].batch must be a whole number >= 1, got {batch!r}")
        route = Route(r["instance"], str(r.get("variant") or ""), r.get("endpoint") or None, str(r.get("state") or "ready"), weight, batch)
        if route.endpoint is not None:
            endpoint_parse(route.endpoint)
        routes[route.instance] = route
        entries.append((route.instance, weight))
    rt = RoutingTable(name, version, tuple(entries))  # validates the version and the weights
    picker = WeightedRouter(rt) if any(w > 0 for _, w in rt.entries) else None
    excluded = frozenset(r.instance for r in routes.values() if r.state != "ready" or r.endpoint is None)
    ensemble = ensemble_build(name, table.get("ensemble"), previous.ensemble if previous is not None else None)
    return Application(name, rt.version, float(slo), str(table.get("drop_rule") or "deadline"), table, routes, picker, excluded, ensemble)


class RoutingTables:
    """The tables a router holds (`apps`: application name -> `Application`), refreshed from `fetch_tables()`.

    `fetch_tables()` returns the active routing tables exactly as `GET /api/v1/routing-tables/?active=true`
    lists them (`ControlPlaneClient.routing_tables`, or `tables_file_reader`); it is blocking and runs in a
    worker thread. A fetch that raises keeps the LAST GOOD tables (one warning per outage,
    `tessera_router_control_plane_up` 0); a table that does not parse keeps that application's previous one.
    `apps` is replaced in one assignment: a query sees one version of each table, whole. `on_apply(apps)` is
    called after each replacement (the dispatcher closes connections no table routes to any more)."""

    def __init__(self, fetch_tables: Callable[[], list[dict]], stats: RouterStats,
                 on_apply: Callable[[dict[str, Application]], None] | None = None) -> None:
        self.fetch_tables = fetch_tables
        self.stats = stats
        self.on_apply = on_apply
        self.apps: dict[str, Application] = {}
        self.pipelines: dict[str, RouterPipeline] = {}  # carried by their stages' tables
        self.refreshed_at: str | None = None
        self.refreshes = 0
        self._down_logged = False

    @property
    def control_plane_up(self) -> bool:
        return self.stats.control_plane_up

    def apply(self, tables: Sequence[dict]) -> None:
        """Replace the held tables with `tables` (what fetch_tables returned). An application whose table
        does not parse keeps its previous table; one no longer listed is dropped."""
        held = self.apps
        new: dict[str, Application] = {}
        for table in tables:
            try:
                name = table.get("application") if isinstance(table, dict) else None
                app = application_build(table, held.get(name) if isinstance(name, str) else None)
            except (ValueError, TypeError) as exc:
                name = table.get("application") if isinstance(table, dict) else None
                log.warning("ignoring a routing table that does not parse (%s); keeping the previous one", exc)
                if isinstance(name, str) and name in held:
                    new[name] = held[name]
                continue
            previous = new.get(app.name)
            if previous is None or app.version >= previous.version:
                new[app.name] = app
        self.apps = new  # one assignment: requests see the old dict or the new one
        self.pipelines = pipelines_from_apps(new)
        self.stats.versions_set({name: app.version for name, app in new.items()})
        if self.on_apply is not None:
            self.on_apply(new)

    async def refresh(self) -> bool:
        """Fetch the tables once (in a thread) and apply them; False (tables kept) when the fetch failed."""
        loop = asyncio.get_running_loop()
        try:
            tables = await loop.run_in_executor(None, self.fetch_tables)
            if not isinstance(tables, (list, tuple)):
                raise TypeError(f"fetch_tables returned {type(tables).__name__}, not a list")
        except Exception as exc:  # the control plane is away: serve on what we have
            self.stats.control_plane_up = False
            if not self._down_logged:
                self._down_logged = True
                log.warning("routing tables unavailable (%s: %s); keeping the last good tables (%s)", type(exc).__name__, exc,
                            ", ".join(f"{a.name} v{a.version}" for a in self.apps.values()) or "none")
            return False
        if self._down_logged:
            log.info("routing tables available again")
        self._down_logged = False
        self.apply(tables)
        self.stats.control_plane_up = True
        self.refreshed_at = utc_now_iso()
        self.refreshes += 1
        return True


def tables_file_reader(path: str | Path) -> Callable[[], list[dict]]:
    """A `fetch_tables` that reads the tables from a JSON file (a list, or {"results": [...]}) on every
    refresh: a router without a control plane (benches, demos)."""
    path = Path(path)

    def fetch() -> list[dict]:
        data = json.loads(path.read_text())
        return data["results"] if isinstance(data, dict) else data

    return fetch
