"""Following one run for an HTTP answer: what is stored so far, then the live rest, exactly once.

A `Follower` joins its owner's group on this process's hub before it reads the run, so nothing
falls between the stored state and the live events; it then turns both into `Update`s: the run's
open state, new reply text (each stored delta as its own piece, `Run.marks` giving the
boundaries of what was stored before it came), its tool calls and pending approvals, and the
ended run. The text it hands on is always the stored reply's next part, so an event seen twice
(stored, then live) or lost (the layer dropped it) changes nothing: the run is read again at a
terminal event, at every tool event, and at least every POLL_SECONDS.

A revoked key ends its followers at once (the `gateway.access` message its WebSockets get), and,
should that message be lost, within a tick (GATEWAY_TICK_INTERVAL_MS), as a WebSocket would.

A follower rides out a database outage as its run does (`read_patiently`): its reads are tried
again for up to GATEWAY_RUN_DB_WAIT_SECONDS (a stream sends keep-alives meanwhile), and only then
does it give up (`DatabaseUnavailable`: the answer ends, and the run is left as by a client that went).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from django.conf import settings

from chat.base.availability import DatabaseUnavailable
from chat.base.db import db_read
from chat.delivery import groups
from chat.delivery.messages import ChatMessage, GatewayMessage
from chat.httpapi.errors import ApiError
from chat.runtime.executor import DatabaseWait, DatabaseWaitOver
from chat.runtime.gateway import runtime
from chat.websocket.access import Identity, verdict
from sessions_app import gateway_reads, tokens
from sessions_app.models import Run, ToolApproval, ToolCall

POLL_SECONDS = 1.0  # the run is read at least this often while followed (events may be lost)
TERMINAL_CHAT_STATES = ("final", "aborted", "error")
T = TypeVar("T")


@dataclass(frozen=True)
class Status:
    """The run is open in this state (queued, dispatching, running): sent first and at each change."""

    run: Run


@dataclass(frozen=True)
class Text:
    """New reply text: `delta`, after which the stored reply is `end` characters long."""

    delta: str
    end: int


@dataclass(frozen=True)
class Tools:
    """The run's tool calls (in order) and its pending approvals, as they are now (sent when changed)."""

    calls: tuple[ToolCall, ...]
    approvals: tuple[ToolApproval, ...]


@dataclass(frozen=True)
class Ended:
    """The run has ended (None: it went with its deleted session), with its tool calls as they ended."""

    run: Run | None
    calls: tuple[ToolCall, ...] = ()


Update = Status | Text | Tools | Ended


class KeyRevoked(ApiError):
    """The caller's key was revoked while its answer was under way."""


def revoked() -> KeyRevoked:
    return KeyRevoked(401, "the API key of this request was revoked", code="key_revoked")


RunHook = Callable[[Run], Awaitable[None]]


async def read_patiently(fn: Callable[..., T], *args: Any) -> T:
    """A read for a followed run, tried again while the database is away for as long as a run waits
    for it (GATEWAY_RUN_DB_WAIT_SECONDS); then `DatabaseUnavailable`."""
    try:
        return await DatabaseWait().patiently(db_read, fn, *args)
    except DatabaseWaitOver:
        limit = settings.GATEWAY_RUN_DB_WAIT_SECONDS
        raise DatabaseUnavailable(f"away for more than {limit:g} s (GATEWAY_RUN_DB_WAIT_SECONDS)") from None


def chat_text(payload: dict[str, Any]) -> str | None:
    """The reply text a `chat` payload carries (None: it carries none)."""
    message = payload.get("message")
    if not isinstance(message, dict):
        return None
    return "".join(p.get("text", "") for p in message.get("content") or [] if isinstance(p, dict))


def pieces(reply: str, marks: list[int], sent: int) -> list[Text]:
    """The stored reply after `sent` characters, cut where its stored deltas ended."""
    cuts = [m for m in marks if isinstance(m, int) and sent < m <= len(reply)]
    if not cuts or cuts[-1] != len(reply):
        cuts.append(len(reply))
    out: list[Text] = []
    start = sent
    for cut in cuts:
        if cut > start:
            out.append(Text(reply[start:cut], cut))
            start = cut
    return out


@dataclass(eq=False)
class Follower:
    """The updates of one run of `owner_id`; `token_hash` ends them (401) when that key is revoked.

    `on_read` is called with the run each time it is read (the request's keeper uses it to stay
    attached)."""

    owner_id: int
    run_pk: int
    token_hash: str | None = None
    on_read: RunHook | None = None
    sent: int = 0  # reply characters handed on
    inbox: asyncio.Queue[GatewayMessage] = field(default_factory=asyncio.Queue)
    _state: str = ""
    _tools: tuple[Any, ...] = ()
    _tool_count: int = -1
    _recheck_at: float = field(default_factory=lambda: time.monotonic() + settings.GATEWAY_TICK_INTERVAL_MS / 1000)

    async def deliver(self, message: GatewayMessage) -> None:
        """A hub member: keep what concerns this run, and revocations (of this caller's key, maybe)."""
        kind = message["type"]
        if kind == "gateway.access" or (kind in ("gateway.chat", "gateway.tool") and message.get("run") == self.run_pk):
            self.inbox.put_nowait(message)

    async def updates(self) -> AsyncIterator[Update]:
        """Every update from what is stored now to the run's end (then it stops)."""
        group = groups.user_group(self.owner_id)
        await runtime.hub.join(group, self)
        try:
            async for update in self._follow():
                yield update
        finally:
            with contextlib.suppress(Exception):
                await runtime.hub.leave(group, self)

    async def _next(self, timeout: float) -> GatewayMessage | None:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self.inbox.get(), max(0.0, timeout))
        return None

    async def _follow(self) -> AsyncIterator[Update]:
        read_at = time.monotonic()
        for update in await self._catch_up(await self._read(), tools=True):
            yield update
            if isinstance(update, Ended):
                return
        while True:
            message = await self._next(read_at + POLL_SECONDS - time.monotonic())
            kind = message["type"] if message is not None else ""
            state = ""
            if message is not None and kind == "gateway.access":
                self._check_access(message)
            elif message is not None and kind == "gateway.chat":
                payload = cast(ChatMessage, message)["payload"]
                state = str(payload.get("state", ""))
                text = chat_text(payload) or ""
                if state == "delta" and len(text) > self.sent:  # the stored reply's next part, as sent live
                    yield Text(text[self.sent :], len(text))
                    self.sent = len(text)
            # read again at a change of state or tools, when nothing came, and every POLL_SECONDS anyway
            if kind in ("", "gateway.tool") or state not in ("", "delta") or time.monotonic() - read_at >= POLL_SECONDS:
                read_at = time.monotonic()
                for update in await self._catch_up(await self._read(), tools=kind == "gateway.tool"):
                    yield update
                    if isinstance(update, Ended):
                        return

    def _check_access(self, message: GatewayMessage) -> None:
        if message.get("owner") != self.owner_id:
            return
        if verdict(Identity(token_hash=self.token_hash), message) == "close":  # type: ignore[arg-type]
            raise revoked()

    async def _read(self) -> Run | None:
        if self.token_hash is not None and time.monotonic() >= self._recheck_at:
            # the backstop of a lost revocation message, as a WebSocket's tick
            self._recheck_at = time.monotonic() + settings.GATEWAY_TICK_INTERVAL_MS / 1000
            if not await read_patiently(tokens.still_authorized, self.owner_id, self.token_hash):
                raise revoked()
        run = await read_patiently(gateway_reads.get_run, self.run_pk)
        if run is not None and self.on_read is not None:
            await self.on_read(run)
        return run

    async def _catch_up(self, run: Run | None, *, tools: bool) -> list[Update]:
        """What the stored run adds to what was handed on: its state, text, tools, its end."""
        if run is None:
            return [Ended(None)]
        out: list[Update] = []
        if not run.is_terminal and run.state != self._state:
            self._state = run.state
            out.append(Status(run))
        found = pieces(run.reply, list(run.marks or []), self.sent)
        if found:
            self.sent = found[-1].end
            out.extend(found)
        calls: tuple[ToolCall, ...] = ()
        if run.tool_calls and (tools or run.tool_calls != self._tool_count or run.is_terminal):
            listed, pending = await read_patiently(gateway_reads.tools_of_run, run.pk)
            calls = tuple(listed)
            signature = tuple((c.call_id, c.state) for c in listed) + tuple(a.approval_id for a in pending)
            self._tool_count = run.tool_calls
            if signature != self._tools:
                self._tools = signature
                out.append(Tools(calls, tuple(pending)))
        if run.is_terminal:
            out.append(Ended(run, calls))
        return out
