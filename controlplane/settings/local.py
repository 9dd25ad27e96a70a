"""Embedded defaults for a laptop: SQLite, in-memory channel layer, Celery tasks run in-process.
Set DATABASE_URL / REDIS_URL to use real services with the same settings."""
from .base import *  # noqa: F401,F403
from .base import EMBEDDED_SERVICES, STATIC_ROOT, VAR_DIR, database_settings, env, redis_settings

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# Local only: a fixed development key. Production settings have no default (see production.py).
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="tessera-local-development-only-not-secret")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])

VAR_DIR.mkdir(parents=True, exist_ok=True)
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise expects it, even before collectstatic
DATABASES = {"default": database_settings(env.str("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'tessera.sqlite3'}"))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and a busy timeout let the in-process worker, the server and the demo's agents write without
    # "database is locked"; IMMEDIATE transactions take the write lock up front, because SQLite fails a
    # read transaction's upgrade to a write at once (no waiting) when another writer holds the lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", "transaction_mode": "IMMEDIATE"}
    )

_redis_url = env.str("REDIS_URL", default="")
globals().update(redis_settings(_redis_url) if _redis_url else EMBEDDED_SERVICES)
