"""Run events (§5): the `chat` event of a run's state, its deltas, how a terminal run ended, and the
`agent` event frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chat.protocol.frames import ms, now_ms
from chat.protocol.keys import agent_id_of
from sessions_app.models import (
    OPEN_STATES,
    STEER,
    STEER_FOLLOWUP,
    CommandReceipt,
    Run,
    RunState,
)


class ChatState(StrEnum):
    """`chat` event states (§5)."""

    STATUS = "status"
    DELTA = "delta"
    FINAL = "final"
    ABORTED = "aborted"
    ERROR = "error"


TERMINAL_CHAT_STATES = (ChatState.FINAL, ChatState.ABORTED, ChatState.ERROR)
# OpenClaw's Control UI (its `client.id`) reads a `status` event's phase as one of OpenClaw's startup
# phases and fails to render any other: it is told `dispatching` in its words, and not the rest.
OPENCLAW_CONTROL_UI = "openclaw-control-ui"
OPENCLAW_STATUS_PHASES = {RunState.DISPATCHING.value: "starting_model"}
# a queued steer's `status` events say which it is: waiting for the active run, or a follow-up now
STEER_PHASES = {STEER: "pending", STEER_FOLLOWUP: "followup"}


def status_phases(client_id: str) -> dict[str, str] | None:
    """How a client is told `chat` status phases: None, as they are (§5); else only these, renamed."""
    return OPENCLAW_STATUS_PHASES if client_id == OPENCLAW_CONTROL_UI else None


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
class RunEnd:
    """How a terminal run ended, as every surface states it."""

    state: RunState
    stop_reason: str | None  # done, killed, timeout; None for failed
    error_kind: str | None  # failed, timeout; None otherwise
    error_message: str  # as stored: "" when the run stored none

    @property
    def error_text(self) -> str:
        """The error message, or `run <state>` when there is none (acks and the `agent` answer)."""
        return self.error_message or f"run {self.state}"


def run_end(run: Run) -> RunEnd:
    """The outcome of a terminal run, with the protocol's defaults filled in."""
    state = RunState(run.state)
    if state not in _DEFAULT_STOP_REASON and state != RunState.FAILED:
        raise ValueError(f"run {run.run_id} has not ended ({state})")
    stop = (run.stop_reason or default_stop_reason(state)) if state in _DEFAULT_STOP_REASON else None
    failed = state in (RunState.FAILED, RunState.TIMEOUT)
    return RunEnd(
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
        status = {**base, "state": ChatState.STATUS.value, "phase": state}
        if state == RunState.QUEUED and run.queue_mode in STEER_PHASES:
            status["steer"] = STEER_PHASES[run.queue_mode]  # docs/protocol-notes.md, "Steering"
        return status
    end = run_end(run)
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


def merged_delta(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive deltas of a run as one: the later one (its `seq`, its text so far), with the
    `deltaText` of both, so a client that appends deltas misses nothing (§5: deltas may be coalesced)."""
    return {**later, "deltaText": f"{earlier.get('deltaText', '')}{later.get('deltaText', '')}"}


def command_event_key(receipt_pk: int) -> int:
    """What stands for a run's pk for a command's `chat` `final` in a connection's filters (which
    key runs by pk: `ConnectionState.runs`): minus its receipt's pk, so it never meets a run's."""
    return -receipt_pk


def command_final(session_key: str, receipt: CommandReceipt) -> dict[str, Any]:
    """An inline command's answer as the `chat` `final` of its runId (seq 1: there is no run and no
    other event), the same for the sender (before its ack) and for the owner's other connections.
    The message is a run's final message marked `command`, as the stored answer is in history
    (OpenClaw's TUI shows it as a notice)."""
    return {
        "runId": receipt.key,
        "sessionKey": session_key,
        "sessionId": str(receipt.session_generation),
        "seq": 1,
        "state": ChatState.FINAL.value,
        "stopReason": "stop",
        "message": {**assistant_message(receipt.reply, ms(receipt.created_at)), "command": True},
    }


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
