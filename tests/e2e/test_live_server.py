"""The protocol against a real daphne process (`manage.py serve`), over real sockets."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from tests.support.db import send_params
from tests.support.servers import ServerHandle, create_token, prepare_database, start_server, ws_client

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, str]]:
    tmp: Path = tmp_path_factory.mktemp("live")
    env = prepare_database(tmp, GATEWAY_MAX_PAYLOAD="65536")
    token = create_token(env, "dora")
    server = start_server(env=env, log_dir=tmp)
    server.wait_ready()
    yield server, token
    server.stop()


async def test_handshake_send_stream_final(live):
    server, token = live
    async with ws_client(server, token) as c:
        assert c.hello["policy"]["maxPayload"] == 65536
        ack = await c.ok("chat.send", send_params("main", "over a real socket", "r1"))
        assert ack["status"] == "started"
        final = await c.wait_event(lambda e: e["event"] == "chat" and e["payload"]["state"] == "final")
        assert final["payload"]["message"]["content"][0]["text"] == "echo: over a real socket"
        deltas = [e for e in c.events if e["event"] == "chat" and e["payload"]["state"] == "delta"]
        assert deltas and all(d["payload"]["seq"] < final["payload"]["seq"] for d in deltas)
        seqs = [e["seq"] for e in c.events]
        assert seqs == list(range(1, len(seqs) + 1))
        replay = await c.ok("chat.send", send_params("main", "over a real socket", "r1"))
        assert replay["status"] == "ok"


async def test_daphne_closes_oversize_frame_with_1009(live):
    server, token = live
    async with ws_client(server, token, subscribe=False) as c:
        await c.ws.send(
            json.dumps(
                {"type": "req", "id": "big", "method": "chat.send", "params": send_params("huge", "x" * 70_000, "big")}
            )
        )
        assert await c.wait_closed() == 1009
        # the close frame's reason names the limit, so a client can tell why (and upload instead)
        assert re.search(r"exceeds payload limit of \d+ octets", c.ws.close_reason or ""), c.ws.close_reason
    async with ws_client(server, token, subscribe=False) as c:
        listing = await c.ok("sessions.list", {"search": "huge"})
        assert listing["totalCount"] == 0


async def test_foreign_origin_refused_missing_origin_allowed(live):
    server, token = live
    with pytest.raises(websockets.exceptions.InvalidStatus) as err:
        async with websockets.connect(server.ws_url, origin="http://evil.example", open_timeout=5):
            pass
    assert err.value.response.status_code == 403
    async with websockets.connect(server.ws_url, origin=f"http://127.0.0.1:{server.port}", open_timeout=5) as ws:
        challenge = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert challenge["event"] == "connect.challenge"
    async with ws_client(server, token, subscribe=False) as c:  # no Origin header at all
        assert c.hello["type"] == "hello-ok"


async def test_abort_from_second_socket_and_root_path(live):
    server, token = live
    async with ws_client(server, token) as a, ws_client(server, token) as b:
        await a.ok("chat.send", send_params("abortme", "[[hang]]", "h1"))
        res = await b.ok("chat.abort", {"sessionKey": "abortme"})
        assert res == {"aborted": True, "runIds": ["h1"]}
        for c in (a, b):
            ev = await c.wait_event(lambda e: e["event"] == "chat" and e["payload"]["state"] == "aborted")
            assert ev["payload"]["runId"] == "h1"
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/", open_timeout=5) as ws:
        challenge = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert challenge["event"] == "connect.challenge"


async def test_bad_first_frame_closes_4008(live):
    server, _token = live
    async with websockets.connect(server.ws_url, open_timeout=5) as ws:
        await asyncio.wait_for(ws.recv(), 5)
        await ws.send("hello?")
        res = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert res["error"]["message"] == "first request must be connect"
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 4008
