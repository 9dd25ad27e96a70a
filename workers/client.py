"""The data plane's only way to the control plane: its REST API, with a host's agent token (agents) or a
router credential (routers).

`ControlPlaneClient(url, token)` wraps the agent- and router-facing endpoints of docs/dataplane.md. Two
kinds of failure are told apart because the agent treats them differently:

- `ControlPlaneUnavailable`: the control plane could not be reached or answered 5xx. The agent keeps
  serving on what it last knew and tries again later.
- `ControlPlaneRejected`: a 4xx answer; the message is the control plane's own (`{"error": {...}}`).
  Retrying the same request will not help.

`ReportBacklog(send, capacity=...)` keeps the periodic reports (an agent's metrics, a router's report)
that could not be delivered, in a bounded buffer, and sends them later with their original times; what
overflows is counted and carried in the next delivered report (`dropped_reports`).
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable

import httpx

__all__ = [
    "REPORT_BACKLOG_S",
    "ControlPlaneClient",
    "ControlPlaneError",
    "ControlPlaneRejected",
    "ControlPlaneUnavailable",
    "ReportBacklog",
    "report_backlog_capacity",
]

API = "/api/v1"
# How long an outage the report buffers ride out at the normal reporting rate (at least ten minutes).
REPORT_BACKLOG_S = 900.0
# Kept reports sent per delivered fresh one: a fleet coming back after an outage catches up over tens of
# seconds instead of all at once, and a router's flush stays a small share of its process.
BACKLOG_FLUSH_PER_REPORT = 20

log = logging.getLogger("tessera.client")


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
            raise ValueError("a token is required: an agent token (tessera agent-token HOST) or a router credential "
                             "(tessera router-credential issue NAME)")
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
        if response.status_code >= 500 or response.status_code == 429:
            # 429: the control plane holds this address (refused secrets from it, apps/users/authentication.py)
            # or throttles it; like an outage it says "later" (Retry-After), so a report is kept, not dropped.
            retry = response.headers.get("retry-after")
            raise ControlPlaneUnavailable(f"{method} {self.url}{path}: HTTP {response.status_code}" + (f", retry after {retry} s" if retry else ""))
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

    def repository_action(self, action: str, model: str, *, config: Any = None) -> dict:
        """The model repository extension's `load` or `unload` of `model` (an application), with this router's
        credential (which an admin must have allowed: `may_load_models`); a load's `config` (Triton's model
        configuration) for the control plane to apply or refuse."""
        body = {"model": model, "action": action, **({"config": config} if config is not None else {})}
        return self._json("POST", f"{API}/routing-tables/repository/", json=body)

    def router_name(self) -> str:
        """The router name this client's router credential is scoped to (a router sees its own only)."""
        credentials = self._list(f"{API}/router-credentials/")
        if len(credentials) != 1:
            raise ControlPlaneRejected(403, f"this token sees {len(credentials)} router credentials; a router credential sees its own only")
        return str(credentials[0]["name"])

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


def report_backlog_capacity(interval_s: float, backlog_s: float = REPORT_BACKLOG_S) -> int:
    """How many reports, one every `interval_s`, cover `backlog_s` of outage."""
    return max(1, math.ceil(backlog_s / max(interval_s, 1e-3)))


class ReportBacklog:
    """Periodic reports that could not be delivered, oldest first, at most `capacity` of them.

    `submit(report)` sends the fresh report first (the control plane's view of now is never held up behind
    a backlog), then up to `flush_per_report` kept ones, oldest first, each with its original `at`. A
    report that cannot be delivered now (control plane unreachable or 5xx, or 401/403: a credential may be
    re-issued) is kept and the error raised; one the control plane refuses for good (another 4xx: it will
    never be accepted) is let go and counted in `rejected_total`. When the buffer is full the oldest kept
    report is let go: `dropped_total` counts them (Prometheus), and the next delivered report carries the
    ones not yet told (`dropped_reports`), so the control plane records the gap. Thread-safe."""

    def __init__(self, send: Callable[[dict], Any], *, capacity: int, flush_per_report: int = BACKLOG_FLUSH_PER_REPORT,
                 what: str = "report") -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._send = send
        self.capacity = capacity
        self.flush_per_report = flush_per_report
        self.what = what
        self._kept: deque[dict] = deque()
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one delivery at a time: reports go out in order
        self.dropped_total = 0
        self.rejected_total = 0
        self.sent_late_total = 0
        self._untold = 0  # dropped, not yet carried in a delivered report

    @property
    def pending(self) -> int:
        return len(self._kept)

    def _keep(self, report: dict) -> None:
        with self._lock:
            if len(self._kept) >= self.capacity:
                self._kept.popleft()
                self.dropped_total += 1
                self._untold += 1
                if self.dropped_total == 1 or self.dropped_total % 100 == 0:
                    log.warning("%s buffer full (%d kept): %d dropped so far, oldest first", self.what, self.capacity, self.dropped_total)
            self._kept.append(report)

    def _deliver(self, report: dict) -> bool:
        """Send one report with the drops not yet told; True when sent, False when refused for good."""
        with self._lock:
            untold = self._untold
        try:
            self._send({**report, "dropped_reports": untold} if untold else report)
        except ControlPlaneRejected as exc:
            if exc.status in (401, 403):
                raise
            self.rejected_total += 1
            log.error("%s refused by the control plane, not sent again: %s", self.what, exc)
            return False
        with self._lock:
            self._untold -= untold
        return True

    def submit(self, report: dict) -> None:
        """Deliver `report` now, then some kept ones; keep it and raise when it cannot be delivered now."""
        with self._sending:
            try:
                self._deliver(report)
            except Exception:
                self._keep(report)
                raise
            self._flush(self.flush_per_report)

    def flush(self, limit: int | None = None) -> int:
        """Send up to `limit` kept reports (all with None), oldest first, stopping at the first that cannot
        be delivered now. Returns how many left the buffer."""
        with self._sending:
            return self._flush(limit)

    def _flush(self, limit: int | None) -> int:
        done = 0
        while limit is None or done < limit:
            with self._lock:
                if not self._kept:
                    break
                report = self._kept[0]
            try:
                sent = self._deliver(report)
            except Exception:  # still away: the rest waits for the next report
                break
            with self._lock:
                if self._kept and self._kept[0] is report:
                    self._kept.popleft()
            self.sent_late_total += sent
            done += 1
        return done


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
