"""Which instance of an application takes a query: the router's choice policy, kept apart from the transport
that sends the query (workers/router/dispatch.py), as Ray Serve keeps its replica scheduler apart from its
router. The draw is the plan's weights (`WeightedRouter`, engine/dataplane/routing.py, the simulator's too)
over the instances that can take the query now: not the table's own exclusions (routes not `ready`, or
without an endpoint), not an endpoint left out for `unavailable_s` after it refused or lost a connection or
answered `draining`, and not an instance found serving another model under this version of the table
(`stale`, until the control plane publishes a new one)."""
from __future__ import annotations

from typing import Callable

from engine.dataplane.routing import NoRouteAvailable
from workers.router.table import Application, Route

__all__ = ["InstanceChoice"]


class InstanceChoice:
    """The instances not to draw, and the draw. `unavailable`: endpoint -> until (time.monotonic); `stale`:
    (application, instance) -> the table version under which the instance answered as another model."""

    def __init__(self, *, unavailable_s: float = 1.0) -> None:
        self.unavailable_s = unavailable_s
        self.unavailable: dict[str, float] = {}
        self.stale: dict[tuple[str, str], int] = {}

    def endpoint_unavailable(self, endpoint: str, now: float) -> None:
        """Leave `endpoint` out for `unavailable_s` (it refused, lost the connection, or is draining)."""
        self.unavailable[endpoint] = now + self.unavailable_s

    def instance_stale(self, app: Application, instance: str) -> None:
        """Leave `instance` out of `app` until its table changes: it answered as another model."""
        self.stale[(app.name, instance)] = app.version

    def prune(self, apps: dict[str, Application]) -> None:
        """Forget the stale instances of tables replaced since (or gone)."""
        for key, version in list(self.stale.items()):
            if key[0] not in apps or apps[key[0]].version != version:
                del self.stale[key]

    def excluded(self, app: Application, now: float) -> frozenset[str] | set[str]:
        """The instances of `app` not to draw now: the table's own exclusions, the endpoints left out and the
        instances found serving another model under this version of the table."""
        unavailable = self.unavailable
        if not unavailable and not self.stale:
            return app.excluded
        bad = set(app.excluded)
        if self.stale:
            for (application, instance), version in list(self.stale.items()):
                if application != app.name:
                    continue
                if version != app.version:  # a newer table: the control plane had its say, try it again
                    del self.stale[(application, instance)]
                else:
                    bad.add(instance)
        for endpoint, until in list(unavailable.items()):
            if until <= now:
                del unavailable[endpoint]
                continue
            for r in app.routes.values():
                if r.endpoint == endpoint:
                    bad.add(r.instance)
        return bad

    def choose(self, app: Application, now: float, *, variant: str | None = None,
               choose: Callable[[frozenset[str] | set[str]], str] | None = None) -> Route:
        """The route of the instance to send to: drawn by the table's weights, or by `choose(excluded)` (an
        ensemble member's instance routing), among those of `variant` when named. NoRouteAvailable, saying
        why, when none can take the query."""
        try:
            if app.picker is None:
                raise NoRouteAvailable(f"{app.name}: the routing table is empty")
            excluded = self.excluded(app, now)
            if variant is not None:
                others = app.others(variant)
                if others:
                    excluded = others.union(excluded)
            if choose is not None:
                instance = choose(excluded)
            else:
                instance = app.picker.choose_excluding(excluded) if excluded else app.picker.choose()
        except NoRouteAvailable as exc:
            message = str(exc) if variant is None else f"{app.name}: no instance of variant {variant!r} can take the query now"
            stale = sorted(i for (a, i), v in self.stale.items() if a == app.name and v == app.version)
            if stale:
                message += f" ({', '.join(stale)} now serve another model; the routing table is being updated)"
            raise NoRouteAvailable(message) from None
        return app.routes[instance]
