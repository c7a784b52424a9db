"""The process's one subscription: its channel joins each group once, for all its connections.

A user with fifty open tabs on one process used to cost every event fifty layer messages
(each copied or serialised, queued, and woken for separately). Here the process's one
channel joins `user.<id>` when the first connection of that user arrives and leaves it
with the last (the same for `operators` and for the process's own `proc.<server_id>`
group), receives each event once, and hands it to its connections directly. Their
filters (`ConnectionState`) decide, per connection, what is news.
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

from chat.delivery import groups
from chat.delivery.messages import OPERATORS_VIA, GatewayMessage, HubProbe, ProcessMessage, untyped
from chat.runtime import health
from chat.web import metrics

log = logging.getLogger(__name__)
CHANNEL_PREFIX = "gateway"  # channel_capacity in settings matches it: every event of the process passes here


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

    async def start(self, process_group: str, on_control: Callable[[ProcessMessage], None]) -> None:
        """Open the channel, join the process's own group, and start receiving."""
        self.on_control = on_control
        self.process_group = process_group
        self.members.clear()
        self._lock = asyncio.Lock()  # of this loop (a test, or a restart, brings a new one)
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
        """Add a connection to a group; the process's channel joins it with the first."""
        async with self._lock:
            first = not self.members[group]
            self.members[group].add(member)
            if first and self.channel is not None:
                await _group_add(group, self.channel)

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
                    await _group_discard(group, self.channel)

    async def leave_all(self, member: Member) -> None:
        """Remove a connection from every group; the channel leaves those it was the last in."""
        async with self._lock:
            for group in [g for g, members in self.members.items() if member in members]:
                self.members[group].discard(member)
                if not self.members[group]:
                    del self.members[group]
                    if self.channel is not None:
                        await _group_discard(group, self.channel)

    async def regroup(self) -> None:
        """Join again every group the process's connections need (the layer may have lost them)."""
        if self.channel is None or self.process_group is None:
            return
        await _group_add(self.process_group, self.channel)
        for group in list(self.members):
            await _group_add(group, self.channel)

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
        self.channel = await layer.new_channel(prefix=CHANNEL_PREFIX)  # type: ignore[call-arg]  # not in the stubs
        await layer.group_add(process_group, self.channel)
        for group in list(self.members):  # after a restart: join again what the connections need
            await layer.group_add(group, self.channel)

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
                    await self._open(process_group)
                health.ok("listener")
                delay = 1.0
                while self.task is me and (channel := self.channel) is not None:
                    message = await layer.receive(channel)
                    health.ok("listener")
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
                log.exception("process channel failed; reopening in %.0fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


async def _group_add(group: str, channel: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_add(group, channel)


async def _group_discard(group: str, channel: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        try:
            await layer.group_discard(group, channel)
        except Exception:  # leaving late is harmless: the filters drop what is not ours
            log.debug("group_discard failed", exc_info=True)
