"""A transaction PostgreSQL rolls back for a deadlock is run again (apps.core.transactions), not answered
503 as if the database were away: two real transactions lock two rows in opposite orders on the real
PostgreSQL, the server picks one as the deadlock victim, and the victim's second attempt succeeds."""
from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import OperationalError, connection, connections, transaction

from apps.core.transactions import RETRY_ATTEMPTS, concurrency_rollback, transaction_retry
from apps.inventory.models import Host
from tests.conftest import service_unavailable

pytestmark = pytest.mark.services


@pytest.mark.timeout(60)
def test_a_deadlock_victim_runs_again_and_both_commit(transactional_db) -> None:
    if connection.vendor != "postgresql":
        service_unavailable(f"the test database is {connection.vendor}, not PostgreSQL (set DATABASE_URL)")
    first, second = Host.objects.create(name="lock-a"), Host.objects.create(name="lock-b")
    both_hold_one = threading.Barrier(2, timeout=20)
    attempts: Counter[str] = Counter()
    errors: list[BaseException] = []

    @transaction_retry
    def lock_both(name: str, order: tuple[int, int]) -> None:
        with transaction.atomic():
            attempts[name] += 1
            list(Host.objects.select_for_update().filter(pk=order[0]))
            if attempts[name] == 1:
                both_hold_one.wait()  # each holds its first row: the second lock closes the cycle
            list(Host.objects.select_for_update().filter(pk=order[1]))
            Host.objects.filter(pk__in=order).update(description=name)

    def run(name: str, order: tuple[int, int]) -> None:
        try:
            lock_both(name, order)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=("one", (first.pk, second.pk))),
               threading.Thread(target=run, args=("two", (second.pk, first.pk)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sorted(attempts.values()) == [1, 2]  # PostgreSQL rolled back one of them once; it ran again
    assert Host.objects.filter(pk__in=(first.pk, second.pk)).values_list("description", flat=True).distinct().count() == 1


class _Sqlstate(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def test_only_concurrency_rollbacks_are_retried_and_not_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    """No database needed: what is retried (SQLSTATE 40P01 / 40001 behind Django's OperationalError), how
    often, and that anything else (a refused connection: the outage handling's 503) raises at once."""
    monkeypatch.setattr("apps.core.transactions.RETRY_WAIT_S", (0.0, 0.0))
    calls: Counter[str] = Counter()

    def failing(name: str, cause: BaseException | None):
        @transaction_retry
        def run() -> None:
            calls[name] += 1
            if cause is None:
                raise OperationalError("connection refused")
            raise OperationalError(str(cause)) from cause
        return run

    with pytest.raises(OperationalError):
        failing("refused", None)()
    with pytest.raises(OperationalError):
        failing("deadlock", _Sqlstate("40P01"))()
    with pytest.raises(OperationalError):
        failing("serialization", _Sqlstate("40001"))()
    with pytest.raises(OperationalError):
        failing("lock timeout", _Sqlstate("55P03"))()  # lock_not_available: a bound was hit, not a collision
    assert calls == {"refused": 1, "deadlock": RETRY_ATTEMPTS, "serialization": RETRY_ATTEMPTS, "lock timeout": 1}
    assert RETRY_ATTEMPTS >= 2


def test_inside_an_outer_transaction_it_runs_once(db) -> None:
    """Only the outermost block can run again whole: nested, the error goes to the outer transaction."""
    calls: Counter[str] = Counter()

    @transaction_retry
    def deadlocked() -> None:
        calls["n"] += 1
        raise OperationalError("deadlock") from _Sqlstate("40P01")

    with pytest.raises(OperationalError):
        deadlocked()  # pytest-django's `db` runs the test inside a transaction
    assert calls["n"] == 1
