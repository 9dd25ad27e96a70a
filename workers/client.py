"""The data plane's only way to the control plane: its REST API, with a host's agent token.

`ControlPlaneClient(url, token)` wraps the agent-facing endpoints of docs/dataplane.md. Two kinds of
failure are told apart because the agent treats them differently:

- `ControlPlaneUnavailable`: the control plane could not be reached or answered 5xx. The agent keeps
  serving on what it last knew and tries again later.
- `ControlPlaneRejected`: a 4xx answer; the message is the control plane's own (`{"error": {...}}`).
  Retrying the same request will not help.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ControlPlaneClient", "ControlPlaneError", "ControlPlaneRejected", "ControlPlaneUnavailable"]

API = "/api/v1"


class ControlPlaneError(RuntimeError):
    pass


class ControlPlaneUnavailable(ControlPlaneError):
    """Unreachable, timed out, or a 5xx answer."""


class ControlPlaneRejected(ControlPlaneError):
    """A 4xx answer: the request itself is wrong (or not allowed)."""

    def __init__(self, status: int, message: str, fields: Any = None) -> None:
        self.status = status
        self.fields = fields
        super().__init__(f"{status}: {message}" + (f" {fields}" if fields else ""))


class ControlPlaneClient:
    """See the module docstring. Thread-safe (httpx.Client is); one per process is enough."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 5.0, transport: httpx.BaseTransport | None = None) -> None:
        if not token:
            raise ValueError("an agent token is required (tessera agent-token HOST prints one)")
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Token {token}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
        )
        self._host: dict | None = None

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:  # connection refused, timeout, protocol error
            raise ControlPlaneUnavailable(f"{method} {self.url}{path}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ControlPlaneUnavailable(f"{method} {self.url}{path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            message, fields = response.text[:500], None
            try:
                error = response.json().get("error", {})
                message, fields = error.get("message", message), error.get("fields")
            except (ValueError, AttributeError):
                pass
            raise ControlPlaneRejected(response.status_code, message, fields)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        return response.json() if response.content else None

    def _list(self, path: str, params: dict | None = None) -> list[dict]:
        """Every page of a paginated list endpoint."""
        items: list[dict] = []
        data = self._json("GET", path, params={"limit": 1000, **(params or {})})
        while True:
            if isinstance(data, list):
                return data
            items.extend(data.get("results", []))
            following = data.get("next")
            if not following:
                return items
            data = self._json("GET", following)

    # ------------------------------------------------------------------ the host

    def host(self) -> dict:
        """The host this token belongs to (an agent token sees exactly one)."""
        if self._host is None:
            hosts = self._list(f"{API}/hosts/")
            if len(hosts) != 1:
                raise ControlPlaneRejected(403, f"this token sees {len(hosts)} hosts; an agent token sees its own host only")
            self._host = hosts[0]
        return self._host

    @property
    def host_id(self) -> int:
        return int(self.host()["id"])

    def report(self, report: dict) -> dict:
        return self._json("POST", f"{API}/hosts/{self.host_id}/report/", json=report)

    def desired_state(self) -> dict | None:
        """The host's latest desired state, or None when none was ever set."""
        try:
            return self._json("GET", f"{API}/hosts/{self.host_id}/desired-state/")
        except ControlPlaneRejected as exc:
            if exc.status == 404:
                return None
            raise

    def metrics(self, payload: dict) -> None:
        self._request("POST", f"{API}/hosts/{self.host_id}/metrics/", json=payload)

    # ------------------------------------------------------------------ routers

    def routing_tables(self) -> list[dict]:
        return self._list(f"{API}/routing-tables/", {"active": "true"})

    def router_report(self, payload: dict) -> None:
        self._request("POST", f"{API}/router-reports/", json=payload)

    # ------------------------------------------------------------------ artifacts and profiling

    def artifact_fetch(self, artifact: dict, cache_dir: Path) -> Path:
        """The artifact's file in `cache_dir` (named by its sha256), downloaded once and verified: a file
        whose bytes do not hash to the recorded sha256 is never kept."""
        sha256 = str(artifact["sha256"]).lower()
        cache_dir.mkdir(parents=True, exist_ok=True)
        path = cache_dir / f"{sha256}.onnx"
        if path.exists() and _file_sha256(path) == sha256:
            return path
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    with self._http.stream("GET", artifact["download"]) as response:
                        if response.status_code >= 400:
                            response.read()
                            kind = ControlPlaneUnavailable if response.status_code >= 500 else None
                            if kind:
                                raise kind(f"artifact {sha256[:12]}: HTTP {response.status_code}")
                            raise ControlPlaneRejected(response.status_code, f"artifact {sha256[:12]}: {response.text[:300]}")
                        for chunk in response.iter_bytes():
                            digest.update(chunk)
                            out.write(chunk)
                except httpx.HTTPError as exc:
                    raise ControlPlaneUnavailable(f"artifact {sha256[:12]}: {exc}") from exc
            if digest.hexdigest() != sha256:
                raise ControlPlaneRejected(422, f"artifact download does not match its sha256 {sha256} (got {digest.hexdigest()})")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def profiling_requests(self, status: str = "pending") -> list[dict]:
        return self._list(f"{API}/profiling-requests/", {"host": self.host_id, "status": status})

    def profiling_progress(self, request_id: int, *, status: str, progress: int, log: str = "", error: str = "") -> None:
        body = {"status": status, "progress": progress, "log": log}
        if error:
            body["error"] = error
        self._request("POST", f"{API}/profiling-requests/{request_id}/progress/", json=body)

    def profiling_results(self, request_id: int, profiles: list[dict]) -> dict:
        return self._json("POST", f"{API}/profiling-requests/{request_id}/results/", json={"points": profiles})


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
