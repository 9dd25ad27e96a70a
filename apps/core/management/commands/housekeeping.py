"""`manage.py housekeeping [--retention-days D]`: prune the history (plans, jobs, routing-table and
desired-state versions, agents' operations, the audit log) older than the retention, then vacuum the tables
with dead rows where PostgreSQL's autovacuum is off, as the beat schedule does every TESSERA_HOUSEKEEPING_EVERY_S
(apps.core.housekeeping)."""
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Prune the history older than TESSERA_HISTORY_RETENTION_DAYS (or --retention-days)."

    def add_arguments(self, parser):
        parser.add_argument("--retention-days", type=float, default=None, help="keep this many days (default: the setting)")

    def handle(self, *args, **options):
        from apps.core.housekeeping import housekeeping_run

        days = options["retention_days"] if options["retention_days"] is not None else settings.TESSERA_HISTORY_RETENTION_DAYS
        if not days > 0:
            raise CommandError(f"--retention-days must be > 0 (got {days})")
        done = housekeeping_run(older_than=timedelta(days=float(days)))
        self.stdout.write(", ".join(f"{table} {n}" for table, n in done["deleted"].items()) + f" deleted (older than {days:g} days)")
        if done["vacuumed"]:
            self.stdout.write(f"vacuumed (autovacuum is off): {', '.join(done['vacuumed'])}")
