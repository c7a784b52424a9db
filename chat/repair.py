"""Delivery repair (§9), batched per process.

Channel layers drop messages when a channel is full and do not order messages across
groups. Every `GATEWAY_REPAIR_SECONDS / 2` the run manager asks the database, once
for all connections of the process, for what changed since their last pass: the
terminal state of runs they saw open, runs of their owners that ended, rows that
changed and sessions that disappeared. Each connection then takes its share and
sends what it missed; its own filters drop what it already sent.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from sessions_app import selectors
from sessions_app.models import TERMINAL_STATES, ChatSession, Run

from . import protocol
from .db import db_sync_to_async

log = logging.getLogger(__name__)
BATCH = 500


@dataclass
class EndedRun:
    owner_id: int
    ended_at: datetime
    payload: dict[str, Any]


@dataclass
class Snapshot:
    """What the database says, for the union of the connections' interests."""

    asked: set[int] = field(default_factory=set)  # the open runs asked about
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)  # of those, the ones found: state (+ payload)
    ended: dict[int, EndedRun] = field(default_factory=dict)  # runs of the owners that ended lately
    ended_until: datetime | None = None  # set when the batch was full: the next scan starts here
    rows: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # session pk -> (owner, row)
    rows_until: datetime | None = None
    checked: set[int] = field(default_factory=set)  # session pks whose existence was checked
    existing: set[int] = field(default_factory=set)


class Repairable(Protocol):
    authed: bool
    user_id: int
    subscribed: bool
    subscribed_all: bool
    connected_at: datetime
    run_watermark: datetime
    row_watermark: datetime
    rows: Any

    def open_run_pks(self) -> list[int]: ...
    async def apply_repair(self, snap: Snapshot, scan_started: datetime) -> None: ...


def margin() -> timedelta:
    """How far back each scan looks again: a transaction's timestamps precede its commit."""
    return timedelta(seconds=max(5.0, settings.GATEWAY_REPAIR_SECONDS * 2))


def take_snapshot(
    open_runs: set[int], owners: set[int] | None, runs_since: datetime, rows_since: datetime | None,
    known_sessions: set[int],
) -> Snapshot:
    """Read everything one repair pass needs, in a handful of indexed queries."""
    snap = Snapshot(asked=set(open_runs))
    if open_runs:
        for run in Run.objects.select_related("session").filter(pk__in=open_runs):
            entry: dict[str, Any] = {"state": run.state}
            if run.state in TERMINAL_STATES:
                entry["payload"] = protocol.chat_payload_for_run(run, run.session.key)
            snap.runs[run.pk] = entry
    ended = Run.objects.select_related("session").filter(ended_at__gte=runs_since).order_by("ended_at")
    if owners is not None:
        ended = ended.filter(session__owner_id__in=owners)
    batch = list(ended[:BATCH])
    for run in batch:
        assert run.ended_at is not None
        snap.ended[run.pk] = EndedRun(
            run.session.owner_id, run.ended_at, protocol.chat_payload_for_run(run, run.session.key)
        )
    if len(batch) == BATCH:
        snap.ended_until = batch[-1].ended_at
    if rows_since is not None:
        changed = selectors.owner_sessions(None).filter(updated_at__gte=rows_since)
        if owners is not None:
            changed = changed.filter(owner_id__in=owners)
        page = list(changed.order_by("updated_at")[:BATCH])
        for session, row in zip(page, selectors.session_rows(page), strict=True):
            snap.rows[session.pk] = (session.owner_id, row)
        if len(page) == BATCH:
            snap.rows_until = page[-1].updated_at
    if known_sessions:
        snap.checked = set(known_sessions)
        snap.existing = set(ChatSession.objects.filter(pk__in=known_sessions).values_list("pk", flat=True))
    return snap


async def repair(connections: list[Repairable]) -> None:
    """One repair pass for these connections (all of a process's, or one being closed)."""
    live = [c for c in connections if c.authed]
    if not live:
        return
    scan_started = timezone.now()
    back = margin()
    open_runs: set[int] = set()
    for c in live:
        open_runs.update(c.open_run_pks())
    owners = None if any(c.subscribed_all for c in live) else {c.user_id for c in live}
    runs_since = min(max(c.run_watermark - back, c.connected_at) for c in live)
    subscribed = [c for c in live if c.subscribed]
    rows_since = min(c.row_watermark for c in subscribed) - back if subscribed else None
    known: set[int] = set()
    for c in subscribed:
        known.update(c.rows)
    snap = await db_sync_to_async(take_snapshot)(open_runs, owners, runs_since, rows_since, known)
    for c in live:
        with contextlib.suppress(Exception):  # one closing socket must not stop the others
            await c.apply_repair(snap, scan_started)
