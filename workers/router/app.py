"""The router's HTTP surface: `Router`, the ASGI app (request parsing, responses, /metrics, /healthz,
/v1/routing-tables) and its lifespan (the routing-table refresh and the per-second report loops)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any, Awaitable, Callable, Sequence

from workers.metrics import PROMETHEUS_CONTENT_TYPE, RouterStats
from workers.router.asgi import InferHeaders, deadline_parse, reply_relay, request_headers_parse
from workers.router.asgi import body_read as _body_read
from workers.router.asgi import response_send as _send
from workers.router.dispatch import Dispatcher, DispatchError
from workers.router.ensembles import ensemble_infer
from workers.router.oip import oip_handle
from workers.router.pipelines import PipelineError, RouterPipeline, output_asks_split, stage_request_build
from workers.router.table import Application, RoutingTables
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

    `grpc_listen` (HOST:PORT): the same protocol over gRPC as well (`inference.GRPCInferenceService` and
    `grpc.health.v1`; workers/router/oip_grpc.py), through the same dispatch.

    HTTP:

    - `/v2/...`: the Open Inference Protocol (KServe v2, Triton's HTTP API) with the binary tensor data,
      parameters, model configuration, model repository and statistics extensions (workers/router/oip.py):
      what `tritonclient`, `perf_analyzer` and KServe clients speak. A model is an application (or a
      pipeline); a version is a variant (a pipeline's: a path). `repository(action, name)` is how its
      `load`/`unload` reach the control plane.
    - `POST /v1/infer/{application}`: Tessera's own path, kept because its errors carry machine-readable
      codes in the body (the protocol's error object is a bare message; /v2 puts the code in a header) and
      `tessera load`, the benches and existing clients use it. Otherwise the same as /v2's infer: the KServe v2 body (JSON, or the binary extension with
      `Inference-Header-Content-Length`) is forwarded unchanged with its content type and header length; the
      runtime's answer is relayed with `X-Tessera-Variant` (and `Inference-Header-Content-Length` for binary
      outputs). The deadline is now + the table's `slo_ms`, or now + `X-Tessera-Deadline-Ms` when that is
      sooner; instance choice, retries and the deadline are the `Dispatcher`'s. Errors (`{"error": {"status",
      "code", "message"}}`): 404 `unknown_application`, 503 `no_route`, 504 `deadline_exceeded` (the
      runtime's drop rule, a deadline already past, or no answer by the deadline + `upstream_grace_s`), 400
      `malformed` (bad headers here, or the runtime's decoding), 502 `upstream_error`.
    - `POST /v1/pipelines/{pipeline}/infer`: a KServe v2 JSON request to the pipeline's entry stage, sent
      stage to stage along the path `X-Tessera-Path` names (default: the first), each stage with what is left
      of the path's SLO, dropped at a stage once past it (workers/router/pipelines.py). The answer is the last
      stage's, with `X-Tessera-Variant` listing each stage's variant and `X-Tessera-Path` the path taken;
      errors name the stage. 404 `unknown_pipeline` / `unknown_path`, 400 `malformed` for binary requests.
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
        repository: Callable[..., None] | None = None,
        grpc_listen: str | None = None,
    ) -> None:
        self.report = report
        # ("load" | "unload", model name, config=a load's configuration or None) -> None, or RepositoryActionError:
        # the control plane's pinning and releasing, for the protocol's model repository extension
        # (workers/router/oip.py); blocking.
        self.repository = repository
        # HOST:PORT of the Open Inference Protocol over gRPC (workers/router/oip_grpc.py), served on this
        # router's event loop from start-up; None: HTTP only. `grpc_port` is the port bound.
        self.grpc_listen = grpc_listen
        self.grpc_port: int | None = None
        self._grpc: Any = None
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
        if self.grpc_listen is not None:
            from workers.router.oip_grpc import oip_grpc_start  # grpcio is loaded only by routers that serve it

            self._grpc = await oip_grpc_start(self, self.grpc_listen)
            self.grpc_port = self._grpc.port
        try:
            await asyncio.wait_for(self.tables.refresh(), timeout=max(5.0, 5 * self.dispatcher.connect_timeout_s))
        except asyncio.TimeoutError:
            log.warning("first routing-table fetch timed out; starting without tables")
        self._tasks = [self._loop.create_task(self._refresh_loop()), self._loop.create_task(self._report_loop())]

    async def shutdown(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop()
            self._grpc = None
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
            elif path.startswith("/v1/pipelines/") and path.endswith("/infer"):
                if scope["method"] != "POST":
                    await _send_error(send, 405, "method_not_allowed", "POST an inference request")
                    return
                if self._loop is None:
                    await self.startup()
                await self._pipeline_infer(scope, receive, send, path[len("/v1/pipelines/"):-len("/infer")])
            elif path == "/v2" or path.startswith("/v2/"):
                if self._loop is None:
                    await self.startup()
                await oip_handle(self, scope, receive, send)
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
        try:
            request = request_headers_parse(scope["headers"])
        except ValueError as exc:
            self.stats.application(application).arrival()
            self.stats.application(application).failed()
            await _send_error(send, 400, "malformed", str(exc))
            return
        body = await _body_read(receive)
        try:
            status, reply, reply_body, variant = await self.application_infer(app, request, body, t0)
        except DispatchError as exc:
            await _send_error(send, exc.status, exc.code, exc.message)
            return
        await reply_relay(send, status, reply, reply_body, [(b"x-tessera-variant", variant.encode())])

    async def application_infer(self, app: Application, request: InferHeaders, body: bytes, t0: float, *,
                                variant: str | None = None, budget_ms: float | None = None) -> tuple[int, dict, bytes, str]:
        """One query to `app` (received at `t0`): counted, dispatched within min(SLO, the client's deadline,
        `budget_ms`), to an instance of `variant` only when one is named; an ensemble application's query to
        the members its scheduler draws, their answers combined by weighted vote (workers/router/ensembles.py).
        The (status, answer header, body, variant: the members that voted joined by '+' for an ensemble);
        raises `DispatchError` when the router answers itself."""
        stats = self.stats.application(app.name)
        stats.arrival()
        budget = app.slo_ms
        for limit in (request.deadline_ms, budget_ms):
            if limit is not None and limit < budget:
                budget = limit
        if app.ensemble is not None and variant is None:  # a random ensemble per query, combined by weighted vote
            return await ensemble_infer(self.dispatcher, app, stats, request, body, t0, budget)
        return await self.dispatcher.dispatch(app, stats, body, request.content_type, request.header_length, t0, budget, variant=variant)

    async def _pipeline_infer(self, scope: dict, receive: Callable, send: Callable, name: str) -> None:
        t0 = time.monotonic()
        pipeline = self.tables.pipelines.get(name)
        if pipeline is None:
            await _send_error(send, 404, "unknown_pipeline", f"no pipeline {name!r} in the routing tables held")
            return
        chosen = client_ms = None
        try:
            for header, value in scope["headers"]:
                if header == b"x-tessera-path":
                    chosen = value.decode("latin-1")
                elif header == b"inference-header-content-length":
                    raise PipelineError(400, "malformed", "pipelines take KServe v2 JSON requests, not the binary tensor extension")
                elif header == b"x-tessera-deadline-ms":
                    client_ms = deadline_parse(value)
        except ValueError as exc:
            await _send_error(send, 400, "malformed", str(exc))
            return
        except PipelineError as exc:
            await _send_error(send, exc.status, exc.code, exc.message)
            return
        body = await _body_read(receive)
        try:
            status, body, content_type, headers = await self.pipeline_infer(pipeline, chosen, body, t0, client_ms)
        except PipelineError as exc:
            await _send_error(send, exc.status, exc.code, exc.message)
            return
        await _send(send, status, body, content_type, headers)

    async def pipeline_infer(self, pipeline: RouterPipeline, chosen: str | None, body: bytes, t0: float,
                             client_ms: float | None) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        """A KServe v2 JSON query sent stage to stage along the path `chosen` (None: the first) of `pipeline`,
        each stage with what is left of the path's SLO (or the client's deadline when sooner). (status, body,
        content type, headers): the last stage's answer, or a stage's refusal relayed with the stage named;
        raises `PipelineError` when the router answers itself."""
        name = pipeline.name
        path, stages, slo_ms = pipeline.path(chosen)
        budget_ms = min(slo_ms, client_ms) if client_ms is not None else slo_ms
        stats = self.stats.path(name, path)
        stats.arrival()
        variants: list[str] = []
        previous = None
        reply: dict = {}
        asks: dict = {}
        if len(stages) > 1:
            body, asks = output_asks_split(body)
        for stage in stages:
            now = time.monotonic()
            elapsed_ms = (now - t0) * 1000.0
            app = self.tables.apps.get(stage)
            if app is None:
                stats.outcome("no_route", elapsed_ms)
                raise PipelineError(503, "no_route", f"stage {stage} of {name}: no routing table for it")
            if elapsed_ms >= budget_ms:
                # The thesis's drop rule: a query already past its SLO is dropped at the stage it reached.
                stats.outcome("dropped", elapsed_ms, stage=stage)
                raise PipelineError(504, "deadline_exceeded", f"dropped before stage {stage} of {name}: {elapsed_ms:.1f} ms "
                                                              f"spent of the path's {budget_ms:g} ms")
            if previous is not None:
                try:
                    body = stage_request_build(body, pipeline.stages.get(stage, {}), stage=stage, previous=previous,
                                               asks=asks if stage == stages[-1] else None)
                except PipelineError:
                    stats.outcome("failed", elapsed_ms)
                    raise
            app_stats = self.stats.application(stage)
            app_stats.arrival()
            try:
                status, reply, body, variant = await self.dispatcher.dispatch(app, app_stats, body, "application/json", None, now,
                                                                              budget_ms - elapsed_ms)
            except DispatchError as exc:
                outcome = {"deadline_exceeded": "dropped", "no_route": "no_route"}.get(exc.code, "failed")
                stats.outcome(outcome, (time.monotonic() - t0) * 1000.0, stage=stage)
                raise PipelineError(exc.status, exc.code, f"stage {stage} of {name}: {exc.message}") from None
            if status != 200:  # the runtime refused the request (its decoding): relayed, with the stage named
                stats.outcome("failed", (time.monotonic() - t0) * 1000.0)
                return status, body, (reply.get("content_type") or "application/json").encode(), [(b"x-tessera-failed-stage", stage.encode())]
            variants.append(f"{stage}={variant}")
            previous = stage
        latency_ms = (time.monotonic() - t0) * 1000.0
        stats.outcome("late" if latency_ms > budget_ms else "served", latency_ms)
        headers = [(b"x-tessera-variant", ", ".join(variants).encode()), (b"x-tessera-path", path.encode())]
        if reply.get("header_length") is not None:  # the client asked the last stage for binary outputs
            headers.append((b"inference-header-content-length", str(reply["header_length"]).encode()))
        return 200, body, (reply.get("content_type") or "application/json").encode(), headers


async def _send_error(send: Callable, status: int, code: str, message: str) -> None:
    await _send(send, status, error_body(status, code, message), _JSON)
