"""Live streams over the channel layer. Every committed ObjectChange is announced on one group (each
WebSocket subscriber gets only the changes to object types it may view); jobs and telemetry publish on
groups of their own through `group_publish`.

Publishers are synchronous code running anywhere: a request thread of the ASGI server, a Celery worker,
an in-process job thread. With channels-redis any of them may send. The in-memory layer (embedded
defaults) keeps asyncio queues that belong to the server's event loop, so a send from another thread is
handed to that loop instead of running on a loop of its own."""
from __future__ import annotations

import asyncio
import logging
import threading

from asgiref.sync import async_to_sync
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
        async_to_sync(layer.group_send)(group, event)
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
