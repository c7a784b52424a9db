"""Broadcasts to channel-layer groups, in commit order, never blocking the committer.

On-commit callbacks hand their message to the serving loop and return at once: a
database thread never waits for the event loop (nor strands when the loop stops).
One sender task per process sends them in the order they were committed. Failures
are logged and swallowed: a broadcast never undoes a committed change, and repair
(§9) fills in whatever a layer dropped. While the layer is away (`availability.channel_layer`)
broadcasts are not attempted, and none waits for it longer than BROADCAST_WAIT_SECONDS: one
send riding out Redis's retries held the queue behind it for the whole outage, and live events
reached other processes seconds late after it. Repair delivers the terminals and rows. A send
that fails or is slow does not itself declare an outage (one slow send on a busy Redis is not
one): the supervisor's layer check, a command without retries each second, is the judge.
A process with no serving loop (a management command) sends synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

from chat.delivery import groups
from chat.delivery.layers import layer_unreachable
from chat.delivery.messages import (
    OPERATORS_VIA,
    AccessMessage,
    ChatMessage,
    GatewayMessage,
    RunCancel,
    SessionMessage,
    ToolMessage,
    untyped,
)
from chat.protocol.frames import encode
from chat.runtime.availability import channel_layer
from chat.web.metrics import channel_layer_failed

log = logging.getLogger(__name__)
BROADCAST_WAIT_SECONDS = 2.0


def chat_message(owner_id: int, run_pk: int, payload: dict[str, Any]) -> ChatMessage:
    """A layer message carrying a `chat` event of one run.

    The payload travels encoded once, as JSON text, for every connection to send as it is,
    beside the fields a connection's filter reads and the payload itself (for the `agent`
    events derived from it).
    """
    return {
        "type": "gateway.chat",
        "owner": owner_id,
        "run": run_pk,
        "runId": payload["runId"],
        "sessionKey": payload["sessionKey"],
        "sessionId": payload["sessionId"],
        "seq": payload["seq"],
        "state": payload["state"],
        "json": encode(payload),
        "payload": payload,
    }


def session_message(owner_id: int, session_pk: int, payload: dict[str, Any]) -> SessionMessage:
    """A layer message carrying a `sessions.changed` event of one session, encoded once (as `chat_message`)."""
    row = payload["session"]
    row_json = encode(row)
    rest = encode({k: v for k, v in payload.items() if k != "session"})
    return {
        "type": "gateway.session",
        "owner": owner_id,
        "session": session_pk,
        "version": row["version"],
        "deleted": bool(row.get("deleted")),
        "reason": payload["reason"],
        "row": row_json,
        "json": f'{rest[:-1]},"session":{row_json}}}',
    }


def tool_message(
    owner_id: int, run_pk: int, call_id: str, event: str, agent: dict[str, Any], plugin: dict[str, Any] | None = None
) -> ToolMessage:
    """A layer message carrying a tool call's or an approval's events (small and rare: not pre-encoded)."""
    message: ToolMessage = {
        "type": "gateway.tool",
        "owner": owner_id,
        "run": run_pk,
        "call": call_id,
        "event": event,
        "agent": agent,
    }
    if plugin is not None:
        message["plugin"] = plugin
    return message


async def agroup_send_all(owner_id: int, message: GatewayMessage) -> None:
    """Send to the owner's connections and to operators subscribed to every session."""
    layer = get_channel_layer()
    if layer is None or not _layer_there():
        return
    operators = cast(GatewayMessage, {**message, "via": OPERATORS_VIA})
    started = time.monotonic()
    for group, msg in ((groups.user_group(owner_id), message), (groups.OPERATORS, operators)):
        try:
            async with asyncio.timeout(BROADCAST_WAIT_SECONDS):  # (no task per send, as wait_for would make)
                await layer.group_send(group, untyped(msg))
        except Exception as exc:  # a broadcast never undoes a committed change
            if not layer_unreachable(exc):
                log.exception("group_send to %s failed", group)
                continue
            channel_layer_failed("broadcast")  # counted; an outage is the layer check's call
            log.debug("group_send to %s failed: %s", group, exc)
            return
        channel_layer.ok(started)


def _layer_there() -> bool:
    """False while the layer is known to be away (the broadcast is skipped, and counted)."""
    if channel_layer.available:
        return True
    channel_layer_failed("broadcast")
    return False


class Broadcaster:
    """The per-process queue of committed broadcasts and the task that sends them in order."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[Callable[[], Awaitable[None]]] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Bind to the running loop (the serving loop)."""
        self.loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        self.task = self.loop.create_task(self._run())

    async def stop(self) -> None:
        """Send what is queued (briefly), then stop."""
        queue, task = self.queue, self.task
        self.loop = self.queue = self.task = None
        if queue is not None and task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queue.join(), 2)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        assert self.queue is not None
        queue = self.queue
        while True:
            send = await queue.get()
            try:
                await send()
            except Exception:
                log.exception("broadcast failed")
            finally:
                queue.task_done()

    def send(self, owner_id: int, message: GatewayMessage) -> None:
        """Queue a broadcast to an owner's connections (and operators), from any thread."""
        if message["type"] == "gateway.chat":
            message["at"] = time.time()  # called once committed: a long transaction is not an old event
        self._enqueue(partial(agroup_send_all, owner_id, message))

    def route(self, group: str, message: AccessMessage | RunCancel) -> None:
        """Queue a message to one group (another process's runtime), from any thread."""
        self._enqueue(partial(_group_send, group, untyped(message)))

    def _enqueue(self, send: Callable[[], Awaitable[None]]) -> None:
        loop, queue = self.loop, self.queue
        if loop is not None and queue is not None and loop.is_running():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: repair covers it
                if _running_loop() is loop:
                    queue.put_nowait(send)
                else:
                    loop.call_soon_threadsafe(queue.put_nowait, send)
            return
        # No serving loop here. A worker thread of some other loop (a test calling services
        # directly) schedules the send there without waiting; a command sends synchronously.
        other = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
        if other is not None and other.is_running():
            asyncio.run_coroutine_threadsafe(_call(send), other)
            return
        try:
            async_to_sync(_call)(send)
        except Exception:
            log.warning("broadcast not sent", exc_info=True)


async def _call(send: Callable[[], Awaitable[None]]) -> None:
    await send()


async def _group_send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None or not _layer_there():
        return  # a cancel routed to another process: its reconcile loop is the backstop
    try:
        async with asyncio.timeout(BROADCAST_WAIT_SECONDS):
            await layer.group_send(group, message)
    except Exception as exc:
        if not layer_unreachable(exc):
            raise
        channel_layer_failed("broadcast")  # counted; an outage is the layer check's call


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


broadcaster = Broadcaster()
