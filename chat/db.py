"""The bridge from the event loop to the ORM."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import DatabaseSyncToAsync
from django.conf import settings

# Sized below the PostgreSQL pool, so a burst of calls queues here instead of
# timing out on the pool; and separate from the loop's default executor (DNS lookups).
_executor: ThreadPoolExecutor | None = None


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.GATEWAY_DB_THREADS, thread_name_prefix="agentgate-db")
    return _executor


def db_sync_to_async(fn: Callable[..., Any]) -> Any:
    """Run a sync ORM function on the executor's thread pool, closing stale connections around it.

    Not thread-sensitive: Channels' default runs every ORM call of the process on one
    thread, so one slow call (or an on-commit broadcast waiting for the loop) would stall
    every connection and run. The services keep no thread-bound state; each call is its
    own transaction, and SQLite writers queue on the IMMEDIATE lock.
    """
    return DatabaseSyncToAsync(fn, thread_sensitive=False, executor=_get_executor())
