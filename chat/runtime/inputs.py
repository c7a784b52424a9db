"""What a run's backend is given (`RunContext`): the run, its session's transcript, and what an HTTP request
added to it (`Run.request`, HTTP-API.md §14.3-14.5) with the calls handed to the API client that its tool
results answer."""

from __future__ import annotations

from typing import Any

from chat.base import agents
from chat.runtime.backends import RunContext
from chat.runtime.tools.config import model_name
from sessions_app import files, gateway_reads
from sessions_app.models import Run, SessionKind, ToolCall, ToolCallState
from sessions_app.run_requests import RunRequest


def request_of(run: Run) -> RunRequest:
    return RunRequest.from_json(run.request)


def reads_transcript(request: RunRequest) -> bool:
    """Whether the session's transcript is the run's context: not for a stateless request (§14.3)."""
    return not request.own_context


def read(run: Run, window: int, request: RunRequest) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The run's transcript (its newest `window` messages) and the client calls its tool results answer."""
    answered = []
    if request.tool_results:
        earlier = gateway_reads.client_calls_before(run.session_id, run.session_generation, before_run_pk=run.pk)
        answered = [_call_item(c) for c in earlier]
    return (transcript(run, window) if window else []), answered


def transcript(run: Run, window: int) -> list[dict[str, Any]]:
    """The newest `window` messages of the run's branch (as much as its backend reads).

    An assistant message of a run that called tools carries them (`tools`: id, the model's
    function name, arguments, result, status and where in the text each came), so the model
    is sent its calls and their results again rather than calling again to learn them. A call
    handed to the API client has its result in the request of a later run: the user message of
    that run carries the results its request brought (`results`, by call id). In an `api` session
    (a stateless request's, continued by a chain or the session header) the user message of the
    run that began it carries the earlier messages that request brought (`context`, in Chat
    Completions' shape): they come before it in the conversation.
    """
    messages = gateway_reads.context_messages(run, limit=window)
    calls = gateway_reads.tool_calls_of({m.run_id for m in messages if m.role == "assistant" and m.run_id})
    handed = any(c.state == ToolCallState.CLIENT for found in calls.values() for c in found)
    asked = {m.run_id for m in messages if m.role == "user" and m.run_id}
    requests = gateway_reads.requests_of(asked) if handed or run.session.kind == SessionKind.API else {}
    attached = files.attachments_of(asked - {run.pk}) if asked - {run.pk} else {}
    out = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "text": m.text, "aborted": m.aborted, "run": m.run_id}
        if m.pk == run.prompt_id:  # the user message a regenerated reply answers again: this run's prompt
            item["run"] = run.pk
        request = requests.get(m.run_id) if m.role == "user" and m.run_id else None
        if request is not None and request.context:
            item["context"] = request.context
        if m.role == "user" and m.run_id in attached:
            item["attachments"] = attached[m.run_id]  # an earlier turn's images and documents, sent again
        if request is not None and request.tool_results:
            item["results"] = {r.call_id: r.output for r in request.tool_results}
        if m.role == "assistant" and m.run_id in calls:
            item["tools"] = [
                {
                    **_call_item(c),
                    "result": c.result,
                    "status": c.state,
                    "step": c.step,
                    "offset": max(0, c.reply_offset - m.reply_start),  # in this message's text
                }
                for c in gateway_reads.calls_of_part(m, calls[m.run_id])
            ]
        out.append(item)
    return out


def _call_item(call: ToolCall) -> dict[str, str]:
    return {
        "id": call.call_id,
        "model_id": call.model_call_id,
        "name": model_name(call.server, call.tool),
        "arguments": call.arguments,
    }


def context_for(
    run: Run, transcript: list[dict[str, Any]], request: RunRequest, answered: list[dict[str, str]]
) -> RunContext:
    """The backend's context: the run, its transcript, its request (which may choose another of the
    agent's models and a reasoning effort for this run only)."""
    session = run.session
    model = session.model_override
    if request.model:
        model = agents.resolve_model(session.agent_id, request.model) or model  # only a model the agent lists
    return RunContext(
        run_pk=run.pk,
        run_id=run.run_id,
        session_key=session.key,
        session_id=str(run.session_generation),
        agent_id=session.agent_id,
        agent=agents.of(session.agent_id).config,
        message=run.message,
        attachments=list(run.attachments or []),
        transcript=transcript,
        timeout_ms=run.timeout_ms,
        model=model,
        thinking_level=request.reasoning_effort or session.thinking_level,
        request=request,
        answered_calls=answered,
    )
