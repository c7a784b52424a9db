"""A transcript's branches in OpenClaw's shapes: `sessions.branches.list`, `sessions.branches.switch`,
`sessions.rewind`, `sessions.fork` (and `sessions.create {parentSessionKey, fork: true}`), and ours,
`chat.regenerate` (docs/branches.md). Entry ids are history messages' ids (`__openclaw.id`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.conf import settings

from chat.base.db import db_read
from chat.methods.registry import Conn, Reply, call, method
from chat.methods.send.admission import admit
from chat.methods.send.handlers import _ack_reply
from chat.methods.send.params import ChatSendParams
from chat.protocol import keys
from chat.protocol.errors import invalid
from chat.protocol.fields import CONTROL_RE, RUN_ID_RE, get_int, get_str, require_unicode
from chat.protocol.scopes import Scope
from sessions_app import branches, gateway_reads
from sessions_app.lifecycle import branches as branch_service


def entry_id(params: dict[str, Any], name: str) -> int:
    """An entry id param: a history message's id. An id of no message here is `missing-entry`."""
    value = get_str(params, name, max_len=64)
    assert value is not None
    value = value.strip()
    if not value.isdigit() or len(value) > 18:
        what = "branch" if name == "leafEntryId" else "message"
        raise invalid(f"{what} entry not found: {value}", field=name, reason="missing-entry")
    return int(value)


def _summaries(owner_id: int, key: str) -> list[dict[str, Any]]:
    session = gateway_reads.find_session(owner_id, key)
    if session is None:
        return []
    return [
        {
            "leafEntryId": str(b.leaf_id),
            "headline": b.headline,
            "messageCount": b.message_count,
            "updatedAt": b.updated_at.isoformat().replace("+00:00", "Z"),
            "active": b.active,
        }
        for b in branches.summaries(session)
    ]


@method("sessions.branches.list", scope=Scope.READ)
async def sessions_branches_list(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    return Reply({"branches": await db_read(_summaries, conn.state.user_id, key)})


@method("sessions.branches.switch", scope=Scope.WRITE)
async def sessions_branches_switch(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    leaf = entry_id(params, "leafEntryId")
    await call(branch_service.switch_branch, owner_id=conn.state.user_id, key=key, leaf_id=leaf)
    return Reply({})


def _cut(cut: branch_service.Cut) -> dict[str, Any]:
    return {"editorText": cut.editor_text} if cut.editor_text else {}


@method("sessions.rewind", scope=Scope.WRITE)
async def sessions_rewind(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    entry = entry_id(params, "entryId")
    cut = await call(branch_service.rewind, owner_id=conn.state.user_id, key=key, entry_id=entry)
    return Reply(_cut(cut))


@method("sessions.fork", scope=Scope.WRITE)
async def sessions_fork(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    entry = entry_id(params, "entryId")
    cut = await call(branch_service.fork, owner_id=conn.state.user_id, key=key, entry_id=entry)
    return Reply({"sessionKey": cut.session.key, **_cut(cut)})


async def create_fork(conn: Conn, params: dict[str, Any], new_key: str | None) -> int:
    """`sessions.create {parentSessionKey, fork: true}`: a new session (`key`, or a generated one) with a
    copy of the parent's whole active branch; its pk."""
    raw = get_str(params, "parentSessionKey", max_len=220)
    assert raw is not None
    parent, _agent = keys.canonical_key(raw, field="parentSessionKey")
    cut = await call(branch_service.fork, owner_id=conn.state.user_id, key=parent, entry_id=None, new_key=new_key)
    return int(cut.session.pk)


@method("chat.regenerate", scope=Scope.WRITE)
async def chat_regenerate(conn: Conn, params: dict[str, Any]) -> Reply:
    """`chat.regenerate {sessionKey, entryId, message?, idempotencyKey, timeoutMs?}`: a sibling branch of
    `entryId` (a new reply to the same user message, or that user message sent again, edited when
    `message` is given) and its run, started in one step; acked as `chat.send` is."""
    key, agent_id = keys.session_key_param(params)
    entry = entry_id(params, "entryId")
    edit = params.get("message")
    if edit is not None:
        if not isinstance(edit, str):
            raise invalid("message must be a string", field="message")
        if "\x00" in edit:
            raise invalid("message must not contain NUL bytes", field="message")
        require_unicode(edit, "message")
        edit = CONTROL_RE.sub("", edit)
        if not edit.strip():
            raise invalid("message must not be empty", field="message")
        if len(edit) > settings.GATEWAY_MAX_MESSAGE_CHARS:
            raise invalid(f"message is longer than {settings.GATEWAY_MAX_MESSAGE_CHARS} characters", field="message")
    run_id = get_str(params, "idempotencyKey", max_len=128, pattern=RUN_ID_RE)
    assert run_id is not None
    timeout_ms = get_int(params, "timeoutMs", lo=1000, hi=3_600_000, default=settings.GATEWAY_DEFAULT_TIMEOUT_MS)
    text = edit if edit is not None else await db_read(branches.regeneration_text, conn.state.user_id, key, entry)
    body = {"regenerate": entry, "message": edit}
    send = ChatSendParams(
        key=key,
        agent_id=agent_id,
        message=text,
        run_id=run_id,
        timeout_ms=timeout_ms or settings.GATEWAY_DEFAULT_TIMEOUT_MS,
        request_hash=hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
        regeneration=branch_service.Regeneration(entry, edit),
    )
    return _ack_reply(conn, await admit(conn.state.user_id, send))
