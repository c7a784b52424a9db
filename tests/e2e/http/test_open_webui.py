"""What Open WebUI sends with an OpenAI connection pointed at `/v1`, replayed against a real server
(HTTP-API.md §14.8; observed from Open WebUI 0.12.4). Open WebUI itself is too heavy to install for
the suite, so its requests are rebuilt here as it makes them:

- the model list it reads (`GET /v1/models`, `data[].id`);
- every message, and every tool follow-up, a stateless streamed request carrying the whole chat and
  its ~36 built-in function tools (~25 KB), with no session header, Idempotency-Key, `user`,
  `stream_options` or `metadata`, and `Accept-Encoding: gzip` (aiohttp's default);
- Stop: the TCP connection closed about 0.06 s after the request, no cancel call; the partial text
  comes back as an assistant turn in the next request;
- old tool exchanges in the history, with call ids issued by earlier stateless runs;
- title generation: one more plain stateless request, not streamed;
- an in-stream error shown only when its chunk has no `choices`; a non-2xx answer's `error.message`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.http.support import Gateway, sse_data, sse_lines, start_gateway

pytestmark = pytest.mark.server

# Open WebUI's built-in tools as it offers them (names as in 0.12.x; a long description each, as there)
BUILTIN_TOOLS = [
    "search_web",
    "fetch_url",
    "get_current_timestamp",
    "calculate_timestamp",
    "search_notes",
    "view_note",
    "write_note",
    "replace_note_content",
    "search_memories",
    "add_memory",
    "replace_memory_content",
    "delete_memory",
    "list_memories",
    "list_knowledge_bases",
    "search_knowledge_bases",
    "query_knowledge_bases",
    "search_knowledge_files",
    "query_knowledge_files",
    "view_knowledge_file",
    "search_chats",
    "view_chat",
    "search_channels",
    "search_channel_messages",
    "view_channel_message",
    "view_channel_thread",
    "generate_image",
    "edit_image",
    "execute_code",
    "list_models",
    "get_model_info",
    "search_files",
    "view_file",
    "list_folders",
    "view_folder",
    "get_user_info",
    "get_current_weather",
]


def builtin_tools() -> list[dict[str, Any]]:
    tools = []
    for name in BUILTIN_TOOLS:
        words = name.replace("_", " ")
        properties = {
            "query": {"type": "string", "description": f"What to {words} for; plain words, no operators."},
            "count": {"type": "integer", "description": "How many results at most (1 to 50).", "default": 5},
            "id": {"type": "string", "description": "The id of one item, as an earlier result gave it."},
        }
        description = (
            f"Use this tool to {words}. Call it when the user asks for it or when the answer needs it; "
            "pass only what the user gave or an earlier result returned, never a guess. The result is "
            "JSON: read it, then answer the user in their own language, citing what you used. "
        )
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {"type": "object", "properties": properties, "required": ["query"]},
                },
            }
        )
    return tools


TOOLS = builtin_tools()
TITLE_PROMPT = (
    "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
    '### Output:\nJSON format: { "title": "your concise title here" }\n'
    "### Chat History:\n<chat_history>\nUSER: {user}\nASSISTANT: {assistant}\n</chat_history>"
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("open-webui"))
    yield gateway
    gateway.stop()


def chat_request(messages: list[dict[str, Any]], *, stream: bool = True) -> dict[str, Any]:
    """A request as Open WebUI builds it: the whole chat, its tools, nothing of ours."""
    return {"model": "main", "messages": messages, "stream": stream, "tools": TOOLS}


def headers(gw: Gateway) -> dict[str, str]:
    return {
        "authorization": f"Bearer {gw.keys['alice']}",
        "content-type": "application/json",
        "accept-encoding": "gzip, deflate",
    }


def text_of(data: list[Any]) -> str:
    return "".join(
        d["choices"][0]["delta"].get("content") or "" for d in data if isinstance(d, dict) and d.get("choices")
    )


async def post(gw: Gateway, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    async with gw.async_http(None) as http:
        answer = await http.post("/v1/chat/completions", json=body, headers=headers(gw))
    return answer.status_code, dict(answer.headers), answer.text


def test_the_model_list_names_the_agents(gw: Gateway) -> None:
    with gw.http(None) as http:
        listed = http.get("/v1/models", headers={"authorization": f"Bearer {gw.keys['alice']}"}).json()
    assert [model["id"] for model in listed["data"]] == ["main"]


async def test_each_message_is_a_stateless_streamed_run_of_its_own(gw: Gateway) -> None:
    assert 20_000 < len(json.dumps(TOOLS)) < 30_000 and len(TOOLS) == 36
    first = [{"role": "user", "content": "[[request]] hello"}]
    status, head, body = await post(gw, chat_request(first))
    assert status == 200 and head["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in head  # never compressed, whatever the client accepts
    data = sse_data(body)
    assert data[-1] == "[DONE]"
    seen = json.loads(text_of(data).removeprefix("echo:").strip())
    assert seen["stateless"] is True and seen["contextCount"] == 0 and seen["user"] == ""
    assert seen["clientTools"] == BUILTIN_TOOLS  # all 36, offered beside the agent's own
    second = [*first, {"role": "assistant", "content": text_of(data)}, {"role": "user", "content": "again"}]
    status, head2, body2 = await post(gw, chat_request(second))
    assert status == 200 and text_of(sse_data(body2)) == "echo: again"
    keys = [head["x-agentgate-session-key"], head2["x-agentgate-session-key"]]
    assert keys[0] != keys[1] and all(key.startswith("agent:main:api-") for key in keys)
    async with gw.ws() as ws:
        listed = await ws.ok("sessions.list", {})
        assert not set(keys) & {row["key"] for row in listed["sessions"]}  # out of the page's list
        api = await ws.ok("sessions.list", {"kinds": ["api"]})
        assert set(keys) <= {row["key"] for row in api["sessions"]}
        history = await ws.ok("chat.history", {"sessionKey": keys[1]})
        # the session holds its own turn: the chat before it was the run's context
        assert [m["content"][0]["text"] for m in history["messages"]] == ["again", "echo: again"]


async def read_head(reader: asyncio.StreamReader, deadline: float) -> dict[str, str]:
    """The answer's headers, if they come before `deadline` (monotonic)."""
    found: dict[str, str] = {}
    with_timeout = max(0.0, deadline - time.monotonic())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), with_timeout)
    except (TimeoutError, asyncio.IncompleteReadError):
        return found
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return found


async def test_stop_is_a_closed_connection_and_ends_the_run_within_a_second(gw: Gateway) -> None:
    chat = [{"role": "user", "content": "[[words:400]] [[tick:20]] a long answer"}]
    payload = json.dumps(chat_request(chat)).encode()
    url = urlparse(gw.server.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    request = [f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"]
    request += [f"{k}: {v}\r\n" for k, v in headers(gw).items()]
    request += [f"content-length: {len(payload)}\r\n\r\n"]
    started = time.monotonic()
    writer.write("".join(request).encode() + payload)
    await writer.drain()
    head = await read_head(reader, started + 5)
    await asyncio.sleep(max(0.0, started + 0.06 - time.monotonic()))  # the click on Stop
    writer.close()
    closed = time.time()
    run_id, key = head["x-agentgate-run-id"], head["x-agentgate-session-key"]
    async with gw.ws() as ws:
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 5000})
        assert waited["aborted"] is True and waited["stopReason"] == "disconnect"
        assert waited["endedAt"] - closed * 1000 < 1000
        history = await ws.ok("chat.history", {"sessionKey": key})
    replies = [m["content"][0]["text"] for m in history["messages"] if m["role"] == "assistant"]
    kept = replies[-1] if replies else ""  # stopped this early, the run may have stored no text yet
    assert len(kept.split()) < 100  # stopped: not 400 words
    # the partial answer comes back as an assistant turn in the next request
    follow = [*chat, {"role": "assistant", "content": kept}, {"role": "user", "content": "go on"}]
    status, _head, body = await post(gw, chat_request(follow))
    assert status == 200 and text_of(sse_data(body)) == "echo: go on"


async def test_old_tool_exchanges_are_matched_within_their_request(gw: Gateway) -> None:
    weather_call = {
        "id": "call_owui_earlier_1",  # issued by an earlier stateless run: not the gateway's to know
        "type": "function",
        "function": {"name": "get_current_weather", "arguments": '{"query": "Paris"}'},
    }
    chat = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "call_owui_earlier_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "[[request]] thanks"},
    ]
    status, _head, body = await post(gw, chat_request(chat))
    assert status == 200
    seen = json.loads(text_of(sse_data(body)).removeprefix("echo:").strip())
    assert seen["contextCount"] == 4
    # the follow-up of a tool call: the results after the last assistant message are the new input
    follow = [*chat[:2], chat[2]]
    status, _head, body = await post(gw, chat_request(follow))
    assert status == 200
    assert text_of(sse_data(body)) == 'echo: tool get_current_weather returned {"temp": 21}'
    # a tool result answering no call of its own request is the only 400, and it says which
    orphan = [chat[0], {"role": "tool", "tool_call_id": "call_nowhere", "content": "{}"}, *chat[3:]]
    status, head, body = await post(gw, chat_request(orphan))
    error = json.loads(body)["error"]
    assert status == 400 and head["content-type"] == "application/json"
    assert error["code"] == "unknown_tool_call_id" and error["param"] == "messages[1].tool_call_id"
    assert "call_nowhere" in error["message"]  # what Open WebUI shows of a non-2xx answer


async def test_title_generation_is_an_ordinary_stateless_run(gw: Gateway) -> None:
    prompt = TITLE_PROMPT.replace("{user}", "hello").replace("{assistant}", "echo: hello")
    status, head, body = await post(
        gw, {"model": "main", "messages": [{"role": "user", "content": prompt}], "stream": False}
    )
    answer = json.loads(body)
    assert status == 200 and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"].startswith("echo: ### Task:")
    async with gw.ws() as ws:
        listed = await ws.ok("sessions.list", {})
        assert head["x-agentgate-session-key"] not in {row["key"] for row in listed["sessions"]}
        waited = await ws.ok("agent.wait", {"runId": head["x-agentgate-run-id"], "timeoutMs": 0})
        assert waited["status"] == "ok"


async def test_a_failure_after_text_is_an_error_chunk_without_choices(gw: Gateway) -> None:
    chat = [{"role": "user", "content": "[[tick:150]] [[fail:stream]] some words here"}]
    status, _head, body = await post(gw, chat_request(chat))
    assert status == 200
    lines = [line for line in sse_lines(body) if not line.startswith(":")]  # keep-alive comments skipped
    data = sse_data(body)
    assert text_of(data).startswith("echo:")
    assert data[-1] == "[DONE]" and lines[-1] == "data: [DONE]"
    ending = data[-2]
    assert "choices" not in ending and ending["error"]["message"]  # shown as the chat's error
    assert ending["error"]["code"] == "backend"
    # refused before the run started: a non-2xx JSON answer, whose error.message Open WebUI shows
    status, head, body = await post(gw, chat_request([{"role": "user", "content": "[[fail:setup]] x"}]))
    assert status == 502 and head["content-type"] == "application/json"
    assert "refused the run" in json.loads(body)["error"]["message"]
