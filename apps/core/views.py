from django.http import JsonResponse

from .outages import DATABASE, services_health


def healthz(request):
    """Liveness and each service's reachability, for load balancers, monitoring and `tessera demo`:
    {"status": "ok" | "degraded" | "down", "services": {"database": {"up": true, "ms": 0.4}, "broker": ...,
    "channel_layer": ...}}; a service that is down carries its "error". 503 only when the database is down
    (nothing can be served); with Redis away the API still reads and answers 503 to what needs it, so the
    server stays in rotation, "degraded", naming the service."""
    services = services_health()
    down = [name for name, health in services.items() if not health["up"]]
    database_down = DATABASE in down
    status = "down" if database_down else ("degraded" if down else "ok")
    return JsonResponse({"status": status, "down": down, "services": services}, status=503 if database_down else 200)


def metrics(request):
    """`GET /metrics`: the control plane's own Prometheus metrics (apps/core/metrics.py), unauthenticated as
    exporters are (counts and statuses, no names of anything); it answers when the database or the broker
    is away, saying so in `tessera_database_up` and `tessera_broker_up`."""
    from django.http import HttpResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from .metrics import CONTROL_PLANE_REGISTRY

    return HttpResponse(generate_latest(CONTROL_PLANE_REGISTRY), content_type=CONTENT_TYPE_LATEST)
