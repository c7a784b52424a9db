"""The Redis channel layer under a real `serve` process: idle connections, many of them, a Redis restart.

redis-py 8's default 5-second socket timeout raced channels-redis's 5-second idle
BZPOPMIN and closed idle consumers with 1011; its default pool of 100 failed a burst of
connects with "Too many connections". These tests hold a few hundred real sockets idle
for longer than a minute, and restart a Redis of their own under live connections.

The long test runs only when Redis is reachable (it takes about 70 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import services
from tests.support.db import send_params
from tests.support.servers import (
    ServerHandle,
    WsClient,
    create_token,
    prepare_database,
    start_server,
    ws_client,
)

pytestmark = [pytest.mark.server, pytest.mark.redis]

IDLE_CONNECTIONS = 300
IDLE_SECONDS = 65.0


def layer_env(tmp_path: Path, redis_url: str, **extra: str) -> dict[str, str]:
    return prepare_database(tmp_path, REDIS_URL=redis_url, REDIS_LAYER_PREFIX=f"agt{uuid.uuid4().hex[:8]}", **extra)


def layer_pool(server: ServerHandle) -> dict[str, float]:
    """The `agentgate_channel_layer_redis_connections` gauges of one process."""
    status, body = server.get("/metrics")
    assert status == 200
    found: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("agentgate_channel_layer_redis_connections{"):
            found[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return found


async def hold(
    server: ServerHandle, token: str, seconds: float, ready: asyncio.Event, out: dict[int, Any], index: int
) -> None:
    """One connection: handshake, then sit idle for `seconds`; record how it ended (None: still open)."""
    try:
        async with ws_client(server, token) as client:
            out[index] = "open"
            await ready.wait()
            await client.drain(seconds)
            out[index] = client.closed
    except Exception as exc:  # a failed handshake counts against the test, with its reason
        out[index] = f"{type(exc).__name__}: {exc}"[:120]


async def test_hundreds_of_idle_connections_stay_open_for_over_a_minute(tmp_path):
    services.require_redis()
    # one user's hundreds of background tabs: above the default per-user cap on purpose
    env = layer_env(tmp_path, services.REDIS_URL, GATEWAY_MAX_CONNECTIONS_PER_USER=str(IDLE_CONNECTIONS + 10))
    token = create_token(env, "idler")
    server = start_server(env=env)
    server.wait_ready()
    try:
        ready = asyncio.Event()
        out: dict[int, Any] = {}
        holders = [
            asyncio.ensure_future(hold(server, token, IDLE_SECONDS, ready, out, i)) for i in range(IDLE_CONNECTIONS)
        ]
        deadline = time.monotonic() + 60
        while len(out) < IDLE_CONNECTIONS and time.monotonic() < deadline and not all(h.done() for h in holders):
            await asyncio.sleep(0.1)
        assert Counter(map(str, out.values())) == {"open": IDLE_CONNECTIONS}, "connects failed"
        pool = layer_pool(server)
        ready.set()
        await asyncio.gather(*holders)
        outcomes = Counter(map(str, out.values()))
        assert outcomes == {"None": IDLE_CONNECTIONS}, f"idle connections closed: {outcomes}"
        # the layer still delivers after a minute of idleness
        async with ws_client(server, token) as a, ws_client(server, token) as b:
            await a.ok("chat.send", send_params("after-idle", "still here", "r1"))
            assert (await b.wait_terminal("r1", 10))["state"] == "final"
        log = server.output()
        assert "Traceback" not in log, log[-3000:]
        assert 0 < pool["max"] <= 50 and pool["open"] <= pool["max"], pool
    finally:
        server.stop()


# --- a Redis of the test's own (the `own_redis` fixture), restarted under live connections -------------


@contextlib.asynccontextmanager
async def clients(server: ServerHandle, token: str, n: int) -> AsyncIterator[list[WsClient]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(ws_client(server, token)) for _ in range(n)]


async def test_redis_restart_keeps_idle_connections_and_delivery(tmp_path, own_redis):
    env = layer_env(tmp_path, own_redis.url, GATEWAY_GROUP_REFRESH_SECONDS="1")
    token = create_token(env, "restarter")
    server = start_server(env=env)
    server.wait_ready()
    try:
        async with clients(server, token, 20) as idle:
            own_redis.kill()
            await asyncio.sleep(1.0)
            own_redis.start()  # same port, empty: groups and queues are gone
            await asyncio.gather(*(c.drain(8.0) for c in idle))
            assert [c.closed for c in idle] == [None] * len(idle), "idle connections dropped by the restart"
            # a new connection works, and its run reaches the connections from before the restart
            async with ws_client(server, token) as fresh:
                await fresh.ok("chat.send", send_params("restart", "after the restart [[words:6]] [[tick:150]]", "r1"))
                assert (await fresh.wait_terminal("r1", 20))["state"] == "final"
                for c in idle:
                    assert (await c.wait_terminal("r1", 10))["state"] == "final"
                    # live events again, not only the repair pass's terminal: the groups were re-added
                    assert any(p["state"] == "delta" for p in c.chat_events("r1")), c.chat_events("r1")
        assert "Exception inside application" not in server.output()
    finally:
        server.stop()
