"""`sessions.list`, `subscribe`, `create`, `patch`, `reset`, `delete`: a session's life, answered in
OpenClaw's shapes.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.utils import timezone

from chat.base.availability import Unavailable
from chat.base.db import db_read
from chat.delivery import groups
from chat.methods import branches, session_settings
from chat.methods.commands import command
from chat.methods.registry import Conn, Reply, call, method
from chat.methods.send import params as send_params
from chat.methods.send.acks import AckStatus
from chat.methods.send.admission import admit
from chat.methods.send.handlers import _ack_reply
from chat.methods.session_settings import thinking_levels
from chat.methods.sessions import params as sessions_params
from chat.protocol import errors, fields, keys, sizes
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.frames import now_ms
from chat.protocol.scopes import Scope
from chat.protocol.session_rows import session_row, session_rows
from chat.protocol.sizes import paged
from sessions_app import gateway_reads
from sessions_app.lifecycle import sessions
from sessions_app.models import (
    ChatSession,
)

log = logging.getLogger(__name__)


def row_of(session_pk: int) -> dict[str, Any] | None:
    """The row of one session as stored now, or None when it is gone."""
    session = gateway_reads.session_by_pk(session_pk)
    return session_rows([session], gateway_reads.queues_of([session]))[0] if session is not None else None


def session_answer(row: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """The answer of a method that creates or changes a session: the row as `session` (ours) and,
    as OpenClaw answers, `ok`, `key`, `sessionId` and the row again as `entry`."""
    answer: dict[str, Any] = {"ok": True, "session": row}
    if row is not None:
        answer.update({"key": row["key"], "sessionId": row["sessionId"], "entry": row})
    answer.update(extra)
    return answer


def session_list(page: gateway_reads.SessionPage, offset: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """A `sessions.list` page (`sizes.fit_list` may shorten it to fit one frame)."""
    rows = session_rows(page.sessions, gateway_reads.queues_of(page.sessions))
    payload = {"ts": now_ms(), "totalCount": page.total, "defaults": defaults, "sessions": rows}
    return paged(payload, offset)


def patch_result(row: dict[str, Any]) -> dict[str, Any]:
    """`sessions.patch`'s answer: a `session_answer` with OpenClaw's `resolved` (the model and
    thinking level the session now runs with, and the levels it may choose)."""
    resolved = {
        "modelProvider": row["modelProvider"],
        "model": row["model"],
        "thinkingLevel": row["thinkingLevel"],
        "thinkingLevels": thinking_levels(),
    }
    return session_answer(row, resolved=resolved)


def _list(owner_id: int, p: sessions_params.ListParams, read: int) -> dict[str, Any]:
    defaults = session_settings.session_defaults(p.agent_id or "main")
    if p.spawned_by is not None:
        # OpenClaw's sub-sessions of another session: this gateway spawns none
        return session_list(gateway_reads.SessionPage([], 0), p.offset, defaults)
    page = gateway_reads.list_sessions(
        owner_id,
        offset=p.offset,
        limit=read,
        status=p.status,
        active_only=p.active_only,
        search=p.search,
        agent_id=p.agent_id,
        updated_since=None if p.active_minutes is None else timezone.now() - timedelta(minutes=p.active_minutes),
        kinds=p.kinds,
    )
    return session_list(page, p.offset, defaults)


@method("sessions.list", scope=Scope.READ)
async def sessions_list(conn: Conn, params: dict[str, Any]) -> Reply:
    p = sessions_params.parse_sessions_list(params)
    # One frame holds the page (maxPayload): rows beyond what could fit are not read, and the
    # page is cut to what does fit, its paging fields saying where to go on.
    read = sizes.rows_that_may_fit(p.limit)
    return Reply(sizes.fit_list(await db_read(_list, conn.state.user_id, p, read), p.offset))


@method("sessions.subscribe", scope=Scope.READ)
async def sessions_subscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    scope = fields.get_str(params, "scope", required=False, max_len=16)
    if scope not in (None, "owner", "all"):
        raise invalid("scope must be 'owner' or 'all'", field="scope")
    if scope == "all" and not conn.state.is_admin:
        raise ProtocolError("FORBIDDEN", "scope 'all' needs operator.admin")
    kinds = sessions_params.parse_kinds(params)
    conn.state.set_subscription(True, all_sessions=scope == "all", kinds=kinds)
    if scope == "all":
        await conn.join_group(groups.OPERATORS)
    return Reply({"subscribed": True})


@method("sessions.unsubscribe", scope=Scope.READ)
async def sessions_unsubscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    conn.state.set_subscription(False)
    return Reply({"subscribed": False})


@method("sessions.create", scope=Scope.WRITE)
async def sessions_create(conn: Conn, params: dict[str, Any]) -> Reply:
    """A new session, answered in OpenClaw's shape; with a first message (as OpenClaw's Control UI
    opens a new chat) also sent, as chat.send sends it, under the create's idempotencyKey."""
    p = sessions_params.parse_sessions_create(params)
    owner_id = conn.state.user_id
    if params.get("fork") is True and params.get("parentSessionKey") is not None:
        # OpenClaw's Fork of a whole session (docs/branches.md)
        forked = await branches.create_fork(conn, params, p.key)
        return Reply(session_answer(await db_read(row_of, forked), runStarted=False))
    first = p.first
    try:
        session = await call(sessions.create_session, owner_id=owner_id, key=p.key, label=p.label, agent_id=p.agent_id)
    except ProtocolError as exc:
        if first is None or p.key is None or exc.details.get("reason") != "session-exists":
            raise
        retried = await db_read(gateway_reads.create_retry, owner_id, p.key, first.run_id, derived=p.derived_key)
        if retried is None:
            raise
        # A retry of a create that got this far: its first message is answered from what is stored
        # (a replay), or sent now if the first attempt stored none. Nothing is created by it, so
        # its errors are its own (and it is safe to retry again).
        first.key = retried.key
        return Reply(await _with_first_message(retried, await _send_first(conn, first)))
    if first is None:
        return Reply(session_answer(await db_read(row_of, session.pk), runStarted=False))
    first.key = session.key
    # The session is committed: whatever stops its message is the answer's runError, never the
    # request's error, which would invite a retry that creates a second session.
    try:
        ack = await _send_first(conn, first)
    except ProtocolError as exc:
        ack = Reply(error=exc.to_error())
    except Unavailable as exc:
        ack = Reply(error=errors.unavailable(exc.dependency, retry_after_ms=exc.retry_after_ms).to_error())
    except Exception:
        log.exception("sessions.create: sending the first message failed")
        ack = Reply(error=ProtocolError("INTERNAL", "internal error").to_error())
    return Reply(await _with_first_message(session, ack))


async def _send_first(conn: Conn, first: send_params.ChatSendParams) -> Reply:
    """`sessions.create`'s first message, sent as chat.send sends it (no `final` for a command:
    its answer carries the `reply`)."""
    if first.command is not None:
        return await command(conn, first)
    return _ack_reply(conn, await admit(conn.state.user_id, first))


async def _with_first_message(session: ChatSession, ack: Reply) -> dict[str, Any]:
    """`sessions.create`'s answer after its first message: the row read again (so `entry` shows the
    run and `sessionId` is the row's) with the send's ack and `runStarted`, or its `runError`."""
    try:
        row = await db_read(row_of, session.pk)
    except Unavailable:
        row = session_row(session, ())  # the row as last read: the answer goes out regardless
    if ack.error is not None:
        return session_answer(row, runStarted=False, runError=ack.error)
    payload = ack.payload if isinstance(ack.payload, dict) else {}
    return session_answer(row, **payload, runStarted=payload.get("status") == AckStatus.STARTED)


@method("sessions.patch", scope=Scope.WRITE)
async def sessions_patch(conn: Conn, params: dict[str, Any]) -> Reply:
    """Label and settings (docs/protocol-notes.md, "Session settings"), answered in OpenClaw's shape."""
    patch = sessions_params.parse_session_patch(params)
    change = sessions.SettingsChange(
        label=patch.label, thinking_level=patch.thinking_level, verbose_level=patch.verbose_level, model=patch.model
    )
    session = await call(
        sessions.patch_session,
        owner_id=conn.state.user_id,
        key=patch.key,
        change=change,
        create=True,  # as OpenClaw: settings may be chosen before the first message
        agent_id=patch.agent_id,
    )
    row = await db_read(row_of, session.pk)
    return Reply(patch_result(row) if row is not None else session_answer(None))


@method("sessions.reset", scope=Scope.WRITE)
async def sessions_reset(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.named_session(params)  # OpenClaw's clients send `{key, agentId?}`
    session, _killed = await call(sessions.reset_session, owner_id=conn.state.user_id, key=key)
    return Reply(session_answer(await db_read(row_of, session.pk)))


@method("sessions.delete", scope=Scope.WRITE)
async def sessions_delete(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    await call(sessions.delete_session, owner_id=conn.state.user_id, key=key)
    return Reply({"deleted": True, "sessionKey": key})
