"""Polling for the tests that watch real processes (agents, routers, Celery) converge."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 60.0, what: str = "condition", interval_s: float = 0.1) -> T:
    """Call `predicate` until it returns something truthy and return that; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
