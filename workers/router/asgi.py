"""The few ASGI moves the router's two HTTP surfaces (workers/router/app.py, oip.py) share."""
from __future__ import annotations

from typing import Callable

__all__ = ["body_read", "response_send"]


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
