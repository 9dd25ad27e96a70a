"""Test settings. Unit tests run Celery tasks in-process and use the in-memory channel layer whatever
the environment says; the integration tests (tests/integration) talk to the real PostgreSQL, Redis and
Celery worker named by DATABASE_URL / REDIS_URL explicitly."""
import tempfile
from pathlib import Path

from .local import *  # noqa: F401,F403
from .local import EMBEDDED_SERVICES, env

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user creation in tests
# A Celery worker started for the integration tests must see the same files: it gets this path too.
MEDIA_ROOT = Path(env.str("TESSERA_MEDIA_ROOT", default="") or tempfile.mkdtemp(prefix="tessera-test-media-"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
TESSERA_ARTIFACT_MAX_BYTES = env.int("TESSERA_ARTIFACT_MAX_BYTES", default=2 * 1024 * 1024)

TESSERA_TEST_REDIS_URL = env.str("REDIS_URL", default="")
globals().update(EMBEDDED_SERVICES)
TESSERA_JOBS_IN_THREAD = False  # tests run a job's task in the caller, to its end
# No heartbeat thread for jobs run in the caller: it would write, on a connection of its own, a row the
# test's transaction holds locked. The Celery worker the integration tests start beats (local settings).
TESSERA_JOB_HEARTBEAT_S = 0.0

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not SQLite's shared in-memory database: tests with a live server have several threads writing
    # at once (agents reporting, the test itself), and only a file database waits on a busy lock (the
    # timeout; local settings make transactions IMMEDIATE) instead of failing with "database table is locked".
    DATABASES["default"]["TEST"] = {"NAME": str(Path(tempfile.mkdtemp(prefix="tessera-test-db-")) / "test.sqlite3")}  # noqa: F405
# No connection pool in tests: pytest-django opens, flushes and closes connections per test, and the
# browser tests fork a server process, which a pool's worker threads would not survive.
DATABASES["default"].get("OPTIONS", {}).pop("pool", None)  # noqa: F405
