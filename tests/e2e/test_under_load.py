"""Server processes under streaming load on PostgreSQL + Redis: a loaded process is not declared
dead while it lives, and SIGTERM stops one within the drain and a few seconds, every run it
owned ended once (docs/deployment.md, "Heartbeats" and "Stopping a process").

Skipped, with the reason, when PostgreSQL or Redis is not reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support import services
from tests.support.cluster import Cluster, cluster
from tests.support.servers import ServerHandle, ws_client

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis]

USERS = [f"load{i}" for i in range(10)]  # (a user may hold 64 connections on one process)
LONG_RUN = "[[words:2000]] [[tick:50]]"  # streams for 100 s: still streaming when the test acts


async def stream(stack: contextlib.AsyncExitStack, server: ServerHandle, token: str, key: str) -> asyncio.Task[int]:
    """Start a long run on `server` and read its events on a task, which returns the close code."""
    client = await stack.enter_async_context(ws_client(server, token, subscribe=False))
    ack = await client.ok("chat.send", {"sessionKey": key, "message": LONG_RUN, "idempotencyKey": key}, timeout=60)
    assert ack["status"] == "started", ack

    async def read() -> int:
        with contextlib.suppress(ConnectionClosed):
            async for _frame in client.ws:  # (read and dropped: parsing them would starve the servers)
                pass
        return int(client.ws.close_code or 1006)

    return asyncio.ensure_future(read())


async def streams(
    stack: contextlib.AsyncExitStack, server: ServerHandle, tokens: dict[str, str], count: int, tag: str
) -> list[asyncio.Task[int]]:
    gate = asyncio.Semaphore(40)

    async def one(i: int) -> asyncio.Task[int]:
        async with gate:
            return await stream(stack, server, tokens[USERS[i % len(USERS)]], f"{tag}{i}")

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def server_id(c: Cluster, server: ServerHandle) -> str:
    ((found,),) = c.query("select server_id from sessions_app_gatewayprocess where pid = %s", server.pid)
    return str(found)


def runs_of(c: Cluster, owner: str) -> Counter[tuple[str, str]]:
    rows = c.query("select state, error_kind from sessions_app_run where owner_process = %s", owner)
    return Counter((state, kind) for state, kind in rows)


def reaped_after(proc: subprocess.Popen[bytes], since: float, timeout: float) -> tuple[int | None, float]:
    """The exit code and how long after `since` the process exited (on a thread: the loop is busy)."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None, timeout
    return code, time.monotonic() - since


@pytest.mark.timeout(300)
async def test_a_process_whose_database_threads_are_all_held_up_is_not_declared_dead(tmp_path: Path) -> None:
    """A transaction holds the rows of a process's streaming runs for 6 s: every one of its
    database threads waits on a delta's write, and the calls behind them queue. Its heartbeat
    does not wait with them (it used to: the peer beside it declared it dead and ended its runs)."""
    with cluster(tmp_path, 2, GATEWAY_RECOVERY_SECONDS="6") as c:  # a peer is dead after 3 s of silence
        tokens = c.tokens(*USERS)
        loaded, sweeper = c.servers
        owner = server_id(c, loaded)
        async with contextlib.AsyncExitStack() as stack:
            readers = await streams(stack, loaded, tokens, 30, "busy")
            oldest = 0.0
            with psycopg.connect(services._libpq(c.db_url)) as holder, holder.transaction():
                held = holder.execute(
                    "select id from sessions_app_run where owner_process = %s for update", (owner,)
                ).fetchall()
                assert len(held) == 30
                deadline = time.monotonic() + 6
                while time.monotonic() < deadline:  # its heartbeat, as its peers see it
                    ((age,),) = c.query(
                        "select extract(epoch from now() - heartbeat_at) from sessions_app_gatewayprocess "
                        "where server_id = %s",
                        owner,
                    )
                    oldest = max(oldest, float(age))
                    await asyncio.sleep(0.1)
            await asyncio.sleep(2)  # (what the peer's sweep would have done by now)
            assert runs_of(c, owner) == {("running", ""): 30}, (runs_of(c, owner), f"heartbeat {oldest:.1f} s old")
            assert oldest < 2.0, f"the held-up process's heartbeat was {oldest:.1f} s old"
            assert "dead processes" not in sweeper.output()
            assert not any(r.done() for r in readers)
            # Each beat's lateness is in /metrics: none late by two seconds.
            status, body = loaded.get("/metrics", timeout=10)
            assert status == 200
            beats = [line for line in body.splitlines() if line.startswith("agentgate_heartbeat_lateness_seconds_")]
            count = next(float(line.split()[-1]) for line in beats if "_count " in line)
            on_time = next(float(line.split()[-1]) for line in beats if 'le="2.0"' in line)
            assert count >= 15 and on_time == count, beats


@pytest.mark.timeout(300)
async def test_sigterm_under_streaming_load_exits_within_the_drain_and_ends_every_run(tmp_path: Path) -> None:
    """200 runs streaming over two processes; one gets SIGTERM. It used to take 15-25 s to exit
    (its runs, still streaming, were ended one by one behind their own writes; then Python's exit
    waited for its threads and freed every object): now the drain and at most 3 s more."""
    drain = 3.0
    with cluster(tmp_path, 2, GATEWAY_SHUTDOWN_DRAIN_SECONDS=str(drain)) as c:
        tokens = c.tokens(*USERS)
        victim, survivor = c.servers
        gone, staying = server_id(c, victim), server_id(c, survivor)
        async with contextlib.AsyncExitStack() as stack:
            on_victim, on_survivor = await asyncio.gather(
                streams(stack, victim, tokens, 100, "v"), streams(stack, survivor, tokens, 100, "s")
            )
            await asyncio.sleep(3)
            assert runs_of(c, gone) == {("running", ""): 100}
            since = time.monotonic()
            victim.terminate()
            code, took = await asyncio.to_thread(reaped_after, victim.proc, since, 60)
            assert code == 0 and took <= drain + 3, (code, took, victim.output()[-3000:])
            # Its clients were told, and closed with 4001; the survivor's go on streaming.
            assert Counter(await asyncio.gather(*on_victim)) == {4001: 100}
            assert not any(r.done() for r in on_survivor)
            # Every run it owned ended once, interrupted (by it, or once it was marked stopped by the
            # survivor's sweep); none of the survivor's was touched.
            deadline = time.monotonic() + 10
            while runs_of(c, gone) != {("failed", "interrupted"): 100} and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert runs_of(c, gone) == {("failed", "interrupted"): 100}
            assert runs_of(c, staying) == {("running", ""): 100}
            terminals: list[Any] = c.query(
                "select r.run_id, count(e.id) from sessions_app_run r left join sessions_app_lifecycleevent e "
                "on e.run_id = r.id and e.tool_call_id is null "
                "and e.to_state in ('done', 'failed', 'killed', 'timeout') "
                "where r.owner_process = %s group by r.run_id",
                gone,
            )
            assert len(terminals) == 100 and all(n == 1 for _run, n in terminals), terminals[:5]
            assert "Traceback" not in victim.output(), victim.output()[-3000:]
