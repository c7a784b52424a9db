"""SQL statements one turn and one resend cost, by kind and by the function that issued them.

Runs the ASGI application in this process (Channels' WebsocketCommunicator) on a
fresh SQLite file, counts every statement on every database connection (an
`execute_wrapper` installed on each connection as it is created), and prints the
counts for: a new run in an existing session (chat.send -> ack -> final, plus the
statements issued after the final within a short settle time), and a resend of the
finished key. The process's periodic loops (heartbeat, repair) are slowed down so
that they do not land in the counts.

    .venv/bin/python bench/sql_per_turn.py [--turns 5]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Statement = tuple[str, str, str]  # (kind, issuing function, thread name)


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements: list[Statement] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        kind = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
        where = "?"
        for frame in reversed(traceback.extract_stack(limit=40)):
            rel = frame.filename.replace(str(ROOT) + os.sep, "")
            if rel.startswith(("chat/", "sessions_app/")):
                where = f"{rel}:{frame.name}"
                break
        with self.lock:
            self.statements.append((kind, where, threading.current_thread().name))
        return execute(sql, params, many, context)

    def take(self) -> list[Statement]:
        with self.lock:
            taken, self.statements = self.statements, []
        return taken


def show(title: str, statements: list[Statement], per: int) -> None:
    print(f"{title}: {len(statements) / per:.1f} statements each ({len(statements)} over {per})")
    for kind, n in collections.Counter(s[0] for s in statements).most_common():
        print(f"    {kind:<10} {n / per:5.1f}")
    print("  by issuing function:")
    for where, n in collections.Counter(s[1] for s in statements).most_common(12):
        print(f"    {n / per:5.1f}  {where}")


async def measure(turns: int) -> None:
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth import get_user_model

    from chat.runtime.db import db_write
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


counter = Counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agentgate-sql-"))
    os.environ.update(
        {
            "DATABASE_URL": f"sqlite:///{tmp / 'sql.sqlite3'}",
            "REDIS_URL": "",
            "GATEWAY_RATE_PER_SEC": "100000",
            "GATEWAY_HEARTBEAT_SECONDS": "3600",
            "GATEWAY_REPAIR_SECONDS": "3600",
            "GATEWAY_LOG_LEVEL": "WARNING",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewayproject.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db.backends.signals import connection_created

    call_command("migrate", "--noinput", verbosity=0)

    def install(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(counter)

    connection_created.connect(install)
    asyncio.run(measure(args.turns))


if __name__ == "__main__":
    main()
