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
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool


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


_pools: weakref.WeakSet[BlockingConnectionPool] = weakref.WeakSet()


class GatewayRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    """`RedisChannelLayer` whose pools wait for a free connection instead of failing."""

    def create_pool(self, index: int) -> BlockingConnectionPool:
        host = dict(self.hosts[index])
        address = host.pop("address", None)
        if address is None:
            raise ValueError("GatewayRedisChannelLayer needs hosts given as {'address': 'redis://...', ...}")
        pool = BlockingConnectionPool.from_url(address, **host)
        _pools.add(pool)
        return pool


def pool_stats() -> dict[str, int]:
    """Connections of this process's layer pools: open in total, in use, and the configured maximum."""
    stats = {"open": 0, "in_use": 0, "max": 0}
    for pool in list(_pools):
        in_use = len(getattr(pool, "_in_use_connections", ()))
        stats["in_use"] += in_use
        stats["open"] += in_use + len(getattr(pool, "_available_connections", ()))
        stats["max"] += int(pool.max_connections)
    return stats
