"""PostgreSQL and Redis for the service-backed suites: reachability, fresh databases, and
private instances of both (`RedisProcess`, `PostgresProcess`) that a test may kill and restart.

Without the services these suites skip and say why; CI sets AGENTGATE_REQUIRE_SERVICES=1
so that a missing service fails the run instead of silently skipping.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from chat.runtime.tools import leash

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


def require_postgres() -> None:
    """Skip (or, in CI, fail) unless PostgreSQL answers."""
    if not postgres_available():
        reason = f"needs PostgreSQL at {POSTGRES_URL} (not reachable)"
        if REQUIRED:
            pytest.fail(reason + "; AGENTGATE_REQUIRE_SERVICES=1")
        pytest.skip(reason)


def rerun_on_postgres(test_file: str, name: str, passed: int, **extra_env: str) -> None:
    """Run `test_file` again in a child pytest whose database is PostgreSQL (a database of its own,
    `name` in its name), all but its tests marked `postgres`, and check that `passed` tests pass.
    Inside that child run this skips: the child is the check."""
    if os.environ.get("AGENTGATE_CHILD_SUITE"):
        pytest.skip("already inside the service-backed child run")
    require_postgres()
    base = urlparse(POSTGRES_URL)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        {
            # pytest-django creates (and drops) test_<name> next to this database name
            "DATABASE_URL": base._replace(path=f"/agentgate_{name}_{uuid.uuid4().hex[:8]}").geturl(),
            "AGENTGATE_CHILD_SUITE": "1",
            "AGENTGATE_EXPECT_VENDOR": "postgresql",
            **extra_env,
        }
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test_file]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [*command, "-k", "not postgres"], cwd=root, env=env, capture_output=True, text=True, timeout=280
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0 and f"{passed} passed" in proc.stdout, tail


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


def create_database(admin_url: str = POSTGRES_URL) -> str:
    """Create an empty database on the server of `admin_url`; return its URL."""
    import psycopg

    name = f"agentgate_it_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parsed = urlparse(admin_url)
    return parsed._replace(path=f"/{name}").geturl()


def drop_database(url: str, admin_url: str = POSTGRES_URL) -> None:
    import psycopg

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def require_programs(found: dict[str, object]) -> None:
    """Skip (or, in CI, fail) unless every server program named was found (its path, or None)."""
    missing = [name for name, path in found.items() if not path]
    if missing:
        reason = f"needs {', '.join(missing)} installed, to run private instances that it restarts"
        if REQUIRED:
            pytest.fail(reason + "; AGENTGATE_REQUIRE_SERVICES=1")
        pytest.skip(reason)


# Private servers listen on ports below the kernel's ephemeral range, so that no outgoing
# connection and no free port the kernel hands another test is handed a port a server let go of while
# it restarts; a lock file per port keeps the suite's parallel workers off each other's.
_PRIVATE_PORTS = range(20000, 32000)


def leashed(command: list[str], python: str = sys.executable) -> list[str]:
    """`command` under the project's launcher (chat/runtime/tools/leash.py): the kernel kills it
    when the thread that started it ends, so a private server never outlives its test run."""
    return leash.command_line(command, python)


def leash_env() -> dict[str, str]:
    return {**os.environ, leash.PARENT_ENV: str(os.getpid())}


class _PortLease:
    """A port below the ephemeral range, free now, and reserved against the suite's other workers."""

    def __init__(self) -> None:
        rng = random.Random()
        for _ in range(200):
            port = rng.choice(_PRIVATE_PORTS)
            # (the files stay: removing one another worker has open would let two hold a port)
            folder = Path(tempfile.gettempdir()) / "agentgate-ports"
            folder.mkdir(exist_ok=True)
            lock = open(folder / f"{port}.lock", "a")  # noqa: SIM115  # held for the server's life
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    lock.close()
                    continue
            self.port, self._lock = port, lock
            return
        raise RuntimeError("no free private port")

    def release(self) -> None:
        self._lock.close()


class RedisProcess:
    """A throwaway `redis-server` without persistence: a restart forgets every group.

    Started from the calling thread (keep it one that lives as long as the test: the kernel
    kills the server when that thread ends), on a reserved port it keeps over restarts.
    """

    def __init__(self, directory: Path) -> None:
        self.lease = _PortLease()
        self.port = self.lease.port
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def spawn(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            leashed([*command, "--dir", str(self.directory)]),
            env=leash_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_ready(self) -> None:
        import redis

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def destroy(self) -> None:
        self.kill()
        self.lease.release()


def postgres_bindir() -> Path | None:
    """Where PostgreSQL's server programs are: `pg_config --bindir`, the PATH, or Debian's versioned folders."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10).stdout
            candidates.append(Path(out.strip()))
    if shutil.which("pg_ctl") is not None:
        candidates.append(Path(str(shutil.which("pg_ctl"))).parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return next((c for c in candidates if (c / "postgres").exists() and (c / "initdb").exists()), None)


class PostgresProcess:
    """A throwaway PostgreSQL cluster, stopped (immediate) and started at will.

    `postgres` runs as a direct child under the project's launcher (no daemon: it dies with the
    test, `leashed`), and listens only on a Unix socket in its own folder: a restart cannot race
    another test for a TCP port. The folder is `directory`; as root, PostgreSQL runs as the
    `postgres` user, which cannot reach pytest's private tmp_path, so the folder is a temporary
    one that user owns (removed by `destroy`). Nothing that user runs is read from the checkout,
    which it may not be able to read either (a private folder, a home directory): the system
    python3 runs the launcher from its source (`leash.command_line`), in that folder.
    """

    PORT = 5432  # only names the socket file in the private folder

    def __init__(self, bindir: Path, directory: Path) -> None:
        self.bindir = bindir
        self.as_user: dict[str, Any] = {}
        self.python = sys.executable
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root, and there is no `postgres` user to run PostgreSQL as")
            python = shutil.which("python3", path="/usr/bin:/bin")
            if python is None:
                pytest.skip("running as root, and there is no system python3 for the `postgres` user")
            self.python = python
            self.base = Path(tempfile.mkdtemp(prefix="agentgate-pg-"))
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self.as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        else:
            self.base = directory / "pg"
            self.base.mkdir()
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.port = self.PORT
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@/postgres?host={self.base}&port={self.port}"

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
            **self.as_user,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "-N")

    def spawn(self) -> None:
        """Start on the same data folder (after a stop: crash recovery, then accepting).

        From the calling thread: keep it one that lives as long as the test (see `leashed`).
        """
        command = [
            str(self.bindir / "postgres"),
            *("-D", str(self.data), "-p", str(self.port), "-k", str(self.base)),
            *("-c", "listen_addresses="),
            # no fsync (the machine does not crash here), but every commit reaches the server's WAL
            # before it is acknowledged: an immediate stop must lose nothing that was committed
            *("-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=100"),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                leashed(command, self.python),
                env=leash_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                **self.as_user,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}):\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(psycopg.Error):
                with psycopg.connect(_libpq(self.admin_url), connect_timeout=2) as conn:
                    conn.execute("select 1")
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not start:\n{self.log.read_text()[-2000:]}")

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def stop(self) -> None:
        """As a crash would: an immediate shutdown (SIGQUIT: connections dropped, no checkpoint)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        shutil.rmtree(self.base, ignore_errors=True)
