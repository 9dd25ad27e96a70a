"""Sending one query to an instance of its application (`Dispatcher`): the transport (connections, frame,
deadline), retries on a refused, lost, draining or wrong-model instance, and the outcome's metrics; the
instance is the choice policy's (workers/router/choice.py). A query is only ever answered by the application
and variant its route names."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from engine.dataplane.routing import NoRouteAvailable
from workers.metrics import ApplicationStats
from workers.router.choice import InstanceChoice
from workers.router.table import Application
from workers.router.upstream import Upstream, UpstreamError
from workers.wire import UNKNOWN_INSTANCE, WRONG_MODEL

__all__ = ["DispatchError", "Dispatcher", "MemberStats"]

_MAX_ATTEMPTS = 3


class DispatchError(Exception):
    """The router answers the query itself with this error (`status`, `code`, `message`); already counted."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Dispatcher:
    """The transport of a query to an instance of its application: the connections to runtimes (one `Upstream`
    per endpoint, opened on first use), the frame, the deadline and the retries; which instance is the
    choice policy's (`InstanceChoice`, workers/router/choice.py).

    A connection failure or a draining answer leaves the endpoint out for `unavailable_s` and is retried on
    another instance (`_MAX_ATTEMPTS` in all) while the deadline allows. The runtime gets the remaining
    milliseconds; no answer by the deadline + `upstream_grace_s` is a drop (504 `deadline_exceeded`).

    Each frame names the application and the variant of its route. An instance that serves another model
    (a route the control plane is withdrawing) refuses with 409 `wrong_model` (a partition runtime that no
    longer holds the model: 404 `unknown_instance`), or, if it does not check,
    answers as another model: either way nothing is relayed, the instance is `stale` for that application
    until its table's version changes, and the query goes to another instance (not counted in
    `_MAX_ATTEMPTS`: each refusal leaves one instance fewer to draw); none left is 503 `no_route`."""

    def __init__(self, *, upstream_grace_s: float = 2.0, connect_timeout_s: float = 1.0, unavailable_s: float = 1.0) -> None:
        self.upstream_grace_s = upstream_grace_s
        self.connect_timeout_s = connect_timeout_s
        self.choice = InstanceChoice(unavailable_s=unavailable_s)
        self.upstreams: dict[str, Upstream] = {}

    @property
    def stale(self) -> dict[tuple[str, str], int]:
        """(application, instance) -> table version: the instances found serving another model."""
        return self.choice.stale

    def upstreams_prune(self, apps: dict[str, Application]) -> None:
        """Close the connections to endpoints that no table in `apps` routes to; forget the stale instances of
        tables replaced since."""
        self.choice.prune(apps)
        for endpoint in list(self.upstreams):
            if not any(r.endpoint == endpoint for app in apps.values() for r in app.routes.values()):
                self.upstreams.pop(endpoint).close()

    def close(self) -> None:
        for up in self.upstreams.values():
            up.close()
        self.upstreams.clear()

    async def _send(self, endpoint: str, frame: dict, body: bytes, deadline: float) -> tuple[dict, bytes]:
        """One attempt: the frame (its `deadline_ms` set to what is left) over the endpoint's connection,
        opened if need be; the runtime's (header, body). UpstreamError when the connection fails;
        asyncio.TimeoutError when no answer comes by the deadline + `upstream_grace_s`."""
        loop = asyncio.get_running_loop()
        upstream = self.upstreams.get(endpoint)
        if upstream is None:
            upstream = self.upstreams[endpoint] = Upstream(endpoint, loop)
        if upstream.transport is None:
            await upstream.connect(min(self.connect_timeout_s, deadline - time.monotonic() + self.upstream_grace_s))
        remaining = deadline - time.monotonic()
        frame["deadline_ms"] = remaining * 1000.0
        fut = upstream.request(frame, body)
        timer = loop.call_later(remaining + self.upstream_grace_s, _expire, fut)
        try:
            return await fut
        except asyncio.TimeoutError:
            upstream.forget(fut)
            raise
        finally:
            timer.cancel()

    async def dispatch(self, app: Application, stats: "ApplicationStats | MemberStats", body: bytes, content_type: str | None,
                       header_length: int | None, t0: float, budget_ms: float, *, variant: str | None = None,
                       on_instance: Callable[[str], None] | None = None,
                       choose: Callable[[frozenset[str] | set[str]], str] | None = None) -> tuple[int, dict, bytes, str]:
        """Send the query (received at `t0`, `time.monotonic`, with `budget_ms` to its deadline) to an instance
        (of `variant` only, when named: the protocol's model version, or an ensemble's member); (status, the
        runtime's answer header, its body, the variant that answered), its outcome counted in `stats`
        (`MemberStats` for an ensemble's member: its instance's counters only). `on_instance(instance)` is
        called as each attempt is sent. `choose(excluded)` picks the instance instead of the table's weights
        (an ensemble member's, by Garrison's instance routing); it raises NoRouteAvailable when none is left.
        Raises `DispatchError` when the router answers itself (no route, deadline, upstream error)."""
        clock = time.monotonic  # not loop.time(): uvloop's clock ticks in milliseconds
        choice = self.choice
        application = app.name
        deadline = t0 + budget_ms / 1000.0
        frame = {"op": "infer", "id": 0, "deadline_ms": 0.0, "content_type": content_type, "header_length": header_length,
                 "instance": "", "routing_version": app.version, "application": application, "variant": ""}
        attempts = 0
        while True:
            attempts += 1
            now = clock()
            try:
                route = choice.choose(app, now, variant=variant, choose=choose)
            except NoRouteAvailable as exc:
                stats.no_route()
                raise DispatchError(503, "no_route", str(exc)) from None
            if deadline <= now:
                stats.dropped((now - t0) * 1000.0)
                raise DispatchError(504, "deadline_exceeded", f"the deadline ({budget_ms:g} ms) passed before an instance took the query")
            instance, endpoint = route.instance, route.endpoint
            assert endpoint is not None  # routes without one are excluded from the draw
            frame["instance"] = instance
            frame["variant"] = route.variant
            if on_instance is not None:
                on_instance(instance)
            try:
                reply, reply_body = await self._send(endpoint, frame, body, deadline)
            except asyncio.TimeoutError:
                stats.dropped((clock() - t0) * 1000.0, variant=route.variant, instance=instance)
                raise DispatchError(504, "deadline_exceeded", f"no answer from instance {instance} by the deadline") from None
            except UpstreamError as exc:
                choice.endpoint_unavailable(endpoint, clock())
                if attempts < _MAX_ATTEMPTS:
                    continue
                stats.failed((clock() - t0) * 1000.0, variant=route.variant, instance=instance)
                raise DispatchError(502, "upstream_error", str(exc)) from None
            status = reply.get("status", 500)
            if status == 503 and reply.get("code") == "draining":
                choice.endpoint_unavailable(endpoint, clock())
                if attempts < _MAX_ATTEMPTS:
                    continue
                stats.no_route()
                raise DispatchError(503, "no_route", f"{application}: the instances tried are draining")
            if ((status == 409 and reply.get("code") == WRONG_MODEL) or (status == 404 and reply.get("code") == UNKNOWN_INSTANCE)
                    or not _serves(reply, application, route.variant)):
                # A stale route: never relay another model's answer (nor a partition's "no such model", a route
                # to a model its partition no longer holds); leave the instance out until a new table.
                choice.instance_stale(app, instance)
                attempts -= 1
                continue
            break
        end = clock()
        latency_ms = (end - t0) * 1000.0
        variant = reply.get("variant") or route.variant
        simulated = bool(reply.get("simulated"))
        if status == 200:
            stats.served(latency_ms, end > deadline, variant=variant, instance=instance, simulated=simulated,
                         queue_us=reply.get("queue_us") or 0.0, compute_us=reply.get("compute_us") or 0.0)
        elif status == 504:
            stats.dropped(latency_ms, variant=variant, instance=instance, simulated=simulated)
        else:
            stats.failed(latency_ms, variant=variant, instance=instance, simulated=simulated)
        return status, reply, reply_body, variant


class MemberStats:
    """An ensemble member's dispatch counts only at its instance (the protocol's per-model statistics and
    Triton's counters); the query itself is counted once, by the ensemble (workers/router/ensembles.py)."""

    def __init__(self, stats: ApplicationStats) -> None:
        self.stats = stats

    def served(self, latency_ms: float, late: bool, *, variant: str = "", instance: str = "", simulated: bool = False,
               queue_us: float = 0.0, compute_us: float = 0.0) -> None:
        self.stats.member_outcome(True, latency_ms, variant=variant, instance=instance, simulated=simulated, queue_us=queue_us, compute_us=compute_us)

    def dropped(self, latency_ms: float, *, variant: str = "", instance: str = "", simulated: bool = False) -> None:
        self.stats.member_outcome(False, latency_ms, variant=variant, instance=instance, simulated=simulated)

    def failed(self, latency_ms: float = 0.0, *, variant: str = "", instance: str = "", simulated: bool = False) -> None:
        self.stats.member_outcome(False, latency_ms, variant=variant, instance=instance, simulated=simulated)

    def no_route(self) -> None:
        pass


def _serves(reply: dict, application: str, variant: str) -> bool:
    """Whether the runtime's reply says it serves `application` and `variant` (a route without a variant name
    checks the application only; a reply that does not say is taken at its word)."""
    answered = reply.get("application")
    if answered is not None and answered != application:
        return False
    return not variant or reply.get("variant") in (None, variant)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())
