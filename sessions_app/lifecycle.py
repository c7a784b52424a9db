"""The lifecycle service: the only code that changes run and session state.

Every function here is synchronous and runs its whole unit (lock, check, write,
signal) in one `transaction.atomic()` block; async callers go through
`database_sync_to_async`. Run transitions are compare-and-set UPDATEs filtered by
the allowed source states, so the first terminal transition wins and any later
abort, error or end changes nothing and emits nothing. The session row is locked
(`select_for_update`) for the whole unit, which serialises all transitions of a
session. Each transition sends a signal; the receivers write the audit row and
register the broadcasts with `transaction.on_commit`.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from . import process, signals
from .models import (
    ACTIVE_STATES,
    OPEN_STATES,
    Actor,
    ChatSession,
    Message,
    Run,
    RunState,
    SessionStatus,
)
from .transitions import sources_for

# reasons of sessions.changed (PROTOCOL.md §7)
REASON_FOR_STATE = {
    RunState.DONE: "run.completed",
    RunState.FAILED: "run.failed",
    RunState.KILLED: "run.aborted",
    RunState.TIMEOUT: "run.timeout",
}
STOP_REASON_TO_CHANGE_REASON = {
    "steer": "steer",
    "reset": "run.aborted",
    "delete": "run.aborted",
    "operator": "operator",
}


class LifecycleError(Exception):
    """A request the lifecycle cannot honour; `code` maps to a protocol error code."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class SessionNotFound(LifecycleError):
    def __init__(self) -> None:
        super().__init__("NOT_FOUND", "session not found")


@dataclass
class SendRequest:
    """A validated chat.send, ready for admission."""

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
    """What admission decided; the consumer turns it into the ack."""

    status: str  # started | queued | in_flight | ok | timeout | error | conflict | queue_full
    run: Run | None
    session: ChatSession
    queue_position: int | None = None
    interrupted_active_run: bool = False


@dataclass
class AbortOutcome:
    aborted: bool
    run_ids: list[str]


def _now() -> Any:
    return timezone.now()


# --- session helpers -------------------------------------------------------------


def _lock_session(pk: int) -> ChatSession:
    return ChatSession.objects.select_for_update().get(pk=pk)


def _find_session(owner_id: int, key: str, *, lock: bool) -> ChatSession:
    qs = ChatSession.objects.filter(owner_id=owner_id, key=key)
    if lock:
        qs = qs.select_for_update()
    session = qs.first()
    if session is None:
        raise SessionNotFound()
    return session


def _get_or_create_session(owner_id: int, key: str, agent_id: str, actor: str) -> ChatSession:
    """Return the locked session, creating it once even when two creators race."""
    existing = ChatSession.objects.select_for_update().filter(owner_id=owner_id, key=key).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():  # savepoint: the unique constraint decides the race
            session = ChatSession.objects.create(owner_id=owner_id, key=key, agent_id=agent_id)
    except IntegrityError:
        return ChatSession.objects.select_for_update().get(owner_id=owner_id, key=key)
    signals.session_changed.send(
        sender=ChatSession, session=session, reason="create", actor=actor, deleted_row=None,
        owner_id=owner_id, emit=True,
    )
    return session


def _save_row(session: ChatSession, *fields: str) -> None:
    """Persist changed row fields and bump `version` (one step per committed change)."""
    session.version += 1
    session.updated_at = _now()
    session.save(update_fields=[*fields, "version", "updated_at"])


def _activate(session: ChatSession, run: Run) -> None:
    """Make `run` the session's active run and the row `running`."""
    now = _now()
    session.active_run = run
    session.last_run = run
    session.status = SessionStatus.RUNNING
    session.started_at = now
    session.ended_at = None
    session.aborted_last_run = False
    session.last_run_error = ""
    _save_row(
        session, "active_run", "last_run", "status", "started_at", "ended_at",
        "aborted_last_run", "last_run_error",
    )
    if run.session_generation == session.session_id:
        Message.objects.create(
            session=session, session_generation=session.session_id, role="user", text=run.message, run=run
        )


def _bump_seq(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(stream_seq=F("stream_seq") + 1)
    run.stream_seq += 1


def _emit_run(
    run: Run, session: ChatSession, from_state: str, to_state: str, reason: str, actor: str,
    *, row_changed: bool, chat: bool = True,
) -> None:
    """Send the transition signal; the chat payload is built from the row as written."""
    from chat import protocol  # the wire encoding lives in one place

    payload = None
    if chat:
        _bump_seq(run)
        payload = protocol.chat_payload_for_run(run, session.key)
    signals.run_transitioned.send(
        sender=Run, run=run, session=session, from_state=from_state, to_state=to_state,
        reason=reason, actor=actor, row_changed=row_changed, chat_payload=payload,
    )


def _next_queue_seq(session: ChatSession) -> int:
    current = Run.objects.filter(session=session).aggregate(m=Max("queue_seq"))["m"]
    return (current or 0) + 1


def _queued_runs(session: ChatSession) -> list[Run]:
    return list(Run.objects.filter(session=session, state=RunState.QUEUED).order_by("queue_seq", "id"))


# --- transitions ---------------------------------------------------------------------


def _transition(
    run: Run,
    to_state: str,
    *,
    reason: str,
    actor: str,
    session: ChatSession,
    start_next: bool = True,
    **values: Any,
) -> bool:
    """Compare-and-set `run` into `to_state`; return False when another transition won.

    Caller holds the session lock. Terminal transitions update the session row
    only when the run is the session's active run of its current generation.
    """
    now = _now()
    sources = sources_for(to_state)
    updates: dict[str, Any] = dict(values)
    terminal = to_state in (RunState.DONE, RunState.FAILED, RunState.KILLED, RunState.TIMEOUT)
    if terminal:
        updates["ended_at"] = now
    elif to_state == RunState.RUNNING:
        updates["started_at"] = now
    elif to_state == RunState.DISPATCHING:
        updates["dispatched_at"] = now
        # The committing process executes the run when it has a run manager;
        # otherwise '' leaves it for any live server process to claim.
        updates["owner_process"] = process.current()
    fresh = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
    if fresh is None or fresh not in sources:
        return False
    if not Run.objects.filter(pk=run.pk, state=fresh).update(state=to_state, **updates):
        return False
    from_state = fresh
    run.refresh_from_db()

    if not terminal:
        row_changed = False
        if to_state == RunState.DISPATCHING:
            _activate(session, run)
            row_changed = True
        _emit_run(run, session, from_state, to_state, reason, actor, row_changed=row_changed)
        return True

    was_active = from_state in ACTIVE_STATES and session.active_run_id == run.pk
    current_generation = run.session_generation == session.session_id
    row_changed = False
    if was_active:
        session.active_run = None
        if current_generation:
            _take_outcome(session, run)
            _save_row(session, "active_run", "status", "last_run", "ended_at", "aborted_last_run", "last_run_error")
        else:
            # An old-generation run never touches the row (§8); only release the slot.
            session.save(update_fields=["active_run"])
        row_changed = current_generation
    elif from_state == RunState.QUEUED and current_generation:
        _save_row(session)  # queuedRunIds changed
        row_changed = True

    if current_generation and from_state in ACTIVE_STATES:
        if to_state == RunState.DONE:
            Message.objects.create(
                session=session, session_generation=session.session_id, role="assistant",
                text=run.reply, run=run,
            )
        elif run.reply:
            # Partial text of an aborted, failed or timed-out run is kept, marked.
            Message.objects.create(
                session=session, session_generation=session.session_id, role="assistant",
                text=run.reply, run=run, aborted=True,
            )
    _emit_run(run, session, from_state, to_state, reason, actor, row_changed=row_changed)
    if was_active and start_next:
        _start_next_queued(session)
    return True


def _start_next_queued(session: ChatSession) -> Run | None:
    """Hand the session to its oldest queued run, if any."""
    if session.active_run_id is not None:
        return None
    for run in _queued_runs(session):
        if _transition(run, RunState.DISPATCHING, reason="run.started", actor=Actor.SYSTEM, session=session):
            return run
    return None


def _kill(run: Run, session: ChatSession, stop_reason: str, actor: str, *, start_next: bool) -> bool:
    reason = STOP_REASON_TO_CHANGE_REASON.get(stop_reason, "run.aborted")
    return _transition(
        run, RunState.KILLED, reason=reason, actor=actor, session=session,
        start_next=start_next, stop_reason=stop_reason,
    )


def _kill_all(session: ChatSession, stop_reason: str, actor: str) -> list[str]:
    """Abort the queued runs (newest first, so none is started) then the active one."""
    killed: list[str] = []
    for run in reversed(_queued_runs(session)):
        if _kill(run, session, stop_reason, actor, start_next=False):
            killed.append(run.run_id)
    if session.active_run_id is not None:
        active = Run.objects.get(pk=session.active_run_id)
        if _kill(active, session, stop_reason, actor, start_next=False):
            killed.append(active.run_id)
    killed.reverse()
    return killed


# --- public API: chat.send and friends ---------------------------------------------------


def queue_position(run: Run) -> int | None:
    """1-based position of a queued run in its session's queue."""
    if run.state != RunState.QUEUED:
        return None
    ahead = Run.objects.filter(session_id=run.session_id, state=RunState.QUEUED, queue_seq__lt=run.queue_seq)
    return ahead.count() + 1


def admit_send(req: SendRequest, *, actor: str = Actor.USER) -> SendOutcome:
    """Admit one chat.send: replay, conflict, fail, queue, interrupt or start."""
    with transaction.atomic():
        session = _get_or_create_session(req.owner_id, req.key, req.agent_id, actor)
        existing = Run.objects.filter(session=session, run_id=req.run_id).first()
        if existing is not None:
            if existing.body_hash != req.body_hash:
                return SendOutcome("conflict", existing, session)
            return SendOutcome(replay_status(existing), existing, session, queue_position(existing))

        base = dict(
            session=session, run_id=req.run_id, session_generation=session.session_id,
            message=req.message, body_hash=req.body_hash, attachments=req.attachments,
            timeout_ms=req.timeout_ms, queue_mode=req.queue_mode, created_by_id=req.owner_id,
        )
        if req.setup_error is not None:
            return _admit_failed(session, base, req.setup_error, actor)

        active = Run.objects.filter(pk=session.active_run_id).first() if session.active_run_id else None
        if active is not None and req.queue_mode != "interrupt":
            if Run.objects.filter(session=session, state=RunState.QUEUED).count() >= settings.GATEWAY_QUEUE_MAX:
                return SendOutcome("queue_full", None, session)
            run = Run.objects.create(state=RunState.QUEUED, queue_seq=_next_queue_seq(session), **base)
            _save_row(session)
            _emit_run(run, session, "", RunState.QUEUED, "queued", actor, row_changed=True)
            return SendOutcome("queued", run, session, queue_position(run))

        interrupted = False
        if active is not None:
            interrupted = _kill(active, session, req.interrupt_reason, actor, start_next=False)
        run = Run.objects.create(state=RunState.QUEUED, queue_seq=_next_queue_seq(session), **base)
        _transition(run, RunState.DISPATCHING, reason="send", actor=actor, session=session)
        return SendOutcome("started", run, session, interrupted_active_run=interrupted)


def _admit_failed(session: ChatSession, base: dict[str, Any], error: str, actor: str) -> SendOutcome:
    """Persist a send that failed before its ack as a failed run (§4)."""
    now = _now()
    run = Run.objects.create(
        state=RunState.FAILED, error_kind="dispatch", error_message=error, ended_at=now,
        queue_seq=_next_queue_seq(session), **base,
    )
    row_changed = False
    if session.active_run_id is None:
        # `running` iff an active run: a failed side-send never masks a live run.
        session.status = SessionStatus.FAILED
        session.last_run = run
        session.started_at = now
        session.ended_at = now
        session.aborted_last_run = False
        session.last_run_error = error
        _save_row(session, "status", "last_run", "started_at", "ended_at", "aborted_last_run", "last_run_error")
        row_changed = True
    _emit_run(run, session, "", RunState.FAILED, "chat.dispatch-error", actor, row_changed=row_changed)
    return SendOutcome("error", run, session)


def replay_status(run: Run) -> str:
    """The ack status a repeated key gets for `run` (§4)."""
    if run.state in OPEN_STATES:
        return "in_flight"
    return {
        RunState.DONE: "ok",
        RunState.KILLED: "timeout",
        RunState.TIMEOUT: "timeout",
        RunState.FAILED: "error",
    }[RunState(run.state)]


def get_run(pk: int) -> Run | None:
    return Run.objects.select_related("session").filter(pk=pk).first()


def mark_running(run_pk: int) -> bool:
    """dispatching -> running; False when the run was already ended (abort won)."""
    with transaction.atomic():
        run = Run.objects.filter(pk=run_pk).first()
        if run is None:
            return False
        session = _lock_session(run.session_id)
        return _transition(run, RunState.RUNNING, reason="run.running", actor=Actor.SYSTEM, session=session)


_RECORD_DELTA_SQL = (
    f"UPDATE {Run._meta.db_table} SET reply = %s, stream_seq = stream_seq + 1 "
    f"WHERE id = %s AND state IN (%s, %s) RETURNING stream_seq"
)


def record_delta(run_pk: int, text: str) -> int | None:
    """Store the accumulated text of an active run; return the delta's seq, or None if ended.

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
    reply: str | None = None,
    stop_reason: str = "",
    error_kind: str = "",
    error_message: str = "",
    reason: str | None = None,
    actor: str = Actor.SYSTEM,
    usage: dict[str, int] | None = None,
    cancel_ms: int | None = None,
) -> bool:
    """End a run (done / failed / timeout / killed). First terminal wins; False if it lost."""
    with transaction.atomic():
        run = Run.objects.filter(pk=run_pk).first()
        if run is None:
            return False
        session = _lock_session(run.session_id)
        values: dict[str, Any] = {"stop_reason": stop_reason, "error_kind": error_kind, "error_message": error_message}
        if reply is not None:
            values["reply"] = reply
        if usage:
            values["prompt_tokens"] = usage.get("prompt_tokens")
            values["completion_tokens"] = usage.get("completion_tokens")
        if cancel_ms is not None:
            values["cancel_ms"] = cancel_ms
        return _transition(
            run, to_state, reason=reason or REASON_FOR_STATE[RunState(to_state)], actor=actor,
            session=session, **values,
        )


def abort(
    owner_id: int, key: str, run_id: str | None, *, stop_reason: str = "rpc", actor: str = Actor.USER
) -> AbortOutcome:
    """chat.abort: stop one run, or every active and queued run of the session."""
    with transaction.atomic():
        session = _find_session(owner_id, key, lock=True)
        if run_id is None:
            return AbortOutcome(*_aborted(_kill_all(session, stop_reason, actor)))
        run = Run.objects.filter(session=session, run_id=run_id).first()
        if run is None:
            if Run.objects.filter(session__owner_id=owner_id, run_id=run_id).exists():
                raise LifecycleError("INVALID_REQUEST", "runId belongs to another session", field="runId")
            return AbortOutcome(False, [])
        if _kill(run, session, stop_reason, actor, start_next=True):
            return AbortOutcome(True, [run.run_id])
        return AbortOutcome(False, [])


def abort_session_by_pk(session_pk: int, *, stop_reason: str, actor: str) -> list[str]:
    """Abort every open run of a session (operators)."""
    with transaction.atomic():
        session = _lock_session(session_pk)
        return _kill_all(session, stop_reason, actor)


def _aborted(run_ids: list[str]) -> tuple[bool, list[str]]:
    return bool(run_ids), run_ids


def create_session(owner_id: int, key: str | None, *, label: str = "", agent_id: str = "main",
                   actor: str = Actor.USER) -> ChatSession:
    """sessions.create: a new session; CONFLICT when the key exists."""
    with transaction.atomic():
        if key is None:
            key = f"agent:{agent_id}:s-{secrets.token_hex(5)}"
        if ChatSession.objects.filter(owner_id=owner_id, key=key).exists():
            raise LifecycleError("CONFLICT", "session already exists", reason="session-exists")
        try:
            with transaction.atomic():
                session = ChatSession.objects.create(owner_id=owner_id, key=key, agent_id=agent_id, label=label)
        except IntegrityError as exc:
            raise LifecycleError("CONFLICT", "session already exists", reason="session-exists") from exc
        signals.session_changed.send(
            sender=ChatSession, session=session, reason="create", actor=actor, deleted_row=None,
            owner_id=owner_id, emit=True,
        )
        return session


def patch_session(owner_id: int, key: str, *, label: str, actor: str = Actor.USER) -> ChatSession:
    """sessions.patch: rename."""
    with transaction.atomic():
        session = _find_session(owner_id, key, lock=True)
        session.label = label
        _save_row(session, "label")
        signals.session_changed.send(
            sender=ChatSession, session=session, reason="patch", actor=actor, deleted_row=None,
            owner_id=owner_id, emit=True,
        )
        return session


def reset_session(
    owner_id: int, key: str, *, actor: str = Actor.USER, create: bool = False, agent_id: str = "main"
) -> tuple[ChatSession, list[str]]:
    """sessions.reset and /new: abort open runs, rotate sessionId, start a fresh transcript."""
    with transaction.atomic():
        if create:
            session = _get_or_create_session(owner_id, key, agent_id, actor)
        else:
            session = _find_session(owner_id, key, lock=True)
        return session, _reset_locked(session, actor)


def _reset_locked(session: ChatSession, actor: str) -> list[str]:
    killed = _kill_all(session, "reset", actor)
    session.session_id = uuid.uuid4()
    session.status = None
    session.last_run = None
    session.started_at = None
    session.ended_at = None
    session.aborted_last_run = False
    session.last_run_error = ""
    _save_row(
        session, "session_id", "status", "last_run", "started_at", "ended_at", "aborted_last_run", "last_run_error"
    )
    signals.session_changed.send(
        sender=ChatSession, session=session, reason="reset", actor=actor, deleted_row=None,
        owner_id=session.owner_id, emit=True,
    )
    return killed


def reset_session_by_pk(session_pk: int, *, actor: str) -> list[str]:
    with transaction.atomic():
        return _reset_locked(_lock_session(session_pk), actor)


def stop_session(owner_id: int, key: str, *, agent_id: str = "main", actor: str = Actor.USER) -> tuple[
    ChatSession, list[str]
]:
    """/stop: abort the session's active and queued runs."""
    with transaction.atomic():
        session = _get_or_create_session(owner_id, key, agent_id, actor)
        return session, _kill_all(session, "stop", actor)


def delete_session(owner_id: int, key: str, *, actor: str = Actor.USER) -> list[str]:
    """sessions.delete: abort open runs (stopReason delete) and delete everything."""
    with transaction.atomic():
        return _delete_locked(_find_session(owner_id, key, lock=True), actor)


def delete_session_by_pk(session_pk: int, *, actor: str) -> list[str]:
    with transaction.atomic():
        return _delete_locked(_lock_session(session_pk), actor)


def _delete_locked(session: ChatSession, actor: str) -> list[str]:
    from .selectors import session_rows

    killed = _kill_all(session, "delete", actor)
    session.version += 1
    row = session_rows([session])[0]
    row["deleted"] = True
    owner_id = session.owner_id
    signals.session_changed.send(
        sender=ChatSession, session=session, reason="delete", actor=actor, deleted_row=row,
        owner_id=owner_id, emit=True,
    )
    session.delete()
    return killed


def mark_failed(session_pk: int, *, reason_text: str, actor: str = Actor.OPERATOR) -> list[str]:
    """Operator: end the session's active run as failed, with a recorded reason."""
    with transaction.atomic():
        session = _lock_session(session_pk)
        if session.active_run_id is None:
            return []
        run = Run.objects.get(pk=session.active_run_id)
        ok = _transition(
            run, RunState.FAILED, reason="operator", actor=actor, session=session,
            error_kind="unknown", error_message=f"marked failed by operator: {reason_text}",
        )
        return [run.run_id] if ok else []


def interrupt_run(run_pk: int, *, message: str, actor: str = Actor.REAPER) -> bool:
    """End a run whose process died or stopped: failed, errorKind interrupted (§8)."""
    return finish_run(
        run_pk, RunState.FAILED, error_kind="interrupted", error_message=message, reason="run.interrupted",
        actor=actor,
    )


def interrupt_runs_of_process(server_id: str, *, actor: str = Actor.REAPER, message: str) -> list[int]:
    """End every open run owned by a dead or stopping process as failed/interrupted."""
    pks = list(
        Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).values_list("pk", flat=True)
    )
    return [pk for pk in pks if interrupt_run(pk, message=message, actor=actor)]


def claim_run(run_pk: int, server_id: str) -> bool:
    """Take ownership of an active run nobody executes (hand-off from a process without a runtime)."""
    with transaction.atomic():
        return bool(
            Run.objects.filter(pk=run_pk, state=RunState.DISPATCHING, owner_process__in=["", server_id]).update(
                owner_process=server_id
            )
        )


def record_cancel_ms(run_pk: int, elapsed_ms: int) -> None:
    """Record how long stopping the run's backend work took (not a state change)."""
    Run.objects.filter(pk=run_pk).update(cancel_ms=elapsed_ms)


# --- operator repairs and retention (gateway_doctor --fix, prune_sessions) ------------------------


def start_next_queued_by_pk(session_pk: int, *, actor: str = Actor.OPERATOR) -> str | None:
    """Start the session's oldest queued run when nothing is active; return its runId.

    From a process without a run manager (a command) the run is left unowned and a
    live server claims it.
    """
    with transaction.atomic():
        session = _lock_session(session_pk)
        if session.active_run_id is not None:
            return None
        for run in _queued_runs(session):
            if _transition(run, RunState.DISPATCHING, reason="run.started", actor=actor, session=session):
                return run.run_id
        return None


def repair_session_row(session_pk: int, *, actor: str = Actor.OPERATOR) -> list[str]:
    """Make the row agree with its runs (§7, §8); return the names of what was repaired.

    - `active_run` pointing at a run that is not active releases the slot, and the row
      takes that run's outcome when it ended in the current generation;
    - `status == "running"` without an active run takes the last run's outcome (or null);
    - an active run with a row that does not say `running` gets `running`;
    - then, with the slot free, the oldest queued run starts.
    """
    with transaction.atomic():
        session = _lock_session(session_pk)
        repaired: list[str] = []
        if session.active_run_id is not None:
            active = Run.objects.filter(pk=session.active_run_id).first()
            if active is None or active.state not in ACTIVE_STATES:
                session.active_run = None
                repaired.append("active_run")
                if active is not None and active.is_terminal and active.session_generation == session.session_id:
                    _take_outcome(session, active)
                    repaired.append("status")
        if session.active_run_id is None and session.status == SessionStatus.RUNNING:
            last = Run.objects.filter(pk=session.last_run_id).first() if session.last_run_id else None
            if last is not None and last.is_terminal and last.session_generation == session.session_id:
                _take_outcome(session, last)
            else:
                session.status = None
                session.ended_at = session.ended_at or _now()
            repaired.append("status")
        elif session.active_run_id is not None and session.status != SessionStatus.RUNNING:
            session.status = SessionStatus.RUNNING
            session.ended_at = None
            repaired.append("status")
        if repaired:
            _save_row(
                session, "active_run", "status", "last_run", "ended_at", "aborted_last_run", "last_run_error"
            )
            signals.session_changed.send(
                sender=ChatSession, session=session, reason="operator", actor=actor, deleted_row=None,
                owner_id=session.owner_id, emit=True,
            )
        if session.active_run_id is None:
            started = _start_next_queued(session)
            if started is not None:
                repaired.append(f"started:{started.run_id}")
        return repaired


def _take_outcome(session: ChatSession, run: Run) -> None:
    """Copy a terminal run's outcome onto the row, as its terminal transition would have."""
    session.status = run.state
    session.last_run = run
    session.ended_at = run.ended_at or _now()
    session.aborted_last_run = run.state == RunState.KILLED
    session.last_run_error = run.error_message if run.state in (RunState.FAILED, RunState.TIMEOUT) else ""


@dataclass
class PruneBatch:
    """What one retention batch deleted; `skipped` sessions had become busy or fresh again."""

    sessions: int = 0
    runs: int = 0
    messages: int = 0
    audit: int = 0
    skipped: int = 0
    keys: list[str] = field(default_factory=list)


def prune_idle_sessions(
    session_pks: list[int], *, idle_before: Any, actor: str = Actor.SYSTEM, broadcast: bool = True
) -> PruneBatch:
    """Retention: delete idle sessions with their runs, messages and audit rows.

    The idle test is repeated here under the row locks, so a session that got a run
    (active or queued) or any change since it was selected is skipped, never deleted.
    Each deleted session is announced like `sessions.delete` (reason `delete`).
    """
    from .models import LifecycleEvent
    from .selectors import session_rows

    with transaction.atomic():
        locked = list(
            ChatSession.objects.select_for_update()
            .filter(pk__in=session_pks, updated_at__lt=idle_before, active_run__isnull=True)
            .exclude(status=SessionStatus.RUNNING)
            .order_by("pk")
        )
        busy = set(
            Run.objects.filter(session_id__in=[s.pk for s in locked], state__in=OPEN_STATES).values_list(
                "session_id", flat=True
            )
        )
        victims = [s for s in locked if s.pk not in busy]
        batch = PruneBatch(skipped=len(session_pks) - len(victims))
        if not victims:
            return batch
        ids = [s.pk for s in victims]
        if broadcast:
            for session, row in zip(victims, session_rows(victims), strict=True):
                session.version += 1
                row.update(version=session.version, deleted=True)
                signals.session_changed.send(
                    sender=ChatSession, session=session, reason="delete", actor=actor, deleted_row=row,
                    owner_id=session.owner_id, emit=True,
                )
        # Children first, in bulk: the cascade would otherwise load every row it deletes.
        batch.audit = LifecycleEvent.objects.filter(session_id__in=ids).delete()[0]
        batch.messages = Message.objects.filter(session_id__in=ids).delete()[0]
        _total, per_model = ChatSession.objects.filter(pk__in=ids).delete()
        batch.runs = per_model.get(Run._meta.label, 0)
        batch.audit += per_model.get("sessions_app.LifecycleEvent", 0)
        batch.sessions = per_model.get(ChatSession._meta.label, 0)
        batch.keys = [s.key for s in victims]
        return batch
