"""The router's connections to runtime processes: one persistent frame connection per runtime endpoint
(`Upstream`, any number of queries in flight), `UpstreamError`, and endpoint parsing."""
from __future__ import annotations

import asyncio
import logging
import socket

from workers.wire import FrameParser, frame_head_pack

__all__ = ["Upstream", "UpstreamError", "endpoint_parse"]

log = logging.getLogger("tessera.router")


class UpstreamError(ConnectionError):
    """The runtime's connection failed (refused, or lost with the query in flight)."""


def endpoint_parse(endpoint: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` (or `HOST:PORT`, `[v6]:PORT`) -> (host, port); ValueError otherwise."""
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint must be tcp://HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


class Upstream(asyncio.Protocol):
    """One persistent frame connection to a runtime; any number of requests in flight, matched by id."""

    def __init__(self, endpoint: str, loop: asyncio.AbstractEventLoop) -> None:
        self.endpoint = endpoint
        self.host, self.port = endpoint_parse(endpoint)
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
        # Frames of the requests that arrive in the same loop iteration go out in one write (one syscall);
        # a body is handed over as it is (not copied into the frame: writelines gathers it).
        out = self._out
        if not out:
            self.loop.call_soon(self._flush)
        out.append(frame_head_pack(header, len(body)))
        if body:
            out.append(body)
        return fut

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and out:
            self.transport.writelines(out)

    def forget(self, fut: asyncio.Future) -> None:
        for rid, f in list(self.pending.items()):
            if f is fut:
                del self.pending[rid]
                break
