"""What the gateway says about its state: session rows, chat events, acks, history.

Every payload here is made of JSON-safe primitives (channels-redis' msgpack rejects
UUIDs and datetimes), so anything returned can go straight through a channel layer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sessions_app import gateway_reads, statements
from sessions_app.lifecycle.runs import SendOutcome
from sessions_app.models import OPEN_STATES, ChatSession, Message, Run, RunState, SessionStatus, ToolApproval, ToolCall


class AckStatus(StrEnum):
    """`chat.send` ack statuses (§4): a live run, or one that is already over."""

    STARTED = "started"
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"
    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


LIVE_ACKS = (AckStatus.STARTED, AckStatus.QUEUED, AckStatus.IN_FLIGHT)
TERMINAL_ACKS = (AckStatus.OK, AckStatus.TIMEOUT, AckStatus.ERROR)


class ChatState(StrEnum):
    """`chat` event states (§5)."""

    STATUS = "status"
    DELTA = "delta"
    FINAL = "final"
    ABORTED = "aborted"
    ERROR = "error"


TERMINAL_CHAT_STATES = (ChatState.FINAL, ChatState.ABORTED, ChatState.ERROR)

# the ack a repeated key gets for its run's stored state (§4)
_REPLAY_ACK = {
    RunState.DONE: AckStatus.OK,
    RunState.KILLED: AckStatus.TIMEOUT,
    RunState.TIMEOUT: AckStatus.TIMEOUT,
    RunState.FAILED: AckStatus.ERROR,
}


# The stopReason of a run that ended without storing one: the one definition every surface
# (chat event, ack, `agent` answer and events) takes its default from.
_DEFAULT_STOP_REASON: dict[str, str] = {
    RunState.DONE: "stop",
    RunState.KILLED: "rpc",
    RunState.TIMEOUT: "timeout",
}


def default_stop_reason(state: str) -> str:
    """The stopReason a `done`, `killed` or `timeout` run gets when it stored none."""
    return _DEFAULT_STOP_REASON[state]


def default_error_kind(state: str) -> str:
    """The errorKind a `failed` or `timeout` run gets when it stored none."""
    return "timeout" if state == RunState.TIMEOUT else "unknown"


@dataclass(frozen=True)
class RunOutcome:
    """How a terminal run ended, as every surface states it."""

    state: RunState
    stop_reason: str | None  # done, killed, timeout; None for failed
    error_kind: str | None  # failed, timeout; None otherwise
    error_message: str  # as stored: "" when the run stored none

    @property
    def error_text(self) -> str:
        """The error message, or `run <state>` when there is none (acks and the `agent` answer)."""
        return self.error_message or f"run {self.state}"


def outcome(run: Run) -> RunOutcome:
    """The outcome of a terminal run, with the protocol's defaults filled in."""
    state = RunState(run.state)
    if state not in _DEFAULT_STOP_REASON and state != RunState.FAILED:
        raise ValueError(f"run {run.run_id} has not ended ({state})")
    stop = (run.stop_reason or default_stop_reason(state)) if state in _DEFAULT_STOP_REASON else None
    failed = state in (RunState.FAILED, RunState.TIMEOUT)
    return RunOutcome(
        state=state,
        stop_reason=stop,
        error_kind=(run.error_kind or default_error_kind(state)) if failed else None,
        error_message=run.error_message or "",
    )


def duration_ms(run: Run) -> int | None:
    """A run's `durationMs`: from dispatch (when it left the queue) to its end; None until both are known."""
    # started_at is only a fallback for a row without a dispatch time (the lifecycle always
    # writes dispatched_at first), kept so no stored run loses its duration
    start = run.dispatched_at or run.started_at
    if start is None or run.ended_at is None:
        return None
    return max(0, int((run.ended_at - start).total_seconds() * 1000))


def ms(value: datetime | None) -> int | None:
    """Epoch milliseconds (the protocol's time format), or None."""
    return None if value is None else int(value.timestamp() * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


def agent_id_of(session_key: str) -> str:
    """The agent of a canonical key `agent:<agentId>:<name>`."""
    return session_key.split(":", 2)[1]


# --- session rows (§7) ----------------------------------------------------------------------------


def session_row(session: ChatSession, queued: Sequence[str]) -> dict[str, Any]:
    """The row of a session read with its runs (`gateway_reads.sessions_with_runs`)."""
    # `running`, `hasActiveRun` and `activeRunIds` all come from the one active-run slot,
    # read in the same statement as the row: they can never contradict each other.
    active = statements.run_id_of(session, "active_run")
    running = active is not None
    started = session.started_at
    ended = None if running else session.ended_at
    runtime = None
    if not running and started is not None and ended is not None:
        runtime = max(0, int((ended - started).total_seconds() * 1000))
    last = statements.run_id_of(session, "last_run")
    return {
        "key": session.key,
        "sessionId": str(session.session_id),
        "agentId": session.agent_id,
        "label": session.label,
        "kind": "direct",
        "status": SessionStatus.RUNNING.value
        if running
        else (None if session.status == SessionStatus.RUNNING else session.status),
        "hasActiveRun": running,
        "activeRunIds": [active] if active is not None else [],
        "queuedRunIds": list(queued),
        "lastRunId": last,
        "startedAt": ms(started),
        "endedAt": ms(ended),
        "runtimeMs": runtime,
        "abortedLastRun": session.aborted_last_run,
        "lastRunError": session.last_run_error or None,
        # TOOLS.md §13.2: "approval" while an approval of its run waits for a decision
        "waitingFor": (session.waiting_for or None) if running else None,
        "version": session.version,
        "createdAt": ms(session.created_at),
        "updatedAt": ms(session.updated_at),
    }


def session_rows(sessions: Sequence[ChatSession]) -> list[dict[str, Any]]:
    """Rows for many sessions (read with their runs) with one more query, whatever their number."""
    # one session (the common case) is one compiled statement; a page is one query
    queued = statements.queued_run_ids([s.pk for s in sessions])
    return [session_row(s, queued.get(s.pk, ())) for s in sessions]


def row_of(session_pk: int) -> dict[str, Any] | None:
    """The row of one session as stored now, or None when it is gone."""
    session = gateway_reads.session_by_pk(session_pk)
    return session_rows([session])[0] if session is not None else None


def row_event(row: dict[str, Any], reason: str, run_id: str | None = None) -> dict[str, Any]:
    """A `sessions.changed` payload."""
    payload: dict[str, Any] = {"sessionKey": row["key"], "reason": reason, "ts": now_ms(), "session": row}
    if run_id:
        payload["runId"] = run_id
    return payload


# --- chat events (§5) -----------------------------------------------------------------------------


def run_details(run: Run) -> dict[str, Any]:
    """Not in the spec: a finished run's `durationMs` and `usage`, when known."""
    details: dict[str, Any] = {}
    duration = duration_ms(run)
    if duration is not None:
        details["durationMs"] = duration
    usage = {
        name: value
        for name, value in (("promptTokens", run.prompt_tokens), ("completionTokens", run.completion_tokens))
        if value is not None
    }
    if usage:
        details["usage"] = usage
    return details


def assistant_message(text: str, timestamp: int | None) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "timestamp": timestamp}


def chat_payload(run: Run, session_key: str) -> dict[str, Any]:
    """The `chat` event for the run's current state (status phase or terminal), at `run.stream_seq`."""
    base: dict[str, Any] = {
        "runId": run.run_id,
        "sessionKey": session_key,
        "sessionId": str(run.session_generation),
        "seq": run.stream_seq,
    }
    state = run.state
    if state in OPEN_STATES:
        return {**base, "state": ChatState.STATUS.value, "phase": state}
    end = outcome(run)
    if state == RunState.DONE:
        return {
            **base,
            "state": ChatState.FINAL.value,
            "stopReason": end.stop_reason,
            "message": assistant_message(run.reply, ms(run.ended_at)),
            **run_details(run),
        }
    if state == RunState.KILLED:
        payload = {**base, "state": ChatState.ABORTED.value, "stopReason": end.stop_reason, **run_details(run)}
    else:
        payload = {
            **base,
            "state": ChatState.ERROR.value,
            "errorKind": end.error_kind,
            # the bare state, not `error_text`: this is what chat events have always said
            "errorMessage": end.error_message or state,
            **run_details(run),
        }
    if run.reply:
        payload["message"] = assistant_message(run.reply, ms(run.ended_at))
    return payload


def delta_payload(
    run_id: str, session_key: str, session_id: str, seq: int, delta: str, text: str, ts: int
) -> dict[str, Any]:
    return {
        "runId": run_id,
        "sessionKey": session_key,
        "sessionId": session_id,
        "seq": seq,
        "state": ChatState.DELTA.value,
        "deltaText": delta,
        "message": assistant_message(text, ts),
    }


# --- acks (§4) ------------------------------------------------------------------------------------


def replay_ack(run: Run) -> AckStatus:
    """The ack status a repeated key gets for `run`: `in_flight` while open, else its outcome."""
    if run.state in OPEN_STATES:
        return AckStatus.IN_FLIGHT
    return _REPLAY_ACK[RunState(run.state)]


def ack_status(outcome: SendOutcome) -> AckStatus:
    """The ack status of an admission that produced a run (not a conflict or a full queue)."""
    if outcome.admission == "existing":
        assert outcome.run is not None
        return replay_ack(outcome.run)
    if outcome.admission == "rejected":
        return AckStatus.ERROR
    return AckStatus(outcome.admission)


def ack_payload(run: Run | None, status: AckStatus, session_key: str, session_id: str, **extra: Any) -> dict[str, Any]:
    """The chat.send acknowledgement for `status` (§4)."""
    payload: dict[str, Any] = {
        "runId": run.run_id if run else extra.pop("runId", None),
        "status": status.value,
        "sessionKey": session_key,
        "sessionId": session_id,
    }
    if run is not None and status in TERMINAL_ACKS:
        # a terminal status is the replay ack of the run's own terminal state (`_REPLAY_ACK`)
        end = outcome(run)
        if status == AckStatus.OK:
            payload["reply"] = run.reply
            payload["stopReason"] = end.stop_reason
        elif status == AckStatus.TIMEOUT:
            payload["stopReason"] = end.stop_reason
            if end.error_message:
                payload["summary"] = end.error_message
        else:
            payload["summary"] = end.error_text
            payload["errorKind"] = end.error_kind
    payload.update({k: v for k, v in extra.items() if v is not None})
    return payload


# --- history and lists ----------------------------------------------------------------------------


def message_items(msg: Message, runs: dict[int, Run], tools: dict[int, list[ToolCall]]) -> list[dict[str, Any]]:
    """A transcript message; an assistant reply with tool calls also gets its `toolResult` messages (§13.4)."""
    calls = tools.get(msg.run_id, []) if msg.run_id is not None and msg.role == "assistant" else []
    item = message_item(msg, runs, calls)
    return [item, *(tool_result_message(c, item) for c in calls)]


def assistant_content(text: str, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """The reply's text blocks with its calls' `toolCall` blocks where they came in the text."""
    content: list[dict[str, Any]] = []
    at = 0
    for call in calls:
        cut = min(max(call.reply_offset, at), len(text))
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
        "timestamp": ms(call.ended_at) or reply["timestamp"],
        **({"runId": reply["runId"]} if "runId" in reply else {}),
    }


def message_item(msg: Message, runs: dict[int, Run], calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": str(msg.pk),
        "role": msg.role,
        "content": assistant_content(msg.text, calls) if calls else [{"type": "text", "text": msg.text}],
        "timestamp": ms(msg.created_at),
    }
    run = runs.get(msg.run_id) if msg.run_id is not None else None
    if run is not None:
        item["runId"] = run.run_id
    if msg.aborted:
        item["aborted"] = True
    if run is not None and msg.role == "assistant" and run.is_terminal:
        item.update(run_details(run))
    return item


def history(session: ChatSession, transcript: gateway_reads.Transcript) -> dict[str, Any]:
    """`chat.history` of the session's current generation, oldest first."""
    payload: dict[str, Any] = {
        "sessionKey": session.key,
        "sessionId": str(session.session_id),
        "messages": [item for m in transcript.messages for item in message_items(m, transcript.runs, transcript.tools)],
        "hasMore": transcript.has_more,
        "session": session_row(session, [r.run_id for r in transcript.queued]),
    }
    active = transcript.active
    if active is not None:
        payload["inFlightRun"] = {"runId": active.run_id, "seq": active.stream_seq, "text": active.reply}
        if active.pk in transcript.tools:
            payload["inFlightRun"]["tools"] = [tool_item(c) for c in transcript.tools[active.pk]]
    # Not in the spec: the queued messages themselves, so a reloaded page can show them.
    payload["queuedRuns"] = [
        {"runId": r.run_id, "text": r.message, "position": i + 1} for i, r in enumerate(transcript.queued)
    ]
    return payload


def agents(configured: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The agents a client may choose: id, display name, model, backend (nothing else of their config)."""
    return [
        {
            "id": agent_id,
            "name": str(config.get("name") or agent_id),
            "model": str(config.get("model") or ""),
            "backend": str(config.get("backend") or ""),
        }
        for agent_id, config in configured.items()
    ]


def session_list(page: gateway_reads.SessionPage, offset: int) -> dict[str, Any]:
    rows = session_rows(page.sessions)
    has_more = offset + len(rows) < page.total
    return {
        "ts": now_ms(),
        "count": len(rows),
        "totalCount": page.total,
        "hasMore": has_more,
        "nextOffset": offset + len(rows) if has_more else None,
        "sessions": rows,
    }


# --- tools (TOOLS.md §13) -------------------------------------------------------------------------


def tool_args(call: ToolCall) -> Any:
    """A call's arguments as the model sent them: the object, or the text when it is not valid JSON."""
    try:
        return json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return call.arguments


def tool_content(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def tool_start_data(call: ToolCall) -> dict[str, Any]:
    return {"phase": "start", "name": call.name, "toolCallId": call.call_id, "args": tool_args(call)}


def tool_result_data(call: ToolCall) -> dict[str, Any]:
    data: dict[str, Any] = {
        "phase": "result",
        "name": call.name,
        "toolCallId": call.call_id,
        "isError": call.is_error,
        "status": call.state,
        "result": {"content": tool_content(call.result)},
    }
    if call.duration_ms is not None:
        data["meta"] = {"durationMs": call.duration_ms}
    return data


def agent_event(run: Run, session_key: str, seq: int, stream: str, data: dict[str, Any]) -> dict[str, Any]:
    """An `agent` event payload (§12.3) of a stream other than the ones derived from `chat` events."""
    return {
        "runId": run.run_id,
        "sessionKey": session_key,
        "sessionId": str(run.session_generation),
        "agentId": agent_id_of(session_key),
        "stream": stream,
        "data": data,
        "seq": seq,
        "ts": now_ms(),
    }


def approval_data(approval: ToolApproval, call: ToolCall) -> dict[str, Any]:
    """The `agent` stream `approval` data of an approval's request or resolution."""
    return {
        "phase": "resolved" if approval.decision else "requested",
        "approvalId": approval.approval_id,
        "toolCallId": call.call_id,
        "status": approval.decision or "pending",
    }


def approval_request(approval: ToolApproval, call: ToolCall, run: Run, session_key: str) -> dict[str, Any]:
    """A `plugin.approval.requested` payload (and an item of `plugin.approval.list`)."""
    args = call.arguments if len(call.arguments) <= 2000 else call.arguments[:2000] + "…"
    return {
        "id": approval.approval_id,
        "request": {
            "title": f"Run {call.name}?",
            "description": f"The agent wants to call {call.name} with {args or '{}'}",
            "severity": "warning",
            "toolName": call.name,
            "toolCallId": call.call_id,
            "mcpTool": {"server": call.server, "tool": call.tool},
            "allowedDecisions": ["allow-once", "deny"],
            "agentId": agent_id_of(session_key),
            "sessionKey": session_key,
            "runId": run.run_id,
        },
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }


def approval_resolved(approval: ToolApproval, call: ToolCall, run: Run, session_key: str) -> dict[str, Any]:
    """A `plugin.approval.resolved` payload (and `plugin.approval.resolve`'s answer)."""
    return {
        "id": approval.approval_id,
        "decision": approval.decision,
        "resolvedBy": approval.decided_by,
        "ts": ms(approval.resolved_at),
        "request": approval_request(approval, call, run, session_key)["request"],
    }


def tool_item(call: ToolCall) -> dict[str, Any]:
    """One call of a run still open (`inFlightRun.tools`)."""
    item: dict[str, Any] = {
        "toolCallId": call.call_id,
        "name": call.name,
        "args": tool_args(call),
        "status": call.state,
    }
    if call.is_terminal:
        item["isError"] = call.is_error
        item["result"] = {"content": tool_content(call.result)}
    return item
