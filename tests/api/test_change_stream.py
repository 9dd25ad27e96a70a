"""The change stream consumer on the in-memory channel layer (the Redis one is in tests/integration)."""
import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from apps.core.consumers import UNAUTHENTICATED, ChangeStreamConsumer
from apps.users.roles import user_role_set
from tests.factories import ApplicationFactory, HostFactory, UserFactory


async def _open(user):
    communicator = WebsocketCommunicator(ChangeStreamConsumer.as_asgi(), "/ws/changes/")
    communicator.scope["user"] = user
    return communicator, await communicator.connect()


def test_anonymous_is_refused():
    async def scenario():
        communicator, (connected, code) = await _open(AnonymousUser())
        return connected, code

    assert asyncio.run(scenario()) == (False, UNAUTHENTICATED)


@pytest.mark.django_db(transaction=True)
def test_subscribers_get_only_what_they_may_view(users):
    limited = UserFactory(username="no-role")
    user_role_set(limited, None)

    async def scenario():
        viewer, _ = await _open(users["viewer"])
        nobody, _ = await _open(limited)
        await database_sync_to_async(lambda: HostFactory(name="h-stream"))()
        await database_sync_to_async(lambda: ApplicationFactory(name="a-stream"))()
        seen = [await viewer.receive_json_from(timeout=2), await viewer.receive_json_from(timeout=2)]
        nothing = await nobody.receive_nothing(timeout=0.3)
        await viewer.disconnect()
        await nobody.disconnect()
        return seen, nothing

    seen, nothing = asyncio.run(scenario())
    assert [(e["object_type"], e["object_repr"]) for e in seen] == [("inventory.host", "h-stream"), ("registry.application", "a-stream")]
    assert nothing
