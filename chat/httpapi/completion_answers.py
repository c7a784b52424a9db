"""Chat Completions answers built from a run (HTTP-API.md §14.4): the completion object, the stream's
chunks, and how the run's outcome reads as a `finish_reason` or an error.

Ids and times come from the run, so a replay under the same Idempotency-Key answers the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from chat.httpapi.errors import NO_RETRY, ApiError
from chat.protocol.run_events import run_end
from sessions_app.models import Run, RunState, ToolCall, ToolCallState

# A `done` run's stopReason as a finish_reason (any other is `stop`)
FINISH_REASONS = {
    "length": "length",
    "tool_limit": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
}


@dataclass(frozen=True)
class Identity:
    """What every object of one answer carries: its id, when, and the model as the request named it."""

    id: str
    created: int
    model: str

    @classmethod
    def of(cls, run: Run, model: str) -> Identity:
        digest = hashlib.sha256(f"{run.pk}:{run.run_id}".encode()).hexdigest()[:29]
        return cls(f"chatcmpl-{digest}", int(run.created_at.timestamp()), model)


def client_calls(calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolCall]:
    """The calls the run handed to the client (client function tools), in order."""
    return [call for call in calls if call.state == ToolCallState.CLIENT]


def tool_call_object(call: ToolCall) -> dict[str, Any]:
    return {"id": call.call_id, "type": "function", "function": {"name": call.tool, "arguments": call.arguments}}


def run_error(run: Run | None) -> ApiError | None:
    """The error a run that did not complete answers with (None for a `done` run).

    Aborted (by anyone, or its session deleted: `run` None) → 409 `run_aborted` with its stopReason;
    failed → 502, timed out → 504, each with the run's errorKind as `code`. None is to be retried by
    the client on its own (`NO_RETRY`): the run ran."""
    if run is not None and run.state == RunState.DONE:
        return None
    if run is None or run.state == RunState.KILLED:
        reason = run_end(run).stop_reason if run is not None else "delete"
        return ApiError(
            409,
            f"the run was aborted (stopReason {reason})",
            type="run_aborted",
            code="run_aborted",
            headers=NO_RETRY,
            extra={"stopReason": reason},
        )
    end = run_end(run)
    status = 504 if run.state == RunState.TIMEOUT else 502
    extra = {"stopReason": end.stop_reason} if end.stop_reason else {}
    return ApiError(status, end.error_text, code=end.error_kind, headers=NO_RETRY, extra=extra)


def finish_reason(run: Run, calls: list[ToolCall]) -> str:
    """The finish_reason of a `done` run: `tool_calls` when it handed calls to the client."""
    if client_calls(calls):
        return "tool_calls"
    return FINISH_REASONS.get(run_end(run).stop_reason or "", "stop")


def usage(run: Run) -> dict[str, int]:
    prompt, completion = run.prompt_tokens or 0, run.completion_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(run: Run, calls: list[ToolCall], who: Identity) -> dict[str, Any]:
    """The non-streaming answer of a `done` run."""
    handed = client_calls(calls)
    message: dict[str, Any] = {"role": "assistant", "content": run.reply if run.reply or not handed else None}
    if handed:
        message["tool_calls"] = [tool_call_object(call) for call in handed]
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(run, calls)}
    return {
        "id": who.id,
        "object": "chat.completion",
        "created": who.created,
        "model": who.model,
        "choices": [choice],
        "usage": usage(run),
    }


def chunk(who: Identity, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One `chat.completion.chunk`."""
    return {
        "id": who.id,
        "object": "chat.completion.chunk",
        "created": who.created,
        "model": who.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(who: Identity, run: Run) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage`: no choices, the usage."""
    return {
        "id": who.id,
        "object": "chat.completion.chunk",
        "created": who.created,
        "model": who.model,
        "choices": [],
        "usage": usage(run),
    }


def ending_chunks(run: Run, calls: list[ToolCall], who: Identity) -> list[dict[str, Any]]:
    """A `done` run's last chunks: its client calls, then the finish_reason."""
    handed = client_calls(calls)
    out = []
    if handed:
        delta = [{"index": i, **tool_call_object(call)} for i, call in enumerate(handed)]
        out.append(chunk(who, {"tool_calls": delta}))
    out.append(chunk(who, {}, finish_reason(run, calls)))
    return out
