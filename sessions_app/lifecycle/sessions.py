"""Sessions: create, rename, abort, stop, reset and delete.

Each service finds its session by owner and key (clients) or by primary key
(operators): `lock_session(owner_id=..., key=...)` or `lock_session(pk=...)`.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from sessions_app.lifecycle.core import (
    LifecycleError,
    kill,
    kill_all,
    lock_or_create_session,
    lock_session,
    row_changed,
    save_row,
    take_outcome,
)
from sessions_app.models import Actor, ChatSession, Run


@dataclass
class AbortOutcome:
    aborted: bool
    run_ids: list[str]


def create_session(
    *, owner_id: int, key: str | None, label: str = "", agent_id: str = "main", actor: str = Actor.USER
) -> ChatSession:
    """A new session (a generated key when `key` is None); CONFLICT when the key exists."""
    if key is None:
        key = f"agent:{agent_id}:s-{secrets.token_hex(5)}"
    with transaction.atomic():
        try:
            with transaction.atomic():  # savepoint: the unique constraint decides a race
                session = ChatSession.objects.create(owner_id=owner_id, key=key, agent_id=agent_id, label=label)
        except IntegrityError as exc:
            raise LifecycleError("CONFLICT", "session already exists", reason="session-exists") from exc
        row_changed(session, reason="create", actor=actor)
        return session


def patch_session(
    *,
    label: str,
    owner_id: int | None = None,
    key: str | None = None,
    pk: int | None = None,
    actor: str = Actor.USER,
) -> ChatSession:
    """Rename a session."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key, pk=pk)
        session.label = label
        save_row(session, "label")
        row_changed(session, reason="patch", actor=actor)
        return session


def abort(
    *,
    owner_id: int,
    key: str,
    run_id: str | None,
    owner_process: str,
    stop_reason: str = "rpc",
    actor: str = Actor.USER,
) -> AbortOutcome:
    """chat.abort: stop one run (its queued successor starts, owned by `owner_process`),
    or every active and queued run of the session."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key)
        if run_id is None:
            killed = kill_all(session, stop_reason=stop_reason, actor=actor)
            return AbortOutcome(bool(killed), killed)
        run = Run.objects.filter(session=session, run_id=run_id).first()
        if run is None:
            if Run.objects.filter(session__owner_id=owner_id, run_id=run_id).exists():
                raise LifecycleError("INVALID_REQUEST", "runId belongs to another session", field="runId")
            return AbortOutcome(False, [])
        if kill(run, session, stop_reason=stop_reason, actor=actor, owner_process=owner_process, start_next=True):
            return AbortOutcome(True, [run.run_id])
        return AbortOutcome(False, [])


def abort_all(
    *,
    owner_id: int | None = None,
    key: str | None = None,
    pk: int | None = None,
    stop_reason: str,
    actor: str,
    create: bool = False,
    agent_id: str = "main",
) -> tuple[ChatSession, list[str]]:
    """Abort every open run of a session: `/stop` (which creates the session if needed), operators."""
    with transaction.atomic():
        session = _lock(owner_id=owner_id, key=key, pk=pk, create=create, agent_id=agent_id, actor=actor)
        return session, kill_all(session, stop_reason=stop_reason, actor=actor)


def reset_session(
    *,
    owner_id: int | None = None,
    key: str | None = None,
    pk: int | None = None,
    actor: str = Actor.USER,
    create: bool = False,
    agent_id: str = "main",
) -> tuple[ChatSession, list[str]]:
    """sessions.reset and /new: abort open runs, rotate sessionId, start a fresh transcript."""
    with transaction.atomic():
        session = _lock(owner_id=owner_id, key=key, pk=pk, create=create, agent_id=agent_id, actor=actor)
        killed = kill_all(session, stop_reason="reset", actor=actor)
        session.session_id = uuid.uuid4()
        take_outcome(session, None)  # a fresh transcript has no last run
        session.started_at = None
        save_row(
            session, "session_id", "status", "last_run", "started_at", "ended_at", "aborted_last_run", "last_run_error"
        )
        row_changed(session, reason="reset", actor=actor)
        return session, killed


def delete_session(
    *, owner_id: int | None = None, key: str | None = None, pk: int | None = None, actor: str = Actor.USER
) -> list[str]:
    """Abort open runs (stopReason delete), announce the deleted row, delete everything."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key, pk=pk)
        killed = kill_all(session, stop_reason="delete", actor=actor)
        session.version += 1
        row_changed(session, reason="delete", actor=actor, deleted=True)
        session.delete()
        return killed


def _lock(
    *, owner_id: int | None, key: str | None, pk: int | None, create: bool, agent_id: str, actor: str
) -> ChatSession:
    """The session, locked; created first when `create` (the inline commands name any key)."""
    if create:
        assert owner_id is not None and key is not None
        return lock_or_create_session(owner_id=owner_id, key=key, agent_id=agent_id, actor=actor)
    return lock_session(owner_id=owner_id, key=key, pk=pk)
