"""What the gateway says about its state: session rows, chat events, acks, history.

Every payload here is made of JSON-safe primitives (channels-redis' msgpack rejects
UUIDs and datetimes), so anything returned can go straight through a channel layer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from chat.protocol import frames
from chat.runtime import catalog
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

# OpenClaw's Control UI (its `client.id`) reads a `status` event's phase as one of OpenClaw's startup
# phases and fails to render any other: it is told `dispatching` in its words, and not the rest.
OPENCLAW_CONTROL_UI = "openclaw-control-ui"
OPENCLAW_STATUS_PHASES = {RunState.DISPATCHING.value: "starting_model"}


def status_phases(client_id: str) -> dict[str, str] | None:
    """How a client is told `chat` status phases: None, as they are (§5); else only these, renamed."""
    return OPENCLAW_STATUS_PHASES if client_id == OPENCLAW_CONTROL_UI else None


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
        **session_settings(session),
        "version": session.version,
        "createdAt": ms(session.created_at),
        "updatedAt": ms(session.updated_at),
    }


def session_settings(session: ChatSession) -> dict[str, Any]:
    """The row's settings and token counts (docs/protocol-notes.md, "Session settings"), read from
    the row and the agent's configuration alone: no query, whatever the number of rows."""
    config = catalog.config_of(session.agent_id)
    inputs, outputs = session.input_tokens, session.output_tokens
    return {
        "thinkingLevel": session.thinking_level or None,
        "verboseLevel": session.verbose_level or None,
        # the model a run of this session would use now (an override the agent no longer lists is not)
        "model": catalog.session_model(config, session.model_override) or None,
        "modelProvider": catalog.provider_of(session.agent_id),
        "inputTokens": inputs,
        "outputTokens": outputs,
        "totalTokens": inputs + outputs if inputs is not None and outputs is not None else None,
        "contextTokens": catalog.context_tokens(config),
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


def session_answer(row: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """The answer of a method that creates or changes a session: the row as `session` (ours) and,
    as OpenClaw answers, `ok`, `key`, `sessionId` and the row again as `entry`."""
    answer: dict[str, Any] = {"ok": True, "session": row}
    if row is not None:
        answer.update({"key": row["key"], "sessionId": row["sessionId"], "entry": row})
    answer.update(extra)
    return answer


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


def message_items(
    msg: Message, runs: dict[int, Run], tools: dict[int, list[ToolCall]], seq: int | None = None
) -> list[dict[str, Any]]:
    """A transcript message; an assistant reply with tool calls also gets its `toolResult` messages (§13.4)."""
    calls = tools.get(msg.run_id, []) if msg.run_id is not None and msg.role == "assistant" else []
    item = message_item(msg, runs, calls, seq)
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
        "__openclaw": {"id": call.call_id, **({"runId": reply["runId"]} if "runId" in reply else {})},
    }


def message_item(
    msg: Message, runs: dict[int, Run], calls: Sequence[ToolCall] = (), seq: int | None = None
) -> dict[str, Any]:
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
            for item in message_items(m, transcript.runs, transcript.tools, transcript.first_seq + i)
        ],
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


# OpenClaw's session scope: each user has their own sessions (and their own `main`).
SESSION_SCOPE = "per-sender"
MAIN_KEY = "main"


def agent_entries(configured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The agents a client may choose: id, display name, model (OpenClaw's `{primary}`), backend.

    Nothing else of their config (keys, URLs) is sent.
    """
    return [
        {
            "id": agent_id,
            "name": str(config.get("name") or agent_id),
            "model": {"primary": catalog.default_model(config)} if catalog.default_model(config) else {},
            "backend": str(config.get("backend") or ""),
        }
        for agent_id, config in configured.items()
    ]


def agents_list(configured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`agents.list`: the agents, the default one, and how sessions are keyed (as OpenClaw says it)."""
    return {"agents": agent_entries(configured), "defaultId": "main", "mainKey": MAIN_KEY, "scope": SESSION_SCOPE}


def session_defaults(agent_id: str) -> dict[str, Any]:
    """What a new session of `agent_id` runs with (`sessions.list` and `chat.startup` `defaults`).

    `modelSelectionTarget` is always `session`: a model chosen in a client applies to its session,
    never to the gateway's configuration (which no client edits here).
    """
    config = catalog.config_of(agent_id)
    return {
        "agentId": agent_id,
        "modelProvider": catalog.provider_of(agent_id),
        "model": catalog.default_model(config) or None,
        "contextTokens": catalog.context_tokens(config),
        "thinkingLevels": thinking_levels(),
        "thinkingOptions": list(frames.THINKING_LEVELS),
        # what a session that chose no level runs with (OpenClaw's effort picker shows it)
        "thinkingDefault": catalog.thinking_default(config),
        "mainKey": MAIN_KEY,
        "mainSessionKey": f"agent:{agent_id}:{MAIN_KEY}",
        "modelSelectionTarget": "session",
    }


def session_list(page: gateway_reads.SessionPage, offset: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """A `sessions.list` page (`outbound.fit_list` may shorten it to fit one frame)."""
    rows = session_rows(page.sessions)
    payload = {"ts": now_ms(), "totalCount": page.total, "defaults": defaults, "sessions": rows}
    return paged(payload, offset)


def paged(payload: dict[str, Any], offset: int) -> dict[str, Any]:
    """Set a list page's `count`, `hasMore` and `nextOffset` from the rows it holds."""
    count = len(payload["sessions"])
    has_more = offset + count < payload["totalCount"]
    payload.update({"count": count, "hasMore": has_more, "nextOffset": offset + count if has_more else None})
    return payload


# --- session settings and inline commands (docs/protocol-notes.md, "Session settings") ------------


def thinking_levels() -> list[dict[str, str]]:
    """The thinking levels a session may choose, as OpenClaw lists them (`{id, label}`)."""
    return [{"id": level, "label": level} for level in frames.THINKING_LEVELS]


def model_choices(agent_ids: Sequence[str]) -> dict[str, Any]:
    """`models.list` in OpenClaw's shape: the models sessions of these agents may choose, each once."""
    models: list[dict[str, Any]] = []
    seen: set[tuple[str | None, str]] = set()
    for agent_id in agent_ids:
        config = catalog.config_of(agent_id)
        provider, context = catalog.provider_of(agent_id), catalog.context_tokens(config)
        for model in catalog.models_of(config):
            if (provider, model) in seen:
                continue
            seen.add((provider, model))
            choice: dict[str, Any] = {"id": model, "name": model, "provider": provider}
            if context is not None:
                choice["contextTokens"] = context
            choice["thinkingLevels"] = thinking_levels()
            models.append(choice)
    return {"models": models}


def patch_result(row: dict[str, Any]) -> dict[str, Any]:
    """`sessions.patch`'s answer: a `session_answer` with OpenClaw's `resolved` (the model and
    thinking level the session now runs with, and the levels it may choose)."""
    resolved = {
        "modelProvider": row["modelProvider"],
        "model": row["model"],
        "thinkingLevel": row["thinkingLevel"],
        "thinkingLevels": thinking_levels(),
    }
    return session_answer(row, resolved=resolved)


def _model_ref(row: dict[str, Any]) -> str:
    return f"{row['modelProvider']}/{row['model']}" if row["model"] else "none"


def _setting_text(value: str | None) -> str:
    return value if value else "default"


def command_answer(command: str, arg: str | None) -> Callable[[ChatSession], str]:
    """The answer of /status, /think, /verbose or /model, made from the row as the command left it."""

    def answer(session: ChatSession) -> str:
        row = session_rows([session])[0]
        if command == frames.STATUS_COMMAND:
            return status_text(row)
        setting = frames.SETTING_COMMANDS[command]
        if setting == "model":
            if arg is None:
                config = catalog.config_of(session.agent_id)
                default = catalog.default_model(config)
                listed = ", ".join(f"{m} (default)" if m == default else m for m in catalog.models_of(config))
                return f"Current model: {_model_ref(row)}.\nModels of agent {session.agent_id}: {listed or 'none'}."
            if arg == "":
                return f"Model reset to default: {_model_ref(row)}."
            return f"Model set to {_model_ref(row)}."
        title = "Thinking level" if setting == "thinkingLevel" else "Verbose level"
        if arg is None:
            choices = ", ".join(frames.setting_choices(setting, session.agent_id))
            return f"Current {title.lower()}: {_setting_text(row[setting])}.\nOptions: {choices}."
        if arg == "":
            return f"{title} reset to default."
        return f"{title} set to {arg}."

    return answer


def status_text(row: dict[str, Any]) -> str:
    """/status: the session, its agent and model, its settings, its runs and its token counts."""
    if row["hasActiveRun"]:
        run = f"running {row['activeRunIds'][0]}"
    elif row["status"] is None:
        run = "idle, no run yet"
    else:
        run = f"idle, last run {row['status']} ({row['lastRunId']})"
    if row["queuedRunIds"]:
        run += f", {len(row['queuedRunIds'])} queued"
    if row["totalTokens"] is not None:
        tokens = f"{row['inputTokens']} in, {row['outputTokens']} out, {row['totalTokens']} total"
    else:
        tokens = "not reported"
    if row["contextTokens"] is not None:
        tokens += f" (context budget {row['contextTokens']})"
    return "\n".join(
        [
            f"Session {row['key']} (sessionId {row['sessionId']})",
            f"Agent {row['agentId']}, model {_model_ref(row)}",
            f"Thinking {_setting_text(row['thinkingLevel'])}, verbose {_setting_text(row['verboseLevel'])}",
            f"Run: {run}",
            f"Tokens (last run): {tokens}",
        ]
    )


def stop_answer(command: str, session_id: str, killed: Sequence[str]) -> str:
    """The answer of /stop, /new and /reset."""
    stopped = f"Stopped {len(killed)} run{'s' if len(killed) != 1 else ''}: {', '.join(killed)}." if killed else ""
    if command in frames.STOP_COMMANDS:
        return stopped or "Nothing to stop."
    return " ".join(filter(None, [f"New conversation started (sessionId {session_id}).", stopped]))


def command_final(run_id: str, session: ChatSession, reply: str) -> dict[str, Any]:
    """An inline command's answer as the `chat` `final` of its runId (seq 1: there is no run and no
    other event), sent to the requesting connection before the ack. The message is a run's final
    message marked `command`, as the stored answer is in history (OpenClaw's TUI shows it as a
    notice)."""
    return {
        "runId": run_id,
        "sessionKey": session.key,
        "sessionId": str(session.session_id),
        "seq": 1,
        "state": ChatState.FINAL.value,
        "stopReason": "stop",
        "message": {**assistant_message(reply, now_ms()), "command": True},
    }


def command_ack(run_id: str, session: ChatSession, command: str, reply: str, killed: Sequence[str]) -> dict[str, Any]:
    """The `ok` ack of an inline command (§4): terminal, no run behind it; `reply` is its answer."""
    return ack_payload(
        None,
        AckStatus.OK,
        session.key,
        str(session.session_id),
        runId=run_id,
        aborted=bool(killed),
        runIds=list(killed),
        command=command,
        reply=reply,
    )


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


# --- OpenClaw's client methods (docs/protocol-notes.md, "OpenClaw's own clients") ------------------


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
    end = outcome(run)
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


def agent_identity(agent_id: str) -> dict[str, Any]:
    """`agent.identity.get`: the agent's display name (its configured `name`, else its id)."""
    name = catalog.config_of(agent_id).get("name")
    if isinstance(name, str) and name.strip():
        return {"agentId": agent_id, "name": name.strip(), "nameSource": "config"}
    return {"agentId": agent_id, "name": agent_id, "nameSource": "default"}


def _command(
    name: str, description: str, category: str, arg: tuple[str, str, tuple[str, ...]] | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "textAliases": [f"/{name}"],
        "description": description,
        "category": category,
        "source": "native",
        "scope": "text",
        "acceptsArgs": arg is not None,
    }
    if arg is not None:
        arg_name, arg_description, choices = arg
        entry["args"] = [
            {
                "name": arg_name,
                "description": arg_description,
                "type": "string",
                "required": False,
                **({"choices": [{"value": c, "label": c} for c in choices]} if choices else {}),
            }
        ]
    return entry


def commands(agent_id: str) -> list[dict[str, Any]]:
    """The inline commands `chat.send` answers in the gateway (`commands.list`, `chat.metadata`)."""
    models = tuple(catalog.models_of(catalog.config_of(agent_id)))
    default = frames.DEFAULT_SETTING
    return [
        _command("status", "Show the session's status, model, settings and token counts", "status"),
        _command(
            "think",
            "Show or set the thinking level",
            "options",
            ("level", "thinking level", (*frames.THINKING_LEVELS, default)),
        ),
        _command(
            "verbose",
            "Show or set the verbose level",
            "options",
            ("level", "verbose level", (*frames.VERBOSE_LEVELS, default)),
        ),
        _command(
            "model",
            "Show or set the session's model",
            "options",
            ("model", "one of the agent's models", (*models, default)),
        ),
        _command("new", "Start the session over (a new sessionId)", "session"),
        _command("reset", "Start the session over (a new sessionId)", "session"),
        _command("stop", "Stop the session's active and queued runs", "session"),
    ]


def gateway_status(
    *, version: str, active: int, queued: int, total: int, recent: Sequence[dict[str, Any]], defaults: dict[str, Any]
) -> dict[str, Any]:
    """`status` (OpenClaw's gateway status, as its TUI's /gateway-status shows it), for the caller."""
    return {
        "ok": True,
        "ts": now_ms(),
        "runtimeVersion": version,
        "activeRuns": active,
        "queuedRuns": queued,
        "linkChannel": {"label": "Link channel", "linked": False},
        "channelSummary": [f"agentgate {version}: {active} active run(s), {queued} queued"],
        "heartbeat": {"defaultAgentId": "main", "agents": []},
        "queuedSystemEvents": [],
        "sessions": {
            "paths": [],
            "count": total,
            "defaults": defaults,
            "recent": [
                {
                    "key": row["key"],
                    "kind": row["kind"],
                    "age": max(0, now_ms() - row["updatedAt"]) if row.get("updatedAt") else None,
                    "model": row.get("model"),
                    "totalTokens": row.get("totalTokens"),
                    "contextTokens": row.get("contextTokens"),
                    "flags": [],
                }
                for row in recent
            ],
        },
    }


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


def approval_replay(key: str) -> dict[str, Any]:
    """`sessions.messages.subscribe`'s `approvalReplay`: none (tool approvals are `plugin.approval.*`)."""
    return {"sessionKey": key, "updatedAtMs": now_ms(), "approvals": [], "truncated": False}


def config_snapshot() -> dict[str, Any]:
    """`config.get`: OpenClaw's config file snapshot, empty. This gateway is configured by its
    environment, which no client reads or edits; `readOnly` says so."""
    return {
        "path": None,
        "exists": False,
        "valid": True,
        "readOnly": True,
        "raw": None,
        "hash": None,
        "config": {},
        "runtimeConfig": {},
        "issues": [],
        "warnings": [],
    }
