"""Operator actions and repairs (admin, `gateway_doctor --fix`).

From a process without a runtime (a command, the admin) a run started here is
left unowned (`owner_process=''`) and a live server process claims it.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from sessions_app.lifecycle.core import (
    OUTCOME_FIELDS,
    lock_session,
    row_changed,
    save_row,
    start_next_queued,
    take_outcome,
    transition,
)
from sessions_app.models import ACTIVE_STATES, Actor, Run, RunErrorKind, RunState, SessionStatus


def mark_failed(
    session_pk: int, *, reason_text: str, actor: str = Actor.OPERATOR, owner_process: str = ""
) -> list[str]:
    """End the session's active run as failed, with a recorded reason."""
    with transaction.atomic():
        session = lock_session(pk=session_pk)
        if session.active_run_id is None:
            return []
        run = Run.objects.get(pk=session.active_run_id)
        ok = transition(
            run,
            RunState.FAILED,
            session=session,
            reason="operator",
            actor=actor,
            owner_process=owner_process,
            error_kind=RunErrorKind.UNKNOWN,
            error_message=f"marked failed by operator: {reason_text}",
        )
        return [run.run_id] if ok else []


def start_next(session_pk: int, *, actor: str = Actor.OPERATOR, owner_process: str = "") -> str | None:
    """Start the session's oldest queued run when nothing is active; return its runId."""
    with transaction.atomic():
        started = start_next_queued(lock_session(pk=session_pk), actor=actor, owner_process=owner_process)
        return None if started is None else started.run_id


def repair_session_row(session_pk: int, *, actor: str = Actor.OPERATOR, owner_process: str = "") -> list[str]:
    """Make the row agree with its runs (§7, §8); return the names of what was repaired.

    - `active_run` pointing at a run that is not active releases the slot, and the row
      takes that run's outcome when it ended in the current generation;
    - `status == "running"` without an active run takes the last run's outcome (or null);
    - an active run with a row that does not say `running` gets `running`;
    - then, with the slot free, the oldest queued run starts.
    """
    with transaction.atomic():
        session = lock_session(pk=session_pk)
        repaired: list[str] = []
        if session.active_run_id is not None:
            active = Run.objects.filter(pk=session.active_run_id).first()
            if active is None or active.state not in ACTIVE_STATES:
                session.active_run = None
                repaired.append("active_run")
                if active is not None and active.is_terminal and active.session_generation == session.session_id:
                    take_outcome(session, active)
                    repaired.append("status")
        if session.active_run_id is None and session.status == SessionStatus.RUNNING:
            last = Run.objects.filter(pk=session.last_run_id).first() if session.last_run_id else None
            if last is not None and last.is_terminal and last.session_generation == session.session_id:
                take_outcome(session, last)
            else:
                session.status = None
                session.ended_at = session.ended_at or timezone.now()
            repaired.append("status")
        elif session.active_run_id is not None and session.status != SessionStatus.RUNNING:
            session.status = SessionStatus.RUNNING
            session.ended_at = None
            repaired.append("status")
        if repaired:
            save_row(session, *OUTCOME_FIELDS)
            row_changed(session, reason="operator", actor=actor)
        started = start_next_queued(session, actor=actor, owner_process=owner_process)
        if started is not None:
            repaired.append(f"started:{started.run_id}")
        return repaired
