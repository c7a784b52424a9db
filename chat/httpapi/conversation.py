"""A request's messages as a run's input (HTTP-API.md §14.3, §14.8).

- `system`/`developer` messages, wherever they stand, are the run's `instructions`.
- The new input is the last `user` message, or the `tool` results after the last `assistant`
  message (a continuation after `finish_reason: "tool_calls"`).
- Stateless: the messages before it are the run's `context`; a `tool` message must answer a
  `tool_calls` entry of an assistant message before it in the same request (the ids of earlier
  stateless runs are not the gateway's to check). Named sessions: the session's transcript is the
  context and earlier messages are ignored; tool results must answer the calls the session waits
  for (those its newest run handed over).
- Images and files come as `data:` URLs (`image_url` parts, `file` parts' `file_data`) under the
  attachment limits of §4: those of the new input become its attachments; in a stateless context an
  image stays a part and a text file becomes a text part. Any part a run cannot take, or the agent's
  backend cannot (`AgentBackend.refusal`), is a 400 naming it, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings

from chat.httpapi.errors import ApiError, bad_request
from chat.methods.send import attach
from chat.methods.send.params import attachment
from chat.protocol.errors import ProtocolError
from chat.protocol.fields import CONTROL_RE
from chat.runtime.backends import get_backend
from chat.runtime.backends.base import attachment_kind, inlined_file
from sessions_app import files
from sessions_app.run_requests import ClientTool, RunRequest, ToolResult

ROLES = ("system", "developer", "user", "assistant", "tool")
INSTRUCTION_ROLES = ("system", "developer")
PENDING = "pending"  # a part naming a stored file, its kind known once `resolve_files` reads it
DATA_URL_RE = re.compile(r"data:([A-Za-z0-9.+/-]+);base64,(.*)", re.DOTALL)


@dataclass
class Conversation:
    """The run's input as a request's messages give it."""

    message: str = ""
    attachments: list[dict[str, Any]] = field(default_factory=list)
    instructions: list[str] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)  # stateless only
    tool_results: list[ToolResult] = field(default_factory=list)
    result_params: dict[str, str] = field(default_factory=dict)  # tool_call_id -> the field that carried it
    parts: list[tuple[str, str]] = field(default_factory=list)  # each image and file read: (its kind, its field)
    stored_now: list[files.StoredNow] = field(default_factory=list)  # inline files `resolve_files` stored


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content (a string, or text parts only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of parts", where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request("only text parts are allowed here", f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _checked_parts(content: Any, where: str, found: list[tuple[str, str]]) -> str | list[dict[str, Any]]:
    """A context message's content, once each part is one a run can take: text and image parts as the
    request gave them, an image file as an image part, a text file as a text part inlining it."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of parts", where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        item = _attachment(part, at)
        if item is None:
            parts.append(_text_part(part, at))
            continue
        found.append((attachment_kind(item), at))
        if item["text"] is not None:
            parts.append(
                {
                    "type": "text",
                    "text": ("\n\n" if j else "") + inlined_file(item["fileName"], item["text"], item["mimeType"]),
                }
            )
        elif part["type"] == "file":
            parts.append({"type": "image_url", "image_url": {"url": part["file"]["file_data"]}})
        else:
            parts.append(part)
    return parts


def _text_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind != "text" or not isinstance(part.get("text"), str):
        raise bad_request(f"content parts of type {kind!r} are not supported", where)
    return dict(part)


def _attachment(part: Any, where: str, ids: bool = False) -> dict[str, Any] | None:
    """An image or file part as an attachment (checked within the limits of §4); None for another part.

    Both come inline as `data:` URLs (base64): an `image_url` part's url, a `file` part's `file_data`
    (with its `filename`); in the new message (`ids`) a file part may name an uploaded file by its
    `file_id` (`POST /api/files`), resolved for the caller by `resolve_files`. Links are not fetched."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        wrong = "images must be sent as data: URLs (base64); links are not fetched"
        return _decoded(url, None, f"{where}.image_url", wrong)
    if kind != "file":
        return None
    file = part.get("file")
    if not isinstance(file, dict):
        raise bad_request("a file part needs its file: {file_data, filename} or {file_id}", f"{where}.file")
    if file.get("file_id") is not None and file.get("file_data") is None:
        if not ids:
            raise bad_request("file ids are read in the new message only; earlier ones send file_data", f"{where}.file")
        try:
            return {**attachment({"fileId": file["file_id"]}, where), "where": f"{where}.file.file_id"}
        except ProtocolError as exc:
            raise bad_request(exc.message, f"{where}.file.file_id") from exc
    wrong = "files must be sent as file_data, a data: URL (data:<type>;base64,...), or as a file_id of POST /api/files"
    return _decoded(file.get("file_data"), file.get("filename"), f"{where}.file.file_data", wrong)


def _decoded(url: Any, name: Any, param: str, wrong: str) -> dict[str, Any]:
    found = DATA_URL_RE.fullmatch(url) if isinstance(url, str) else None
    if found is None:
        raise bad_request(wrong, param)
    try:
        return attachment({"mimeType": found.group(1), "fileName": name, "content": found.group(2)}, param)
    except ProtocolError as exc:  # too large, not base64, not image/* or text/*, not what its type says
        named = str(exc.details.get("field") or "").endswith(".fileName")
        raise bad_request(exc.message, param.replace("file_data", "filename") if named else param) from exc


def _new_input(content: Any, where: str, found: list[tuple[str, str]]) -> tuple[str, list[dict[str, Any]]]:
    """The new user message: its text, and its images and files as attachments."""
    if isinstance(content, list):
        texts, attached = [], []
        for j, part in enumerate(content):
            item = _attachment(part, f"{where}[{j}]", ids=True)
            if item is None:
                texts.append(_text_part(part, f"{where}[{j}]")["text"])
            else:
                attached.append(item)
                found.append((attachment_kind(item) if "sha256" in item else PENDING, f"{where}[{j}]"))
        text = "\n".join(texts)
    else:
        text, attached = _text_of(content, where), []
    if "\x00" in text:
        raise bad_request("a message must not contain NUL characters", where)
    text = CONTROL_RE.sub("", text)
    if len(text) > settings.GATEWAY_MAX_MESSAGE_CHARS:
        raise bad_request(f"a message is at most {settings.GATEWAY_MAX_MESSAGE_CHARS} characters", where)
    if len(attached) > settings.GATEWAY_MAX_ATTACHMENTS:
        raise bad_request(f"at most {settings.GATEWAY_MAX_ATTACHMENTS} images and files per message", where)
    return text, attached


def check_taken(convo: Conversation, agent_id: str) -> None:
    """Every image and file part read is one the agent's backend can take: else a 400 naming the part,
    before anything is admitted (§14.3)."""
    backend = get_backend(agent_id)
    for kind, param in convo.parts:
        refused = backend.refusal(kind) if backend is not None and kind != PENDING else None
        if refused is not None:
            raise bad_request(refused, param, "unsupported_content")


async def resolve_files(convo: Conversation, owner_id: int, agent_id: str) -> None:
    """The new message's files named by id, resolved for their owner (another's is a 400 naming the
    part), inline images stored: as `chat.send` does; then what they are is checked as `check_taken` does."""
    waiting = [i for i, item in enumerate(convo.attachments) if "sha256" not in item]
    try:
        convo.attachments = await attach.prepare(owner_id, convo.attachments, convo.stored_now)
    except ProtocolError as exc:
        raise bad_request(exc.message, str(exc.details.get("field") or "messages"), "file_not_found") from exc
    kinds = iter([attachment_kind(convo.attachments[i]) for i in waiting])
    convo.parts = [(next(kinds) if kind == PENDING else kind, param) for kind, param in convo.parts]
    check_taken(convo, agent_id)


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise bad_request("each message must be an object", where)
    if raw.get("role") not in ROLES:
        raise bad_request(f"role must be one of {', '.join(ROLES)}", f"{where}.role")
    return raw


def _tool_calls(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    calls = raw.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise bad_request("tool_calls must be a list", f"{where}.tool_calls")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call.get("id") if isinstance(call, dict) else None, str) or not isinstance(function, dict):
            raise bad_request("a tool call needs an id and a function", f"{where}.tool_calls[{j}]")
    return calls


def _result(raw: dict[str, Any], where: str) -> ToolResult:
    call_id = raw.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request("a tool message needs its tool_call_id", f"{where}.tool_call_id")
    return ToolResult(call_id, _text_of(raw.get("content"), f"{where}.content"))


def read_messages(messages: list[Any], *, named: bool, agent_id: str) -> Conversation:
    """The run's input from a request's messages for a run of `agent_id` (see the module's rules)."""
    found = [_message(raw, i) for i, raw in enumerate(messages)]
    convo = Conversation()
    turns: list[tuple[int, dict[str, Any]]] = []
    for i, raw in enumerate(found):
        if raw["role"] in INSTRUCTION_ROLES:
            text = _text_of(raw.get("content"), f"messages[{i}].content")
            if text.strip():
                convo.instructions.append(text)
        else:
            turns.append((i, raw))
    if not turns:
        raise bad_request("messages must include a user message", "messages")
    last_i, last = turns[-1]
    if last["role"] == "assistant":
        raise bad_request("the last message must be a user message or tool results", f"messages[{last_i}].role")
    start = len(turns) - 1
    if last["role"] == "tool":
        while start > 0 and turns[start - 1][1]["role"] == "tool":
            start -= 1
        for i, raw in turns[start:]:
            result = _result(raw, f"messages[{i}]")
            convo.tool_results.append(result)
            convo.result_params[result.call_id] = f"messages[{i}].tool_call_id"
    else:
        convo.message, convo.attachments = _new_input(last.get("content"), f"messages[{last_i}].content", convo.parts)
    if not named:
        convo.context = _context(turns[:start], convo.parts)
        offered = {call["id"] for entry in convo.context for call in entry.get("tool_calls", [])}
        unknown = [r.call_id for r in convo.tool_results if r.call_id not in offered]
        if unknown:
            raise unknown_call(unknown[0], convo.result_params[unknown[0]])
    check_taken(convo, agent_id)
    return convo


def _context(turns: list[tuple[int, dict[str, Any]]], found: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Earlier messages, oldest first, as the run's context; a tool message must answer a call before it."""
    context: list[dict[str, Any]] = []
    offered: set[str] = set()
    for i, raw in turns:
        where = f"messages[{i}]"
        role = raw["role"]
        if role == "tool":
            result = _result(raw, where)
            if result.call_id not in offered:
                raise unknown_call(result.call_id, f"{where}.tool_call_id")
            context.append({"role": "tool", "tool_call_id": result.call_id, "content": result.output})
            continue
        entry: dict[str, Any] = {"role": role, "content": _checked_parts(raw.get("content"), f"{where}.content", found)}
        if role == "assistant":
            calls = _tool_calls(raw, where)
            if calls:
                entry["tool_calls"] = calls
                offered.update(call["id"] for call in calls)
        context.append(entry)
    return context


def unknown_call(call_id: str, param: str) -> ApiError:
    return bad_request(
        f"tool_call_id {call_id!r} answers no tool call of this conversation", param, "unknown_tool_call_id"
    )


class Asked(Protocol):
    """What both endpoints' requests ask of a run besides their messages."""

    tools: list[ClientTool]
    tool_choice: str | dict[str, Any]
    params: dict[str, Any]
    reasoning_effort: str
    user: str
    metadata: dict[str, str]


def run_request(
    asked: Asked, convo: Conversation, model: str, *, stateless: bool, instructions: list[str] | None = None
) -> RunRequest:
    """The run's part of a request (HTTP-API.md §14.3): `instructions` (Responses' own field) come
    before the system and developer messages."""
    return RunRequest(
        instructions=[*(instructions or []), *convo.instructions],
        context=convo.context,
        tool_results=convo.tool_results,
        client_tools=asked.tools,
        tool_choice=asked.tool_choice,
        params=asked.params,
        reasoning_effort=asked.reasoning_effort,
        model=model,
        user=asked.user,
        metadata=asked.metadata,
        stateless=stateless,
    )
