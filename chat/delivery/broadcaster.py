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
import threading
import time
from typing import Any, cast

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

from chat.base.availability import channel_layer
from chat.base.metrics import channel_layer_failed
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
from chat.protocol import run_events
from chat.protocol.frames import encode
from sessions_app.models import SessionKind

log = logging.getLogger(__name__)
STOP_WAIT_SECONDS = 1.0  # how long `stop` waits for its task once cancelled
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


def merged_chat(earlier: ChatMessage, later: ChatMessage) -> ChatMessage:
    """Two consecutive deltas of a run (`seq` n and n + 1) as one layer message (`run_events.merged_delta`)."""
    payload = run_events.merged_delta(earlier["payload"], later["payload"])
    return {**later, "payload": payload, "json": encode(payload)}


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
        "kind": str(row.get("kind", SessionKind.DIRECT.value)),
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


Sends = list[tuple[str, dict[str, Any]]]  # (group, message) pairs, in order


def to_owner(owner_id: int, message: GatewayMessage) -> Sends:
    """One broadcast: to the owner's connections, and to operators subscribed to every session."""
    operators = cast(GatewayMessage, {**message, "via": OPERATORS_VIA})
    return [(groups.user_group(owner_id), untyped(message)), (groups.OPERATORS, untyped(operators))]


async def agroup_send_all(owner_id: int, message: GatewayMessage) -> None:
    """Send to the owner's connections and to operators subscribed to every session, now."""
    await send_batch(to_owner(owner_id, message))


async def send_batch(sends: Sends) -> None:
    """Hand a batch of group sends to the layer, in order: all in one `group_send_many` (on one Redis
    host one round trip), or one by one where the layer has no batches. A send that fails is logged
    and the rest still go; a layer that is unreachable ends the batch (counted: repair covers it)."""
    layer = get_channel_layer()
    if layer is None or not sends or not _layer_there():
        return
    started = time.monotonic()
    many = getattr(layer, "group_send_many", None)
    if many is not None and len(sends) > 1:
        try:
            async with asyncio.timeout(BROADCAST_WAIT_SECONDS):  # (no task per send, as wait_for would make)
                await many(sends)
        except Exception as exc:  # a broadcast never undoes a committed change
            if layer_unreachable(exc):
                channel_layer_failed("broadcast")  # counted; an outage is the layer check's call
                log.debug("group_send of %d messages failed: %s", len(sends), exc)
                return
            log.exception("group_send of %d messages failed; sending them one by one", len(sends))
        else:
            channel_layer.ok(started)
            return
    for group, message in sends:
        try:
            async with asyncio.timeout(BROADCAST_WAIT_SECONDS):
                await layer.group_send(group, message)
        except Exception as exc:
            if not layer_unreachable(exc):
                log.exception("group_send to %s failed", group)
                continue
            channel_layer_failed("broadcast")
            log.debug("group_send to %s failed: %s", group, exc)
            return
        channel_layer.ok(started)


def _layer_there() -> bool:
    """False while the layer is known to be away (the broadcast is skipped, and counted)."""
    if channel_layer.available:
        return True
    channel_layer_failed("broadcast")
    return False


# A queued broadcast: its sends, and what waits for them to be handed to the layer (`send_tracked`).
_Queued = tuple[Sends, "asyncio.Future[None] | None"]


class Broadcaster:
    """The per-process queue of committed broadcasts and the task that sends them in order.

    The task takes everything queued at once (up to MAX_BATCH broadcasts) and hands it to the
    layer as one batch (`send_batch`): on Redis one round trip, however many events the process's
    runs committed meanwhile. A process that produces events faster than one batch a round trip
    sends bigger batches instead of building a queue.
    """

    MAX_BATCH = 500

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[_Queued] | None = None
        self.task: asyncio.Task[None] | None = None
        self.halted: asyncio.Event | None = None  # set by `stop`: the task sends nothing more
        # Broadcasts from other threads (a transaction's on-commit callbacks) wait here for the
        # loop: one wake-up of the loop takes all that came meanwhile, not one each.
        self._inbox: list[_Queued] = []
        self._inbox_lock = threading.Lock()
        self._waking = False

    def start(self) -> None:
        """Bind to the running loop (the serving loop)."""
        with self._inbox_lock:
            self._inbox.clear()
            self._waking = False
        self.loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        self.halted = asyncio.Event()
        self.task = self.loop.create_task(self._run(self.queue, self.halted))

    async def stop(self) -> None:
        """Send what is queued (briefly), then stop."""
        queue, task, halted = self.queue, self.task, self.halted
        self.loop = self.queue = self.task = self.halted = None
        if queue is not None and task is not None and halted is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queue.join(), 2)
            halted.set()
            task.cancel()
            # Bounded: a layer send can swallow its cancellation (redis-py reads it as its own
            # timeout); the loop below then sees it was stopped and ends after that send.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
            await asyncio.wait({task}, timeout=STOP_WAIT_SECONDS)
            while not queue.empty():  # never sent: nobody waits for them any longer
                _sends, waiter = queue.get_nowait()
                _release(waiter)

    async def _run(self, queue: asyncio.Queue[_Queued], halted: asyncio.Event) -> None:
        while not halted.is_set():
            batch = [await queue.get()]
            while len(batch) < self.MAX_BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                await send_batch([send for sends, _waiter in batch for send in sends])
            except Exception:
                log.exception("broadcast failed")
            finally:
                for _sends, waiter in batch:
                    _release(waiter)
                    queue.task_done()

    def send(self, owner_id: int, message: GatewayMessage) -> None:
        """Queue a broadcast to an owner's connections (and operators), from any thread."""
        self._enqueue(to_owner(owner_id, _stamped(message)))

    def send_tracked(self, owner_id: int, message: GatewayMessage) -> asyncio.Future[None] | None:
        """Queue a broadcast from the serving loop: what is done once it has been handed to the layer
        (or dropped). A run streaming sends its next delta only after that, so its deltas coalesce
        as far as the layer is behind instead of queueing up (`RunExecutor._pump`). None: sent
        already (no serving loop here)."""
        loop, queue = self.loop, self.queue
        if loop is None or queue is None or _running_loop() is not loop:
            self.send(owner_id, message)
            return None
        waiter = loop.create_future()
        queue.put_nowait((to_owner(owner_id, _stamped(message)), waiter))
        return waiter

    def route(self, group: str, message: AccessMessage | RunCancel) -> None:
        """Queue a message to one group (another process's runtime), from any thread."""
        self._enqueue([(group, untyped(message))])

    def _enqueue(self, sends: Sends) -> None:
        loop, queue = self.loop, self.queue
        item: _Queued = (sends, None)
        if loop is not None and queue is not None and loop.is_running():
            if _running_loop() is loop:
                queue.put_nowait(item)
                return
            with self._inbox_lock:
                self._inbox.append(item)
                if self._waking:
                    return  # the wake-up already on its way takes this one too
                self._waking = True
            try:
                loop.call_soon_threadsafe(self._take_inbox, queue)
            except RuntimeError:  # the loop closed meanwhile: repair covers it
                with self._inbox_lock:
                    self._waking = False
            return
        # No serving loop here. A worker thread of some other loop (a test calling services
        # directly) schedules the send there without waiting; a command sends synchronously.
        other = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
        if other is not None and other.is_running():
            asyncio.run_coroutine_threadsafe(send_batch(sends), other)
            return
        try:
            async_to_sync(send_batch)(sends)
        except Exception:
            log.warning("broadcast not sent", exc_info=True)

    def _take_inbox(self, queue: asyncio.Queue[_Queued]) -> None:
        with self._inbox_lock:
            taken, self._inbox = self._inbox, []
            self._waking = False
        for item in taken:
            queue.put_nowait(item)


def _stamped(message: GatewayMessage) -> GatewayMessage:
    if message["type"] == "gateway.chat":
        message["at"] = time.time()  # called once committed: a long transaction is not an old event
    return message


def _release(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


broadcaster = Broadcaster()
