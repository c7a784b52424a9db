"""Broadcasts to channel-layer groups, called from on-commit callbacks.

Failures are logged and swallowed: a broadcast never undoes a committed change,
and the repair loop in every connection (§9) fills in what a layer dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

from . import groups, protocol

log = logging.getLogger(__name__)
_pending: set[asyncio.Future[None]] = set()  # keep scheduled sends referenced until done



def chat_message(owner_id: int, run_pk: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "gateway.chat", "owner": owner_id, "run": run_pk, "payload": payload}


def session_message(
    owner_id: int, session_pk: int, reason: str, row: dict[str, Any], run_id: str | None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"sessionKey": row["key"], "reason": reason, "ts": protocol.now_ms(), "session": row}
    if run_id:
        payload["runId"] = run_id
    return {"type": "gateway.session", "owner": owner_id, "session": session_pk, "payload": payload}


async def agroup_send_all(owner_id: int, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group, msg in ((groups.user_group(owner_id), message), (groups.OPERATORS, {**message, "via": "operators"})):
        try:
            await layer.group_send(group, msg)
        except Exception:  # a broadcast never undoes a committed change
            log.exception("group_send to %s failed", group)


LOOP_CALL_TIMEOUT = 10.0


def call_from_thread(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
    """Run `fn(*args)` on the serving event loop from a worker thread; False if it did not finish.

    The wait is bounded: a loop that stops meanwhile (shutdown, the end of a test) must
    never strand the worker thread, or the process could not even exit. Only a thread
    that no event loop started (a management command) lets `async_to_sync` make a loop.
    """
    from .runtime.manager import run_manager

    # The loop whose executor runs this thread (asgiref records it), else the serving loop.
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None) or run_manager.loop
    try:
        if loop is None:
            async_to_sync(fn)(*args)
            return True
        if loop.is_closed() or not loop.is_running():
            return False
        future = asyncio.run_coroutine_threadsafe(fn(*args), loop)
        try:
            future.result(LOOP_CALL_TIMEOUT)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False
        return True
    except (Exception, asyncio.CancelledError):
        log.warning("call on the event loop failed", exc_info=True)
        return False


def group_send_all(owner_id: int, message: dict[str, Any]) -> None:
    """Sync twin of agroup_send_all, for on-commit callbacks on worker threads."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        # A broadcast that does not happen is logged, never raised: the change is
        # committed, the repair loop delivers it, and the transaction's remaining
        # on-commit callbacks must still run.
        if not call_from_thread(agroup_send_all, owner_id, message):
            log.warning("broadcast to owner %s not sent", owner_id)
        return
    # Called on an event-loop thread (never from the lifecycle service): schedule it.
    task = asyncio.ensure_future(agroup_send_all(owner_id, message))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def send_chat(owner_id: int, run_pk: int, payload: dict[str, Any]) -> None:
    group_send_all(owner_id, chat_message(owner_id, run_pk, payload))


def send_row(owner_id: int, session_pk: int, reason: str, run_id: str | None,
             fallback_row: dict[str, Any] | None = None) -> None:
    """Broadcast sessions.changed built from committed state (or the deleted row)."""
    from sessions_app.selectors import session_row

    try:
        row = session_row(session_pk) or fallback_row
    except Exception:
        log.warning("row %s not read for broadcast", session_pk, exc_info=True)
        return
    if row is None:
        return
    group_send_all(owner_id, session_message(owner_id, session_pk, reason, row, run_id))
