"""Finding a session as OpenClaw's clients name one: `sessions.describe`, `sessions.resolve` (key,
sessionId, label, a link's shortId), `sessions.messages.subscribe`.
"""

from __future__ import annotations

from typing import Any

from chat.base.db import db_read
from chat.methods.registry import Conn, Reply, method
from chat.methods.sessions import params as sessions_params
from chat.protocol import errors, keys
from chat.protocol.errors import ProtocolError
from chat.protocol.frames import now_ms
from chat.protocol.scopes import Scope
from chat.protocol.session_rows import session_rows
from sessions_app import gateway_reads
from sessions_app.models import (
    ChatSession,
)


def _row_of_key(owner_id: int, key: str) -> dict[str, Any] | None:
    session = gateway_reads.find_session(owner_id, key)
    return session_rows([session], gateway_reads.queues_of([session]))[0] if session is not None else None


@method("sessions.describe", scope=Scope.READ)
async def sessions_describe(conn: Conn, params: dict[str, Any]) -> Reply:
    """One session's row, or `session: null` for a key never used (as OpenClaw answers it)."""
    key, _agent = keys.named_session(params)
    return Reply({"session": await db_read(_row_of_key, conn.state.user_id, key)})


def _candidate(session: ChatSession) -> dict[str, Any]:
    candidate = {"key": session.key, "agentId": session.agent_id}
    if session.label:
        candidate["displayName"] = session.label
    return candidate


def _by_short_id(owner_id: int, agent_id: str | None, short_id: str) -> list[ChatSession]:
    """Sessions whose key ends with a UUID that starts with these hex digits (a Control UI link)."""
    found = []
    for session in gateway_reads.find_sessions(
        owner_id, agent_id=agent_id, key_contains=keys.dashed_uuid_prefix(short_id), limit=200
    ):
        suffix = keys.UUID_SUFFIX_RE.search(session.key)
        if suffix is not None and suffix.group(1).replace("-", "").lower().startswith(short_id):
            found.append(session)
    return found[:10]


def _resolve(owner_id: int, p: sessions_params.ResolveParams) -> list[ChatSession]:
    """The caller's sessions the selector names (none, one, or several)."""
    if p.unmatchable:
        return []
    if p.key is not None:
        session = gateway_reads.find_session(owner_id, p.key)
        return [session] if session is not None and p.agent_id in (None, session.agent_id) else []
    if p.short_id is not None:
        return _by_short_id(owner_id, p.agent_id, p.short_id)
    return gateway_reads.find_sessions(owner_id, agent_id=p.agent_id, session_id=p.session_id, label=p.label, limit=2)


@method("sessions.resolve", scope=Scope.READ)
async def sessions_resolve(conn: Conn, params: dict[str, Any]) -> Reply:
    """`{ok: true, key, agentId}` for the one session a key, sessionId, label or shortId names."""
    p = sessions_params.parse_sessions_resolve(params)
    found = await db_read(_resolve, conn.state.user_id, p)
    if len(found) > 1:
        if p.short_id is not None:
            return Reply({"ok": False, "candidates": [_candidate(s) for s in found]})
        keys = ", ".join(s.key for s in found)
        raise errors.invalid(f"Multiple sessions found with {p.field}: {p.value} ({keys})", field=p.field)
    if not found:
        if p.allow_missing:
            return Reply({"ok": False})
        raise ProtocolError("NOT_FOUND", f"No session found: {p.value}", field=p.field)
    return Reply({"ok": True, **_candidate(found[0])})


@method("sessions.messages.subscribe", scope=Scope.READ)
async def messages_subscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    """Acknowledged: a session's live messages reach every connection of its owner as `chat` (and
    `agent`) events already, subscribed or not; no `session.message` events are sent."""
    key, include_approvals = sessions_params.parse_messages_subscribe(params)
    answer: dict[str, Any] = {"subscribed": True, "key": key}
    if include_approvals:
        if Scope.APPROVALS not in conn.state.scopes:
            raise errors.invalid(
                "sessions.messages.subscribe includeApprovals requires scope operator.approvals",
                field="includeApprovals",
            )
        answer["approvalReplay"] = approval_replay(key)
    return Reply(answer)


@method("sessions.messages.unsubscribe", scope=Scope.READ)
async def messages_unsubscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.named_session(params)
    return Reply({"subscribed": False, "key": key})


def approval_replay(key: str) -> dict[str, Any]:
    """`sessions.messages.subscribe`'s `approvalReplay`: none (tool approvals are `plugin.approval.*`)."""
    return {"sessionKey": key, "updatedAtMs": now_ms(), "approvals": [], "truncated": False}
