"""The images' health check: `python deploy/docker/healthcheck.py URL` exits 0 when GET URL answers 200,
1 otherwise (Docker's HEALTHCHECK and compose's healthcheck run it; Kubernetes probes the same paths itself).

The control plane's /healthz answers 503 while the database is down (apps/core/views.py), and Django
refuses a Host header that DJANGO_ALLOWED_HOSTS does not allow, so the request names the first allowed
host, as the Kubernetes probes name the Service (a leading dot allows the name itself). Routers' /healthz
and agents' /metrics do not look at the Host. Standard library only: the check must not import Django."""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def allowed_host(value: str) -> str | None:
    """The first name of a DJANGO_ALLOWED_HOSTS value a request may carry ("*" and empty entries skipped)."""
    for name in value.split(","):
        name = name.strip().lstrip(".")
        if name and "*" not in name:
            return name
    return None


def check(url: str, *, timeout: float = 4.0) -> bool:
    request = urllib.request.Request(url)
    host = allowed_host(os.environ.get("DJANGO_ALLOWED_HOSTS", ""))
    if host:
        request.add_header("Host", host)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP(S)_PROXY
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return False


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: healthcheck.py URL")
    sys.exit(0 if check(sys.argv[1]) else 1)
