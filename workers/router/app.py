"""The router: an ASGI app (served by uvicorn with httptools and uvloop) that sends each inference request
to one runtime instance of its application, drawn by the active routing table's weights, over a persistent
frame connection per runtime (docs/dataplane.md).

    router = Router(fetch_tables, report, refresh_s=1.0, report_s=1.0)
    router_serve(router, "0.0.0.0", 8000)                  # blocking, uvicorn
    handle = router_start_in_thread(router)                 # tests: handle.url, handle.stop()
    python -m workers.router --tables tables.json --listen 127.0.0.1:8000 [--ready-file PATH]

`fetch_tables()` returns the active routing tables exactly as `GET /api/v1/routing-tables/?active=true`
lists them (`ControlPlaneClient.routing_tables`); `report(dict)` receives the router report every
`report_s` (`ControlPlaneClient.router_report`). Both are blocking callables, run in a worker thread, so
the router depends on no client. A fetch that raises keeps the LAST GOOD tables (one warning per outage,
`tessera_router_control_plane_up` 0); a table that does not parse keeps that application's previous one.
Each application's table is replaced in one assignment: a query sees one version, whole.

HTTP:

- `POST /v1/infer/{application}`: the KServe v2 body (JSON, or the binary extension with
  `Inference-Header-Content-Length`) is forwarded unchanged with its content type and header length; the
  runtime's answer is relayed with `X-Tessera-Variant` (and `Inference-Header-Content-Length` for binary
  outputs). The deadline is now + the table's `slo_ms`, or now + `X-Tessera-Deadline-Ms` when that is
  sooner; the runtime gets the remaining milliseconds. The instance is `WeightedRouter.choose_excluding`
  over the routes that are not `ready` (or have no endpoint), that refused a connection lately, or that
  answered `draining` lately; a connection failure or a draining answer is retried on another instance
  while the deadline allows. Errors (`{"error": {"status", "code", "message"}}`): 404
  `unknown_application`, 503 `no_route`, 504 `deadline_exceeded` (the runtime's drop rule, a deadline
  already past, or no answer by the deadline + `upstream_grace_s`), 400 `malformed` (bad headers here,
  or the runtime's decoding), 502 `upstream_error`.
- `GET /metrics`: Prometheus text (the router's own registry: `tessera_router_*`, the routing-table
  versions, and Triton's request counters per instance).
- `GET /healthz`: `{"status": "ok", "applications": n, "control_plane_up": bool}`.
- `GET /v1/routing-tables`: the tables held now, as fetched, with their versions.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from engine.dataplane.routing import NoRouteAvailable, RoutingTable, WeightedRouter
from workers.metrics import PROMETHEUS_CONTENT_TYPE, RouterStats, utc_now_iso
from workers.wire import FrameParser, error_body, frame_pack

__all__ = ["Router", "RouterHandle", "UpstreamError", "main", "router_serve", "router_start_in_thread", "tables_file_reader"]

log = logging.getLogger("tessera.router")

_JSON = b"application/json"
_MAX_ATTEMPTS = 3


class UpstreamError(ConnectionError):
    """The runtime's connection failed (refused, or lost with the query in flight)."""


# --------------------------------------------------------------------------- runtime connections


def _endpoint_parse(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint must be tcp://HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


class _Upstream(asyncio.Protocol):
    """One persistent frame connection to a runtime; any number of requests in flight, matched by id."""

    def __init__(self, endpoint: str, loop: asyncio.AbstractEventLoop) -> None:
        self.endpoint = endpoint
        self.host, self.port = _endpoint_parse(endpoint)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.parser = FrameParser()
        self.next_id = 0
        self._out: list[bytes] = []
        self._connecting: asyncio.Future | None = None

    # connection

    @property
    def connected(self) -> bool:
        return self.transport is not None

    async def connect(self, timeout_s: float) -> None:
        if self.transport is not None:
            return
        if self._connecting is None:
            self._connecting = self.loop.create_task(self._connect())
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, even if nobody waits
        try:
            await asyncio.wait_for(asyncio.shield(self._connecting), timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {self.endpoint}: {exc or type(exc).__name__}") from None

    async def _connect(self) -> None:
        try:
            await self.loop.create_connection(lambda: self, self.host, self.port)
        finally:
            self._connecting = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.parser = FrameParser()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._out = []
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(UpstreamError(f"connection to {self.endpoint} lost" + (f": {exc}" if exc else "")))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # frames

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.parser.feed(data)
        except ValueError as exc:
            log.warning("bad frame from %s: %s; closing the connection", self.endpoint, exc)
            self.transport.close()  # type: ignore[union-attr]
            return
        pending = self.pending
        for header, body in frames:
            fut = pending.pop(header.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result((header, body))

    def request(self, header: dict, body: bytes) -> asyncio.Future:
        """Send a frame; the future resolves with the (header, body) answer. Connect first."""
        if self.transport is None:
            raise UpstreamError(f"connection to {self.endpoint} lost")
        self.next_id += 1
        rid = self.next_id
        header["id"] = rid
        fut = self.loop.create_future()
        self.pending[rid] = fut
        # Frames of the requests that arrive in the same loop iteration go out in one write (one syscall).
        out = self._out
        out.append(frame_pack(header, body))
        if len(out) == 1:
            self.loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def forget(self, fut: asyncio.Future) -> None:
        for rid, f in list(self.pending.items()):
            if f is fut:
                del self.pending[rid]
                break


# --------------------------------------------------------------------------- tables


@dataclass
class _Route:
    instance: str
    variant: str
    endpoint: str | None
    state: str
    weight: float


@dataclass
class _Application:
    name: str
    version: int
    slo_ms: float
    drop_rule: str
    table: dict
    routes: dict[str, _Route]
    picker: WeightedRouter | None
    excluded: frozenset[str]


def _application_build(table: dict) -> _Application:
    """A routing table as the API lists it -> the router's view (raises ValueError when it does not parse)."""
    if not isinstance(table, dict):
        raise ValueError(f"a routing table must be an object, got {type(table).__name__}")
    name = table.get("application")
    version = table.get("version")
    slo = table.get("slo_ms")
    if not isinstance(name, str) or not name:
        raise ValueError(f"routing table without an application: {table!r:.200}")
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not slo > 0:
        raise ValueError(f"{name}: slo_ms must be a number > 0, got {slo!r}")
    routes: dict[str, _Route] = {}
    entries = []
    for i, r in enumerate(table.get("routes") or []):
        if not isinstance(r, dict) or not isinstance(r.get("instance"), str):
            raise ValueError(f"{name}: routes[{i}] must be an object with an instance")
        weight = r.get("weight", 0.0)
        route = _Route(r["instance"], str(r.get("variant") or ""), r.get("endpoint") or None, str(r.get("state") or "ready"), weight)
        if route.endpoint is not None:
            _endpoint_parse(route.endpoint)
        routes[route.instance] = route
        entries.append((route.instance, weight))
    rt = RoutingTable(name, version, tuple(entries))  # validates the version and the weights
    picker = WeightedRouter(rt) if any(w > 0 for _, w in rt.entries) else None
    excluded = frozenset(r.instance for r in routes.values() if r.state != "ready" or r.endpoint is None)
    return _Application(name, rt.version, float(slo), str(table.get("drop_rule") or "deadline"), table, routes, picker, excluded)


def tables_file_reader(path: str | Path) -> Callable[[], list[dict]]:
    """A `fetch_tables` that reads the tables from a JSON file (a list, or {"results": [...]}) on every
    refresh: a router without a control plane (benches, demos)."""
    path = Path(path)

    def fetch() -> list[dict]:
        data = json.loads(path.read_text())
        return data["results"] if isinstance(data, dict) else data

    return fetch


# --------------------------------------------------------------------------- the ASGI app


class Router:
    """See the module docstring. An ASGI 3 application (`await router(scope, receive, send)`)."""

    def __init__(
        self,
        fetch_tables: Callable[[], list[dict]],
        report: Callable[[dict], None] | None = None,
        refresh_s: float = 1.0,
        report_s: float = 1.0,
        *,
        name: str | None = None,
        upstream_grace_s: float = 2.0,
        connect_timeout_s: float = 1.0,
        unavailable_s: float = 1.0,
    ) -> None:
        self.fetch_tables = fetch_tables
        self.report = report
        self.refresh_s = refresh_s
        self.report_s = report_s
        self.name = name or socket.gethostname()
        self.upstream_grace_s = upstream_grace_s
        self.connect_timeout_s = connect_timeout_s
        self.unavailable_s = unavailable_s
        self.stats = RouterStats(self.name)
        self._apps: dict[str, _Application] = {}
        self._upstreams: dict[str, _Upstream] = {}
        self._unavailable: dict[str, float] = {}  # endpoint -> until (time.monotonic): refused, lost or draining
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cp_down_logged = False
        self._report_down_logged = False
        self.refreshed_at: str | None = None
        self.refreshes = 0

    # ------------------------------------------------------------------ tables

    @property
    def control_plane_up(self) -> bool:
        return self.stats.control_plane_up

    def tables_apply(self, tables: Sequence[dict]) -> None:
        """Replace the held tables with `tables` (what fetch_tables returned). An application whose table
        does not parse keeps its previous table; one no longer listed is dropped."""
        held = self._apps
        new: dict[str, _Application] = {}
        for table in tables:
            try:
                app = _application_build(table)
            except (ValueError, TypeError) as exc:
                name = table.get("application") if isinstance(table, dict) else None
                log.warning("ignoring a routing table that does not parse (%s); keeping the previous one", exc)
                if isinstance(name, str) and name in held:
                    new[name] = held[name]
                continue
            previous = new.get(app.name)
            if previous is None or app.version >= previous.version:
                new[app.name] = app
        self._apps = new  # one assignment: requests see the old dict or the new one
        self.stats.versions_set({name: app.version for name, app in new.items()})
        for endpoint in list(self._upstreams):
            if not any(r.endpoint == endpoint for app in new.values() for r in app.routes.values()):
                self._upstreams.pop(endpoint).close()

    async def refresh(self) -> bool:
        """Fetch the tables once (in a thread) and apply them; False (tables kept) when the fetch failed."""
        loop = asyncio.get_running_loop()
        try:
            tables = await loop.run_in_executor(None, self.fetch_tables)
            if not isinstance(tables, (list, tuple)):
                raise TypeError(f"fetch_tables returned {type(tables).__name__}, not a list")
        except Exception as exc:  # the control plane is away: serve on what we have
            self.stats.control_plane_up = False
            if not self._cp_down_logged:
                self._cp_down_logged = True
                log.warning("routing tables unavailable (%s: %s); keeping the last good tables (%s)", type(exc).__name__, exc,
                            ", ".join(f"{a.name} v{a.version}" for a in self._apps.values()) or "none")
            return False
        if self._cp_down_logged:
            log.info("routing tables available again")
        self._cp_down_logged = False
        self.tables_apply(tables)
        self.stats.control_plane_up = True
        self.refreshed_at = utc_now_iso()
        self.refreshes += 1
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def _report_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.report_s)
            snapshot = self.stats.snapshot_and_reset()
            if self.report is None:
                continue
            try:
                await loop.run_in_executor(None, self.report, snapshot)
            except Exception as exc:
                if not self._report_down_logged:
                    self._report_down_logged = True
                    log.warning("router report failed (%s: %s); will keep trying", type(exc).__name__, exc)
            else:
                self._report_down_logged = False

    async def startup(self) -> None:
        """First fetch (bounded by `connect_timeout_s` x 5), then the refresh and report loops."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self.refresh(), timeout=max(5.0, 5 * self.connect_timeout_s))
        except asyncio.TimeoutError:
            log.warning("first routing-table fetch timed out; starting without tables")
        self._tasks = [self._loop.create_task(self._refresh_loop()), self._loop.create_task(self._report_loop())]

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        for up in self._upstreams.values():
            up.close()
        self._upstreams.clear()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v1/infer/"):
                if scope["method"] != "POST":
                    await _send_error(send, 405, "method_not_allowed", "POST an inference request")
                    return
                if self._loop is None:
                    await self.startup()
                await self._infer(scope, receive, send, path[10:])
            elif scope["method"] != "GET":
                await _send_error(send, 405 if path in ("/metrics", "/healthz", "/v1/routing-tables") else 404, "not_found", f"{scope['method']} {path}")
            elif path == "/metrics":
                await _send(send, 200, self.stats.exposition(), PROMETHEUS_CONTENT_TYPE.encode())
            elif path == "/healthz":
                await _send(send, 200, json.dumps({"status": "ok", "router": self.name, "applications": len(self._apps),
                                                   "control_plane_up": self.control_plane_up}).encode(), _JSON)
            elif path in ("/v1/routing-tables", "/v1/routing-tables/"):
                doc = {"router": self.name, "control_plane_up": self.control_plane_up, "refreshed_at": self.refreshed_at,
                       "tables": [app.table for app in sorted(self._apps.values(), key=lambda a: a.name)]}
                await _send(send, 200, json.dumps(doc).encode(), _JSON)
            else:
                await _send_error(send, 404, "not_found", f"no such path {path}")
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        await self.startup()
                    except Exception as exc:  # pragma: no cover
                        await send({"type": "lifespan.startup.failed", "message": str(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    def _excluded(self, app: _Application, now: float) -> frozenset[str] | set[str]:
        unavailable = self._unavailable
        if not unavailable:
            return app.excluded
        bad = set(app.excluded)
        for endpoint, until in list(unavailable.items()):
            if until <= now:
                del unavailable[endpoint]
                continue
            for r in app.routes.values():
                if r.endpoint == endpoint:
                    bad.add(r.instance)
        return bad

    async def _infer(self, scope: dict, receive: Callable, send: Callable, application: str) -> None:
        loop = self._loop
        assert loop is not None
        clock = time.monotonic  # not loop.time(): uvloop's clock ticks in milliseconds
        t0 = clock()
        app = self._apps.get(application)
        if app is None:
            await _send_error(send, 404, "unknown_application", f"no routing table for application {application!r}")
            return
        stats = self.stats.application(application)
        stats.arrival()
        content_type = None
        header_length = None
        budget_ms = app.slo_ms
        try:
            for name, value in scope["headers"]:
                if name == b"content-type":
                    content_type = value.decode("latin-1")
                elif name == b"inference-header-content-length":
                    header_length = int(value)
                    if header_length < 0:
                        raise ValueError
                elif name == b"x-tessera-deadline-ms":
                    client = float(value)
                    if not client >= 0 or client == float("inf"):
                        raise ValueError
                    if client < budget_ms:
                        budget_ms = client
        except ValueError:
            stats.failed()
            await _send_error(send, 400, "malformed", "Inference-Header-Content-Length must be an integer >= 0 and X-Tessera-Deadline-Ms a number >= 0")
            return
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body"):
            chunks = [body]
            while message.get("more_body"):
                message = await receive()
                chunks.append(message.get("body", b""))
            body = b"".join(chunks)
        deadline = t0 + budget_ms / 1000.0
        frame = {"op": "infer", "id": 0, "deadline_ms": 0.0, "content_type": content_type, "header_length": header_length,
                 "instance": "", "routing_version": app.version}
        attempts = 0
        route: _Route | None = None
        while True:
            attempts += 1
            now = clock()
            try:
                if app.picker is None:
                    raise NoRouteAvailable(f"{application}: the routing table is empty")
                excluded = self._excluded(app, now)
                instance = app.picker.choose_excluding(excluded) if excluded else app.picker.choose()
            except NoRouteAvailable as exc:
                stats.no_route()
                await _send_error(send, 503, "no_route", str(exc))
                return
            route = app.routes[instance]
            remaining = deadline - now
            if remaining <= 0:
                stats.dropped((now - t0) * 1000.0)
                await _send_error(send, 504, "deadline_exceeded", f"the deadline ({budget_ms:g} ms) passed before an instance took the query")
                return
            endpoint = route.endpoint
            upstream = self._upstreams.get(endpoint)  # type: ignore[arg-type]
            if upstream is None:
                upstream = self._upstreams[endpoint] = _Upstream(endpoint, loop)  # type: ignore[index]
            try:
                if upstream.transport is None:
                    await upstream.connect(min(self.connect_timeout_s, remaining + self.upstream_grace_s))
                remaining = deadline - clock()
                frame["deadline_ms"] = remaining * 1000.0
                frame["instance"] = instance
                fut = upstream.request(frame, body)
                timer = loop.call_later(remaining + self.upstream_grace_s, _expire, fut)
                try:
                    reply, reply_body = await fut
                finally:
                    timer.cancel()
            except asyncio.TimeoutError:
                upstream.forget(fut)
                stats.dropped((clock() - t0) * 1000.0, variant=route.variant, instance=instance)
                await _send_error(send, 504, "deadline_exceeded", f"no answer from instance {instance} by the deadline")
                return
            except UpstreamError as exc:
                self._unavailable[endpoint] = clock() + self.unavailable_s  # type: ignore[index]
                if attempts < _MAX_ATTEMPTS:
                    continue
                stats.failed((clock() - t0) * 1000.0, variant=route.variant, instance=instance)
                await _send_error(send, 502, "upstream_error", str(exc))
                return
            status = reply.get("status", 500)
            if status == 503 and reply.get("code") == "draining":
                self._unavailable[endpoint] = clock() + self.unavailable_s  # type: ignore[index]
                if attempts < _MAX_ATTEMPTS:
                    continue
                stats.no_route()
                await _send_error(send, 503, "no_route", f"{application}: the instances tried are draining")
                return
            break
        end = clock()
        latency_ms = (end - t0) * 1000.0
        variant = reply.get("variant") or route.variant
        simulated = bool(reply.get("simulated"))
        if status == 200:
            stats.served(latency_ms, end > deadline, variant=variant, instance=instance, simulated=simulated)
        elif status == 504:
            stats.dropped(latency_ms, variant=variant, instance=instance, simulated=simulated)
        else:
            stats.failed(latency_ms, variant=variant, instance=instance, simulated=simulated)
        headers = [(b"content-type", (reply.get("content_type") or "application/json").encode()),
                   (b"content-length", str(len(reply_body)).encode()), (b"x-tessera-variant", variant.encode())]
        hl = reply.get("header_length")
        if hl is not None:
            headers.append((b"inference-header-content-length", str(hl).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply_body})


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


async def _send(send: Callable, status: int, body: bytes, content_type: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Callable, status: int, code: str, message: str) -> None:
    await _send(send, status, error_body(status, code, message), _JSON)


# --------------------------------------------------------------------------- serving


class _CoalescingTransport:
    """Wraps uvicorn's transport so that a response's status line and headers go out in the same write as
    its body (uvicorn writes them separately: two syscalls, two TCP segments and often two wake-ups of the
    client per response). Everything else is passed through."""

    __slots__ = ("_transport", "_held")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:9] == b"HTTP/1.1 " and data[9:12] != b"100" and data.find(b"\r\n\r\n") == len(data) - 4:
            # A response head alone: wait for its body, the next write in the same loop iteration (the app
            # sends it right after); a response without a body write (HEAD) goes out on the next iteration.
            self._held = data
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _http_protocol():
    """uvicorn's httptools protocol with the coalescing transport ("httptools" if uvicorn moved it)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - another uvicorn layout: plain httptools
        return "httptools"

    class _Protocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(_CoalescingTransport(transport))  # type: ignore[arg-type]

    return _Protocol


def _uvicorn_config(router: Router, host: str, port: int, log_level: str, **kwargs: Any):
    import uvicorn

    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover
        loop = "asyncio"
    return uvicorn.Config(
        router, host=host, port=port, http=_http_protocol(), loop=kwargs.pop("loop", loop), lifespan="on", access_log=False,
        server_header=False, date_header=False, proxy_headers=False, log_level=log_level, **kwargs,
    )


def router_serve(router: Router, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning") -> None:
    """Serve the router with uvicorn (httptools, uvloop) until SIGINT / SIGTERM."""
    import uvicorn

    gc.collect()
    gc.freeze()  # what is loaded now lives as long as the process: fewer, shorter full collections
    uvicorn.Server(_uvicorn_config(router, host, port, log_level)).run()


@dataclass
class RouterHandle:
    """A router serving in a background thread: `url` (http://127.0.0.1:PORT), `stop()`."""

    url: str
    router: Router
    server: Any
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def router_start_in_thread(router: Router, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                           startup_timeout_s: float = 30.0) -> RouterHandle:
    """Serve the router with uvicorn on its own event loop in a daemon thread (tests)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    bound = sock.getsockname()
    server = uvicorn.Server(_uvicorn_config(router, host, bound[1], log_level, loop="none"))
    failure: list[BaseException] = []

    def run() -> None:
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # pragma: no cover - surfaced by the start-up wait
            failure.append(exc)
        finally:
            loop.close()
            sock.close()

    thread = threading.Thread(target=run, name="tessera-router", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"the router did not start: {failure[0] if failure else 'thread exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the router did not start in time")
        time.sleep(0.01)
    host_part = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    return RouterHandle(url=f"http://{host_part}:{bound[1]}", router=router, server=server, thread=thread)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workers.router`: a router on a tables file (no control plane), for benches and demos."""
    import argparse

    from workers.runtime.server import ready_file_write

    parser = argparse.ArgumentParser(prog="python -m workers.router", description="A Tessera router on a routing-tables file.")
    parser.add_argument("--tables", required=True, help="JSON: the routing tables as GET /api/v1/routing-tables/?active=true lists them")
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (port 0: any free port)")
    parser.add_argument("--ready-file", default=None, help="where to write http://HOST:PORT once serving")
    parser.add_argument("--name", default=None)
    parser.add_argument("--refresh-s", type=float, default=1.0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    host, _, port = args.listen.rpartition(":")
    router = Router(tables_file_reader(args.tables), None, refresh_s=args.refresh_s, name=args.name)
    if args.ready_file is None:
        router_serve(router, host or "127.0.0.1", int(port), log_level=args.log_level)
        return 0
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or "127.0.0.1", int(port)))
    bound = sock.getsockname()
    server = uvicorn.Server(_uvicorn_config(router, bound[0], bound[1], args.log_level, loop="none"))

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            ready_file_write(args.ready_file, f"http://{bound[0]}:{bound[1]}")
        await task

    gc.collect()
    gc.freeze()
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()
    return 0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
