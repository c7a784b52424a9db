"""Several `manage.py serve` processes on a fresh PostgreSQL database and a Redis channel layer.

Also the checks the multi-process suites share: a row that contradicts itself, and the
rows a connection holds after applying its `sessions.changed` events in order.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.support import services
from tests.support.servers import FAST_ENV, ServerHandle, create_token, manage, start_server

# A cold start imports Django, Channels and Twisted; beside other suites on a 2-core machine that
# has taken over 30 s.
READY_SECONDS = 60.0


@dataclass
class Cluster:
    env: dict[str, str]
    db_url: str
    log_dir: Path
    servers: list[ServerHandle] = field(default_factory=list)

    def token(self, username: str) -> str:
        return create_token(self.env, username)

    def tokens(self, *usernames: str) -> dict[str, str]:
        """A token for each user (created if missing), from one command instead of one each."""
        script = (
            "from sessions_app.tokens import get_or_create_user, issue_token\n"
            f"for name in {list(usernames)!r}:\n"
            "    print(name, issue_token(get_or_create_user(name, create=True), name='test')[1])\n"
        )
        out = manage(self.env, "shell", "-c", script).stdout
        return dict(line.split(" ", 1) for line in out.strip().splitlines()[-len(usernames) :])

    def restart(self, index: int) -> ServerHandle:
        """A new process on the same port as server `index` (after it died)."""
        old = self.servers[index]
        self.servers[index] = start_server(env=self.env, port=old.port, log_dir=self.log_dir)
        self.servers[index].wait_ready(READY_SECONDS)
        return self.servers[index]

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(services._libpq(self.db_url), connect_timeout=10) as conn:
            return conn.execute(sql, args).fetchall()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("server-*.log")))


@contextmanager
def cluster(
    log_dir: Path, processes: int, *, postgres_url: str | None = None, redis_url: str | None = None, **extra: str
) -> Iterator[Cluster]:
    """Start `processes` servers on a fresh database; drop it afterwards.

    On the suite's PostgreSQL and Redis, or on the servers of `postgres_url` (its admin URL) and
    `redis_url` (private instances a test restarts).
    """
    if postgres_url is None or redis_url is None:
        services.require_services()
    admin_url = postgres_url or services.POSTGRES_URL
    db_url = services.create_database(admin_url)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(FAST_ENV)
    env.update(
        {
            "DATABASE_URL": db_url,
            "REDIS_URL": redis_url or services.REDIS_URL,
            "PYTHONUNBUFFERED": "1",
            "REDIS_LAYER_PREFIX": f"agt{uuid.uuid4().hex[:8]}",
            **extra,
        }
    )
    c = Cluster(env, db_url, log_dir)
    try:
        manage(env, "migrate", "--noinput", "-v0")
        c.servers = [start_server(env=env, log_dir=log_dir) for _ in range(processes)]
        for s in c.servers:
            s.wait_ready(READY_SECONDS)
        yield c
    except BaseException:
        failed = True
        raise
    else:
        failed = False
    finally:
        for s in c.servers:
            s.stop()
        try:
            services.drop_database(db_url, admin_url)
        except Exception:
            # A test that failed while its private server was stopped: its own failure is
            # the one to see (the server and its database go away with the test anyway).
            if not failed:
                raise


def contradictions(row: dict[str, Any]) -> list[str]:
    """What a session row says against itself (§7): running iff an active run is named."""
    found = []
    running = row.get("status") == "running"
    if running != bool(row.get("hasActiveRun")):
        found.append("status vs hasActiveRun")
    if bool(row.get("hasActiveRun")) != bool(row.get("activeRunIds")):
        found.append("hasActiveRun vs activeRunIds")
    if running and not row.get("lastRunId"):
        found.append("running without lastRunId")
    return found


def held_rows(events: list[dict[str, Any]], seed: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The rows a client holds: `seed` (a sessions.list), then every sessions.changed in order.

    Within one session the highest `version` wins; a row created later under the same key is
    another session (a deleted key used again), whatever its version.
    """
    rows: dict[str, dict[str, Any]] = {}

    def apply(row: dict[str, Any]) -> None:
        known = rows.get(row["key"])
        if (
            known is None
            or row["createdAt"] > known["createdAt"]
            or (row["createdAt"] == known["createdAt"] and row["version"] >= known["version"])
        ):
            rows[row["key"]] = row

    for row in seed or []:
        apply(row)
    for e in events:
        if e["event"] == "sessions.changed":
            apply(e["payload"]["session"])
    return {k: v for k, v in rows.items() if not v.get("deleted")}
