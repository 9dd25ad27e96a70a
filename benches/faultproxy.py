"""A TCP proxy that plays a service's outages, for benches/faults.py and tests/integration/test_outages.py:
put it in front of PostgreSQL or Redis and point the control plane at it; the shared service itself is
never touched.

Modes (`FaultProxy.mode = ...`):
- "up": forwards both ways.
- "refused": the service killed: the listening socket is closed (a connect is refused at once) and every
  open connection is cut.
- "frozen": the service stopped (SIGSTOP), or a network that drops packets: new connections are accepted
  and every connection stays open, but nothing is forwarded until the mode changes; what was held back
  is then delivered, as a resumed process would answer.

The proxy runs on a daemon thread with its own event loop, so a synchronous test or bench drives it."""
from __future__ import annotations

import asyncio
import socket
import threading

MODES = ("up", "refused", "frozen")
CHUNK = 64 * 1024


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self._mode = "up"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy-{self.port}", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._thawed: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # ---- driven from any thread

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        self._call(self._apply("refused"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self._call(self._apply(mode))

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    # ---- on the proxy's loop

    async def _start(self) -> None:
        self._thawed = asyncio.Event()
        self._thawed.set()
        await self._listen()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)

    async def _apply(self, mode: str) -> None:
        previous, self._mode = self._mode, mode
        if mode == "frozen":
            self._thawed.clear()
        else:
            self._thawed.set()
        if mode == "refused" and self._server is not None:
            self._server.close()
            self._server = None
            for writer in list(self._writers):
                writer.transport.abort()  # a reset, as the kernel sends for a killed process's sockets
            self._writers.clear()
        if mode != "refused" and previous == "refused":
            await self._listen()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.add(client_writer)
        await self._thawed.wait()  # frozen: accepted (the kernel's backlog), never answered
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            return
        self._writers.add(upstream_writer)
        await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))
        for writer in (client_writer, upstream_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self._thawed.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.transport.abort()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def url_port(url: str, default: int) -> int:
    """The port of a service URL (postgres://user@host:port/db, redis://host:port/n)."""
    hostpart = url.split("://", 1)[1].rpartition("@")[2].split("/", 1)[0]
    return int(hostpart.rsplit(":", 1)[1]) if ":" in hostpart else default


def url_via(url: str, proxy: FaultProxy) -> str:
    """`url` pointed at `proxy` (127.0.0.1 and its port), with the same credentials and path."""
    scheme, rest = url.split("://", 1)
    auth, _, hostpart = rest.rpartition("@")
    return f"{scheme}://{auth + '@' if auth else ''}127.0.0.1:{proxy.port}/{hostpart.partition('/')[2]}"
