"""Tessera's database engine: Django's PostgreSQL backend with COMMIT and ROLLBACK under the statement
watchdog (apps/core/outages.py). Django sends those through psycopg's connection, not through a cursor, so
the execute wrappers never see them: a server that froze between a transaction's last statement and its
COMMIT held the request (or the worker's job) for as long as it stayed frozen. Selected for every
PostgreSQL database URL (controlplane/settings/base.py)."""
from __future__ import annotations

from django.db.backends.postgresql import base

from apps.core.outages import statement_watched

__all__ = ["DatabaseWrapper"]


class DatabaseWrapper(base.DatabaseWrapper):
    def _commit(self):
        with statement_watched(self):
            return super()._commit()

    def _rollback(self):
        with statement_watched(self):
            return super()._rollback()
