"""What one connection has been told, and what it may be told next (no socket here).

Each run's events reach the client in `seq` order with exactly one terminal and
nothing after it; rows never go backwards; a repair snapshot yields just what this
connection missed. The consumer asks, and sends what it is given.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from chat.delivery import agent_events
from chat.delivery.first_sight import Stored
from chat.delivery.messages import ChatMessage, SessionMessage, ToolMessage
from chat.protocol import run_events
from chat.protocol.frames import encode
from chat.protocol.scopes import CAP_TOOL_EVENTS, Scope
from sessions_app.models import SessionKind

MAX_TRACKED_RUNS = 2000
# An event of a run unknown here written this long before the connection opened is not its news
# (some slack for the clocks of the processes, which write events and open connections).
STALE_EVENT_SECONDS = 2.0
MAX_TRACKED_ROWS = 5000
MAX_TRACKED_TOOLS = 2000
Event = tuple[str, dict[str, Any]]


@dataclass
class RunView:
    """What this connection has delivered of one run."""

    run_id: str
    session_key: str
    session_id: str
    seq: int = 0
    terminal: bool = False
    replied: int = 0  # how much reply text its `agent` assistant events have carried


@dataclass
class RowSeen:
    """The newest row this connection sent of one session (as sent: a dict, or the layer's JSON text)."""

    version: int
    deleted: bool
    row: dict[str, Any] | None = None
    row_json: str | None = None

    def full(self) -> dict[str, Any]:
        if self.row is None:
            self.row = json.loads(self.row_json or "{}")
        return self.row


@dataclass
class ToolView:
    """What this connection has delivered of one tool call (or approval): started, ended."""

    run_pk: int
    started: bool = False
    done: bool = False


@dataclass
class HeldRun:
    """The events of a run first heard of from an event, held (in order) until its stored state is known."""

    first: ChatMessage
    events: list[ChatMessage | ToolMessage]


@dataclass
class ConnectionState:
    """The per-connection view: identity, subscription, and the run and row filters."""

    user_id: int = 0
    username: str = ""
    scopes: list[str] = field(default_factory=list)
    authed: bool = False
    subscribed: bool = False
    subscribed_all: bool = False
    session_kinds: tuple[str, ...] = (SessionKind.DIRECT.value,)  # the kinds of sessions whose rows it is told of
    held_acks: int = 0
    connected_at: datetime = field(default_factory=timezone.now)
    runs: OrderedDict[int, RunView] = field(default_factory=OrderedDict)
    rows: OrderedDict[int, RowSeen] = field(default_factory=OrderedDict)
    caps: frozenset[str] = frozenset()
    status_phases: dict[str, str] | None = None  # `run_events.status_phases`: None = §5's phases as they are
    tools: OrderedDict[str, ToolView] = field(default_factory=OrderedDict)  # by toolCallId
    approvals: OrderedDict[str, ToolView] = field(default_factory=OrderedDict)  # by approval id
    held: dict[int, HeldRun] = field(default_factory=dict)  # by run pk: awaiting `first_sight`
    # time.monotonic() since when it hears every event of its groups (inf while joining one)
    listening_since: float = math.inf

    @property
    def is_admin(self) -> bool:
        return Scope.ADMIN in self.scopes

    # --- what methods tell it -------------------------------------------------------------------

    def track_run(self, run_pk: int, *, terminal: bool, run_id: str, session_key: str, session_id: str) -> None:
        """Remember a run this client knows of; a terminal ack closes it for this connection."""
        view = self.runs.get(run_pk)
        if view is None:
            view = RunView(run_id, session_key, session_id)
            self._remember(run_pk, view)
        if terminal:
            view.terminal = True

    def set_subscription(
        self, subscribed: bool, *, all_sessions: bool = False, kinds: tuple[str, ...] = (SessionKind.DIRECT.value,)
    ) -> None:
        self.subscribed = subscribed
        self.subscribed_all = subscribed and all_sessions
        self.session_kinds = kinds

    # --- filters ------------------------------------------------------------------------------

    def may_see(self, owner_id: int, *, via_operators: bool = False) -> bool:
        """Own sessions come through the user group; others' only to admins subscribed to all."""
        own = owner_id == self.user_id
        if via_operators:
            return not own and self.subscribed_all and self.is_admin
        return own or (self.subscribed_all and self.is_admin)

    def admit_chat(self, run_pk: int, payload: dict[str, Any], *, written_at: float | None = None) -> bool:
        """Whether this run event is news here: in `seq` order, nothing after a terminal, and
        not an event of a run it never knew that was written before it connected.

        A layer that lags (a loaded process) may hand a new connection events seconds old.
        Taken, they would make it follow a run that, as like as not, ended before it
        connected; repair (like `repair.connection_events`' ended runs) never tells a connection of
        those. What it knows of such runs comes from `sessions.list` and `chat.history`.
        """
        view = self.runs.get(run_pk)
        if view is None:
            if self._stale(written_at):
                return False
            view = RunView(payload["runId"], payload["sessionKey"], payload["sessionId"])
            self._remember(run_pk, view)
        self.runs.move_to_end(run_pk)
        seq = int(payload.get("seq", 0))
        if view.terminal or seq <= view.seq:
            return False
        view.seq = seq
        view.terminal = payload.get("state") in run_events.TERMINAL_CHAT_STATES
        return True

    def _stale(self, written_at: float | None) -> bool:
        # live events say when they were written (`ChatMessage.at`); repair's come from the database
        return written_at is not None and written_at < self.connected_at.timestamp() - STALE_EVENT_SECONDS

    def first_heard(self, run_pk: int, payload: dict[str, Any], *, written_at: float | None = None) -> bool:
        """Whether this run event is the first this connection hears of its run, and may be news:
        then it waits for the run as stored (`chat.delivery.first_sight`, then `settle`).

        A late event of a run that has already ended must not leave the connection following
        a run whose terminal went out before it listened. A terminal leaves nothing open: not held.
        """
        return (
            run_pk not in self.runs
            and payload.get("state") not in run_events.TERMINAL_CHAT_STATES
            and not self._stale(written_at)
        )

    def settle(self, run_pk: int, stored: Stored | None) -> None:
        """What the held events of a run first heard of come to, now that it is found stored (None:
        not known, the database away): open, they are followed; ended, only its terminal is
        sent, if its end is news here; gone with its session, nothing. Never a dangling delta."""
        held = self.held[run_pk]
        first = held.first["payload"]
        ident = {"run_id": first["runId"], "session_key": first["sessionKey"], "session_id": first["sessionId"]}
        if stored is None or stored.open:
            self.track_run(run_pk, terminal=False, **ident)  # repair ends it, if it goes unannounced
            return
        terminal = stored.terminal
        if terminal is not None and (run_pk in self.runs or self.ended_news(stored.ended_at)):
            terminal = terminal.copy()
            if "via" in held.first:  # as it came: the filters know who may see it
                terminal["via"] = held.first["via"]
            held.events = [terminal]  # what it came to, in place of old news (tool events included)
            self.track_run(run_pk, terminal=False, **ident)
        else:
            held.events = []
            self.track_run(run_pk, terminal=True, **ident)

    def ended_news(self, ended_at: datetime | None) -> bool:
        """Whether a run that ended then is news here: not if it ended before this connection opened
        (what it knows of such runs comes from `sessions.list` and `chat.history`)."""
        return ended_at is None or ended_at >= self.connected_at

    def chat_json(self, payload: dict[str, Any], encoded: str) -> str | None:
        """An admitted `chat` event as this client is told it (None: not at all): a status phase
        only in the words it reads (`status_phases`), everything else as encoded once."""
        if self.status_phases is None or payload.get("state") != run_events.ChatState.STATUS:
            return encoded
        phase = self.status_phases.get(str(payload.get("phase")))
        return None if phase is None else encode({**payload, "phase": phase})

    def admit_row(self, session_pk: int, payload: dict[str, Any]) -> bool:
        """Whether this `sessions.changed` is news here: subscribed, and never older than what was sent."""
        row = payload["session"]
        if row.get("kind", SessionKind.DIRECT.value) not in self.session_kinds:
            return False
        return self._admit_row(session_pk, RowSeen(row["version"], bool(row.get("deleted")), row=row))

    def admit_encoded_row(self, message: SessionMessage) -> bool:
        """`admit_row` for a layer message whose payload is already encoded (`delivery.session_message`)."""
        if message.get("kind", SessionKind.DIRECT.value) not in self.session_kinds:
            return False
        seen = RowSeen(message["version"], message["deleted"], row_json=message["row"])
        return self._admit_row(int(message["session"]), seen)

    def _admit_row(self, session_pk: int, seen: RowSeen) -> bool:
        if not self.subscribed:
            return False
        known = self.rows.get(session_pk)
        if known is not None and (seen.version < known.version or known.deleted):
            return False
        self.rows[session_pk] = seen
        self.rows.move_to_end(session_pk)
        while len(self.rows) > MAX_TRACKED_ROWS:
            self.rows.popitem(last=False)
        return True

    def tool_events(self, message: ToolMessage) -> list[Event]:
        """The events of a tool message that are news here: each call's start once, its result once
        (even after its run's terminal, or without a start), approvals once requested and once resolved.

        The `agent` stream goes to connections that declared the cap `tool-events`; the
        `plugin.approval.*` events to the owner's connections holding `operator.approvals`.
        """
        if CAP_TOOL_EVENTS not in self.caps and Scope.APPROVALS not in self.scopes:
            return []  # nothing of it is for this connection (and nothing to track for repair)
        event = message["event"]
        is_approval = event.startswith("approval")
        ident = message["agent"]["data"]["approvalId"] if is_approval else message["call"]
        seen = self.approvals if is_approval else self.tools
        view = seen.get(ident)
        if event == "update":
            news = view is not None and view.started and not view.done
        elif event in ("result", "approval.resolved"):
            news = view is None or not view.done
        else:
            news = view is None
        if not news:
            return []
        if view is None:
            view = seen[ident] = ToolView(int(message["run"]))
            while len(seen) > MAX_TRACKED_TOOLS:
                seen.popitem(last=False)
        if event != "update":
            view.started = True
            view.done = event in ("result", "approval.resolved")
        events: list[Event] = []
        if CAP_TOOL_EVENTS in self.caps:
            events.append(("agent", message["agent"]))
        plugin = message.get("plugin")
        if plugin is not None and Scope.APPROVALS in self.scopes and int(message["owner"]) == self.user_id:
            events.append(("plugin.approval.resolved" if view.done else "plugin.approval.requested", plugin))
        return events

    def open_tool_ids(self) -> tuple[list[str], list[str]]:
        """The calls and approvals this connection saw begin and not end (repair asks after them)."""
        return (
            [i for i, v in self.tools.items() if not v.done],
            [i for i, v in self.approvals.items() if not v.done],
        )

    def open_run_pks(self) -> list[int]:
        return [pk for pk, view in self.runs.items() if not view.terminal]

    def follow(self, run_pk: int, chat: dict[str, Any], facts: dict[str, Any] | None) -> list[Event]:
        """A `chat` event this connection admitted, followed by its `agent` events (§12): what
        this connection has had of the reply decides what they carry."""
        if run_pk < 0:  # an inline command's answer (`run_events.command_event_key`): no run, no `agent` stream
            return [("chat", chat)]
        view = self.runs.get(run_pk)
        payloads, replied = agent_events.agent_events(chat, facts, view.replied if view is not None else 0)
        if view is not None:
            view.replied = replied
        return [("chat", chat), *(("agent", p) for p in payloads)]

    def _remember(self, run_pk: int, view: RunView) -> None:
        self.runs[run_pk] = view
        self.runs.move_to_end(run_pk)
        while len(self.runs) > MAX_TRACKED_RUNS:
            self.runs.popitem(last=False)
