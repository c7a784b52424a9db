"""Settings for agentgate, read from the environment with django-environ.

Every knob has an embedded default so that `make run` works on a fresh machine:
SQLite in the repo folder, the in-memory channel layer and the scripted agent.
"""

from __future__ import annotations

import json
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# --- Core Django -------------------------------------------------------------
DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    # No built-in key: generate one on first start and keep it beside the project
    # (sessions survive restarts; nothing secret is ever in the repository).
    _key_file = Path(env.str("SECRET_KEY_FILE", default=str(BASE_DIR / ".secret_key")))
    if not _key_file.exists():
        _key_file.write_text(secrets.token_urlsafe(50))
        _key_file.chmod(0o600)
    SECRET_KEY = _key_file.read_text().strip()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Origins (scheme://host[:port]) that may open the WebSocket besides the gateway's own,
# e.g. a page served from another port, or the public origin behind a TLS-terminating proxy.
GATEWAY_ALLOWED_ORIGINS = env.list("GATEWAY_ALLOWED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",  # must come before staticfiles (daphne.E001)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # trigram search indexes (PostgreSQL; harmless on SQLite)
    "channels",
    "axes",  # login throttling (django-axes)
    "sessions_app.apps.SessionsAppConfig",
    "chat.apps.ChatConfig",
]

MIDDLEWARE = [
    "gatewayproject.logs.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "sessions_app.audit.OperatorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: answers a locked-out login with 429
]

ROOT_URLCONF = "gatewayproject.urls"
ASGI_APPLICATION = "gatewayproject.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

# --- Content-Security-Policy (django-csp) ----------------------------------------
# The page and the admin load only their own scripts and styles; nothing inline. The chat
# page adds ws://HOST and wss://HOST of the host it was served from to connect-src.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}

# --- HTTPS and a TLS-terminating proxy (docs/operators.md) ---------------------------
# GATEWAY_BEHIND_PROXY: trust X-Forwarded-Proto for "is this HTTPS" and, in `serve`,
# X-Forwarded-For/-Port for the client address (login throttling, the metrics allowlist).
# Only behind a proxy that sets these headers itself: a client could forge them otherwise.
GATEWAY_BEHIND_PROXY = env.bool("GATEWAY_BEHIND_PROXY", default=False)
if GATEWAY_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = env.bool("USE_X_FORWARDED_HOST", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # probes speak plain HTTP to the process
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"

# --- Database ----------------------------------------------------------------
# Async code reaches the ORM through the executor's fixed pool of worker threads
# (chat.base.db), so a connection kept per worker thread is reused, not leaked.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the writer; IMMEDIATE transactions plus a busy
    # timeout make concurrent writers queue instead of failing with "locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": env.int("SQLITE_BUSY_TIMEOUT_SECONDS", default=30),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # Opening a SQLite connection costs more than most of our queries: keep it.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=300)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env.bool("DB_POOL", default=True):
    # A pool hands each call a warm connection (Django requires CONN_MAX_AGE 0 with it).
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env.int("DB_POOL_MIN", default=1),
        "max_size": env.int("DB_POOL_MAX", default=12),
        # A call waits this long for a connection. The gateway's own threads never exhaust the
        # pool (GATEWAY_DB_THREADS < DB_POOL_MAX), so a wait means the server is away: the
        # first calls of an outage hear so within this (later ones at once, chat.base.availability).
        "timeout": env.float("DB_POOL_TIMEOUT_SECONDS", default=5.0),
        # psycopg-pool retries a failed connect with a doubling delay for 5 minutes by default,
        # so after a long outage the pool came back only minutes later; a short attempt gives
        # up soon and the next call that needs a connection starts a fresh one at once.
        "reconnect_timeout": env.float("DB_POOL_RECONNECT_SECONDS", default=2.0),
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # With the pool, Django has it check each connection (an empty statement) as it leaves the
    # pool: one that died idle (a restart the process slept through) is replaced there, not
    # handed to a call whose error would look like an outage. Without it, a kept connection
    # is checked before it is reused.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Seconds to wait for a database connection before calling it down (commands, /readyz, /metrics).
DB_CONNECT_TIMEOUT_SECONDS = env.float("DB_CONNECT_TIMEOUT_SECONDS", default=3.0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    _pg_options = DATABASES["default"].setdefault("OPTIONS", {})
    _pg_options.setdefault("connect_timeout", max(1, int(DB_CONNECT_TIMEOUT_SECONDS)))
    # TCP keepalives: a server that vanished without closing its sockets (a failover, a dead
    # host) is noticed within about 20 s instead of a call waiting on it for the kernel's hours.
    for _name, _value in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 5)):
        _pg_options.setdefault(_name, _value)
    _pg_options.setdefault("keepalives_count", 2)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer -------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
GATEWAY_CHANNEL_CAPACITY = env.int("GATEWAY_CHANNEL_CAPACITY", default=500)
# The process's own channel (chat.delivery.hub) receives every event of all its connections.
GATEWAY_PROCESS_CHANNEL_CAPACITY = env.int("GATEWAY_PROCESS_CHANNEL_CAPACITY", default=100_000)
_CHANNEL_CAPACITY = {"gateway.*": GATEWAY_PROCESS_CHANNEL_CAPACITY}
# redis-py 8 reads with a 5-second socket timeout by default, the length of channels-redis's
# idle BZPOPMIN: the read lost that race and idle consumers were closed with 1011
# (channels_redis#422). The socket timeout must stay above 5 s; a finite one still notices a
# silently dead Redis. Retries with backoff ride over a Redis restart; the pool waits for a
# free connection instead of failing a burst of connects (chat.delivery.layers).
REDIS_SOCKET_TIMEOUT_SECONDS = env.float("REDIS_SOCKET_TIMEOUT_SECONDS", default=15.0)
REDIS_MAX_CONNECTIONS = env.int("REDIS_MAX_CONNECTIONS", default=50)
REDIS_POOL_TIMEOUT_SECONDS = env.float("REDIS_POOL_TIMEOUT_SECONDS", default=20.0)
REDIS_RETRIES = env.int("REDIS_RETRIES", default=10)
if REDIS_URL:
    if REDIS_SOCKET_TIMEOUT_SECONDS <= 6:
        raise ImproperlyConfigured("REDIS_SOCKET_TIMEOUT_SECONDS must exceed the layer's 5-second blocking read")
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    CHANNEL_LAYERS: dict[str, Any] = {
        "default": {
            "BACKEND": "chat.delivery.layers.GatewayRedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
                        "socket_connect_timeout": env.float("REDIS_CONNECT_TIMEOUT_SECONDS", default=5.0),
                        "socket_keepalive": True,
                        "health_check_interval": env.int("REDIS_HEALTH_CHECK_SECONDS", default=30),
                        # 0.1, 0.2, ... capped at 2 s: ten retries cover about 15 s of Redis restart
                        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.1), REDIS_RETRIES),
                        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
                        "max_connections": REDIS_MAX_CONNECTIONS,
                        "timeout": REDIS_POOL_TIMEOUT_SECONDS,  # wait for a pooled connection
                    }
                ],
                "capacity": GATEWAY_CHANNEL_CAPACITY,
                "channel_capacity": _CHANNEL_CAPACITY,
                "prefix": env.str("REDIS_LAYER_PREFIX", default="agentgate"),
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.delivery.layers.InMemoryChannelLayer",
            # group_expiry: a connection stays in its groups for as long as it is open (the
            # default, a day, would silently stop a long-lived tab's events)
            "CONFIG": {
                "capacity": GATEWAY_CHANNEL_CAPACITY,
                "channel_capacity": _CHANNEL_CAPACITY,
                "group_expiry": 10 * 365 * 86400,
            },
        }
    }

# --- Auth, i18n, static ----------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login throttling by django-axes: after AXES_FAILURE_LIMIT wrong passwords for one username
# from one address, that pair is locked out for AXES_COOLOFF_MINUTES (a success resets the count).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLED = env.bool("AXES_ENABLED", default=True)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Stored files (uploads and attachments; docs/files.md) -------------------------
# Bytes go through Django's storage API under the `attachments` alias: the filesystem under the
# project folder by default. Any django-storages backend (S3-compatible included) is chosen by
# GATEWAY_FILES_STORAGE (its dotted class) and GATEWAY_FILES_STORAGE_OPTIONS (JSON, its OPTIONS).
GATEWAY_FILES_STORAGE = env.str("GATEWAY_FILES_STORAGE", default="django.core.files.storage.FileSystemStorage")
GATEWAY_FILES_STORAGE_OPTIONS = env.json(
    "GATEWAY_FILES_STORAGE_OPTIONS", default={"location": str(BASE_DIR / "uploads")}
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "attachments": {"BACKEND": GATEWAY_FILES_STORAGE, "OPTIONS": GATEWAY_FILES_STORAGE_OPTIONS},
}

# --- Logging ----------------------------------------------------------------------
# LOG_FORMAT=json: one JSON object per line. Either way every line carries the request,
# connection and run ids of the code that logged it (gatewayproject.logs), and an
# unhandled 500 is logged with its traceback on `django.request` (no ADMINS needed).
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOG_LEVEL = env.str("GATEWAY_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "gatewayproject.logs.ContextFilter"}},
    "formatters": {
        "plain": {"()": "gatewayproject.logs.PlainFormatter"},
        "json": {"()": "gatewayproject.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["context"],
        },
    },
    "loggers": {
        "chat": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "sessions_app": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "gatewayproject": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        # 500s (with traceback) and other request errors; Django's default sends them only to ADMINS
        "django": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "daphne": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        # psycopg-pool warns at every failed reconnect while the database is away; the gateway
        # logs the outage once when it starts and once when it ends (chat.base.availability)
        "psycopg": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# --- Operator endpoints -----------------------------------------------------------
# /readyz and /metrics answer a bearer token (`Authorization: Bearer <token>`) or a client
# address in this list of IPs/networks; anyone else gets 404. Empty list: token only.
GATEWAY_METRICS_TOKEN = env.str("GATEWAY_METRICS_TOKEN", default="")
GATEWAY_METRICS_ALLOW = env.list("GATEWAY_METRICS_ALLOW", default=["127.0.0.1", "::1"])

# --- Gateway limits (PROTOCOL.md §4, §9, §10) -------------------------------------
GATEWAY_VERSION = "0.1.0"
GATEWAY_MAX_MESSAGE_CHARS = env.int("GATEWAY_MAX_MESSAGE_CHARS", default=32000)
GATEWAY_MAX_ATTACHMENTS = env.int("GATEWAY_MAX_ATTACHMENTS", default=4)
GATEWAY_MAX_ATTACHMENT_BYTES = env.int("GATEWAY_MAX_ATTACHMENT_BYTES", default=5 * 1024 * 1024)
# An image's own limits: its bytes, and its pixels (width x height, read from its header before
# it is decoded: a larger one, a decompression bomb included, is refused).
GATEWAY_MAX_IMAGE_BYTES = env.int("GATEWAY_MAX_IMAGE_BYTES", default=5 * 1024 * 1024)
GATEWAY_MAX_IMAGE_PIXELS = env.int("GATEWAY_MAX_IMAGE_PIXELS", default=40_000_000)
# The text kept of one document (a PDF's extracted text, a text file's), before any agent's budget.
GATEWAY_MAX_DOCUMENT_CHARS = env.int("GATEWAY_MAX_DOCUMENT_CHARS", default=500_000)
# An upload no run uses is an orphan after this long (`manage.py clean_files`).
GATEWAY_FILE_ORPHAN_HOURS = env.float("GATEWAY_FILE_ORPHAN_HOURS", default=24.0)
GATEWAY_QUEUE_MAX = env.int("GATEWAY_QUEUE_MAX", default=20)
GATEWAY_DEFAULT_TIMEOUT_MS = env.int("GATEWAY_DEFAULT_TIMEOUT_MS", default=600_000)
GATEWAY_MAX_PAYLOAD = env.int("GATEWAY_MAX_PAYLOAD", default=1024 * 1024)
GATEWAY_MAX_BUFFERED_BYTES = env.int("GATEWAY_MAX_BUFFERED_BYTES", default=8 * 1024 * 1024)
# One reply's text, counted as encoded in a frame; a delta carries it twice (text so far and
# the new part), so the default keeps every event of a run under GATEWAY_MAX_PAYLOAD.
GATEWAY_MAX_REPLY_BYTES = env.int(
    "GATEWAY_MAX_REPLY_BYTES", default=(GATEWAY_MAX_PAYLOAD - min(64 * 1024, GATEWAY_MAX_PAYLOAD // 4)) // 2
)
GATEWAY_TICK_INTERVAL_MS = env.int("GATEWAY_TICK_INTERVAL_MS", default=30_000)
GATEWAY_CONNECT_TIMEOUT_MS = env.int("GATEWAY_CONNECT_TIMEOUT_MS", default=10_000)
# `serve` drops a connection whose first request's headers take longer than this (slowloris).
GATEWAY_HEADER_TIMEOUT_SECONDS = env.float("GATEWAY_HEADER_TIMEOUT_SECONDS", default=10.0)
GATEWAY_RATE_PER_SEC = env.float("GATEWAY_RATE_PER_SEC", default=20.0)
GATEWAY_RATE_BURST = env.int("GATEWAY_RATE_BURST", default=40)

# --- The OpenAI-compatible HTTP API under /v1/ (HTTP-API.md §14) ---------------------
GATEWAY_HTTP_API = env.bool("GATEWAY_HTTP_API", default=True)
# Browser origins allowed to call it (CORS); none by default.
GATEWAY_HTTP_CORS_ORIGINS = env.list("GATEWAY_HTTP_CORS_ORIGINS", default=[])
GATEWAY_HTTP_MAX_BODY = env.int("GATEWAY_HTTP_MAX_BODY", default=20 * 1024 * 1024)
# A request body not all there this long after its headers is dropped (408).
GATEWAY_HTTP_BODY_TIMEOUT_SECONDS = env.float("GATEWAY_HTTP_BODY_TIMEOUT_SECONDS", default=30.0)
# An event stream sends a `: keep-alive` comment when it has been silent this long.
GATEWAY_HTTP_KEEPALIVE_SECONDS = env.float("GATEWAY_HTTP_KEEPALIVE_SECONDS", default=15.0)
# A run of a request with an Idempotency-Key whose client left waits this long for a retry to reattach.
GATEWAY_HTTP_REATTACH_SECONDS = env.float("GATEWAY_HTTP_REATTACH_SECONDS", default=30.0)

GATEWAY_REPAIR_SECONDS = env.float("GATEWAY_REPAIR_SECONDS", default=5.0)
# Re-add connections to their layer groups this often (Redis forgets groups on a restart
# without persistence, and after a day); 0 turns it off.
GATEWAY_GROUP_REFRESH_SECONDS = env.float("GATEWAY_GROUP_REFRESH_SECONDS", default=30.0)
GATEWAY_RECOVERY_SECONDS = env.float("GATEWAY_RECOVERY_SECONDS", default=30.0)
GATEWAY_HEARTBEAT_SECONDS = env.float("GATEWAY_HEARTBEAT_SECONDS", default=5.0)
GATEWAY_DELTA_INTERVAL_MS = env.int("GATEWAY_DELTA_INTERVAL_MS", default=50)
GATEWAY_SHUTDOWN_DRAIN_SECONDS = env.float("GATEWAY_SHUTDOWN_DRAIN_SECONDS", default=5.0)
GATEWAY_STUCK_RUN_SECONDS = env.int("GATEWAY_STUCK_RUN_SECONDS", default=3600)
GATEWAY_DB_THREADS = env.int("GATEWAY_DB_THREADS", default=8)
# How long a run may go on without being able to write (the database away) before it stops and
# ends failed (errorKind "unavailable") once the database is back (chat.runtime.executor).
GATEWAY_RUN_DB_WAIT_SECONDS = env.float("GATEWAY_RUN_DB_WAIT_SECONDS", default=30.0)
# Admin bulk actions act on at most this many rows per request (the commands handle more).
GATEWAY_ADMIN_BULK_LIMIT = env.int("GATEWAY_ADMIN_BULK_LIMIT", default=200)
# The sweep deletes rows of processes that stopped (or last heartbeated) this long ago.
GATEWAY_PROCESS_RETENTION_HOURS = env.float("GATEWAY_PROCESS_RETENTION_HOURS", default=24.0)
# `prune_sessions --older-than-days` below this needs --force.
GATEWAY_PRUNE_MIN_DAYS = env.float("GATEWAY_PRUNE_MIN_DAYS", default=7.0)
GATEWAY_MAX_HELD_ACKS = env.int("GATEWAY_MAX_HELD_ACKS", default=16)
# Authenticated connections one user may hold on one server process; one more is refused (4029).
GATEWAY_MAX_CONNECTIONS_PER_USER = env.int("GATEWAY_MAX_CONNECTIONS_PER_USER", default=64)
# Unrevoked API keys one user may hold (the keys page, the admin and create_api_token refuse one more).
GATEWAY_MAX_API_KEYS_PER_USER = env.int("GATEWAY_MAX_API_KEYS_PER_USER", default=20)
if GATEWAY_MAX_API_KEYS_PER_USER < 1:
    raise ImproperlyConfigured("GATEWAY_MAX_API_KEYS_PER_USER must be at least 1")

# Agent table: id -> {backend, model, ...}. GATEWAY_AGENTS is JSON and is merged
# over the default, so `main` stays the scripted demo agent unless overridden.
# `main` has the built-in demo MCP server (a clock, a calculator, notes: docs/tools.md), started on
# its first tool call; GATEWAY_DEMO_TOOLS=false leaves it out.
DEMO_MCP_SERVER = {
    "command": sys.executable,
    "args": ["-m", "chat.runtime.tools.demo_server"],
    "env": {"AGENTGATE_NOTES_DIR": env.str("AGENTGATE_NOTES_DIR", default=str(BASE_DIR / "notes"))},
    "cwd": str(BASE_DIR),
}
GATEWAY_AGENTS: dict[str, dict[str, Any]] = {"main": {"backend": "scripted", "model": "scripted"}}
if env.bool("GATEWAY_DEMO_TOOLS", default=True):
    GATEWAY_AGENTS["main"]["mcp_servers"] = {"demo": DEMO_MCP_SERVER}
GATEWAY_AGENTS.update(json.loads(env.str("GATEWAY_AGENTS", default="{}") or "{}"))

# --- Usage and budgets (docs/usage.md) ----------------------------------------------
# A budget for every user who has none of their own, created at their first send, e.g.
# {"max_tokens": 1000000, "max_cost_usd": 5, "period": "month"}; {} for none.
GATEWAY_DEFAULT_USER_BUDGET = json.loads(env.str("GATEWAY_DEFAULT_USER_BUDGET", default="{}"))
# How often a process looks whether any budget is enabled at all (a budget saved here is seen at once).
GATEWAY_BUDGET_CHECK_SECONDS = env.float("GATEWAY_BUDGET_CHECK_SECONDS", default=5.0)
# The output a run is reserved for when its agent sets no `max_tokens`.
GATEWAY_BUDGET_OUTPUT_TOKENS = env.int("GATEWAY_BUDGET_OUTPUT_TOKENS", default=1024)
