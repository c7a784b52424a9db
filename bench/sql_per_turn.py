"""SQL statements one turn and one resend cost, by kind and by the function that issued them.

Runs the ASGI application in this process (Channels' WebsocketCommunicator) on a
fresh database, counts every statement on every database connection (an
`execute_wrapper` installed on each connection as it is created), and prints the
counts for: a new run in an existing session (chat.send -> ack -> final, plus the
statements issued after the final within a short settle time), and a resend of the
finished key. The process's periodic loops (heartbeat, repair) are slowed down so
that they do not land in the counts.

The database is a fresh SQLite file, or with `--database-url` a fresh database created on
that PostgreSQL server for the run and dropped after it. On PostgreSQL it also counts what
goes over the wire: every round trip to the server (statements, BEGIN, COMMIT, the pool's
check of a connection it hands out), through psycopg's pure-Python libpq wrapper when libpq
is installed (the counts are the same with the C one; only they cannot be taken there).

Statements count BEGIN (on PostgreSQL from the wire, where the driver sends it) and not COMMIT,
on both databases alike. Transactions are the commits plus the writes made in autocommit.

    .venv/bin/python bench/sql_per_turn.py [--turns 5] [--trace]
        [--database-url postgres://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes.util
import os
import sys
import tempfile
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
WRITES = ("INSERT", "UPDATE", "DELETE")

Statement = tuple[str, str, str]  # (kind, issuing function, thread name)


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements: list[Statement] = []
        self.commits = 0
        self.autocommit_writes = 0
        self.wire: list[str] = []  # PostgreSQL: what each round trip was (kind)
        self.trace: list[tuple[str, str, str]] = []  # (thread, sql, call chain)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        kind = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
        where = "?"
        chain: list[str] = []
        for frame in traceback.extract_stack(limit=60):
            rel = frame.filename.replace(str(ROOT) + os.sep, "")
            if rel.startswith(("chat/", "sessions_app/")):
                where = f"{rel}:{frame.name}"
                chain.append(f"{Path(rel).stem}.{frame.name}")
        thread = threading.current_thread().name
        with self.lock:
            self.statements.append((kind, where, thread))
            self.trace.append((thread, " ".join(sql.split())[:140], " > ".join(chain[-5:])))
            if kind in WRITES and context["connection"].get_autocommit():
                self.autocommit_writes += 1
        return execute(sql, params, many, context)

    def committed(self) -> None:
        with self.lock:
            self.commits += 1

    def sent(self, kind: str) -> None:
        with self.lock:
            self.wire.append(kind)

    def take(self) -> tuple[list[Statement], int, list[str], list[tuple[str, str, str]]]:
        with self.lock:
            taken = self.statements, self.commits + self.autocommit_writes, self.wire, self.trace
            self.statements, self.commits, self.autocommit_writes, self.wire, self.trace = [], 0, 0, [], []
        return taken


counter = Counter()


def show(title: str, taken: tuple[list[Statement], int, list[str], list[tuple[str, str, str]]], per: int) -> None:
    statements, transactions, wire, trace = taken
    # PostgreSQL's BEGIN is sent by the driver, not through a cursor: counted from the wire, so that
    # both databases count statements alike (BEGIN in, COMMIT out)
    statements = statements + [("BEGIN", "(driver)", "")] * wire.count("BEGIN")
    print(f"{title}: {len(statements) / per:.1f} statements each ({len(statements)} over {per})")
    for kind, n in collections.Counter(s[0] for s in statements).most_common():
        print(f"    {kind:<10} {n / per:5.1f}")
    print(f"  transactions: {transactions / per:.1f}")
    if wire:
        print(f"  round trips to PostgreSQL: {len(wire) / per:.1f}")
        for kind, n in collections.Counter(wire).most_common():
            print(f"    {kind:<10} {n / per:5.1f}")
    print("  by issuing function:")
    for where, n in collections.Counter(s[1] for s in statements).most_common(12):
        print(f"    {n / per:5.1f}  {where}")
    if os.environ.get("SQL_PER_TURN_TRACE") and per == 1:
        print("  in order:")
        for thread, sql, chain in trace:
            print(f"    [{thread}] {sql}\n        {chain}")


async def measure(turns: int, trace: bool) -> None:
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth import get_user_model

    from chat.base.db import db_write
    from gatewayproject.asgi import application
    from sessions_app.tokens import issue_token
    from tests.support.communicator import Client

    def make_token() -> str:
        user = get_user_model().objects.create_user(username="sqlcount")
        return issue_token(user)[1]

    token = await db_write(make_token)
    comm = WebsocketCommunicator(application, "/ws/gateway")
    connected, _ = await comm.connect()
    assert connected
    client = Client(comm)
    await client._pump_one(5)
    await client.ok(
        "connect",
        {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "sql", "version": "1"}, "auth": {"token": token}},
    )
    await client.ok("sessions.subscribe", {})
    message = "[[tick:0]] the quick brown fox jumps"
    await client.ok("chat.send", {"sessionKey": "s", "idempotencyKey": "warm", "message": message})
    await client.wait_terminal("warm", 10)
    await client.drain(0.3)
    counter.take()
    if trace:
        os.environ["SQL_PER_TURN_TRACE"] = "1"
        turns = 1
    for i in range(turns):
        ack = await client.ok("chat.send", {"sessionKey": "s", "idempotencyKey": f"k{i}", "message": message})
        assert ack["status"] == "started", ack
        await client.wait_terminal(f"k{i}", 10)
        await client.drain(0.3)
    show("new run (send -> final, in an existing session)", counter.take(), turns)
    for _ in range(turns):
        ack = await client.ok("chat.send", {"sessionKey": "s", "idempotencyKey": "k0", "message": message})
        assert ack["status"] == "ok", ack
    await client.drain(0.3)
    show("resend of a finished key", counter.take(), turns)
    await client.close()


def _count_round_trips() -> bool:
    """Count every message psycopg sends to the server (needs libpq for psycopg's Python wrapper)."""
    if ctypes.util.find_library("pq") is None:
        return False
    os.environ["PSYCOPG_IMPL"] = "python"  # before psycopg is imported
    from psycopg import pq
    from psycopg.pq import pq_ctypes

    def kind_of(command: bytes) -> str:
        text = bytes(command).decode(errors="replace").strip()
        return text.split(None, 1)[0].upper() if text else "(check)"  # the pool's empty statement

    def counted(name: str, kind: Any) -> None:
        real = getattr(pq_ctypes.PGconn, name)

        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.pipeline_status == pq.PipelineStatus.OFF:
                counter.sent(kind(args))
            return real(self, *args, **kwargs)

        setattr(pq_ctypes.PGconn, name, send)

    for name in ("send_query", "send_query_params", "exec_", "exec_params"):
        counted(name, lambda args: kind_of(args[0]))
    for name in ("send_query_prepared", "exec_prepared"):
        counted(name, lambda args: "(prepared)")
    for name in ("send_prepare", "prepare"):
        counted(name, lambda args: "(prepare)")
    real_sync = pq_ctypes.PGconn.pipeline_sync

    def sync(self: Any) -> Any:
        counter.sent("(pipeline)")
        return real_sync(self)

    pq_ctypes.PGconn.pipeline_sync = sync  # type: ignore[method-assign]
    return True


def _libpq(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--trace", action="store_true", help="one turn, every statement in order with its callers")
    parser.add_argument(
        "--database-url", help="a PostgreSQL server (any database on it) to create this run's database on"
    )
    args = parser.parse_args()
    admin_url = args.database_url
    created: str | None = None
    if admin_url:
        if not admin_url.startswith(("postgres://", "postgresql://")):
            parser.error("--database-url must be a PostgreSQL URL")
        _count_round_trips()
        import psycopg

        name = f"agentgate_sql_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created = urlparse(admin_url)._replace(path=f"/{name}").geturl()
        url = created
    else:
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='agentgate-sql-')) / 'sql.sqlite3'}"
    os.environ.update(
        {
            "DATABASE_URL": url,
            "REDIS_URL": "",
            "GATEWAY_RATE_PER_SEC": "100000",
            "GATEWAY_HEARTBEAT_SECONDS": "3600",
            "GATEWAY_REPAIR_SECONDS": "3600",
            "GATEWAY_LOG_LEVEL": "WARNING",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewayproject.settings")
    sys.path.insert(0, str(ROOT))
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections
        from django.db.backends.base.base import BaseDatabaseWrapper
        from django.db.backends.signals import connection_created

        call_command("migrate", "--noinput", verbosity=0)
        real_commit = BaseDatabaseWrapper.commit

        def commit(self: Any) -> None:
            counter.committed()
            real_commit(self)

        BaseDatabaseWrapper.commit = commit  # type: ignore[method-assign]

        def install(sender: Any, connection: Any, **kwargs: Any) -> None:
            if counter not in connection.execute_wrappers:  # (a pooled connection "connects" at each checkout)
                connection.execute_wrappers.append(counter)

        connection_created.connect(install)
        connections.close_all()  # the next connections (migrate's one included) are counted
        print(f"database: {connections['default'].vendor}")
        asyncio.run(measure(args.turns, args.trace))
    finally:
        if created is not None:
            from django.db import connections

            connections.close_all()
            pool = getattr(connections["default"], "pool", None)
            if pool is not None:
                pool.close()
            import psycopg

            with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=10) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{urlparse(created).path.lstrip("/")}" WITH (FORCE)')


if __name__ == "__main__":
    main()
