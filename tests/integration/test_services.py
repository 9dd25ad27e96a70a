"""Real PostgreSQL, Redis, Celery worker and channels-redis."""
from __future__ import annotations

import asyncio
import io
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import IntegrityError, transaction

from apps.core.consumers import ChangeStreamConsumer
from apps.core.context import change_context
from apps.registry.models import Artifact
from apps.registry.services.artifacts import artifact_create
from tests.factories import HostFactory, ModelVariantFactory
from tests.onnx_builders import onnx_mlp_bytes

pytestmark = pytest.mark.services


def test_postgresql_enforces_the_constraints(postgres):
    variant = ModelVariantFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        type(variant).objects.create(application=variant.application, name=variant.name, accuracy=0.1, accuracy_metric="x")
    assert postgres.vendor == "postgresql"


def test_celery_task_runs_in_a_real_worker(celery_worker, settings):
    client, queue, media_root = celery_worker
    settings.MEDIA_ROOT = media_root  # the worker reads the artifact from the same storage
    with change_context(source="test"):
        artifact = artifact_create(upload=io.BytesIO(onnx_mlp_bytes(seed=3)), original_name="mlp.onnx")
    result = client.send_task("registry.artifact_verify", args=[artifact.pk], queue=queue).get(timeout=60)
    assert result == {"artifact": artifact.pk, "ok": True, "error": ""}
    artifact.refresh_from_db()
    assert artifact.last_verified is not None and artifact.verify_error == ""

    # Corrupt the stored file: the worker must notice, so it really read the bytes.
    with open(artifact.file.path, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\x00corrupt\x00")
    result = client.send_task("registry.artifact_verify", args=[artifact.pk], queue=queue).get(timeout=60)
    assert result["ok"] is False and "expected" in result["error"]
    assert "hashes to" in Artifact.objects.get(pk=artifact.pk).verify_error


def test_channels_redis_group_round_trip(redis_url):
    from channels_redis.core import RedisChannelLayer

    async def round_trip():
        layer = RedisChannelLayer(hosts=[redis_url])
        group = f"tessera-test-{uuid.uuid4().hex[:8]}"
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        await layer.group_send(group, {"type": "metric.update", "value": 42})
        message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.group_discard(group, channel)
        await layer.flush()
        return message

    assert asyncio.run(round_trip()) == {"type": "metric.update", "value": 42}


@pytest.mark.django_db(transaction=True)
def test_change_stream_over_channels_redis(redis_url, settings, users):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [redis_url]}}}

    async def scenario():
        communicator = WebsocketCommunicator(ChangeStreamConsumer.as_asgi(), "/ws/changes/")
        communicator.scope["user"] = users["viewer"]
        connected, _ = await communicator.connect()
        assert connected
        await database_sync_to_async(lambda: HostFactory(name="streamed-host"))()
        event = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return event

    event = asyncio.run(scenario())
    assert event["object_type"] == "inventory.host" and event["action"] == "create" and event["object_repr"] == "streamed-host"


def test_a_burst_of_events_reaches_redis_whole_and_in_order(redis_url, settings, caplog):
    """A burst (a demo seed, a rollout touching a hundred rows) is sent over a bounded number of pooled
    connections: none refused with "Too many connections", none lost, each group's events in order."""
    from channels.layers import get_channel_layer

    from apps.core.streams import group_publish, stream_publisher_flush

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [redis_url], "capacity": 1000}}}
    groups = [f"tessera-burst-{uuid.uuid4().hex[:8]}-{i}" for i in range(5)]

    async def subscribe():
        layer = get_channel_layer()
        channels = [await layer.new_channel() for _ in groups]
        for group, channel in zip(groups, channels):
            await layer.group_add(group, channel)
        return channels

    channels = asyncio.run(subscribe())
    for n in range(120):
        for group in groups:
            group_publish(group, {"type": "burst.event", "n": n})
    assert stream_publisher_flush(timeout_s=30)

    async def receive_all():
        layer = get_channel_layer()
        got = {}
        for group, channel in zip(groups, channels):
            got[group] = [(await asyncio.wait_for(layer.receive(channel), timeout=5))["n"] for _ in range(120)]
            await layer.group_discard(group, channel)
        return got

    received = asyncio.run(receive_all())
    assert all(numbers == list(range(120)) for numbers in received.values())
    assert "could not publish" not in caplog.text
