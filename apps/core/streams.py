"""Live streams over the channel layer. Every committed ObjectChange is announced on one group (each
WebSocket subscriber gets only the changes to object types it may view); jobs and telemetry publish on
groups of their own through `group_publish`.

Publishers are synchronous code running anywhere: a request thread of the ASGI server, a Celery worker,
an in-process job thread. None of them waits for the send:
- channels-redis: events go to one publisher thread per process, whose event loop keeps the layer's
  Redis connections (an `async_to_sync` per event would open a loop, and a connection, per report);
- the in-memory layer (embedded defaults) keeps asyncio queues that belong to the server's event loop, so
  a send from another thread is handed to that loop."""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time

from channels.layers import InMemoryChannelLayer, get_channel_layer

from .models import ObjectChange

logger = logging.getLogger(__name__)

CHANGE_GROUP = "tessera.changes"

_server_loop: asyncio.AbstractEventLoop | None = None
_server_loop_lock = threading.Lock()


def stream_server_loop_register(loop: asyncio.AbstractEventLoop) -> None:
    """Called by consumers when they connect: the loop that serves WebSockets in this process."""
    global _server_loop
    with _server_loop_lock:
        _server_loop = loop


class _Publisher:
    """A daemon thread running an event loop that sends events to the channel layer. Started on first use
    in each process (after a fork too: threads do not survive one). Each group's events are sent one after
    another, in the order given (a subscriber sees a create before its update); different groups' in
    parallel, at most `MAX_SENDING` at once, because each send holds one of the layer's pooled Redis
    connections and redis-py refuses beyond the pool's limit ("Too many connections"). At most
    `MAX_PENDING` events wait; beyond that (Redis away) events are dropped with a warning, not queued."""

    MAX_PENDING = 10_000
    MAX_SENDING = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = 0
        self._dropped = 0
        self._queues: dict[str, collections.deque] = {}  # touched on the publisher's loop only
        self._sending: asyncio.Semaphore | None = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid() or self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="tessera-stream-publisher", daemon=True).start()
                self._loop, self._pid, self._pending, self._queues = loop, os.getpid(), 0, {}
                self._sending = asyncio.Semaphore(self.MAX_SENDING)
            return self._loop

    def submit(self, layer, group: str, event: dict) -> None:
        loop = self._ensure()
        with self._lock:
            if self._pending >= self.MAX_PENDING:
                self._dropped += 1
                if self._dropped % 1000 == 1:
                    logger.warning("live stream backlog full: %d events dropped so far", self._dropped)
                return
            self._pending += 1
        loop.call_soon_threadsafe(self._enqueue, layer, group, event)

    def _enqueue(self, layer, group: str, event: dict) -> None:
        """On the publisher's loop: queue behind the group's earlier events; start its sender if idle."""
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = collections.deque()
            self._loop.create_task(self._drain(group, queue))
        queue.append((layer, event))

    async def _drain(self, group: str, queue: collections.deque) -> None:
        while queue:
            layer, event = queue.popleft()
            try:
                async with self._sending:
                    await layer.group_send(group, event)
            except Exception:  # noqa: BLE001 - best effort, see group_publish
                logger.warning("could not publish to %s", group, exc_info=True)
            finally:
                with self._lock:
                    self._pending -= 1
        del self._queues[group]  # nothing ran between the last check and here: the loop is ours alone

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every submitted event has been sent (tests, and processes about to exit)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0:
                    return True
            time.sleep(0.005)
        return False


_publisher = _Publisher()
stream_publisher_flush = _publisher.flush


def group_publish(group: str, event: dict) -> None:
    """Send `event` to every consumer in `group`, from any thread; never raises (a live view is best
    effort: what it shows is also in the database)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = _server_loop
        if isinstance(layer, InMemoryChannelLayer):
            if loop is None or loop.is_closed():
                return  # nobody in this process has ever subscribed: nothing to deliver to
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(layer.group_send(group, event))
            else:
                asyncio.run_coroutine_threadsafe(layer.group_send(group, event), loop)
            return
        _publisher.submit(layer, group, event)
    except Exception:  # noqa: BLE001 - the data is committed; a down channel layer must not fail the caller
        logger.warning("could not publish to %s", group, exc_info=True)


def change_event(change: ObjectChange) -> dict:
    ct = change.changed_object_type
    return {
        "type": "change.event",  # dispatched to the consumers' change_event
        "id": change.pk,
        "time": change.time.isoformat(),
        "action": change.action,
        "object_type": f"{ct.app_label}.{ct.model}",
        "object_id": change.changed_object_id,
        "object_repr": change.object_repr,
        "actor": change.actor_name,
        "changed_fields": change.changed_fields,
    }


def change_stream_publish(*, change_id: int) -> None:
    change = ObjectChange.objects.select_related("changed_object_type").filter(pk=change_id).first()
    if change is None:
        return
    group_publish(CHANGE_GROUP, change_event(change))
