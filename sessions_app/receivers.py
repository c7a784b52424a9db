"""Signal receivers: the audit row in the transaction, broadcasts after commit."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from .models import ACTIVE_STATES, TERMINAL_STATES, ChatSession, LifecycleEvent, Run
from .signals import run_transitioned, session_changed


@receiver(run_transitioned)
def record_run_transition(
    sender: Any, run: Run, session: ChatSession, from_state: str, to_state: str, reason: str, actor: str,
    row_changed: bool, chat_payload: dict[str, Any] | None, **kwargs: Any,
) -> None:
    from chat import delivery
    from chat.runtime import hooks

    LifecycleEvent.objects.create(
        session=session, run=run, from_state=from_state, to_state=to_state, reason=reason, actor=actor,
        detail=run.error_message if to_state in TERMINAL_STATES else "",
    )
    owner_id = session.owner_id
    # The runtime hooks go first and every callback is robust: a failed broadcast must
    # never cost a run its worker (the repair loop re-sends what a broadcast lost).
    if to_state == "dispatching":
        transaction.on_commit(partial(hooks.run_dispatching, run.pk, run.owner_process), robust=True)
    elif to_state in TERMINAL_STATES and from_state in ACTIVE_STATES:
        transaction.on_commit(partial(hooks.run_ended, run.pk, run.owner_process), robust=True)
    transaction.on_commit(partial(hooks.run_changed, run.pk, to_state), robust=True)
    if chat_payload is not None:
        transaction.on_commit(partial(delivery.send_chat, owner_id, run.pk, chat_payload), robust=True)
    if row_changed:
        transaction.on_commit(partial(delivery.send_row, owner_id, session.pk, reason, run.run_id), robust=True)


@receiver(session_changed)
def record_session_change(
    sender: Any, session: ChatSession, reason: str, actor: str, deleted_row: dict[str, Any] | None,
    owner_id: int, emit: bool = True, **kwargs: Any,
) -> None:
    from chat import delivery

    if deleted_row is None:
        LifecycleEvent.objects.create(session=session, reason=reason, actor=actor)
    if emit:
        transaction.on_commit(partial(delivery.send_row, owner_id, session.pk, reason, None, deleted_row), robust=True)
