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
