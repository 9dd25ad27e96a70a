"""When a request is run once more after a concurrency rollback (apps.core.middleware.OutageMiddleware): only
when no transaction of its first run committed (`RequestCommits`, on the real database), and once. The
deadlock itself, end to end, is in tests/integration/test_request_deadlock_retry.py."""
from __future__ import annotations

import pytest
from django.db import OperationalError, connection, transaction
from django.http import HttpResponse
from django.test import RequestFactory

from apps.core.middleware import OutageMiddleware
from apps.core.transactions import RequestCommits, request_rollback_note
from apps.inventory.models import Host

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: on_commit callbacks run


class _Sqlstate(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _committed(run) -> bool:
    commits = RequestCommits()
    with connection.execute_wrapper(commits):
        run()
    return commits.committed


def _rolled_back(write) -> None:
    try:
        with transaction.atomic():
            write()
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass


def test_only_a_committed_transaction_that_wrote_counts() -> None:
    host = Host.objects.create(name="commits")

    def rename(name: str):
        return lambda: Host.objects.filter(pk=host.pk).update(description=name)

    def committed_write():
        with transaction.atomic():
            rename("committed")()

    def read_and_lock():
        with transaction.atomic():
            list(Host.objects.select_for_update().filter(pk=host.pk))

    def savepoint_rolled_back():
        with transaction.atomic():
            list(Host.objects.all())
            _rolled_back(rename("in a savepoint"))

    def savepoint_rolled_back_after_a_write():
        with transaction.atomic():
            rename("kept")()
            _rolled_back(rename("in a savepoint"))

    assert _committed(committed_write)
    assert _committed(savepoint_rolled_back_after_a_write)
    assert not _committed(lambda: _rolled_back(rename("rolled back")))
    assert not _committed(read_and_lock)
    assert not _committed(savepoint_rolled_back)
    assert not _committed(rename("bookkeeping, outside a transaction"))


@pytest.mark.parametrize("commits_first, runs", [(False, 2), (True, 1)])
def test_a_request_rolled_back_for_concurrency_is_run_once_more_unless_something_committed(commits_first, runs) -> None:
    calls: list[int] = []
    deadlock = OperationalError("deadlock detected")
    deadlock.__cause__ = _Sqlstate("40P01")

    def view(request):  # what the middleware's get_response runs: a view that commits, then is a deadlock's victim
        calls.append(1)
        if commits_first:
            with transaction.atomic():
                Host.objects.create(name=f"committed-{len(calls)}")
        request_rollback_note(request, deadlock)
        return HttpResponse(status=503)

    response = OutageMiddleware(view)(RequestFactory().post("/api/v1/hosts/", data={"name": "x"}))
    assert response.status_code == 503 and len(calls) == runs
    assert Host.objects.filter(name__startswith="committed-").count() == (1 if commits_first else 0)


def test_an_outage_or_another_error_is_not_run_again() -> None:
    calls: list[int] = []

    def view(request):
        calls.append(1)
        request_rollback_note(request, OperationalError("connection refused"))  # the database away: not a conflict
        return HttpResponse(status=503)

    OutageMiddleware(view)(RequestFactory().post("/api/v1/hosts/", data={"name": "x"}))
    assert calls == [1]
