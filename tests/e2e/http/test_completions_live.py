"""Chat Completions against a real server with the official SDK (HTTP-API.md §14.2-14.4, §14.7):
models and aliases, whole and streamed answers, and that each request is a real run of the gateway."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator

import openai
import pytest

from chat.runtime.backends import scripted
from tests.e2e.http.support import Gateway, sse_data, sse_lines, start_gateway

pytestmark = pytest.mark.server

AGENTS = {"research": {"backend": "scripted", "model": "scripted", "models": ["scripted", "scripted-big"]}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("completions"), GATEWAY_AGENTS=json.dumps(AGENTS))
    yield gateway
    gateway.stop()


def session_runs(gw: Gateway, key: str) -> int:
    with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
        query = "SELECT count(*) FROM sessions_app_run r JOIN sessions_app_chatsession s ON r.session_id = s.id"
        return int(db.execute(f"{query} WHERE s.key = ?", (key,)).fetchone()[0])


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_models_are_the_agents_and_aliases_name_them(gw: Gateway) -> None:
    client = gw.sdk()
    listed = client.models.list().data
    assert [m.id for m in listed] == ["main", "research"]
    assert all(m.object == "model" and m.owned_by == "agentgate" for m in listed)
    for alias in ("research", "openclaw/research", "openclaw:research", "agent:research", "agentgate/research"):
        assert client.models.retrieve(alias).id == "research"
    assert client.models.retrieve("openclaw/default").id == "main"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("nobody")
    assert missing.value.body["code"] == "model_not_found"
    for model in ("openclaw", "openclaw/default", "agent:research"):
        answer = client.chat.completions.create(model=model, messages=user("alias"))
        assert answer.choices[0].message.content == "echo: alias"
        assert answer.model == model  # echoed as asked
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-nope", messages=user("x"))
    assert unknown.value.body["code"] == "model_not_found" and unknown.value.body["param"] == "model"


def test_model_header_picks_one_of_the_agents_models(gw: Gateway) -> None:
    client = gw.sdk()
    ok = client.chat.completions.create(
        model="research", messages=user("big"), extra_headers={"x-agentgate-model": "scripted-big"}
    )
    assert ok.choices[0].message.content == "echo: big"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="research", messages=user("x"), extra_headers={"x-openclaw-model": "gpt-4o"}
        )
    assert bad.value.body["param"] == "x-agentgate-model"


def test_whole_answer_with_run_headers_and_usage(gw: Gateway) -> None:
    raw = gw.sdk().chat.completions.with_raw_response.create(model="main", messages=user("hello there"))
    answer = raw.parse()
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "echo: hello there"
    assert answer.choices[0].finish_reason == "stop"
    assert (
        answer.usage is not None
        and answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    )
    assert raw.headers["x-agentgate-run-id"].startswith("http-")
    assert raw.headers["x-agentgate-session-key"].startswith("agent:main:api-")


def test_stream_sync_role_first_text_in_order_one_finish_then_done(gw: Gateway) -> None:
    stream = gw.sdk().chat.completions.create(
        model="main",
        messages=user("[[tick:5]] one two three four"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: one two three four"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({c.id for c in chunks}) == 1
    # as sent: data lines only, `[DONE]` last, no compression
    with gw.http() as http:
        answer = http.post("/v1/chat/completions", json={"model": "main", "messages": user("raw"), "stream": True})
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in answer.headers
    assert answer.headers["x-agentgate-run-id"]
    lines = sse_lines(answer.text)
    assert all(line.startswith(("data: ", ":")) for line in lines) and lines[-1] == "data: [DONE]"
    assert sum(1 for d in sse_data(answer.text) if d == "[DONE]") == 1


async def test_stream_async(gw: Gateway) -> None:
    client = gw.async_sdk()
    stream = await client.chat.completions.create(model="main", messages=user("async words"), stream=True)
    parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert "".join(parts) == "echo: async words"
    whole = await client.chat.completions.create(model="main", messages=user("async whole"))
    assert whole.choices[0].message.content == "echo: async whole"
    await client.close()


async def test_a_stateless_request_is_a_run_in_an_api_session_left_out_of_lists(gw: Gateway) -> None:
    raw = gw.sdk().chat.completions.with_raw_response.create(
        model="main",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "echo: earlier"},
            {"role": "user", "content": "the new one"},
        ],
    )
    key, run_id = raw.headers["x-agentgate-session-key"], raw.headers["x-agentgate-run-id"]
    async with gw.ws() as ws:
        default = await ws.ok("sessions.list", {})
        assert key not in [row["key"] for row in default["sessions"]]
        listed = await ws.ok("sessions.list", {"kinds": ["api"]})
        row = next(row for row in listed["sessions"] if row["key"] == key)
        assert row["kind"] == "api" and row["lastRunId"] == run_id and row["status"] == "done"
        both = await ws.ok("sessions.list", {"kinds": ["direct", "api"]})
        assert key in [row["key"] for row in both["sessions"]]
        bad = await ws.call("sessions.list", {"kinds": ["secret"]})
        assert bad["error"]["details"]["field"] == "kinds"
        history = await ws.ok("chat.history", {"sessionKey": key})
        texts = [(m["role"], m["content"][0]["text"]) for m in history["messages"]]
        assert texts == [("user", "the new one"), ("assistant", "echo: the new one")]
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 0})
        assert waited["status"] == "ok"


async def test_sessions_changed_of_api_sessions_go_only_to_who_subscribed_to_them(gw: Gateway) -> None:
    client = gw.async_sdk()
    async with gw.ws() as plain, gw.ws(subscribe=False) as watcher:
        await watcher.ok("sessions.subscribe", {"kinds": ["api"]})
        stateless = await client.chat.completions.with_raw_response.create(model="main", messages=user("a"))
        key = stateless.headers["x-agentgate-session-key"]
        seen = await watcher.wait_event(
            lambda e: e["event"] == "sessions.changed" and e["payload"]["sessionKey"] == key
        )
        assert seen["payload"]["session"]["kind"] == "api"
        header = {"x-agentgate-session-key": "for-plain"}
        await client.chat.completions.create(model="main", messages=user("b"), extra_headers=header)
        changed = lambda e: e["event"] == "sessions.changed"  # noqa: E731
        await plain.wait_event(lambda e: changed(e) and e["payload"]["sessionKey"] == "agent:main:for-plain")
        assert not [e for e in plain.events if changed(e) and e["payload"]["sessionKey"] == key]
        assert not [e for e in watcher.events if changed(e) and e["payload"]["sessionKey"] == "agent:main:for-plain"]
        for ws in (plain, watcher):  # read what is still coming, so the close handshake is not stuck behind it
            await ws.drain(0.1)
    await client.close()


async def test_named_session_by_header_continues_its_transcript(gw: Gateway) -> None:
    client = gw.sdk()
    header = {"x-agentgate-session-key": "notes"}
    first = client.chat.completions.with_raw_response.create(model="main", messages=user("first"), extra_headers=header)
    assert first.headers["x-agentgate-session-key"] == "agent:main:notes"
    # of the request's messages only the new input counts: the earlier ones are the session's already
    client.chat.completions.create(
        model="main",
        messages=[*user("ignored"), {"role": "assistant", "content": "ignored too"}, *user("second")],
        extra_headers={"x-openclaw-session-key": "agent:main:notes"},
    )
    research = client.chat.completions.with_raw_response.create(
        model="research", messages=user("r"), extra_headers=header
    )
    assert research.headers["x-agentgate-session-key"] == "agent:research:notes"
    with pytest.raises(openai.BadRequestError) as other_agent:
        client.chat.completions.create(
            model="main", messages=user("x"), extra_headers={"x-agentgate-session-key": "agent:research:notes"}
        )
    assert other_agent.value.body["param"] == "x-agentgate-session-key"
    async with gw.ws() as ws:
        history = await ws.ok("chat.history", {"sessionKey": "agent:main:notes"})
        assert [m["content"][0]["text"] for m in history["messages"]] == [
            "first",
            "echo: first",
            "second",
            "echo: second",
        ]
        listed = await ws.ok("sessions.list", {})
        assert {"agent:main:notes", "agent:research:notes"} <= {row["key"] for row in listed["sessions"]}


async def test_chat_abort_from_a_websocket_stops_an_http_stream(gw: Gateway) -> None:
    async with gw.async_http() as http, gw.ws() as ws:
        request = {"model": "main", "messages": user("[[words:400]] [[tick:20]]"), "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=request) as answer:
            key, run_id = answer.headers["x-agentgate-session-key"], answer.headers["x-agentgate-run-id"]
            events: list[str] = []
            lines = answer.aiter_lines()
            async for line in lines:
                events.append(line)
                if '"content":"echo:' in line:
                    break
            aborted = await ws.ok("chat.abort", {"sessionKey": key, "runId": run_id})
            assert aborted == {"aborted": True, "runIds": [run_id]}
            events += [line async for line in lines]
    data = sse_data("\n".join(events))
    assert data[-1] == "[DONE]"
    error = data[-2]["error"]
    assert "choices" not in data[-2]
    assert error["code"] == "run_aborted" and error["stopReason"] == "rpc"
    assert not any(isinstance(d, dict) and d.get("choices") and d["choices"][0]["finish_reason"] for d in data)


async def test_an_aborted_run_answers_409_run_aborted_without_a_stream(gw: Gateway) -> None:
    client = gw.async_sdk()
    pending = asyncio.ensure_future(
        client.chat.completions.with_raw_response.create(
            model="main", messages=user("[[hang]]"), extra_headers={"x-agentgate-session-key": "hung"}
        )
    )
    async with gw.ws() as ws:
        for _ in range(100):
            listed = await ws.ok("sessions.list", {"search": "hung"})
            if listed["sessions"] and listed["sessions"][0]["activeRunIds"]:
                break
            await asyncio.sleep(0.05)
        await ws.ok("chat.abort", {"sessionKey": "agent:main:hung"})
    with pytest.raises(openai.ConflictError) as conflict:
        await pending
    assert conflict.value.body["code"] == "run_aborted" and conflict.value.body["stopReason"] == "rpc"
    assert conflict.value.response.headers["x-agentgate-run-id"]
    await client.close()


async def test_the_sdks_own_retries_never_undo_an_abort_nor_run_a_failure_again(gw: Gateway) -> None:
    """409 run_aborted, 502 and 504 of a run that ran say `x-should-retry: false`, which the official SDKs
    honour: with their default retries on, an abort stays an abort and a failing request is one run."""
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys["alice"], timeout=30)  # max_retries=2
    header = {"x-agentgate-session-key": "no-retry"}
    pending = asyncio.ensure_future(
        client.chat.completions.create(model="main", messages=user("[[words:40]] [[tick:100]]"), extra_headers=header)
    )
    async with gw.ws() as ws:
        for _ in range(100):
            listed = await ws.ok("sessions.list", {"search": "no-retry"})
            if listed["sessions"] and listed["sessions"][0]["activeRunIds"]:
                break
            await asyncio.sleep(0.05)
        await ws.ok("chat.abort", {"sessionKey": "agent:main:no-retry"})
        with pytest.raises(openai.ConflictError) as conflict:
            await pending
        assert conflict.value.body["code"] == "run_aborted"
        assert conflict.value.response.headers["x-should-retry"] == "false"
        for failing in ("[[fail:dispatch]]", "[[fail:setup]]"):
            with pytest.raises(openai.InternalServerError) as failed:
                await client.chat.completions.create(model="main", messages=user(failing), extra_headers=header)
            assert failed.value.status_code == 502 and failed.value.response.headers["x-should-retry"] == "false"
    with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
        runs = db.execute(
            "SELECT r.message, r.state FROM sessions_app_run r JOIN sessions_app_chatsession s "
            "ON r.session_id = s.id WHERE s.key = ? ORDER BY r.id",
            ("agent:main:no-retry",),
        ).fetchall()
    assert runs == [
        ("[[words:40]] [[tick:100]]", "killed"),
        ("[[fail:dispatch]]", "failed"),
        ("[[fail:setup]]", "failed"),
    ]
    await client.close()


async def test_two_users_keys_are_isolated(gw: Gateway) -> None:
    alice, bob = gw.sdk("alice"), gw.sdk("bob")
    header = {"x-agentgate-session-key": "diary", "Idempotency-Key": "same-key-for-both"}
    mine = alice.chat.completions.with_raw_response.create(
        model="main", messages=user("alice's secret"), extra_headers=header
    )
    theirs = bob.chat.completions.with_raw_response.create(
        model="main", messages=user("bob's note"), extra_headers=header
    )
    assert theirs.parse().choices[0].message.content == "echo: bob's note"  # its own run, not alice's replayed
    assert theirs.headers.get("x-agentgate-idempotent-replay") is None
    assert mine.headers["x-agentgate-session-key"] == theirs.headers["x-agentgate-session-key"] == "agent:main:diary"
    async with gw.ws("bob") as ws:
        history = await ws.ok("chat.history", {"sessionKey": "agent:main:diary"})
        assert [m["content"][0]["text"] for m in history["messages"]] == ["bob's note", "echo: bob's note"]
        api = await ws.ok("sessions.list", {"kinds": ["direct", "api"]})
        assert all("alice" not in json.dumps(row) for row in api["sessions"])
        stateless = alice.chat.completions.with_raw_response.create(model="main", messages=user("alice alone"))
        other = await ws.call("agent.wait", {"runId": stateless.headers["x-agentgate-run-id"], "timeoutMs": 0})
        assert other["error"]["code"] == "NOT_FOUND"


def test_client_tool_named_like_an_agent_tool_is_a_400_that_says_how_out(gw: Gateway) -> None:
    tools = [{"type": "function", "function": {"name": "demo__clock", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as clash:
        gw.sdk().chat.completions.create(model="main", messages=user("x"), tools=tools)  # type: ignore[arg-type]
    body = clash.value.body
    assert body["param"] == "tools[0].function.name" and body["code"] == "tool_name_clash"
    assert "demo.clock" in body["message"] and "rename" in body["message"]
    fine = [{"type": "function", "function": {"name": "demo__elsewhere"}}]
    answer = gw.sdk().chat.completions.create(model="main", messages=user("fine"), tools=fine)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "echo: fine"


needs_client_tools = pytest.mark.skipif(
    not hasattr(scripted, "CLIENT_TOOL_RE"), reason="the scripted agent has no [[client_tool:...]] directive yet"
)
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@needs_client_tools
def test_what_a_request_adds_reaches_its_run(gw: Gateway) -> None:
    answer = gw.sdk().chat.completions.create(
        model="main",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "echo: earlier"},
            {"role": "developer", "content": [{"type": "text", "text": "use metric units"}]},
            {"role": "user", "content": "[[request]]"},
        ],
        temperature=0.2,
        top_p=0.9,
        max_completion_tokens=50,
        stop=["END"],
        seed=7,
        user="u-1",
        metadata={"app": "tests"},
        reasoning_effort="low",
        tools=WEATHER,  # type: ignore[arg-type]
        tool_choice="auto",
    )
    received = json.loads((answer.choices[0].message.content or "").removeprefix("echo: "))
    assert received["instructions"] == ["be brief", "use metric units"]
    assert received["contextCount"] == 2 and received["stateless"] is True
    assert received["params"] == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 50, "stop": ["END"], "seed": 7}
    assert received["clientTools"] == ["get_weather"] and received["toolChoice"] == "auto"
    assert received["user"] == "u-1" and received["metadata"] == {"app": "tests"}
    assert received["reasoningEffort"] == "low"


@needs_client_tools
def test_client_tool_calls_end_the_run_and_their_results_continue_a_stateless_chat(gw: Gateway) -> None:
    client = gw.sdk()
    ask = [{"role": "user", "content": 'look it up [[client_tool:get_weather {"city": "Oslo"}]]'}]
    first = client.chat.completions.create(model="main", messages=ask, tools=WEATHER)  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "echo: look it up"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    history = [
        *ask,
        {"role": "assistant", "content": choice.message.content, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    after = client.chat.completions.create(model="main", messages=history, tools=WEATHER)  # type: ignore[arg-type]
    assert after.choices[0].finish_reason == "stop"
    assert after.choices[0].message.content == "echo: tool get_weather returned sunny"
    stream = client.chat.completions.create(model="main", messages=ask, tools=WEATHER, stream=True)  # type: ignore[arg-type]
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name if tc.function else None) for tc in calls] == [(0, "get_weather")]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="main", messages=[*ask, {"role": "tool", "tool_call_id": "call_nobody", "content": "x"}]
        )
    assert unknown.value.body["param"] == "messages[1].tool_call_id"
    assert unknown.value.body["code"] == "unknown_tool_call_id"


@needs_client_tools
def test_tool_results_continue_a_named_session_where_only_its_calls_count(gw: Gateway) -> None:
    client = gw.sdk()
    header = {"x-agentgate-session-key": "weather"}
    ask = [{"role": "user", "content": '[[client_tool:get_weather {"city": "Rome"}]]'}]
    first = client.chat.completions.create(model="main", messages=ask, tools=WEATHER, extra_headers=header)  # type: ignore[arg-type]
    (call,) = first.choices[0].message.tool_calls or []
    result = [{"role": "tool", "tool_call_id": call.id, "content": "warm"}]
    keyed = {**header, "Idempotency-Key": "weather-result"}
    after = client.chat.completions.create(model="main", messages=result, tools=WEATHER, extra_headers=keyed)  # type: ignore[arg-type]
    assert after.choices[0].message.content == "echo: tool get_weather returned warm"
    # its retry under the same key (a lost answer) is that run's answer again, though the session
    # has moved on and no call waits for a result any more
    again = client.chat.completions.with_raw_response.create(
        model="main",
        messages=result,  # type: ignore[arg-type]
        tools=WEATHER,  # type: ignore[arg-type]
        extra_headers=keyed,
    )
    assert again.headers.get("x-agentgate-idempotent-replay") == "true"
    assert again.parse().choices[0].message.content == after.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="main", messages=[{"role": "tool", "tool_call_id": "tc_other", "content": "x"}], extra_headers=header
        )
    assert unknown.value.body["param"] == "messages[0].tool_call_id"
    # a call already answered is no longer waited for: its result again is refused, and nothing runs
    runs = session_runs(gw, "agent:main:weather")
    with pytest.raises(openai.BadRequestError) as answered:
        client.chat.completions.create(model="main", messages=result, tools=WEATHER, extra_headers=header)  # type: ignore[arg-type]
    assert answered.value.body["code"] == "unknown_tool_call_id"
    assert answered.value.body["param"] == "messages[0].tool_call_id"
    assert session_runs(gw, "agent:main:weather") == runs == 2


def test_a_failed_run_is_an_error_with_its_error_kind_whole_or_streamed(gw: Gateway) -> None:
    client = gw.sdk()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="main", messages=user("[[fail:setup]]"))
    assert refused.value.status_code == 502 and refused.value.body["code"] == "dispatch"
    assert refused.value.response.headers["x-agentgate-run-id"]
    with gw.http() as http:
        before_any_text = http.post(
            "/v1/chat/completions", json={"model": "main", "messages": user("[[fail:dispatch]]"), "stream": True}
        )
        mid_stream = http.post(
            "/v1/chat/completions", json={"model": "main", "messages": user("a b c [[fail:stream]]"), "stream": True}
        )
    assert before_any_text.status_code == 502 and before_any_text.json()["error"]["code"] == "dispatch"
    data = sse_data(mid_stream.text)
    assert mid_stream.status_code == 200 and data[-1] == "[DONE]"
    assert data[-2] == {"error": data[-2]["error"]} and data[-2]["error"]["code"] == "backend"
    assert "".join(d["choices"][0]["delta"].get("content") or "" for d in data[:-2]).startswith("echo:")
