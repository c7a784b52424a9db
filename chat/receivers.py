"""From lifecycle signals to the wire: events encoded in the transaction, sent after commit.

The payloads are built while the transaction still holds the session lock, from the
rows as written, so every event says exactly what was committed with it; they leave
the process only from on-commit callbacks. Connected in `ChatConfig.ready`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from sessions_app.models import ACTIVE_STATES, TERMINAL_STATES, ChatSession, Run, RunState

from . import wire
from .delivery import broadcaster, chat_message, session_message
from .runtime import hooks


def on_run_transitioned(
    sender: Any, run: Run, session: ChatSession, from_state: str, to_state: str, reason: str,
    row_changed: bool, **kwargs: Any,
) -> None:
    owner_id = session.owner_id
    # Broadcasts are queued first: the hooks below may wake this run's worker, whose next
    # transition must not overtake this one's events. Every callback is robust, so a failed
    # broadcast never costs a run its worker (repair re-sends what a broadcast lost).
    event = chat_message(owner_id, run.pk, wire.chat_payload(run, session.key))
    transaction.on_commit(partial(broadcaster.send, owner_id, event), robust=True)
    if row_changed:
        row = wire.session_rows([session])[0]
        message = session_message(owner_id, session.pk, wire.row_event(row, reason, run.run_id))
        transaction.on_commit(partial(broadcaster.send, owner_id, message), robust=True)
    if to_state == RunState.DISPATCHING:
        transaction.on_commit(partial(hooks.run_dispatching, run.pk, run.owner_process), robust=True)
    elif to_state in TERMINAL_STATES and from_state in ACTIVE_STATES:
        transaction.on_commit(partial(hooks.run_ended, run.pk, run.owner_process), robust=True)
    transaction.on_commit(partial(hooks.run_changed, run.pk), robust=True)


def on_session_changed(sender: Any, session: ChatSession, reason: str, deleted: bool = False, **kwargs: Any) -> None:
    row = wire.session_rows([session])[0]
    if deleted:
        row["deleted"] = True
    message = session_message(session.owner_id, session.pk, wire.row_event(row, reason))
    transaction.on_commit(partial(broadcaster.send, session.owner_id, message), robust=True)
