"""Request handlers: validate with `protocol`, act through the lifecycle service and selectors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from chat.db import db_sync_to_async
from sessions_app import lifecycle, selectors
from sessions_app.lifecycle import LifecycleError, SendOutcome, SendRequest
from sessions_app.models import ACTIVE_STATES, Run, RunState

from . import protocol
from .protocol import ProtocolError, invalid
from .runtime.backends import get_backend
from .runtime.manager import run_manager


class Conn(Protocol):
    """What handlers need from the connection."""

    user_id: int
    is_admin: bool
    held_acks: int

    def track_run(self, run_pk: int, *, terminal: bool, run_id: str, session_key: str, session_id: str) -> None: ...
    def set_subscription(self, subscribed: bool, *, all_sessions: bool = False) -> None: ...


@dataclass
class Reply:
    """A response: ok payload, or error (with an optional payload, as the `error` ack has)."""

    payload: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    wait: Callable[[], Awaitable[Reply]] | None = None  # a held ack (waitMs), sent later

    @property
    def ok(self) -> bool:
        return self.error is None


Handler = Callable[[Conn, dict[str, Any]], Awaitable[Reply]]
HANDLERS: dict[str, Handler] = {}


def method(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register



def _lifecycle_error(exc: LifecycleError) -> ProtocolError:
    return ProtocolError(exc.code, exc.message, **exc.details)


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a sync service on a worker thread, mapping domain errors to protocol errors."""
    try:
        return await db_sync_to_async(fn)(*args, **kwargs)
    except LifecycleError as exc:
        raise _lifecycle_error(exc) from exc


# --- health -----------------------------------------------------------------------------------


def _run_counts() -> tuple[int, int]:
    active = Run.objects.filter(state__in=ACTIVE_STATES).count()
    queued = Run.objects.filter(state=RunState.QUEUED).count()
    return active, queued


@method("health")
async def health(conn: Conn, params: dict[str, Any]) -> Reply:
    active, queued = await db_sync_to_async(_run_counts)()
    return Reply({"ok": True, "ts": protocol.now_ms(), "version": settings.GATEWAY_VERSION,
                  "activeRuns": active, "queuedRuns": queued})


# --- chat.send / sessions.steer ------------------------------------------------------------------


def _ack_reply(conn: Conn, outcome: SendOutcome, send: protocol.ChatSendParams) -> Reply:
    session = outcome.session
    run = outcome.run
    status = outcome.status
    if status == "conflict":
        raise ProtocolError(
            "CONFLICT", "idempotencyKey was already used with a different message",
            field="idempotencyKey", reason="idempotency-conflict",
        )
    if status == "queue_full":
        raise ProtocolError(
            "RATE_LIMITED", f"the session queue is full ({settings.GATEWAY_QUEUE_MAX})",
            reason="queue-full", retryable=True, retry_after_ms=1000,
        )
    assert run is not None
    terminal = status in ("ok", "timeout", "error")
    conn.track_run(run.pk, terminal=terminal, run_id=run.run_id, session_key=session.key,
                   session_id=str(run.session_generation))
    payload = protocol.ack_payload(
        run, status, session.key, str(session.session_id),
        queuePosition=outcome.queue_position if status in ("queued", "in_flight") else None,
        interruptedActiveRun=True if outcome.interrupted_active_run else None,
    )
    if status == "error":
        return Reply(payload, {"code": "UNAVAILABLE", "message": payload.get("summary", "run failed")})
    return Reply(payload)


async def _send(conn: Conn, params: dict[str, Any], *, steer: bool) -> Reply:
    send = protocol.parse_chat_send(params)
    if steer:
        send.queue_mode = "interrupt"
    command = send.command
    if command is not None:
        return await _command(conn, send, command)
    if not run_manager.accepting:
        raise ProtocolError("UNAVAILABLE", "server is shutting down", retryable=True, retry_after_ms=1000)
    if send.wait_ms > 0 and conn.held_acks >= settings.GATEWAY_MAX_HELD_ACKS:
        raise ProtocolError(
            "RATE_LIMITED", f"at most {settings.GATEWAY_MAX_HELD_ACKS} acks may be held by waitMs at once",
            field="waitMs", reason="too-many-held-acks", retryable=True, retry_after_ms=1000,
        )
    backend = get_backend(send.agent_id)
    setup_error = (
        f"agent {send.agent_id!r} has no usable backend" if backend is None
        else backend.check_setup(send.message, send.attachments)
    )
    request = SendRequest(
        owner_id=conn.user_id, key=send.key, agent_id=send.agent_id, run_id=send.run_id, message=send.message,
        body_hash=send.body_hash, timeout_ms=send.timeout_ms, attachments=send.attachments,
        queue_mode=send.queue_mode, interrupt_reason="steer" if steer else "interrupt", setup_error=setup_error,
    )
    outcome: SendOutcome = await call(lifecycle.admit_send, request)
    reply = _ack_reply(conn, outcome, send)
    if send.wait_ms > 0 and outcome.status in ("started", "queued", "in_flight") and outcome.run is not None:
        run_pk = outcome.run.pk

        async def held() -> Reply:
            run = await run_manager.wait_terminal(run_pk, send.wait_ms / 1000)
            if run is None:
                # Gone with its deleted session: that ended it (aborted, stopReason delete).
                conn.track_run(run_pk, terminal=True, run_id=send.run_id, session_key=outcome.session.key,
                               session_id=str(outcome.session.session_id))
                return Reply(protocol.ack_payload(None, "timeout", outcome.session.key,
                                                  str(outcome.session.session_id), runId=send.run_id,
                                                  stopReason="delete"))
            # Rebuilt from the run as it is now: a terminal ack once it has ended, a
            # fresh queue position while it waits.
            status = lifecycle.replay_status(run)
            if status == "in_flight" and outcome.status != "in_flight":
                status = "queued" if run.state == RunState.QUEUED else "started"
            position = await db_sync_to_async(lifecycle.queue_position)(run) if status != "started" else None
            return _ack_reply(conn, SendOutcome(status, run, outcome.session, position), send)

        return Reply(wait=held)
    return reply


async def _command(conn: Conn, send: protocol.ChatSendParams, command: str) -> Reply:
    """Inline commands: no run is created (§4)."""
    if command in protocol.STOP_COMMANDS:
        session, killed = await call(lifecycle.stop_session, conn.user_id, send.key, agent_id=send.agent_id)
        extra: dict[str, Any] = {"aborted": bool(killed), "runIds": killed}
    else:
        session, killed = await call(
            lifecycle.reset_session, conn.user_id, send.key, create=True, agent_id=send.agent_id
        )
        extra = {"aborted": bool(killed), "runIds": killed}
    payload = protocol.ack_payload(None, "ok", session.key, str(session.session_id), runId=send.run_id, **extra)
    payload["command"] = command
    return Reply(payload)


@method("chat.send")
async def chat_send(conn: Conn, params: dict[str, Any]) -> Reply:
    return await _send(conn, params, steer=False)


@method("sessions.steer")
async def sessions_steer(conn: Conn, params: dict[str, Any]) -> Reply:
    # The chat.send ack, unchanged: a terminal status stays terminal (§7).
    return await _send(conn, params, steer=True)


# --- chat.abort / chat.history ----------------------------------------------------------------


@method("chat.abort")
async def chat_abort(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = protocol.session_key_param(params)
    run_id = protocol.get_str(params, "runId", required=False, max_len=128, pattern=protocol.RUN_ID_RE)
    outcome = await call(lifecycle.abort, conn.user_id, key, run_id)
    return Reply({"aborted": outcome.aborted, "runIds": outcome.run_ids})


def _history(owner_id: int, key: str, limit: int, before_id: int | None) -> dict[str, Any] | None:
    session = selectors.find_session(owner_id, key)
    if session is None:
        return None
    return selectors.history(session, limit=limit, before_id=before_id)


@method("chat.history")
async def chat_history(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = protocol.session_key_param(params)
    limit = protocol.get_int(params, "limit", lo=1, hi=1000, default=200) or 200
    before_raw = params.get("beforeId")
    before_id: int | None = None
    if before_raw is not None:
        if isinstance(before_raw, bool) or not isinstance(before_raw, str | int) or not str(before_raw).isdigit():
            raise invalid("beforeId must be a message id", field="beforeId")
        before_id = int(before_raw)
    payload = await db_sync_to_async(_history)(conn.user_id, key, limit, before_id)
    if payload is None:
        # A key that was never used is an empty conversation, not an error.
        payload = {"sessionKey": key, "sessionId": None, "messages": [], "hasMore": False, "session": None,
                   "queuedRuns": []}
    return Reply(payload)


# --- agents.list -------------------------------------------------------------------------------


@method("agents.list")
async def agents_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The configured agents (id, display name, model, backend), for a client's agent picker."""
    agents = [
        {
            "id": agent_id,
            "name": str(config.get("name") or agent_id),
            "model": str(config.get("model") or ""),
            "backend": str(config.get("backend") or ""),
        }
        for agent_id, config in settings.GATEWAY_AGENTS.items()
    ]
    return Reply({"agents": agents, "defaultId": "main"})


# --- sessions.* --------------------------------------------------------------------------------

LIST_STATUSES = {"running", "done", "failed", "killed", "timeout", "none"}


@method("sessions.list")
async def sessions_list(conn: Conn, params: dict[str, Any]) -> Reply:
    limit = protocol.get_int(params, "limit", lo=1, hi=500, default=100) or 100
    offset = protocol.get_int(params, "offset", lo=0, hi=10_000_000, default=0) or 0
    status = protocol.get_str(params, "status", required=False, max_len=16)
    if status is not None and status not in LIST_STATUSES:
        raise invalid("status must be one of " + ", ".join(sorted(LIST_STATUSES)), field="status")
    active_only = protocol.get_bool(params, "activeOnly")
    search = protocol.get_str(params, "search", required=False, min_len=0, max_len=200)
    result = await db_sync_to_async(selectors.list_sessions)(
        conn.user_id, limit=limit, offset=offset, status=status, active_only=active_only, search=search or None
    )
    return Reply({"ts": protocol.now_ms(), **result})


@method("sessions.subscribe")
async def sessions_subscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    scope = protocol.get_str(params, "scope", required=False, max_len=16)
    if scope not in (None, "owner", "all"):
        raise invalid("scope must be 'owner' or 'all'", field="scope")
    if scope == "all" and not conn.is_admin:
        raise ProtocolError("FORBIDDEN", "scope 'all' needs operator.admin")
    conn.set_subscription(True, all_sessions=scope == "all")
    return Reply({"subscribed": True})


@method("sessions.unsubscribe")
async def sessions_unsubscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    conn.set_subscription(False)
    return Reply({"subscribed": False})


def _row_of(session: Any) -> dict[str, Any]:
    return selectors.session_rows([session])[0]


@method("sessions.create")
async def sessions_create(conn: Conn, params: dict[str, Any]) -> Reply:
    agent_id = protocol.get_str(params, "agentId", required=False, max_len=64, pattern=protocol.AGENT_ID_RE)
    label = protocol.get_str(params, "label", required=False, min_len=0, max_len=200) or ""
    raw_key = protocol.get_str(params, "sessionKey", required=False, max_len=220)
    key: str | None = None
    if raw_key is not None:
        if agent_id and not raw_key.startswith("agent:"):
            raw_key = f"agent:{agent_id}:{raw_key}"
        key, key_agent = protocol.canonical_key(raw_key)
        if agent_id and agent_id != key_agent:
            raise invalid("agentId does not match sessionKey", field="agentId")
        agent_id = key_agent
    agent_id = agent_id or "main"
    if agent_id not in settings.GATEWAY_AGENTS:
        raise ProtocolError("NOT_FOUND", f"unknown agent: {agent_id}", field="agentId")
    session = await call(lifecycle.create_session, conn.user_id, key, label=label, agent_id=agent_id)
    return Reply({"session": await db_sync_to_async(_row_of)(session)})


@method("sessions.patch")
async def sessions_patch(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = protocol.session_key_param(params)
    label = protocol.get_str(params, "label", min_len=0, max_len=200)
    session = await call(lifecycle.patch_session, conn.user_id, key, label=label or "")
    return Reply({"session": await db_sync_to_async(_row_of)(session)})


@method("sessions.reset")
async def sessions_reset(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = protocol.session_key_param(params)
    session, _killed = await call(lifecycle.reset_session, conn.user_id, key)
    return Reply({"session": await db_sync_to_async(_row_of)(session)})


@method("sessions.delete")
async def sessions_delete(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = protocol.session_key_param(params)
    await call(lifecycle.delete_session, conn.user_id, key)
    return Reply({"deleted": True, "sessionKey": key})
