"""Branches of a transcript: switch, rewind, fork, and where a regenerated or edited message goes.

The session's `active_leaf` is written here (and by `core.append_message`, as messages are added):
each move under the session lock, announced (`sessions.changed` with reason `branch-switch`, `rewind`
or `fork`) with an audit row saying from where to where. None of them while a run of the session is
active or queued: the run's messages would land on a branch it was not given (UNAVAILABLE).
Nothing is deleted: a rewound or abandoned branch stays in the tree, and can be switched back to.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from sessions_app import branches, statements
from sessions_app.lifecycle.core import (
    LifecycleError,
    lock_session,
    row_changed,
    save_row,
)
from sessions_app.models import Actor, ChatSession, Message, Run, RunState

# what each action is called in its refusal while the agent works (OpenClaw's words)
_BUSY = {
    "switch": "Branch switch is unavailable while the agent is working.",
    "rewind": "Rewind is unavailable while the agent is working.",
    "fork": "Fork is unavailable while the agent is working.",
    "regenerate": "Regenerate is unavailable while the agent is working.",
}


def refuse_while_working(session: ChatSession, action: str) -> None:
    """UNAVAILABLE while a run of the locked session is active or queued."""
    queue = statements.known_queue(session)
    queued = bool(queue) if queue is not None else Run.objects.filter(session=session, state=RunState.QUEUED).exists()
    if session.active_run_id is not None or queued:
        raise LifecycleError("UNAVAILABLE", _BUSY[action], reason="session-busy", retryable=True)


def entry(session: ChatSession, entry_id: int, *, field: str = "entryId", what: str = "message") -> Message:
    """A message of the session's current transcript by its id (INVALID_REQUEST when there is none)."""
    found = Message.objects.filter(pk=entry_id, session=session, session_generation=session.session_id).first()
    if found is None:
        raise LifecycleError(
            "INVALID_REQUEST", f"{what} entry not found: {entry_id}", field=field, reason="missing-entry"
        )
    return found


def _user_message_on_active_path(session: ChatSession, entry_id: int) -> Message:
    """The user message `entry_id` of the active branch: what rewind and fork cut before."""
    message = entry(session, entry_id)
    if message.role != "user" or message.command_key:
        raise LifecycleError(
            "INVALID_REQUEST", f"entry is not a user message: {entry_id}", field="entryId", reason="not-user-message"
        )
    if message.pk not in branches.path_ids(session.active_leaf_id):
        raise LifecycleError(
            "INVALID_REQUEST",
            f"message entry is not on the active path: {entry_id}",
            field="entryId",
            reason="off-active-path",
        )
    return message


def move_leaf(session: ChatSession, leaf_id: int | None, *, reason: str, actor: str) -> None:
    """Make `leaf_id` the locked session's active leaf, announced with `reason` and audited (from, to)."""
    before = session.active_leaf_id
    session.active_leaf_id = leaf_id
    save_row(session, "active_leaf")
    row_changed(session, reason=reason, actor=actor, detail=f"active leaf {before or '-'} -> {leaf_id or '-'}")


def switch_branch(*, owner_id: int, key: str, leaf_id: int, actor: str = Actor.USER) -> ChatSession:
    """`sessions.branches.switch`: the active branch becomes the one ending at `leaf_id`, a branch end."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key)
        refuse_while_working(session, "switch")
        leaf = entry(session, leaf_id, field="leafEntryId", what="branch")
        if leaf.pk == session.active_leaf_id:
            raise LifecycleError(
                "INVALID_REQUEST", f"branch is already active: {leaf_id}", field="leafEntryId", reason="already-active"
            )
        if Message.objects.filter(parent=leaf).exists():
            raise LifecycleError(
                "INVALID_REQUEST", f"entry is not a branch tip: {leaf_id}", field="leafEntryId", reason="not-branch-tip"
            )
        move_leaf(session, leaf.pk, reason="branch-switch", actor=actor)
        return session


@dataclass(frozen=True)
class Cut:
    """What rewind and fork answer: the session (the new one, for a fork) and the cut message's text."""

    session: ChatSession
    editor_text: str


def rewind(*, owner_id: int, key: str, entry_id: int, actor: str = Actor.USER) -> Cut:
    """`sessions.rewind`: the active branch goes back to just before the user message `entry_id` (its text
    is handed back for the composer). The branch rewound from stays, a branch one can switch back to."""
    with transaction.atomic():
        session = lock_session(owner_id=owner_id, key=key)
        refuse_while_working(session, "rewind")
        message = _user_message_on_active_path(session, entry_id)
        move_leaf(session, message.parent_id, reason="rewind", actor=actor)
        return Cut(session, message.text)


def fork(*, owner_id: int, key: str, entry_id: int | None, new_key: str | None = None, actor: str = Actor.USER) -> Cut:
    """`sessions.fork` (and `sessions.create {parentSessionKey, fork: true}`, `entry_id` None): a new session
    of the same agent and settings whose transcript is a copy of the active branch before the user message
    `entry_id` (all of it, for None); that message's text is handed back for the new session's composer.

    The copies keep their runs (what history shows of them, their tool calls): the model of the new
    session is sent the same prefix, calls and results included."""
    with transaction.atomic():
        source = lock_session(owner_id=owner_id, key=key)
        refuse_while_working(source, "fork")
        if entry_id is None:
            leaf_id, text = source.active_leaf_id, ""
        else:
            message = _user_message_on_active_path(source, entry_id)
            leaf_id, text = message.parent_id, message.text
        prefix = branches.path(leaf_id)
        new_key = new_key or f"agent:{source.agent_id}:s-{secrets.token_hex(5)}"
        try:
            with transaction.atomic():  # savepoint: the unique constraint decides a race for the key
                forked = ChatSession.objects.create(
                    owner_id=owner_id,
                    key=new_key,
                    agent_id=source.agent_id,
                    label=source.label,
                    thinking_level=source.thinking_level,
                    verbose_level=source.verbose_level,
                    model_override=source.model_override,
                )
        except IntegrityError as exc:
            raise LifecycleError("CONFLICT", "session already exists", reason="session-exists") from exc
        copies = [_copy(m, forked) for m in prefix]
        parent_id: int | None = None
        for copy in copies:  # in order: each copy follows the one before (a fork is one branch)
            copy.parent_id = parent_id
            statements.insert(copy)
            parent_id = copy.pk
        forked.active_leaf_id = parent_id
        save_row(forked, "active_leaf")
        forked.active_run = forked.last_run = None  # known: no query to find out
        row_changed(
            source, reason="fork", actor=actor, detail=f"forked to {new_key} at {entry_id or 'the active leaf'}"
        )
        row_changed(forked, reason="fork", actor=actor, detail=f"forked from {source.key} ({len(copies)} messages)")
        return Cut(forked, text)


@dataclass(frozen=True)
class Regeneration:
    """What `chat.regenerate` names: a reply to answer again, or a user message to send again (edited
    when `message` is given)."""

    entry_id: int
    message: str | None = None


@dataclass(frozen=True)
class Sibling:
    """Where a regenerated run goes: the leaf it starts from, the user message it answers again (a reply
    regenerated: it adds none of its own), its message and attachments."""

    leaf_id: int | None
    prompt_id: int | None
    message: str
    attachments: list[dict[str, object]]


# what places a message (its session, transcript, parent, id, time); a copy keeps everything else
_PLACE = frozenset({"id", "session_id", "session_generation", "parent_id", "created_at"})


def _copy(message: Message, session: ChatSession) -> Message:
    """A message copied into `session`'s transcript as it is: its run, its text, a steered reply part's
    span, and whatever field a message gains later."""
    kept = {f.attname: getattr(message, f.attname) for f in Message._meta.concrete_fields if f.attname not in _PLACE}
    return Message(session=session, session_generation=session.session_id, **kept)


def sibling_of(session: ChatSession, regeneration: Regeneration) -> Sibling:
    """Under the session lock, where the new sibling branch of `regeneration` starts (INVALID_REQUEST for
    an entry that is not a reply to a user message or a user message; UNAVAILABLE while the agent works)."""
    refuse_while_working(session, "regenerate")
    message = entry(session, regeneration.entry_id)
    if message.command_key:
        raise LifecycleError(
            "INVALID_REQUEST", "an inline command cannot be regenerated", field="entryId", reason="command-entry"
        )
    if message.role == "assistant":
        if regeneration.message is not None:
            raise LifecycleError(
                "INVALID_REQUEST", "message edits a user message: name one as entryId", field="message"
            )
        prompt = Message.objects.filter(pk=message.parent_id, role="user").first() if message.parent_id else None
        if prompt is None:
            raise LifecycleError(
                "INVALID_REQUEST", "this reply answers no user message", field="entryId", reason="no-prompt"
            )
        return Sibling(prompt.pk, prompt.pk, prompt.text, _attachments_of(prompt))
    if message.role != "user":
        raise LifecycleError("INVALID_REQUEST", "entry is not a message to regenerate", field="entryId")
    if regeneration.message is None:
        return Sibling(message.parent_id, None, message.text, _attachments_of(message))
    return Sibling(message.parent_id, None, regeneration.message, [])


def _attachments_of(message: Message) -> list[dict[str, object]]:
    """The attachments the run that added this user message was sent with (sent again with it)."""
    if message.run_id is None:
        return []
    found = Run.objects.filter(pk=message.run_id).values_list("attachments", flat=True).first()
    return list(found or [])
