"""The bridge from the event loop to the ORM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.db import DatabaseSyncToAsync


def db_sync_to_async(fn: Callable[..., Any]) -> Any:
    """Run a sync ORM function on the executor's thread pool, closing stale connections around it.

    Not thread-sensitive: Channels' default runs every ORM call of the process on one
    thread, so one slow call (or an on-commit broadcast waiting for the loop) would stall
    every connection and run. The services keep no thread-bound state; each call is its
    own transaction, and SQLite writers queue on the IMMEDIATE lock.
    """
    return DatabaseSyncToAsync(fn, thread_sensitive=False)
