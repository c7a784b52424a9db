"""Signal receivers: the audit row in the transaction, broadcasts after commit."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from . import audit
from .models import ACTIVE_STATES, TERMINAL_STATES, Actor, ChatSession, LifecycleEvent, Run, SessionTombstone
from .signals import run_transitioned, session_changed


def _who(actor: str) -> dict[str, Any]:
    """The operator behind an `operator` action (admin user or command), for the audit row."""
    operator = audit.current_operator()
    if operator is None or actor != Actor.OPERATOR:
        return {}
    return {"actor_user_id": operator.user_id, "actor_name": operator.name[:150]}


@receiver(run_transitioned)
def record_run_transition(
    sender: Any, run: Run, session: ChatSession, from_state: str, to_state: str, reason: str, actor: str,
    row_changed: bool, chat_payload: dict[str, Any] | None, **kwargs: Any,
) -> None:
    from chat import delivery
    from chat.runtime import hooks

    LifecycleEvent.objects.create(
        session=session, run=run, from_state=from_state, to_state=to_state, reason=reason, actor=actor,
        detail=run.error_message if to_state in TERMINAL_STATES else "", **_who(actor),
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
        LifecycleEvent.objects.create(session=session, reason=reason, actor=actor, **_who(actor))
    if emit:
        transaction.on_commit(partial(delivery.send_row, owner_id, session.pk, reason, None, deleted_row), robust=True)


@receiver(post_delete, sender=ChatSession)
def record_tombstone(sender: Any, instance: ChatSession, **kwargs: Any) -> None:
    """Every deleted session (sessions.delete, admin, prune) leaves a tombstone and a log line."""
    operator = audit.current_operator()
    reason = audit.deletion_reason()
    SessionTombstone.objects.create(
        session_pk=instance.pk, key=instance.key, owner_id=instance.owner_id, session_id=instance.session_id,
        reason=reason, actor_name=(operator.name if operator else "")[:150],
        actor_user_id=operator.user_id if operator else None, last_updated_at=instance.updated_at,
    )
    audit.log.info(
        "session %s deleted (%s) key=%s owner=%s by=%s", instance.pk, reason, instance.key, instance.owner_id,
        operator.name if operator else "-",
    )
