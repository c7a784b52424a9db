"""The runtime's start-up: a connection that arrives while it starts waits for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from chat.base.availability import ChannelLayerUnavailable
from chat.runtime.gateway import runtime
from tests.support.communicator import open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


def hold_the_hubs_start(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The runtime's start waits, at the hub, until the returned event is set."""
    gate = asyncio.Event()
    start = runtime.hub.start

    async def slow_start(*args: Any, **kwargs: Any) -> None:
        await gate.wait()
        await start(*args, **kwargs)

    monkeypatch.setattr(runtime.hub, "start", slow_start)
    return gate


async def test_a_connection_during_start_up_gets_live_events(alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to go on at once, join its groups with no hub channel open, and be forgotten
    when the hub opened: no live event until it reconnected (only repair's terminals)."""
    gate = hold_the_hubs_start(monkeypatch)
    booting = asyncio.ensure_future(runtime.ensure_started())  # as `serve` does at boot
    await asyncio.sleep(0.05)
    opening = asyncio.ensure_future(open_client(alice[1]))
    await asyncio.sleep(0.3)
    assert not opening.done(), "the connection went on before the runtime had started"
    gate.set()
    await booting
    early = await opening
    sender = await open_client(alice[1])
    try:
        await sender.ok("chat.send", send_params("boot", "one two three [[tick:30]]", "m1"))
        assert (await early.wait_terminal("m1", 10))["state"] == "final"
        assert any(p["state"] == "delta" for p in early.chat_events("m1")), early.chat_events("m1")
    finally:
        await sender.close()
        await early.close()


async def test_a_failed_start_is_tried_again_by_the_next_connection(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = runtime.hub.start
    calls = {"n": 0}

    async def failing_once(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("channel layer unreachable")
        await start(*args, **kwargs)

    monkeypatch.setattr(runtime.hub, "start", failing_once)
    with pytest.raises(ChannelLayerUnavailable):  # the layer unreachable: an outage, not a crash
        await runtime.ensure_started()
    assert not runtime.running and "channel layer unreachable" in runtime.start_error  # /readyz: unready
    client = await open_client(alice[1])
    try:
        await client.ok("chat.send", send_params("retry", "hello [[tick:10]]", "m1"))
        assert (await client.wait_terminal("m1", 10))["state"] == "final"
    finally:
        await client.close()


async def test_a_cancelled_first_caller_neither_aborts_the_start_nor_cancels_the_others(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = hold_the_hubs_start(monkeypatch)
    first = asyncio.ensure_future(runtime.ensure_started())  # e.g. a connection whose client left
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(runtime.ensure_started())
    await asyncio.sleep(0.05)
    first.cancel()
    await asyncio.sleep(0.05)
    assert not second.done(), "the other caller was cancelled with the first"
    gate.set()
    await asyncio.wait_for(second, 5)
    assert first.cancelled() and runtime.running and runtime.hub.task is not None
    client = await open_client(alice[1])
    try:
        await client.ok("chat.send", send_params("after", "hello [[tick:10]]", "m1"))
        assert (await client.wait_terminal("m1", 10))["state"] == "final"
    finally:
        await client.close()


async def test_a_start_that_fails_for_another_reason_closes_the_socket_with_4013(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not an outage (a bug, a bad setting): logged with its traceback, and the client hears the
    documented close it retries after, not a crashed consumer."""
    from gatewayproject.asgi import application

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("something else")

    monkeypatch.setattr(runtime.hub, "start", broken)
    comm = WebsocketCommunicator(application, "/ws/gateway")
    accepted, _ = await comm.connect()
    assert accepted
    closed = await comm.receive_output(5)
    assert closed == {"type": "websocket.close", "code": 4013}, closed
    assert not runtime.running and "something else" in runtime.start_error
    await comm.disconnect()
