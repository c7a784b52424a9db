"""What the consumer relies on in Channels (4.3.2) when it overrides `__call__` and `dispatch`.

The consumer has no channel of its own (`channel_layer_alias = None`: the process's hub
receives for it) and dispatches without Channels' hop to its sync thread before every
message (`aclose_old_connections`), because it never uses the ORM on that thread. These
tests fail if a Channels upgrade changes any of that, so the reasons in
`chat/websocket/consumer.py` are looked at again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import channels
import channels.consumer
import pytest
from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer

from chat.websocket.consumer import GatewayConsumer


def test_pinned_channels_version() -> None:
    assert channels.__version__ == "4.3.2"


def test_handler_names_are_the_message_types_with_dots_as_underscores() -> None:
    assert get_handler_name({"type": "websocket.receive"}) == "websocket_receive"
    assert get_handler_name({"type": "gateway.chat"}) == "gateway_chat"
    with pytest.raises(ValueError):
        get_handler_name({"type": "_private.thing"})


async def test_a_consumer_without_a_layer_alias_gets_no_channel_and_dispatches_client_messages() -> None:
    seen: list[dict[str, Any]] = []

    class Probe(AsyncConsumer):
        channel_layer_alias = None  # type: ignore[assignment]

        async def dispatch(self, message: dict[str, Any]) -> None:
            seen.append(message)
            raise StopConsumer

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await queue.put({"type": "websocket.connect"})
    probe = Probe()

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent")

    await asyncio.wait_for(probe(scope={"type": "websocket"}, receive=queue.get, send=send), 2)
    assert seen == [{"type": "websocket.connect"}]
    assert probe.channel_layer is None and not hasattr(probe, "channel_name")


async def test_channels_dispatch_closes_old_connections_and_ours_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hop we skip on purpose: Channels' dispatch awaits it before every handler."""
    calls: list[str] = []

    async def recorder() -> None:
        calls.append("aclose_old_connections")

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", recorder)
    handled: list[str] = []

    class Plain(AsyncConsumer):
        async def gateway_chat(self, message: dict[str, Any]) -> None:
            handled.append("plain")

    await Plain().dispatch({"type": "gateway.chat"})
    assert calls == ["aclose_old_connections"] and handled == ["plain"]

    consumer = GatewayConsumer()
    consumer.busy, consumer.deferred = False, deque()

    async def gateway_chat(message: dict[str, Any]) -> None:
        handled.append("ours")

    consumer.gateway_chat = gateway_chat  # type: ignore[method-assign]
    await consumer.dispatch({"type": "gateway.chat"})
    assert calls == ["aclose_old_connections"] and handled == ["plain", "ours"]
    with pytest.raises(ValueError, match="No handler"):
        await consumer.dispatch({"type": "nothing.here"})
