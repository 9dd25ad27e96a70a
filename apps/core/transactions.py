"""Transactions that PostgreSQL rolls back for concurrency, not for a fault: retried, not answered 503.

PostgreSQL ends a transaction with a deadlock (SQLSTATE 40P01) when two of them lock rows in opposite
orders, and with a serialization failure (40001) under stricter isolation. Both are the database working
as designed: the transaction was rolled back whole, nothing of it was written, and running it again
succeeds. Django raises them as OperationalError, which the outage handling reads as "the database is
away" (apps.core.outages); so a service whose transaction can collide with another, such as an agent's
report locking its host while an operator's change does too, runs under `transaction_retry`: its whole
transaction again, a few times, after a short randomised wait. A collision that persists still ends as
the 503 it was before, logged as a conflict."""
from __future__ import annotations

import functools
import logging
import random
import time
from typing import Callable, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

logger = logging.getLogger("tessera.transactions")

P = ParamSpec("P")
R = TypeVar("R")

# SQLSTATEs of a transaction PostgreSQL rolled back for concurrency: deadlock_detected, serialization_failure.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
RETRY_ATTEMPTS = 3
RETRY_WAIT_S = (0.01, 0.1)  # bounds of the random wait before another attempt


def concurrency_rollback(exc: BaseException) -> bool:
    """Whether `exc` is a transaction PostgreSQL rolled back for a deadlock or a serialization failure."""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES


def transaction_retry(func: Callable[P, R]) -> Callable[P, R]:
    """Run `func` (which opens its own transaction) again when PostgreSQL rolls its transaction back for a
    deadlock or a serialization failure: up to RETRY_ATTEMPTS in all. Inside an outer transaction it runs
    once, as written: only the outermost block can be run again whole."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return func(*args, **kwargs)
        for attempt in range(1, RETRY_ATTEMPTS + 1):
            try:
                return func(*args, **kwargs)
            except OperationalError as exc:
                if not concurrency_rollback(exc):
                    raise
                if attempt == RETRY_ATTEMPTS:
                    logger.warning("%s: rolled back for concurrency %d times, giving up: %s", func.__qualname__, attempt, exc)
                    raise
                logger.info("%s: rolled back for concurrency (attempt %d), running it again: %s", func.__qualname__, attempt, exc)
                time.sleep(random.uniform(*RETRY_WAIT_S))  # noqa: S311 - jitter, not security
        raise AssertionError("unreachable")

    return wrapper
