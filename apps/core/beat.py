"""Celery beat's scheduler (settings CELERY_BEAT_SCHEDULER): django-celery-beat's DatabaseScheduler, made to
wait for its database instead of crashing on it.

django-celery-beat reads its schedule from PostgreSQL when beat starts, and again whenever the schedule
changes and at least every 5 minutes. Its own scheduler gives up on a database that is away at the wrong
moment: at start (beat exits at once, and the control loop's clock, job sweeper included, stops until a
supervisor restarts it), and on a re-read during an outage (beat exits mid-run). `DatabaseWaitingScheduler`:

- starts by waiting for the database: the schedule's setup (reading the table, writing the entries of
  CELERY_BEAT_SCHEDULE into it) is tried again with exponential backoff, each failure logged, for up to
  TESSERA_BEAT_DATABASE_WAIT_S (then it raises, and beat exits for its supervisor to restart it);
- rides out an outage while it runs: it keeps ticking on the schedule it last read (the periodic tasks go
  on being sent to the broker; each task meets the outage in its worker), logs the outage once when it
  starts and once when it ends, and re-reads the schedule as soon as the database answers again.

After each failure the database connection is dropped, and with it the connection pool: psycopg's pool
retries a refused server with its own exponential backoff (up to two minutes between attempts), which
would hold beat back long after the database has returned."""
from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable

from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connection
from django_celery_beat.schedulers import SCHEDULE_SYNC_MAX_INTERVAL, DatabaseScheduler

logger = logging.getLogger("tessera.beat")

# What a database that is away (refused, frozen and cut off by the statement watchdog, restarting) raises.
DATABASE_AWAY = (DatabaseError, InterfaceError)
SETUP_FIRST_WAIT_S = 0.5
SETUP_LONGEST_WAIT_S = 10.0


def _database_reset() -> None:
    """Forget the connection (and its pool) a failed statement used: the next statement connects afresh."""
    try:
        connection.close()
    except DATABASE_AWAY:
        pass
    close_pool = getattr(connection, "close_pool", None)  # PostgreSQL's backend, with or without a pool
    if close_pool is not None:
        try:
            close_pool()
        except Exception:  # noqa: BLE001 - a pool that fails to close is dropped all the same
            logger.debug("closing the database pool failed", exc_info=True)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else exc.__class__.__name__


class DatabaseWaitingScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler that waits for its database at start and survives it going
    away while beat runs (see the module docstring)."""

    _away_since: float | None = None
    _reread_due = False

    # ------------------------------------------------------------------ start: wait for the database

    def setup_schedule(self) -> None:
        """Read the schedule and install CELERY_BEAT_SCHEDULE's entries, waiting for the database with
        exponential backoff (SETUP_FIRST_WAIT_S doubling to SETUP_LONGEST_WAIT_S) for at most
        TESSERA_BEAT_DATABASE_WAIT_S; past that, the database's error is raised."""
        self._retried_until_answered("reading its schedule", super().setup_schedule)

    def _retried_until_answered(self, what: str, attempt: Callable[[], Any]) -> Any:
        bound_s = float(settings.TESSERA_BEAT_DATABASE_WAIT_S)
        started = time.monotonic()
        wait_s, tries = SETUP_FIRST_WAIT_S, 0
        while True:
            tries += 1
            try:
                result = attempt()
            except DATABASE_AWAY as exc:
                self._initial_read = True  # the schedule was not read: the next try reads it from the start
                _database_reset()
                waited = time.monotonic() - started
                if waited + wait_s > bound_s:
                    logger.error("beat: the database did not answer %s in %.0f s (%d tries); giving up: %s",
                                 what, waited, tries, _first_line(exc))
                    raise
                logger.warning("beat: the database is unavailable for %s (try %d, %.0f s so far; giving up after %.0f s): %s; "
                               "trying again in %.1f s", what, tries, waited, bound_s, _first_line(exc), wait_s)
                time.sleep(wait_s)
                wait_s = min(wait_s * 2, SETUP_LONGEST_WAIT_S)
                continue
            if tries > 1:
                logger.warning("beat: the database answered after %.1f s (%d tries); %s done", time.monotonic() - started, tries, what)
            return result

    def update_from_dict(self, mapping: dict) -> None:
        """As django-celery-beat's, except that the database being away is raised (its own logs every error
        and goes on, so an entry of CELERY_BEAT_SCHEDULE, the job sweeper say, would silently be missing)."""
        entries = {}
        for name, fields in mapping.items():
            try:
                entry = self.Entry.from_entry(name, app=self.app, **fields)
            except DATABASE_AWAY:
                raise
            except Exception:  # noqa: BLE001 - a malformed entry is the library's case: logged, the rest go on
                logger.exception("beat: cannot add the entry %r to the database schedule: %r", name, fields)
                continue
            if entry.model.enabled:
                entries[name] = entry
        self.schedule.update(entries)

    # ------------------------------------------------------------------ running: ride out an outage

    @property
    def schedule(self) -> dict:
        """The schedule, re-read as django-celery-beat does (on a change, at least every 5 minutes, and
        right after an outage); while the database is away, the schedule last read."""
        if self._reread_due:
            # The library re-reads once the last full read is SCHEDULE_SYNC_MAX_INTERVAL old: make it so.
            self._last_full_sync = datetime.datetime.now() - datetime.timedelta(seconds=SCHEDULE_SYNC_MAX_INTERVAL)
        try:
            schedule = DatabaseScheduler.schedule.fget(self)
        except DATABASE_AWAY as exc:
            if self._schedule is None:  # never read (the setup's first try): setup_schedule waits and tries again
                raise
            self._database_away(exc)
            self._reread_due = True
            return self._schedule
        self._reread_due = False
        return schedule

    def schedule_changed(self) -> bool:
        """Whether the schedule changed since it was last read (django-celery-beat's check, without its
        error log on every tick of an outage); False while the database is away."""
        try:
            close_old_connections()
            last, changed_at = self._last_timestamp, self.Changes.last_change()
        except DATABASE_AWAY as exc:
            self._database_away(exc)
            return False
        self._database_back()
        self._last_timestamp = changed_at
        return bool(changed_at and changed_at > (last or changed_at))

    def sync(self) -> None:
        """Write the entries' last run times (django-celery-beat's); skipped while the database is away
        (they stay due and are written once it answers)."""
        if self._away_since is not None:
            return
        super().sync()

    def _database_away(self, exc: BaseException) -> None:
        _database_reset()
        if self._away_since is None:
            self._away_since = time.monotonic()
            logger.warning("beat: the database is unavailable (%s); ticking on the schedule read last, and reading it "
                           "again once the database answers", _first_line(exc))

    def _database_back(self) -> None:
        if self._away_since is not None:
            logger.warning("beat: the database answers again after %.1f s; reading the schedule again", time.monotonic() - self._away_since)
            self._away_since = None
            self._reread_due = True
