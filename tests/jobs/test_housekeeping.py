"""History retention (issue 44: the soak found plans, jobs, routing-table and desired-state versions, agents'
operations and the audit log growing with every re-plan, for as long as the fleet runs). apps.core.housekeeping
prunes what is older than the retention and keeps, whatever its age, what the fleet runs or may still run."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.core.housekeeping import dead_rows_vacuum, history_prune, housekeeping_run
from apps.core.models import ObjectChange
from apps.deployments.models import HostDesiredState, HostOperation, RoutingTable
from apps.jobs.models import Job
from apps.planning.models import Plan
from apps.planning.rollout import plan_status_set
from tests.factories import ApplicationFactory, HostFactory

pytestmark = pytest.mark.django_db

OLD = timezone.now() - timedelta(days=40)


def _aged(queryset, field: str = "created") -> None:
    queryset.update(**{field: OLD})


@pytest.fixture
def history():
    """Old and new rows of every kind the control loop writes."""
    app = ApplicationFactory(name="classify")
    host = HostFactory(name="gpu-host")
    plans = {status: Plan.objects.create(status=status) for status in
             ("draft", "validated", "approved", "rolling_out", "active", "superseded", "failed", "rolled_back")}
    newer = Plan.objects.create(status="superseded", previous=plans["superseded"])
    jobs = {status: Job.objects.create(kind="planning", status=status) for status in ("pending", "running", "succeeded", "failed")}
    plans["active"].job = jobs["succeeded"]
    plans["active"].save(update_fields=["job"])
    tables = [RoutingTable.objects.create(application=app, version=v, active=v == 3, routes=[]) for v in (1, 2, 3)]
    states = [HostDesiredState.objects.create(host=host, version=v, spec={"version": v}) for v in (1, 2, 3, 4)]
    host.converged_version, host.settled_version = 2, None
    host.save(update_fields=["converged_version", "settled_version"])
    HostOperation.objects.create(host=host, at=OLD, action="runtime.start", outcome="ok")
    HostOperation.objects.create(host=host, at=timezone.now(), action="runtime.start", outcome="ok")
    for qs in (Plan.objects.exclude(pk=newer.pk), Job.objects.all(), RoutingTable.objects.all(), HostDesiredState.objects.all()):
        _aged(qs)
    changes_before = ObjectChange.objects.count()
    _aged(ObjectChange.objects.filter(pk__in=list(ObjectChange.objects.values_list("pk", flat=True)[: changes_before // 2])), "time")
    return {"plans": plans, "newer": newer, "jobs": jobs, "tables": tables, "states": states, "host": host,
            "changes_before": changes_before}


def test_history_older_than_the_retention_is_pruned_and_what_runs_stays(history) -> None:
    deleted = history_prune(older_than=timedelta(days=30))
    plans = set(Plan.objects.values_list("status", flat=True))
    assert plans == {"approved", "rolling_out", "active", "superseded"}  # the newer superseded one
    assert Plan.objects.filter(status="superseded").get().pk == history["newer"].pk
    assert Plan.objects.get(pk=history["newer"].pk).previous is None  # its pruned predecessor is cleared
    assert Plan.objects.get(status="active").job is None  # its pruned job is cleared too
    assert set(Job.objects.values_list("status", flat=True)) == {"pending", "running"}
    assert list(RoutingTable.objects.values_list("version", flat=True)) == [3]  # the active one
    # The latest desired state and the version the host converged on stay.
    assert sorted(HostDesiredState.objects.values_list("version", flat=True)) == [2, 4]
    assert HostOperation.objects.count() == 1
    assert ObjectChange.objects.filter(time__lt=timezone.now() - timedelta(days=30)).count() == 0
    assert deleted["plan"] == 5 and deleted["job"] == 2 and deleted["routingtable"] == 2 and deleted["hostdesiredstate"] == 2
    assert deleted["objectchange"] >= 1
    # Pruning is retention, not a change: it wrote no audit row. And a second run finds nothing.
    assert history_prune(older_than=timedelta(days=30)) == dict.fromkeys(deleted, 0)


def test_nothing_newer_than_the_retention_is_touched(history) -> None:
    counts = (Plan.objects.count(), Job.objects.count(), RoutingTable.objects.count(), HostDesiredState.objects.count())
    assert set(history_prune(older_than=timedelta(days=60)).values()) == {0}
    assert (Plan.objects.count(), Job.objects.count(), RoutingTable.objects.count(), HostDesiredState.objects.count()) == counts


def test_the_command_prunes_with_the_setting_or_its_option_and_refuses_a_bad_one(history, capsys) -> None:
    call_command("housekeeping", "--retention-days", "30")
    assert "plan 5" in capsys.readouterr().out
    with pytest.raises(Exception, match="must be > 0"):
        call_command("housekeeping", "--retention-days", "0")
    assert settings.TESSERA_HISTORY_RETENTION_DAYS == 90.0
    assert settings.CELERY_BEAT_SCHEDULE["core.housekeeping"]["task"] == "core.housekeeping"


def _table_stats(table: str) -> tuple[int, object]:
    with connection.cursor() as cursor:
        try:
            cursor.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, now (PostgreSQL 15+)
        except Exception:  # noqa: BLE001 - older servers flush on their own within a second
            time.sleep(1.5)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables WHERE relname = %s", [table])
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_dead_rows_are_vacuumed_where_autovacuum_does_not() -> None:
    """The soak's database grew 92 MB an hour with its live rows level: the server ran with autovacuum off,
    and nothing made the pruned and updated rows' space reusable. Housekeeping now vacuums the tables whose
    dead rows pass autovacuum's own threshold, where autovacuum is off; where it is on it leaves them to it."""
    if connection.vendor != "postgresql":
        assert dead_rows_vacuum(force=True) == []  # SQLite reuses its free pages itself
        return
    big = {"rows": ["x" * 200] * 200}  # TOASTed, as a plan's problem is
    Plan.objects.bulk_create([Plan(status="superseded", problem=big) for _ in range(120)])
    Plan.objects.all()._raw_delete(connection.alias)
    dead, _ = _table_stats("planning_plan")
    assert dead >= 120
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::bool")
        (autovacuum,) = cursor.fetchone()
    vacuumed = dead_rows_vacuum()
    if autovacuum:
        assert vacuumed == []  # autovacuum's own work
        vacuumed = dead_rows_vacuum(force=True)
    assert "planning_plan" in vacuumed
    dead, last_vacuum = _table_stats("planning_plan")
    assert dead == 0 and last_vacuum is not None
    # Inside a transaction VACUUM cannot run: refused with a reason, and housekeeping prunes without it.
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="outside a transaction"):
            dead_rows_vacuum(force=True)
        assert housekeeping_run(older_than=timedelta(days=30))["vacuumed"] == []


def test_a_status_move_does_not_rewrite_the_plans_problem_and_result() -> None:
    """Each status move (approved, rolling out, active, superseded) saved the whole plan: its problem, result
    and prediction (hundreds of kB) written again every time, as dead copies for VACUUM to reclaim."""
    plan = Plan.objects.create(status="validated", problem={"applications": ["a"] * 50}, result={"placements": []})
    with CaptureQueriesContext(connection) as queries:
        plan_status_set(plan=plan, status="approved", approved_at=timezone.now())
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "planning_plan"')]
    assert len(updates) == 1
    assert '"status"' in updates[0] and '"approved_at"' in updates[0]
    assert '"problem"' not in updates[0] and '"result"' not in updates[0] and '"prediction"' not in updates[0]
    plan.refresh_from_db()
    assert plan.status == "approved" and plan.problem == {"applications": ["a"] * 50}
    change = ObjectChange.objects.filter(changed_object_id=str(plan.pk), action="update").latest("pk")
    assert change.prechange_data["status"] == "validated" and change.postchange_data["status"] == "approved"
