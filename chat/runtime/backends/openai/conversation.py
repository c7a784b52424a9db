"""The messages sent to the model: the transcript (or a stateless request's own messages) trimmed to the
budget, each step's calls and results, and the results an API client sent for calls handed to it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from chat.runtime.backends.attached import user_content
from chat.runtime.backends.base import RunContext
from chat.runtime.backends.openai.settings import AgentSettings
from chat.runtime.tools.config import MODEL_NAME_RE
from chat.runtime.tools.host import ModelCall, ToolResult
from sessions_app.lifecycle.steering import Delivered
from sessions_app.models import TOOL_TERMINAL_STATES, ToolCallState

# Text written after tool calls starts a new paragraph of the same reply.
PARAGRAPH = "\n\n"
NO_CLIENT_RESULT = "(no result: the call was handed to the API client, which sent none)"


def build_messages(
    ctx: RunContext, settings: AgentSettings, images: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The request's messages: system prompt plus the conversation, trimmed to the budget.

    The conversation is the session's transcript (`transcript_groups`), or, for a stateless
    HTTP request, the messages it brought (`context_groups`, HTTP-API.md §14.3). Whole
    messages are dropped from the oldest end until the texts fit `context_chars`; the run's
    own message is always kept (an oversize one is the server's to refuse), and so are the
    calls the request's tool results answer. An assistant message that called tools is kept
    or dropped with its results, so a tool message never loses the call it answers. A request
    that brings only tool results ends with them, not with an empty user message.
    """
    request = ctx.request
    images = images or {}
    alias: dict[str, str] = {}
    instructions: list[str] = []
    if ctx.stateless:
        history, instructions = context_groups(request.context)
        current = ctx.message
    else:
        history, current, alias = transcript_groups(ctx, settings, images)
    content = user_content(
        current, ctx.attachments, images, document_chars=settings.document_chars, send_images=settings.vision
    )
    results = {r.call_id: r.output for r in request.tool_results}
    pinned, leftover = answer_calls(history, results, alias)
    if leftover:  # results of calls no longer in the window: told in words, a request stays valid
        told = "\n\n".join(f"Result of tool call {call_id}:\n{output}" for call_id, output in leftover.items())
        history.append([{"role": "user", "content": told}])
        pinned.add(len(history) - 1)
    for group in history:
        _close_unanswered(group)

    prompt = "\n\n".join(p for p in (settings.system_prompt, *request.instructions, *instructions) if p)
    budget = settings.context_chars - len(prompt) - len(_text_of(content))
    kept: list[list[dict[str, Any]]] = []
    for index in range(len(history) - 1, -1, -1):
        budget -= sum(_size(message) for message in history[index])
        if budget < 0 and index not in pinned:
            break
        kept.append(history[index])
    kept.reverse()
    system = [{"role": "system", "content": prompt}] if prompt else []
    tail = [{"role": "user", "content": content}] if content or not results else []
    return [*system, *(message for group in kept for message in group), *tail]


def transcript_groups(
    ctx: RunContext, settings: AgentSettings, images: Mapping[str, str] | None = None
) -> tuple[list[list[dict[str, Any]]], str, dict[str, str]]:
    """The transcript before this run's message as groups of messages, that message's text, and the
    ids a client may name the calls handed to it by (the model's or the gateway's) -> the id sent.

    `ctx.transcript` is the current generation oldest first and already holds this run's user
    message; anything stored after it (nothing, normally) is not part of this run's context.
    Aborted partial replies are sent as they were shown. Results an earlier request brought for
    calls handed to its client follow those calls (`answer_calls`). The earlier messages a stateless
    request brought (`context`) come before its own message, when a later request continues its
    session; the instructions among them were that run's alone (§14.3).
    """
    history: list[list[dict[str, Any]]] = []
    alias: dict[str, str] = {}
    for entry in ctx.transcript:
        role = entry.get("role")
        if role == "user" and entry.get("run") == ctx.run_pk:
            return history, str(entry.get("text") or ""), alias
        if role == "user" and entry.get("context"):
            history.extend(context_groups(entry["context"])[0])
        if role == "user" and entry.get("results"):
            answer_calls(history, entry["results"], alias)
        if role == "user" and (entry.get("text") or entry.get("attachments")):
            content = user_content(
                str(entry.get("text") or ""),
                list(entry.get("attachments") or []),
                images or {},
                document_chars=settings.document_chars,
                send_images=settings.vision and settings.history_images,
            )
            history.append([{"role": "user", "content": content}])
        elif role == "assistant":
            group = assistant_messages(entry)
            if group:
                history.append(group)
            for call in entry.get("tools") or []:
                if call.get("status") == ToolCallState.CLIENT and call.get("id"):
                    alias.update(
                        {str(call["id"]): str(call["id"]), str(call.get("model_id") or call["id"]): call["id"]}
                    )
    return history, ctx.message, alias  # the run's message not in the transcript (a run of an older generation)


def context_groups(context: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """A stateless request's messages (Chat Completions' shape) as groups, and its system/developer texts
    (added to the system prompt, §14.3). An assistant message with calls and the tool messages after it
    are one group; each call is sent in the form every server accepts back (`_tool_call`)."""
    groups: list[list[dict[str, Any]]] = []
    system: list[str] = []
    for message in context:
        role = message.get("role")
        content = _content(message.get("content"))
        if role in ("system", "developer"):
            system.append(_text_of(content))
        elif role == "tool" and groups and groups[-1][0].get("tool_calls"):
            groups[-1].append(
                {"role": "tool", "tool_call_id": str(message.get("tool_call_id") or ""), "content": content}
            )
        elif role == "assistant" and message.get("tool_calls"):
            calls = [
                _tool_call(str(c.get("id") or ""), str((c.get("function") or {}).get("name") or ""), _args(c))
                for c in message["tool_calls"]
                if isinstance(c, dict)
            ]
            groups.append([{"role": "assistant", "content": content or None, "tool_calls": calls}])
        elif role in ("user", "assistant", "tool"):
            groups.append([{"role": role, "content": content, **_tool_call_id(message)}])
    return groups, [text for text in system if text]


def answer_calls(
    history: list[list[dict[str, Any]]], results: dict[str, str], alias: dict[str, str]
) -> tuple[set[int], dict[str, str]]:
    """Put each result (call id -> output) as a `tool` message after the newest assistant message that
    made that call (`alias` maps the ids a client may use to the id sent), unless one answers it
    already. Returns the groups answered, and the results that answer no call of the history."""
    answered: set[int] = set()
    leftover: dict[str, str] = {}
    for call_id, output in results.items():
        target = alias.get(call_id, call_id)
        for index in range(len(history) - 1, -1, -1):
            if _add_result(history[index], target, output):
                answered.add(index)
                break
        else:
            leftover[call_id] = output
    return answered, leftover


def _add_result(group: list[dict[str, Any]], call_id: str, output: str) -> bool:
    """Answer `call_id` in this group: True when one of its assistant messages made the call."""
    for i, message in enumerate(group):
        if any(c["id"] == call_id for c in message.get("tool_calls") or []):
            at = _after_results(group, i)
            if not any(m.get("tool_call_id") == call_id for m in group[i + 1 : at]):
                group.insert(at, {"role": "tool", "tool_call_id": call_id, "content": output or "(no output)"})
            return True
    return False


def _close_unanswered(group: list[dict[str, Any]]) -> None:
    """Every call sent needs its result, or the request is refused: a call no result answers (handed to
    a client that never sent one) is told as such."""
    for i in range(len(group) - 1, -1, -1):
        calls = group[i].get("tool_calls") or []
        at = _after_results(group, i)
        have = {m.get("tool_call_id") for m in group[i + 1 : at]}
        missing = [c["id"] for c in calls if c["id"] not in have]
        group[at:at] = [{"role": "tool", "tool_call_id": call_id, "content": NO_CLIENT_RESULT} for call_id in missing]


def _after_results(group: list[dict[str, Any]], index: int) -> int:
    """Where the `tool` messages that follow the group's message `index` end."""
    at = index + 1
    while at < len(group) and group[at].get("role") == "tool":
        at += 1
    return at


def assistant_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant transcript entry as the model's messages, its tool calls included (§13.4).

    In order: per step, the text written before its calls with the calls (named by their
    gateway ids), then one `tool` message per call; the text after the last step closes it.
    Only calls that reached their terminal state are sent, so every call sent has its
    result and the request stays valid (a call still open belongs to a run not yet ended).
    """
    text = str(entry.get("text") or "")
    calls = [c for c in entry.get("tools") or [] if c.get("status") in TOOL_TERMINAL_STATES and c.get("id")]
    if not calls:
        return [{"role": "assistant", "content": text}] if text else []
    steps: dict[int, list[dict[str, Any]]] = {}
    for c in calls:
        steps.setdefault(int(c.get("step") or 0), []).append(c)
    out: list[dict[str, Any]] = []
    pos = 0
    for step in sorted(steps):
        group = steps[step]
        offset = min(max(int(group[0].get("offset") or 0), pos), len(text))
        out.append(
            {
                "role": "assistant",
                "content": _text_between(text, pos, offset) or None,
                "tool_calls": [_tool_call(str(c["id"]), str(c.get("name") or ""), c.get("arguments")) for c in group],
            }
        )
        out.extend(
            {"role": "tool", "tool_call_id": str(c["id"]), "content": _result_text(c.get("result"), c.get("status"))}
            for c in group
            if c.get("status") != ToolCallState.CLIENT  # its result comes with the client's next request
        )
        pos = offset
    rest = _text_between(text, pos, len(text))
    if rest:
        out.append({"role": "assistant", "content": rest})
    return out


def step_messages(text: str, calls: list[ModelCall], results: list[ToolResult]) -> list[dict[str, Any]]:
    """A finished step as the next request's messages: its text and calls, then each call's result."""
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [_tool_call(c.id, c.name, c.arguments) for c in calls],
        }
    ]
    by_id = {r.model_call_id: r for r in results}
    for c in calls:
        result = by_id.get(c.id)
        content = _result_text(result.text, result.status) if result else "(no result: the call was not run)"
        messages.append({"role": "tool", "tool_call_id": c.id, "content": content})
    return messages


def steer_messages(steers: list[Delivered], settings: AgentSettings) -> list[dict[str, Any]]:
    """Steering messages the run took, as user messages for its next request, in the order they came.
    Their documents go as text like any message's; their images are named by a placeholder (the run's
    images were prepared at its start; the next run sends them from the transcript)."""
    return [
        {
            "role": "user",
            "content": user_content(
                s.message, s.attachments, {}, document_chars=settings.document_chars, send_images=False
            ),
        }
        for s in steers
    ]


def _text_between(text: str, start: int, end: int) -> str:
    """The reply's text of one step, without the paragraph break the gateway put before it."""
    part = text[start:end]
    return part.removeprefix(PARAGRAPH) if start else part


def _tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A call as an assistant message carries it, in a form every server accepts back.

    Servers that render history through a chat template parse the arguments, and refuse
    the whole request (every later turn of the session, too) when a past call's arguments
    are not a JSON object: such a call is sent with `{}`; its result says what was wrong.
    The same goes for a function name outside OpenAI's rule.
    """
    args = arguments if isinstance(arguments, str) else ""
    try:
        valid = isinstance(json.loads(args), dict)
    except ValueError:
        valid = False
    if not MODEL_NAME_RE.fullmatch(name):
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "unknown_tool"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args if valid else "{}"}}


def _result_text(result: Any, status: Any) -> str:
    text = str(result or "")
    return text if text else f"(no output; the call ended {status})"


def _content(value: Any) -> Any:
    """A request message's content: its text, or its parts when they are not all text (images)."""
    if isinstance(value, list):
        if all(isinstance(p, dict) and p.get("type") == "text" for p in value):
            return "".join(str(p.get("text") or "") for p in value)
        return value
    return "" if value is None else str(value)


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


def _args(call: dict[str, Any]) -> Any:
    return (call.get("function") or {}).get("arguments")


def _tool_call_id(message: dict[str, Any]) -> dict[str, str]:
    return {"tool_call_id": str(message.get("tool_call_id") or "")} if message.get("role") == "tool" else {}


def _size(message: dict[str, Any]) -> int:
    """A message's characters for the context budget: its text, and its calls' names and arguments."""
    size = len(_text_of(message.get("content")))
    for call in message.get("tool_calls") or []:
        size += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return size
