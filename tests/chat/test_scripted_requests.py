"""The scripted agent's side of HTTP runs (docs/protocol-notes.md, "The scripted agent"): `[[request]]`
says what a run received, `[[client_tool:NAME {json}]]` hands a call to the API client, and a request's
tool results are echoed. The request is attached at admission (tests/support/run_requests.py); the
consumer, executor and lifecycle are the real ones."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from sessions_app.models import Run, ToolCall
from sessions_app.run_requests import ClientTool, RunRequest, ToolResult
from tests.support.communicator import Client, open_client
from tests.support.run_requests import HttpRuns
from tests.support.tools import TOOL_CONNECT, tool_events

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "agent:main:api"
WEATHER = ClientTool("get_weather", "The weather", {"type": "object"})


@pytest.fixture
async def tool_client(alice: tuple[Any, str]) -> AsyncIterator[Client]:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


async def turn(client: Client, run_id: str, message: str) -> dict[str, Any]:
    await client.ok("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id})
    return await client.wait_terminal(run_id)


def text_of(final: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in final["message"]["content"] if b.get("type") == "text")


@database_sync_to_async
def calls_of(run_id: str) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run__run_id=run_id).order_by("seq"))


async def test_request_directive_summarises_what_the_run_received(tool_client, http_runs: HttpRuns, settings):
    settings.GATEWAY_AGENTS = {"main": {"backend": "scripted", "models": ["scripted", "scripted-2"]}}
    request = RunRequest(
        instructions=["Be brief.", "No lists."],
        context=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        params={"temperature": 0.2, "seed": 3},
        client_tools=[WEATHER],
        tool_choice={"name": "get_weather"},
        model="scripted-2",
        reasoning_effort="high",
        user="u-42",
        metadata={"trace": "t1"},
    )
    http_runs.add("r1", request)
    final = await turn(tool_client, "r1", "[[request]] [[tick:0]]")
    assert final["state"] == "final"
    assert json.loads(text_of(final)) == {
        "instructionCount": 2,
        "instructions": ["Be brief.", "No lists."],
        "contextCount": 2,
        "stateless": True,
        "params": {"temperature": 0.2, "seed": 3},
        "clientTools": ["get_weather"],
        "toolChoice": {"name": "get_weather"},
        "toolResults": [],
        "model": "scripted-2",
        "reasoningEffort": "high",
        "user": "u-42",
        "metadata": {"trace": "t1"},
    }
    # a chat.send receives nothing of the kind
    plain = json.loads(text_of(await turn(tool_client, "r2", "[[request]]")))
    assert (plain["instructionCount"], plain["clientTools"], plain["stateless"], plain["model"]) == (0, [], False, "")


async def test_client_tool_directive_hands_the_call_over_and_ends_the_run(tool_client, http_runs: HttpRuns):
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    final = await turn(tool_client, "r1", 'checking [[client_tool:get_weather {"city": "Oslo"}]]')
    assert final["state"] == "final" and final["stopReason"] == "tool_calls" and text_of(final) == "echo: checking"
    (call,) = await calls_of("r1")
    assert (call.state, call.tool, call.arguments, call.step) == ("client", "get_weather", '{"city": "Oslo"}', 1)
    assert call.model_call_id.startswith("call_") and call.reply_offset == len("echo: checking")
    run = await database_sync_to_async(Run.objects.get)(run_id="r1")
    assert (run.state, run.stop_reason, run.surface) == ("done", "tool_calls", "http")
    # each delta's boundary was kept with it: the last is the whole reply
    assert run.marks and run.marks == sorted(set(run.marks)) and run.marks[-1] == len(run.reply)
    assert [(d["phase"], d.get("status")) for d in tool_events(tool_client, "r1")] == [
        ("start", None),
        ("result", "client"),
    ]
    history = await tool_client.ok("chat.history", {"sessionKey": KEY})
    assistant, tool_result = history["messages"][-2:]
    assert [b["type"] for b in assistant["content"]] == ["text", "toolCall"]
    assert (tool_result["role"], tool_result["status"], tool_result["isError"]) == ("toolResult", "client", False)


async def test_a_client_tool_the_request_did_not_offer_is_not_called(tool_client, http_runs: HttpRuns):
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    final = await turn(tool_client, "r1", "hi [[client_tool:launch {}]]")
    assert final["stopReason"] == "stop" and text_of(final) == "echo: hi (client tool launch was not offered)"
    # a chat.send offers none
    final = await turn(tool_client, "r2", "[[client_tool:get_weather]]")
    assert text_of(final) == "echo: (client tool get_weather was not offered)"
    assert await calls_of("r1") == [] and await calls_of("r2") == []


async def test_tool_results_are_echoed_with_the_names_of_their_calls(tool_client, http_runs: HttpRuns):
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    await turn(tool_client, "r1", "[[client_tool:get_weather {}]] [[client_tool:get_weather {}]]")
    first, second = await calls_of("r1")
    # named by the model's id and by the gateway's (a client may know either); an unknown id stays an id
    results = [ToolResult(first.model_call_id, "sunny"), ToolResult(second.call_id, "rain"), ToolResult("x9", "?")]
    http_runs.add("r2", RunRequest(tool_results=results), message="")
    final = await turn(tool_client, "r2", "(results)")
    expected = "echo: tool get_weather returned sunny; tool get_weather returned rain; tool x9 returned ?"
    assert final["stopReason"] == "stop" and text_of(final) == expected

    # a stateless request names its calls in its own context
    context = [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup"}}]},
    ]
    http_runs.add("r3", RunRequest(context=context, tool_results=[ToolResult("c1", "found")]), message="")
    assert text_of(await turn(tool_client, "r3", "(results)")) == "echo: tool lookup returned found"
