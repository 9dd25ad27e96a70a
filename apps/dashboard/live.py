"""The live metrics hub: one per server process (per event loop), whatever the number of dashboards open.

Before it (issue 43), every browser socket joined the metrics group itself: the channel layer delivered
each report batch once per socket, each socket folded it into its own `LiveWindow` and rolled it up on
its own, so a thousand reports a second cost the process 45 ms of every second per open dashboard. Now:

- one channel of the process's own (`channel_layer.new_channel()`) is in `METRICS_GROUP`, so each event
  is delivered and decoded once per process, and folded once into one `LiveWindow`;
- every `FLUSH_S` after a report, and at least every `TICK_S`, the window is rolled up once per distinct
  view among the sockets (the applications a user may see, `LiveConsumer.catalogue`, and whether the page
  draws instances), each view encoded once, and the text sent to each socket that has that view.

The hub starts with its first metrics subscriber and stops with its last (its tasks cancelled, its channel
out of the group). A channel layer that fails (Redis down) is retried every second; the window keeps what
it had, and pages see the reports' age grow until reports come again."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any, Protocol

import orjson
from channels.layers import get_channel_layer

from apps.telemetry.rollup import ApplicationCatalogue, LiveWindow
from apps.telemetry.streams import METRICS_GROUP

log = logging.getLogger("tessera.dashboard")

FLUSH_S = 0.2  # a report reaches the browser within this (plus transit): coalesces a fleet's reports
TICK_S = 1.0
RETRY_S = 1.0  # after a channel-layer failure


class MetricsSocket(Protocol):
    """What the hub needs of a browser socket (`LiveConsumer`)."""

    catalogue: dict[str, ApplicationCatalogue]
    catalogue_key: Any  # equal for equal catalogues: sockets with equal keys share one roll-up
    wants_instances: bool

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None: ...


def catalogue_key(catalogue: dict[str, ApplicationCatalogue]) -> tuple:
    """A hashable value equal for equal catalogues (users with the same view permissions)."""
    return tuple(sorted((name, entry.slo_ms, tuple(sorted(entry.accuracies.items()))) for name, entry in catalogue.items()))


def metrics_text(snapshot: dict[str, Any]) -> str:
    """The message a page receives, as JSON text a browser reads: a number that is not finite (a NaN) is
    written as null (the standard library would write NaN, and the page would lose the whole message)."""
    return orjson.dumps({"type": "metrics", **snapshot}, option=orjson.OPT_NON_STR_KEYS).decode()


class LiveHub:
    def __init__(self) -> None:
        self.window = LiveWindow()
        self.sockets: set[MetricsSocket] = set()
        self.dirty = False
        self.sends = 0  # roll-ups sent, counted per view (not per socket): for tests and benches
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []
        self._channel: str | None = None

    # ------------------------------------------------------------------ sockets

    async def join(self, socket: MetricsSocket) -> None:
        async with self._lock:
            self.sockets.add(socket)
            if not self._tasks:
                loop = asyncio.get_running_loop()
                self._tasks = [loop.create_task(self._receive()), loop.create_task(self._pump())]

    async def leave(self, socket: MetricsSocket) -> None:
        async with self._lock:
            self.sockets.discard(socket)
            if self.sockets or not self._tasks:
                return
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._group_leave()

    # ------------------------------------------------------------------ the channel layer

    async def _group_leave(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):  # the layer may be the thing that is down
                await get_channel_layer().group_discard(METRICS_GROUP, channel)

    async def _receive(self) -> None:
        """Fold every metrics event into the window, once for the process."""
        layer = get_channel_layer()
        failing = False
        while True:
            try:
                if self._channel is None:
                    # The default prefix: channels-redis pulls every process-local channel of one prefix from
                    # one Redis list and sorts them out; a prefix of our own would wait behind the sockets' pulls.
                    channel = await layer.new_channel()
                    await layer.group_add(METRICS_GROUP, channel)
                    self._channel = channel
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis refused or gone: try again, and say so once
                if not failing:
                    log.warning("live metrics: the channel layer failed (%s: %s); retrying every %g s", type(exc).__name__, exc, RETRY_S)
                failing = True
                await self._group_leave()
                await asyncio.sleep(RETRY_S)
                continue
            failing = False
            kind = message.get("type")
            if kind == "metrics.hosts":
                for report in message["reports"]:
                    self.window.host_report(report)
            elif kind == "metrics.router":
                self.window.router_report(message)
            else:
                continue
            self.dirty = True

    # ------------------------------------------------------------------ roll-ups

    async def _pump(self) -> None:
        """A roll-up within FLUSH_S of new reports, and at least every TICK_S, to every metrics socket."""
        last_sent = time.monotonic()
        while True:
            await asyncio.sleep(FLUSH_S)
            now = time.monotonic()
            if not (self.dirty or now - last_sent >= TICK_S):
                continue
            self.dirty = False
            last_sent = now
            try:
                await self.publish(time.time())
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad roll-up must not end the stream for every page
                log.exception("live metrics: a roll-up failed")

    async def publish(self, at: float) -> None:
        """Roll the window up once per view among the sockets, and send each socket its view's text."""
        views: dict[tuple, list[MetricsSocket]] = {}
        catalogues: dict[Any, dict[str, ApplicationCatalogue]] = {}
        for socket in list(self.sockets):
            views.setdefault((socket.catalogue_key, socket.wants_instances), []).append(socket)
            catalogues[socket.catalogue_key] = socket.catalogue
        if not views:
            return
        snapshots = self.window.snapshots(now=at, views=[(catalogues[key], instances) for key, instances in views])
        for sockets, snapshot in zip(views.values(), snapshots):
            text = metrics_text(snapshot)
            self.sends += 1
            for socket in sockets:
                with contextlib.suppress(Exception):  # a socket closing as we send: its disconnect leaves the hub
                    await socket.send(text_data=text)


_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveHub] = weakref.WeakKeyDictionary()


def live_hub() -> LiveHub:
    """The hub of the running event loop (the server process's), made on first use."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get(loop)
    if hub is None:
        hub = _HUBS[loop] = LiveHub()
    return hub
