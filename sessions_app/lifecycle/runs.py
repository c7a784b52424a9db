"""Runs: admission of a send, and each step of a run's life up to its one terminal state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app import gateway_reads, statements
from sessions_app.lifecycle.core import (
    OUTCOME_FIELDS,
    REASON_FOR_STATE,
    emit_run,
    kill,
    lock_or_create_session,
    lock_run,
    next_queue_seq,
    save_row,
    take_outcome,
    transition,
)
from sessions_app.models import ACTIVE_STATES, Actor, ChatSession, Run, RunState

# What admission decided: a new run started or queued, the key's existing run, a key reused
# with another body, a full queue, or a send that failed before its ack (kept as a failed run).
Admission = Literal["started", "queued", "existing", "conflict", "queue_full", "rejected"]


@dataclass
class SendRequest:
    """A validated send, ready for admission."""

    owner_id: int
    key: str
    agent_id: str
    run_id: str
    message: str
    body_hash: str
    timeout_ms: int
    attachments: list[dict[str, Any]] = field(default_factory=list)
    queue_mode: str = "followup"
    interrupt_reason: str = "interrupt"  # stopReason for the run an interrupt replaces
    setup_error: str | None = None  # a failure found before the ack (§4)


@dataclass
class SendOutcome:
    admission: Admission
    run: Run | None
    session: ChatSession
    queue_position: int | None = None
    interrupted_active_run: bool = False


def admit_send(req: SendRequest, *, owner_process: str, actor: str = Actor.USER) -> SendOutcome:
    """Admit one send: its key's existing run, a conflict, a failure, a queued run or a started one.

    A started run is owned by `owner_process` (the process that will execute it, or '').
    """
    with transaction.atomic():
        session = lock_or_create_session(owner_id=req.owner_id, key=req.key, agent_id=req.agent_id, actor=actor)
        existing = statements.run("r.session_id = %s AND r.run_id = %s", [session.pk, req.run_id])
        if existing is not None:
            if existing.body_hash != req.body_hash:
                return SendOutcome("conflict", existing, session)
            return SendOutcome("existing", existing, session, gateway_reads.queue_position(existing))

        base = dict(
            session=session,
            run_id=req.run_id,
            session_generation=session.session_id,
            message=req.message,
            body_hash=req.body_hash,
            attachments=req.attachments,
            timeout_ms=req.timeout_ms,
            queue_mode=req.queue_mode,
            created_by_id=req.owner_id,
        )
        if req.setup_error is not None:
            return _admit_failed(session, base, req.setup_error, actor)

        active = statements.run("r.id = %s", [session.active_run_id]) if session.active_run_id else None
        if active is not None and req.queue_mode != "interrupt":
            if Run.objects.filter(session=session, state=RunState.QUEUED).count() >= settings.GATEWAY_QUEUE_MAX:
                return SendOutcome("queue_full", None, session)
            run = statements.insert(Run(state=RunState.QUEUED, queue_seq=next_queue_seq(session), stream_seq=1, **base))
            save_row(session)
            emit_run(
                run, session, from_state="", to_state=RunState.QUEUED, reason="queued", actor=actor, row_changed=True
            )
            return SendOutcome("queued", run, session, gateway_reads.queue_position(run))

        interrupted = False
        if active is not None:
            interrupted = kill(
                active,
                session,
                stop_reason=req.interrupt_reason,
                actor=actor,
                owner_process=owner_process,
                start_next=False,
            )
        run = statements.insert(Run(state=RunState.QUEUED, queue_seq=next_queue_seq(session), **base))
        transition(run, RunState.DISPATCHING, session=session, reason="send", actor=actor, owner_process=owner_process)
        return SendOutcome("started", run, session, interrupted_active_run=interrupted)


def _admit_failed(session: ChatSession, base: dict[str, Any], error: str, actor: str) -> SendOutcome:
    """Persist a send that failed before its ack as a failed run (§4)."""
    run = Run.objects.create(
        state=RunState.FAILED,
        error_kind="dispatch",
        error_message=error,
        ended_at=timezone.now(),
        queue_seq=next_queue_seq(session),
        stream_seq=1,
        **base,
    )
    changed = False
    if session.active_run_id is None:
        # `running` iff an active run: a failed side-send never masks a live run.
        take_outcome(session, run)  # failed, this run, its error
        session.started_at = run.ended_at  # it never ran: it started and ended at once
        save_row(session, "started_at", *OUTCOME_FIELDS)
        changed = True
    emit_run(
        run,
        session,
        from_state="",
        to_state=RunState.FAILED,
        reason="chat.dispatch-error",
        actor=actor,
        row_changed=changed,
    )
    return SendOutcome("rejected", run, session)


def mark_running(run_pk: int) -> bool:
    """dispatching -> running; False when the run was already ended (an abort won) or is gone."""
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None:
            return False
        session, run = found
        return transition(
            run,
            RunState.RUNNING,
            session=session,
            reason="run.running",
            actor=Actor.SYSTEM,
            owner_process=run.owner_process,
        )


_RECORD_DELTA_SQL = (
    f"UPDATE {Run._meta.db_table} SET reply = %s, stream_seq = stream_seq + 1 "
    f"WHERE id = %s AND state IN (%s, %s) RETURNING stream_seq"
)


def record_delta(run_pk: int, text: str) -> int | None:
    """Store the accumulated text of an active run; return the delta's seq, or None if it ended.

    One statement (compare-and-set plus RETURNING; SQLite >= 3.35 and PostgreSQL): this
    is the hot path of every streaming run.
    """
    with connection.cursor() as cursor:
        cursor.execute(_RECORD_DELTA_SQL, [text, run_pk, *ACTIVE_STATES])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def finish_run(
    run_pk: int,
    to_state: str,
    *,
    owner_process: str,
    reply: str | None = None,
    stop_reason: str = "",
    error_kind: str = "",
    error_message: str = "",
    reason: str | None = None,
    actor: str = Actor.SYSTEM,
    usage: dict[str, int] | None = None,
    cancel_ms: int | None = None,
) -> bool:
    """End a run (done / failed / timeout / killed). First terminal wins; False if it lost.

    A run whose session was deleted meanwhile has already ended (`killed`, stopReason
    `delete`): that is its terminal, and this returns False quietly.
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None:
            return False
        session, run = found
        values: dict[str, Any] = {"stop_reason": stop_reason, "error_kind": error_kind, "error_message": error_message}
        if reply is not None:
            values["reply"] = reply
        if usage:
            values["prompt_tokens"] = usage.get("prompt_tokens")
            values["completion_tokens"] = usage.get("completion_tokens")
        if cancel_ms is not None:
            values["cancel_ms"] = cancel_ms
        return transition(
            run,
            to_state,
            session=session,
            reason=reason or REASON_FOR_STATE[RunState(to_state)],
            actor=actor,
            owner_process=owner_process,
            **values,
        )


def interrupt_run(run_pk: int, *, message: str, owner_process: str = "", actor: str = Actor.REAPER) -> bool:
    """End a run whose process died or stopped: failed, errorKind interrupted (§8)."""
    return finish_run(
        run_pk,
        RunState.FAILED,
        owner_process=owner_process,
        error_kind="interrupted",
        error_message=message,
        reason="run.interrupted",
        actor=actor,
    )


def interrupt_runs_of_process(server_id: str, *, message: str, actor: str = Actor.REAPER) -> list[int]:
    """End every active run owned by a dead or stopping process as failed/interrupted.

    Their queued successors start unowned, for a live process to claim.
    """
    pks = list(Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).values_list("pk", flat=True))
    return [pk for pk in pks if interrupt_run(pk, message=message, actor=actor)]


def claim_run(run_pk: int, *, server_id: str) -> bool:
    """Take ownership of an active run nobody executes (started by a process without a runtime)."""
    with transaction.atomic():
        return bool(
            Run.objects.filter(pk=run_pk, state=RunState.DISPATCHING, owner_process__in=["", server_id]).update(
                owner_process=server_id
            )
        )


def record_cancel_ms(run_pk: int, elapsed_ms: int) -> None:
    """Record how long stopping an aborted run's backend work took (not a state change)."""
    Run.objects.filter(pk=run_pk).update(cancel_ms=elapsed_ms)
