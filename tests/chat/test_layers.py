"""The gateway's Redis channel layer against a real Redis: batched reads, batched group sends.

Pinned to channels-redis 4.3.0: the layer writes and reads the library's keys and messages (its
group sets, its queues, `__asgi_channel__`) with scripts and pops of its own, so an upgrade must
pass here first; the library's own layer reads what this one sends, and the other way round.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from typing import Any

import channels_redis
import pytest
from channels_redis.core import RedisChannelLayer
from redis.exceptions import ResponseError

from chat.delivery.layers import RECEIVE_MANY, GatewayRedisChannelLayer
from tests.support import services

pytestmark = pytest.mark.redis


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_layer_is_written_against_the_pinned_library() -> None:
    assert channels_redis.__version__ == "4.3.0"
    library = _squash(inspect.getsource(RedisChannelLayer.group_send))
    # what the library's delivery script does to each queue, as `_DELIVER_MANY_LUA` does it
    for step in ("redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS])", "'ZADD'", "'EXPIRE'"):
        assert step in library, "channels-redis changed its delivery script"
    assert "__asgi_channel__" in inspect.getsource(RedisChannelLayer.receive_single)
    assert "__asgi_channel__" in inspect.getsource(RedisChannelLayer._map_channel_keys_to_connection)


async def test_the_library_reads_what_the_layer_sends_and_the_other_way_round(layer: GatewayRedisChannelLayer) -> None:
    library = RedisChannelLayer(hosts=[{"address": host["address"]} for host in layer.hosts], prefix=layer.prefix)
    try:
        theirs = await library.new_channel(prefix="gateway")
        ours = await layer.new_channel(prefix="gateway")
        await library.group_add("g", theirs)
        await layer.group_add("g", ours)
        await layer.group_send_many([("g", {"type": "e", "i": 1}), ("g", {"type": "e", "i": 2})])
        assert [(await library.receive(theirs))["i"] for _ in range(2)] == [1, 2]
        await library.group_send("g", {"type": "e", "i": 3})
        assert [m["i"] for m in await layer.receive_many(ours)] == [1, 2, 3]
        wide = {"type": "e", **{f"k{n}": n for n in range(20)}}  # a map of more than 15 entries
        await layer.group_send_many([("g", wide)])
        assert [await library.receive(theirs) for _ in range(2)] == [{"type": "e", "i": 3}, wide]
    finally:
        await library.flush()


@pytest.fixture(params=["one trip", "sharded"])
async def layer(request: pytest.FixtureRequest) -> Any:
    """The layer on one Redis host (group sends in one round trip), and sharded over two (here two
    databases of the same Redis: the groups' members read first, then the copies sent)."""
    services.require_redis()
    hosts = [{"address": services.REDIS_URL}]
    if request.param == "sharded":
        hosts.append({"address": services.REDIS_URL.rsplit("/", 1)[0] + "/1"})
    made = GatewayRedisChannelLayer(
        hosts=hosts,
        prefix=f"t{uuid.uuid4().hex[:8]}",
        capacity=1000,
        channel_capacity={"small.*": 3},
    )
    assert (made._capacity_prefixes is not None) == (request.param == "one trip")
    yield made
    await made.flush()


def test_the_one_trip_path_needs_one_host_plain_messages_and_prefix_capacities() -> None:
    one = {"hosts": [{"address": "redis://127.0.0.1:6379/0"}], "capacity": 10}
    assert GatewayRedisChannelLayer(**one, channel_capacity={"gateway.*": 5})._capacity_prefixes == [("gateway.", 5)]
    assert GatewayRedisChannelLayer(**one, channel_capacity={"gate*way.*": 5})._capacity_prefixes is None
    assert GatewayRedisChannelLayer(**one, channel_capacity={"exact": 5})._capacity_prefixes is None
    assert GatewayRedisChannelLayer(**one, symmetric_encryption_keys=["k"])._capacity_prefixes is None


async def test_a_process_channel_is_read_in_batches_in_order(layer: GatewayRedisChannelLayer) -> None:
    hub = await layer.new_channel(prefix="gateway")
    other = await layer.new_channel(prefix="gateway")  # a second channel of the same process
    await layer.group_add("g", hub)
    await layer.group_add("o", other)
    for i in range(250):
        await layer.group_send("g", {"type": "e", "i": i})
        if i % 50 == 0:
            await layer.group_send("o", {"type": "o", "i": i})
    got = [(await layer.receive(hub))["i"] for _ in range(250)]
    assert got == list(range(250))
    assert [(await layer.receive(other))["i"] for _ in range(5)] == [0, 50, 100, 150, 200]
    real = layer.non_local_name(hub)
    assert await layer.connection(layer.consistent_hash(real)).zcard(layer.prefix + real) == 0  # nothing left


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


async def test_a_batch_of_group_sends_arrives_in_order_within_capacity(layer: GatewayRedisChannelLayer) -> None:
    """Each queue gets its copies in the batch's order, after those of the batch before, and no more
    than its capacity; a group without members costs nothing and is no error."""
    a = await layer.new_channel(prefix="gateway")
    b = await layer.new_channel(prefix="small")  # capacity 3
    await layer.group_add("both", a)
    await layer.group_add("both", b)
    await layer.group_add("one", a)
    first = [("both", {"type": "e", "i": i}) for i in range(3)] + [("nobody", {"type": "x"})]
    second = [("one" if i % 2 else "both", {"type": "e", "i": i}) for i in range(3, 300)]
    await layer.group_send_many(first)
    await layer.group_send_many(second)
    got: list[int] = []
    while len(got) < 300:
        got += [m["i"] for m in await layer.receive_many(a)]
    assert got == list(range(300))
    assert [(await layer.receive(b))["i"] for _ in range(3)] == [0, 1, 2]  # the rest was over capacity
    real = layer.non_local_name(b)
    assert await layer.connection(layer.consistent_hash(real)).zcard(layer.prefix + real) == 0


async def test_receive_many_hands_on_everything_waiting_and_waits_for_the_first(
    layer: GatewayRedisChannelLayer,
) -> None:
    hub = await layer.new_channel(prefix="gateway")
    lost = await layer.new_channel(prefix="gateway")  # a channel the hub had before: the same queue
    await layer.group_add("g", hub)
    await layer.group_add("old", lost)
    await layer.group_send_many([("g", {"type": "e", "i": i}) for i in range(RECEIVE_MANY + 10)])
    await layer.group_send("old", {"type": "e", "i": -1})
    batch = await layer.receive_many(hub)
    assert [m["i"] for m in batch] == list(range(RECEIVE_MANY))
    assert [m["i"] for m in await layer.receive_many(hub)] == [*range(RECEIVE_MANY, RECEIVE_MANY + 10), -1]
    waiting = asyncio.ensure_future(layer.receive_many(hub))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await layer.group_send("g", {"type": "e", "i": "late"})
    assert [m["i"] for m in await asyncio.wait_for(waiting, 5)] == ["late"]


async def test_receive_many_works_without_bzmpop(
    layer: GatewayRedisChannelLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis older than 7 has no BZMPOP: the layer pops, and blocks on BZPOPMIN only when empty."""
    import redis.asyncio

    async def unknown(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ResponseError("unknown command 'BZMPOP', with args beginning with: '5' '1'")

    monkeypatch.setattr(redis.asyncio.Redis, "bzmpop", unknown)
    hub = await layer.new_channel(prefix="gateway")
    await layer.group_add("g", hub)
    await layer.group_send_many([("g", {"type": "e", "i": i}) for i in range(3)])
    assert [m["i"] for m in await layer.receive_many(hub)] == [0, 1, 2]
    waiting = asyncio.ensure_future(layer.receive_many(hub))
    await asyncio.sleep(0.2)
    await layer.group_send("g", {"type": "e", "i": 3})
    assert [m["i"] for m in await asyncio.wait_for(waiting, 5)] == [3]


async def test_two_channels_of_a_process_in_a_group_share_one_copy(layer: GatewayRedisChannelLayer) -> None:
    """As the library sends it: one message to the process's queue, naming both channels."""
    first = await layer.new_channel(prefix="gateway")
    second = await layer.new_channel(prefix="gateway")
    await layer.group_add("g", first)
    await layer.group_add("g", second)
    await layer.group_send_many([("g", {"type": "e", "i": 1})])
    real = layer.non_local_name(first)
    assert await layer.connection(layer.consistent_hash(real)).zcard(layer.prefix + real) == 1
    assert (await layer.receive(first))["i"] == 1
    assert (await layer.receive(second))["i"] == 1
