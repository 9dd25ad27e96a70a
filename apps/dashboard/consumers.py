"""`ws/live/`: the dashboard's one WebSocket. A page subscribes to the topics it draws; each subscription is
checked against the user's permissions when it is made, and change events are filtered per object type.

Client -> server: {"subscribe": ["metrics", "instances", "jobs", "changes"]} / {"unsubscribe": [...]}.
Server -> client:
- {"type": "subscribed", "topic": t} or {"type": "error", "topic": t, "error": "..."};
- {"type": "metrics", ...}: roll-ups of the fleet's telemetry (apps/telemetry/rollup.py), sent within
  `FLUSH_S` of a report arriving and at least once per `TICK_S` without one; with "instances" also
  subscribed, every instance's load and utilisation in it (the fleet page). The process's one `LiveHub`
  (apps/dashboard/live.py) receives the reports and rolls them up once per view, not once per socket;
- {"type": "job", ...} as a job's status, progress or log changes; {"type": "change", ...} per audited change;
- {"type": "tick", "at": ...} once per `TICK_S` to pages without metrics, so they can tell a live stream
  from a dead one."""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.core.consumers import UNAUTHENTICATED
from apps.core.metrics import live_sockets
from apps.core.streams import CHANGE_GROUP, stream_server_loop_register
from apps.dashboard.live import TICK_S, catalogue_key, live_hub
from apps.jobs.streams import JOB_GROUP
from apps.telemetry.selectors import application_catalogue_for
from apps.telemetry.streams import METRICS_GROUP

CATALOGUE_REFRESH_S = 30.0  # variants and SLOs change rarely; a page reload is immediate anyway
METRICS_TOPICS = frozenset({"metrics", "instances"})  # served by the process's LiveHub, not by joining the group


@dataclass(frozen=True)
class Topic:
    group: str
    perms: tuple[str, ...]  # all needed to subscribe (superusers always may)


METRICS_PERMS = ("telemetry.view_applicationsample", "telemetry.view_runtimesample", "telemetry.view_gpusample")
TOPICS = {
    "metrics": Topic(METRICS_GROUP, METRICS_PERMS),
    "instances": Topic(METRICS_GROUP, METRICS_PERMS),  # adds per-instance figures to "metrics"
    "jobs": Topic(JOB_GROUP, ("jobs.view_job",)),
    "changes": Topic(CHANGE_GROUP, ()),  # every event is checked against the object type's view permission
}


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accept, then close with 4401: a refused handshake reaches the browser only as 1006, and the
            # page could not tell "log in again" from "the server is away".
            await self.accept()
            await self.close(code=UNAUTHENTICATED)
            return
        self.user = user
        self.permissions = await database_sync_to_async(user.get_all_permissions)()
        self.subscribed: set[str] = set()
        self.catalogue: dict = {}
        self.catalogue_key: tuple = ()
        self.catalogue_at = 0.0
        self.hub = None
        stream_server_loop_register(asyncio.get_running_loop())
        await self.accept()
        live_sockets.inc()
        self.counted = True
        self.pump = asyncio.get_running_loop().create_task(self._pump())

    @classmethod
    async def encode_json(cls, content) -> str:
        """By orjson: a number that is not finite (a NaN) is written as null, which a browser's JSON.parse
        reads; the standard library would write NaN, and the page would lose the whole message."""
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS).decode()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            live_sockets.dec()
            self.counted = False
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        if getattr(self, "hub", None) is not None:
            await self.hub.leave(self)
            self.hub = None
        for group in {TOPICS[topic].group for topic in getattr(self, "subscribed", ()) if topic not in METRICS_TOPICS}:
            await self.channel_layer.group_discard(group, self.channel_name)

    @property
    def wants_instances(self) -> bool:
        return "instances" in self.subscribed

    def _may(self, perm: str) -> bool:
        return self.user.is_superuser or perm in self.permissions

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """A frame that is not JSON text gets an error, as a malformed request would; the socket stays open."""
        try:
            content = await self.decode_json(text_data) if text_data is not None else None
        except ValueError:
            content = None
        if content is None:
            await self.send_json({"type": "error", "error": "Send JSON text frames."})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict) or not ({"subscribe", "unsubscribe"} & content.keys()):
            await self.send_json({"type": "error", "error": 'Send {"subscribe": [topics]} or {"unsubscribe": [topics]}.'})
            return
        for action in ("subscribe", "unsubscribe"):
            topics = content.get(action, [])
            for topic in [topics] if isinstance(topics, str) else topics if isinstance(topics, list) else []:
                await (self._subscribe(topic) if action == "subscribe" else self._unsubscribe(topic))

    async def _subscribe(self, topic) -> None:
        spec = TOPICS.get(topic) if isinstance(topic, str) else None
        if spec is None:
            await self.send_json({"type": "error", "topic": topic, "error": f"Unknown topic; one of {', '.join(TOPICS)}."})
            return
        missing = [p for p in spec.perms if not self._may(p)]
        if missing:
            await self.send_json({"type": "error", "topic": topic, "error": f"Forbidden: needs {', '.join(missing)}."})
            return
        if topic in METRICS_TOPICS:
            if not self.catalogue_at:
                await self._catalogue_refresh()
            self.subscribed.add(topic)
            if self.hub is None:
                self.hub = live_hub()
                await self.hub.join(self)
        else:
            await self.channel_layer.group_add(spec.group, self.channel_name)
            self.subscribed.add(topic)
        await self.send_json({"type": "subscribed", "topic": topic})

    async def _unsubscribe(self, topic) -> None:
        if topic in self.subscribed:
            self.subscribed.discard(topic)
            if topic in METRICS_TOPICS:
                if not METRICS_TOPICS & self.subscribed and self.hub is not None:  # "metrics" and "instances" share one
                    await self.hub.leave(self)
                    self.hub = None
            else:
                await self.channel_layer.group_discard(TOPICS[topic].group, self.channel_name)

    async def _catalogue_refresh(self) -> None:
        self.catalogue = await database_sync_to_async(application_catalogue_for)(self.user)
        self.catalogue_key = catalogue_key(self.catalogue)
        self.catalogue_at = time.monotonic()

    async def _pump(self) -> None:
        """A page with metrics gets them from the hub; this keeps its catalogue fresh. A page without gets a
        tick every TICK_S, so that it can tell a live stream from a dead one."""
        while True:
            await asyncio.sleep(TICK_S)
            if METRICS_TOPICS & self.subscribed:
                if time.monotonic() - self.catalogue_at >= CATALOGUE_REFRESH_S:
                    await self._catalogue_refresh()
            else:
                await self.send_json({"type": "tick", "at": time.time()})

    # ---------------------------------------------------------------- channel-layer events

    async def job_update(self, event: dict) -> None:
        await self.send_json({**{k: v for k, v in event.items() if k != "type"}, "type": "job"})

    async def change_event(self, event: dict) -> None:
        app_label, model = event["object_type"].split(".", 1)
        if self._may(f"{app_label}.view_{model}"):
            await self.send_json({**{k: v for k, v in event.items() if k != "type"}, "type": "change"})
