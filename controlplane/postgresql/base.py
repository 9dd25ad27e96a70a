"""Tessera's database engine: Django's PostgreSQL backend with COMMIT and ROLLBACK under the statement
watchdog (apps/core/outages.py). Django sends those through psycopg's connection, not through a cursor, so
the execute wrappers never see them: a server that froze between a transaction's last statement and its
COMMIT held the request (or the worker's job) for as long as it stayed frozen. Its connection pool checks
each connection before lending it, under the same watchdog (`pool_connection_check`). Selected for every
PostgreSQL database URL (controlplane/settings/base.py)."""
from __future__ import annotations

import logging
import time

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

from apps.core.outages import pool_connection_check, statement_watched

__all__ = ["CheckedConnectionPool", "DatabaseWrapper"]

logger = logging.getLogger("tessera.outages")


class DatabaseWrapper(base.DatabaseWrapper):
    def _commit(self):
        with statement_watched(self):
            return super()._commit()

    def _rollback(self):
        with statement_watched(self):
            return super()._rollback()

    @property
    def pool(self):
        """Django's pool (its `pool` property, as of Django 5.2), but a `CheckedConnectionPool`: Django offers
        only psycopg's own check (CONN_HEALTH_CHECKS), unbounded, and a failed check there sleeps a second's
        backoff before the next connection, past the pool's 1 s timeout (a 503 where a fresh connection was a
        few milliseconds away)."""
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # Django sets its own autocommit when it takes the connection
            pool = CheckedConnectionPool(kwargs=connect_kwargs, open=False, configure=self._configure_connection,
                                         **(pool_options if isinstance(pool_options, dict) else {}))
            self._connection_pools.setdefault(self.alias, pool)  # the first of racing threads wins, as in Django
        return self._connection_pools[self.alias]


class CheckedConnectionPool(ConnectionPool):
    """psycopg's pool, each connection checked before it is lent (`pool_connection_check`: an empty query under
    the statement watchdog). One that a restarted, refused or frozen server broke while it sat idle is given
    back, which discards it and has the pool open another in the background, and the next is tried at once,
    within the same timeout. Without this, the first request or task on each broken connection failed (the
    soak saw each worker task that took one fail once after a database outage)."""

    def getconn(self, timeout: float | None = None):
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            # Past the deadline the pool raises PoolTimeout (a 503, as for any wait for a connection).
            conn = super().getconn(timeout=max(0.0, deadline - time.monotonic()))
            try:
                pool_connection_check(conn)
            except Exception as exc:  # noqa: BLE001 - whatever broke it, the connection is not lent
                logger.info("a pooled connection failed its check, discarded: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
                conn.close()  # even one the server still holds open: a closed connection the pool replaces
                self.putconn(conn)
                continue
            return conn
