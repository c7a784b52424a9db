"""Issue 11, High: bounded replies, frames within maxPayload, maxBufferedBytes, clean release."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from chat.protocol import sizes
from chat.runtime.backends import RunContext, capped
from chat.runtime.backends.scripted import (
    MAX_DELAY_MS,
    MAX_REPLY_CHARS,
    MAX_TICK_MS,
    MAX_WORDS,
    parse_script,
    reply_words,
)
from chat.runtime.gateway import runtime
from chat.websocket import outbound
from chat.websocket.consumer import GatewayConsumer
from tests.support.communicator import Client, open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


# --- the scripted agent's caps (finding 1) ----------------------------------------------------------


def test_scripted_directives_are_clamped() -> None:
    script = parse_script("[[words:3000000]] [[tick:5000000]] [[delay:99999999]]")
    assert script.words == MAX_WORDS
    assert script.tick_ms == MAX_TICK_MS
    assert script.delay_ms == MAX_DELAY_MS
    # not ASCII digits, or absurdly long: ignored, not a crash
    assert parse_script("[[words:²]]").words is None
    assert parse_script("[[words:" + "9" * 4000 + "]]").words is None


def test_scripted_reply_is_lazy_and_bounded() -> None:
    words = reply_words(parse_script("[[words:3000000]]"), [])
    assert not isinstance(words, list)  # streamed as made, never built up front
    total = sum(len(w) for w in words)
    assert total <= MAX_REPLY_CHARS
    assert total > MAX_REPLY_CHARS // 2


async def test_capped_stream_ends_with_length_and_closes_the_backend() -> None:
    closed: list[bool] = []

    async def backend() -> Any:
        try:
            for _ in range(1000):
                yield "0123456789"
        finally:
            closed.append(True)

    ctx = RunContext(run_pk=1, run_id="r", session_key="k", session_id="s", agent_id="main", agent={}, message="")
    stream = capped(backend(), ctx)
    stream.left = 95
    text = "".join([chunk async for chunk in stream])
    assert text == "0123456789" * 9 + "01234"
    assert ctx.stop_reason == "length"
    assert closed == [True]


async def test_capped_stream_closes_a_backend_never_iterated() -> None:
    closed: list[bool] = []

    async def backend() -> Any:
        try:
            yield "x"
        finally:
            closed.append(True)

    ctx = RunContext(run_pk=1, run_id="r", session_key="k", session_id="s", agent_id="main", agent={}, message="")
    inner = backend()
    await inner.__anext__()
    await capped(inner, ctx).aclose()
    assert closed == [True]


async def test_long_reply_is_cut_at_the_reply_budget(client: Client, settings: Any) -> None:
    settings.GATEWAY_MAX_REPLY_BYTES = 300
    await client.ok("chat.send", send_params("main", "[[words:500]] [[tick:0]]", "long"))
    final = await client.wait_terminal("long", timeout=20)
    assert final["state"] == "final" and final["stopReason"] == "length"
    text = final["message"]["content"][0]["text"]
    assert text.startswith("echo: word1 word2") and sizes.encoded_len(text) <= 300
    replay = await client.ok("chat.send", send_params("main", "[[words:500]] [[tick:0]]", "long"))
    assert replay["reply"] == text and replay["stopReason"] == "length"


# --- frames within maxPayload (finding 2) ---------------------------------------------------------


def test_fit_history_keeps_newest_and_cuts_a_lone_giant() -> None:
    def item(i: int, text: str) -> dict[str, Any]:
        return {"id": str(i), "role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}

    payload = {
        "sessionKey": "k",
        "messages": [item(i, "é" * 300) for i in range(10)],
        "hasMore": False,
        "queuedRuns": [{"runId": f"q{i}", "text": "x" * 5000, "position": i + 1} for i in range(5)],
    }
    fitted = sizes.fit_history(json.loads(json.dumps(payload)), 6000)
    assert len(json.dumps(fitted, separators=(",", ":"))) <= 6000
    assert fitted["hasMore"] is True
    ids = [m["id"] for m in fitted["messages"]]
    assert ids and ids == [str(i) for i in range(10 - len(ids), 10)]
    assert all(q.get("truncated") for q in fitted["queuedRuns"])
    giant = {"sessionKey": "k", "messages": [item(1, "a"), item(2, "\u2603" * 5000)], "hasMore": False}
    cut = sizes.fit_history(giant, 4000)
    assert [m["id"] for m in cut["messages"]] == ["2"] and cut["messages"][0]["truncated"] is True
    assert cut["hasMore"] is True and len(json.dumps(cut, separators=(",", ":"))) <= 4000


async def test_history_pages_by_bytes(client: Client, settings: Any) -> None:
    settings.GATEWAY_MAX_PAYLOAD = 16 * 1024
    settings.GATEWAY_MAX_REPLY_BYTES = 4000
    for i in range(6):
        await client.ok("chat.send", send_params("main", f"m{i} " + "x" * 1900, f"r{i}"))
        await client.wait_terminal(f"r{i}", timeout=20)
    seen: list[str] = []
    before: str | None = None
    for _ in range(20):
        params: dict[str, Any] = {"sessionKey": "main", "limit": 1000}
        if before is not None:
            params["beforeId"] = before
        rid = await client.send("chat.history", params)
        page = await client.response(rid)
        assert page["ok"], page
        body = page["payload"]
        assert len(json.dumps(page, separators=(",", ":"))) <= settings.GATEWAY_MAX_PAYLOAD
        seen = [m["id"] for m in body["messages"]] + seen
        if not body["hasMore"]:
            break
        before = body["messages"][0]["id"]
    assert len(seen) == 12 and len(set(seen)) == 12  # six user messages, six replies, none twice


async def test_oversize_response_is_an_error_and_the_socket_stays(client: Client, settings: Any) -> None:
    for i in range(8):
        await client.ok("sessions.create", {"sessionKey": f"s{i}", "label": "x" * 190})
    # sessions.list pages by bytes, but never sends an empty page: a first row too large for the frame
    settings.GATEWAY_MAX_PAYLOAD = 600
    res = await client.call("sessions.list", {})
    assert res["ok"] is False and res["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert (await client.ok("health", {}))["ok"] is True


def _in_groups(consumer: GatewayConsumer) -> list[str]:
    """The groups the process's channel holds for this connection (chat.delivery.hub)."""
    return [g for g, members in runtime.hub.members.items() if consumer in members]


async def test_oversize_event_closes_cleanly_and_releases(client: Client, settings: Any) -> None:
    admin = client
    consumer = _only_connection()
    assert _in_groups(consumer)
    settings.GATEWAY_MAX_PAYLOAD = 3000
    settings.GATEWAY_MAX_REPLY_BYTES = 100_000  # misconfigured on purpose: an event outgrows the frame limit
    await admin.send("chat.send", send_params("main", "[[words:2000]] [[tick:0]]", "big"))
    assert await admin.wait_closed() == outbound.CLOSE_SEND_FAILED
    await asyncio.sleep(0.1)
    assert len(runtime.connections) == 0
    assert _in_groups(consumer) == []


async def test_failed_send_closes_cleanly_and_releases(client: Client, monkeypatch: Any) -> None:
    consumer = _only_connection()
    real_send = GatewayConsumer.send

    async def failing(self: GatewayConsumer, text_data: str | None = None, **kwargs: Any) -> None:
        if text_data is not None and '"tick"' in text_data:
            raise RuntimeError("transport refused the frame")
        await real_send(self, text_data=text_data, **kwargs)

    monkeypatch.setattr(GatewayConsumer, "send", failing)
    await consumer.send_event("tick", {"ts": 1})
    assert await client.wait_closed() == outbound.CLOSE_SEND_FAILED
    assert len(runtime.connections) == 0
    assert _in_groups(consumer) == []


async def test_handler_crash_outside_dispatch_releases(alice: tuple[Any, str], monkeypatch: Any) -> None:
    client = await open_client(alice[1])  # not the fixture: its clean-up would re-raise the crash
    consumer = _only_connection()

    async def crash(self: GatewayConsumer, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raise RuntimeError("a fault outside any handler's own error handling")

    # a fault that escapes the consumer's handlers kills the application instance
    monkeypatch.setattr(GatewayConsumer, "receive", crash)
    await client.send_raw("{}")
    with pytest.raises(Exception):  # noqa: B017 - whatever the fault, the instance ends
        await asyncio.wait_for(client.comm.future, 5)
    assert len(runtime.connections) == 0
    assert _in_groups(consumer) == []


def _only_connection() -> GatewayConsumer:
    (consumer,) = runtime.connections.snapshot()
    assert isinstance(consumer, GatewayConsumer)
    return consumer


# --- maxBufferedBytes (finding 3) -----------------------------------------------------------------------


async def test_client_over_max_buffered_is_closed(alice: tuple[Any, str], settings: Any) -> None:
    from gatewayproject.asgi import application  # as open_client does: the app loads after settings

    waiting = {"bytes": 0}

    async def with_probe(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = {**scope, "extensions": {outbound.BUFFER_PROBE: lambda: waiting["bytes"]}}
        return await application(scope, receive, send)

    comm = WebsocketCommunicator(with_probe, "/ws/gateway")
    assert (await comm.connect())[0]
    c = Client(comm)
    await c._pump_one(2)
    c.hello = await c.ok(
        "connect",
        {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "t", "version": "1"}, "auth": {"token": alice[1]}},
    )
    assert c.hello["policy"]["maxBufferedBytes"] == settings.GATEWAY_MAX_BUFFERED_BYTES
    await c.ok("chat.send", send_params("main", "[[words:50]] [[tick:5]]", "slow"))
    waiting["bytes"] = settings.GATEWAY_MAX_BUFFERED_BYTES  # the client stopped reading
    assert await c.wait_closed() == outbound.CLOSE_SLOW_CONSUMER
    assert len(runtime.connections) == 0
    # it reconnects and resyncs: the run finished meanwhile, history has it
    again = await open_client(alice[1])
    await asyncio.sleep(1.5)
    history = await again.ok("chat.history", {"sessionKey": "main"})
    assert history["messages"][-1]["content"][0]["text"].startswith("echo: word1")
    await again.close()


def test_transport_probe_reads_twisted_buffers() -> None:
    class Transport:
        dataBuffer = b"x" * 100
        offset = 40
        _tempDataLen = 7

    assert outbound.transport_buffered(Transport()) == 67


def test_autobahn_formats_its_frame_debug_line_without_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plain_frame_logging` relies on autobahn's switch for click's colours (an upgrade that drops it fails here)."""
    import autobahn.util

    from chat.websocket.outbound import plain_frame_logging

    monkeypatch.setattr(autobahn.util, "_HAS_CLICK", autobahn.util._HAS_CLICK)  # restored afterwards
    plain_frame_logging()
    assert autobahn.util.hl("sendData", bold=True) == "sendData"


async def test_the_scripted_agent_keeps_its_pace_and_a_late_reader_gets_what_is_due_at_once() -> None:
    """Word i is due i ticks after the first: a reader that comes late gets the words already due in
    one chunk (as it would read a model's stream over the network); without a pace, a word a chunk."""
    from chat.runtime.backends.scripted import ScriptedBackend

    backend = ScriptedBackend("main", {})

    def context(message: str) -> RunContext:
        return RunContext(
            run_pk=1, run_id="r", session_key="k", session_id="s", agent_id="main", agent={}, message=message
        )

    unpaced = context("[[words:30]] [[tick:0]]")
    words = [chunk async for chunk in await backend.start(unpaced)]
    assert len(words) == 31 and all(len(chunk.split()) == 1 for chunk in words)

    paced = context("[[words:30]] [[tick:10]]")
    late = await backend.start(paced)
    first = await late.__anext__()
    await asyncio.sleep(0.155)  # the reader busy elsewhere: words 1-15 fall due meanwhile
    rest = [chunk async for chunk in late]
    assert "".join([first, *rest]) == "".join(words)
    assert len(rest[0].split()) >= 15
    assert paced.usage is not None and paced.usage["completion_tokens"] == 31  # words, however chunked
