"""Tool calls and approvals (TOOLS.md §13): each step of a call up to its one terminal state.

Every change holds the session lock (`lock_run`), like every run transition, and is one
compare-and-set on the call's state: a call goes `pending` -> (`pending_approval` ->
`pending`) -> `running` -> terminal, never back, so it runs at most once. A run's terminal
transition closes its open calls and approvals in the same transaction (`close_open`), so no
call outlives its run. Each change sends `tool_changed` (audit row, events after commit). A call of
an API client's own function tool is never run here: `hand_to_client` records it ended `client`.

Each may be tried again when its answer was lost (a connection broken mid-commit), and does
nothing twice: `record_calls` and `request_approval` give back what the earlier try made;
`begin_call` and `finish_call` say no, and the runner reads the call to learn why.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from sessions_app.lifecycle import toolstate
from sessions_app.lifecycle.core import LifecycleError, lock_run, row_changed, save_row
from sessions_app.models import (
    ACTIVE_STATES,
    TOOL_OPEN_STATES,
    Actor,
    ApprovalDecision,
    ChatSession,
    Run,
    ToolApproval,
    ToolCall,
    ToolCallState,
)


@dataclass
class NewCall:
    """A call the model asked for, as recorded; `failure` set: it ends `failed` without reaching a server."""

    model_call_id: str
    server: str
    tool: str
    arguments: str
    failure: str | None = None
    error_kind: str = ""


def new_call_id() -> str:
    """A toolCallId unique across the gateway (the model's own ids collide across runs)."""
    return f"tc_{secrets.token_hex(12)}"


def record_calls(
    run_pk: int, *, step: int, calls: list[NewCall], reply_offset: int, recorded_before: int
) -> list[ToolCall] | None:
    """Record a step's calls before any of them runs; None when the run is no longer active.

    `recorded_before`: how many calls the run had before this step, as its runner counted them.
    More means an earlier try of this step committed and its answer was lost (a connection broken
    mid-commit): the retry gets those rows back, so no call is recorded twice.
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None or found[1].state not in ACTIVE_STATES:
            return None
        return _record(*found, step, calls, reply_offset, recorded_before)


def hand_to_client(
    run_pk: int, *, step: int, calls: list[NewCall], reply_offset: int, recorded_before: int
) -> list[ToolCall] | None:
    """Record a step's calls of the API client's function tools (HTTP-API.md §14.4) as handed to it: each
    is recorded (`start`) and ends at once in state `client` (`result`, no result of its own: the client's
    comes with its next request). None is run here. None when the run is no longer active; a retry after a
    lost answer gets the earlier try's rows back, as `record_calls` does.
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None or found[1].state not in ACTIVE_STATES:
            return None
        session, run = found
        rows = _record(session, run, step, calls, reply_offset, recorded_before)
        for row in rows:
            if row.state == ToolCallState.PENDING:
                toolstate.end_call(
                    row,
                    run,
                    session,
                    ToolCallState.CLIENT,
                    result="",
                    is_error=False,
                    error_kind="",
                    reason="tool.client",
                    actor=Actor.SYSTEM,
                )
        return rows


def _record(
    session: ChatSession, run: Run, step: int, calls: list[NewCall], reply_offset: int, recorded_before: int
) -> list[ToolCall]:
    """Insert the calls `pending`, each with its `start` event (the caller holds the run's lock)."""
    if run.tool_calls > recorded_before:
        return list(ToolCall.objects.filter(run=run, seq__gt=recorded_before).order_by("seq"))
    now = timezone.now()
    rows = [
        ToolCall(
            call_id=new_call_id(),
            run=run,
            seq=run.tool_calls + i + 1,
            step=step,
            model_call_id=c.model_call_id[:128],
            server=c.server,
            tool=c.tool[:128],
            arguments=c.arguments,
            reply_offset=reply_offset,
            created_at=now,
        )
        for i, c in enumerate(calls)
    ]
    ToolCall.objects.bulk_create(rows)  # primary keys come back (RETURNING: PostgreSQL, SQLite >= 3.35)
    first = toolstate.take_seqs(run, len(rows), new_calls=len(rows))
    for i, row in enumerate(rows):
        toolstate.emit(
            row, run, session, from_state="", reason="tool.recorded", actor=Actor.SYSTEM, event="start", seq=first + i
        )
    return rows


def _lock_call(call_pk: int) -> tuple[ChatSession, Run, ToolCall] | None:
    """The call with its run and session, the session row-locked first (then the call is current)."""
    run_pk = ToolCall.objects.filter(pk=call_pk).values_list("run_id", flat=True).first()
    found = lock_run(run_pk) if run_pk is not None else None
    if found is None:
        return None
    call = ToolCall.objects.filter(pk=call_pk).first()
    return None if call is None else (found[0], found[1], call)


def _leave_pending(
    found: tuple[ChatSession, Run, ToolCall] | None, to_state: str, **values: Any
) -> tuple[ChatSession, Run, ToolCall] | None:
    """Move a `pending` call of an active run (`_lock_call`'s) on; None when it may not."""
    if found is None:
        return None
    _session, run, call = found
    if run.state not in ACTIVE_STATES or call.state != ToolCallState.PENDING:
        return None
    return found if toolstate.set_state(call, to_state, **values) else None


def begin_call(call_pk: int) -> bool:
    """pending -> running, committed before the request is written to the server; False: do not run it."""
    with transaction.atomic():
        found = _leave_pending(_lock_call(call_pk), ToolCallState.RUNNING, started_at=timezone.now())
        if found is None:
            return False
        session, run, call = found
        toolstate.emit(
            call, run, session, from_state=ToolCallState.PENDING, reason="tool.started", actor=Actor.SYSTEM, event=""
        )
        return True


def finish_call(
    call_pk: int,
    state: str,
    *,
    result: str,
    is_error: bool,
    error_kind: str = "",
    reason: str = "",
    actor: str = Actor.SYSTEM,
) -> bool:
    """An open call's one terminal state, with its (capped) result; False when it had already ended."""
    with transaction.atomic():
        found = _lock_call(call_pk)
        if found is None:
            return False
        session, run, call = found
        if call.state not in TOOL_OPEN_STATES:
            return False
        return toolstate.end_call(
            call,
            run,
            session,
            state,
            result=result,
            is_error=is_error,
            error_kind=error_kind,
            reason=reason or f"tool.{state}",
            actor=actor,
        )


# --- approvals ------------------------------------------------------------------------------------


def request_approval(call_pk: int, *, expires_at: datetime) -> ToolApproval | None:
    """pending -> pending_approval with its approval; the row says `waitingFor: approval`. None: run over.

    A call has one approval: a retry whose earlier try committed (its answer lost) gets that one
    back, whatever has been decided on it since.
    """
    with transaction.atomic():
        found = _lock_call(call_pk)
        earlier = ToolApproval.objects.filter(tool_call_id=call_pk).first() if found is not None else None
        if earlier is not None:
            return earlier
        found = _leave_pending(found, ToolCallState.PENDING_APPROVAL)
        if found is None:
            return None
        session, run, call = found
        approval = ToolApproval.objects.create(
            approval_id=f"ap_{secrets.token_hex(12)}",
            tool_call=call,
            session=session,
            owner_id=session.owner_id,
            expires_at=expires_at,
        )
        _set_waiting(session, run, "approval")
        seq = toolstate.take_seqs(run, 1)
        toolstate.emit(
            call,
            run,
            session,
            from_state=ToolCallState.PENDING,
            reason="approval.requested",
            actor=Actor.SYSTEM,
            event="approval",
            seq=seq,
            approval=approval,
        )
        return approval


def _set_waiting(session: ChatSession, run: Run, waiting: str) -> None:
    """The row's `waitingFor`, for the current generation's active run only (§8)."""
    if session.active_run_id != run.pk or run.session_generation != session.session_id:
        return
    if session.waiting_for == waiting:
        return
    session.waiting_for = waiting
    save_row(session, "waiting_for")
    row_changed(session, reason="approval.requested" if waiting else "approval.resolved", actor=Actor.SYSTEM)


def _settle_waiting(session: ChatSession, run: Run) -> None:
    """Clear the row's `waitingFor` once no approval of the run is pending."""
    if not ToolApproval.objects.filter(tool_call__run=run).pending().exists():
        _set_waiting(session, run, "")


def find_approval(approval_id: str, *, user_id: int, staff: bool) -> ToolApproval:
    """An approval its owner (or staff) may see; NOT_FOUND for anyone else's, as for an unknown id."""
    approval = ToolApproval.objects.select_related("tool_call__run__session").filter(approval_id=approval_id).first()
    if approval is None or (approval.owner_id != user_id and not staff):
        raise LifecycleError("NOT_FOUND", "approval not found")
    return approval


def resolve_approval(
    approval_id: str, *, decision: str, user_id: int, user_name: str, staff: bool = False
) -> ToolApproval:
    """Record a decision; the first one wins and a repeat gets it back. allow-once -> the call is
    `pending` again (its runner starts it), deny -> the call ends `denied`."""
    if decision not in (ApprovalDecision.ALLOW_ONCE, ApprovalDecision.DENY):
        raise LifecycleError("INVALID_REQUEST", "decision must be allow-once or deny", field="decision")
    approval = find_approval(approval_id, user_id=user_id, staff=staff)
    with transaction.atomic():
        found = _lock_call(approval.tool_call_id)
        if found is None:
            raise LifecycleError("NOT_FOUND", "approval not found")
        session, run, call = found
        approval = ToolApproval.objects.get(pk=approval.pk)  # current, under the lock
        if not approval.pending:
            return approval
        actor = Actor.USER if user_id == approval.owner_id else Actor.OPERATOR
        toolstate.decide(approval, call, run, session, decision, by=user_name, by_user_id=user_id, actor=actor)
        _settle_waiting(session, run)
        return approval


def expire_approval(approval_pk: int) -> ToolApproval | None:
    """No decision by `expires_at`: resolved `expired` (fail closed), the call ends `expired`."""
    with transaction.atomic():
        approval = ToolApproval.objects.filter(pk=approval_pk).first()
        found = _lock_call(approval.tool_call_id) if approval is not None else None
        if found is None:
            return None
        session, run, call = found
        approval = ToolApproval.objects.get(pk=approval_pk)
        if approval.pending and approval.expires_at <= timezone.now():
            toolstate.decide(
                approval, call, run, session, ApprovalDecision.EXPIRED, by="system", by_user_id=None, actor=Actor.SYSTEM
            )
            _settle_waiting(session, run)
        return approval


# --- repairs (gateway_doctor --fix) ---------------------------------------------------------------


def close_calls_of_ended_run(run_pk: int, *, actor: str = Actor.OPERATOR) -> list[str]:
    """Close the open calls and approvals of a run that has already ended, as its end would have.

    Its terminal transition does this in the same transaction (`toolstate.close_open`), so this
    only repairs a database that says otherwise: running -> `unknown` (or `cancelled` when the run
    was stopped), not started -> `cancelled`, pending approvals -> decision `cancelled`. Returns
    the toolCallIds it closed ([] when the run is not terminal or nothing was open).
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None or not found[1].is_terminal:
            return []
        session, run = found
        open_ids = list(
            ToolCall.objects.filter(run=run, state__in=TOOL_OPEN_STATES)
            .order_by("seq")
            .values_list("call_id", flat=True)
        )
        if open_ids:
            toolstate.close_open(run, session, to_state=run.state, stop_reason=run.stop_reason, actor=actor)
        return open_ids
