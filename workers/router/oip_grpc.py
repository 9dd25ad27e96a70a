"""The Open Inference Protocol over gRPC on the router: `inference.GRPCInferenceService` and the standard
`grpc.health.v1.Health`, what `tritonclient.grpc`, `perf_analyzer -i grpc` and KServe's `InferenceGRPCClient`
speak (their default transport).

Source: the protocol's gRPC specification (kserve/open-inference-protocol, specification/protocol/
inference_grpc.md) and Triton's gRPC service (triton-inference-server/common protobuf/grpc_service.proto:
the configuration, statistics and model repository methods, and `ModelStreamInfer`); the messages are in
workers/router/proto/oip.proto. Triton maps its error kinds onto gRPC's codes as `_GRPC_CODES` does.

One implementation, two transports: every method calls the protocol's operations in workers/router/oip.py,
which the HTTP surface calls too. A `ModelInfer` request is put into the HTTP form the runtimes take (the
binary tensor data extension: each input's raw bytes, as they came in `raw_input_contents`, after a JSON
header; typed `contents` are checked and laid out the same way) and sent through the same dispatch,
deadlines, ensembles and pipelines (a pipeline's stages take JSON, so its inputs are written as JSON
first); the answer's outputs come back as `raw_output_contents`. So a model, its versions, its errors and
its statistics are the same over both.

Where gRPC differs from HTTP:
- The deadline is the smallest of the application's SLO, the call's gRPC deadline, the request parameter
  `timeout` (microseconds, Triton's) and the `x-tessera-deadline-ms` metadata.
- Errors are gRPC status codes with the protocol's message; Tessera's code (`no_route`, `deadline_exceeded`,
  ...) rides in the trailing metadata `x-tessera-error-code`, the variant(s) that answered in
  `x-tessera-variant` (and in the answer's parameter `tessera_variant`, which a stream's answers carry too).
- `ModelStreamInfer` answers each request of a stream as it completes (not in order: match them by `id`),
  a refused one as the protocol's `error_message`.
- Health: `grpc.health.v1.Health` says SERVING for "" and for the inference service once the router holds
  routing tables, as `/v2/health/ready` does.
Not served: shared memory, tracing, logging settings (UNIMPLEMENTED, as for any method not listed).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

import grpc
import orjson
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from workers.router.asgi import InferHeaders, deadline_parse
from workers.router.oip import (
    InferAnswer,
    OipError,
    model_config,
    model_find,
    model_infer,
    model_metadata,
    model_ready,
    model_statistics,
    repository_action,
    repository_index,
    repository_parameters_check,
    server_metadata,
    server_ready,
)
from workers.router.proto import oip_pb2 as pb
from workers.wire import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE, MAX_BODY_BYTES, WireError, request_inputs_json, response_raw_outputs, values_raw

if TYPE_CHECKING:
    from workers.router.app import Router

__all__ = ["SERVICE", "OipGrpcServer", "infer_request_body", "infer_response_build", "oip_grpc_start"]

log = logging.getLogger("tessera.router.grpc")

SERVICE = "inference.GRPCInferenceService"
_HEALTH_EVERY_S = 0.5

# HTTP status (the router's and the runtimes' refusals) -> gRPC status code, as Triton maps its error kinds.
_GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

# Which typed-contents field holds a datatype's elements (InferTensorContents); FP16 and BF16 have none.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


# --------------------------------------------------------------------------- requests and answers


def _parameter_value(parameter: Any) -> Any:
    """An InferParameter or ModelRepositoryParameter as the JSON value the HTTP protocol would carry."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def _parameters(params: Any) -> dict[str, Any]:
    return {key: _parameter_value(value) for key, value in params.items()}


def infer_request_body(request: pb.ModelInferRequest, *, json_inputs: bool = False) -> tuple[bytes, int | None]:
    """A gRPC ModelInferRequest -> the HTTP protocol's body and its JSON header's length: each input's raw
    bytes after the header (binary tensor data), or every input as JSON data (`json_inputs`: a pipeline's
    stages), the outputs asked for as binary data, the request's parameters kept. WireError says what is
    malformed."""
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise WireError(f"raw_input_contents has {len(raws)} entries for {len(request.inputs)} inputs: give one per input, in order")
    inputs: list[dict[str, Any]] = []
    buffers: list[bytes] = []
    for i, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        shape = tuple(int(d) for d in tensor.shape)
        if any(d < 0 for d in shape):
            raise WireError(f"{where}: 'shape' must hold non-negative integers, got {list(shape)}")
        if raws:
            if tensor.HasField("contents"):
                raise WireError(f"{where}: give its elements in raw_input_contents or in contents, not both")
            raw = raws[i]
        else:
            raw = _contents_raw(tensor, shape, where)
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(shape)}
        params = _parameters(tensor.parameters)
        params.pop("binary_data_size", None)
        entry["parameters"] = {**params, "binary_data_size": len(raw)}
        inputs.append(entry)
        buffers.append(raw)
    doc: dict[str, Any] = {}
    if request.id:
        doc["id"] = request.id
    doc["inputs"] = inputs
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": {**_parameters(o.parameters), "binary_data": True}} for o in request.outputs]
    doc["parameters"] = {**_parameters(request.parameters), "binary_data_output": True}
    header = orjson.dumps(doc)
    body = b"".join([header, *buffers])
    if json_inputs:
        return request_inputs_json(body, len(header)), None
    return body, len(header)


def _contents_raw(tensor: Any, shape: tuple[int, ...], where: str) -> bytes:
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        if tensor.datatype in ("FP16", "BF16"):
            raise WireError(f"{where}: {tensor.datatype} has no typed contents; send it in raw_input_contents")
        raise WireError(f"{where}: unsupported datatype {tensor.datatype!r}")
    contents = tensor.contents
    for other in set(_CONTENTS_FIELD.values()) - {field}:
        if len(getattr(contents, other)):
            raise WireError(f"{where}: a {tensor.datatype} tensor's elements go in contents.{field}, not contents.{other}")
    return values_raw(tensor.datatype, shape, list(getattr(contents, field)), where)


def _parameter_set(target: Any, value: Any) -> None:
    """A JSON parameter value into an InferParameter (objects and lists as JSON text)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        target.int64_param = value
    elif isinstance(value, int) and 0 <= value < (1 << 64):
        target.uint64_param = value
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        target.string_param = orjson.dumps(value).decode()


def infer_response_build(answer: InferAnswer, name: str) -> pb.ModelInferResponse:
    """An answer in the HTTP protocol's form -> a gRPC ModelInferResponse (outputs as raw contents)."""
    doc, raws = response_raw_outputs(answer.body, answer.header_length)
    response = pb.ModelInferResponse(model_name=str(doc.get("model_name") or name), model_version=str(doc.get("model_version") or ""),
                                     id=str(doc.get("id") or ""))
    for entry in doc.get("outputs") or []:
        out = response.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        for key, value in (entry.get("parameters") or {}).items():
            if key != "binary_data_size":
                _parameter_set(out.parameters[key], value)
    response.raw_output_contents.extend(raws)
    for key, value in (doc.get("parameters") or {}).items():
        _parameter_set(response.parameters[key], value)
    for key, value in answer.headers:
        if key == b"x-tessera-variant":
            response.parameters["tessera_variant"].string_param = value.decode("utf-8", "replace")
    return response


def _deadline_ms(context: Any) -> float | None:
    """The smaller of the call's gRPC deadline and its `x-tessera-deadline-ms` metadata (ms; None: neither)."""
    left = context.time_remaining()
    deadline = left * 1000.0 if left is not None else None
    for key, value in context.invocation_metadata() or ():
        if key == "x-tessera-deadline-ms":
            try:
                ms = deadline_parse(value.encode() if isinstance(value, str) else value)
            except ValueError as exc:
                raise OipError(400, str(exc), "malformed") from None
            deadline = ms if deadline is None else min(deadline, ms)
    return deadline


def _metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    return tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)


# --------------------------------------------------------------------------- the service


def _method(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A unary method: the router's refusals and malformed requests as gRPC status codes."""

    @functools.wraps(fn)
    async def wrapper(self: "OipGrpcServicer", request: Any, context: Any) -> Any:
        try:
            return await fn(self, request, context)
        except OipError as exc:
            await context.abort(_GRPC_CODES.get(exc.status, grpc.StatusCode.UNKNOWN), exc.message,
                                trailing_metadata=(*_metadata(exc.headers), ("x-tessera-error-code", exc.code)))
        except WireError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc), trailing_metadata=(("x-tessera-error-code", exc.code),))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return wrapper


def _version(version: str) -> str | None:
    return version or None  # the protocol's empty version: none named


class OipGrpcServicer:
    """The methods of `inference.GRPCInferenceService` on one router (see the module docstring)."""

    def __init__(self, router: "Router") -> None:
        self.router = router

    @_method
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @_method
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=server_ready(self.router))

    @_method
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=model_ready(self.router, request.name, _version(request.version)))

    @_method
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return json_format.ParseDict(server_metadata(), pb.ServerMetadataResponse())

    @_method
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        doc = model_metadata(self.router, request.name, _version(request.version))
        return json_format.ParseDict(doc, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    @_method
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        doc = model_config(self.router, request.name, _version(request.version))
        return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig(), ignore_unknown_fields=True))

    @_method
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        rows = model_statistics(self.router, request.name or None, _version(request.version))
        return json_format.ParseDict({"model_stats": rows}, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @_method
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**entry)
                                                  for entry in repository_index(self.router, request.ready)])

    @_method
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Any) -> pb.RepositoryModelLoadResponse:
        config = repository_parameters_check(_parameters(request.parameters), "load", request.model_name)
        await repository_action(self.router, "load", request.model_name, config)
        return pb.RepositoryModelLoadResponse()

    @_method
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Any) -> pb.RepositoryModelUnloadResponse:
        repository_parameters_check(_parameters(request.parameters), "unload", request.model_name)
        await repository_action(self.router, "unload", request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @_method
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        answer = await self._infer(request, _deadline_ms(context))
        context.set_trailing_metadata(_metadata(answer.headers))
        return infer_response_build(answer, request.model_name)

    async def _infer(self, request: pb.ModelInferRequest, deadline_ms: float | None) -> InferAnswer:
        t0 = time.monotonic()
        app, _pipeline = model_find(self.router, request.model_name)
        body, header_length = infer_request_body(request, json_inputs=app is None)
        headers = InferHeaders(BINARY_CONTENT_TYPE if header_length is not None else JSON_CONTENT_TYPE, header_length, deadline_ms)
        return await model_infer(self.router, request.model_name, _version(request.model_version), headers, body, t0)

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest], context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request of the stream answered as it completes; a refused one as `error_message`."""
        answers: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        outstanding = 0  # requests read and not yet answered

        async def one(request: pb.ModelInferRequest) -> None:
            try:
                answer = await self._infer(request, _deadline_ms(context))
                response = pb.ModelStreamInferResponse(infer_response=infer_response_build(answer, request.model_name))
            except (OipError, WireError) as exc:
                message = exc.message if isinstance(exc, OipError) else str(exc)
                response = pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(model_name=request.model_name,
                                                                                                                   id=request.id))
            except Exception as exc:  # an answer is owed for every request read, whatever went wrong
                log.exception("stream request to %s failed", request.model_name)
                response = pb.ModelStreamInferResponse(error_message=f"internal error: {type(exc).__name__}: {exc}",
                                                       infer_response=pb.ModelInferResponse(model_name=request.model_name, id=request.id))
            answers.put_nowait(response)

        async def read() -> None:
            nonlocal outstanding
            async for request in requests:
                outstanding += 1
                task = asyncio.ensure_future(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reader = asyncio.ensure_future(read())
        getter: asyncio.Future | None = None
        try:
            while not (reader.done() and outstanding == 0):
                getter = asyncio.ensure_future(answers.get())
                await asyncio.wait({getter} if reader.done() else {getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    outstanding -= 1
                    yield getter.result()
                else:
                    getter.cancel()
            reader.result()  # a broken stream's error, if any
        finally:  # the stream ended, or the client went away: nothing of it is left running
            for task in [reader, *tasks, *([getter] if getter is not None else [])]:
                task.cancel()

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Callable, req: Any, resp: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)

        methods = {
            "ServerLive": unary(self.ServerLive, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": unary(self.ServerReady, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": unary(self.ModelReady, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": unary(self.ServerMetadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
            "ModelMetadata": unary(self.ModelMetadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            "ModelConfig": unary(self.ModelConfig, pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": unary(self.ModelStatistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
            "RepositoryIndex": unary(self.RepositoryIndex, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
            "RepositoryModelLoad": unary(self.RepositoryModelLoad, pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
            "RepositoryModelUnload": unary(self.RepositoryModelUnload, pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
            "ModelInfer": unary(self.ModelInfer, pb.ModelInferRequest, pb.ModelInferResponse),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.ModelStreamInfer, request_deserializer=pb.ModelInferRequest.FromString,
                                                                      response_serializer=pb.ModelStreamInferResponse.SerializeToString),
        }
        return grpc.method_handlers_generic_handler(SERVICE, methods)


class _RouterHealth(health.aio.HealthServicer):
    """grpc.health.v1 for the router: SERVING for "" and the inference service once the router holds routing
    tables, as /v2/health/ready; a Check reads it at the time it is asked."""

    def __init__(self, router: "Router") -> None:
        super().__init__()
        self._router = router
        self._last: int | None = None

    async def follow(self) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if server_ready(self._router) else health_pb2.HealthCheckResponse.NOT_SERVING
        if status != self._last:
            self._last = status
            for service in ("", SERVICE):
                await self.set(service, status)

    async def Check(self, request: Any, context: Any) -> Any:
        await self.follow()
        return await super().Check(request, context)


class OipGrpcServer:
    """The router's gRPC server on the router's event loop: `port` (the one bound), `stop()`."""

    def __init__(self, server: Any, port: int, health_task: asyncio.Task) -> None:
        self.server, self.port, self._health_task = server, port, health_task

    async def stop(self, grace_s: float = 1.0) -> None:
        self._health_task.cancel()
        await self.server.stop(grace_s)


async def oip_grpc_start(router: "Router", listen: str) -> OipGrpcServer:
    """Serve `inference.GRPCInferenceService` and `grpc.health.v1.Health` for `router` on `listen`
    (HOST:PORT, port 0: any free port), insecure (TLS ends in front of the router, as for its HTTP), on the
    running event loop, which the HTTP side's dispatch shares. Raises RuntimeError when it cannot bind."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_BODY_BYTES),
                                      ("grpc.max_send_message_length", MAX_BODY_BYTES),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((OipGrpcServicer(router).handler(),))
    health_servicer = _RouterHealth(router)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise RuntimeError(f"the router's gRPC server cannot listen on {listen}: {exc}") from None
    await server.start()

    async def health_follow() -> None:
        while True:  # for Watch's streams; Check asks afresh
            await health_servicer.follow()
            await asyncio.sleep(_HEALTH_EVERY_S)

    return OipGrpcServer(server, port, asyncio.ensure_future(health_follow()))
