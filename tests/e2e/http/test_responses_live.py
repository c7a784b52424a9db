"""The Responses API against a real server with the official SDK (HTTP-API.md §14.5, §14.6): shapes,
streams (order, numbering, one terminal, no `[DONE]`), resuming a stream from any event, background
responses, cancel, delete, input items, chains, idempotent retries and isolation between two keys."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.http.support import Gateway, start_gateway
from tests.support.servers import ROOT

pytestmark = pytest.mark.server

# the scripted agent's client tool directive comes with the run side of client tools
CLIENT_TOOLS = "client_tool" in (ROOT / "chat/runtime/backends/scripted.py").read_text()
TERMINALS = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
TERMINAL = {"completed", "incomplete", "failed", "cancelled"}  # a response's status once it ended


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("responses")
    gateway = start_gateway(tmp, AGENTGATE_NOTES_DIR=str(tmp / "notes"))
    yield gateway
    gateway.stop()


def db_rows(gw: Gateway, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
        return db.execute(sql, params).fetchall()


def run_of(gw: Gateway, response_id: str) -> tuple[str, str, str]:
    """The state, stopReason and session key of a response's run, as stored."""
    rows = db_rows(
        gw,
        "SELECT r.state, r.stop_reason, s.key FROM sessions_app_apiresponse a "
        "JOIN sessions_app_run r ON a.run_id = r.id JOIN sessions_app_chatsession s ON r.session_id = s.id "
        "WHERE a.response_id = ?",
        response_id,
    )
    assert rows, response_id
    return rows[0]


def raw_events(gw: Gateway, body: dict[str, Any], who: str = "alice", **headers: str) -> tuple[list[str], list[Any]]:
    """A streamed POST as sent: its `event:` names and its `data:` payloads (decoded)."""
    names, data = [], []
    with gw.http(who, **headers) as http, http.stream("POST", "/v1/responses", json={**body, "stream": True}) as got:
        assert got.status_code == 200, got.read()
        assert got.headers["content-type"].startswith("text/event-stream")
        for line in got.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                data.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return names, data


def dumped(events: Any) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", exclude_unset=True) for e in events]


def wait_status(client: openai.OpenAI, response_id: str, statuses: set[str], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = client.responses.retrieve(response_id)
        if found.status in statuses or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_response_is_its_run_answered(gw: Gateway) -> None:
    raw = gw.sdk().responses.with_raw_response.create(model="main", input="hello there", metadata={"k": "v"})
    got = raw.parse()
    assert got.id.startswith("resp_") and len(got.id) == 5 + 32
    assert (got.object, got.status, got.model, got.metadata) == ("response", "completed", "main", {"k": "v"})
    assert got.output_text == "echo: hello there"
    assert [item.type for item in got.output] == ["message"]
    assert got.output[0].status == "completed" and got.output[0].role == "assistant"
    assert got.usage is not None and got.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens
    assert got.error is None and got.background is False and got.previous_response_id is None
    assert raw.headers["x-agentgate-session-key"].startswith("agent:main:api-")
    state, _stop, key = run_of(gw, got.id)
    assert (state, key) == ("done", raw.headers["x-agentgate-session-key"])
    assert gw.sdk().responses.retrieve(got.id).model_dump() == got.model_dump()


def test_a_stream_is_numbered_in_order_with_one_terminal_and_no_done(gw: Gateway) -> None:
    names, data = raw_events(gw, {"model": "main", "input": "one two three [[tick:20]]"})
    assert "[DONE]" not in data
    assert names == [d["type"] for d in data]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert [n for n in names if n in TERMINALS] == ["response.completed"] and names[-1] == "response.completed"
    deltas = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    assert deltas == "echo: one two three" == data[-1]["response"]["output"][0]["content"][0]["text"]
    # the SDK reads the same stream, and its helper puts the response together from it
    with gw.sdk().responses.stream(model="main", input="one two three") as stream:
        final = stream.get_final_response()
    assert final.output_text == "echo: one two three" and final.status == "completed"


def test_a_resumed_stream_replays_the_same_events(gw: Gateway) -> None:
    client = gw.sdk()
    first = dumped(client.responses.create(model="main", input="a b c d e f [[tick:30]]", stream=True))
    response_id = first[0]["response"]["id"]
    assert dumped(client.responses.retrieve(response_id, stream=True)) == first
    for after in (0, 3, len(first) - 2):
        assert dumped(client.responses.retrieve(response_id, stream=True, starting_after=after)) == first[after + 1 :]
    # every stream ends with the response's one terminal event: resumed after it, that event again
    assert dumped(client.responses.retrieve(response_id, stream=True, starting_after=len(first) - 1)) == first[-1:]
    with pytest.raises(openai.BadRequestError) as past:  # a number past the end of an ended response names no event
        client.responses.retrieve(response_id, stream=True, starting_after=len(first))
    assert past.value.body["param"] == "starting_after"


def test_a_stream_resumed_past_the_end_of_a_running_response_ends_with_its_terminal(gw: Gateway) -> None:
    client = gw.sdk()
    got = client.responses.create(model="main", input="short [[delay:500]]", background=True)
    resumed = dumped(client.responses.retrieve(got.id, stream=True, starting_after=500))
    assert [e["type"] for e in resumed] == ["response.completed"] and resumed[0]["sequence_number"] < 500
    assert resumed == dumped(client.responses.retrieve(got.id, stream=True))[-1:]


def test_a_background_response_answers_at_once_and_its_stream_resumes_live(gw: Gateway) -> None:
    client = gw.sdk()
    started = time.monotonic()
    got = client.responses.create(model="main", input="slow words [[words:6]] [[tick:300]]", background=True)
    assert time.monotonic() - started < 1.5
    assert got.background is True and got.status in ("queued", "in_progress") and got.output == []
    live = client.responses.retrieve(got.id, stream=True, starting_after=1)
    resumed = dumped(live)
    assert resumed[0]["sequence_number"] == 2 and resumed[-1]["type"] == "response.completed"
    whole = dumped(client.responses.retrieve(got.id, stream=True))
    assert whole[2:] == resumed
    assert client.responses.retrieve(got.id).output_text == "echo: word1 word2 word3 word4 word5 word6"


def test_a_background_stream_whose_client_leaves_goes_on(gw: Gateway) -> None:
    body = {"model": "main", "input": "on and on [[words:5]] [[tick:200]]", "background": True, "stream": True}
    with gw.http() as http, http.stream("POST", "/v1/responses", json=body) as got:
        lines = got.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
    response_id = first["response"]["id"]
    done = wait_status(gw.sdk(), response_id, {"completed", "cancelled", "failed"})
    assert done.status == "completed" and done.output_text.endswith("word5")


def test_a_stream_whose_client_leaves_without_a_key_aborts_its_run(gw: Gateway) -> None:
    body = {"model": "main", "input": "long [[words:60]] [[tick:200]]", "stream": True}
    with gw.http() as http, http.stream("POST", "/v1/responses", json=body) as got:
        first = json.loads(next(line for line in got.iter_lines() if line.startswith("data: "))[6:])
    left = time.monotonic()
    response_id = first["response"]["id"]
    while run_of(gw, response_id)[0] != "killed" and time.monotonic() - left < 3:
        time.sleep(0.02)
    assert run_of(gw, response_id)[:2] == ("killed", "disconnect")
    assert time.monotonic() - left < 1.5
    assert gw.sdk().responses.retrieve(response_id).status == "cancelled"


def test_cancel_aborts_the_run_and_an_ended_response_is_answered_unchanged(gw: Gateway) -> None:
    client = gw.sdk()
    got = client.responses.create(model="main", input="wait [[hang]]", background=True)
    assert wait_status(client, got.id, {"in_progress"}).status == "in_progress"
    cancelled = client.responses.cancel(got.id)
    assert cancelled.status == "cancelled" and cancelled.id == got.id
    assert cancelled.error is not None and cancelled.error.code == "run_aborted"
    assert run_of(gw, got.id)[:2] == ("killed", "cancel")
    assert client.responses.cancel(got.id).model_dump() == cancelled.model_dump()
    events = dumped(client.responses.retrieve(got.id, stream=True))
    assert [e["type"] for e in events if e["type"] in TERMINALS] == ["response.cancelled"]
    finished = wait_status(client, client.responses.create(model="main", input="quick", background=True).id, TERMINAL)
    assert finished.status == "completed"
    assert client.responses.cancel(finished.id).model_dump() == finished.model_dump()
    # only a background response is cancelled (as OpenAI's): another's run ends with its own request
    foreground = client.responses.create(model="main", input="mine")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(foreground.id)
    assert refused.value.body["code"] == "not_background"


def test_delete_forgets_the_response_and_keeps_its_run(gw: Gateway) -> None:
    client = gw.sdk()
    got = client.responses.create(model="main", input="forget me")
    state, _stop, key = run_of(gw, got.id)
    assert client.responses.delete(got.id) is None
    for call in (
        lambda: client.responses.retrieve(got.id),
        lambda: client.responses.delete(got.id),
        lambda: client.responses.cancel(got.id),
        lambda: client.responses.input_items.list(got.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert db_rows(
        gw,
        "SELECT r.state FROM sessions_app_run r JOIN sessions_app_chatsession s ON r.session_id = s.id WHERE s.key = ?",
        key,
    ) == [(state,)]


def test_input_items_are_listed_as_given(gw: Gateway) -> None:
    client = gw.sdk()
    got = client.responses.create(
        model="main",
        input=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
            {"type": "message", "role": "assistant", "content": "said"},
            {"role": "user", "content": "last"},
        ],
        instructions="and kind",
    )
    assert got.output_text == "echo: last"
    assert got.instructions == "and kind\n\nbe brief"  # what the run was given: instructions, then developer's
    listed = client.responses.input_items.list(got.id)
    assert [(i.type, i.role) for i in listed.data] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
        ("message", "developer"),
    ]
    assert listed.data[0].content[0].text == "last"
    ascending = client.responses.input_items.list(got.id, order="asc", limit=2)
    assert [i.role for i in ascending.data] == ["developer", "user"] and ascending.has_more
    rest = client.responses.input_items.list(got.id, order="asc", after=ascending.last_id)
    assert [i.role for i in rest.data] == ["assistant", "user"] and not rest.has_more


def test_previous_response_id_continues_its_session(gw: Gateway) -> None:
    client = gw.sdk()
    first = client.responses.with_raw_response.create(model="main", input="first turn")
    second = client.responses.with_raw_response.create(
        model="main", input="second turn", previous_response_id=first.parse().id
    )
    key = first.headers["x-agentgate-session-key"]
    assert second.headers["x-agentgate-session-key"] == key
    assert second.parse().previous_response_id == first.parse().id
    texts = db_rows(
        gw,
        "SELECT m.role, m.text FROM sessions_app_message m JOIN sessions_app_chatsession s "
        "ON m.session_id = s.id WHERE s.key = ? ORDER BY m.id",
        key,
    )
    assert texts == [
        ("user", "first turn"),
        ("assistant", "echo: first turn"),
        ("user", "second turn"),
        ("assistant", "echo: second turn"),
    ]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="main", input="x", previous_response_id="resp_" + "0" * 32)
    assert unknown.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="main", input="not kept", store=False)
    assert unstored.store is False and unstored.output_text == "echo: not kept"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="main", input="x", previous_response_id=unstored.id)


def test_conversation_names_a_session(gw: Gateway) -> None:
    client = gw.sdk()
    raw = client.responses.with_raw_response.create(model="main", input="in a named one", conversation="notes")
    assert raw.headers["x-agentgate-session-key"] == "agent:main:notes"
    again = client.responses.with_raw_response.create(model="main", input="again", conversation={"id": "notes"})
    assert again.headers["x-agentgate-session-key"] == "agent:main:notes"


def test_a_retry_under_its_key_is_the_same_response(gw: Gateway) -> None:
    client = gw.sdk()
    key = {"Idempotency-Key": f"resp-retry-{time.monotonic_ns()}"}
    first = client.responses.with_raw_response.create(model="main", input="once", extra_headers=key)
    again = client.responses.with_raw_response.create(model="main", input="once", extra_headers=key)
    assert again.parse().id == first.parse().id and again.parse().output_text == "echo: once"
    assert again.headers["x-agentgate-idempotent-replay"] == "true"
    assert again.headers["x-agentgate-run-id"] == first.headers["x-agentgate-run-id"]
    names, data = raw_events(gw, {"model": "main", "input": "once"}, **key)
    assert data[0]["response"]["id"] == first.parse().id and names[-1] == "response.completed"
    with pytest.raises(openai.ConflictError):
        client.responses.create(model="main", input="another", extra_headers=key)
    assert db_rows(gw, "SELECT count(*) FROM sessions_app_run WHERE run_id = ?", key["Idempotency-Key"]) == [(1,)]


def test_another_users_responses_are_not_found(gw: Gateway) -> None:
    mine = gw.sdk("alice").responses.create(model="main", input="mine", background=True)
    theirs = gw.sdk("bob")
    for call in (
        lambda: theirs.responses.retrieve(mine.id),
        lambda: theirs.responses.retrieve(mine.id, stream=True),
        lambda: theirs.responses.cancel(mine.id),
        lambda: theirs.responses.delete(mine.id),
        lambda: theirs.responses.input_items.list(mine.id),
        lambda: theirs.responses.create(model="main", input="x", previous_response_id=mine.id),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "mine" not in json.dumps(missing.value.body)
    assert wait_status(gw.sdk("alice"), mine.id, {"completed"}).output_text == "echo: mine"


def test_bad_requests_name_their_field_and_change_nothing(gw: Gateway) -> None:
    client = gw.sdk()
    before = db_rows(gw, "SELECT count(*) FROM sessions_app_run")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "x", "background": True, "store": False}, "background"),
        ({"input": [{"type": "computer_call_output"}]}, "input[0].type"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"input": []}, "input"),
        ({"input": "x", "temperature": 9}, "temperature"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": "x", "reasoning": {"effort": []}}, "reasoning.effort"),
        ({"input": "x", "conversation": {}}, "conversation"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
        ({"input": "x", "previous_response_id": "resp_1", "conversation": "c"}, "conversation"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "input[0].call_id"),
        (
            {"input": [{"type": "mcp_approval_response", "approval_request_id": "ap_1", "approve": True}]},
            "previous_response_id",
        ),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model="main", **extra)
        assert bad.value.status_code == 400 and bad.value.body["param"] == param, (extra, bad.value.body)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="gpt-nope", input="x")
    assert unknown.value.body["code"] == "model_not_found"
    with gw.http() as http:
        assert http.get("/v1/responses/resp_x", params={"stream": "maybe"}).status_code == 400
        assert http.get("/v1/responses/resp_x", params={"starting_after": "x", "stream": "true"}).status_code == 400
    assert db_rows(gw, "SELECT count(*) FROM sessions_app_run") == before


@pytest.mark.skipif(not CLIENT_TOOLS, reason="the scripted agent has no [[client_tool:...]] directive yet (run side)")
def test_client_function_tools_are_function_calls_and_their_outputs_continue(gw: Gateway) -> None:
    client = gw.sdk()
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    first = client.responses.create(
        model="main", input='weather [[client_tool:get_weather {"city": "Oslo"}]]', tools=tools
    )
    assert first.status == "completed"
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    keyed = {"Idempotency-Key": "oslo-output"}
    second = client.responses.create(
        model="main", previous_response_id=first.id, input=output, tools=tools, extra_headers=keyed
    )
    assert second.status == "completed" and "sunny" in second.output_text
    # its retry under the same key is the same response, though no call waits for that output now
    # and the response it continued is gone
    client.responses.delete(first.id)
    again = client.responses.create(
        model="main", previous_response_id=first.id, input=output, tools=tools, extra_headers=keyed
    )
    assert (again.id, again.output_text) == (second.id, second.output_text)
    wrong = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="main", previous_response_id=second.id, input=wrong, tools=tools)
    assert bad.value.body["param"] == "input[0].call_id"


async def test_chat_abort_from_a_websocket_cancels_a_streamed_response_seen_in_history(gw: Gateway) -> None:
    async with gw.async_http() as http, gw.ws() as ws:
        body = {"model": "main", "input": "[[words:400]] [[tick:20]]", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as answer:
            key, run_id = answer.headers["x-agentgate-session-key"], answer.headers["x-agentgate-run-id"]
            seen: list[dict[str, Any]] = []
            lines = answer.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["type"] == "response.in_progress":
                        break
            assert await ws.ok("chat.abort", {"sessionKey": key, "runId": run_id}) == {
                "aborted": True,
                "runIds": [run_id],
            }
            seen += [json.loads(line[6:]) async for line in lines if line.startswith("data: ")]
        history = await ws.ok("chat.history", {"sessionKey": key})
    assert [e["type"] for e in seen if e["type"] in TERMINALS] == ["response.cancelled"]
    assert seen[-1]["response"]["error"]["stop_reason"] == "rpc"
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    # the same run, in the session's history
    assert [m["role"] for m in history["messages"] if m["__openclaw"].get("runId") == run_id][:1] == ["user"]


async def test_a_keyed_stream_left_midway_is_reattached_by_its_retry_exactly_once(gw: Gateway) -> None:
    key = {"Idempotency-Key": f"resp-reattach-{time.monotonic_ns()}"}
    body = {"model": "main", "input": "again [[words:30]] [[tick:30]]", "stream": True}
    async with gw.async_http(**key) as http:
        async with http.stream("POST", "/v1/responses", json=body) as first:
            lines = first.aiter_lines()
            head = [json.loads(line[6:]) async for line in _take(lines, 4)]
        async with http.stream("POST", "/v1/responses", json=body) as retry:
            assert retry.headers.get("x-agentgate-idempotent-replay") is None  # reattached while it ran
            whole = [json.loads(line[6:]) async for line in retry.aiter_lines() if line.startswith("data: ")]
    assert whole[: len(head)] == head  # the answer so far, then the live rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert [e["type"] for e in whole if e["type"] in TERMINALS] == ["response.completed"]
    assert whole[-1]["response"]["output"][0]["content"][0]["text"].endswith("word30")
    assert db_rows(gw, "SELECT count(*) FROM sessions_app_run WHERE run_id = ?", key["Idempotency-Key"]) == [(1,)]


async def _take(lines: Any, count: int) -> Any:
    """The first `count` data lines of a stream."""
    async for line in lines:
        if line.startswith("data: "):
            yield line
            count -= 1
            if not count:
                return
