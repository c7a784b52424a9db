"""Broadcasts to channel-layer groups, called from on-commit callbacks.

Failures are logged and swallowed: a broadcast never undoes a committed change,
and the repair loop in every connection (§9) fills in what a layer dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from . import groups

log = logging.getLogger(__name__)
_pending: set[asyncio.Future[None]] = set()  # keep scheduled sends referenced until done


def now_ms() -> int:
    return int(time.time() * 1000)


def chat_message(owner_id: int, run_pk: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "gateway.chat", "owner": owner_id, "run": run_pk, "payload": payload}


def session_message(
    owner_id: int, session_pk: int, reason: str, row: dict[str, Any], run_id: str | None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"sessionKey": row["key"], "reason": reason, "ts": now_ms(), "session": row}
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


def group_send_all(owner_id: int, message: dict[str, Any]) -> None:
    """Sync twin of agroup_send_all, for on-commit callbacks on worker threads."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            async_to_sync(agroup_send_all)(owner_id, message)
        except (Exception, asyncio.CancelledError):
            # The caller's task was cancelled (a client went away) or the layer failed:
            # the change is committed, the repair loop delivers it; the remaining
            # on-commit callbacks of the transaction must still run.
            log.warning("broadcast to owner %s not sent", owner_id, exc_info=True)
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
