"""The bridge from the event loop to the ORM: reads on a pool of threads, writes on the writer.

SQLite takes one writer at a time. Threads racing for its lock wait in its busy handler,
which sleeps in growing steps: that is where multi-second tails come from. So on SQLite
every write runs on one dedicated thread, in the order it was asked for, and never waits
for the lock behind another thread of this process; reads run beside it (WAL). On
PostgreSQL writes are spread over the pool like reads: its row locks serialise only
what touches the same session.

Each call is a plain function run on a thread (no asgiref context hop); the thread's
connection is kept (SQLite) or handed back to the pool (PostgreSQL) after each call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connection

T = TypeVar("T")

_readers: ThreadPoolExecutor | None = None
_writer: ThreadPoolExecutor | None = None


def single_writer() -> bool:
    """Whether writes go through one thread (SQLite)."""
    return connection.vendor == "sqlite"


def _executors() -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    global _readers, _writer
    if _readers is None:
        # Sized below the PostgreSQL pool, so a burst of calls queues here instead of
        # timing out on the pool; separate from the loop's default executor (DNS lookups).
        _readers = ThreadPoolExecutor(max_workers=settings.GATEWAY_DB_THREADS, thread_name_prefix="agentgate-db")
        _writer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentgate-writer") if single_writer() else _readers
        )
    assert _writer is not None
    return _readers, _writer


def _run(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        # Hands a PostgreSQL connection back to the pool; keeps a healthy SQLite one.
        close_old_connections()


async def _call(executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    # A clean context: the caller's may carry asgiref markers that would make the
    # ORM call look re-entrant.
    call = functools.partial(contextvars.Context().run, _run, fn, args, kwargs)
    return await loop.run_in_executor(executor, call)


async def db_read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a read (selectors) on a database thread."""
    return await _call(_executors()[0], fn, *args, **kwargs)


async def db_write(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a write (the lifecycle services and other writes) on the writer."""
    return await _call(_executors()[1], fn, *args, **kwargs)
