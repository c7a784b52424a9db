"""Issue 11, Low: lone surrogates, odd ids, binary frames, trailing newlines, static traversal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from chat.websocket import handshake
from tests.support.communicator import Client
from tests.support.db import counts, send_params

pytestmark = pytest.mark.django_db(transaction=True)

LONE = "\ud800"


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("chat.send", send_params("main", f"hi {LONE}", "s1"), "message"),
        ("sessions.create", {"sessionKey": "x", "label": f"a{LONE}"}, "label"),
        ("sessions.list", {"search": LONE}, "search"),
        ("chat.history", {"sessionKey": "main", "beforeId": "\u00b2"}, "beforeId"),
        ("chat.history", {"sessionKey": "main", "beforeId": "9" * 30}, "beforeId"),
        ("chat.history", {"sessionKey": "main", "beforeId": 2**70}, "beforeId"),
        (
            "chat.send",
            {
                **send_params("main", "see file", "s2"),
                "attachments": [{"mimeType": "text/plain", "fileName": f"a{LONE}.txt", "content": "aGk="}],
            },
            "attachments[0].fileName",
        ),
        ("chat.send", send_params("main\n", "hi", "s3"), "sessionKey"),
        ("chat.send", send_params("main", "hi", "s4\n"), "idempotencyKey"),
        (
            "chat.send",
            {**send_params("main", "see", "s5"), "attachments": [{"mimeType": "text/plain\n", "content": "aGk="}]},
            "attachments[0].mimeType",
        ),
    ],
)
async def test_bad_text_is_invalid_request_and_stores_nothing(
    client: Client, method: str, params: dict[str, Any], field: str
) -> None:
    before = await counts()
    res = await client.call(method, params)
    assert res["ok"] is False and res["error"]["code"] == "INVALID_REQUEST", res
    assert res["error"]["details"]["field"] == field
    assert await counts() == before


async def test_binary_first_frame_closes_4008(alice: tuple[Any, str]) -> None:
    from gatewayproject.asgi import application  # as open_client does: the app loads after settings

    comm = WebsocketCommunicator(application, "/ws/gateway")
    assert (await comm.connect())[0]
    c = Client(comm)
    await c._pump_one(2)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert await c.wait_closed(3) == handshake.CLOSE_POLICY


async def test_binary_and_garbage_frames_are_rate_limited(client: Client, settings: Any) -> None:
    settings.GATEWAY_RATE_PER_SEC = 0.001  # nothing refills during the test
    for i in range(settings.GATEWAY_RATE_BURST + 4):
        if i % 2:
            await client.comm.send_to(bytes_data=b"\x01")
        else:
            await client.send_raw("not json")
    await client.drain(0.5)
    assert client.responses["invalid"]["error"]["code"] == "RATE_LIMITED"


async def _http_get(path: str) -> tuple[int, bytes]:
    from gatewayproject.asgi import application  # as open_client does: the app loads after settings

    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


async def test_static_traversal_is_refused_without_a_500() -> None:
    status, body = await _http_get("/static/chat/../../manage.py")
    assert status in (400, 404)
    assert b"Traceback" not in body and b"DJANGO_SETTINGS_MODULE" not in body
