"""`chat.send`, `sessions.steer` and `chat.abort`: admit, ack, hold the ack (`waitMs`), abort."""

from __future__ import annotations

import asyncio
from typing import Any

from chat.base.db import db_read
from chat.methods.commands import command
from chat.methods.registry import Conn, Reply, call, check_held, method
from chat.methods.send import acks as send_acks
from chat.methods.send import params as send_params
from chat.methods.send.acks import AckStatus
from chat.methods.send.admission import admit, budget_error, refuse_unadmitted
from chat.protocol import fields, keys
from chat.protocol.scopes import Scope
from chat.runtime.gateway import runtime
from sessions_app import gateway_reads
from sessions_app.lifecycle import sessions
from sessions_app.lifecycle.runs import SendOutcome
from sessions_app.models import RunState


def _ack_reply(conn: Conn, admitted: SendOutcome, status: AckStatus | None = None) -> Reply:
    """The ack of an admission (or, for a held ack, of the run as it is now)."""
    refuse_unadmitted(admitted)
    session, run = admitted.session, admitted.run
    assert run is not None
    status = status or send_acks.ack_status(admitted)
    if admitted.steered_into is not None:
        return _steered_reply(conn, admitted)
    conn.state.track_run(
        run.pk,
        terminal=status in send_acks.TERMINAL_ACKS,
        run_id=run.run_id,
        session_key=session.key,
        session_id=str(run.session_generation),
    )
    payload = send_acks.ack_payload(
        run,
        status,
        session.key,
        str(session.session_id),
        queuePosition=admitted.queue_position if status in (AckStatus.QUEUED, AckStatus.IN_FLIGHT) else None,
        interruptedActiveRun=True if admitted.interrupted_active_run else None,
    )
    if status == AckStatus.ERROR:
        return Reply(payload, {"code": "UNAVAILABLE", "message": payload.get("summary", "run failed")})
    return Reply(payload)


def _steered_reply(conn: Conn, admitted: SendOutcome) -> Reply:
    """The ack of a steer the active run is to take: `started` with that run's id and `steered: true`,
    and the steer's own id (`steerRunId`: what `chat.abort` withdraws it by while it waits). This
    connection follows both: the run, and the steer should it become a follow-up."""
    session, steer, active = admitted.session, admitted.run, admitted.steered_into
    assert steer is not None and active is not None
    for run in (active, steer):
        conn.state.track_run(
            run.pk, terminal=False, run_id=run.run_id, session_key=session.key, session_id=str(run.session_generation)
        )
    return Reply(
        send_acks.ack_payload(
            active, AckStatus.STARTED, session.key, str(session.session_id), steered=True, steerRunId=steer.run_id
        )
    )


async def _send(conn: Conn, params: dict[str, Any], *, steer: bool) -> Reply:
    if params.get("attachments"):
        # inline files are decoded and read here (a PDF's text, an image's header): off the event
        # loop, which every connection of the process shares
        send = await asyncio.to_thread(send_params.parse_chat_send, params)
    else:
        send = send_params.parse_chat_send(params)
    if steer:
        send.queue_mode, send.steer = "steer", True
    if send.command is not None:
        return await command(conn, send, announce=True)
    if send.wait_ms > 0:
        check_held(conn, "waitMs")
    admitted = await admit(conn.state.user_id, send)
    if admitted.admission == "budget":
        return _budget_reply(admitted, send.run_id)
    reply = _ack_reply(conn, admitted)
    if (
        send.wait_ms > 0
        and admitted.run is not None
        and admitted.steered_into is None  # a steer's ack is not held: its run is another's
        and send_acks.ack_status(admitted) in send_acks.LIVE_ACKS
    ):
        return Reply(wait=lambda: _held_ack(conn, admitted, send))
    return reply


def _budget_reply(admitted: SendOutcome, run_id: str) -> Reply:
    """The `error` ack of a send a budget refused: nothing admitted, the budget named with its reset."""
    error = budget_error(admitted)
    session = admitted.session
    payload = {
        "runId": run_id,
        "status": AckStatus.ERROR.value,
        "sessionKey": session.key,
        "errorKind": "budget",
        "summary": error.message,
        "budget": error.details["budget"],
        "resetsAt": error.details["resetsAt"],
    }
    if session.pk is not None:
        payload["sessionId"] = str(session.session_id)
    return Reply(payload, error.to_error())


async def _held_ack(conn: Conn, admitted: SendOutcome, send: send_params.ChatSendParams) -> Reply:
    """The ack of a send with `waitMs`: the run's outcome once it ends, or its live state at the deadline."""
    assert admitted.run is not None
    first = send_acks.ack_status(admitted)
    session = admitted.session
    run = await runtime.executor.wait_terminal(admitted.run.pk, send.wait_ms / 1000)
    if run is None:
        # Gone with its deleted session: that ended it (aborted, stopReason delete).
        conn.state.track_run(
            admitted.run.pk,
            terminal=True,
            run_id=send.run_id,
            session_key=session.key,
            session_id=str(session.session_id),
        )
        return Reply(
            send_acks.ack_payload(
                None, AckStatus.TIMEOUT, session.key, str(session.session_id), runId=send.run_id, stopReason="delete"
            )
        )
    # Rebuilt from the run as it is now: a terminal ack once it has ended, a fresh
    # queue position while it waits.
    status = send_acks.replay_ack(run)
    if status == AckStatus.IN_FLIGHT and first != AckStatus.IN_FLIGHT:
        status = AckStatus.QUEUED if run.state == RunState.QUEUED else AckStatus.STARTED
    position = await db_read(gateway_reads.queue_position, run) if status != AckStatus.STARTED else None
    return _ack_reply(conn, SendOutcome(admitted.admission, run, session, position), status)


@method("chat.send", scope=Scope.WRITE)
async def chat_send(conn: Conn, params: dict[str, Any]) -> Reply:
    return await _send(conn, params, steer=False)


@method("sessions.steer", scope=Scope.WRITE)
async def sessions_steer(conn: Conn, params: dict[str, Any]) -> Reply:
    # The chat.send ack, unchanged: a terminal status stays terminal (§7).
    return await _send(conn, params, steer=True)


@method("chat.abort", scope=Scope.WRITE)
async def chat_abort(conn: Conn, params: dict[str, Any]) -> Reply:
    key, _agent = keys.session_key_param(params)
    run_id = fields.get_str(params, "runId", required=False, max_len=128, pattern=fields.RUN_ID_RE)
    admitted = await call(
        sessions.abort, owner_id=conn.state.user_id, key=key, run_id=run_id, owner_process=runtime.owner_for_new_runs()
    )
    return Reply({"aborted": admitted.aborted, "runIds": admitted.run_ids})
