"""From lifecycle signals to the wire: events encoded in the transaction, sent after commit.

The payloads are built while the transaction still holds the session lock, from the
rows as written, so every event says exactly what was committed with it; they leave
the process only from on-commit callbacks. A session row that changes several times in
one transaction (a run ends and the next starts; a session created by its first send)
is announced once per change, each event carrying the row as committed: a client never
sees an intermediate row that is older than what its ack already told it. A change undone
with its savepoint (a failed write of the writer's batch) is neither announced nor lent
its row to the others. Connected by `chat.wiring`, which also hands in this process's runtime
(`RunHooks`): the runtime sits above delivery and is told through the hooks, never imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from django.db import transaction

from chat.base import metrics
from chat.delivery import agent_events
from chat.delivery.broadcaster import broadcaster, chat_message, session_message, tool_message
from chat.protocol import run_events, tool_events
from chat.protocol.session_rows import row_event, session_rows
from sessions_app.gateway_reads import queues_of
from sessions_app.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    ChatSession,
    CommandReceipt,
    Run,
    RunState,
    ToolApproval,
    ToolCall,
)


class RunHooks(Protocol):
    """What this process's runtime is told after a commit (`chat.runtime.hooks`): each returns at once."""

    def run_dispatching(self, run: Run, owner_process: str) -> None: ...

    def run_ended(self, run_pk: int, owner_process: str) -> None: ...

    def run_changed(self, run_pk: int) -> None: ...

    def tool_changed(self, call_pk: int, run_pk: int) -> None: ...


class _NoRuntime:
    """Until the runtime is wired in (a management command that imports no runtime): nothing to tell."""

    def run_dispatching(self, run: Run, owner_process: str) -> None:
        return None

    def run_ended(self, run_pk: int, owner_process: str) -> None:
        return None

    def run_changed(self, run_pk: int) -> None:
        return None

    def tool_changed(self, call_pk: int, run_pk: int) -> None:
        return None


hooks: RunHooks = _NoRuntime()


def use_hooks(runtime_hooks: RunHooks) -> None:
    """Tell this process's runtime of committed changes from now on (`chat.wiring`)."""
    global hooks
    hooks = runtime_hooks


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
    event = chat_message(owner_id, run.pk, run_events.chat_payload(run, session.key))
    event["agent"] = agent_events.run_facts(run)  # what its `agent` events add to the chat payload
    transaction.on_commit(partial(broadcaster.send, owner_id, event), robust=True)
    if row_changed:
        _row_changed(session, reason, run.run_id)
    if to_state == RunState.DISPATCHING:
        run.session = session  # in hand: the executor needs no read to start it
        transaction.on_commit(partial(hooks.run_dispatching, run, run.owner_process), robust=True)
    elif to_state in TERMINAL_STATES and from_state in ACTIVE_STATES:
        transaction.on_commit(partial(hooks.run_ended, run.pk, run.owner_process), robust=True)
    transaction.on_commit(partial(hooks.run_changed, run.pk), robust=True)


def on_tool_changed(
    sender: Any,
    call: ToolCall,
    run: Run,
    session: ChatSession,
    event: str,
    seq: int,
    approval: ToolApproval | None = None,
    **kwargs: Any,
) -> None:
    """A tool call's or approval's event, encoded now from the rows as written, sent after commit."""
    plugin = None
    if event == "start":
        data = tool_events.tool_start_data(call)
    elif event == "result":
        data = tool_events.tool_result_data(call)
        took = None if call.duration_ms is None else call.duration_ms / 1000
        ended = partial(metrics.tool_call_ended, call.server, call.state, call.error_kind, took)
        transaction.on_commit(ended, robust=True)
    elif event in ("approval", "approval.resolved") and approval is not None:
        data = tool_events.approval_data(approval, call)
        make = tool_events.approval_resolved if approval.decision else tool_events.approval_request
        plugin = make(approval, call, run, session.key)
    else:
        transaction.on_commit(partial(hooks.tool_changed, call.pk, run.pk), robust=True)
        return  # a change with no event of its own (a call started, an approval allowed)
    stream = "approval" if event.startswith("approval") else "tool"
    message = tool_message(
        session.owner_id,
        run.pk,
        call.call_id,
        event,
        run_events.agent_event(run, session.key, seq, stream, data),
        plugin,
    )
    transaction.on_commit(partial(broadcaster.send, session.owner_id, message), robust=True)
    transaction.on_commit(partial(hooks.tool_changed, call.pk, run.pk), robust=True)


def on_command_stored(sender: Any, session: ChatSession, receipt: CommandReceipt, **kwargs: Any) -> None:
    """An inline command's exchange, stored in the transcript: to the owner's connections after
    commit as any transcript change is, the `chat` `final` the sender gets before its ack (whose
    connection drops this copy: its handler closed the key for it)."""
    payload = run_events.command_final(session.key, receipt)
    event = chat_message(session.owner_id, run_events.command_event_key(receipt.pk), payload)
    transaction.on_commit(partial(broadcaster.send, session.owner_id, event), robust=True)


def on_session_changed(sender: Any, session: ChatSession, reason: str, deleted: bool = False, **kwargs: Any) -> None:
    _row_changed(session, reason, None, deleted=deleted)


@dataclass(slots=True, eq=False)
class _Change:
    """One change of a session row, as written; `committed` once its savepoints have all held."""

    holder: _PendingRow
    reason: str
    run_id: str | None
    row: dict[str, Any]
    committed: bool = False

    def mark(self) -> None:
        """On commit: this change is part of what committed (Django drops it with a rolled-back savepoint)."""
        self.committed = True

    def flush(self) -> None:
        """On commit: the entry of the holder's latest change, last of its entries, flushes it."""
        if self.holder.changes[-1] is self:
            self.holder.flush()


@dataclass(eq=False)
class _PendingRow:
    """The row changes of one session in one transaction, announced once it commits.

    Each change registers its own `mark` with `on_commit`, so a savepoint that rolls back
    takes its marks with it. Then it appends a flush entry that names no savepoint, so
    only a full rollback discards it; the latest change's entry, last of the holder's, runs
    after every mark that survived and sends only those changes, each with the last one's
    row (the earlier changes' entries, superseded, do nothing).
    """

    owner_id: int
    session_pk: int
    changes: list[_Change] = field(default_factory=list)
    flushed: bool = False
    # The latest change's flush function, as it stands in Django's on-commit entries
    # `(savepoint ids, func, robust)`: a savepoint's rollback rebuilds those tuples, the
    # function in them stays the same object.
    flush_fn: Callable[[], None] | None = None

    def flush(self) -> None:
        """Send the changes that committed, each with the committed row."""
        if self.flushed:
            return  # sent already
        self.flushed = True
        if _pending().get(self.session_pk) is self:
            del _pending()[self.session_pk]
        changes = [change for change in self.changes if change.committed]
        if not changes:
            return  # every change was rolled back with its savepoint
        row = changes[-1].row  # the row as committed: what the last surviving change wrote
        if row.get("deleted"):
            changes = [c for c in changes if c.reason == "delete"][-1:]  # gone: only its deletion is news
        for change in changes:
            event = row_event(row, change.reason, change.run_id)
            broadcaster.send(self.owner_id, session_message(self.owner_id, self.session_pk, event))


_local = threading.local()


def _pending() -> dict[int, _PendingRow]:
    pending: dict[int, _PendingRow] | None = getattr(_local, "rows", None)
    if pending is None:
        pending = _local.rows = {}
    return pending


def _waiting(waiting: list[Any], fn: object) -> bool:
    """Whether the function `fn` still waits in the on-commit list."""
    # From the end, by identity: a holder's entry is usually among the last registered.
    return fn is not None and any(entry[1] is fn for entry in reversed(waiting))


def _row_changed(session: ChatSession, reason: str, run_id: str | None, *, deleted: bool = False) -> None:
    row = session_rows([session], queues_of([session]))[0]
    if deleted:
        row["deleted"] = True
    connection = transaction.get_connection()
    if not connection.in_atomic_block:  # autocommit: already committed, sent now
        alone = _PendingRow(session.owner_id, session.pk)
        alone.changes.append(_Change(alone, reason, run_id, row, committed=True))
        transaction.on_commit(alone.flush, robust=True)
        return
    pending = _pending()
    holder = pending.get(session.pk)
    # A holder whose flush is no longer waiting for this connection's commit belongs to a
    # transaction that rolled back (a full rollback clears the list): start afresh.
    if holder is None or holder.flushed or not _waiting(connection.run_on_commit, holder.flush_fn):
        if len(pending) > 1000:  # holders left behind by rollbacks
            pending.clear()
        holder = pending[session.pk] = _PendingRow(session.owner_id, session.pk)
    change = _Change(holder, reason, run_id, row)
    holder.changes.append(change)
    transaction.on_commit(change.mark, robust=True)
    # Appended, never moved (test helpers such as captureOnCommitCallbacks index into the
    # list): no savepoint ids, so a savepoint's rollback keeps it.
    holder.flush_fn = change.flush  # one bound method, the very object the entry holds
    # Django's private on-commit list: no public call registers outside the current savepoint. What
    # this relies on is pinned by test_receivers.py::test_django_on_commit_list_behaves_as_the_row_holders_rely_on.
    connection.run_on_commit.append((set(), holder.flush_fn, True))
