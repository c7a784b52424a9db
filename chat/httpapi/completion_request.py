"""A Chat Completions request read and checked field by field (HTTP-API.md §14.4): a known field
with a bad value is a 400 naming it; unknown fields are ignored; a null is the same as absent."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from chat.base.agents import THINKING_LEVELS
from chat.httpapi.errors import bad_request
from sessions_app.run_requests import ClientTool

FUNCTION_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CLIENT_TOOLS = 128
MAX_STOP = 4
# OpenAI's reasoning efforts as the session thinking levels they stand for
EFFORTS = {"none": "off", **{level: level for level in THINKING_LEVELS if level != "off"}}


@dataclass
class CompletionRequest:
    """What a request asks, checked; `messages` still raw (the conversation module reads them)."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    tools: list[ClientTool] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = ""
    params: dict[str, Any] = field(default_factory=dict)  # sampling parameters, as the model API names them
    reasoning_effort: str = ""
    user: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"{name} must be a number from {lo:g} to {hi:g}", name)
    return value


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer from {lo} to {hi}", name)
    return value


def _bool(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _stop(body: dict[str, Any]) -> list[str] | None:
    value = body.get("stop")
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP or not all(isinstance(s, str) for s in stops):
        raise bad_request(f"stop must be a string or a list of 1 to {MAX_STOP} strings", "stop")
    return stops


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    value = body.get("metadata")
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise bad_request("metadata must be an object of at most 16 string values", "metadata")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > 512:
            raise bad_request("metadata keys are at most 64 characters, values strings of at most 512", "metadata")
    return dict(value)


def parse_tools(value: Any, param: str = "tools") -> list[ClientTool]:
    """Client function tools (`[{"type": "function", "function": {name, description?, parameters?}}]`)."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_CLIENT_TOOLS:
        raise bad_request(f"{param} must be a list of at most {MAX_CLIENT_TOOLS} tools", param)
    tools: list[ClientTool] = []
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(item.get("function"), dict):
            raise bad_request("only function tools are supported: {type: 'function', function: {...}}", where)
        function = item["function"]
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME_RE.fullmatch(name):
            raise bad_request("a function name is 1 to 64 of a-z, A-Z, 0-9, _ and -", f"{where}.function.name")
        if any(tool.name == name for tool in tools):
            raise bad_request(f"two tools are named {name!r}", f"{where}.function.name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request("description must be a string", f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request("parameters must be a JSON Schema object", f"{where}.function.parameters")
        tools.append(ClientTool(name, description or "", parameters or {}))
    return tools


def parse_tool_choice(value: Any, tools: list[ClientTool], param: str = "tool_choice") -> str | dict[str, Any]:
    """`none` | `auto` | `required` | a named function of `tools`; "" when not given."""
    if value is None:
        return ""
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise bad_request("tool_choice 'required' needs tools", param)
        return str(value)
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            "tool_choice must be 'none', 'auto', 'required' or {type: 'function', function: {name}}", param
        )
    if not any(tool.name == name for tool in tools):
        raise bad_request(f"tool_choice names {name!r}, which is not one of the request's tools", param)
    return {"name": name}


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters given, as the model API names them."""
    tokens = _int(body, "max_completion_tokens", 1, 10_000_000)
    legacy = _int(body, "max_tokens", 1, 10_000_000)
    found: dict[str, Any] = {
        "temperature": _number(body, "temperature", 0, 2),
        "top_p": _number(body, "top_p", 0, 1),
        "max_tokens": tokens if tokens is not None else legacy,
        "stop": _stop(body),
        "seed": _int(body, "seed", -(2**63), 2**63 - 1),
        "presence_penalty": _number(body, "presence_penalty", -2, 2),
        "frequency_penalty": _number(body, "frequency_penalty", -2, 2),
        "parallel_tool_calls": _bool(body, "parallel_tool_calls"),
    }
    return {name: value for name, value in found.items() if value is not None}


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    """Check every field this gateway honours; the first bad one is the 400."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    n = _int(body, "n", 1, 128)
    if n is not None and n > 1:
        raise bad_request("n > 1 is not supported: each request is one run with one answer", "n")
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)
    ):
        raise bad_request("stream_options must be an object; include_usage a boolean", "stream_options")
    effort = body.get("reasoning_effort")
    if effort is not None and (not isinstance(effort, str) or effort not in EFFORTS):
        raise bad_request(f"reasoning_effort must be one of {', '.join(EFFORTS)}", "reasoning_effort")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise bad_request("user must be a string of at most 256 characters", "user")
    tools = parse_tools(body.get("tools"))
    return CompletionRequest(
        model=body.get("model"),  # type: ignore[arg-type]  # checked by `models.agent_of`
        messages=messages,
        stream=bool(_bool(body, "stream")),
        include_usage=bool((options or {}).get("include_usage", False)),
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        params=_sampling(body),
        reasoning_effort=EFFORTS.get(effort, "") if effort is not None else "",
        user=user or "",
        metadata=_metadata(body),
    )
