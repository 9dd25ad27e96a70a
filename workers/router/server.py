"""Serving the router with uvicorn (httptools, uvloop): `router_serve` (blocking), `router_start_in_thread`
and its `RouterHandle` (tests), and `main`, the `python -m workers.router` command (a routing-tables file)."""
from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from workers.router.app import Router
from workers.router.table import tables_file_reader

__all__ = ["RouterHandle", "main", "router_serve", "router_start_in_thread"]


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
            self._transport.writelines((held, data))  # one gathered write, the body not copied onto the head
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


def router_serve(router: Router, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning",
                 ready_file: str | Path | None = None) -> None:
    """Serve the router with uvicorn (httptools, uvloop) until SIGINT / SIGTERM. With `ready_file`, write
    `http://HOST:PORT` there once serving (port 0: any free port; IPv4 only)."""
    if ready_file is not None:
        _serve_with_ready_file(router, host, port, log_level, ready_file)
        return
    import uvicorn

    gc.collect()
    gc.freeze()  # what is loaded now lives as long as the process: fewer, shorter full collections
    uvicorn.Server(_uvicorn_config(router, host, port, log_level)).run()


def _serve_with_ready_file(router: Router, host: str, port: int, log_level: str, ready_file: str | Path) -> None:
    import uvicorn

    from workers.runtime.server import ready_file_write

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()
    server = uvicorn.Server(_uvicorn_config(router, bound[0], bound[1], log_level, loop="none"))

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            lines = f"http://{bound[0]}:{bound[1]}"
            if router.grpc_port is not None:
                lines += f"\ngrpc://{bound[0]}:{router.grpc_port}"
            ready_file_write(ready_file, lines)
        await task

    gc.collect()
    gc.freeze()
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


@dataclass
class RouterHandle:
    """A router serving in a background thread: `url` (http://127.0.0.1:PORT), `grpc_url` (127.0.0.1:PORT
    when the router serves gRPC, else None), `stop()`."""

    url: str
    router: Router
    server: Any
    thread: threading.Thread
    grpc_url: str | None = None

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
    grpc_url = f"{host_part}:{router.grpc_port}" if router.grpc_port is not None else None
    return RouterHandle(url=f"http://{host_part}:{bound[1]}", router=router, server=server, thread=thread, grpc_url=grpc_url)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workers.router --tables FILE --listen HOST:PORT [--ready-file PATH]`: a router on a tables
    file (no control plane), for benches and demos."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workers.router", description="A Tessera router on a routing-tables file.")
    parser.add_argument("--tables", required=True, help="JSON: the routing tables as GET /api/v1/routing-tables/?active=true lists them")
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (port 0: any free port)")
    parser.add_argument("--grpc-listen", default=None, help="HOST:PORT for the Open Inference Protocol over gRPC too (port 0: any free port)")
    parser.add_argument("--ready-file", default=None, help="where to write http://HOST:PORT once serving (and grpc://HOST:PORT on a second line)")
    parser.add_argument("--name", default=None)
    parser.add_argument("--refresh-s", type=float, default=1.0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    host, _, port = args.listen.rpartition(":")
    router = Router(tables_file_reader(args.tables), None, refresh_s=args.refresh_s, name=args.name, grpc_listen=args.grpc_listen)
    router_serve(router, host or "127.0.0.1", int(port), log_level=args.log_level, ready_file=args.ready_file)
    return 0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
