"""Property test: no value of any field the HTTP API reads is a 500 (HTTP-API.md §14.1 "500 never for
bad input"). A valid request of each endpoint has one of its fields (top-level or nested: a message, a
content part, an input item, a tool) replaced by a random JSON value, or left out, and is sent through
the ASGI app in-process with the real database and runtime; a request that is still valid runs (the
scripted agent answers at once). The answer is never a 5xx but for a run's own end (502/504, with its
run), and a 400 names the field it refuses."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat.httpapi.app import HttpApi

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

IMAGE = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
COMPLETION: dict[str, Any] = {
    "model": "main",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": IMAGE}}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", **TOOL, "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "and now?"},
    ],
    "stream": False,
    "stream_options": {"include_usage": True},
    "tools": [TOOL],
    "tool_choice": "auto",
    "max_completion_tokens": 100,
    "max_tokens": 100,
    "temperature": 0.5,
    "top_p": 0.9,
    "stop": ["\n\n"],
    "seed": 1,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "user": "u1",
    "metadata": {"k": "v"},
    "parallel_tool_calls": True,
    "reasoning_effort": "low",
    "n": 1,
}
COMPLETION_PATHS = [
    *([k] for k in COMPLETION),
    ["messages", 0],
    ["messages", 1, "content"],
    ["messages", 1, "content", 0],
    ["messages", 1, "content", 0, "text"],
    ["messages", 1, "content", 1, "image_url"],
    ["messages", 1, "content", 1, "image_url", "url"],
    ["messages", 1, "role"],
    ["messages", 2, "content"],
    ["messages", 2, "tool_calls"],
    ["messages", 2, "tool_calls", 0],
    ["messages", 2, "tool_calls", 0, "id"],
    ["messages", 2, "tool_calls", 0, "function"],
    ["messages", 2, "tool_calls", 0, "function", "arguments"],
    ["messages", 3, "tool_call_id"],
    ["messages", 3, "content"],
    ["messages", 4, "content"],
    ["stream_options", "include_usage"],
    ["tools", 0],
    ["tools", 0, "type"],
    ["tools", 0, "function"],
    ["tools", 0, "function", "name"],
    ["tools", 0, "function", "description"],
    ["tools", 0, "function", "parameters"],
]
RESPONSE: dict[str, Any] = {
    "model": "main",
    "input": [
        {"type": "message", "role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": IMAGE}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "and now?"},
    ],
    "instructions": "Answer.",
    "stream": False,
    "background": False,
    "store": True,
    "previous_response_id": None,
    "conversation": None,
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "max_output_tokens": 100,
    "temperature": 0.5,
    "top_p": 0.9,
    "metadata": {"k": "v"},
    "user": "u1",
    "reasoning": {"effort": "low"},
    "parallel_tool_calls": True,
}
RESPONSE_PATHS = [
    *([k] for k in RESPONSE),
    ["input", 0],
    ["input", 0, "role"],
    ["input", 0, "content"],
    ["input", 1, "content"],
    ["input", 1, "content", 0],
    ["input", 1, "content", 0, "text"],
    ["input", 1, "content", 1, "image_url"],
    ["input", 1, "content", 1, "type"],
    ["input", 2, "call_id"],
    ["input", 2, "name"],
    ["input", 2, "arguments"],
    ["input", 3, "call_id"],
    ["input", 3, "output"],
    ["input", 4],
    ["input", 4, "type"],
    ["input", 4, "id"],
    ["tools", 0],
    ["tools", 0, "name"],
    ["tools", 0, "parameters"],
    ["tools", 0, "description"],
    ["reasoning", "effort"],
    ["conversation", "id"],
]
HEADERS = ["x-agentgate-session-key", "x-agentgate-model", "idempotency-key"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["", "main", "auto", "none", "required", "user", "text", "input_text", "function", "high"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MISSING = object()  # the field left out


def _has(parent: Any, key: Any) -> bool:
    """Whether `parent[key]` can be read or set (a dict, or a list long enough for an int key)."""
    return isinstance(parent, dict) or (isinstance(parent, list) and isinstance(key, int) and key < len(parent))


def changed(base: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    """`base` with the field at `path` set to `value` (or removed), when its parent is still there."""
    body = copy.deepcopy(base)
    parent: Any = body
    for step in path[:-1]:
        inside = parent[step] if _has(parent, step) and (isinstance(parent, list) or step in parent) else None
        parent = inside if isinstance(inside, dict | list) else {}
    last = path[-1]
    if not _has(parent, last):
        return body
    if value is not MISSING:
        parent[last] = value
    elif isinstance(parent, list) or last in parent:
        parent.pop(last)
    return body


def edits(paths: list[list[Any]]) -> st.SearchStrategy[list[tuple[list[Any], Any]]]:
    one = st.tuples(st.sampled_from(paths), st.one_of(values, st.just(MISSING)))
    return st.lists(one, min_size=1, max_size=3)


header_values = st.one_of(
    st.sampled_from(["fuzz", "agent:main:fuzz", "agent:ghost:x", "scripted", "k-1"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
)
headers = st.dictionaries(st.sampled_from(HEADERS), header_values, max_size=2)


async def post(path: str, token: str, body: dict[str, Any], extra: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One POST through the app; its status, headers and whole body."""
    raw = json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": raw, "more_body": False})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            inbox.put_nowait({"type": "http.disconnect"})  # the client goes once the answer is whole

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            *((k.encode(), v.encode()) for k, v in extra.items()),
        ],
    }
    await asyncio.wait_for(HttpApi(inner)(scope, inbox.get, send), 30)
    start = sent[0]
    return (
        start["status"],
        {k.decode(): v.decode() for k, v in start["headers"]},
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:  # pragma: no cover - never reached
    raise AssertionError("only /v1/ is asked")


def check(status: int, answer_headers: dict[str, str], body: bytes, asked: Any) -> None:
    assert status != 500 and status != 503, (status, body[:300], asked)
    if status >= 500:
        assert status in (502, 504) and "x-agentgate-run-id" in answer_headers, (status, body[:300], asked)
    if status == 400:
        error = json.loads(body)["error"]
        assert error["param"], (error, asked)


@pytest.fixture
def fast(settings: Any) -> None:
    settings.GATEWAY_RATE_PER_SEC = 100_000
    settings.GATEWAY_RATE_BURST = 100_000


@hsettings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=edits(COMPLETION_PATHS), extra=headers)
async def test_no_value_of_a_chat_completions_field_is_a_500(alice, fast, changes, extra) -> None:
    body = COMPLETION
    for path, value in changes:
        body = changed(body, path, value)
    status, answer_headers, answer = await post("/v1/chat/completions", alice[1], body, extra)
    check(status, answer_headers, answer, (changes, extra))


@hsettings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=edits(RESPONSE_PATHS), extra=headers)
async def test_no_value_of_a_responses_field_is_a_500(alice, fast, changes, extra) -> None:
    body = RESPONSE
    for path, value in changes:
        body = changed(body, path, value)
    status, answer_headers, answer = await post("/v1/responses", alice[1], body, extra)
    check(status, answer_headers, answer, (changes, extra))
