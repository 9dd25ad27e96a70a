"""The router's HTTP surface: `Router`, the ASGI app (request parsing, responses, /metrics, /healthz,
/v1/routing-tables) and its lifespan (the routing-table refresh and the per-second report loops)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Awaitable, Callable, Sequence

from workers.metrics import PROMETHEUS_CONTENT_TYPE, RouterStats
from workers.router.dispatch import Dispatcher, DispatchError
from workers.router.table import RoutingTables
from workers.wire import error_body

__all__ = ["Router"]

log = logging.getLogger("tessera.router")

_JSON = b"application/json"


class Router:
    """An ASGI 3 application (`await router(scope, receive, send)`) that sends each inference request to one
    runtime instance of its application, drawn by the active routing table's weights (docs/dataplane.md).

        router = Router(fetch_tables, report, refresh_s=1.0, report_s=1.0)
        router_serve(router, "0.0.0.0", 8000)                  # workers.router.server: blocking, uvicorn
        handle = router_start_in_thread(router)                 # tests: handle.url, handle.stop()

    `fetch_tables()` returns the active routing tables (see `RoutingTables`), refreshed every `refresh_s`;
    `report(dict)` receives the router report every `report_s` (`ControlPlaneClient.router_report`). Both
    are blocking callables, run in a worker thread, so the router depends on no client.

    HTTP:

    - `POST /v1/infer/{application}`: the KServe v2 body (JSON, or the binary extension with
      `Inference-Header-Content-Length`) is forwarded unchanged with its content type and header length; the
      runtime's answer is relayed with `X-Tessera-Variant` (and `Inference-Header-Content-Length` for binary
      outputs). The deadline is now + the table's `slo_ms`, or now + `X-Tessera-Deadline-Ms` when that is
      sooner; instance choice, retries and the deadline are the `Dispatcher`'s. Errors (`{"error": {"status",
      "code", "message"}}`): 404 `unknown_application`, 503 `no_route`, 504 `deadline_exceeded` (the
      runtime's drop rule, a deadline already past, or no answer by the deadline + `upstream_grace_s`), 400
      `malformed` (bad headers here, or the runtime's decoding), 502 `upstream_error`.
    - `GET /metrics`: Prometheus text (the router's own registry: `tessera_router_*`, the routing-table
      versions, and Triton's request counters per instance).
    - `GET /healthz`: `{"status": "ok", "applications": n, "control_plane_up": bool}`.
    - `GET /v1/routing-tables`: the tables held now, as fetched, with their versions.
    """

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
        self.report = report
        self.refresh_s = refresh_s
        self.report_s = report_s
        self.name = name or socket.gethostname()
        self.stats = RouterStats(self.name)
        self.dispatcher = Dispatcher(upstream_grace_s=upstream_grace_s, connect_timeout_s=connect_timeout_s, unavailable_s=unavailable_s)
        self.tables = RoutingTables(fetch_tables, self.stats, on_apply=self.dispatcher.upstreams_prune)
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._report_down_logged = False

    # ------------------------------------------------------------------ tables

    @property
    def control_plane_up(self) -> bool:
        return self.stats.control_plane_up

    @property
    def refreshed_at(self) -> str | None:
        return self.tables.refreshed_at

    @property
    def refreshes(self) -> int:
        return self.tables.refreshes

    def tables_apply(self, tables: Sequence[dict]) -> None:
        """Replace the held tables with `tables` (`RoutingTables.apply`)."""
        self.tables.apply(tables)

    async def refresh(self) -> bool:
        """Fetch the tables once and apply them; False (tables kept) when the fetch failed."""
        return await self.tables.refresh()

    # ------------------------------------------------------------------ lifespan

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.tables.refresh()

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
            await asyncio.wait_for(self.tables.refresh(), timeout=max(5.0, 5 * self.dispatcher.connect_timeout_s))
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
        self.dispatcher.close()

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
                await _send(send, 200, json.dumps({"status": "ok", "router": self.name, "applications": len(self.tables.apps),
                                                   "control_plane_up": self.control_plane_up}).encode(), _JSON)
            elif path in ("/v1/routing-tables", "/v1/routing-tables/"):
                doc = {"router": self.name, "control_plane_up": self.control_plane_up, "refreshed_at": self.tables.refreshed_at,
                       "tables": [app.table for app in sorted(self.tables.apps.values(), key=lambda a: a.name)]}
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

    async def _infer(self, scope: dict, receive: Callable, send: Callable, application: str) -> None:
        t0 = time.monotonic()  # not loop.time(): uvloop's clock ticks in milliseconds
        app = self.tables.apps.get(application)
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
        try:
            status, reply, reply_body, variant = await self.dispatcher.dispatch(app, stats, body, content_type, header_length, t0, budget_ms)
        except DispatchError as exc:
            await _send_error(send, exc.status, exc.code, exc.message)
            return
        headers = [(b"content-type", (reply.get("content_type") or "application/json").encode()),
                   (b"content-length", str(len(reply_body)).encode()), (b"x-tessera-variant", variant.encode())]
        hl = reply.get("header_length")
        if hl is not None:
            headers.append((b"inference-header-content-length", str(hl).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply_body})


async def _send(send: Callable, status: int, body: bytes, content_type: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Callable, status: int, code: str, message: str) -> None:
    await _send(send, status, error_body(status, code, message), _JSON)
