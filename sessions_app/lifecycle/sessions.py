"""Sessions: create, rename and change settings, answer inline commands, abort, stop, reset and delete.

Each service finds its session by owner and key (clients) or by primary key
(operators): `lock_session(owner_id=..., key=...)` or `lock_session(pk=...)`.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from django.db import IntegrityError, transaction

from sessions_app import signals, statements
from sessions_app.lifecycle.core import (
    OUTCOME_FIELDS,
    LifecycleError,
    append_message,
    kill,
    kill_all,
    lock_or_create_session,
    lock_session,
    row_changed,
    save_row,
    take_outcome,
)
from sessions_app.models import Actor, ChatSession, CommandReceipt, Message, Run


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


@dataclass(frozen=True)
class SettingsChange:
    """What a patch changes (values already validated by the caller): None leaves a field as it
    is, "" clears it (no label; the agent's default level or model)."""

    label: str | None = None
    thinking_level: str | None = None
    verbose_level: str | None = None
    model: str | None = None

    def apply(self, session: ChatSession) -> list[str]:
        """Set the given fields on `session`; the names of the row fields they are."""
        changed = []
        for attr, field in (
            ("label", "label"),
            ("thinking_level", "thinking_level"),
            ("verbose_level", "verbose_level"),
            ("model", "model_override"),
        ):
            value = getattr(self, attr)
            if value is not None:
                setattr(session, field, value)
                changed.append(field)
        return changed


def patch_session(
    *,
    owner_id: int | None = None,
    key: str | None = None,
    pk: int | None = None,
    label: str | None = None,
    change: SettingsChange | None = None,
    actor: str = Actor.USER,
    create: bool = False,
    agent_id: str = "main",
) -> ChatSession:
    """Rename a session and change its settings (`label`, or any fields of `change`); one `patch`.

    With `create`, a key not used yet is created first (announced as `create`), as OpenClaw's
    `sessions.patch` does: a client may choose a model before the first message.
    """
    change = change or SettingsChange()
    if label is not None:
        change = replace(change, label=label)
    with transaction.atomic():
        session = _lock(owner_id=owner_id, key=key, pk=pk, create=create, agent_id=agent_id, actor=actor)
        save_row(session, *change.apply(session))
        row_changed(session, reason="patch", actor=actor)
        return session


CommandEffect = Literal["answer", "stop", "reset"]


@dataclass(frozen=True)
class InlineCommand:
    """An inline command as the lifecycle carries it out (parsed and validated by the caller).

    `answer` only answers (after applying `change`, if any) and stores the exchange in the
    transcript; `stop` aborts the session's open runs; `reset` does that, rotates the sessionId
    and starts a fresh transcript.
    """

    key: str  # the send's idempotencyKey: the command's key in its session
    text: str  # the command as typed: a retry under the key must send the same
    effect: CommandEffect = "answer"
    change: SettingsChange | None = None


@dataclass(frozen=True)
class CommandAnswer:
    """What an inline command did, as its receipt recorded it; `replayed`: a retry, nothing done now."""

    session: ChatSession
    receipt: CommandReceipt
    replayed: bool


def answer_command(
    *,
    owner_id: int,
    key: str,
    agent_id: str,
    command: InlineCommand,
    answer: Callable[[ChatSession, list[str]], str],
    actor: str = Actor.USER,
) -> CommandAnswer:
    """An inline command (/stop, /new, /reset, /status, /think, /verbose, /model): create the
    session if needed, do what it does, and record `answer(session, stopped run ids)` in a receipt
    under `command.key` (the send's idempotencyKey). /status and the settings commands also store
    the command and its answer in the current transcript under that key (`command_stored`), marked
    as a command's: no model ever reads them.

    A key the session has seen is answered as a run's is (§4): the same command again gets its
    receipt (`replayed`) and nothing is done, stored or announced again; a key of another command,
    or of a run, is CONFLICT. One transaction: the answer describes the row exactly as this change
    leaves it, and the receipt commits with the change or not at all.
    """
    with transaction.atomic():
        session = lock_or_create_session(owner_id=owner_id, key=key, agent_id=agent_id, actor=actor)
        receipt = CommandReceipt.objects.filter(session=session, key=command.key).first()
        if receipt is not None:
            if receipt.text != command.text:
                raise _key_conflict()
            return CommandAnswer(session, receipt, replayed=True)
        if Run.objects.filter(session=session, run_id=command.key).exists():
            raise _key_conflict()
        killed: list[str] = []
        if command.effect == "stop":
            killed = kill_all(session, stop_reason="stop", actor=actor)
        elif command.effect == "reset":
            killed = _reset(session, actor=actor)
        elif command.change is not None and (fields := command.change.apply(session)):
            save_row(session, *fields)
            row_changed(session, reason="patch", actor=actor)
        reply = answer(session, killed)
        receipt = statements.insert(
            CommandReceipt(
                session=session,
                key=command.key,
                text=command.text,
                reply=reply,
                run_ids=killed,
                session_generation=session.session_id,
            )
        )
        if command.effect == "answer":
            for role, body in (("user", command.text), ("assistant", reply)):
                append_message(
                    session,
                    Message(
                        session=session,
                        session_generation=session.session_id,
                        role=role,
                        text=body,
                        command_key=command.key,
                    ),
                )
            save_row(session, "active_leaf")
            signals.command_stored.send(sender=CommandReceipt, session=session, receipt=receipt)
        return CommandAnswer(session, receipt, replayed=False)


def _key_conflict() -> LifecycleError:
    # the words and details chat.send uses for a key reused with another message
    return LifecycleError(
        "CONFLICT",
        "idempotencyKey was already used with a different message",
        field="idempotencyKey",
        reason="idempotency-conflict",
    )


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
    *, owner_id: int | None = None, key: str | None = None, pk: int | None = None, stop_reason: str, actor: str
) -> tuple[ChatSession, list[str]]:
    """Abort every open run of a session (operators; `/stop` is `answer_command`'s)."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key, pk=pk)
        return session, kill_all(session, stop_reason=stop_reason, actor=actor)


def reset_session(
    *, owner_id: int | None = None, key: str | None = None, pk: int | None = None, actor: str = Actor.USER
) -> tuple[ChatSession, list[str]]:
    """sessions.reset (and operators; /new and /reset are `answer_command`'s): abort open runs,
    rotate sessionId, start a fresh transcript."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key, pk=pk)
        return session, _reset(session, actor=actor)


def _reset(session: ChatSession, *, actor: str) -> list[str]:
    """Reset the locked session: its open runs aborted (stopReason reset), a new sessionId; the runs aborted."""
    killed = kill_all(session, stop_reason="reset", actor=actor)
    session.session_id = uuid.uuid4()
    take_outcome(session, None)  # a fresh transcript has no last run
    session.started_at = None
    session.active_leaf_id = None  # nor any message
    save_row(session, "session_id", "started_at", "active_leaf", *OUTCOME_FIELDS)
    row_changed(session, reason="reset", actor=actor)
    return killed


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
    """The session, locked; created first when `create` (a patch may name a key not used yet)."""
    if create:
        assert owner_id is not None and key is not None
        return lock_or_create_session(owner_id=owner_id, key=key, agent_id=agent_id, actor=actor)
    return lock_session(owner_id=owner_id, key=key, pk=pk)
