"""The methods OpenClaw's own clients call beside the chat family (its Control UI, TUI and ACP bridge).

Shapes are OpenClaw's (read from its gateway's server code); every choice is written in
docs/protocol-notes.md, "OpenClaw's own clients". What this gateway does not have (cron jobs,
devices, config editing, questions) is answered honestly: an empty list, or UNAVAILABLE.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chat.methods.handlers import Conn, Handler, Reply, check_held, history_of, method
from chat.protocol import frames, wire
from chat.protocol.frames import ProtocolError, Scope
from chat.runtime.db import db_read
from chat.runtime.gateway import runtime
from chat.websocket import outbound
from sessions_app import gateway_reads
from sessions_app.models import ChatSession, Run

# --- sessions ------------------------------------------------------------------------------------


def _row(owner_id: int, key: str) -> dict[str, Any] | None:
    session = gateway_reads.find_session(owner_id, key)
    return wire.session_rows([session])[0] if session is not None else None


@method("sessions.describe", scope=Scope.READ)
async def sessions_describe(conn: Conn, params: dict[str, Any]) -> Reply:
    """One session's row, or `session: null` for a key never used (as OpenClaw answers it)."""
    key, _agent = frames.named_session(params)
    return Reply({"session": await db_read(_row, conn.state.user_id, key)})


def _candidate(session: ChatSession) -> dict[str, Any]:
    candidate = {"key": session.key, "agentId": session.agent_id}
    if session.label:
        candidate["displayName"] = session.label
    return candidate


def _by_short_id(owner_id: int, agent_id: str | None, short_id: str) -> list[ChatSession]:
    """Sessions whose key ends with a UUID that starts with these hex digits (a Control UI link)."""
    found = []
    for session in gateway_reads.find_sessions(
        owner_id, agent_id=agent_id, key_contains=frames.dashed_uuid_prefix(short_id), limit=200
    ):
        suffix = frames.UUID_SUFFIX_RE.search(session.key)
        if suffix is not None and suffix.group(1).replace("-", "").lower().startswith(short_id):
            found.append(session)
    return found[:10]


def _resolve(owner_id: int, p: frames.ResolveParams) -> list[ChatSession]:
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
    p = frames.parse_sessions_resolve(params)
    found = await db_read(_resolve, conn.state.user_id, p)
    if len(found) > 1:
        if p.short_id is not None:
            return Reply({"ok": False, "candidates": [_candidate(s) for s in found]})
        keys = ", ".join(s.key for s in found)
        raise frames.invalid(f"Multiple sessions found with {p.field}: {p.value} ({keys})", field=p.field)
    if not found:
        if p.allow_missing:
            return Reply({"ok": False})
        raise ProtocolError("NOT_FOUND", f"No session found: {p.value}", field=p.field)
    return Reply({"ok": True, **_candidate(found[0])})


@method("sessions.get", scope=Scope.READ)
async def sessions_get(conn: Conn, params: dict[str, Any]) -> Reply:
    """The session's newest messages (`{messages}`; none for a key never used), at most 1000, within
    one frame."""
    key, limit = frames.parse_sessions_get(params)
    page = outbound.fit_history(await db_read(history_of, conn.state.user_id, key, limit))
    return Reply({"messages": page["messages"]})


@method("sessions.messages.subscribe", scope=Scope.READ)
async def messages_subscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    """Acknowledged: a session's live messages reach every connection of its owner as `chat` (and
    `agent`) events already, subscribed or not; no `session.message` events are sent."""
    key, include_approvals = frames.parse_messages_subscribe(params)
    answer: dict[str, Any] = {"subscribed": True, "key": key}
    if include_approvals:
        if Scope.APPROVALS not in conn.state.scopes:
            raise frames.invalid(
                "sessions.messages.subscribe includeApprovals requires scope operator.approvals",
                field="includeApprovals",
            )
        answer["approvalReplay"] = wire.approval_replay(key)
    return Reply(answer)


@method("sessions.messages.unsubscribe", scope=Scope.READ)
async def messages_unsubscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = frames.named_session(params)
    return Reply({"subscribed": False, "key": key})


# --- chat.startup, chat.metadata ---------------------------------------------------------------


def _startup(owner_id: int, p: frames.StartupParams) -> dict[str, Any]:
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
    return wire.startup(history, wire.session_defaults(wire.agent_id_of(key)), resolution)


@method("chat.startup", scope=Scope.READ)
async def chat_startup(conn: Conn, params: dict[str, Any]) -> Reply:
    """`chat.history` with what the Control UI opens a chat with: the row as `sessionInfo` and the
    agent's `defaults`; named by a link's `shortId`, also its `resolution`."""
    p = frames.parse_chat_startup(params)
    payload = await db_read(_startup, conn.state.user_id, p)
    if "messages" not in payload:
        return Reply(payload)  # a shortId that names no one session
    budget = outbound.frame_budget()
    if p.max_bytes is not None:
        budget = min(budget, p.max_bytes)
    return Reply(outbound.fit_history(payload, budget))


@method("chat.metadata", scope=Scope.READ)
async def chat_metadata(conn: Conn, params: dict[str, Any]) -> Reply:
    """What a chat of this agent offers: its inline commands and its defaults (models: `models.list`)."""
    agent_id = frames.parse_identity(params)
    return Reply(
        {
            "agentId": agent_id,
            "commands": wire.commands(agent_id),
            "defaults": wire.session_defaults(agent_id),
        }
    )


@method("commands.list", scope=Scope.READ)
async def commands_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The gateway's inline commands (`chat.send` answers them without a run)."""
    return Reply({"commands": wire.commands(frames.parse_identity(params))})


# --- the gateway and its agents ------------------------------------------------------------------


def _status(owner_id: int | None, user_id: int) -> dict[str, Any]:
    active, queued = gateway_reads.open_run_counts(owner_id)
    page = gateway_reads.list_sessions(user_id, limit=10)
    return wire.gateway_status(
        version=settings.GATEWAY_VERSION,
        active=active,
        queued=queued,
        total=page.total,
        recent=wire.session_rows(page.sessions),
        defaults=wire.session_defaults("main"),
    )


@method("status", scope=Scope.READ)
async def gateway_status(conn: Conn, params: dict[str, Any]) -> Reply:
    """The gateway's status: version, load (as `health` counts it), the caller's recent sessions."""
    state = conn.state
    return Reply(await db_read(_status, None if state.is_admin else state.user_id, state.user_id))


@method("agent.identity.get", scope=Scope.READ)
async def agent_identity(conn: Conn, params: dict[str, Any]) -> Reply:
    return Reply(wire.agent_identity(frames.parse_identity(params)))


@method("models.authStatus", scope=Scope.READ)
async def models_auth_status(conn: Conn, params: dict[str, Any]) -> Reply:
    """No provider here signs in through a client: credentials are the operator's configuration."""
    frames.parse_identity(params)
    return Reply({"ts": wire.now_ms(), "providers": []})


@method("question.list", scope=Scope.READ)
async def question_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """Agents here never ask the operator questions: always none."""
    return Reply({"questions": []})


@method("config.get", scope=Scope.READ)
async def config_get(conn: Conn, params: dict[str, Any]) -> Reply:
    """No configuration is read or edited over the protocol here: an empty, read-only snapshot."""
    return Reply(wire.config_snapshot())


# --- agent.wait ----------------------------------------------------------------------------------


@method("agent.wait", scope=Scope.WRITE)
async def agent_wait(conn: Conn, params: dict[str, Any]) -> Reply:
    """Wait up to `timeoutMs` for a run of the caller's to end; answer its real outcome (`pending`
    when it is still open). The wait is held like a `waitMs` ack: other requests go on meanwhile."""
    p = frames.parse_agent_wait(params)
    run = await db_read(gateway_reads.find_run_of_owner, conn.state.user_id, p.run_id, p.key)
    if run is None:
        raise ProtocolError("NOT_FOUND", "agent run was not found", field="runId")
    key = run.session.key
    if run.is_terminal or p.timeout_ms == 0:
        return Reply(wire.wait_result(run, p.run_id, key))
    check_held(conn, "runId")
    return Reply(wait=lambda: _waited(run, p, key))


async def _waited(run: Run, p: frames.AgentWaitParams, key: str) -> Reply:
    current = await runtime.executor.wait_terminal(run.pk, p.timeout_ms / 1000)
    return Reply(wire.wait_result(current, p.run_id, key))


# --- what this gateway does not have -----------------------------------------------------------

# Reads of OpenClaw features with nothing to show here, answered with OpenClaw's empty result.
NOTHING: dict[str, dict[str, Any]] = {
    "tasks.list": {"tasks": []},  # background tasks: none run here
    "sessions.branches.list": {"branches": []},  # a session here is one line of turns
    "progressCard.get": {"card": None},  # no progress cards
}

# Methods of OpenClaw features this gateway does not have: UNAVAILABLE, saying which feature. They
# are left out of hello-ok's `features.methods`: listing them would claim the feature (OpenClaw's
# clients check that list before some calls, e.g. the Control UI's command palette).
ABSENT: dict[str, str] = {
    "cron.list": "scheduled automations (cron)",
    "cron.status": "scheduled automations (cron)",
    "cron.runs": "scheduled automations (cron)",
    "environments.list": "environments",
    "node.list": "paired nodes",
    "device.pair.list": "device pairing",
    "plugins.list": "plugins",
    "channels.status": "messaging channels",
    "talk.catalog": "voice (talk)",
    "sessions.companion.state": "session companions",
    "sessions.observer.visibility": "observer presence",
    "exec.approval.list": "exec approvals (tool approvals are plugin.approval.*)",
    "openclaw.approval.list": "operator approvals (tool approvals are plugin.approval.*)",
    "config.schema": "config editing",
}
# ... and the changes among them, which need write (OpenClaw: admin) like any change
ABSENT_CHANGES: dict[str, str] = {
    "config.set": "config editing",
    "config.patch": "config editing",
    "config.apply": "config editing",
    "cron.add": "scheduled automations (cron)",
}


def _nothing(result: dict[str, Any]) -> Handler:
    async def answer(conn: Conn, params: dict[str, Any]) -> Reply:
        return Reply(dict(result))

    return answer


def _absent(name: str, feature: str) -> Handler:
    async def answer(conn: Conn, params: dict[str, Any]) -> Reply:
        raise ProtocolError(
            "UNAVAILABLE",
            f"{name} is not available: this gateway has no {feature}",
            retryable=False,
            reason="not-supported",
            method=name,
        )

    return answer


for _name, _result in NOTHING.items():
    method(_name, scope=Scope.READ)(_nothing(_result))
for _name, _feature in ABSENT.items():
    method(_name, scope=Scope.READ, listed=False)(_absent(_name, _feature))
for _name, _feature in ABSENT_CHANGES.items():
    method(_name, scope=Scope.WRITE, listed=False)(_absent(_name, _feature))
