"""Issue 11 against a real `manage.py serve`: big histories, slow readers, no leaked sockets."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.support.db import send_params
from tests.support.servers import ServerHandle, create_token, prepare_database, start_server, ws_client

pytestmark = pytest.mark.server

MAX_BUFFERED = 1024 * 1024


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, str]]:
    tmp: Path = tmp_path_factory.mktemp("hardening")
    env = prepare_database(tmp, GATEWAY_MAX_BUFFERED_BYTES=str(MAX_BUFFERED), GATEWAY_METRICS_TOKEN="m-token")
    token = create_token(env, "erin")
    server = start_server(env=env, log_dir=tmp)
    server.wait_ready()
    yield server, token
    server.stop()


def _sockets_gauge(server: ServerHandle) -> float:
    import urllib.request

    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": "Bearer m-token"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(r"^agentgate_connected_sockets (\S+)$", text, re.M)
    assert match, text[:500]
    return float(match.group(1))


async def test_big_history_still_opens(live: tuple[ServerHandle, str]) -> None:
    server, token = live
    async with ws_client(server, token) as c:
        limit = c.hello["policy"]["maxPayload"]
        big = "\u00e9" * 31_990  # 6 bytes a character once escaped: ~190 KB a message
        for i in range(7):
            await c.ok("chat.send", send_params("big", big + f" {i}", f"b{i}", waitMs=20_000), timeout=30)
        seen = 0
        before = None
        for _ in range(30):
            params: dict[str, Any] = {"sessionKey": "big", "limit": 1000}
            if before:
                params["beforeId"] = before
            page = await c.ok("chat.history", params, timeout=15)
            assert len(json.dumps(page)) < limit
            seen += len(page["messages"])
            if not page["hasMore"]:
                break
            before = page["messages"][0]["id"]
        assert seen == 14


async def test_slow_reader_is_closed_and_released(live: tuple[ServerHandle, str]) -> None:
    server, token = live
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's buffer fills
    sock.connect(("127.0.0.1", server.port))
    ws = await websockets.connect(server.ws_url, sock=sock, max_queue=1, max_size=2**21)
    await ws.recv()
    await ws.send(
        json.dumps(
            {
                "type": "req",
                "id": "c",
                "method": "connect",
                "params": {
                    "minProtocol": 4,
                    "maxProtocol": 4,
                    "client": {"id": "slow", "version": "1"},
                    "auth": {"token": token},
                },
            }
        )
    )
    assert json.loads(await ws.recv())["ok"] is True
    async with ws_client(server, token) as sender:
        for i in range(3):
            await sender.ok("chat.send", send_params(f"slow{i}", "[[words:4000]] [[tick:2]]", f"s{i}"))
    # The sender leaves at once: on a loaded machine this test process could itself fall behind three
    # streams and be closed as a slow reader too. The slow socket reads nothing while the replies stream.
    for _ in range(120):
        await asyncio.sleep(0.5)
        if _sockets_gauge(server) == 0:
            break
    code = None
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    except websockets.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else 1006
    assert code in (4009, 1006)  # 4009 when the close frame got through, else the server dropped it
    assert "client is not reading" in server.output()
    assert _sockets_gauge(server) == 0  # the slow one was closed and released
