"""The primitive steps of a tool call and an approval, and closing them when their run ends.

Kept apart from `toolcalls` (the services) because `core.transition` calls `close_open` in a run's
terminal transaction, and the services need `core`. Callers hold the session lock.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone

from sessions_app import signals
from sessions_app.models import (
    TOOL_OPEN_STATES,
    ApprovalDecision,
    ChatSession,
    Run,
    RunState,
    ToolApproval,
    ToolCall,
    ToolCallState,
    ToolErrorKind,
)

# What the transcript (and so the model) is told of a call that did not run to its own end.
NOT_STARTED_TEXT = "Not run: the run ended before this tool call started."
CANCELLED_TEXT = "Cancelled: the run ended ({why}) while this tool ran; its request was cancelled."
UNKNOWN_TEXT = (
    "Outcome unknown: the gateway stopped while this tool ran, so whether it took effect is not known. "
    "It was not run again."
)
EXPIRED_TEXT = "Not run: nobody decided on its approval in time (it expired)."
DENIED_TEXT = "Not run: {who} denied it."


def emit(
    call: ToolCall,
    run: Run,
    session: ChatSession,
    *,
    from_state: str,
    reason: str,
    actor: str,
    event: str,
    seq: int = 0,
    approval: ToolApproval | None = None,
) -> None:
    """Send `tool_changed`; `event` names the wire event it carries ('' for none: audit only)."""
    signals.tool_changed.send(
        sender=ToolCall,
        call=call,
        run=run,
        session=session,
        from_state=from_state,
        to_state=call.state,
        reason=reason,
        actor=actor,
        event=event,
        seq=seq,
        approval=approval,
    )


def take_seqs(run: Run, count: int, *, new_calls: int = 0) -> int:
    """Take `count` event seqs of the run (tool events interleave with its chat events) and count
    `new_calls` more tool calls on it, in one statement; the first seq taken."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET stream_seq = stream_seq + %s, tool_calls = tool_calls + %s "
            "WHERE id = %s RETURNING stream_seq, tool_calls",
            [count, new_calls, run.pk],
        )
        seq, calls = cursor.fetchone()
    run.stream_seq, run.tool_calls = int(seq), int(calls)
    return run.stream_seq - count + 1


def set_state(call: ToolCall, to_state: str, **values: Any) -> bool:
    """Compare-and-set one call from its current state; False when another change won."""
    updated = ToolCall.objects.filter(pk=call.pk, state=call.state).update(state=to_state, **values)
    if not updated:
        return False
    call.state = to_state
    for name, value in values.items():
        setattr(call, name, value)
    return True


def end_call(
    call: ToolCall,
    run: Run,
    session: ChatSession,
    state: str,
    *,
    result: str,
    is_error: bool,
    error_kind: str,
    reason: str,
    actor: str,
) -> bool:
    from_state = call.state
    if not set_state(call, state, result=result, is_error=is_error, error_kind=error_kind, ended_at=timezone.now()):
        return False
    seq = take_seqs(run, 1)
    emit(call, run, session, from_state=from_state, reason=reason, actor=actor, event="result", seq=seq)
    return True


def decide(
    approval: ToolApproval,
    call: ToolCall,
    run: Run,
    session: ChatSession,
    decision: str,
    *,
    by: str,
    by_user_id: int | None,
    actor: str,
) -> None:
    """Resolve a pending approval and move its call accordingly (the caller holds the lock)."""
    approval.decision = decision
    approval.decided_by = by[:150]
    approval.decided_by_user_id = by_user_id
    approval.resolved_at = timezone.now()
    approval.save(update_fields=["decision", "decided_by", "decided_by_user_id", "resolved_at"])
    reason = f"approval.{decision}"
    if call.state == ToolCallState.PENDING_APPROVAL:
        if decision == ApprovalDecision.ALLOW_ONCE:
            set_state(call, ToolCallState.PENDING)
            emit(call, run, session, from_state=ToolCallState.PENDING_APPROVAL, reason=reason, actor=actor, event="")
        else:
            state, text, kind = _REFUSED[decision]
            end_call(
                call,
                run,
                session,
                state,
                result=text.format(who=by),
                is_error=True,
                error_kind=kind,
                reason=reason,
                actor=actor,
            )
    seq = take_seqs(run, 1)
    emit(
        call,
        run,
        session,
        from_state="",
        reason="approval.resolved",
        actor=actor,
        event="approval.resolved",
        seq=seq,
        approval=approval,
    )


# a decision other than allow-once: the call's terminal state, what the transcript says of it, its kind
_REFUSED: dict[str, tuple[str, str, str]] = {
    ApprovalDecision.DENY: (ToolCallState.DENIED, DENIED_TEXT, ToolErrorKind.DENY),
    ApprovalDecision.EXPIRED: (ToolCallState.EXPIRED, EXPIRED_TEXT, ToolErrorKind.EXPIRED),
    ApprovalDecision.CANCELLED: (ToolCallState.CANCELLED, NOT_STARTED_TEXT, ToolErrorKind.CANCELLED),
}


# --- a run's end ------------------------------------------------------------------------------------


def close_open(run: Run, session: ChatSession, *, to_state: str, stop_reason: str, actor: str) -> None:
    """Close every open call and approval of a run that is ending, in its terminal transaction.

    A call that was running ends `cancelled` when the run was stopped (its request is then
    cancelled) and `unknown` when the run failed under it (a dead process: nobody knows
    whether it took effect); one not yet started ends `cancelled`. Pending approvals resolve
    `cancelled`. Called before the run's own transition takes its event seq, so these events
    come first.
    """
    calls = list(ToolCall.objects.filter(run=run, state__in=TOOL_OPEN_STATES).order_by("seq"))
    if not calls:
        return
    approvals = {a.tool_call_id: a for a in ToolApproval.objects.filter(tool_call__in=calls).pending()}
    stopped = to_state in (RunState.KILLED, RunState.TIMEOUT)
    why = stop_reason or to_state
    for call in calls:
        approval = approvals.get(call.pk)
        if approval is not None:
            decide(approval, call, run, session, ApprovalDecision.CANCELLED, by="system", by_user_id=None, actor=actor)
            continue
        if call.state != ToolCallState.RUNNING:
            state, text, kind = ToolCallState.CANCELLED, NOT_STARTED_TEXT, ToolErrorKind.CANCELLED
        elif stopped:
            state, text, kind = ToolCallState.CANCELLED, CANCELLED_TEXT.format(why=why), ToolErrorKind.CANCELLED
        else:
            state, text, kind = ToolCallState.UNKNOWN, UNKNOWN_TEXT, ToolErrorKind.UNKNOWN
        end_call(
            call, run, session, state, result=text, is_error=True, error_kind=kind, reason=f"tool.{state}", actor=actor
        )
