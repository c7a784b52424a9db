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
  blocking read, keepalive, health checks, retries over a Redis restart) come from
  `CHANNEL_LAYERS` in settings.

Both answer `in_group`, the supervisor's check that the layer still holds the process's
groups (on Redis one command without retries, so a Redis that is away is noticed at once), and
`receive_many`: everything waiting on the process's channel, in order, for the hub to hand on
at once. The Redis layer also sends a batch of group sends, in order, in two round trips
(`group_send_many`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import msgpack
from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from channels_redis.serializers import MsgPackSerializer
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a process's channel hands its hub at most at once (`receive_many`).
RECEIVE_MANY = 500


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

    async def receive_many(self, channel: str) -> list[dict[str, Any]]:
        """The next message on `channel` (waiting for it) and every one queued behind it, in order."""
        messages = [await self.receive(channel)]
        queue = self.channels.get(channel)
        if queue is not None:
            now = time.time()
            while not queue.empty() and len(messages) < RECEIVE_MANY:
                expires, message = queue.get_nowait()
                if expires >= now:
                    messages.append(message)
            if queue.empty():
                self.channels.pop(channel, None)  # as `receive` leaves an emptied channel
        return messages


_pools: weakref.WeakSet[BlockingConnectionPool] = weakref.WeakSet()
# Pool settings the layer check does without: its retries, the pool's size and wait, and the
# health check (a command of its own, retried); timeouts are its own.
_CHECKER_DROPS = frozenset({"retry", "retry_on_error", "max_connections", "timeout", "health_check_interval"})
log = logging.getLogger(__name__)

# A batch's delivery: message i to queue KEYS[i] (a queue may take several) with score SCORES[i]
# if the queue is under its capacity, as channels-redis 4.3.0's script does for one message; each
# queue's expired messages dropped first and its expiry renewed, once per batch. The scores come
# from the sender as strings: Lua would print a number with 14 digits, too few to keep a batch
# in order (time.time() needs 16).
# ARGV: the n messages, their n capacities, their n scores, the expiry, the cut-off for expired ones.
_DELIVER_MANY_LUA = """
    local n = #KEYS
    local expiry = ARGV[3 * n + 1]
    local expired = ARGV[3 * n + 2]
    local over = 0
    local seen = {}
    for i = 1, n do
        local key = KEYS[i]
        if not seen[key] then
            seen[key] = true
            redis.call('ZREMRANGEBYSCORE', key, 0, expired)
        end
        if redis.call('ZCARD', key) < tonumber(ARGV[n + i]) then
            redis.call('ZADD', key, ARGV[2 * n + i], ARGV[i])
        else
            over = over + 1
        end
    end
    for key in pairs(seen) do
        redis.call('EXPIRE', key, expiry)
    end
    return over
"""
SCORE_STEP = 1e-6  # between the scores of one batch's messages (a double near time.time() resolves 2.4e-7)

# A batch of group sends in one round trip (one Redis host): for each send, the group's members
# (its expired ones dropped, read once per batch), and to each channel key among them the
# message naming its channels in this group, under the key's capacity, as the library's
# `group_send` leaves it. The sender packs each message once, as a msgpack map with room for one
# more entry (`_blob`); the script appends that entry, `__asgi_channel__` and the list of channels,
# so what lands in a queue is the library's message, byte for byte in kind.
# ARGV: expiry, the cut-off for expired messages, the cut-off for expired group members, the
# default capacity, the number of capacity prefixes, (prefix, capacity) for each, the key prefix,
# then (group key, message, score) for each send.
_FAN_OUT_LUA = """
    local expiry = ARGV[1]
    local expired = ARGV[2]
    local group_expired = ARGV[3]
    local default_capacity = tonumber(ARGV[4])
    local capacities = {}
    local i = 6
    for c = 1, tonumber(ARGV[5]) do
        capacities[c] = {ARGV[i], tonumber(ARGV[i + 1])}
        i = i + 2
    end
    local prefix = ARGV[i]
    i = i + 1
    local function capacity(channel)
        for _, rule in ipairs(capacities) do
            if string.sub(channel, 1, #rule[1]) == rule[1] then
                return rule[2]
            end
        end
        return default_capacity
    end
    local function str(s)
        local n = #s
        if n < 32 then
            return string.char(0xa0 + n) .. s
        elseif n < 256 then
            return string.char(0xd9, n) .. s
        end
        return string.char(0xda, math.floor(n / 256), n % 256) .. s
    end
    local channel_entry = str('__asgi_channel__')
    local members = {}
    local seen = {}
    local over = 0
    while i <= #ARGV do
        local group, message, score = ARGV[i], ARGV[i + 1], ARGV[i + 2]
        i = i + 3
        local channels = members[group]
        if not channels then
            redis.call('ZREMRANGEBYSCORE', group, 0, group_expired)
            channels = redis.call('ZRANGE', group, 0, -1)
            members[group] = channels
        end
        local keys, by_key = {}, {}
        for _, channel in ipairs(channels) do
            local bang = string.find(channel, '!', 1, true)
            local key = prefix .. (bang and string.sub(channel, 1, bang) or channel)
            if not by_key[key] then
                by_key[key] = {}
                keys[#keys + 1] = key
            end
            table.insert(by_key[key], channel)
        end
        for _, key in ipairs(keys) do
            local listed = by_key[key]
            if not seen[key] then
                seen[key] = true
                redis.call('ZREMRANGEBYSCORE', key, 0, expired)
            end
            if redis.call('ZCARD', key) < capacity(listed[1]) then
                local names = {}
                for n, channel in ipairs(listed) do
                    names[n] = str(channel)
                end
                local head = #listed < 16 and string.char(0x90 + #listed)
                    or string.char(0xdc, math.floor(#listed / 256), #listed % 256)
                redis.call('ZADD', key, score, message .. channel_entry .. head .. table.concat(names))
            else
                over = over + 1
            end
        end
    end
    for key in pairs(seen) do
        redis.call('EXPIRE', key, expiry)
    end
    return over
"""


class GatewayRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    """`RedisChannelLayer` whose pools wait for a free connection instead of failing, whose
    process channel is read in batches, and whose group sends go out in batches.

    The library pops one message per receive, with three round trips and a cleaner task
    each (a backup copy guards against a cancelled read): about 250 messages a second on a
    busy 2-core machine, while a process's one channel (`chat.delivery.hub`) takes every event of all
    its connections. Under load its queue grew to tens of seconds of lag. The hub reads its
    channel with `receive_many`: one blocking pop of everything waiting (BZMPOP; on a Redis
    older than 7, a ZPOPMIN and, when that finds nothing, a BZPOPMIN), handed on in order.
    Nothing read is backed up in Redis: a dead process loses it, as it loses its queue
    anyway, and repair (§9) covers that. (`receive`, the library's careful read, still works,
    and takes what else waits in one ZPOPMIN.)

    The library's `group_send` costs four round trips a message; each event of a run is two
    group sends (the user's group and the operators'). `group_send_many` sends a batch of them
    in two: the groups' members in one pipeline, then every copy in one script.
    """

    receive_batch = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batched: dict[str, deque[tuple[Any, dict[str, Any]]]] = defaultdict(deque)
        self._bzmpop = True  # the server has BZMPOP (Redis >= 7); found out at the first read
        self._last_score = 0.0  # the score of the last message this layer queued (`group_send_many`)
        self._deliver_many = AsyncScript(cast(Any, None), _DELIVER_MANY_LUA.encode())  # run with a pooled client
        self._fan_out = AsyncScript(cast(Any, None), _FAN_OUT_LUA.encode())
        # The one-trip path (`_FAN_OUT_LUA`): one Redis host (a script reaches no other), messages
        # packed as the library packs them (msgpack, not encrypted), every capacity pattern a prefix.
        serializer = self._serializer
        prefixes = _capacity_prefixes(kwargs.get("channel_capacity") or {})
        one_trip = self.ring_size == 1 and isinstance(serializer, MsgPackSerializer) and not serializer.crypter
        self._capacity_prefixes = prefixes if one_trip else None
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
        """One group send: `group_send_many` of one."""
        await self.group_send_many([(group, message)])

    async def group_send_many(self, sends: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Each (group, message) to every channel of its group, in order: in one round trip on one
        Redis host (`_FAN_OUT_LUA`); sharded over several, the groups' members in one pipeline per
        host, then every copy in one script per host (`_DELIVER_MANY_LUA`).

        What the library's `group_send` does for one message, for a batch: expired members and
        messages dropped, a queue over its capacity skipped (and logged), the message a channel
        key gets naming its channels in this group (`__asgi_channel__`). The batch's copies get
        increasing scores, after any earlier batch's, so each queue hands them out in order.
        """
        if not sends:
            return
        for group, _message in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
        if self._capacity_prefixes is not None:
            await self._send_in_one_trip(sends)
            return
        members = await self._members({group for group, _message in sends})
        by_host: dict[int, tuple[list[str], list[bytes], list[int]]] = defaultdict(lambda: ([], [], []))
        for group, message in sends:
            channels = members[group]
            if not channels:
                continue
            by_connection, messages, capacities = self._map_channel_keys_to_connection(channels, message)
            for index, keys in by_connection.items():
                host_keys, host_messages, host_capacities = by_host[index]
                for key in keys:
                    host_keys.append(key)
                    host_messages.append(messages[key])
                    host_capacities.append(capacities[key])
        if not by_host:
            return
        now = time.time()
        score = max(now, self._last_score + SCORE_STEP)
        expiry = int(self.expiry)
        sends_per_host = []
        for index, (keys, messages, capacities) in by_host.items():
            scores = [repr(score + i * SCORE_STEP) for i in range(len(keys))]
            score += len(keys) * SCORE_STEP
            args: list[Any] = [*messages, *capacities, *scores, expiry, int(now) - expiry]
            sends_per_host.append(self._deliver_many(keys=keys, args=args, client=self.connection(index)))
        self._last_score = score
        if len(sends_per_host) == 1:
            over = await sends_per_host[0]
        else:
            over = sum(await asyncio.gather(*sends_per_host))
        if over > 0:
            log.info("%s of %s messages over capacity in a batch of %s group sends", over, len(sends), len(sends))

    async def _send_in_one_trip(self, sends: Sequence[tuple[str, dict[str, Any]]]) -> None:
        prefixes = self._capacity_prefixes or []
        now = time.time()
        expiry = int(self.expiry)
        args: list[Any] = [expiry, int(now) - expiry, int(now) - self.group_expiry, self.capacity, len(prefixes)]
        for prefix, capacity in prefixes:
            args += [prefix, capacity]
        args.append(self.prefix)
        score = max(now, self._last_score + SCORE_STEP)
        for i, (group, message) in enumerate(sends):
            args += [self._group_key(group), self._blob(message), repr(score + i * SCORE_STEP)]
        self._last_score = score + len(sends) * SCORE_STEP
        over = await self._fan_out(keys=[], args=args, client=self.connection(0))
        if over > 0:
            log.info("%s messages over capacity in a batch of %s group sends", over, len(sends))

    def _blob(self, message: dict[str, Any]) -> bytes:
        """The message as the library serialises it, less its `__asgi_channel__` entry (`_FAN_OUT_LUA`
        appends it): the random prefix, then a msgpack map header counting one entry more than
        the message has, then the message's entries."""
        assert "__asgi_channel__" not in message
        packed: bytes = msgpack.packb(message)
        head = packed[0]
        if 0x80 <= head <= 0x8F:
            count, body = head & 0x0F, packed[1:]
        elif head == 0xDE:
            count, body = int.from_bytes(packed[1:3], "big"), packed[3:]
        else:
            count, body = int.from_bytes(packed[1:5], "big"), packed[5:]
        count += 1
        if count < 16:
            header = bytes([0x80 | count])
        elif count < 0x10000:
            header = b"\xde" + count.to_bytes(2, "big")
        else:
            header = b"\xdf" + count.to_bytes(4, "big")
        length = self._serializer.random_prefix_length
        return random.getrandbits(8 * length).to_bytes(length, "big") + header + body

    async def _members(self, groups: set[str]) -> dict[str, list[str]]:
        """The channels of each group, expired ones dropped: one pipeline per Redis host."""
        by_host: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            by_host[self.consistent_hash(group)].append(group)
        expired = int(time.time()) - self.group_expiry

        async def read(index: int, names: list[str]) -> dict[str, list[str]]:
            pipe = self.connection(index).pipeline(transaction=False)
            for group in names:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=expired)
                pipe.zrange(key, 0, -1)
            replies = await pipe.execute()
            return {group: [m.decode("utf8") for m in replies[2 * i + 1]] for i, group in enumerate(names)}

        if len(by_host) == 1:
            [(index, names)] = by_host.items()
            return await read(index, names)
        found: dict[str, list[str]] = {}
        for part in await asyncio.gather(*(read(index, names) for index, names in by_host.items())):
            found.update(part)
        return found

    async def receive_many(self, channel: str) -> list[dict[str, Any]]:
        """Every message waiting on this process's channels, in order (at most RECEIVE_MANY), waiting
        for the first: one round trip when any wait or when the first arrives (on Redis 7).

        All of a process's channels share one queue in Redis; a message for another channel of the
        process (one its hub had before the layer failed) is handed on too: it was sent to a group
        of this process's connections, whose filters drop what they had already.
        """
        assert "!" in channel, "receive_many reads a process channel"
        real = self.non_local_name(channel)
        left = self._batched.pop(real, None)  # read ahead by `receive_single`
        if left:
            return [message for _channel, message in left]
        key = self.prefix + real
        connection = self.connection(self.consistent_hash(real))
        while True:
            popped = await self._pop(connection, key)
            if popped:
                return [self._unpack(content, real)[1] for content in popped]

    async def _pop(self, connection: Redis, key: str) -> list[bytes]:
        """What waits in `key` (up to RECEIVE_MANY), after waiting up to `brpop_timeout` for anything."""
        got: Any
        if self._bzmpop:
            try:
                got = await connection.bzmpop(self.brpop_timeout, 1, [key], min=True, count=RECEIVE_MANY)
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._bzmpop = False  # Redis < 7: pop, and block only when empty
            else:
                return [] if got is None else [member for member, _score in got[1]]  # [key, [[member, score]...]]
        got = await connection.zpopmin(key, RECEIVE_MANY)
        if got:
            return [member for member, _score in got]
        got = await connection.bzpopmin(key, timeout=self.brpop_timeout)
        return [] if got is None else [got[1]]  # [key, member, score]

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


def _capacity_prefixes(patterns: dict[Any, int]) -> list[tuple[str, int]] | None:
    """`channel_capacity` as (prefix, capacity) in order, when every pattern is a prefix glob
    (`gateway.*`); None otherwise (the one-trip script matches prefixes only)."""
    prefixes = []
    for pattern, capacity in patterns.items():
        if not isinstance(pattern, str) or not pattern.endswith("*") or any(c in pattern[:-1] for c in "*?[]"):
            return None
        prefixes.append((pattern[:-1], int(capacity)))
    return prefixes


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
