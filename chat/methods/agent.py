"""The `agent` method (PROTOCOL.md §12): a `chat.send` that answers twice.

It validates into the same `ChatSendParams` and admits through the same
`methods.admit` (`runs.admit_send`) as `chat.send`: one lifecycle underneath. The
first answer says the run is admitted; the second, under the same request id, is held
like a `waitMs` ack until the run ends. The wait is not bounded by `waitMs`: it lasts
as long as the run may (its own budget, counted from when it leaves the queue, plus a
margin for the end to be recorded). A closed connection cancels the wait, never the run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from chat.delivery import agent_events
from chat.methods.handlers import Conn, Reply, admit, check_held, command, method, refuse_unadmitted
from chat.protocol import frames, wire
from chat.protocol.frames import Scope
from chat.runtime.gateway import runtime
from sessions_app.models import Run, RunState

# How long the final answer waits for the run's terminal events to reach this connection
# through the layer (they come first, so a client reads the whole reply before its answer);
# after that the connection sends them from the stored run itself, as repair would.
DELIVERY_GRACE_SECONDS = 1.0


@method("agent", scope=Scope.WRITE)
async def agent_call(conn: Conn, params: dict[str, Any]) -> Reply:
    send = frames.parse_agent(params)
    if send.command is not None:
        return await command(conn, send)  # no run: the command's one answer (§4)
    check_held(conn, "idempotencyKey")
    outcome = await admit(conn, send)
    refuse_unadmitted(outcome)
    run, session = outcome.run, outcome.session
    assert run is not None
    key, session_id = session.key, str(run.session_generation)
    if run.is_terminal:
        # A setup failure, or a finished key replayed: the final answer alone.
        conn.state.track_run(run.pk, terminal=True, run_id=run.run_id, session_key=key, session_id=session_id)
        payload, error = final_answer(run, run.run_id, key)
        return Reply(payload, error)
    conn.state.track_run(run.pk, terminal=False, run_id=run.run_id, session_key=key, session_id=session_id)
    accepted = accepted_payload(run, key, str(session.session_id), outcome.queue_position)
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
    payload = wire.chat_payload(run, key)
    if conn.state.admit_chat(run.pk, payload):
        await conn.send_events(conn.state.follow(run.pk, payload, agent_events.run_facts(run)))


# --- the two answers (§12.2) ---------------------------------------------------------------------


def accepted_payload(run: Run, session_key: str, session_id: str, queue_position: int | None) -> dict[str, Any]:
    """The first answer: the run is admitted (started, queued, or already open under this key)."""
    payload: dict[str, Any] = {
        "runId": run.run_id,
        "sessionKey": session_key,
        "sessionId": session_id,
        "agentId": wire.agent_id_of(session_key),
        "status": "accepted",
        "acceptedAt": wire.now_ms(),
    }
    if run.state == RunState.QUEUED and queue_position is not None:
        payload["queuePosition"] = queue_position
    return payload


def final_answer(run: Run | None, run_id: str, session_key: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The final answer of an ended run: (payload, None) when it completed, else (payload, error).

    `run` None: the run went with its deleted session, which aborted it (stopReason `delete`).
    """
    if run is not None and run.state == RunState.DONE:
        agent = settings.GATEWAY_AGENTS.get(wire.agent_id_of(session_key), {})
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
                    "durationMs": wire.duration_ms(run),
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
    end = wire.outcome(run) if run is not None else None
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
