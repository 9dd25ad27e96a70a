from django.db import connection
from django.http import JsonResponse


def healthz(request):
    """Liveness and database reachability, for load balancers and `tessera demo`."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
    except Exception as exc:  # noqa: BLE001
        return JsonResponse({"status": "error", "error": str(exc)}, status=503)
