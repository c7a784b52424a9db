"""Several server processes on PostgreSQL + Redis (channels-redis): the scale-out configuration.

Skipped, with the reason, when PostgreSQL or Redis is not reachable.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import services
from tests.support.db import rows_from_events, send_params, terminal_events
from tests.support.servers import FAST_ENV, ServerHandle, create_token, manage, start_server, ws_client

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    services.require_services()
    db_url = services.create_database()
    log_dir: Path = tmp_path_factory.mktemp("scaleout")
    import os

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(FAST_ENV)
    env.update(
        {
            "DATABASE_URL": db_url,
            "REDIS_URL": services.REDIS_URL,
            "PYTHONUNBUFFERED": "1",
            "REDIS_LAYER_PREFIX": f"agt{uuid.uuid4().hex[:8]}",
        }
    )
    manage(env, "migrate", "--noinput", "-v0")
    token = create_token(env, "carol")
    servers = [start_server(env=env, log_dir=log_dir) for _ in range(2)]
    for s in servers:
        s.wait_ready()
    yield {"env": env, "token": token, "servers": servers, "db_url": db_url, "log_dir": log_dir}
    for s in servers:
        s.stop()
    services.drop_database(db_url)


def db_query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(services._libpq(db_url)) as conn:
        return conn.execute(sql, args).fetchall()


async def test_events_cross_processes_and_rows_agree(cluster):
    a_srv, b_srv = cluster["servers"]
    key = f"x{uuid.uuid4().hex[:6]}"
    async with ws_client(a_srv, cluster["token"]) as a, ws_client(b_srv, cluster["token"]) as b:
        ack = await a.ok("chat.send", send_params(key, "across two processes [[tick:30]]", "r1"))
        assert ack["status"] == "started"
        for c in (a, b):
            ev = await c.wait_event(
                lambda e: e["event"] == "chat" and e["payload"]["runId"] == "r1" and e["payload"]["state"] == "final",
                10,
            )
            assert ev["payload"]["message"]["content"][0]["text"] == "echo: across two processes"
        await asyncio.gather(a.drain(0.5), b.drain(0.5))
        fresh = {r["key"]: r for r in (await b.ok("sessions.list", {"limit": 500}))["sessions"]}
        for c in (a, b):
            rows = rows_from_events(c.events)
            assert rows[f"agent:main:{key}"] == fresh[f"agent:main:{key}"]


async def test_abort_on_one_process_stops_run_on_the_other(cluster):
    a_srv, b_srv = cluster["servers"]
    key = f"x{uuid.uuid4().hex[:6]}"
    async with ws_client(a_srv, cluster["token"]) as a, ws_client(b_srv, cluster["token"]) as b:
        # 60 words at 200 ms: long enough that a loaded machine's slow abort still finds the task
        # running (a run that ends on its own first is never cancelled, and has no cancel_ms)
        words = " ".join(f"w{i}" for i in range(60))
        await a.ok("chat.send", send_params(key, f"{words} [[tick:200]]", "r1"))
        await b.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("state") == "delta", 10)
        res = await b.ok("chat.abort", {"sessionKey": key, "runId": "r1"})
        assert res == {"aborted": True, "runIds": ["r1"]}
        for c in (a, b):
            await c.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("state") == "aborted", 10)
        deadline = time.monotonic() + 5
        cancel_ms = None
        while time.monotonic() < deadline and cancel_ms is None:
            ((cancel_ms,),) = db_query(
                cluster["db_url"],
                "select r.cancel_ms from sessions_app_run r join sessions_app_chatsession s "
                "on s.id = r.session_id where r.run_id = %s and s.key = %s",
                "r1",
                f"agent:main:{key}",
            )
            await asyncio.sleep(0.1)
        assert cancel_ms is not None, "the owning process never cancelled the run's task"
        await asyncio.gather(a.drain(1.0), b.drain(1.0))
        for c in (a, b):
            states = [
                p["state"]
                for p in (e["payload"] for e in c.events if e["event"] == "chat")
                if p["runId"] == "r1" and p["sessionKey"] == f"agent:main:{key}"
            ]
            assert states.count("aborted") == 1 and "final" not in states


async def test_same_key_on_two_processes_makes_one_run(cluster):
    a_srv, b_srv = cluster["servers"]
    key = f"x{uuid.uuid4().hex[:6]}"
    async with ws_client(a_srv, cluster["token"]) as a, ws_client(b_srv, cluster["token"]) as b:
        for i in range(5):
            rid = f"race{i}"
            ra, rb = await asyncio.gather(
                a.call("chat.send", send_params(key, f"m{i}", rid)), b.call("chat.send", send_params(key, f"m{i}", rid))
            )
            statuses = sorted([ra["payload"]["status"], rb["payload"]["status"]])
            assert statuses in (
                ["in_flight", "started"],
                ["in_flight", "queued"],
                ["ok", "started"],
                ["ok", "queued"],
            ), statuses
        for i in range(5):
            await a.wait_event(
                lambda e, i=i: (
                    e["event"] == "chat" and e["payload"]["runId"] == f"race{i}" and e["payload"]["state"] == "final"
                ),
                10,
            )
        ((count,),) = db_query(
            cluster["db_url"],
            "select count(*) from sessions_app_run r join sessions_app_chatsession s on s.id = r.session_id "
            "where s.key = %s",
            f"agent:main:{key}",
        )
        assert count == 5
        assert all(len(terminal_events(a.events, f"race{i}")) == 1 for i in range(5))


async def test_kill_9_owner_then_other_process_recovers(cluster, tmp_path):
    env = cluster["env"]
    victim: ServerHandle = start_server(env=env, log_dir=cluster["log_dir"])
    victim.wait_ready()
    survivor = cluster["servers"][0]
    key = f"x{uuid.uuid4().hex[:6]}"
    async with ws_client(survivor, cluster["token"]) as watcher:
        async with ws_client(victim, cluster["token"]) as v:
            await v.ok("chat.send", send_params(key, "[[hang]]", "doomed"))
            await v.ok("chat.send", send_params(key, "next in line", "after"))
        victim.kill()
        started = time.monotonic()
        changed = await watcher.wait_event(
            lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "run.interrupted", 15
        )
        assert time.monotonic() - started < float(FAST_ENV["GATEWAY_RECOVERY_SECONDS"]) + 3
        assert changed["payload"]["session"]["key"] == f"agent:main:{key}"
        ev = await watcher.wait_event(
            lambda e: e["event"] == "chat" and e["payload"]["runId"] == "doomed" and e["payload"]["state"] == "error",
            10,
        )
        assert ev["payload"]["errorKind"] == "interrupted"
        # the queued run is handed to a live process and completes
        await watcher.wait_event(
            lambda e: e["event"] == "chat" and e["payload"]["runId"] == "after" and e["payload"]["state"] == "final", 15
        )
        row = next(r for r in (await watcher.ok("sessions.list"))["sessions"] if r["key"] == f"agent:main:{key}")
        assert row["status"] == "done" and not row["hasActiveRun"]
