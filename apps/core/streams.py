"""The change stream: every committed ObjectChange is announced on one channel-layer group; each
WebSocket subscriber gets only the changes to object types it may view."""
from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from .models import ObjectChange

CHANGE_GROUP = "tessera.changes"


def change_event(change: ObjectChange) -> dict:
    ct = change.changed_object_type
    return {
        "type": "change.event",  # dispatched to ChangeStreamConsumer.change_event
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
    layer = get_channel_layer()
    change = ObjectChange.objects.select_related("changed_object_type").filter(pk=change_id).first()
    if layer is None or change is None:
        return
    async_to_sync(layer.group_send)(CHANGE_GROUP, change_event(change))
