"""WebSocket routes."""
from django.urls import path

from apps.core.consumers import ChangeStreamConsumer
from apps.dashboard.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/changes/", ChangeStreamConsumer.as_asgi()),  # the audit feed alone, for API clients
    path("ws/live/", LiveConsumer.as_asgi()),  # the dashboard: metrics, jobs and changes by subscription
]
