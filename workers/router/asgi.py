"""What the router's two HTTP surfaces (workers/router/app.py, oip.py) share: reading a request's body and
headers, sending a response, relaying a runtime's answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["InferHeaders", "body_read", "deadline_parse", "reply_relay", "request_headers_parse", "response_send"]


async def body_read(receive: Callable) -> bytes:
    """The whole request body, however many messages it came in."""
    message = await receive()
    body = message.get("body", b"")
    if message.get("more_body"):
        chunks = [body]
        while message.get("more_body"):
            message = await receive()
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
    return body


async def response_send(send: Callable, status: int, body: bytes, content_type: bytes, extra: list | None = None) -> None:
    """One whole response: status, content type and length, `extra` headers, body."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class InferHeaders:
    """What the router reads of an inference request's HTTP headers."""

    content_type: str | None = None
    header_length: int | None = None  # Inference-Header-Content-Length: the binary tensor extension
    deadline_ms: float | None = None  # X-Tessera-Deadline-Ms: the client's own budget


def request_headers_parse(headers: list) -> InferHeaders:
    """An ASGI request's headers -> `InferHeaders`; ValueError saying which header is malformed."""
    content_type = header_length = deadline_ms = None
    for name, value in headers:
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"inference-header-content-length":
            try:
                header_length = int(value)
            except ValueError:
                header_length = -1
            if header_length < 0:
                raise ValueError("Inference-Header-Content-Length must be an integer >= 0")
        elif name == b"x-tessera-deadline-ms":
            deadline_ms = deadline_parse(value)
    return InferHeaders(content_type, header_length, deadline_ms)


def deadline_parse(value: bytes) -> float:
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not ms >= 0 or ms == float("inf"):
        raise ValueError("X-Tessera-Deadline-Ms must be a number >= 0")
    return ms


async def reply_relay(send: Callable, status: int, reply: dict, body: bytes, extra: list) -> None:
    """Relay a runtime's answer: its content type and, for binary outputs, its JSON header's length."""
    headers = [(b"content-type", (reply.get("content_type") or "application/json").encode()),
               (b"content-length", str(len(body)).encode()), *extra]
    hl = reply.get("header_length")
    if hl is not None:
        headers.append((b"inference-header-content-length", str(hl).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
