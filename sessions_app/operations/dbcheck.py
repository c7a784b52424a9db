"""A quick, bounded "is the database there?" that never waits for the connection pool.

Django's PostgreSQL pool waits up to DB_POOL_TIMEOUT_SECONDS (30 s) for a connection
when the server is down; commands, `/readyz` and `/metrics` must answer long before
that. `probe_database` opens one throwaway connection with a connect timeout of
DB_CONNECT_TIMEOUT_SECONDS and runs `SELECT 1` under a statement timeout as long.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from django.conf import settings
from django.db import connections


class DatabaseUnreachable(Exception):
    """The database did not answer within the connect timeout."""


def probe_database(alias: str = "default", timeout: float | None = None) -> None:
    """Raise DatabaseUnreachable (one readable line) unless the database answers `SELECT 1`."""
    timeout = float(settings.DB_CONNECT_TIMEOUT_SECONDS if timeout is None else timeout)
    conn = connections[alias]
    vendor = conn.vendor
    try:
        if vendor == "postgresql":
            import psycopg  # only on PostgreSQL: a SQLite deployment need not have it

            params: dict[str, Any] = {
                k: v for k, v in conn.get_connection_params().items() if k not in ("context", "cursor_factory")
            }
            params["connect_timeout"] = max(1, round(timeout))
            # A server that accepts connections but cannot run a statement (recovering, its
            # disk stuck) fails the probe within the timeout instead of holding it.
            limit = f"-c statement_timeout={max(1, int(timeout * 1000))}"
            params["options"] = f"{params.get('options') or ''} {limit}".strip()
            with psycopg.connect(**params) as raw:
                raw.execute("SELECT 1")
        elif vendor == "sqlite":
            name = str(conn.settings_dict["NAME"])
            if conn.is_in_memory_db():  # type: ignore[attr-defined]
                return
            with sqlite3.connect(f"file:{name}?mode=rw", uri=True, timeout=timeout) as raw:
                raw.execute("SELECT 1")
        else:
            conn.ensure_connection()
    except DatabaseUnreachable:
        raise
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnreachable(f"database unreachable ({vendor}): {detail}"[:400]) from exc
