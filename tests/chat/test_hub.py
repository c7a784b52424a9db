"""The process's hub: its receive loop, its probe, its stop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from channels.layers import get_channel_layer

from chat.delivery.hub import HubNotListening
from chat.runtime.gateway import runtime

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_probe_round_trips_through_the_receive_loop(client: Any) -> None:
    await asyncio.wait_for(runtime.hub.probe(), 2)
    assert not runtime.hub._probes


async def test_a_stopped_hub_does_not_receive_again_when_the_client_library_swallows_the_cancel(
    client: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py turns a cancellation into its own TimeoutError; the loop must still end."""
    layer = get_channel_layer()
    assert layer is not None
    receive = layer.receive

    async def like_redis_py(channel: str) -> dict[str, Any]:
        try:
            return await receive(channel)
        except asyncio.CancelledError:
            raise TimeoutError("Timeout reading from socket") from None

    monkeypatch.setattr(layer, "receive", like_redis_py)
    hub = runtime.hub
    await hub.probe()  # the loop is waiting in the patched receive
    task = hub.task
    assert task is not None
    with caplog.at_level(logging.ERROR, logger="chat.delivery.hub"):
        await hub.stop()
        await asyncio.sleep(1.3)  # longer than the loop's first back-off
    assert task.done(), "the receive loop went on after stop"
    assert hub.channel is None, "a stopped hub opened a channel again"
    assert "process channel failed" not in caplog.text
    with pytest.raises(HubNotListening):
        await hub.probe()


async def test_the_probe_does_not_wait_to_leave_its_group(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer that hangs on group_discard must not hold readiness past its deadline."""
    layer = get_channel_layer()
    assert layer is not None
    hang = asyncio.Event()

    async def hanging_discard(group: str, channel: str) -> None:
        await hang.wait()

    monkeypatch.setattr(layer, "group_discard", hanging_discard)
    await asyncio.wait_for(runtime.hub.probe(), 1)
    assert runtime.hub._leaving  # still leaving, in the background
    hang.set()
    await asyncio.sleep(0.05)
    assert not runtime.hub._leaving


async def test_an_odd_message_does_not_restart_the_listener(client: Any) -> None:
    """A `gateway.chat` without `at` (an older release's) is handed on; the channel stays."""
    from chat.delivery import groups
    from chat.delivery.broadcaster import chat_message

    layer = get_channel_layer()
    assert layer is not None
    channel, task = runtime.hub.channel, runtime.hub.task
    conn = next(iter(runtime.connections))
    payload = {"runId": "old", "sessionKey": "agent:main:main", "sessionId": "g", "seq": 1, "state": "status"}
    message = dict(chat_message(conn.state.user_id, 77, payload))  # not sent through the broadcaster: no `at`
    await layer.group_send(groups.user_group(conn.state.user_id), message)
    await layer.group_send(groups.user_group(conn.state.user_id), {"type": "gateway.nonsense", "owner": "x"})
    await client.drain(0.3)
    assert [e["payload"]["runId"] for e in client.events if e["event"] == "chat"] == ["old"]
    assert runtime.hub.channel == channel and runtime.hub.task is task


def test_a_chat_event_is_stamped_when_it_is_sent_not_when_it_was_built() -> None:
    """Built in the transaction, sent once committed: a slow commit is not an old event."""
    from chat.delivery.broadcaster import broadcaster, chat_message

    payload = {"runId": "r", "sessionKey": "agent:main:main", "sessionId": "g", "seq": 1, "state": "status"}
    message = chat_message(1, 5, payload)
    message["at"] = 0.0
    broadcaster.send(1, message)
    assert message["at"] > 1e9
