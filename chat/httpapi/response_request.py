"""A Responses request read and checked (HTTP-API.md §14.5): a known field with a bad value is a 400
naming it, unknown fields are ignored, a null is the same as absent.

The `input` items become the Chat Completions messages they stand for, so the one reading of a
request's messages (`chat.httpapi.conversation`: instructions, the new input, a stateless context,
tool results and their matching, images) serves both APIs; its errors are renamed to the `input`
item they came from. `mcp_approval_response` items are not messages: they answer an approval of
the response they continue. The gateway's own outputs sent back as input (`mcp_call`,
`mcp_approval_request`, `mcp_list_tools`, `reasoning`) carry nothing a run needs and are skipped.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from chat.httpapi.completion_request import EFFORTS, _bool, _int, _metadata, _number, parse_tool_choice, parse_tools
from chat.httpapi.errors import ApiError, bad_request
from sessions_app.run_requests import ClientTool

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
SKIPPED_ITEMS = ("mcp_call", "mcp_approval_request", "mcp_list_tools", "reasoning")
TEXT_PARTS = ("input_text", "output_text", "text")
MAX_ITEMS = 1000
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class ApprovalAnswer:
    """An `mcp_approval_response` input item."""

    approval_id: str
    approve: bool
    param: str  # the item, for errors


@dataclass
class ResponsesAsk:
    """What a request asks, checked."""

    model: str
    items: list[dict[str, Any]] = field(default_factory=list)  # the input items as stored (with ids)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the items as Chat Completions messages
    sources: list[int] = field(default_factory=list)  # the input index of each message
    approvals: list[ApprovalAnswer] = field(default_factory=list)
    instructions: str = ""
    stream: bool = False
    background: bool = False
    store: bool = True
    previous_response_id: str = ""
    conversation: str | None = None
    tools: list[ClientTool] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = ""
    params: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str = ""
    user: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def renamed(error: ApiError, sources: list[int]) -> ApiError:
    """An error of the messages' reading, naming the `input` item it came from."""
    param = error.param or ""
    found = re.match(r"messages\[(\d+)\](.*)", param)
    if found and int(found.group(1)) < len(sources):
        # an input_file's fields are its own (not under `file`); a function_call_output's id is its call_id
        rest = found.group(2).replace(".file.", ".").replace(".tool_call_id", ".call_id")
        error.param = f"input[{sources[int(found.group(1))]}]{rest}"
    elif param == "messages":
        error.param = "input"
    if error.code == "unknown_tool_call_id":
        error.message = error.message.replace("tool_call_id", "call_id")
    return error


def _parts(content: Any, where: str) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """A message's content as Chat Completions content, and as stored input parts."""
    if isinstance(content, str):
        return content, [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of parts", where)
    chat: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{j}]"
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            chat.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and part.get("image_url") is None and part.get("file_id") is not None:
            # an uploaded image (POST /api/files), read as a file part naming it
            chat.append({"type": "file", "file": {"file_id": part.get("file_id")}})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise bad_request("images are sent as data: URLs in image_url, or as a file_id of POST /api/files", at)
            chat.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "input_file":
            # read (or refused, naming this part) where the messages are read, as a Chat Completions file
            chat.append({"type": "file", "file": {k: part.get(k) for k in ("file_data", "filename", "file_id")}})
        else:
            raise bad_request(f"content parts of type {kind!r} are not supported", at)
    return chat, [dict(p) for p in content]


def _string(value: Any, name: str, *, max_len: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > max_len:
        raise bad_request(f"{name} must be a string of at most {max_len} characters", name)
    return value


class _Input:
    """Reads the `input` items in order."""

    def __init__(self, ask: ResponsesAsk) -> None:
        self.ask = ask

    def read(self, value: Any) -> None:
        if isinstance(value, str):
            value = [{"type": "message", "role": "user", "content": value}]
        if not isinstance(value, list) or not value or len(value) > MAX_ITEMS:
            raise bad_request(f"input must be a string or a list of 1 to {MAX_ITEMS} items", "input")
        for i, raw in enumerate(value):
            if not isinstance(raw, dict):
                raise bad_request("each input item must be an object", f"input[{i}]")
            kind = raw.get("type") or ("message" if "role" in raw else None)
            if kind == "message":
                self._message(raw, i)
            elif kind == "function_call":
                self._function_call(raw, i)
            elif kind == "function_call_output":
                self._output(raw, i)
            elif kind == "mcp_approval_response":
                self._approval(raw, i)
            elif kind not in SKIPPED_ITEMS:
                raise bad_request(f"input items of type {kind!r} are not supported", f"input[{i}].type")

    def _keep(self, raw: dict[str, Any], prefix: str, **stored: Any) -> None:
        given = raw.get("id")
        ident = given if isinstance(given, str) and ID_RE.fullmatch(given) else item_id(prefix)
        self.ask.items.append({"id": ident, **stored})

    def _add(self, message: dict[str, Any], i: int) -> None:
        self.ask.messages.append(message)
        self.ask.sources.append(i)

    def _message(self, raw: dict[str, Any], i: int) -> None:
        role = raw.get("role")
        if role not in MESSAGE_ROLES:
            raise bad_request(f"role must be one of {', '.join(MESSAGE_ROLES)}", f"input[{i}].role")
        content, parts = _parts(raw.get("content"), f"input[{i}].content")
        if role == "assistant":
            parts = [{**p, "type": "output_text"} if p.get("type") == "input_text" else p for p in parts]
        self._add({"role": role, "content": content}, i)
        self._keep(raw, "msg", type="message", role=role, content=parts, status="completed")

    def _function_call(self, raw: dict[str, Any], i: int) -> None:
        call_id, name, arguments = raw.get("call_id"), raw.get("name"), raw.get("arguments", "")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not isinstance(arguments, str):
            raise bad_request("a function_call needs call_id, name and arguments (strings)", f"input[{i}]")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        last = self.ask.messages[-1] if self.ask.messages else None
        if last is not None and last["role"] == "assistant" and self.ask.sources[-1] == i - 1:
            last.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
            self.ask.sources[-1] = i
        else:
            self._add({"role": "assistant", "content": None, "tool_calls": [call]}, i)
        self._keep(raw, "fc", type="function_call", call_id=call_id, name=name, arguments=arguments)

    def _output(self, raw: dict[str, Any], i: int) -> None:
        call_id, output = raw.get("call_id"), raw.get("output")
        if isinstance(output, list):
            texts = [p.get("text") for p in output if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts) or len(texts) != len(output):
                raise bad_request("a function_call_output's output must be a string or text parts", f"input[{i}]")
            output = "\n".join(t for t in texts if isinstance(t, str))
        if not isinstance(call_id, str) or not call_id or not isinstance(output, str):
            raise bad_request("a function_call_output needs call_id and output (strings)", f"input[{i}]")
        self._add({"role": "tool", "tool_call_id": call_id, "content": output}, i)
        self._keep(raw, "fco", type="function_call_output", call_id=call_id, output=output)

    def _approval(self, raw: dict[str, Any], i: int) -> None:
        approval_id, approve = raw.get("approval_request_id"), raw.get("approve")
        if not isinstance(approval_id, str) or not approval_id:
            raise bad_request("approval_request_id must be the approval's id", f"input[{i}].approval_request_id")
        if not isinstance(approve, bool):
            raise bad_request("approve must be a boolean", f"input[{i}].approve")
        reason = _string(raw.get("reason"), f"input[{i}].reason", max_len=1000)
        self.ask.approvals.append(ApprovalAnswer(approval_id, approve, f"input[{i}]"))
        stored = {"approval_request_id": approval_id, "approve": approve, **({"reason": reason} if reason else {})}
        self._keep(raw, "mcpr", type="mcp_approval_response", **stored)


def _tools(value: Any) -> list[ClientTool]:
    """Responses' function tools (`{type, name, description?, parameters?}`), read as Chat Completions'."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("tools must be a list", "tools")
    nested = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(
                "only function tools are supported (the agent's own MCP tools run in the gateway)", f"tools[{i}].type"
            )
        function = {k: tool.get(k) for k in ("name", "description", "parameters") if tool.get(k) is not None}
        nested.append({"type": "function", "function": function})
    try:
        return parse_tools(nested)
    except ApiError as error:
        error.param = (error.param or "tools").replace(".function", "")
        raise


def _tool_choice(value: Any, tools: list[ClientTool]) -> str | dict[str, Any]:
    if isinstance(value, dict) and value.get("type") == "function":
        value = {"type": "function", "function": {"name": value.get("name")}}
    return parse_tool_choice(value, tools)


def _reasoning(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, dict):
        raise bad_request("reasoning must be an object ({effort})", "reasoning")
    effort = value.get("effort")
    if effort is None:
        return ""
    if not isinstance(effort, str) or effort not in EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(EFFORTS)}", "reasoning.effort")
    return EFFORTS[effort]


def _conversation(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value.strip():
        raise bad_request("conversation must name a session (a string, or {id})", "conversation")
    return value


def parse_responses(body: dict[str, Any]) -> ResponsesAsk:
    """Check every field this gateway honours; the first bad one is the 400."""
    ask = ResponsesAsk(model=body.get("model"))  # type: ignore[arg-type]  # checked by `models.agent_of`
    _Input(ask).read(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", "instructions")
    ask.instructions = instructions or ""
    ask.stream = bool(_bool(body, "stream"))
    ask.background = bool(_bool(body, "background"))
    store = _bool(body, "store")
    ask.store = True if store is None else store
    if ask.background and not ask.store:
        raise bad_request("a background response must be stored (store: true)", "background")
    ask.previous_response_id = _string(body.get("previous_response_id"), "previous_response_id", max_len=64)
    ask.conversation = _conversation(body.get("conversation"))
    if ask.previous_response_id and ask.conversation is not None:
        raise bad_request("previous_response_id and conversation cannot be used together", "conversation")
    ask.tools = _tools(body.get("tools"))
    ask.tool_choice = _tool_choice(body.get("tool_choice"), ask.tools)
    sampled = {
        "temperature": _number(body, "temperature", 0, 2),
        "top_p": _number(body, "top_p", 0, 1),
        "max_tokens": _int(body, "max_output_tokens", 1, 10_000_000),
        "parallel_tool_calls": _bool(body, "parallel_tool_calls"),
    }
    ask.params = {name: value for name, value in sampled.items() if value is not None}
    ask.reasoning_effort = _reasoning(body.get("reasoning"))
    ask.user = _string(body.get("user"), "user", max_len=256)
    ask.metadata = _metadata(body)
    return ask
