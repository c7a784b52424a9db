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
