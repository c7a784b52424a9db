"""Delivery repair (§9), batched per process.

Channel layers drop messages when a channel is full and do not order messages across
groups. Every `GATEWAY_REPAIR_SECONDS / 2` the run manager asks the database, once
for all connections of the process, for what changed since its last pass: the
terminal state of runs the connections saw open, runs that ended, rows that changed
and known sessions that disappeared. Each connection takes its share and sends what
it missed; its own filters drop what it already sent.

The process keeps one scan position per stream (ended runs, changed rows). When it
is caught up, each pass looks back a margin (a transaction's timestamps precede its
commit); when a burst fills a batch, the next pass continues from a keyset cursor
(timestamp, pk), so the scan always moves forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from chat.base.db import db_read
from chat.delivery import agent_events
from chat.delivery.broadcaster import tool_message
from chat.delivery.connection import ConnectionState, Event
from chat.delivery.messages import ToolMessage
from chat.protocol import run_events, session_rows, tool_events
from sessions_app import gateway_reads
from sessions_app.models import TERMINAL_STATES

log = logging.getLogger(__name__)
BATCH = 500


@dataclass
class EndedRun:
    owner_id: int
    ended_at: datetime
    payload: dict[str, Any]
    facts: dict[str, Any] | None = None  # for its `agent` events


@dataclass
class Snapshot:
    """What the database says, for the union of the connections' interests."""

    asked: set[int] = field(default_factory=set)  # the open runs asked about
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)  # of those, the ones found: state (+ payload)
    ended: dict[int, EndedRun] = field(default_factory=dict)  # runs that ended since the last pass
    rows: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # session pk -> (owner, row)
    checked: set[int] = field(default_factory=set)  # session pks whose existence was checked
    existing: set[int] = field(default_factory=set)
    tools: list[ToolMessage] = field(default_factory=list)  # results and resolutions of those asked about


@dataclass
class Position:
    """Where one scan resumes: caught up at `since`, or mid-burst after `cursor`."""

    since: datetime
    cursor: tuple[datetime, int] | None = None

    def window(self) -> dict[str, Any]:
        """Where the next read starts: after the cursor, or the margin before `since`."""
        return {"cursor": self.cursor, "since": self.since - margin()}

    def advance(self, batch: list[Any], ts: str, scan_started: datetime) -> None:
        if len(batch) == BATCH:
            self.cursor = (getattr(batch[-1], ts), batch[-1].pk)
        else:
            self.cursor = None
            self.since = scan_started


@dataclass
class Scanner:
    """The scan positions of one process."""

    runs: Position = field(default_factory=lambda: Position(timezone.now()))
    rows: Position = field(default_factory=lambda: Position(timezone.now()))


class Repairable(Protocol):
    """A connection: its state, and a way to send it events."""

    state: ConnectionState

    async def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None: ...


def margin() -> timedelta:
    """How far back a caught-up scan looks again: a transaction's timestamps precede its commit."""
    return timedelta(seconds=max(5.0, settings.GATEWAY_REPAIR_SECONDS * 2))


def take_snapshot(
    scanner: Scanner,
    open_runs: set[int],
    owners: set[int] | None,
    want_rows: bool,
    known_sessions: set[int],
    open_tools: tuple[set[str], set[str]] = (set(), set()),
) -> Snapshot:
    """Read everything one repair pass needs, in a handful of indexed queries."""
    scan_started = timezone.now()
    snap = Snapshot(asked=set(open_runs))
    if open_runs:
        for run in gateway_reads.runs_with_sessions(open_runs):
            entry: dict[str, Any] = {"state": run.state}
            if run.state in TERMINAL_STATES:
                entry["payload"] = run_events.chat_payload(run, run.session.key)
                entry["facts"] = agent_events.run_facts(run)
            snap.runs[run.pk] = entry
    batch = gateway_reads.ended_runs(**scanner.runs.window(), owners=owners, limit=BATCH)
    for run in batch:
        assert run.ended_at is not None
        snap.ended[run.pk] = EndedRun(
            run.session.owner_id,
            run.ended_at,
            run_events.chat_payload(run, run.session.key),
            agent_events.run_facts(run),
        )
    scanner.runs.advance(batch, "ended_at", scan_started)
    if want_rows:
        page = gateway_reads.changed_sessions(**scanner.rows.window(), owners=owners, limit=BATCH)
        for session, row in zip(page, session_rows.session_rows(page, gateway_reads.queues_of(page)), strict=True):
            snap.rows[session.pk] = (session.owner_id, row)
        scanner.rows.advance(page, "updated_at", scan_started)
    else:
        scanner.rows = Position(scan_started)  # nobody listens: start from now when someone does
    if known_sessions:
        snap.checked = set(known_sessions)
        snap.existing = gateway_reads.existing_session_pks(known_sessions)
    calls, approvals = open_tools
    for call in gateway_reads.ended_tool_calls(calls):
        run = call.run
        data = tool_events.tool_result_data(call)
        agent = run_events.agent_event(run, run.session.key, run.stream_seq, "tool", data)
        snap.tools.append(tool_message(run.session.owner_id, run.pk, call.call_id, "result", agent))
    for approval in gateway_reads.resolved_approvals(approvals):
        call = approval.tool_call
        run = call.run
        agent = run_events.agent_event(
            run, run.session.key, run.stream_seq, "approval", tool_events.approval_data(approval, call)
        )
        plugin = tool_events.approval_resolved(approval, call, run, run.session.key)
        snap.tools.append(tool_message(run.session.owner_id, run.pk, call.call_id, "approval.resolved", agent, plugin))
    return snap


def connection_events(state: ConnectionState, snap: Snapshot) -> list[Event]:
    """One connection's share of a repair snapshot; its filters drop what it already had."""
    events: list[Event] = []
    for pk, ended in snap.ended.items():
        # not runs that ended before this connection existed: they are not its news
        if state.ended_news(ended.ended_at) and state.may_see(ended.owner_id) and state.admit_chat(pk, ended.payload):
            events += state.follow(pk, ended.payload, ended.facts)
    for message in snap.tools:
        # before the run's own terminal below, as they were sent (a card ends before its run)
        if state.may_see(message["owner"]):
            events += state.tool_events(message)
    for pk in state.open_run_pks():
        if pk not in snap.asked:
            continue  # opened after the snapshot was read: the next pass covers it
        stored = snap.runs.get(pk)
        if stored is None:
            # Gone with its deleted session, and with it what its terminal was: nothing is
            # made up; the run is closed here, and the row's deletion says the rest.
            state.runs[pk].terminal = True
        elif stored["state"] in TERMINAL_STATES and state.admit_chat(pk, stored["payload"]):
            events += state.follow(pk, stored["payload"], stored.get("facts"))
    if not state.subscribed:
        return events
    for session_pk, (owner_id, row) in snap.rows.items():
        known = state.rows.get(session_pk)
        if state.may_see(owner_id) and (known is None or row["version"] > known.version):
            payload = session_rows.row_event(row, "resync")
            if state.admit_row(session_pk, payload):
                events.append(("sessions.changed", payload))
    for session_pk in [pk for pk in state.rows if pk in snap.checked and pk not in snap.existing]:
        known = state.rows[session_pk]
        if not known.deleted:
            payload = session_rows.row_event({**known.full(), "deleted": True, "version": known.version + 1}, "delete")
            if state.admit_row(session_pk, payload):
                events.append(("sessions.changed", payload))
    return events


async def repair(connections: list[Repairable], scanner: Scanner) -> None:
    """One repair pass for these connections (all of a process's)."""
    live = [c for c in connections if c.state.authed]
    if not live:
        return
    open_runs: set[int] = set()
    for c in live:
        open_runs.update(c.state.open_run_pks())
    owners = None if any(c.state.subscribed_all for c in live) else {c.state.user_id for c in live}
    subscribed = [c for c in live if c.state.subscribed]
    known: set[int] = set()
    for c in subscribed:
        known.update(c.state.rows)
    calls: set[str] = set()
    approvals: set[str] = set()
    for c in live:
        open_calls, open_approvals = c.state.open_tool_ids()
        calls.update(open_calls)
        approvals.update(open_approvals)
    snap = await db_read(take_snapshot, scanner, open_runs, owners, bool(subscribed), known, (calls, approvals))
    for c in live:
        try:
            events = connection_events(c.state, snap)
            if events:
                await c.send_events(events)
        except Exception:  # one connection must not stop the others; its failure is news (it misses events)
            log.warning("repair of one connection failed", exc_info=True)
