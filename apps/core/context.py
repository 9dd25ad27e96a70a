"""The change context: who is making the changes on this thread or task, so the audit receivers can
record the actor without every service passing it around. Set by middleware for HTTP requests and by
`change_context()` for tasks, commands and tests."""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class ChangeContext:
    request: Any = None  # the HttpRequest; its user is read at save time (DRF authenticates lazily)
    principal: Any = None  # an explicit actor for non-HTTP work
    source: str = "system"
    request_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def actor(self) -> Any:
        if self.principal is not None:
            return self.principal
        if self.request is not None:
            return getattr(self.request, "user", None)
        return None


_current: ContextVar[ChangeContext | None] = ContextVar("tessera_change_context", default=None)


def change_context_current() -> ChangeContext | None:
    return _current.get()


@contextmanager
def change_context(*, request: Any = None, principal: Any = None, source: str = "system") -> Iterator[ChangeContext]:
    ctx = ChangeContext(request=request, principal=principal, source=source)
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
