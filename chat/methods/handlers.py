"""Request handlers: validate with `protocol`, act through the lifecycle services and selectors,
answer with `wire`. Each declares its method name and the scope it needs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from chat.delivery import groups
from chat.methods import timing
from chat.protocol import frames, wire
from chat.protocol.frames import ProtocolError, Scope, invalid
from chat.protocol.wire import AckStatus
from chat.runtime.availability import Unavailable
from chat.runtime.backends import get_backend
from chat.runtime.db import db_read, db_write
from chat.runtime.gateway import runtime
from chat.runtime.tools.host import setup_error as tool_setup_error
from chat.websocket import outbound
from chat.websocket.connection import ConnectionState
from sessions_app import gateway_reads
from sessions_app.lifecycle import LifecycleError, runs, sessions
from sessions_app.lifecycle.runs import SendOutcome, SendRequest
from sessions_app.models import ChatSession, RunState

log = logging.getLogger(__name__)


class Conn(Protocol):
    """What handlers need from the connection."""

    state: ConnectionState

    async def join_group(self, group: str) -> None: ...

    async def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None: ...


@dataclass
class Reply:
    """A response: ok payload, or error (with an optional payload, as the `error` ack has)."""

    payload: dict[str, Any] | list[Any] | None = None
    error: dict[str, Any] | None = None
    # A held answer (waitMs; agent's final), sent later. With a payload or error too, that is
    # answered first: two responses under one request id (agent, §12).
    wait: Callable[[], Awaitable[Reply]] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


Handler = Callable[[Conn, dict[str, Any]], Awaitable[Reply]]


@dataclass(frozen=True)
class Method:
    name: str
    scope: Scope
    handler: Handler
    # In `hello-ok.features.methods`: False for a method that only says a feature is not here.
    listed: bool = True


METHODS: dict[str, Method] = {}


def method(name: str, *, scope: Scope, listed: bool = True) -> Callable[[Handler], Handler]:
    """Register a handler for `name`, callable with `scope`; `listed: False` leaves it out of
    `hello-ok.features.methods` (it still answers when called)."""

    def register(fn: Handler) -> Handler:
        METHODS[name] = Method(name, scope, fn, listed)
        return fn

    return register


def listed_methods() -> list[str]:
    """The methods `hello-ok` announces: those that do what their name says."""
    return [m.name for m in METHODS.values() if m.listed]


def lookup(name: str, state: ConnectionState) -> Method:
    """The method a request names, if it exists and the connection has its scope."""
    found = METHODS.get(name)
    if found is None:
        raise invalid(f"unknown method: {name}", code="UNKNOWN_METHOD", field="method")
    if found.scope not in state.scopes:
        raise ProtocolError("FORBIDDEN", f"{name} needs scope {found.scope}")
    return found


async def dispatch(conn: Conn, name: str, params: dict[str, Any]) -> Reply:
    """Run the handler of a request, metered."""
    reply: Reply = await timing.call_handler(name, lookup(name, conn.state).handler, conn, params)
    return reply


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a lifecycle service on the writer, mapping domain errors to protocol errors."""
    try:
        return await db_write(fn, *args, urgent=True, **kwargs)  # a client waits for its answer
    except LifecycleError as exc:
        raise ProtocolError(exc.code, exc.message, **exc.details) from exc


# --- health -----------------------------------------------------------------------------------


@method("health", scope=Scope.READ)
async def health(conn: Conn, params: dict[str, Any]) -> Reply:
    # gateway-wide load is for operators; a user sees the runs of their own sessions
    active, queued = await db_read(gateway_reads.open_run_counts, None if conn.state.is_admin else conn.state.user_id)
    return Reply(
        {
            "ok": True,
            "ts": wire.now_ms(),
            "version": settings.GATEWAY_VERSION,
            "activeRuns": active,
            "queuedRuns": queued,
        }
    )


# --- chat.send / sessions.steer ------------------------------------------------------------------


def refuse_unadmitted(outcome: SendOutcome) -> None:
    """Raise the error of an admission that produced no run of its own: a conflict, a full queue."""
    if outcome.admission == "conflict":
        raise ProtocolError(
            "CONFLICT",
            "idempotencyKey was already used with a different message",
            field="idempotencyKey",
            reason="idempotency-conflict",
        )
    if outcome.admission == "queue_full":
        raise ProtocolError(
            "RATE_LIMITED",
            f"the session queue is full ({settings.GATEWAY_QUEUE_MAX})",
            reason="queue-full",
            retryable=True,
            retry_after_ms=1000,
        )


def _ack_reply(conn: Conn, outcome: SendOutcome, status: AckStatus | None = None) -> Reply:
    """The ack of an admission (or, for a held ack, of the run as it is now)."""
    refuse_unadmitted(outcome)
    session, run = outcome.session, outcome.run
    assert run is not None
    status = status or wire.ack_status(outcome)
    conn.state.track_run(
        run.pk,
        terminal=status in wire.TERMINAL_ACKS,
        run_id=run.run_id,
        session_key=session.key,
        session_id=str(run.session_generation),
    )
    payload = wire.ack_payload(
        run,
        status,
        session.key,
        str(session.session_id),
        queuePosition=outcome.queue_position if status in (AckStatus.QUEUED, AckStatus.IN_FLIGHT) else None,
        interruptedActiveRun=True if outcome.interrupted_active_run else None,
    )
    if status == AckStatus.ERROR:
        return Reply(payload, {"code": "UNAVAILABLE", "message": payload.get("summary", "run failed")})
    return Reply(payload)


async def _send(conn: Conn, params: dict[str, Any], *, steer: bool) -> Reply:
    send = frames.parse_chat_send(params)
    if steer:
        send.queue_mode, send.steer = "interrupt", True
    if send.command is not None:
        return await command(conn, send, announce=True)
    if send.wait_ms > 0:
        check_held(conn, "waitMs")
    outcome = await admit(conn, send)
    reply = _ack_reply(conn, outcome)
    if send.wait_ms > 0 and outcome.run is not None and wire.ack_status(outcome) in wire.LIVE_ACKS:
        return Reply(wait=lambda: _held_ack(conn, outcome, send))
    return reply


def check_held(conn: Conn, field: str) -> None:
    """Refuse one more held answer over the connection's limit (nothing is stored)."""
    if conn.state.held_acks >= settings.GATEWAY_MAX_HELD_ACKS:
        raise ProtocolError(
            "RATE_LIMITED",
            f"at most {settings.GATEWAY_MAX_HELD_ACKS} answers may be held at once",
            field=field,
            reason="too-many-held-acks",
            retryable=True,
            retry_after_ms=1000,
        )


async def admit(conn: Conn, send: frames.ChatSendParams) -> SendOutcome:
    """Admission of a validated send (chat.send, sessions.steer, agent): one path for all."""
    if not runtime.accepting:
        raise ProtocolError("UNAVAILABLE", "server is shutting down", retryable=True, retry_after_ms=1000)
    # A key seen before is answered from what is stored, without a write (§4).
    outcome = await db_read(_known_send, conn.state.user_id, send)
    if outcome is None:
        outcome = await _admit(conn, send)
    return outcome


def _known_send(owner_id: int, send: frames.ChatSendParams) -> SendOutcome | None:
    """The outcome of a send whose key its session already has, or None for a new key."""
    run = gateway_reads.find_run(owner_id, send.key, send.run_id)
    if run is None:
        return None
    if run.body_hash != send.body_hash:
        return SendOutcome("conflict", run, run.session)
    return SendOutcome("existing", run, run.session, gateway_reads.queue_position(run))


async def _admit(conn: Conn, send: frames.ChatSendParams) -> SendOutcome:
    backend = get_backend(send.agent_id)
    setup_error = (
        f"agent {send.agent_id!r} has no usable backend"
        if backend is None
        else backend.check_setup(send.message, send.attachments)
    )
    if setup_error is None and backend is not None and backend.uses_tools(send.message):
        # bad tool settings, or an MCP server that cannot start: a setup failure (TOOLS.md §13.1)
        setup_error = await tool_setup_error(send.agent_id, backend.config)
    request = SendRequest(
        owner_id=conn.state.user_id,
        key=send.key,
        agent_id=send.agent_id,
        run_id=send.run_id,
        message=send.message,
        body_hash=send.body_hash,
        timeout_ms=send.timeout_ms,
        attachments=send.attachments,
        queue_mode=send.queue_mode,
        interrupt_reason="steer" if send.steer else "interrupt",
        setup_error=setup_error,
    )
    outcome: SendOutcome = await call(runs.admit_send, request, owner_process=runtime.owner_for_new_runs())
    return outcome


async def _held_ack(conn: Conn, outcome: SendOutcome, send: frames.ChatSendParams) -> Reply:
    """The ack of a send with `waitMs`: the run's outcome once it ends, or its live state at the deadline."""
    assert outcome.run is not None
    first = wire.ack_status(outcome)
    session = outcome.session
    run = await runtime.executor.wait_terminal(outcome.run.pk, send.wait_ms / 1000)
    if run is None:
        # Gone with its deleted session: that ended it (aborted, stopReason delete).
        conn.state.track_run(
            outcome.run.pk,
            terminal=True,
            run_id=send.run_id,
            session_key=session.key,
            session_id=str(session.session_id),
        )
        return Reply(
            wire.ack_payload(
                None, AckStatus.TIMEOUT, session.key, str(session.session_id), runId=send.run_id, stopReason="delete"
            )
        )
    # Rebuilt from the run as it is now: a terminal ack once it has ended, a fresh
    # queue position while it waits.
    status = wire.replay_ack(run)
    if status == AckStatus.IN_FLIGHT and first != AckStatus.IN_FLIGHT:
        status = AckStatus.QUEUED if run.state == RunState.QUEUED else AckStatus.STARTED
    position = await db_read(gateway_reads.queue_position, run) if status != AckStatus.STARTED else None
    return _ack_reply(conn, SendOutcome(outcome.admission, run, session, position), status)


async def command(conn: Conn, send: frames.ChatSendParams, *, announce: bool = False) -> Reply:
    """Inline commands (§4; docs/protocol-notes.md): answered by the gateway, never sent to a model.

    No run is created and none is tracked: the ack is terminal (`ok`) and carries the answer as
    `reply`; /status, /think, /verbose and /model also store the command and its answer in the
    transcript, marked `command`, for clients that re-read history after a terminal ack. With
    `announce` (chat.send, sessions.steer) the answer is also sent to this connection, before the
    ack, as the `chat` `final` of the send's runId: OpenClaw's ACP bridge shows only text from
    `chat` events and ignores `reply`. A key used before replays the stored answer (§4).
    """
    command = send.command
    assert command is not None
    owner_id = conn.state.user_id
    killed: list[str] = []
    replayed = False
    if command in frames.STOP_COMMANDS:
        session, killed = await call(
            sessions.abort_all,
            owner_id=owner_id,
            key=send.key,
            stop_reason="stop",
            actor="user",
            create=True,
            agent_id=send.agent_id,
        )
        reply = wire.stop_answer(command, str(session.session_id), killed)
    elif command in frames.RESET_COMMANDS:
        session, killed = await call(
            sessions.reset_session, owner_id=owner_id, key=send.key, create=True, agent_id=send.agent_id
        )
        reply = wire.stop_answer(command, str(session.session_id), killed)
    else:
        setting, arg = frames.SETTING_COMMANDS.get(command), send.command_arg
        change = None
        if setting is not None and arg is not None:
            change = sessions.SettingsChange(
                thinking_level=arg if setting == "thinkingLevel" else None,
                verbose_level=arg if setting == "verboseLevel" else None,
                model=arg if setting == "model" else None,
            )
        session, reply, replayed = await call(
            sessions.answer_command,
            owner_id=owner_id,
            key=send.key,
            agent_id=send.agent_id,
            text=send.command_text,
            command_key=send.run_id,
            answer=wire.command_answer(command, arg),
            change=change,
        )
    if announce and not replayed:
        # Only to this connection (the others do not know the runId), and before the ack: the
        # consumer sends what a handler sends, then its answer, in order on one socket. A replay
        # is its ack alone, as a terminal run's resend is (its `reply` is the answer).
        await conn.send_events([("chat", wire.command_final(send.run_id, session, reply))])
    return Reply(wire.command_ack(send.run_id, session, command, reply, killed))


@method("chat.send", scope=Scope.WRITE)
async def chat_send(conn: Conn, params: dict[str, Any]) -> Reply:
    return await _send(conn, params, steer=False)


@method("sessions.steer", scope=Scope.WRITE)
async def sessions_steer(conn: Conn, params: dict[str, Any]) -> Reply:
    # The chat.send ack, unchanged: a terminal status stays terminal (§7).
    return await _send(conn, params, steer=True)


# --- chat.abort / chat.history ----------------------------------------------------------------


@method("chat.abort", scope=Scope.WRITE)
async def chat_abort(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = frames.session_key_param(params)
    run_id = frames.get_str(params, "runId", required=False, max_len=128, pattern=frames.RUN_ID_RE)
    outcome = await call(
        sessions.abort, owner_id=conn.state.user_id, key=key, run_id=run_id, owner_process=runtime.owner_for_new_runs()
    )
    return Reply({"aborted": outcome.aborted, "runIds": outcome.run_ids})


def history_of(owner_id: int, key: str, limit: int, before_id: int | None = None) -> dict[str, Any]:
    """`chat.history` of the owner's session (an empty one for a key not used yet), before paging
    by bytes: `chat.history`, `sessions.get` and `chat.startup` all read it here."""
    session = gateway_reads.find_session(owner_id, key)
    if session is None:
        return wire.empty_history(key)
    return wire.history(session, gateway_reads.transcript(session, limit=limit, before_id=before_id))


@method("chat.history", scope=Scope.READ)
async def chat_history(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = frames.session_key_param(params)
    limit = frames.get_int(params, "limit", lo=1, hi=1000, default=200) or 200
    before_id = frames.get_message_id(params, "beforeId")
    # paged by bytes as well as by count: the page must fit in one frame (maxPayload)
    return Reply(outbound.fit_history(await db_read(history_of, conn.state.user_id, key, limit, before_id)))


# --- agents.list -------------------------------------------------------------------------------


@method("agents.list", scope=Scope.READ)
async def agents_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The configured agents (id, display name, model, backend), for a client's agent picker."""
    return Reply(wire.agents_list(settings.GATEWAY_AGENTS))


@method("models.list", scope=Scope.READ)
async def models_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The models a session may choose (OpenClaw's `/model` picker): one agent's, or every agent's."""
    return Reply(wire.model_choices(frames.parse_models_list(params)))


# --- sessions.* --------------------------------------------------------------------------------


def _list(owner_id: int, p: frames.ListParams, read: int) -> dict[str, Any]:
    defaults = wire.session_defaults(p.agent_id or "main")
    if p.spawned_by is not None:
        # OpenClaw's sub-sessions of another session: this gateway spawns none
        return wire.session_list(gateway_reads.SessionPage([], 0), p.offset, defaults)
    page = gateway_reads.list_sessions(
        owner_id,
        offset=p.offset,
        limit=read,
        status=p.status,
        active_only=p.active_only,
        search=p.search,
        agent_id=p.agent_id,
        updated_since=None if p.active_minutes is None else timezone.now() - timedelta(minutes=p.active_minutes),
    )
    return wire.session_list(page, p.offset, defaults)


@method("sessions.list", scope=Scope.READ)
async def sessions_list(conn: Conn, params: dict[str, Any]) -> Reply:
    p = frames.parse_sessions_list(params)
    # One frame holds the page (maxPayload): rows beyond what could fit are not read, and the
    # page is cut to what does fit, its paging fields saying where to go on.
    read = outbound.rows_that_may_fit(p.limit)
    return Reply(outbound.fit_list(await db_read(_list, conn.state.user_id, p, read), p.offset))


@method("sessions.subscribe", scope=Scope.READ)
async def sessions_subscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    scope = frames.get_str(params, "scope", required=False, max_len=16)
    if scope not in (None, "owner", "all"):
        raise invalid("scope must be 'owner' or 'all'", field="scope")
    if scope == "all" and not conn.state.is_admin:
        raise ProtocolError("FORBIDDEN", "scope 'all' needs operator.admin")
    conn.state.set_subscription(True, all_sessions=scope == "all")
    if scope == "all":
        await conn.join_group(groups.OPERATORS)
    return Reply({"subscribed": True})


@method("sessions.unsubscribe", scope=Scope.READ)
async def sessions_unsubscribe(conn: Conn, params: dict[str, Any]) -> Reply:
    conn.state.set_subscription(False)
    return Reply({"subscribed": False})


def _row(session_pk: int) -> dict[str, Any] | None:
    return wire.row_of(session_pk)


@method("sessions.create", scope=Scope.WRITE)
async def sessions_create(conn: Conn, params: dict[str, Any]) -> Reply:
    """A new session, answered in OpenClaw's shape; with a first message (as OpenClaw's Control UI
    opens a new chat) also sent, as chat.send sends it, under the create's idempotencyKey."""
    p = frames.parse_sessions_create(params)
    owner_id = conn.state.user_id
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
        return Reply(wire.session_answer(await db_read(_row, session.pk), runStarted=False))
    first.key = session.key
    # The session is committed: whatever stops its message is the answer's runError, never the
    # request's error, which would invite a retry that creates a second session.
    try:
        ack = await _send_first(conn, first)
    except ProtocolError as exc:
        ack = Reply(error=exc.to_error())
    except Unavailable as exc:
        ack = Reply(error=frames.unavailable(exc.dependency, retry_after_ms=exc.retry_after_ms).to_error())
    except Exception:
        log.exception("sessions.create: sending the first message failed")
        ack = Reply(error=ProtocolError("INTERNAL", "internal error").to_error())
    return Reply(await _with_first_message(session, ack))


async def _send_first(conn: Conn, first: frames.ChatSendParams) -> Reply:
    """`sessions.create`'s first message, sent as chat.send sends it (no `final` for a command:
    its answer carries the `reply`)."""
    return await command(conn, first) if first.command is not None else _ack_reply(conn, await admit(conn, first))


async def _with_first_message(session: ChatSession, ack: Reply) -> dict[str, Any]:
    """`sessions.create`'s answer after its first message: the row read again (so `entry` shows the
    run and `sessionId` is the row's) with the send's ack and `runStarted`, or its `runError`."""
    try:
        row = await db_read(_row, session.pk)
    except Unavailable:
        row = wire.session_row(session, ())  # the row as last read: the answer goes out regardless
    if ack.error is not None:
        return wire.session_answer(row, runStarted=False, runError=ack.error)
    payload = ack.payload if isinstance(ack.payload, dict) else {}
    return wire.session_answer(row, **payload, runStarted=payload.get("status") == AckStatus.STARTED)


@method("sessions.patch", scope=Scope.WRITE)
async def sessions_patch(conn: Conn, params: dict[str, Any]) -> Reply:
    """Label and settings (docs/protocol-notes.md, "Session settings"), answered in OpenClaw's shape."""
    patch = frames.parse_session_patch(params)
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
    row = await db_read(_row, session.pk)
    return Reply(wire.patch_result(row) if row is not None else wire.session_answer(None))


@method("sessions.reset", scope=Scope.WRITE)
async def sessions_reset(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = frames.named_session(params)  # OpenClaw's clients send `{key, agentId?}`
    session, _killed = await call(sessions.reset_session, owner_id=conn.state.user_id, key=key)
    return Reply(wire.session_answer(await db_read(_row, session.pk)))


@method("sessions.delete", scope=Scope.WRITE)
async def sessions_delete(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = frames.session_key_param(params)
    await call(sessions.delete_session, owner_id=conn.state.user_id, key=key)
    return Reply({"deleted": True, "sessionKey": key})
