"""The Open Inference Protocol (KServe v2, Triton's HTTP API) on the router: what lets `tritonclient`,
`perf_analyzer` and KServe's SDK talk to a Tessera fleet as to one inference server. The protocol's
operations (`server_metadata`, `model_metadata`, `model_config`, `model_infer`, ...) are written once here
and serve both transports: `oip_handle` over HTTP, workers/router/oip_grpc.py over gRPC.

Source: the protocol's REST specification (kserve/open-inference-protocol, specification/protocol/
inference_rest.md: health, server and model metadata, model ready, inference, the error object) and
Triton's extensions to it (triton-inference-server/server docs/protocol/: extension_binary_data.md,
extension_model_configuration.md, extension_model_repository.md, extension_statistics.md,
extension_parameters.md). Status codes follow Triton's mapping of its error kinds (src/http_server.cc,
`HttpCodeFromError`): not found 404, unavailable 503, unsupported 501, invalid argument 400.

How Tessera's objects map onto the protocol's:

- A model is an application: the router picks the variant by the active routing table's weights, so the
  plan decides. A model version is a variant, and its version is its number (the registry's id) wherever
  the protocol shows one: metadata, configuration, the repository index, statistics and infer answers'
  `model_version` (Triton's clients and perf_analyzer read versions as whole numbers). A request may name
  a version by its number or its variant's name; `parameters.variant` and `X-Tessera-Variant` give the name:
  `/v2/models/{app}/versions/{variant}/infer` sends the query to an instance of that variant only (for
  debugging; it still needs a route in the table). A pipeline is a
  model too (platform `tessera_pipeline`); its versions are its paths.
- Errors are the protocol's `{"error": "<message>"}`; Tessera's machine-readable code (`no_route`,
  `deadline_exceeded`, ...) rides in the `X-Tessera-Error-Code` header.
- The request parameter `timeout` (microseconds, Triton's) is a deadline like `X-Tessera-Deadline-Ms`: the
  query gets the smaller of it and the application's SLO.
- The model repository extension maps onto the control plane: `load` pins an application into planning and
  `unload` releases it (its routes are withdrawn at once and later plans give it no capacity), each through
  the control plane's API with the router's own credential, which an operator must have allowed to do so.
  `index` lists what the router's tables hold.

A model's configuration shows the plan: `max_batch_size` is the largest batch the routed instances run
and `dynamic_batching.preferred_batch_size` their batch sizes (0 and whole shapes where an input has no
variable batch axis, or the table gives no batch). Differences from Triton, on purpose: the runtimes batch
queries, so `max_batch_size` counts queries per batch, and a query may carry more rows than it (Triton
counts rows and refuses such a request);
`/v2/models/{m}/stats` counts what this router saw (answers and failures with their durations), and for
the answers the queue and compute times their runtimes measured (input and output handling are not
measured apart, so those fields stay 0). Not served: shared memory,
sequences, tracing, logging, classification.
"""
from __future__ import annotations

import asyncio
import functools
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import orjson

from engine.dataplane.tensors import OIP_TO_TRITON_DATATYPE
from workers.router.asgi import body_read as _body
from workers.router.asgi import InferHeaders, reply_relay, request_headers_parse
from workers.router.asgi import response_send as _send
from workers.router.dispatch import DispatchError
from workers.router.pipelines import PipelineError, RouterPipeline
from workers.router.table import Application

if TYPE_CHECKING:
    from workers.router.app import Router

__all__ = [
    "InferAnswer", "OIP_EXTENSIONS", "OipError", "RepositoryActionError", "model_config", "model_find", "model_infer", "model_metadata",
    "model_ready", "model_statistics", "oip_handle", "repository_action", "repository_index", "repository_parameters_check",
    "server_metadata", "server_ready",
]

OIP_EXTENSIONS = ("binary_tensor_data", "parameters", "model_configuration", "model_repository", "statistics")

_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?:/(?P<action>ready|config|stats|infer))?/?$")
_REPOSITORY_PATH = re.compile(r"^/v2/repository/models/(?P<name>[^/]+)/(?P<action>load|unload)/?$")
_JSON = b"application/json"
_PIPELINE_PLATFORM = "tessera_pipeline"


class OipError(Exception):
    """The router's own refusal of a protocol request: `status` (HTTP; the gRPC side maps it), the message,
    Tessera's machine-readable `code`, and headers to send with it (a refused query's variant)."""

    def __init__(self, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or []


class RepositoryActionError(Exception):
    """What the control plane answered to a load or unload (`status`: its HTTP status, 503 when it is away)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class InferAnswer:
    """A query's answer as a runtime (or the router, for an ensemble) gave it: the KServe v2 body, JSON or
    with binary outputs after a JSON header of `header_length` bytes, and the headers to send with it
    (`x-tessera-variant`, and a pipeline's `x-tessera-path`)."""

    body: bytes
    content_type: bytes
    header_length: int | None
    headers: list[tuple[bytes, bytes]]


async def oip_handle(router: "Router", scope: dict, receive: Callable, send: Callable) -> None:
    """Answer one `/v2...` request over HTTP (see the module docstring)."""
    path, method = scope["path"], scope["method"]
    try:
        if path in ("/v2", "/v2/"):
            _method(method, "GET")
            await _json(send, 200, server_metadata())
        elif path == "/v2/health/live":
            _method(method, "GET")
            await _json(send, 200, {"live": True})
        elif path == "/v2/health/ready":
            _method(method, "GET")
            ready = server_ready(router)
            await _json(send, 200 if ready else 400, {"ready": ready})
        elif path in ("/v2/repository/index", "/v2/repository/index/"):
            _method(method, "POST")
            body = await _body(receive)
            ready_only = _json_body(body, "the index request").get("ready", False) if body.strip() else False
            await _json(send, 200, repository_index(router, bool(ready_only)))
        elif (m := _REPOSITORY_PATH.match(path)) is not None:
            _method(method, "POST")
            body = await _body(receive)
            params = (_json_body(body, f"the {m['action']} request").get("parameters") or {}) if body.strip() else {}
            config = repository_parameters_check(params, m["action"], m["name"])
            await repository_action(router, m["action"], m["name"], config)
            await _send(send, 200, b"", _JSON)
        elif path in ("/v2/models/stats", "/v2/models/stats/"):
            _method(method, "GET")
            await _json(send, 200, {"model_stats": model_statistics(router, None, None)})
        elif (m := _MODEL_PATH.match(path)) is not None:
            await _model(router, scope, receive, send, m["name"], m["version"], m["action"])
        else:
            raise OipError(404, f"no such path {path}", "not_found")
    except OipError as exc:
        await _json(send, exc.status, {"error": exc.message}, [*exc.headers, (b"x-tessera-error-code", exc.code.encode())])


async def _model(router: "Router", scope: dict, receive: Callable, send: Callable, name: str, version: str | None,
                 action: str | None) -> None:
    if action == "infer":
        _method(scope["method"], "POST")
        t0 = time.monotonic()
        model_find(router, name)  # an unknown model is refused before its body is read
        try:
            request = request_headers_parse(scope["headers"])
        except ValueError as exc:
            raise OipError(400, str(exc), "malformed") from None
        body = await _body(receive)
        answer = await model_infer(router, name, version, request, body, t0)
        await reply_relay(send, 200, {"content_type": answer.content_type.decode(), "header_length": answer.header_length},
                          answer.body, answer.headers)
        return
    _method(scope["method"], "GET")
    if action is None:
        await _json(send, 200, model_metadata(router, name, version))
    elif action == "ready":
        await _send(send, 200 if model_ready(router, name, version) else 400, b"", _JSON)
    elif action == "config":
        await _json(send, 200, model_config(router, name, version))
    else:  # stats
        await _json(send, 200, {"model_stats": model_statistics(router, name, version)})


# --------------------------------------------------------------------------- the protocol's operations
# One implementation for both transports: HTTP above, gRPC in workers/router/oip_grpc.py. Each takes the
# model's name and version as the request gives them (None: none given) and raises OipError.


def server_metadata() -> dict:
    return {"name": "tessera-router", "version": _version(), "extensions": list(OIP_EXTENSIONS)}


def server_ready(router: "Router") -> bool:
    """Ready once the router holds routing tables (fetched at least once, or given)."""
    return router.tables.refreshes > 0 or bool(router.tables.apps)


def model_find(router: "Router", name: str) -> tuple[Application | None, RouterPipeline | None]:
    """The application or pipeline a model name means; 404 for neither."""
    app = router.tables.apps.get(name)
    pipeline = router.tables.pipelines.get(name) if app is None else None
    if app is None and pipeline is None:
        raise OipError(404, f"Request for unknown model: '{name}' is not found", "unknown_model")
    return app, pipeline


def _pipeline_version_known(pipeline: RouterPipeline, version: str | None) -> str | None:
    if version is not None and version not in pipeline.paths:
        raise OipError(404, f"Request for unknown model: '{pipeline.name}' version '{version}' is not found (its versions are its "
                            f"paths: {', '.join(pipeline.paths)})", "unknown_version")
    return version


def model_metadata(router: "Router", name: str, version: str | None) -> dict:
    app, pipeline = model_find(router, name)
    if app is not None:
        return _app_metadata(app, _version_known(app, version))
    return _pipeline_metadata(router, pipeline, _pipeline_version_known(pipeline, version))  # type: ignore[arg-type]


def model_ready(router: "Router", name: str, version: str | None) -> bool:
    app, pipeline = model_find(router, name)
    if app is not None:
        return _app_ready(app, _version_known(app, version))
    return _pipeline_ready(router, pipeline, _pipeline_version_known(pipeline, version))  # type: ignore[arg-type]


def model_config(router: "Router", name: str, version: str | None) -> dict:
    app, pipeline = model_find(router, name)
    if app is not None:
        return _config(app, _version_known(app, version))
    return _pipeline_config(router, pipeline, _pipeline_version_known(pipeline, version))  # type: ignore[arg-type]


def model_statistics(router: "Router", name: str | None, version: str | None) -> list[dict]:
    """Statistics of one application (every version, or one), or of every application (`name` None)."""
    if name is None:
        apps = router.tables.apps
        return [s for n in sorted(apps) for s in _stats(router, apps[n], None)]
    app, _pipeline = model_find(router, name)
    if app is None:
        raise OipError(400, f"statistics are kept per application: ask for the stages of pipeline '{name}'", "unsupported")
    return _stats(router, app, _version_known(app, version))


async def model_infer(router: "Router", name: str, version: str | None, request: InferHeaders, body: bytes, t0: float) -> InferAnswer:
    """One query to a model received at `t0` (the body as the HTTP protocol carries it: JSON, or the binary
    tensor data extension with `request.header_length`): an application's dispatched by its routing table
    (to `version`'s variant only when one is named), a pipeline's sent along the path `version` names.
    A runtime's refusal is raised as OipError with its status, message and code."""
    app, pipeline = model_find(router, name)
    if app is not None:
        return await _application_infer(router, app, _version_known(app, version), request, body, t0)
    return await _pipeline_infer(router, pipeline, _pipeline_version_known(pipeline, version), request, body, t0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- inference


async def _application_infer(router: "Router", app: Application, version: str | None, request: InferHeaders, body: bytes,
                             t0: float) -> InferAnswer:
    budget_ms = _timeout_ms(body, request.header_length)
    try:
        status, reply, reply_body, variant = await router.application_infer(app, request, body, t0, variant=version, budget_ms=budget_ms)
    except DispatchError as exc:
        raise OipError(exc.status, exc.message, exc.code) from None
    headers = [(b"x-tessera-variant", variant.encode())]
    if status != 200:
        raise _refusal(status, reply_body, headers)
    return InferAnswer(reply_body, (reply.get("content_type") or "application/json").encode(), reply.get("header_length"), headers)


async def _pipeline_infer(router: "Router", pipeline: RouterPipeline, version: str | None, request: InferHeaders, body: bytes,
                          t0: float) -> InferAnswer:
    if request.header_length is not None:
        raise OipError(400, "pipelines take JSON tensors, not the binary tensor data extension", "malformed")
    client_ms = request.deadline_ms
    timeout_ms = _timeout_ms(body, None)
    if timeout_ms is not None:
        client_ms = timeout_ms if client_ms is None else min(client_ms, timeout_ms)
    try:
        status, reply_body, content_type, headers = await router.pipeline_infer(pipeline, version, body, t0, client_ms)
    except PipelineError as exc:
        raise OipError(exc.status, exc.message, exc.code) from None
    if status != 200:
        raise _refusal(status, reply_body, headers)
    header_length = next((int(v) for k, v in headers if k == b"inference-header-content-length"), None)
    return InferAnswer(reply_body, content_type, header_length, [(k, v) for k, v in headers if k != b"inference-header-content-length"])


def _timeout_ms(body: bytes, header_length: int | None) -> float | None:
    """The request's `parameters.timeout` (Triton's, in microseconds) in milliseconds, or None. Only a JSON
    header that mentions it is parsed here; the runtime decodes the tensors."""
    head = body[:header_length] if header_length is not None else body
    if b'"timeout"' not in head:
        return None
    params = _json_body(head, "the inference request").get("parameters")
    timeout = params.get("timeout") if isinstance(params, dict) else None
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise OipError(400, f"parameters.timeout must be a whole number of microseconds >= 0, got {timeout!r}", "malformed")
    return timeout / 1000.0


def _refusal(status: int, body: bytes, headers: list) -> OipError:
    """A runtime's refusal (Tessera's error object) in the protocol's shape, its code kept."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        message, code = str(error.get("message", "")), str(error.get("code", "error"))
    else:
        message, code = (error if isinstance(error, str) else body.decode("utf-8", "replace")), "error"
    return OipError(status, message, code, list(headers))


# --------------------------------------------------------------------------- metadata, readiness, configuration


def _model_doc(app: Application) -> dict:
    model = app.table.get("model")
    return model if isinstance(model, dict) else {}


def _routed_variants(app: Application) -> list[str]:
    return sorted({r.variant for r in app.routes.values() if r.variant and r.weight > 0})


def _version_known(app: Application, version: str | None) -> str | None:
    """The variant a version names: its name, or its number (the registry's id: Triton's clients and
    perf_analyzer take versions as whole numbers); 404 for one the application does not have."""
    if version is None:
        return None
    versions = _model_doc(app).get("versions") or {}
    known = set(versions) | {r.variant for r in app.routes.values()}
    if version in known:
        return version
    for name, doc in versions.items():
        if isinstance(doc, dict) and str(doc.get("id")) == version:
            return name
    raise OipError(404, f"Request for unknown model: '{app.name}' version '{version}' is not found "
                         f"(its versions are its variants, by name or number: {', '.join(sorted(known)) or 'none'})", "unknown_version")


def _version_number(app: Application, variant: str) -> str:
    """A variant's number as a version, where the table gives one (else its name)."""
    doc = (_model_doc(app).get("versions") or {}).get(variant)
    return str(doc["id"]) if isinstance(doc, dict) and doc.get("id") is not None else variant


def _app_metadata(app: Application, version: str | None) -> dict:
    model = _model_doc(app)
    tensors = (model.get("versions") or {}).get(version, {}) if version is not None else model
    routed = [version] if version is not None else _routed_variants(app)
    return {"name": app.name, "versions": sorted((_version_number(app, v) for v in routed), key=_version_order),
            "platform": model.get("platform", "onnxruntime_onnx"),
            "inputs": list(tensors.get("inputs") or []), "outputs": list(tensors.get("outputs") or [])}


def _version_order(version: str) -> tuple:
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def _app_ready(app: Application, version: str | None) -> bool:
    return any(r.state == "ready" and r.endpoint is not None and r.weight > 0 and (version is None or r.variant == version)
               for r in app.routes.values())


def _config(app: Application, version: str | None) -> dict:
    """Triton's model configuration (extension_model_configuration.md) of what the plan runs: where every input
    has a variable batch axis and the routed instances say their planned batch, `max_batch_size` is the
    largest of those and `dynamic_batching` lists them as preferred sizes (the runtimes batch server-side, by
    the plan) with the application's own batching delay (0 where it has none: Tessera's runtimes choose
    their wait against each query's deadline), and the tensors' `dims` leave
    the batch axis out, as Triton's do. Otherwise `max_batch_size` is 0 and `dims` are whole shapes."""
    metadata = _app_metadata(app, version)
    batches = sorted({r.batch for r in app.routes.values() if r.batch and r.weight > 0 and (version is None or r.variant == version)})
    batched = bool(batches) and bool(metadata["inputs"]) and all(_batch_axis(t) for t in metadata["inputs"])
    config = {
        "name": app.name, "platform": metadata["platform"], "backend": "onnxruntime",
        "max_batch_size": batches[-1] if batched else 0,
        "input": [_config_tensor(t, batched) for t in metadata["inputs"]],
        "output": [_config_tensor(t, batched and _batch_axis(t)) for t in metadata["outputs"]],
        "parameters": {"tessera_slo_ms": {"string_value": f"{app.slo_ms:g}"},
                       "tessera_variants": {"string_value": ",".join([version] if version is not None else _routed_variants(app))}},
    }
    if batched:
        delay_ms = _model_doc(app).get("batching_delay_ms")
        config["dynamic_batching"] = {"preferred_batch_size": batches,
                                      "max_queue_delay_microseconds": int(round(delay_ms * 1000)) if isinstance(delay_ms, (int, float)) else 0}
    return config


def _batch_axis(tensor: dict) -> bool:
    shape = tensor.get("shape") or []
    return bool(shape) and shape[0] == -1


def _config_tensor(tensor: dict, batched: bool = False) -> dict:
    shape = list(tensor.get("shape") or [])
    return {"name": tensor["name"], "data_type": OIP_TO_TRITON_DATATYPE.get(tensor.get("datatype", ""), "TYPE_INVALID"),
            "dims": shape[1:] if batched else shape}


def _pipeline_stages(pipeline: RouterPipeline, version: str | None) -> tuple[str, ...]:
    return pipeline.paths[version or pipeline.first_path][0]


def _pipeline_metadata(router: "Router", pipeline: RouterPipeline, version: str | None) -> dict:
    stages = _pipeline_stages(pipeline, version)
    first, last = router.tables.apps.get(stages[0]), router.tables.apps.get(stages[-1])
    return {"name": pipeline.name, "versions": [version] if version is not None else list(pipeline.paths),
            "platform": _PIPELINE_PLATFORM,
            "inputs": list(_model_doc(first).get("inputs") or []) if first else [],
            "outputs": list(_model_doc(last).get("outputs") or []) if last else []}


def _pipeline_ready(router: "Router", pipeline: RouterPipeline, version: str | None) -> bool:
    return all(stage in router.tables.apps and _app_ready(router.tables.apps[stage], None)
               for stage in _pipeline_stages(pipeline, version))


def _pipeline_config(router: "Router", pipeline: RouterPipeline, version: str | None) -> dict:
    metadata = _pipeline_metadata(router, pipeline, version)
    stages = _pipeline_stages(pipeline, version)
    slo_ms = pipeline.paths[version or pipeline.first_path][1]
    return {"name": pipeline.name, "platform": _PIPELINE_PLATFORM, "max_batch_size": 0,
            "input": [_config_tensor(t) for t in metadata["inputs"]], "output": [_config_tensor(t) for t in metadata["outputs"]],
            "parameters": {"tessera_slo_ms": {"string_value": f"{slo_ms:g}"}, "tessera_stages": {"string_value": ",".join(stages)}}}


def _stats(router: "Router", app: Application, version: str | None) -> list[dict]:
    """Triton's model statistics (extension_statistics.md) from what this router counted, per variant, each
    under its number as the version (perf_analyzer reads versions as integers)."""
    name = app.name
    per_variant = router.stats.application(name).per_variant()
    rows = []
    zero = {"count": 0, "ns": 0}
    for variant, agg in sorted(per_variant.items()):
        if version is not None and variant != version:
            continue
        rows.append({
            "name": name, "version": _version_number(app, variant), "last_inference": int(agg["last_ms"]),
            "inference_count": int(agg["success"]), "execution_count": int(agg["success"]),
            "inference_stats": {"success": {"count": int(agg["success"]), "ns": int(agg["success_us"] * 1000)},
                                "fail": {"count": int(agg["failure"]), "ns": int(agg["failure_us"] * 1000)},
                                # As the runtimes measured each answered query: queued, then its batch's run.
                                "queue": {"count": int(agg["success"]), "ns": int(agg["queue_us"] * 1000)},
                                "compute_infer": {"count": int(agg["success"]), "ns": int(agg["compute_us"] * 1000)},
                                # Not measured apart (0 ns; counted as Triton counts them, once per execution):
                                # input and output handling fall in the router's overhead.
                                "compute_input": {"count": int(agg["success"]), "ns": 0},
                                "compute_output": {"count": int(agg["success"]), "ns": 0},
                                "cache_hit": dict(zero), "cache_miss": dict(zero)},
            "batch_stats": [],
        })
    return rows


# --------------------------------------------------------------------------- the model repository


def repository_index(router: "Router", ready_only: bool) -> list[dict]:
    """One entry per application and variant the tables route (a table with no routes: one entry, UNAVAILABLE),
    and one per pipeline path."""
    entries: list[dict] = []
    for name in sorted(router.tables.apps):
        app = router.tables.apps[name]
        variants = _routed_variants(app)
        if not variants:
            entries.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": "the active plan gives it no capacity"})
        for variant in variants:
            ready = _app_ready(app, variant)
            entries.append({"name": name, "version": _version_number(app, variant), "state": "READY" if ready else "UNAVAILABLE",
                            "reason": "" if ready else "no ready instance of this variant"})
    for name in sorted(router.tables.pipelines):
        pipeline = router.tables.pipelines[name]
        for path in pipeline.paths:
            ready = _pipeline_ready(router, pipeline, path)
            entries.append({"name": name, "version": path, "state": "READY" if ready else "UNAVAILABLE",
                            "reason": "" if ready else "a stage has no ready instance"})
    return [e for e in entries if e["state"] == "READY"] if ready_only else entries


def repository_parameters_check(params: Any, action: str, name: str) -> Any:
    """A load's or unload's `parameters` (extension_model_repository.md): a load's `config` (Triton's model
    configuration as JSON text) is relayed for the control plane to apply or refuse; `unload_dependents`
    changes nothing (an application has no dependents a router loads); model files (`file:...`) and anything
    else are refused, naming the parameter. Returns the config, or None."""
    if not isinstance(params, dict):
        raise OipError(400, f"failed to {action} '{name}': parameters must be an object", "malformed")
    for key in params:
        if key == "config" and action == "load":
            continue
        if key == "unload_dependents" and action == "unload":
            continue
        why = ("Tessera loads models from its registry: upload the ONNX file as an artifact and give the application a variant"
               if key.startswith("file:") else "not a parameter Tessera takes here")
        raise OipError(400, f"failed to {action} '{name}': parameters.{key}: {why}", "malformed")
    return params.get("config")


async def repository_action(router: "Router", action: str, name: str, config: Any = None) -> None:
    """A load or unload relayed to the control plane (`router.repository`), then the tables refreshed."""
    if router.repository is None:
        raise OipError(501, "this router has no control plane to load or unload models through", "unsupported")
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, functools.partial(router.repository, action, name, config=config))
    except RepositoryActionError as exc:
        raise OipError(exc.status, exc.message, "repository") from None
    await router.tables.refresh()  # the withdrawn or returned routes, now rather than at the next refresh


# --------------------------------------------------------------------------- plumbing


def _method(method: str, allowed: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise OipError(405, f"{method} is not allowed here; use {allowed}", "method_not_allowed")


def _json_body(body: bytes, what: str) -> dict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OipError(400, f"{what} is not valid JSON: {exc}", "malformed") from None
    if not isinstance(doc, dict):
        raise OipError(400, f"{what} must be a JSON object", "malformed")
    return doc


async def _json(send: Callable, status: int, doc: Any, extra: list | None = None) -> None:
    await _send(send, status, orjson.dumps(doc), _JSON, extra)


@functools.cache
def _version() -> str:
    """Tessera's version, read once per process (package metadata is files on disk)."""
    try:
        from importlib.metadata import version

        return version("tessera")
    except Exception:  # not installed as a distribution (a source checkout run in place)
        return "0"
