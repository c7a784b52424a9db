"""The `agent` method (PROTOCOL.md §12): a `chat.send` that answers twice; and `agent.wait`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from chat.base import agents as catalog
from chat.base.db import db_read
from chat.delivery import agent_events
from chat.methods.commands import command
from chat.methods.registry import Conn, Reply, check_held, method
from chat.methods.send.admission import admit, refuse_unadmitted
from chat.methods.send.params import ChatSendParams, parse_chat_send
from chat.protocol import frames, keys, run_events
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.fields import MAX_WAIT_MS, RUN_ID_RE, get_int, get_str
from chat.protocol.frames import ms
from chat.protocol.keys import agent_session, named_session
from chat.protocol.run_events import run_details, run_end
from chat.protocol.scopes import Scope
from chat.runtime.gateway import runtime
from sessions_app import gateway_reads
from sessions_app.models import (
    Run,
    RunState,
)


def parse_agent(params: dict[str, Any]) -> ChatSendParams:
    """Validate `agent` params as the `chat.send` they stand for: same checks, same admission.

    `sessionKey` (or `key`) is optional: without it the run goes to the agent's main session.
    `timeout` is in seconds (OpenClaw's unit). A bare key plus `agentId` means
    `agent:<agentId>:<key>`, as in `sessions.create`.
    """
    key, _agent = agent_session(params, default_name="main")
    assert key is not None
    timeout = params.get("timeout")
    timeout_ms: int | None = None
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 3600:
            raise invalid("timeout must be a number of seconds between 1 and 3600", field="timeout")
        timeout_ms = int(timeout * 1000)
    mapped: dict[str, Any] = {
        "sessionKey": key,
        "message": params.get("message"),
        "idempotencyKey": params.get("idempotencyKey"),
        "attachments": params.get("attachments"),
        "timeoutMs": timeout_ms,
        "queueMode": params.get("queueMode"),
    }
    return parse_chat_send({k: v for k, v in mapped.items() if v is not None})


DEFAULT_AGENT_WAIT_MS = 30_000


@dataclass
class AgentWaitParams:
    """`agent.wait {runId, timeoutMs?}`; an optional session key narrows a runId used in several."""

    run_id: str
    timeout_ms: int
    key: str | None


def parse_agent_wait(params: dict[str, Any]) -> AgentWaitParams:
    run_id = get_str(params, "runId", max_len=128, pattern=RUN_ID_RE)
    assert run_id is not None
    timeout_ms = get_int(params, "timeoutMs", lo=0, hi=MAX_WAIT_MS, default=DEFAULT_AGENT_WAIT_MS)
    key = None
    if params.get("sessionKey") is not None or params.get("key") is not None:
        key, _agent = named_session(params)
    return AgentWaitParams(run_id, DEFAULT_AGENT_WAIT_MS if timeout_ms is None else timeout_ms, key)


# How long the final answer waits for the run's terminal events to reach this connection
# through the layer (they come first, so a client reads the whole reply before its answer);
# after that the connection sends them from the stored run itself, as repair would.
DELIVERY_GRACE_SECONDS = 1.0


@method("agent", scope=Scope.WRITE)
async def agent_call(conn: Conn, params: dict[str, Any]) -> Reply:
    send = parse_agent(params)
    if send.command is not None:
        return await command(conn, send)  # no run: the command's one answer (§4)
    check_held(conn, "idempotencyKey")
    admitted = await admit(conn.state.user_id, send)
    refuse_unadmitted(admitted)
    run, session = admitted.run, admitted.session
    assert run is not None
    key, session_id = session.key, str(run.session_generation)
    if run.is_terminal:
        # A setup failure, or a finished key replayed: the final answer alone.
        conn.state.track_run(run.pk, terminal=True, run_id=run.run_id, session_key=key, session_id=session_id)
        payload, error = final_answer(run, run.run_id, key)
        return Reply(payload, error)
    conn.state.track_run(run.pk, terminal=False, run_id=run.run_id, session_key=key, session_id=session_id)
    accepted = accepted_payload(run, key, str(session.session_id), admitted.queue_position)
    return Reply(accepted, wait=lambda: _final(conn, run, key))


async def _final(conn: Conn, run: Run, key: str) -> Reply:
    """The second answer: the run's outcome, sent after this connection has its terminal events."""
    ended = await _wait_end(run)
    if ended is None:
        # Gone with its deleted session: that ended it (aborted, stopReason delete).
        conn.state.track_run(
            run.pk, terminal=True, run_id=run.run_id, session_key=key, session_id=str(run.session_generation)
        )
    elif not ended.is_terminal:
        return Reply(
            {"runId": run.run_id, "status": "in_flight", "sessionKey": key},
            {
                "code": "UNAVAILABLE",
                "message": "the run did not end within its timeout",
                "details": {"runId": run.run_id},
                "retryable": True,
            },
        )
    else:
        await _deliver_terminal(conn, ended, key)
    payload, error = final_answer(ended, run.run_id, key)
    return Reply(payload, error)


async def _wait_end(run: Run) -> Run | None:
    """The run once it has ended (None if deleted), or as it is when its budget is long past."""
    margin = settings.GATEWAY_RECOVERY_SECONDS + 5  # a dead owner's runs are ended by the sweep
    budget = run.timeout_ms / 1000 + margin
    wait_for = budget
    while True:
        current = await runtime.executor.wait_terminal(run.pk, wait_for)
        if current is None or current.is_terminal:
            return current
        if current.state == RunState.QUEUED or current.dispatched_at is None:
            wait_for = budget  # its budget starts when it leaves the queue
            continue
        wait_for = budget - (timezone.now() - current.dispatched_at).total_seconds()
        if wait_for <= 0:
            return current


async def _deliver_terminal(conn: Conn, run: Run, key: str) -> None:
    """Make sure this connection has sent the run's terminal `chat` and `agent` events."""
    deadline = time.monotonic() + DELIVERY_GRACE_SECONDS
    while time.monotonic() < deadline:
        view = conn.state.runs.get(run.pk)
        # admit and send happen without a suspension point in between, so a run closed here
        # has had its terminal events sent already
        if view is not None and view.terminal:
            return
        await asyncio.sleep(0.01)
    payload = run_events.chat_payload(run, key)
    if conn.state.admit_chat(run.pk, payload):
        await conn.send_events(conn.state.follow(run.pk, payload, agent_events.run_facts(run)))


def accepted_payload(run: Run, session_key: str, session_id: str, queue_position: int | None) -> dict[str, Any]:
    """The first answer: the run is admitted (started, queued, or already open under this key)."""
    payload: dict[str, Any] = {
        "runId": run.run_id,
        "sessionKey": session_key,
        "sessionId": session_id,
        "agentId": keys.agent_id_of(session_key),
        "status": "accepted",
        "acceptedAt": frames.now_ms(),
    }
    if run.state == RunState.QUEUED and queue_position is not None:
        payload["queuePosition"] = queue_position
    return payload


def final_answer(run: Run | None, run_id: str, session_key: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The final answer of an ended run: (payload, None) when it completed, else (payload, error).

    `run` None: the run went with its deleted session, which aborted it (stopReason `delete`).
    """
    if run is not None and run.state == RunState.DONE:
        agent = catalog.of(keys.agent_id_of(session_key)).config
        inp, outp = run.prompt_tokens, run.completion_tokens
        total = inp + outp if inp is not None and outp is not None else None
        return {
            "runId": run.run_id,
            "status": "ok",
            "summary": "completed",
            "sessionKey": session_key,
            "result": {
                "payloads": [{"text": run.reply, "mediaUrl": None}] if run.reply else [],
                "meta": {
                    "durationMs": run_events.duration_ms(run),
                    "agentMeta": {
                        "sessionId": str(run.session_generation),
                        "provider": agent.get("backend"),
                        "model": agent.get("model"),
                        "usage": {"input": inp, "output": outp, "total": total},
                    },
                },
            },
        }, None
    details: dict[str, Any] = {"runId": run_id}
    end = run_events.run_end(run) if run is not None else None
    if end is None or end.state == RunState.KILLED:
        reason = end.stop_reason if end is not None else "delete"
        status, message = "aborted", f"run aborted (stopReason {reason})"
        details["stopReason"] = reason
    else:
        status = "timeout" if end.state == RunState.TIMEOUT else "error"
        message = end.error_text
        details["errorKind"] = end.error_kind
        if end.state == RunState.TIMEOUT:
            details["stopReason"] = end.stop_reason
    payload = {"runId": run_id, "status": status, "summary": message, "sessionKey": session_key}
    return payload, {"code": "UNAVAILABLE", "message": message, "details": details}


def wait_result(run: Run | None, run_id: str, session_key: str) -> dict[str, Any]:
    """`agent.wait`'s answer: the run's real outcome, or `pending` while it is still open.

    OpenClaw's words: `ok` (done), `error` (failed, or aborted: `aborted: true` and the
    `stopReason`), `timeout` (ran out of time), each with `endedAt`; `pending` (with `phase`) when
    the wait ended first. Its clients read any other status as `ok`, so no other word is used.
    `run` None: the run went with its deleted session, which aborted it (stopReason `delete`).
    """
    base: dict[str, Any] = {"runId": run_id, "sessionKey": session_key}
    if run is None:
        return {
            **base,
            "status": "error",
            "aborted": True,
            "stopReason": "delete",
            "error": "run aborted (stopReason delete)",
        }
    base["sessionId"] = str(run.session_generation)
    started = ms(run.dispatched_at or run.started_at)
    if started is not None:
        base["startedAt"] = started
    if not run.is_terminal:
        phase = "queued" if run.state == RunState.QUEUED else "running"
        return {**base, "status": "pending", "phase": phase, **({"timeoutPhase": "queue"} if phase == "queued" else {})}
    end = run_end(run)
    base["endedAt"] = ms(run.ended_at)
    base.update(run_details(run))
    # OpenClaw's record of what the run replied (the text so far, for one that did not complete)
    base["terminalReply"] = {"disposition": "visible", "text": run.reply} if run.reply else {"disposition": "empty"}
    if end.state == RunState.DONE:
        return {**base, "status": "ok", "stopReason": end.stop_reason}
    if end.state == RunState.KILLED:
        message = f"run aborted (stopReason {end.stop_reason})"
        return {**base, "status": "error", "aborted": True, "stopReason": end.stop_reason, "error": message}
    status = "timeout" if end.state == RunState.TIMEOUT else "error"
    result = {**base, "status": status, "error": end.error_text, "errorKind": end.error_kind}
    if end.stop_reason is not None:
        result["stopReason"] = end.stop_reason
    return result


@method("agent.wait", scope=Scope.WRITE)
async def agent_wait(conn: Conn, params: dict[str, Any]) -> Reply:
    """Wait up to `timeoutMs` for a run of the caller's to end; answer its real outcome (`pending`
    when it is still open). The wait is held like a `waitMs` ack: other requests go on meanwhile."""
    p = parse_agent_wait(params)
    run = await db_read(gateway_reads.find_run_of_owner, conn.state.user_id, p.run_id, p.key)
    if run is None:
        raise ProtocolError("NOT_FOUND", "agent run was not found", field="runId")
    key = run.session.key
    if run.is_terminal or p.timeout_ms == 0:
        return Reply(wait_result(run, p.run_id, key))
    check_held(conn, "runId")
    return Reply(wait=lambda: _waited(run, p, key))


async def _waited(run: Run, p: AgentWaitParams, key: str) -> Reply:
    current = await runtime.executor.wait_terminal(run.pk, p.timeout_ms / 1000)
    return Reply(wait_result(current, p.run_id, key))
