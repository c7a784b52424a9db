"""`/readyz` as a load balancer or a readiness probe uses it, against real `serve` processes.

On Redis, readiness once received on a channel of its own while the hub's receive loop
held channels-redis's per-process receive lock: the check's message was never popped and
a scale-out deployment never became ready. These tests poll `/readyz` from a fresh start,
after a kill -9 and restart, and through a Redis restart, and hold every answer to the
deadline the operators' guide documents.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import services
from tests.support.db import send_params
from tests.support.servers import ServerHandle, create_token, prepare_database, start_server, ws_client
from tests.support.services import RedisProcess

pytestmark = [pytest.mark.server]

ANSWER_WITHIN = 3.0  # docs/operators.md: every check has a 2 s deadline; a probe's timeoutSeconds ≥ 3


def readyz(server: ServerHandle) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    status, body = server.get("/readyz", timeout=10)
    return status, json.loads(body), time.monotonic() - started


def until_ready(server: ServerHandle, within: float) -> tuple[float, list[dict[str, Any]]]:
    """Poll like a probe (every 0.2 s) until 200; every answer must come within the deadline."""
    started = time.monotonic()
    answers: list[dict[str, Any]] = []
    while time.monotonic() - started < within:
        if not server.alive():
            raise AssertionError(f"server exited:\n{server.output()}")
        try:
            status, body, took = readyz(server)
        except OSError:  # not listening yet
            time.sleep(0.2)
            continue
        assert took < ANSWER_WITHIN, f"/readyz took {took:.2f}s: {body}"
        answers.append(body)
        if status == 200:
            return time.monotonic() - started, answers
        time.sleep(0.2)
    raise AssertionError(f"never ready within {within}s; last answers: {answers[-3:]}\n{server.output()[-3000:]}")


def redis_env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    return prepare_database(tmp_path, REDIS_URL=redis_url, REDIS_LAYER_PREFIX=f"agt{uuid.uuid4().hex[:8]}")


def test_ready_on_the_in_memory_layer(tmp_path: Path) -> None:
    server = start_server(env=prepare_database(tmp_path))
    try:
        until_ready(server, 20)
        status, body, _ = readyz(server)
        assert status == 200 and body["checks"]["channelLayer"]["ok"], body
    finally:
        server.stop()


@pytest.mark.redis
async def test_ready_on_redis_from_a_fresh_start_and_after_kill_9(tmp_path: Path) -> None:
    services.require_redis()
    env = redis_env(tmp_path, services.REDIS_URL)
    token = create_token(env, "ready")
    server = start_server(env=env)
    try:
        until_ready(server, 20)
        # ready means a connection works end to end: events reach it through the hub
        async with ws_client(server, token) as client:
            await client.ok("chat.send", send_params("r", "ready [[words:3]]", "m1"))
            assert (await client.wait_terminal("m1", 15))["state"] == "final"
        server.kill()
        server = start_server(env=env, port=server.port)
        until_ready(server, 20)
        for _ in range(5):  # it stays ready: the probe's group and message leave nothing behind
            status, body, _ = readyz(server)
            assert status == 200, body
    finally:
        server.stop()


@pytest.mark.redis
def test_unready_while_redis_is_gone_and_ready_again_when_it_is_back(tmp_path: Path, own_redis: RedisProcess) -> None:
    server = start_server(env=redis_env(tmp_path, own_redis.url))
    try:
        until_ready(server, 20)
        own_redis.kill()
        deadline = time.monotonic() + 15
        while True:
            status, body, took = readyz(server)
            assert took < ANSWER_WITHIN, f"/readyz took {took:.2f}s with Redis gone: {body}"
            if status == 503:
                assert body["checks"]["channelLayer"]["ok"] is False, body
                break
            assert time.monotonic() < deadline, f"still ready with Redis gone: {body}"
            time.sleep(0.2)
        own_redis.start()  # same port, empty
        until_ready(server, 30)
    finally:
        server.stop()
