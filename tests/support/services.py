"""PostgreSQL and Redis for the service-backed suites: reachability, fresh databases.

Without the services these suites skip and say why; CI sets AGENTGATE_REQUIRE_SERVICES=1
so that a missing service fails the run instead of silently skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

POSTGRES_URL = os.environ.get("AGENTGATE_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRED = os.environ.get("AGENTGATE_REQUIRE_SERVICES") == "1"


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def postgres_available() -> bool:
    if not _reachable(POSTGRES_URL, 5432):
        return False
    try:
        import psycopg

        with psycopg.connect(_libpq(POSTGRES_URL), connect_timeout=2) as conn:
            conn.execute("select 1")
        return True
    except Exception:
        return False


def redis_available() -> bool:
    if not _reachable(REDIS_URL, 6379):
        return False
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping())
    except Exception:
        return False


def require_redis() -> None:
    """Skip (or, in CI, fail) unless Redis answers."""
    if not redis_available():
        reason = f"needs Redis at {REDIS_URL} (not reachable)"
        if REQUIRED:
            pytest.fail(reason + "; AGENTGATE_REQUIRE_SERVICES=1")
        pytest.skip(reason)


def require_services() -> None:
    """Skip (or, in CI, fail) unless both PostgreSQL and Redis answer."""
    missing = []
    if not postgres_available():
        missing.append(f"PostgreSQL at {POSTGRES_URL}")
    if not redis_available():
        missing.append(f"Redis at {REDIS_URL}")
    if missing:
        reason = "service-backed test needs " + " and ".join(missing) + " (not reachable)"
        if REQUIRED:
            pytest.fail(reason + "; AGENTGATE_REQUIRE_SERVICES=1")
        pytest.skip(reason)


def _libpq(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def create_database() -> str:
    """Create an empty database; return its URL."""
    import psycopg

    name = f"agentgate_it_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parsed = urlparse(POSTGRES_URL)
    return parsed._replace(path=f"/{name}").geturl()


def drop_database(url: str) -> None:
    import psycopg

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class RedisProcess:
    """A throwaway `redis-server` without persistence: a restart forgets every group."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                import redis

                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
