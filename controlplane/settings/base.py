"""Settings shared by every environment. Everything that differs between a laptop and production
comes from the environment (django-environ); the modules `local`, `production` and `test` only choose
defaults."""
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()

# Data written at run time (SQLite file, uploaded artifacts) lives under one folder, outside the package.
VAR_DIR = Path(env.str("TESSERA_VAR_DIR", default=str(BASE_DIR / "var")))

INSTALLED_APPS = [
    "daphne",  # ASGI runserver: HTTP and WebSocket from one process
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "apps.core",
    "apps.users",
    "apps.inventory",
    "apps.registry",
    "apps.policies",
    "apps.deployments",
    "apps.telemetry",
    "apps.jobs",
    "apps.planning",
    "apps.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.errors.ApiErrorsAsJsonMiddleware",  # outside the rest: it sees every answer under /api/
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.core.middleware.ChangeContextMiddleware",
    "apps.core.middleware.OutageMiddleware",  # last: its process_exception runs first
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Project-wide templates (base layout, registration/login.html, error pages); apps keep their own.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
# Project-wide assets (vendored front-end libraries with their licences, logo, favicon, the page shell's CSS);
# each app's own assets stay in its static/ folder. Served by WhiteNoise from STATIC_ROOT after collectstatic.
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.str("TESSERA_STATIC_ROOT", default=str(VAR_DIR / "staticfiles")))
MEDIA_ROOT = Path(env.str("TESSERA_MEDIA_ROOT", default=str(VAR_DIR / "media")))
# Where the demo seed keeps the CPU latencies it measured (controlplane/demo.py), so that later seeds on the
# same machine reuse them instead of measuring again; empty: measure on every seed.
TESSERA_DEMO_MEASUREMENTS_DIR = env.str("TESSERA_DEMO_MEASUREMENTS_DIR", default="")
MEDIA_URL = "/media/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "controlplane.storage.StaticFilesStorage"},
}
# Brotli forms of the static files beside the gzip ones (needs the `brotli` package; controlplane/storage.py).
TESSERA_STATIC_BROTLI = env.bool("TESSERA_STATIC_BROTLI", default=False)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Password sign-ins slow down after repeated failures (apps/users/services.py, "sign-in throttling").
AUTHENTICATION_BACKENDS = ["apps.users.backends.ThrottledModelBackend"]
# The dashboard's login page (Django's auth views); the admin keeps its own at /admin/login/.
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# --- Tessera ------------------------------------------------------------------------------------
# Uploaded ONNX artifacts larger than this are refused before anything is stored.
TESSERA_ARTIFACT_MAX_BYTES = env.int("TESSERA_ARTIFACT_MAX_BYTES", default=512 * 1024 * 1024)
# Uploads above this size go to a temporary file instead of memory; the ONNX checker reads the file.
FILE_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024

# --- REST API -----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.users.authentication.TokenAuthentication",
        "apps.inventory.authentication.AgentTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.core.api.permissions.TesseraModelPermissions"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.pagination.TesseraPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.core.api.exceptions.tessera_exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    # Rates of the throttles views name (apps/core/api/throttling.py: "N/period", e.g. 20/h or 5/15m), counted
    # in the default cache (Redis wherever REDIS_URL is set, so every process shares the count).
    "DEFAULT_THROTTLE_RATES": {
        "token_create": env.str("TESSERA_TOKEN_CREATE_RATE", default="20/h"),  # API tokens one user creates
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera API",
    "DESCRIPTION": "SLO-aware control plane for GPU inference fleets.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Fields of the same name with different choices (Accelerator.kind, Job.kind) get an enum each.
    "ENUM_NAME_OVERRIDES": {
        "AcceleratorKindEnum": "apps.inventory.choices.AcceleratorKindChoices",
        "JobKindEnum": "apps.jobs.choices.JobKindChoices",
    },
}

# Agent and router samples older than this are deleted (telemetry.prune, hourly on beat or in-process).
TESSERA_TELEMETRY_RETENTION_DAYS = env.float("TESSERA_TELEMETRY_RETENTION_DAYS", default=7.0)
# The rest of the history (ended plans, ended jobs, routing-table and desired-state versions, agents' operations,
# the audit log; apps.core.housekeeping), pruned every TESSERA_HOUSEKEEPING_EVERY_S by beat, as NetBox keeps
# its changelog and jobs 90 days.
TESSERA_HISTORY_RETENTION_DAYS = env.float("TESSERA_HISTORY_RETENTION_DAYS", default=90.0)
TESSERA_HOUSEKEEPING_EVERY_S = env.float("TESSERA_HOUSEKEEPING_EVERY_S", default=3600.0)
# An applied plan's prediction is checked against what the routers measured over this long after it became
# active (or until the next plan did, if sooner but at least TESSERA_PREDICTION_CHECK_MIN_S; apps.planning.prediction).
TESSERA_PREDICTION_CHECK_WINDOW_S = env.float("TESSERA_PREDICTION_CHECK_WINDOW_S", default=300.0)
TESSERA_PREDICTION_CHECK_MIN_S = env.float("TESSERA_PREDICTION_CHECK_MIN_S", default=30.0)
# Agents' metrics reports are stored in batches by one writer thread per server process (group commit,
# apps/telemetry/ingest.py): at most this many reports per transaction; beyond this many waiting, a report
# is answered 503 at once; a report not committed within WAIT_S is answered 503 (the agent sends it again).
TESSERA_INGEST_BATCH_MAX = env.int("TESSERA_INGEST_BATCH_MAX", default=500)
TESSERA_INGEST_MAX_WAITING = env.int("TESSERA_INGEST_MAX_WAITING", default=20000)
TESSERA_INGEST_WAIT_S = env.float("TESSERA_INGEST_WAIT_S", default=3.0)

# --- Celery -------------------------------------------------------------------------------------
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env.int("TESSERA_TASK_TIME_LIMIT", default=15 * 60)
CELERY_TASK_SOFT_TIME_LIMIT = env.int("TESSERA_TASK_SOFT_TIME_LIMIT", default=14 * 60)
# django-celery-beat's database schedule, waiting for PostgreSQL at beat's start (at most this long, then beat
# exits for its supervisor) and riding out an outage while it runs (apps/core/beat.py).
CELERY_BEAT_SCHEDULER = "apps.core.beat:DatabaseWaitingScheduler"
TESSERA_BEAT_DATABASE_WAIT_S = env.float("TESSERA_BEAT_DATABASE_WAIT_S", default=300.0)
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Outages: bounded waits and job recovery ----------------------------------------------------
# A frozen PostgreSQL or Redis (accepting, never answering) must not hold a request: every connection
# and socket operation has a bound, and a request that hits one answers 503 with Retry-After
# (apps.core.outages). The figures the fault-injection bench measures are in benches/faults.py.
TESSERA_DB_CONNECT_TIMEOUT_S = env.int("TESSERA_DB_CONNECT_TIMEOUT_S", default=2)  # libpq's least is 2
TESSERA_DB_STATEMENT_TIMEOUT_S = env.float("TESSERA_DB_STATEMENT_TIMEOUT_S", default=4.0)  # 0: none
# `manage.py migrate`'s bound on one statement instead (0: none): a migration may rewrite a large table, and it
# runs alone, before the processes that serve requests.
TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S = env.float("TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S", default=0.0)
TESSERA_REDIS_CONNECT_TIMEOUT_S = env.float("TESSERA_REDIS_CONNECT_TIMEOUT_S", default=1.0)
TESSERA_REDIS_SOCKET_TIMEOUT_S = env.float("TESSERA_REDIS_SOCKET_TIMEOUT_S", default=2.0)
TESSERA_RETRY_AFTER_S = env.int("TESSERA_RETRY_AFTER_S", default=5)  # the Retry-After of a 503
# Jobs (apps.jobs.services.jobs_sweep): a running attempt writes a heartbeat every TESSERA_JOB_HEARTBEAT_S
# (0: none); the sweeper, every TESSERA_JOB_SWEEP_EVERY_S, sends again a running job whose heartbeat is
# older than TESSERA_JOB_STALE_AFTER_S (its worker died), a pending job that never left for the broker
# that long after it was created, and a pending job no worker took within TESSERA_JOB_REQUEUE_AFTER_S of
# its last send; a job pending TESSERA_JOB_PENDING_MAX_S is failed with that reason. So a killed worker's
# job resumes within STALE_AFTER + SWEEP_EVERY (+ a worker's pick-up) seconds of its last heartbeat.
TESSERA_JOB_HEARTBEAT_S = env.float("TESSERA_JOB_HEARTBEAT_S", default=2.0)
TESSERA_JOB_STALE_AFTER_S = env.float("TESSERA_JOB_STALE_AFTER_S", default=10.0)
TESSERA_JOB_SWEEP_EVERY_S = env.float("TESSERA_JOB_SWEEP_EVERY_S", default=5.0)
TESSERA_JOB_REQUEUE_AFTER_S = env.float("TESSERA_JOB_REQUEUE_AFTER_S", default=60.0)
TESSERA_JOB_PENDING_MAX_S = env.float("TESSERA_JOB_PENDING_MAX_S", default=900.0)
# Celery beat (django-celery-beat's DatabaseScheduler copies this entry into its table). A sweep that waited
# longer than its interval in the queue (no worker up) expires instead of piling up.
CELERY_BEAT_SCHEDULE = {
    "jobs.sweep": {"task": "jobs.sweep", "schedule": TESSERA_JOB_SWEEP_EVERY_S, "options": {"expires": TESSERA_JOB_SWEEP_EVERY_S}},
    "core.housekeeping": {"task": "core.housekeeping", "schedule": TESSERA_HOUSEKEEPING_EVERY_S,
                          "options": {"expires": TESSERA_HOUSEKEEPING_EVERY_S}},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("TESSERA_LOG_LEVEL", default="INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING", "propagate": False, "handlers": ["console"]}},
}


def database_settings(url: str) -> dict:
    """The default database from one URL. PostgreSQL gets psycopg's connection pool: under ASGI every
    request runs on a thread of its own, so per-thread persistent connections (CONN_MAX_AGE) would be
    opened per request and leak; the pool hands each request a warm connection instead. Size it with
    TESSERA_DB_POOL_MAX_SIZE (per server or worker process; PostgreSQL allows 100 by default);
    TESSERA_DB_POOL=false opens a connection per request instead (a process that must not keep idle
    connections, such as CI's worker on a test database that is dropped at the end)."""
    database = env.db_url_config(url)
    if database["ENGINE"] != "django.db.backends.postgresql":
        return database
    database["ENGINE"] = "controlplane.postgresql"  # Django's, with COMMIT and ROLLBACK watched too (apps.core.outages)
    options = database.setdefault("OPTIONS", {})
    # Bounded waits (see "Outages" above): connecting, and any one statement on the server. A server that
    # stops answering mid-statement is cut off by apps.core.outages' statement watchdog.
    options.setdefault("connect_timeout", TESSERA_DB_CONNECT_TIMEOUT_S)
    if TESSERA_DB_STATEMENT_TIMEOUT_S > 0:
        options.setdefault("options", f"-c statement_timeout={int(TESSERA_DB_STATEMENT_TIMEOUT_S * 1000)}")
    if env.bool("TESSERA_DB_POOL", default=True):
        database["CONN_MAX_AGE"] = 0  # the pool manages connection lifetime; Django refuses both
        options["pool"] = {
            "min_size": env.int("TESSERA_DB_POOL_MIN_SIZE", default=2),
            "max_size": env.int("TESSERA_DB_POOL_MAX_SIZE", default=20),
            # Waiting for a connection: a free one, or a new one while PostgreSQL is away. Past this the
            # request answers 503 (a refused database answered after the old 10 s wait).
            "timeout": env.float("TESSERA_DB_POOL_TIMEOUT_S", default=1.0),
        }
    return database


def redis_settings(redis_url: str) -> dict:
    """Everything that talks to Redis, derived from one URL: broker, result backend, channel layer; every
    client with bounded connect and socket timeouts, and a publish that fails fast (one quick retry on a
    fresh connection) instead of kombu's retry loop: a request that cannot queue answers 503 at once."""
    sockets = {"socket_connect_timeout": TESSERA_REDIS_CONNECT_TIMEOUT_S, "socket_timeout": TESSERA_REDIS_SOCKET_TIMEOUT_S}
    return {
        "CELERY_BROKER_URL": redis_url,
        "CELERY_RESULT_BACKEND": redis_url,
        "CHANNEL_LAYERS": {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                # Its receive blocks in Redis up to 5 s (channels-redis' brpop_timeout): the socket waits longer.
                "CONFIG": {"hosts": [{"address": redis_url, **sockets, "socket_timeout": 5 + TESSERA_REDIS_SOCKET_TIMEOUT_S}]},
            }
        },
        "TESSERA_JOBS_IN_THREAD": False,
        "CELERY_BROKER_TRANSPORT_OPTIONS": {
            # A task whose worker died unacknowledged (acks_late) is delivered again after this many seconds,
            # but only when kombu's restore sweep next runs: every unacked_restore_interval x
            # unacked_restore_throttle = 10 x 10 s in kombu 5.7 (and at a worker's start), so a 20 s setting
            # took 95 s. The job sweeper's heartbeats bound a killed worker's job instead (STALE_AFTER +
            # SWEEP_EVERY above); this is the backstop, and must exceed the longest task (a rollout: 31 min).
            "visibility_timeout": env.int("TESSERA_BROKER_VISIBILITY_TIMEOUT", default=3600),
            **sockets,
            "retry_on_timeout": False,
            # kombu's own connection retries when a channel is opened (its default retries for ever).
            "max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2,
        },
        "CELERY_BROKER_CONNECTION_TIMEOUT": TESSERA_REDIS_CONNECT_TIMEOUT_S,
        "CELERY_TASK_PUBLISH_RETRY_POLICY": {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2},
        "CELERY_REDIS_SOCKET_CONNECT_TIMEOUT": TESSERA_REDIS_CONNECT_TIMEOUT_S,
        "CELERY_REDIS_SOCKET_TIMEOUT": TESSERA_REDIS_SOCKET_TIMEOUT_S,
        # The API's rate limits (apps/core/api/throttling.py), shared by every server process.
        "CACHES": {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url,
                               "KEY_PREFIX": "tessera", "OPTIONS": sockets}},
    }


EMBEDDED_SERVICES = {
    # No broker: tasks run in-process, in the caller, after the transaction commits.
    "CELERY_TASK_ALWAYS_EAGER": True,
    "CELERY_TASK_EAGER_PROPAGATES": True,
    "CELERY_BROKER_URL": "memory://",
    "CELERY_RESULT_BACKEND": "cache+memory://",
    "CHANNEL_LAYERS": {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
    # The API's rate limits count in this process's memory (one process serves the embedded defaults).
    "CACHES": {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    # The in-process worker: a job's task runs in a thread of this process once its transaction commits,
    # so a long job (a rollout waits for agents) does not hold up the request that started it.
    "TESSERA_JOBS_IN_THREAD": True,
}
