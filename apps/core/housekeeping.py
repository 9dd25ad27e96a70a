"""History retention: what the control loop writes on every re-plan, kept for TESSERA_HISTORY_RETENTION_DAYS.

A fleet that re-plans every minute writes, per plan, a Plan (its whole problem and plan as JSON), a planning
job and often a rollout job, new versions of the routing tables it touches, new desired-state versions of the
hosts it changes, the agents' operations and the audit log of all of it. The soak (benches/soak.py) measured
about 200 plans, 400 jobs, 1,600 routing-table versions and 4,500 audit rows an hour at a 30 s interval:
without retention the database grows for as long as the fleet runs. Telemetry has its own retention
(apps.telemetry.services.telemetry_prune); this is the rest, as NetBox's housekeeping prunes its changelog and
jobs (CHANGELOG_RETENTION, JOB_RETENTION, 90 days by default).

What stays, whatever its age: the active plan and every plan approved or rolling out (a draft or validated
plan older than the retention was never applied and never will be: newer plans replaced it), jobs pending or
running, every active routing table, each host's latest desired state and the
versions it converged or settled on. Rows are deleted without loading them, and not audited (pruning is
retention, not a change; telemetry_prune does the same); references to a pruned plan or job from what stays
are cleared first, as their on_delete=SET_NULL would.

Deleted and updated rows leave dead tuples that only VACUUM makes reusable. PostgreSQL's autovacuum does that
on its own, but a server can run with it off (the soak found one: its database grew 92 MB an hour while the
live rows stayed level). `dead_rows_vacuum` then does autovacuum's work on Tessera's tables, by autovacuum's
own threshold, after every pruning."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

logger = logging.getLogger("tessera.housekeeping")

# Plans that are not, and will not be, what the fleet runs; jobs that ended.
PRUNED_PLAN_STATUSES = ("draft", "validated", "superseded", "failed", "rolled_back")
ENDED_JOB_STATUSES = ("succeeded", "failed")


def _raw_delete(queryset) -> int:
    return queryset._raw_delete(queryset.db)


@transaction.atomic
def history_prune(*, older_than: timedelta) -> dict[str, int]:
    """Delete the history older than `older_than` (see the module docstring for what always stays). Returns the
    rows deleted per table."""
    from apps.core.models import ObjectChange
    from apps.deployments.models import HostDesiredState, HostOperation, RoutingTable
    from apps.inventory.models import Host
    from apps.jobs.models import Job
    from apps.planning.models import Plan, PredictionCheck
    from apps.registry.models import ProfilingRequest

    cutoff = timezone.now() - older_than
    deleted: dict[str, int] = {}

    plans = Plan.objects.filter(status__in=PRUNED_PLAN_STATUSES, created__lt=cutoff).values("pk")
    Plan.objects.filter(previous__in=plans).update(previous=None)
    _raw_delete(PredictionCheck.objects.filter(plan__in=plans))  # a raw delete does not cascade
    deleted["plan"] = _raw_delete(Plan.objects.filter(pk__in=plans))

    jobs = Job.objects.filter(status__in=ENDED_JOB_STATUSES, created__lt=cutoff).values("pk")
    Plan.objects.filter(job__in=jobs).update(job=None)
    ProfilingRequest.objects.filter(job__in=jobs).update(job=None)
    deleted["job"] = _raw_delete(Job.objects.filter(pk__in=jobs))

    deleted["routingtable"] = _raw_delete(RoutingTable.objects.filter(active=False, created__lt=cutoff))

    deleted["hostdesiredstate"] = 0
    old_states = HostDesiredState.objects.filter(created__lt=cutoff)
    for host_id, latest, converged, settled in (Host.objects.filter(pk__in=old_states.values("host")).annotate(latest=Max("desired_states__version"))
                                                .values_list("pk", "latest", "converged_version", "settled_version")):
        kept = {v for v in (latest, converged, settled) if v is not None}
        deleted["hostdesiredstate"] += _raw_delete(old_states.filter(host_id=host_id).exclude(version__in=kept))

    deleted["hostoperation"] = _raw_delete(HostOperation.objects.filter(at__lt=cutoff))
    deleted["objectchange"] = _raw_delete(ObjectChange.objects.filter(time__lt=cutoff))
    if any(deleted.values()):
        logger.info("history older than %s pruned: %s", older_than, ", ".join(f"{n} {k}" for k, n in deleted.items() if n))
    return deleted


# Long by nature, like a migration: not under the request's statement bound.
VACUUM_STATEMENT_BOUND_S = 300.0

# The tables of this database whose dead tuples (their own, or their TOAST table's) pass autovacuum's
# threshold: autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor x live tuples, the server's settings.
_DEAD_TABLES_SQL = """
SELECT t.relname
  FROM pg_stat_user_tables t
  JOIN pg_class c ON c.oid = t.relid
  LEFT JOIN pg_stat_all_tables toast ON toast.relid = c.reltoastrelid
 WHERE t.schemaname = current_schema()
   AND (t.n_dead_tup > %(threshold)s + %(scale)s * t.n_live_tup
        OR coalesce(toast.n_dead_tup, 0) > %(threshold)s + %(scale)s * coalesce(toast.n_live_tup, 0))
 ORDER BY t.n_dead_tup + coalesce(toast.n_dead_tup, 0) DESC
"""

_autovacuum_off_warned = False


def dead_rows_vacuum(*, force: bool = False) -> list[str]:
    """VACUUM (ANALYZE) each table whose dead rows pass autovacuum's threshold, when PostgreSQL's autovacuum is
    off (or `force`); nothing where it is on (it does this itself) or on SQLite (which reuses its free pages).
    Plain VACUUM: it takes no lock that blocks reads or writes. Returns the tables vacuumed. Must run outside
    a transaction (VACUUM cannot run inside one)."""
    global _autovacuum_off_warned
    from .outages import statement_bound_override

    if connection.vendor != "postgresql":
        return []
    if connection.in_atomic_block:
        raise RuntimeError("dead_rows_vacuum runs outside a transaction: VACUUM cannot run inside one")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::bool, current_setting('autovacuum_vacuum_threshold')::int, "
                       "current_setting('autovacuum_vacuum_scale_factor')::float")
        autovacuum, threshold, scale = cursor.fetchone()
        if autovacuum and not force:
            return []
        if not autovacuum and not _autovacuum_off_warned:
            _autovacuum_off_warned = True
            logger.warning("PostgreSQL's autovacuum is off: housekeeping vacuums Tessera's tables itself; turn it on (autovacuum = on)")
        cursor.execute(_DEAD_TABLES_SQL, {"threshold": threshold, "scale": scale})
        tables = [name for (name,) in cursor.fetchall()]
    vacuumed = []
    with statement_bound_override(VACUUM_STATEMENT_BOUND_S), connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM (ANALYZE) {connection.ops.quote_name(table)}")
            vacuumed.append(table)
    if vacuumed:
        logger.info("vacuumed %d tables with dead rows past autovacuum's threshold: %s", len(vacuumed), ", ".join(vacuumed))
    return vacuumed


def housekeeping_run(*, older_than: timedelta) -> dict[str, object]:
    """One housekeeping pass: `history_prune`, then `dead_rows_vacuum` (outside the pruning's transaction).
    What the beat task, the embedded scheduler and `manage.py housekeeping` run."""
    deleted = history_prune(older_than=older_than)
    if connection.in_atomic_block:  # a caller's transaction (a test's): VACUUM cannot run inside one
        logger.warning("housekeeping inside a transaction: the history is pruned, nothing is vacuumed")
        return {"deleted": deleted, "vacuumed": []}
    return {"deleted": deleted, "vacuumed": dead_rows_vacuum()}
