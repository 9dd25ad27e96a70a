"""One router connection to a runtime: frames read on the event loop, answers written from any thread
(docs/dataplane.md, "Router ↔ runtime frames")."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from typing import Any, Callable

from workers.wire import FrameParser, frame_pack

__all__ = ["GATHER_BYTES", "FrameConnection", "socket_configure"]

log = logging.getLogger("tessera.runtime")

_RECV_BYTES = 1 << 18
GATHER_BYTES = 1 << 16  # an answer body above this is sent after its frame head by one sendmsg, not copied onto it
_SEND_TIMEOUT_S = 10.0

FrameHandler = Callable[["FrameConnection", dict, bytes], None]


def socket_configure(sock: socket.socket) -> None:
    """An accepted connection's socket: blocking for sendall, with a kernel send timeout (not settimeout:
    that polls before every send); reads never wait (MSG_DONTWAIT, on readiness); no Nagle delay."""
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(_SEND_TIMEOUT_S), 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class FrameConnection:
    """One frame connection. Reads happen on the event loop (`loop.add_reader`, non-blocking recv), each
    frame handed to `handle(conn, header, body)`; writes come from any thread (the loop for control answers,
    the batcher's worker thread for inference answers, which saves a thread hop per query): one lock per
    connection keeps frames whole, and a write waits until it is complete, at most `_SEND_TIMEOUT_S` (a peer
    that stops reading for that long is disconnected). `on_close(conn)` is called once it is closed."""

    __slots__ = ("sock", "fd", "parser", "closed", "lock", "peer", "loop", "handle", "on_close", "more")

    def __init__(self, sock: socket.socket, *, loop: asyncio.AbstractEventLoop, handle: FrameHandler,
                 on_close: Callable[["FrameConnection"], Any]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.parser = FrameParser()
        self.closed = False
        self.lock = threading.Lock()
        self.loop = loop
        self.handle = handle
        self.on_close = on_close
        self.more = False  # while a frame is handled: more frames of the same read wait behind it
        try:
            self.peer = sock.getpeername()
        except OSError:
            self.peer = None

    def start(self) -> None:
        """Read frames from now on (event loop thread)."""
        self.loop.add_reader(self.fd, self.readable)

    def readable(self) -> None:
        try:
            data = self.sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        try:
            frames = self.parser.feed(data)
        except ValueError as exc:  # FrameError: this connection cannot be trusted any more
            log.warning("closing the connection from %s: %s", self.peer, exc)
            self.close()
            return
        handle = self.handle
        last = len(frames) - 1
        if last > 0:
            self.more = True
            try:
                for header, body in frames[:last]:
                    handle(self, header, body)
            finally:
                self.more = False
        if last >= 0:
            handle(self, *frames[last])

    def send(self, header: dict, body: bytes = b"") -> None:
        """Send one frame (any thread)."""
        self.send_bytes(frame_pack(header, body))

    def send_bytes(self, data: bytes, body: bytes | memoryview = b"") -> None:
        """Send `data`, then `body` (a large answer's tensor bytes, gathered into the same sendmsg rather than
        copied onto the frame's head)."""
        if self.closed:
            return
        with self.lock:
            try:
                if not body:
                    self.sock.sendall(data)
                else:
                    sent = self.sock.sendmsg((data, body))
                    if sent < len(data) + len(body):  # the kernel took part of it (a full send buffer)
                        if sent < len(data):
                            self.sock.sendall(memoryview(data)[sent:])
                            sent = len(data)
                        self.sock.sendall(memoryview(body)[sent - len(data):])
            except OSError:
                self.closed = True
                if not self.loop.is_closed():
                    self.loop.call_soon_threadsafe(self.close)

    def close(self) -> None:
        """Close (event loop thread)."""
        self.closed = True
        if self.fd >= 0:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
            self.fd = -1
            with self.lock:
                self.sock.close()
        self.on_close(self)
