"""WebSocket routes."""
from django.urls import path

from apps.core.consumers import ChangeStreamConsumer

websocket_urlpatterns = [
    path("ws/changes/", ChangeStreamConsumer.as_asgi()),
]
