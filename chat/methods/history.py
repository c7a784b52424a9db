"""A session's transcript: `chat.history`, `sessions.get`, `chat.startup` — messages with their tool
calls and results, fitted to one frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.base.db import db_read
from chat.methods import session_settings
from chat.methods.registry import Conn, Reply, method
from chat.methods.sessions.lookup import _by_short_id, _candidate
from chat.protocol import fields, keys, sizes
from chat.protocol.errors import invalid
from chat.protocol.fields import ANY_COUNT, get_int
from chat.protocol.frames import ms
from chat.protocol.keys import named_session, optional_agent, short_id
from chat.protocol.run_events import run_details
from chat.protocol.scopes import Scope
from chat.protocol.session_rows import session_row
from chat.protocol.tool_events import tool_args, tool_content, tool_error_kind, tool_item
from sessions_app import gateway_reads
from sessions_app.models import (
    ChatSession,
    Message,
    Run,
    ToolCall,
)

# THE most messages one history read returns (chat.history, chat.startup; sessions.get reads a larger
# limit as this one), before it is fitted to one frame
MAX_HISTORY_LIMIT = 1000


def parse_sessions_get(params: dict[str, Any]) -> tuple[str, int]:
    """`sessions.get {key, limit?}`: the session, and how many of its newest messages (default 200).

    OpenClaw bounds `limit` only below (its ACP bridge asks for a million): more than
    `chat.history`'s 1000 is read as 1000.
    """
    key, _agent = named_session(params)
    limit = get_int(params, "limit", lo=1, hi=ANY_COUNT, default=200) or 200
    return key, min(limit, MAX_HISTORY_LIMIT)


@dataclass
class StartupParams:
    """`chat.startup`: a session's first page, named by its key or by a link's shortId."""

    limit: int
    max_bytes: int | None
    key: str | None = None
    short_id: str | None = None
    agent_id: str | None = None


def parse_chat_startup(params: dict[str, Any]) -> StartupParams:
    """Validate `chat.startup` params: `sessionKey` (as `chat.history`), or `shortId` with `agentId`."""
    limit = get_int(params, "limit", lo=1, hi=MAX_HISTORY_LIMIT, default=200) or 200
    max_bytes = get_int(params, "maxBytes", lo=1024, hi=ANY_COUNT, default=None)
    if params.get("shortId") is not None and params.get("sessionKey") is None and params.get("key") is None:
        agent_id = optional_agent(params)
        if agent_id is None:
            raise invalid("agentId is required with shortId", field="agentId")
        return StartupParams(limit, max_bytes, short_id=short_id(params), agent_id=agent_id)
    key, agent_id = named_session(params)
    return StartupParams(limit, max_bytes, key=key, agent_id=agent_id)


def message_items(
    msg: Message,
    runs: dict[int, Run],
    tools: dict[int, list[ToolCall]],
    seq: int | None = None,
    files: dict[int, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """A transcript message; an assistant reply with tool calls also gets its `toolResult` messages (§13.4)."""
    calls = tools.get(msg.run_id, []) if msg.run_id is not None and msg.role == "assistant" else []
    calls = gateway_reads.calls_of_part(msg, calls) if calls else calls
    item = message_item(msg, runs, calls, seq)
    if msg.role == "user" and files and msg.run_id in files and not msg.command_key:
        # Not in the spec: the files the prompt was sent with (docs/files.md), so a reloaded page
        # shows them; their bytes are `GET /api/files/<fileId>`, for their owner.
        item["attachments"] = files[msg.run_id]
    return [item, *(tool_result_message(c, item) for c in calls)]


def openclaw_identity(item: dict[str, Any], seq: int | None) -> dict[str, Any]:
    """OpenClaw's `__openclaw` identity of a history message: `id`, its position `seq` in the
    transcript and, for a run's messages, `runId` and the `idempotencyKey` OpenClaw gives them
    (`RUNID:user` for the prompt, `RUNID` for the reply). Its clients match the messages they
    showed live against history by these, so a turn is not shown twice."""
    identity: dict[str, Any] = {"id": item["id"]}
    if seq is not None:
        identity["seq"] = seq
    run_id = item.get("runId")
    if run_id is not None:
        identity["runId"] = run_id
        identity["idempotencyKey"] = f"{run_id}:user" if item["role"] == "user" else run_id
    return identity


def assistant_content(text: str, calls: Sequence[ToolCall], start: int = 0) -> list[dict[str, Any]]:
    """The reply's text blocks with its calls' `toolCall` blocks where they came in the text (`text`
    starts at `start` of the run's reply: a part of a steered run's)."""
    content: list[dict[str, Any]] = []
    at = 0
    for call in calls:
        cut = min(max(call.reply_offset - start, at), len(text))
        if text[at:cut]:
            content.append({"type": "text", "text": text[at:cut]})
        at = cut
        content.append({"type": "toolCall", "id": call.call_id, "name": call.name, "arguments": tool_args(call)})
    if text[at:] or not content:
        content.append({"type": "text", "text": text[at:]})
    return content


def tool_result_message(call: ToolCall, reply: dict[str, Any]) -> dict[str, Any]:
    """A call's result as a transcript message (OpenClaw's `toolResult`)."""
    return {
        "id": call.call_id,
        "role": "toolResult",
        "toolCallId": call.call_id,
        "toolName": call.name,
        "content": tool_content(call.result),
        "isError": call.is_error,
        "status": call.state,
        **tool_error_kind(call),
        "timestamp": ms(call.ended_at) or reply["timestamp"],
        **({"runId": reply["runId"]} if "runId" in reply else {}),
        "__openclaw": {"id": call.call_id, **({"runId": reply["runId"]} if "runId" in reply else {})},
    }


def message_item(
    msg: Message, runs: dict[int, Run], calls: Sequence[ToolCall] = (), seq: int | None = None
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": str(msg.pk),
        "role": msg.role,
        "content": (
            assistant_content(msg.text, calls, msg.reply_start) if calls else [{"type": "text", "text": msg.text}]
        ),
        "timestamp": ms(msg.created_at),
    }
    run = runs.get(msg.run_id) if msg.run_id is not None else None
    if run is not None:
        item["runId"] = run.run_id
    if msg.aborted:
        item["aborted"] = True
    if msg.command_key:
        # An inline command or its answer: OpenClaw's TUI shows these as notices. The command's
        # key (its ack's runId) lets a client match the command it showed as sent.
        item["command"] = True
        item["runId"] = msg.command_key
    if run is not None and msg.role == "assistant" and run.is_terminal:
        item.update(run_details(run))
    item["__openclaw"] = openclaw_identity(item, seq)
    return item


def empty_history(key: str) -> dict[str, Any]:
    """`chat.history` of a key never used: an empty conversation, not an error."""
    return {"sessionKey": key, "sessionId": None, "messages": [], "hasMore": False, "session": None, "queuedRuns": []}


def history(session: ChatSession, transcript: gateway_reads.Transcript) -> dict[str, Any]:
    """`chat.history` of the session's current generation, oldest first."""
    payload: dict[str, Any] = {
        "sessionKey": session.key,
        "sessionId": str(session.session_id),
        "messages": [
            item
            for i, m in enumerate(transcript.messages)
            for item in message_items(m, transcript.runs, transcript.tools, transcript.first_seq + i, transcript.files)
        ],
        "hasMore": transcript.has_more,
        "session": session_row(session, [r.run_id for r in transcript.queued]),
    }
    if transcript.siblings:
        # Not in the spec: a message with siblings (regenerated, edited, rewound from) says which of
        # them it is and the branch end each leads to (`sessions.branches.switch`), for a "2/3" switcher.
        for item in payload["messages"]:
            found = transcript.siblings.get(int(item["id"])) if item["id"].isdigit() else None
            if found is not None and item["role"] in ("user", "assistant"):
                item["siblings"] = {"index": found.index, "count": len(found.leaves), "leaves": found.leaves}
    active = transcript.active
    if active is not None:
        # a run that took steering messages shows its parts before them as messages: only the rest is in flight
        parts = [m for m in transcript.messages if m.run_id == active.pk and m.role == "assistant"]
        start, after_step = (parts[-1].reply_start + len(parts[-1].text), parts[-1].last_step) if parts else (0, 0)
        payload["inFlightRun"] = {
            "runId": active.run_id,
            "seq": active.stream_seq,
            "text": active.reply[start:].removeprefix("\n\n"),
        }
        if active.pk in transcript.tools:
            calls = [c for c in transcript.tools[active.pk] if c.step > after_step]
            payload["inFlightRun"]["tools"] = [tool_item(c) for c in calls]
    # Not in the spec: the queued messages themselves, so a reloaded page can show them.
    payload["queuedRuns"] = [
        {"runId": r.run_id, "text": r.message, "position": i + 1} for i, r in enumerate(transcript.queued)
    ]
    return payload


def startup(history: dict[str, Any], defaults: dict[str, Any], resolution: dict[str, Any] | None) -> dict[str, Any]:
    """`chat.startup`: a `chat.history` page with the row again as `sessionInfo`, the agent's
    `defaults`, the row's levels, and how a link's shortId was resolved (when it was)."""
    row = history["session"]
    history.update(
        sessionInfo=row,
        defaults=defaults,
        thinkingLevel=row.get("thinkingLevel") if row else None,
        verboseLevel=row.get("verboseLevel") if row else None,
    )
    if resolution is not None:
        history["resolution"] = resolution
    return history


def history_of(owner_id: int, key: str, limit: int, before_id: int | None = None) -> dict[str, Any]:
    """`chat.history` of the owner's session (an empty one for a key not used yet), before paging
    by bytes: `chat.history`, `sessions.get` and `chat.startup` all read it here."""
    session = gateway_reads.find_session(owner_id, key)
    if session is None:
        return empty_history(key)
    return history(session, gateway_reads.transcript(session, limit=limit, before_id=before_id))


@method("chat.history", scope=Scope.READ)
async def chat_history(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    limit = fields.get_int(params, "limit", lo=1, hi=MAX_HISTORY_LIMIT, default=200) or 200
    before_id = fields.get_message_id(params, "beforeId")
    # paged by bytes as well as by count: the page must fit in one frame (maxPayload)
    return Reply(sizes.fit_history(await db_read(history_of, conn.state.user_id, key, limit, before_id)))


@method("sessions.get", scope=Scope.READ)
async def sessions_get(conn: Conn, params: dict[str, Any]) -> Reply:
    """The session's newest messages (`{messages}`; none for a key never used), at most 1000, within
    one frame."""
    key, limit = parse_sessions_get(params)
    page = sizes.fit_history(await db_read(history_of, conn.state.user_id, key, limit))
    return Reply({"messages": page["messages"]})


def _startup(owner_id: int, p: StartupParams) -> dict[str, Any]:
    resolution: dict[str, Any] | None = None
    key = p.key
    if p.short_id is not None:
        found = _by_short_id(owner_id, p.agent_id, p.short_id)
        if len(found) != 1:
            return {"resolution": {"ok": False, **({"candidates": [_candidate(s) for s in found]} if found else {})}}
        key = found[0].key
        resolution = {"ok": True, **_candidate(found[0])}
    assert key is not None
    history = history_of(owner_id, key, p.limit)
    return startup(history, session_settings.session_defaults(keys.agent_id_of(key)), resolution)


@method("chat.startup", scope=Scope.READ)
async def chat_startup(conn: Conn, params: dict[str, Any]) -> Reply:
    """`chat.history` with what the Control UI opens a chat with: the row as `sessionInfo` and the
    agent's `defaults`; named by a link's `shortId`, also its `resolution`."""
    p = parse_chat_startup(params)
    payload = await db_read(_startup, conn.state.user_id, p)
    if "messages" not in payload:
        return Reply(payload)  # a shortId that names no one session
    budget = sizes.frame_budget()
    if p.max_bytes is not None:
        budget = min(budget, p.max_bytes)
    return Reply(sizes.fit_history(payload, budget))
