"""Transactions that PostgreSQL rolls back for concurrency, not for a fault: retried, not answered 503.

PostgreSQL ends a transaction with a deadlock (SQLSTATE 40P01) when two of them lock rows in opposite
orders, and with a serialization failure (40001) under stricter isolation. Both are the database working
as designed: the transaction was rolled back whole, nothing of it was written, and running it again
succeeds. Django raises them as OperationalError, which the outage handling reads as "the database is
away" (apps.core.outages); so a service whose transaction can collide with another, such as an agent's
report locking its host while an operator's change does too, runs under `transaction_retry`: its whole
transaction again, a few times, after a short randomised wait. A collision that persists still ends as
the 503 it was before, logged as a conflict.

A request (an operator's, through the API or the dashboard) whose transaction is rolled back so is run once
more, whole, before it is answered 503 (apps.core.middleware.OutageMiddleware): when nothing has been sent,
its body can be read again, and no transaction of the request committed before the one rolled back
(`RequestCommits`), so that the second run repeats nothing the first one left behind."""
from __future__ import annotations

import functools
import logging
import random
import time
from typing import Callable, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction

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
                time.sleep(random.uniform(*RETRY_WAIT_S))  # noqa: S311  # nosec B311 - jitter, not security
        raise AssertionError("unreachable")

    return wrapper


# --------------------------------------------------------------------------- a request, run once more

# Set on Django's request when it was answered for a concurrency rollback (`request_rollback_note`).
ROLLBACK_NOTE = "tessera_concurrency_rollback"
# Statements that change nothing: reads (a row lock included: it ends with its transaction) and transaction control.
_NOT_WRITES = ("SELECT", "SAVEPOINT", "RELEASE", "ROLLBACK", "SET ", "SHOW")


def request_rollback_note(request, exc: BaseException) -> None:
    """Note on `request` (Django's, or the REST framework's around it) that `exc` ended it, when `exc` is a
    concurrency rollback: the middleware may then run the request once more."""
    if request is not None and concurrency_rollback(exc):
        setattr(getattr(request, "_request", request), ROLLBACK_NOTE, True)


class RequestCommits:
    """An execute wrapper (`connection.execute_wrapper`) for the time a request is served: `committed` turns
    true once a transaction of the request that wrote has committed. Each write inside a transaction
    registers an on_commit callback, which Django runs when the outermost block commits and drops when the
    block (or the savepoint the write was in) rolls back, so a transaction rolled back whole leaves no
    trace here. A single statement outside any transaction is not counted: by the services' convention
    every change runs in `transaction.atomic`, and what runs bare is bookkeeping that a second run repeats
    harmlessly (an API token's last_used, a job's log line)."""

    def __init__(self) -> None:
        self.committed = False

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        connection = context["connection"]
        if not self.committed and connection.in_atomic_block and not sql.lstrip()[:9].upper().startswith(_NOT_WRITES):
            transaction.on_commit(self._committed, using=connection.alias)
        return result

    def _committed(self) -> None:
        self.committed = True
