"""WebSocket consumers stay thin: authenticate, subscribe, filter by permission, forward."""
from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .streams import CHANGE_GROUP, stream_server_loop_register

UNAUTHENTICATED = 4401


class ChangeStreamConsumer(AsyncJsonWebsocketConsumer):
    """`ws/changes/`: a live feed of audited changes for the dashboard's "what changed recently"."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        self.permissions = await database_sync_to_async(user.get_all_permissions)()
        self.is_superuser = user.is_superuser
        stream_server_loop_register(asyncio.get_running_loop())
        await self.channel_layer.group_add(CHANGE_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(CHANGE_GROUP, self.channel_name)

    async def change_event(self, event: dict) -> None:
        app_label, model = event["object_type"].split(".", 1)
        if self.is_superuser or f"{app_label}.view_{model}" in self.permissions:
            await self.send_json({k: v for k, v in event.items() if k != "type"})
