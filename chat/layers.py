"""The Redis channel layer of a scale-out deployment, with a bounded, waiting connection pool.

channels-redis opens one redis-py pool per process (per event loop). Its plain
`ConnectionPool` raises "Too many connections" once more commands are in flight than
`max_connections` (100 by default since redis-py 8): a burst of a few hundred
connects, each doing a `group_add`, killed consumers with 1011. A
`BlockingConnectionPool` makes such a burst wait briefly for a free connection
instead, and still bounds what one process opens on Redis.

The pool's settings (socket timeout above the layer's 5-second BZPOPMIN, keepalive,
health checks, retries over a Redis restart) come from `CHANNEL_LAYERS` in settings.
"""

from __future__ import annotations

import weakref

from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool

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
