"""The process's one subscription: its channel joins each group once, for all its connections.

A user with fifty open tabs on one process used to cost every event fifty layer messages
(each copied or serialised, queued, and woken for separately). Here the process's one
channel joins `user.<id>` when the first connection of that user arrives and leaves it
with the last (the same for `operators` and for the process's own `proc.<server_id>`
group), receives each event once, and hands it to its connections directly. Their
filters (`ConnectionState`) decide, per connection, what is news.

While the layer is away (`availability.channel_layer`) a connection still joins here: the
layer's side of it waits (`stale`) until the supervisor's layer check sees the layer back and
re-adds every group (`watch`), so a handshake never waits out Redis's retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol, cast

from channels.layers import get_channel_layer

from chat.base import health, metrics
from chat.base.availability import channel_layer
from chat.delivery import groups
from chat.delivery.broadcaster import merged_chat
from chat.delivery.first_sight import FirstSight
from chat.delivery.layers import in_group, layer_unreachable
from chat.delivery.messages import OPERATORS_VIA, ChatMessage, GatewayMessage, HubProbe, ProcessMessage, untyped

log = logging.getLogger(__name__)
CHANNEL_PREFIX = "gateway"  # channel_capacity in settings matches it: every event of the process passes here
# How long a join (a handshake) waits for the layer; past it the add goes on in the background
# and the group is re-added with the others once the layer answers (`stale`).
JOIN_WAIT_SECONDS = 3.0
# While the layer is unreachable the channel is reopened this often (other failures back off to 30 s).
REOPEN_OUTAGE_SECONDS = 1.0


class HubNotListening(RuntimeError):
    """The process's channel is not open or not being received on."""


class Member(Protocol):
    async def deliver(self, message: GatewayMessage) -> None: ...


class Hub:
    """Group memberships of this process, reference-counted by its connections."""

    def __init__(self) -> None:
        self.channel: str | None = None
        self.members: dict[str, set[Member]] = defaultdict(set)  # group -> its local connections
        self.task: asyncio.Task[None] | None = None
        self.on_control: Callable[[ProcessMessage], None] | None = None  # messages for the process itself
        self.process_group: str | None = None
        self._lock = asyncio.Lock()
        self._probes: dict[str, asyncio.Future[None]] = {}  # token -> waiting probe
        self._leaving: set[asyncio.Task[None]] = set()  # probes' groups being left
        self._adding: set[asyncio.Future[None]] = set()  # joins that outlived JOIN_WAIT_SECONDS
        # A group add was skipped or failed (the layer away): re-add every group when it answers.
        self.stale = False
        self.first_sight = FirstSight()  # the runs its connections first hear of from an event, as stored

    async def start(self, process_group: str, on_control: Callable[[ProcessMessage], None]) -> None:
        """Open the channel, join the process's own group, and start receiving."""
        self.on_control = on_control
        self.process_group = process_group
        self.members.clear()
        self._lock = asyncio.Lock()  # of this loop (a test, or a restart, brings a new one)
        self.first_sight = FirstSight()
        await self._open(process_group)
        self.task = asyncio.ensure_future(self._receive_loop(process_group))

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=5)
        self.members.clear()
        self.channel = None
        for waiting in self._probes.values():
            if not waiting.done():
                waiting.set_exception(HubNotListening("the process's channel was closed"))
        self._probes.clear()

    async def probe(self) -> None:
        """Round trip through the path every connection's events take: join a fresh group with
        the process's channel, send to it, and wait for the receive loop to hand it back.

        Readiness must not use a channel of its own: channels-redis lets one receive loop per
        process pop only its own channel, so a second channel's message would never be read.
        Cancelled by the caller's deadline; the group is left either way.
        """
        channel = self.channel
        if self.task is None or self.task.done() or channel is None:
            raise HubNotListening("the process's channel is not open (the receive loop is restarting)")
        channel_layer.check()  # away: say so at once, not after the client's retries
        layer = get_channel_layer()
        assert layer is not None
        token = uuid.uuid4().hex
        group = f"probe.{token}"
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probes[token] = waiting
        try:
            await layer.group_add(group, channel)
            try:
                ping: HubProbe = {"type": "hub.probe", "token": token}
                await layer.group_send(group, untyped(ping))
                await waiting
            finally:
                # left in the background: a Redis that hangs must not hold readiness past its deadline
                leaving = asyncio.ensure_future(_group_discard(group, channel))
                self._leaving.add(leaving)
                leaving.add_done_callback(self._leaving.discard)
        finally:
            self._probes.pop(token, None)

    async def join(self, group: str, member: Member) -> None:
        """Add a connection to a group; the process's channel joins it with the first.

        With the layer away (or slow past JOIN_WAIT_SECONDS) the connection joins here at once
        and the layer's side follows when it answers (`stale`, `watch`).
        """
        async with self._lock:
            first = not self.members[group]
            self.members[group].add(member)
            if not first or self.channel is None:
                return
            if not channel_layer.available:
                self.stale = True
                return
            adding = asyncio.ensure_future(_group_add(group, self.channel))
            try:
                await asyncio.wait_for(asyncio.shield(adding), JOIN_WAIT_SECONDS)
            except TimeoutError:
                self.stale = True  # re-added by the layer check, which also judges whether the layer is away
                metrics.channel_layer_failed("join")
                self._adding.add(adding)
                adding.add_done_callback(_retrieved)
                adding.add_done_callback(self._adding.discard)
            except Exception as exc:
                if not layer_unreachable(exc):
                    raise
                channel_layer.failed(exc)
                self.stale = True

    async def leave(self, group: str, member: Member) -> None:
        """Remove a connection from one group; the channel leaves it with the last."""
        async with self._lock:
            members = self.members.get(group)
            if members is None or member not in members:
                return
            members.discard(member)
            if not members:
                del self.members[group]
                if self.channel is not None:
                    await self._discard(group, self.channel)

    async def leave_all(self, member: Member) -> None:
        """Remove a connection from every group; the channel leaves those it was the last in."""
        async with self._lock:
            for group in [g for g, members in self.members.items() if member in members]:
                self.members[group].discard(member)
                if not self.members[group]:
                    del self.members[group]
                    if self.channel is not None:
                        await self._discard(group, self.channel)

    async def _discard(self, group: str, channel: str) -> None:
        """The channel leaves a group; not waited for past JOIN_WAIT_SECONDS, nor at all while the
        layer is away (leaving late is harmless: no connection here takes the group's events)."""
        if not channel_layer.available:
            return
        leaving = asyncio.ensure_future(_group_discard(group, channel))
        try:
            await asyncio.wait_for(asyncio.shield(leaving), JOIN_WAIT_SECONDS)
        except TimeoutError:
            self.stale = True  # the late leave could land after a new join of the group: re-add then
            self._leaving.add(leaving)
            leaving.add_done_callback(self._leaving.discard)

    async def regroup(self) -> None:
        """Join again every group the process's connections need (the layer may have lost them)."""
        channel, process_group = self.channel, self.process_group
        if channel is None or process_group is None:
            return
        self.stale = False  # (set again by a join that fails meanwhile)
        started = time.monotonic()
        try:
            await _group_add(process_group, channel)
            for group in list(self.members):
                if self.channel != channel:
                    break
                await _group_add(group, channel)
        except BaseException:
            self.stale = True
            raise
        if self.channel != channel:
            # the receive loop lost that channel meanwhile and its next one joined every group as it
            # opened (`_open`): what this pass joined again with the lost one must go, or the groups
            # keep a dead member for their expiry
            await self._leave(channel, process_group)
            return
        channel_layer.ok(started)

    async def watch(self) -> bool:
        """Whether the layer lost this process's groups (a Redis restarted without persistence
        forgets them all): if so, or if a join could not reach it, re-add every group now.

        One command without retries, so a layer that is away is noticed at once; the outage
        and its end are reported to `availability.channel_layer`.
        """
        channel, process_group = self.channel, self.process_group
        layer = get_channel_layer()
        if channel is None or process_group is None or layer is None:
            return False
        started = time.monotonic()
        present = await in_group(layer, process_group, channel)
        channel_layer.ok(started)
        if present and not self.stale:
            return False
        if not present:
            log.warning(
                "the channel layer had lost this process's groups (Redis restarted?): re-adding %d groups",
                len(self.members) + 1,
            )
        await self.regroup()
        return True

    async def deliver(self, message: dict[str, Any]) -> None:
        """Hand one layer message to the local connections of its group.

        A message for connections (`gateway.*`) names its user (`owner`); one sent through
        the operators' group says so (`via`).
        """
        if str(message.get("type", "")).startswith("gateway."):
            event = cast(GatewayMessage, message)  # one of the shapes `chat.delivery.messages` declares
            if event["type"] == "gateway.chat" and "at" in event:  # (a process of an older release sends none)
                metrics.EVENT_DELIVERY_LAG.observe(max(0.0, time.time() - event["at"]))
            via = event.get("via") == OPERATORS_VIA
            group = groups.OPERATORS if via else groups.user_group(event["owner"])
            for member in list(self.members.get(group, ())):
                try:
                    await member.deliver(event)
                except Exception:  # one closing socket must not stop the others
                    log.debug("delivery to one connection failed", exc_info=True)
        elif message.get("type") == "hub.probe":
            waiting = self._probes.get(str(message.get("token")))
            if waiting is not None and not waiting.done():
                waiting.set_result(None)
        elif self.on_control is not None:
            self.on_control(cast(ProcessMessage, message))

    async def _open(self, process_group: str) -> None:
        layer = get_channel_layer()
        assert layer is not None
        lost = self.channel
        self.channel = await layer.new_channel(prefix=CHANNEL_PREFIX)  # type: ignore[call-arg]  # not in the stubs
        await layer.group_add(process_group, self.channel)
        for group in list(self.members):  # after a restart: join again what the connections need
            await layer.group_add(group, self.channel)
        if lost is not None and lost != self.channel:
            # a layer that failed without losing its data still lists the lost channel
            await self._leave(lost, process_group)

    async def _leave(self, channel: str, process_group: str) -> None:
        """Take a channel this process no longer reads out of every group it may be in (best effort)."""
        for group in (process_group, *list(self.members)):
            await _group_discard(group, channel)

    async def _receive_loop(self, process_group: str) -> None:
        """Receive for the process; restarted, and logged, when the layer fails (events lost
        meanwhile are repaired, §9)."""
        layer = get_channel_layer()
        assert layer is not None
        me = asyncio.current_task()
        delay = 1.0
        # `stop` forgets this task before cancelling it: redis-py may swallow the cancellation
        # (as its own timeout), and a loop that went on would receive on no channel.
        while self.task is me:
            try:
                if self.channel is None:
                    started = time.monotonic()
                    await self._open(process_group)
                    channel_layer.ok(started)  # the layer answered: an outage is over here too
                health.ok("listener")
                delay = 1.0
                receive_many = getattr(layer, "receive_many", None)
                while self.task is me and (channel := self.channel) is not None:
                    if receive_many is None:
                        messages = [await layer.receive(channel)]
                    else:
                        messages = await receive_many(channel)
                    health.ok("listener")
                    for message in coalesced(messages):
                        try:
                            await self.deliver(message)
                        except Exception:  # one odd message is not the layer failing: no new channel
                            log.exception("a layer message of type %r could not be handed on", message.get("type"))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.task is not me:
                    return
                self.channel = None
                health.failed("listener", exc, restart=True)
                metrics.channel_layer_failed("listener")
                metrics.BACKGROUND_RESTARTS.labels("listener").inc()
                if layer_unreachable(exc):  # an outage: logged once by `availability`
                    channel_layer.failed(exc)
                    # Tried again soon: each try is bounded by Redis's connect timeout, and
                    # events and readiness come back only with the channel.
                    delay = min(delay, REOPEN_OUTAGE_SECONDS)
                    log.debug("process channel lost (%s); reopening in %.0fs", type(exc).__name__, delay)
                    await asyncio.sleep(delay)
                    continue
                log.exception("process channel failed; reopening in %.0fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


def coalesced(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a batch read from the layer comes to: consecutive deltas of a run (`seq` n, n + 1, with
    nothing of that run between them) as one, in the later one's place (`broadcaster.merged_chat`).

    A process that falls behind (its loop busy, the layer slow) reads bigger batches: each of its
    connections then gets a run's text once per batch, however many deltas it was written in, and
    catches up with the run instead of working through every step of it. A batch of one, the
    usual case, is left as it is.
    """
    if len(messages) < 2:
        return messages
    out: list[dict[str, Any] | None] = []
    latest: dict[tuple[Any, Any], int] = {}  # (run, via) -> where its latest event is in `out`
    for message in messages:
        kind = message.get("type")
        if kind in ("gateway.chat", "gateway.tool"):
            run = (message.get("run"), message.get("via"))
            at = latest.get(run)
            if at is not None and _is_delta(message):
                earlier = out[at]
                if earlier is not None and _is_delta(earlier) and message["seq"] == earlier["seq"] + 1:
                    out[at] = None
                    message = untyped(merged_chat(cast(ChatMessage, earlier), cast(ChatMessage, message)))
            latest[run] = len(out)
        out.append(message)
    return [message for message in out if message is not None]


def _is_delta(message: dict[str, Any]) -> bool:
    return message.get("type") == "gateway.chat" and message.get("state") == "delta" and "payload" in message


async def _group_add(group: str, channel: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_add(group, channel)


def _retrieved(task: asyncio.Future[None]) -> None:
    """A join's add that outlived its wait: its failure is the layer's outage, already reported."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a late group add failed: %s", task.exception())


async def _group_discard(group: str, channel: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        try:
            await layer.group_discard(group, channel)
        except Exception:  # leaving late is harmless: the filters drop what is not ours
            log.debug("group_discard failed", exc_info=True)
