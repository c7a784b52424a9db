"""Budgets under a real race: two server processes on PostgreSQL + Redis, one user sending 50 runs at once
through both against a budget that fits 10 reservations, and kill -9 of a process mid-call.

Skipped, with the reason, when PostgreSQL or Redis is not reachable.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import services
from tests.support.cluster import cluster as two_processes
from tests.support.db import send_params
from tests.support.servers import ServerHandle, start_server, ws_client

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

OUTPUT_CAP = 20
MESSAGE = "[[tick:30]] a b c d e"  # 20 characters: 5 tokens of prompt, counted from text
RESERVATION = 5 + OUTPUT_CAP


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    log_dir: Path = tmp_path_factory.mktemp("budgets")
    with two_processes(
        log_dir,
        2,
        GATEWAY_BUDGET_OUTPUT_TOKENS=str(OUTPUT_CAP),
        GATEWAY_BUDGET_CHECK_SECONDS="0",  # a budget made by this test is seen at once
    ) as c:
        token = c.token("dana")
        yield {"env": c.env, "token": token, "servers": c.servers, "db_url": c.db_url, "log_dir": log_dir}


def db(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(services._libpq(db_url), autocommit=True) as conn:
        cursor = conn.execute(sql, args)
        return cursor.fetchall() if cursor.description else []


def new_budget(db_url: str, max_tokens: int) -> int:
    db(db_url, "UPDATE sessions_app_budget SET enabled = false")
    ((pk,),) = db(
        db_url,
        "INSERT INTO sessions_app_budget (name, scope, user_id, agent_id, period, max_tokens, used_tokens,"
        " used_cost_micros, reserved_tokens, reserved_cost_micros, enabled, created_at)"
        " SELECT 'dana', 'user', id, '', 'total', %s, 0, 0, 0, 0, true, now() FROM auth_user WHERE username = 'dana'"
        " RETURNING id",
        max_tokens,
    )
    return int(pk)


async def test_fifty_concurrent_sends_on_two_processes_never_overspend(cluster):
    db_url = cluster["db_url"]
    budget = new_budget(db_url, 10 * RESERVATION)
    a_srv, b_srv = cluster["servers"]
    tag = uuid.uuid4().hex[:6]
    async with ws_client(a_srv, cluster["token"]) as a, ws_client(b_srv, cluster["token"]) as b:
        sends = [(a if i % 2 else b, f"{tag}-{i}") for i in range(50)]
        # every send written before any answer is read: each process admits its own concurrently
        rids = [await c.send("chat.send", send_params(rid, MESSAGE, rid)) for c, rid in sends]
        answers = [await c.response(r, 30) for (c, _rid), r in zip(sends, rids, strict=True)]
        admitted = [rid for (_c, rid), ans in zip(sends, answers, strict=True) if ans["ok"]]
        refused = [ans for ans in answers if not ans["ok"]]
        assert admitted and refused, answers[:3]
        assert all(r["payload"]["errorKind"] == "budget" and r["error"]["code"] == "RATE_LIMITED" for r in refused)
        for client, rid in sends:
            if rid in admitted:
                await client.wait_event(
                    lambda e, rid=rid: (
                        e["event"] == "chat"
                        and e["payload"]["runId"] == rid
                        and e["payload"]["state"] in ("final", "error", "aborted")
                    ),
                    30,
                )
    await asyncio.sleep(0.5)
    ((used, reserved, limit),) = db(
        db_url, "SELECT used_tokens, reserved_tokens, max_tokens FROM sessions_app_budget WHERE id = %s", budget
    )
    assert reserved == 0
    assert used <= limit + RESERVATION, (used, limit)
    ((recorded,),) = db(
        db_url,
        "SELECT coalesce(sum(input_tokens + output_tokens), 0) FROM sessions_app_usagerecord WHERE run_id LIKE %s",
        f"{tag}-%",
    )
    assert recorded == used
    runs = {rid for (rid,) in db(db_url, "SELECT run_id FROM sessions_app_run WHERE run_id LIKE %s", f"{tag}-%")}
    assert runs == set(admitted)  # the refused sends admitted nothing


async def test_kill_9_mid_call_records_unknown_usage_and_releases_the_reservation(cluster):
    db_url = cluster["db_url"]
    budget = new_budget(db_url, 10_000)
    victim: ServerHandle = start_server(env=cluster["env"], log_dir=cluster["log_dir"])
    victim.wait_ready()
    survivor = cluster["servers"][0]
    rid = f"doomed-{uuid.uuid4().hex[:6]}"
    async with ws_client(survivor, cluster["token"]) as watcher:
        async with ws_client(victim, cluster["token"]) as v:
            await v.ok("chat.send", send_params(rid, "[[hang]] hi", rid))
        ((held,),) = db(db_url, "SELECT reserved_tokens FROM sessions_app_budget WHERE id = %s", budget)
        assert held > 0
        victim.kill()
        await watcher.wait_event(
            lambda e: e["event"] == "chat" and e["payload"]["runId"] == rid and e["payload"]["state"] == "error", 20
        )
    ((reserved, used),) = db(
        db_url, "SELECT reserved_tokens, used_tokens FROM sessions_app_budget WHERE id = %s", budget
    )
    assert (reserved, used) == (0, 0)
    ((unknown, step),) = db(db_url, "SELECT unknown, step FROM sessions_app_usagerecord WHERE run_id = %s", rid)
    assert unknown and step == 1
