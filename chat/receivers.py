"""From lifecycle signals to the wire: events encoded in the transaction, sent after commit.

The payloads are built while the transaction still holds the session lock, from the
rows as written, so every event says exactly what was committed with it; they leave
the process only from on-commit callbacks. A session row that changes several times in
one transaction (a run ends and the next starts; a session created by its first send)
is announced once per change, each event carrying the row as committed: a client never
sees an intermediate row that is older than what its ack already told it. Connected in
`ChatConfig.ready`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import transaction

from sessions_app.models import ACTIVE_STATES, TERMINAL_STATES, ChatSession, Run, RunState

from . import agent, wire
from .delivery import broadcaster, chat_message, session_message
from .runtime import hooks


def on_run_transitioned(
    sender: Any,
    run: Run,
    session: ChatSession,
    from_state: str,
    to_state: str,
    reason: str,
    row_changed: bool,
    **kwargs: Any,
) -> None:
    owner_id = session.owner_id
    # Broadcasts are queued first: the hooks below may wake this run's worker, whose next
    # transition must not overtake this one's events. Every callback is robust, so a failed
    # broadcast never costs a run its worker (repair re-sends what a broadcast lost).
    event = chat_message(owner_id, run.pk, wire.chat_payload(run, session.key))
    event["agent"] = agent.run_facts(run)  # what its `agent` events add to the chat payload
    transaction.on_commit(partial(broadcaster.send, owner_id, event), robust=True)
    if row_changed:
        _row_changed(session, reason, run.run_id)
    if to_state == RunState.DISPATCHING:
        run.session = session  # in hand: the executor needs no read to start it
        transaction.on_commit(partial(hooks.run_dispatching, run, run.owner_process), robust=True)
    elif to_state in TERMINAL_STATES and from_state in ACTIVE_STATES:
        transaction.on_commit(partial(hooks.run_ended, run.pk, run.owner_process), robust=True)
    transaction.on_commit(partial(hooks.run_changed, run.pk), robust=True)


def on_session_changed(sender: Any, session: ChatSession, reason: str, deleted: bool = False, **kwargs: Any) -> None:
    _row_changed(session, reason, None, deleted=deleted)


@dataclass
class _PendingRow:
    """The row changes of one session in one transaction, announced once it commits."""

    owner_id: int
    session_pk: int
    changes: list[tuple[str, str | None]] = field(default_factory=list)  # (reason, runId)
    row: dict[str, Any] = field(default_factory=dict)

    flushed: bool = False

    def flush(self) -> None:
        if self.flushed:
            return  # registered once per change; the first call after the commit sends them all
        self.flushed = True
        if _pending().get(self.session_pk) is self:
            del _pending()[self.session_pk]
        changes = self.changes
        if self.row.get("deleted"):
            changes = [c for c in changes if c[0] == "delete"][-1:]  # gone: only its deletion is news
        for reason, run_id in changes:
            event = wire.row_event(self.row, reason, run_id)
            broadcaster.send(self.owner_id, session_message(self.owner_id, self.session_pk, event))


_local = threading.local()


def _pending() -> dict[int, _PendingRow]:
    pending: dict[int, _PendingRow] | None = getattr(_local, "rows", None)
    if pending is None:
        pending = _local.rows = {}
    return pending


def _row_changed(session: ChatSession, reason: str, run_id: str | None, *, deleted: bool = False) -> None:
    row = wire.session_rows([session])[0]
    if deleted:
        row["deleted"] = True
    pending = _pending()
    holder = pending.get(session.pk)
    # A holder whose callback is no longer waiting for this connection's commit belongs to
    # a transaction that rolled back: start afresh.
    waiting = transaction.get_connection().run_on_commit
    if holder is None or holder.flushed or not any(callback[1] == holder.flush for callback in waiting):
        if len(pending) > 1000:  # holders left behind by rollbacks
            pending.clear()
        holder = pending[session.pk] = _PendingRow(session.owner_id, session.pk)
    holder.changes.append((reason, run_id))
    holder.row = row
    transaction.on_commit(holder.flush, robust=True)
