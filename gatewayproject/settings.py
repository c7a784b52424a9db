"""Settings for agentgate, read from the environment with django-environ.

Every knob has an embedded default so that `make run` works on a fresh machine:
SQLite in the repo folder, the in-memory channel layer and the scripted agent.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import environ
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
    "sessions_app.apps.SessionsAppConfig",
    "chat.apps.ChatConfig",
]

MIDDLEWARE = [
    "gatewayproject.logs.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "sessions_app.audit.OperatorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

# --- Database ----------------------------------------------------------------
# Async code reaches the ORM through the executor's fixed pool of worker threads
# (chat.db), so a connection kept per worker thread is reused, not leaked.
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
        "timeout": env.float("DB_POOL_TIMEOUT_SECONDS", default=30.0),
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
# Seconds to wait for a database connection before calling it down (commands, /readyz, /metrics).
DB_CONNECT_TIMEOUT_SECONDS = env.float("DB_CONNECT_TIMEOUT_SECONDS", default=3.0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", max(1, int(DB_CONNECT_TIMEOUT_SECONDS))
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer -------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
GATEWAY_CHANNEL_CAPACITY = env.int("GATEWAY_CHANNEL_CAPACITY", default=500)
# redis-py 8 reads with a 5-second socket timeout by default, the length of channels-redis's
# idle BZPOPMIN: the read lost that race and idle consumers were closed with 1011
# (channels_redis#422). The socket timeout must stay above 5 s; a finite one still notices a
# silently dead Redis. Retries with backoff ride over a Redis restart; the pool waits for a
# free connection instead of failing a burst of connects (chat.layers).
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
            "BACKEND": "chat.layers.GatewayRedisChannelLayer",
            "CONFIG": {
                "hosts": [{
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
                }],
                "capacity": GATEWAY_CHANNEL_CAPACITY,
                "prefix": env.str("REDIS_LAYER_PREFIX", default="agentgate"),
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": GATEWAY_CHANNEL_CAPACITY},
        }
    }

# --- Auth, i18n, static ----------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
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
    },
}

# --- Gateway limits (PROTOCOL.md §4, §9, §10) -------------------------------------
GATEWAY_VERSION = "0.1.0"
GATEWAY_MAX_MESSAGE_CHARS = env.int("GATEWAY_MAX_MESSAGE_CHARS", default=32000)
GATEWAY_MAX_ATTACHMENTS = env.int("GATEWAY_MAX_ATTACHMENTS", default=4)
GATEWAY_MAX_ATTACHMENT_BYTES = env.int("GATEWAY_MAX_ATTACHMENT_BYTES", default=5 * 1024 * 1024)
GATEWAY_QUEUE_MAX = env.int("GATEWAY_QUEUE_MAX", default=20)
GATEWAY_DEFAULT_TIMEOUT_MS = env.int("GATEWAY_DEFAULT_TIMEOUT_MS", default=600_000)
GATEWAY_MAX_PAYLOAD = env.int("GATEWAY_MAX_PAYLOAD", default=1024 * 1024)
GATEWAY_MAX_BUFFERED_BYTES = env.int("GATEWAY_MAX_BUFFERED_BYTES", default=8 * 1024 * 1024)
GATEWAY_TICK_INTERVAL_MS = env.int("GATEWAY_TICK_INTERVAL_MS", default=30_000)
GATEWAY_CONNECT_TIMEOUT_MS = env.int("GATEWAY_CONNECT_TIMEOUT_MS", default=10_000)
GATEWAY_RATE_PER_SEC = env.float("GATEWAY_RATE_PER_SEC", default=20.0)
GATEWAY_RATE_BURST = env.int("GATEWAY_RATE_BURST", default=40)
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
# Admin bulk actions act on at most this many rows per request (the commands handle more).
GATEWAY_ADMIN_BULK_LIMIT = env.int("GATEWAY_ADMIN_BULK_LIMIT", default=200)
# The sweep deletes rows of processes that stopped (or last heartbeated) this long ago.
GATEWAY_PROCESS_RETENTION_HOURS = env.float("GATEWAY_PROCESS_RETENTION_HOURS", default=24.0)
# `prune_sessions --older-than-days` below this needs --force.
GATEWAY_PRUNE_MIN_DAYS = env.float("GATEWAY_PRUNE_MIN_DAYS", default=7.0)
GATEWAY_MAX_HELD_ACKS = env.int("GATEWAY_MAX_HELD_ACKS", default=16)

# Agent table: id -> {backend, model, ...}. GATEWAY_AGENTS is JSON and is merged
# over the default, so `main` stays the scripted demo agent unless overridden.
GATEWAY_AGENTS: dict[str, dict[str, Any]] = {"main": {"backend": "scripted", "model": "scripted"}}
GATEWAY_AGENTS.update(json.loads(env.str("GATEWAY_AGENTS", default="{}") or "{}"))
