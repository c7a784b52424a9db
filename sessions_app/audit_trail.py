"""The audit trail: one row per lifecycle change, written in the change's own transaction,
and a tombstone for every deleted session (receivers of the lifecycle signals and of a session's
deletion, connected when the app is ready). Rows of changes made together (a run's end and the next
one's start, a run that ran and ended in one step) go in as one statement (`statements.insert_later`)."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete
from django.dispatch import receiver

from sessions_app import audit, statements
from sessions_app.models import (
    TERMINAL_STATES,
    Actor,
    ChatSession,
    LifecycleEvent,
    Run,
    SessionTombstone,
    ToolApproval,
    ToolCall,
)
from sessions_app.signals import run_transitioned, session_changed, tool_changed


def _who(actor: str) -> dict[str, Any]:
    """The operator behind an `operator` action (admin user or command), for the audit row."""
    operator = audit.current_operator()
    if operator is None or actor != Actor.OPERATOR:
        return {}
    return {"actor_user_id": operator.user_id, "actor_name": operator.name[:150]}


@receiver(run_transitioned, dispatch_uid="sessions_app-audit-run")
def record_run_transition(
    sender: Any,
    run: Run,
    session: ChatSession,
    from_state: str,
    to_state: str,
    reason: str,
    actor: str,
    **kwargs: Any,
) -> None:
    statements.insert_later(
        LifecycleEvent(
            session=session,
            run=run,
            from_state=from_state,
            to_state=to_state,
            reason=reason,
            actor=actor,
            detail=run.error_message if to_state in TERMINAL_STATES else "",
            **_who(actor),
        )
    )


@receiver(tool_changed, dispatch_uid="sessions_app-audit-tool")
def record_tool_change(
    sender: Any,
    call: ToolCall,
    run: Run,
    session: ChatSession,
    from_state: str,
    to_state: str,
    reason: str,
    actor: str,
    approval: ToolApproval | None = None,
    **kwargs: Any,
) -> None:
    """One audit row per tool call or approval change: the call's states, and who decided."""
    who = _who(actor)
    if approval is not None and approval.decided_by_user_id is not None:
        who = {"actor_user_id": approval.decided_by_user_id, "actor_name": approval.decided_by}
    detail = f"{call.call_id} {call.name}"
    if approval is not None:
        detail += f" approval {approval.approval_id} {approval.decision or 'pending'}"
    statements.insert_later(
        LifecycleEvent(
            session=session,
            run=run,
            tool_call=call,
            from_state=from_state,
            to_state=to_state,
            reason=reason[:64],
            actor=actor,
            detail=detail,
            **who,
        )
    )


@receiver(session_changed, dispatch_uid="sessions_app-audit-session")
def record_session_change(
    sender: Any, session: ChatSession, reason: str, actor: str, deleted: bool = False, **kwargs: Any
) -> None:
    if not deleted:  # a deleted session's audit goes with it; its tombstone stays
        detail = str(kwargs.get("detail") or "")
        statements.insert_later(
            LifecycleEvent(session=session, reason=reason, actor=actor, detail=detail, **_who(actor))
        )


@receiver(post_delete, sender=ChatSession, dispatch_uid="sessions_app-tombstone")
def record_tombstone(sender: Any, instance: ChatSession, **kwargs: Any) -> None:
    """Every deleted session (sessions.delete, admin, prune) leaves a tombstone and a log line."""
    operator = audit.current_operator()
    reason = audit.deletion_reason()
    SessionTombstone.objects.create(
        session_pk=instance.pk,
        key=instance.key,
        owner_id=instance.owner_id,
        session_id=instance.session_id,
        reason=reason,
        actor_name=(operator.name if operator else "")[:150],
        actor_user_id=operator.user_id if operator else None,
        last_updated_at=instance.updated_at,
    )
    audit.log.info(
        "session %s deleted (%s) key=%s owner=%s by=%s",
        instance.pk,
        reason,
        instance.key,
        instance.owner_id,
        operator.name if operator else "-",
    )
