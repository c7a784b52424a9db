"""Channel layers, each with what the library's own lacks here.

- `InMemoryChannelLayer` (one process): Channels' walks every channel and group on each
  `receive` to drop expired messages — with hundreds of connections, each delivered event
  paid for all of them; here that sweep runs at most once a second (a message past its
  60 s expiry may live up to a second longer). It also kept `channel_capacity` as given
  instead of compiling its patterns, so any per-channel capacity failed at the first
  receive; here they are compiled, as the base class (and channels-redis) intend.
- `GatewayRedisChannelLayer` (scale-out): channels-redis opens one redis-py pool per
  process (per event loop). Its plain `ConnectionPool` raises "Too many connections" once
  more commands are in flight than `max_connections` (100 by default since redis-py 8): a
  burst of a few hundred connects killed consumers with 1011. A `BlockingConnectionPool`
  makes such a burst wait briefly for a free connection instead, and still bounds what one
  process opens on Redis. The pool's settings (socket timeout above the layer's 5-second
  BZPOPMIN, keepalive, health checks, retries over a Redis restart) come from
  `CHANNEL_LAYERS` in settings.

Both answer `in_group`, the supervisor's check that the layer still holds the process's
groups (on Redis one command without retries, so a Redis that is away is noticed at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict, deque
from functools import partial
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    """`channels.layers.InMemoryChannelLayer` with its expiry sweep throttled."""

    sweep_interval = 1.0
    _swept_at = 0.0

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.channel_capacity = self.compile_capacities(self.channel_capacity)  # type: ignore[arg-type,assignment]

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= self.sweep_interval:
            self._swept_at = now
            super()._clean_expired()  # type: ignore[misc]  # not in the stubs

    async def in_group(self, group: str, channel: str) -> bool:
        return channel in self.groups.get(group, {})


_pools: weakref.WeakSet[BlockingConnectionPool] = weakref.WeakSet()
# Pool settings the layer check does without: its retries, the pool's size and wait, and the
# health check (a command of its own, retried); timeouts are its own.
_CHECKER_DROPS = frozenset({"retry", "retry_on_error", "max_connections", "timeout", "health_check_interval"})
log = logging.getLogger(__name__)

# channels-redis 4.3.0's delivery script, unchanged: each queue under its capacity gets the message.
_GROUP_SEND_LUA = """
    local over_capacity = 0
    local current_time = ARGV[#ARGV - 1]
    local expiry = ARGV[#ARGV]
    for i=1,#KEYS do
        if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
            redis.call('ZADD', KEYS[i], current_time, ARGV[i])
            redis.call('EXPIRE', KEYS[i], expiry)
        else
            over_capacity = over_capacity + 1
        end
    end
    return over_capacity
"""


class GatewayRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    """`RedisChannelLayer` whose pools wait for a free connection instead of failing, and
    whose process channel is read in batches.

    The library pops one message per receive, with three round trips and a cleaner task
    each (a backup copy guards against a cancelled read): about 250 messages a second on a
    busy 2-core machine, while a process's one channel (`chat.delivery.hub`) takes every event of all
    its connections. Under load its queue grew to tens of seconds of lag. Here, once the
    library's careful read has returned a message, what else waits on the process's
    channel comes in one ZPOPMIN and is handed out in order without going back to Redis.
    Those are not backed up in Redis: a dead process loses them, as it loses its queue
    anyway, and repair (§9) covers that.
    """

    receive_batch = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batched: dict[str, deque[tuple[Any, dict[str, Any]]]] = defaultdict(deque)
        # per event loop and host: a client of its own for `in_group`, without retries
        self._checkers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Redis]] = (
            weakref.WeakKeyDictionary()
        )

    async def in_group(self, group: str, channel: str) -> bool:
        """Whether `channel` is in `group`. Not retried, unlike the layer's own commands: a Redis
        that is away fails it at once, one restarted without persistence answers no."""
        index = self.consistent_hash(group)
        clients = self._checkers.setdefault(asyncio.get_running_loop(), {})
        client = clients.get(index)
        if client is None:
            client = clients[index] = self._checker(index)
        return await client.zscore(self._group_key(group), channel) is not None

    def _checker(self, index: int) -> Redis:
        """A client for `in_group` with the pool's settings (address, credentials, TLS, keepalive)
        but no retries, no pool wait and short timeouts: a Redis that is away fails it at once."""
        host = {k: v for k, v in self.hosts[index].items() if k not in _CHECKER_DROPS}
        address = host.pop("address")
        host["socket_connect_timeout"] = min(float(host.get("socket_connect_timeout") or 2.0), 2.0)
        host["socket_timeout"] = 3.0
        return Redis.from_url(address, retry=Retry(NoBackoff(), 0), **host)

    async def _clean_receive_backup(self, index: int, channel: str) -> None:
        """The library's clean-up after a read, a task of its own that nobody awaits: with Redis
        away past the retries its error was logged as "Task exception was never retrieved",
        with a traceback, once per lost read. Left undone, the message is put back and read
        again (the connections' filters drop what they already had)."""
        try:
            await super()._clean_receive_backup(index, channel)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.debug("cleaning the receive backup of %s failed: %s", channel, exc)

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        local = "!" in channel
        if local and self._batched[channel]:
            return self._batched[channel].popleft()
        received = await super().receive_single(channel)
        if local and self.receive_batch > 1:
            # The library's receive counts on nothing being awaited between its read and the
            # hand-over of `received`: the extra pop must neither lose it nor what it popped.
            # Shielded, its result lands in the batch even if this read is cancelled meanwhile;
            # if it fails (Redis away), `received` is still handed over.
            connection = self.connection(self.consistent_hash(channel))
            pop = asyncio.ensure_future(connection.zpopmin(self.prefix + channel, self.receive_batch - 1))
            pop.add_done_callback(partial(self._keep, channel))
            try:
                await asyncio.shield(pop)
            except asyncio.CancelledError:
                self._batched[channel].appendleft(received)  # the next read hands it over, then the batch
                raise
            except Exception:
                pass  # logged by `_keep`; `received` is still handed over
        return received

    def _keep(self, channel: str, pop: asyncio.Future[Any]) -> None:
        if pop.cancelled():
            return
        if pop.exception() is not None:
            log.warning("reading more of the process channel failed: %s", pop.exception())
            return
        self._batched[channel].extend(self._unpack(content, channel) for content, _score in pop.result())

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """The library's `group_send` (channels-redis 4.3.0) in two round trips instead of four:
        the group's expiry and read in one pipeline, then, per shard, the queues' expiry and
        the delivery script in another. Every event of every run passes here."""
        assert self.require_valid_group_name(group), "Group name not valid"
        key = self._group_key(group)
        pipe = self.connection(self.consistent_hash(group)).pipeline(transaction=False)
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
        pipe.zrange(key, 0, -1)
        _expired, members = await pipe.execute()
        if not members:
            return
        by_connection, messages, capacities = self._map_channel_keys_to_connection(
            [member.decode("utf8") for member in members], message
        )
        for index, keys in by_connection.items():
            now = time.time()
            pipe = self.connection(index).pipeline(transaction=False)
            for channel_key in keys:
                pipe.zremrangebyscore(channel_key, min=0, max=int(now) - int(self.expiry))
            args = [messages[k] for k in keys] + [capacities[k] for k in keys] + [now, self.expiry]
            pipe.eval(_GROUP_SEND_LUA, len(keys), *keys, *args)
            over_capacity = (await pipe.execute())[-1]
            if over_capacity > 0:
                log.info("%s of %s channels over capacity in group %s", over_capacity, len(members), group)

    def _unpack(self, content: bytes, channel: str) -> tuple[Any, dict[str, Any]]:
        # As the library's receive_single decodes what it popped.
        message: dict[str, Any] = self.deserialize(content)
        return message.pop("__asgi_channel__", channel), message

    def create_pool(self, index: int) -> BlockingConnectionPool:
        host = dict(self.hosts[index])
        address = host.pop("address", None)
        if address is None:
            raise ValueError("GatewayRedisChannelLayer needs hosts given as {'address': 'redis://...', ...}")
        pool = BlockingConnectionPool.from_url(address, **host)
        _pools.add(pool)
        return pool


async def in_group(layer: Any, group: str, channel: str) -> bool:
    """Whether the layer holds `channel` in `group` (a layer that cannot say: yes)."""
    check = getattr(layer, "in_group", None)
    return True if check is None else bool(await check(group, channel))


def layer_unreachable(exc: BaseException) -> bool:
    """Whether a layer error means Redis is not there (rather than a bad message)."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | TimeoutError)


def pool_stats() -> dict[str, int]:
    """Connections of this process's layer pools: open in total, in use, and the configured maximum."""
    stats = {"open": 0, "in_use": 0, "max": 0}
    for pool in list(_pools):
        in_use = len(getattr(pool, "_in_use_connections", ()))
        stats["in_use"] += in_use
        stats["open"] += in_use + len(getattr(pool, "_available_connections", ()))
        stats["max"] += int(pool.max_connections)
    return stats
