"""The gateway's Redis channel layer against a real Redis: batched reads, two-trip group sends.

Pinned to channels-redis 4.3.0: the layer re-implements `group_send` with the library's
own delivery script and reads the library's queue keys, so an upgrade must pass here first.
"""

from __future__ import annotations

import inspect
import re
import uuid
from typing import Any

import channels_redis
import pytest
from channels_redis.core import RedisChannelLayer

from chat.delivery.layers import _GROUP_SEND_LUA, GatewayRedisChannelLayer
from tests.support import services

pytestmark = pytest.mark.redis


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_layer_is_written_against_the_pinned_library() -> None:
    assert channels_redis.__version__ == "4.3.0"
    library = _squash(inspect.getsource(RedisChannelLayer.group_send))
    assert _squash(_GROUP_SEND_LUA) in library, "channels-redis changed its delivery script"
    assert "__asgi_channel__" in inspect.getsource(RedisChannelLayer.receive_single)


@pytest.fixture
async def layer() -> Any:
    services.require_redis()
    made = GatewayRedisChannelLayer(
        hosts=[{"address": services.REDIS_URL}],
        prefix=f"t{uuid.uuid4().hex[:8]}",
        capacity=1000,
        channel_capacity={"small.*": 3},
    )
    yield made
    await made.flush()


async def test_a_process_channel_is_read_in_batches_in_order(layer: GatewayRedisChannelLayer) -> None:
    hub = await layer.new_channel(prefix="gateway")
    other = await layer.new_channel(prefix="gateway")  # a second channel of the same process
    await layer.group_add("g", hub)
    for i in range(250):
        await layer.group_send("g", {"type": "e", "i": i})
        if i % 50 == 0:
            await layer.send(other, {"type": "o", "i": i})
    got = [(await layer.receive(hub))["i"] for _ in range(250)]
    assert got == list(range(250))
    assert [(await layer.receive(other))["i"] for _ in range(5)] == [0, 50, 100, 150, 200]
    key = layer.prefix + layer.non_local_name(hub)
    assert await layer.connection(0).zcard(key) == 0  # nothing left behind in Redis


async def test_group_send_reaches_every_member_once_and_respects_capacity(layer: GatewayRedisChannelLayer) -> None:
    a = await layer.new_channel(prefix="gateway")
    b = await layer.new_channel(prefix="small")  # capacity 3
    for channel in (a, b):
        await layer.group_add("both", channel)
    await layer.group_send("nobody", {"type": "x"})  # an empty group is one round trip, no error
    for i in range(5):
        await layer.group_send("both", {"type": "e", "i": i})
    assert [(await layer.receive(a))["i"] for _ in range(5)] == [0, 1, 2, 3, 4]
    assert [(await layer.receive(b))["i"] for _ in range(3)] == [0, 1, 2]  # the rest was over capacity
    await layer.group_discard("both", a)
    await layer.group_send("both", {"type": "e", "i": 9})
    assert (await layer.receive(b))["i"] == 9


async def test_a_failed_extra_read_still_hands_over_the_message_read_first(
    layer: GatewayRedisChannelLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library counts on nothing between its read and the hand-over; our extra pop may fail."""
    import redis.asyncio

    hub = await layer.new_channel(prefix="gateway")
    await layer.group_add("g", hub)
    for i in range(3):
        await layer.group_send("g", {"type": "e", "i": i})
    real = redis.asyncio.Redis.zpopmin
    calls = {"n": 0}

    async def once_broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.asyncio.ConnectionError("Redis went away")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.Redis, "zpopmin", once_broken)
    assert [(await layer.receive(hub))["i"] for _ in range(3)] == [0, 1, 2]
