"""HTTP runs with the `openai` backend (HTTP-API.md §14.3-14.5): what a request brings reaches the model.

A run's request (`Run.request`) is attached at admission (tests/support/run_requests.py); the rest is the
real path — the consumer, the executor, the backend, the lifecycle — against the fake model server, which
records every request it gets (and can answer with what it got: `Reply(echo=True)`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.runtime.backends.openai import request_options
from sessions_app.models import ChatSession, Run, SessionKind, ToolCall
from sessions_app.run_requests import ClientTool, RunRequest, ToolResult
from tests.support.communicator import Client, open_client
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.run_requests import HttpRuns
from tests.support.tools import TOOL_CONNECT, tool_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

KEY = "agent:llm:chat"
WEATHER = ClientTool("get_weather", "The weather in a city", {"type": "object", "properties": {"city": {}}})


@pytest.fixture
def use_agent(settings: Any, fake: FakeOpenAI, tmp_path: Path) -> Any:
    """Agent `llm`: the fake model, with no tools of its own unless asked (`demo=True`: the demo MCP server)."""

    def configure(*, demo: bool = False, **overrides: Any) -> dict[str, Any]:
        if demo:
            notes = {"AGENTGATE_NOTES_DIR": str(tmp_path)}
            overrides["mcp_servers"] = {"demo": {**settings.DEMO_MCP_SERVER, "env": notes}}
            overrides.setdefault("approval", {"*": "never"})
        config = agent_config(fake, **overrides)
        settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": config}
        return config

    configure()
    return configure


@pytest.fixture
async def tool_client(alice: tuple[Any, str], use_agent: Any) -> AsyncIterator[Client]:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


async def turn(client: Client, run_id: str, message: str = "hello", timeout: float = 30) -> dict[str, Any]:
    """One send and its terminal `chat` event (the first send with tools starts the MCP server)."""
    await client.ok("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id}, timeout)
    return await client.wait_terminal(run_id, timeout=timeout)


def reply_text(final: dict[str, Any]) -> str:
    content = final["message"]["content"]
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


@database_sync_to_async
def calls_of(run_id: str) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run__run_id=run_id, run__session__key=KEY).order_by("seq"))


@database_sync_to_async
def run_row(run_id: str) -> Run:
    return Run.objects.get(run_id=run_id, session__key=KEY)


# --- instructions, context, parameters, model --------------------------------------------------------------


async def test_instructions_are_added_to_the_agents_system_prompt(tool_client, fake, use_agent, http_runs: HttpRuns):
    use_agent(system_prompt="You are terse.")
    http_runs.add("r1", RunRequest(instructions=["Answer in French.", "Use no lists."]))
    assert (await turn(tool_client, "r1", "hi"))["state"] == "final"
    assert fake.requests[0].messages == [
        {"role": "system", "content": "You are terse.\n\nAnswer in French.\n\nUse no lists."},
        {"role": "user", "content": "hi"},
    ]


async def test_a_stateless_requests_context_replaces_the_transcript(tool_client, fake, http_runs: HttpRuns):
    assert (await turn(tool_client, "r0", "something said on the page"))["state"] == "final"
    context = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": "4"},
    ]
    http_runs.add("r1", RunRequest(context=context))
    fake.push(Reply(echo=True))
    final = await turn(tool_client, "r1", "and 3+3?")
    received = json.loads(reply_text(final))
    # the session's transcript ("something said on the page") is not the context: the request's messages are
    assert received["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ]


async def test_a_stateless_request_of_one_message_never_sends_its_sessions_transcript(tool_client, fake, http_runs):
    await turn(tool_client, "r0", "first")
    http_runs.add("r1", RunRequest(stateless=True))  # no context: the request had only its new message
    await turn(tool_client, "r1", "second")
    assert fake.requests[1].messages == [{"role": "user", "content": "second"}]


async def test_a_continued_api_session_sends_the_first_requests_context_then_every_turn(
    tool_client, fake, alice, http_runs: HttpRuns
):
    """A chain (or the session header) onto a stateless request's session: the model gets the messages that
    request brought, then each run's input and reply, then the new input (HTTP-API.md §14.3)."""
    await database_sync_to_async(ChatSession.objects.create)(owner=alice[0], key=KEY, agent_id="llm", kind="api")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    context = [
        {"role": "user", "content": "I am Zed."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny, Zed."},
    ]
    http_runs.add("r1", RunRequest(context=context, instructions=["Be brief."], stateless=True))
    fake.push(Reply(chunks=["Noted."]))
    await turn(tool_client, "r1", "remember that")
    http_runs.add("r2", RunRequest())  # continues the session: no context of its own
    fake.push(Reply(echo=True))
    received = json.loads(reply_text(await turn(tool_client, "r2", "what is my name?")))
    assert received["messages"] == [
        *context,
        {"role": "user", "content": "remember that"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "what is my name?"},
    ]  # the first run's instructions were that run's alone
    session = await database_sync_to_async(ChatSession.objects.get)(key=KEY)
    assert session.kind == SessionKind.API


async def test_sampling_parameters_pass_and_win_over_the_agents(tool_client, fake, use_agent, http_runs: HttpRuns):
    use_agent(temperature=0.9, max_tokens=500)
    params = {
        "temperature": 0.1,
        "top_p": 0.5,
        "max_completion_tokens": 64,
        "stop": ["\n\n"],
        "seed": 7,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "parallel_tool_calls": False,  # no tools offered: not sent (servers refuse it alone)
        "logit_bias": {"1": 5},  # not a parameter the gateway passes on
    }
    http_runs.add("r1", RunRequest(params=params))
    await turn(tool_client, "r1")
    body = fake.requests[0].body
    passed = {k: v for k, v in params.items() if k not in ("parallel_tool_calls", "logit_bias")}
    assert {k: body.get(k) for k in passed} == passed
    assert "max_tokens" not in body and "parallel_tool_calls" not in body and "logit_bias" not in body

    http_runs.add("r2", RunRequest(params={"parallel_tool_calls": False}, client_tools=[WEATHER]))
    await turn(tool_client, "r2")
    body = fake.requests[1].body
    assert body["parallel_tool_calls"] is False and body["temperature"] == 0.9 and body["max_tokens"] == 500


async def test_a_request_picks_a_listed_model_and_a_reasoning_effort(tool_client, fake, use_agent, http_runs):
    use_agent(models=["fake-model", "fake-large"])
    http_runs.add("r1", RunRequest(model="fake-large", reasoning_effort="low"))
    http_runs.add("r2", RunRequest(model="not-listed"))
    await turn(tool_client, "r1")
    await turn(tool_client, "r2")
    await turn(tool_client, "r3")  # a chat.send: the session's own settings, untouched by the requests
    first, second, third = (r.body for r in fake.requests)
    assert (first["model"], first.get("reasoning_effort")) == ("fake-large", "low")
    assert (second["model"], second.get("reasoning_effort")) == ("fake-model", None)
    assert (third["model"], third.get("reasoning_effort")) == ("fake-model", None)


# --- client function tools -------------------------------------------------------------------------------


async def test_a_client_tool_call_ends_the_run_done_and_is_handed_over(tool_client, fake, use_agent, http_runs):
    use_agent(demo=True)
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    args = json.dumps({"city": "Paris"})
    fake.push(tool_reply(ToolCallReply("get_weather", args, id="call_w"), chunks=["Let me", " check."]))
    final = await turn(tool_client, "r1", "weather in Paris?")
    assert final["state"] == "final" and final["stopReason"] == "tool_calls", final
    assert reply_text(final) == "Let me check."  # the text so far is kept

    first = fake.requests[0]
    assert first.tool_names == ["demo__clock", "demo__calculate", "demo__add_note", "demo__list_notes", "get_weather"]
    weather = first.body["tools"][-1]["function"]
    assert weather == {"name": "get_weather", "description": WEATHER.description, "parameters": WEATHER.parameters}
    assert len(fake.requests) == 1  # the model is not asked again: the client runs the call

    (call,) = await calls_of("r1")
    assert (call.state, call.model_call_id, call.server, call.tool, call.arguments) == (
        "client",
        "call_w",
        "",
        "get_weather",
        args,
    )
    assert (call.result, call.is_error, call.started_at) == ("", False, None)  # never run here
    assert call.reply_offset == len("Let me check.")
    run = await run_row("r1")
    assert (run.state, run.stop_reason, run.reply, run.tool_calls) == ("done", "tool_calls", "Let me check.", 1)

    start, result = tool_events(tool_client, "r1")
    assert (start["phase"], start["name"], start["args"]) == ("start", "get_weather", {"city": "Paris"})
    assert (result["phase"], result["status"], result["isError"]) == ("result", "client", False)
    history = await tool_client.ok("chat.history", {"sessionKey": KEY})
    tool_result = history["messages"][-1]
    assert (tool_result["role"], tool_result["toolCallId"], tool_result["status"]) == (
        "toolResult",
        call.call_id,
        "client",
    )


async def test_tool_results_continue_a_named_session(tool_client, fake, http_runs: HttpRuns):
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    fake.push(tool_reply(ToolCallReply("get_weather", '{"city": "Oslo"}', id="call_w"), chunks=["Checking."]))
    assert (await turn(tool_client, "r1", "weather in Oslo?"))["stopReason"] == "tool_calls"
    (handed,) = await calls_of("r1")

    # the next request brings only the result (named by the id the model gave the call)
    http_runs.add(
        "r2", RunRequest(client_tools=[WEATHER], tool_results=[ToolResult("call_w", "-3 °C, snow")]), message=""
    )
    fake.push(Reply(chunks=["Cold:", " -3 °C."]))
    final = await turn(tool_client, "r2", "(results)")
    assert final["state"] == "final" and final["stopReason"] == "stop" and reply_text(final) == "Cold: -3 °C."
    call = {
        "id": handed.call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert fake.requests[1].messages == [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": handed.call_id, "content": "-3 °C, snow"},
    ]

    # a later turn still shows the model the call with the result the client sent
    fake.push(Reply(echo=True))
    received = json.loads(reply_text(await turn(tool_client, "r3", "thanks")))
    assert received["messages"] == [
        *fake.requests[1].messages,
        {"role": "assistant", "content": "Cold: -3 °C."},
        {"role": "user", "content": "thanks"},
    ]


async def test_a_stateless_continuation_answers_the_calls_in_its_own_context(tool_client, fake, http_runs):
    context = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
    ]
    http_runs.add("r1", RunRequest(context=context, tool_results=[ToolResult("c1", "sunny")]), message="")
    fake.push(Reply(echo=True))
    received = json.loads(reply_text(await turn(tool_client, "r1")))
    assert received["messages"] == [*context, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


async def test_a_forced_tool_choice_holds_for_the_first_step_only(tool_client, fake, use_agent, http_runs: HttpRuns):
    use_agent(demo=True)
    http_runs.add("r1", RunRequest(client_tools=[WEATHER], tool_choice="required"))
    fake.push(
        tool_reply(ToolCallReply("demo__calculate", '{"expression": "6*7"}', id="call_c")),
        Reply(chunks=["42."]),
    )
    final = await turn(tool_client, "r1", "6*7?")
    assert final["state"] == "final" and reply_text(final) == "42."
    assert [r.tool_choice for r in fake.requests] == ["required", "auto"]  # forced again, it would loop

    http_runs.add("r2", RunRequest(client_tools=[WEATHER], tool_choice={"name": "demo__clock"}))
    http_runs.add("r3", RunRequest(client_tools=[WEATHER], tool_choice="none"))
    fake.push(tool_reply(ToolCallReply("demo__clock", "{}", id="call_t")), Reply(chunks=["Noon."]))
    await turn(tool_client, "r2")
    fake.push(Reply(chunks=["No tools."]), Reply(chunks=["x"]))
    await turn(tool_client, "r3")
    named = {"type": "function", "function": {"name": "demo__clock"}}
    assert [r.tool_choice for r in fake.requests[2:]] == [named, "auto", "none"]


async def test_a_mixed_step_runs_the_agents_calls_and_hands_over_the_clients(tool_client, fake, use_agent, http_runs):
    use_agent(demo=True)
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    fake.push(
        tool_reply(
            ToolCallReply("demo__calculate", '{"expression": "2+2"}', id="call_c"),
            ToolCallReply("get_weather", '{"city": "Rome"}', id="call_w"),
        )
    )
    final = await turn(tool_client, "r1", "2+2 and the weather in Rome?")
    assert final["state"] == "final" and final["stopReason"] == "tool_calls"
    assert len(fake.requests) == 1
    own, handed = await calls_of("r1")
    assert (own.tool, own.state, own.result) == ("calculate", "succeeded", "2+2 = 4")
    assert (handed.tool, handed.state, handed.model_call_id) == ("get_weather", "client", "call_w")

    # the client answers with the gateway's own id for its call: the model sees both results of the step
    http_runs.add(
        "r2", RunRequest(client_tools=[WEATHER], tool_results=[ToolResult(handed.call_id, "warm")]), message=""
    )
    fake.push(Reply(chunks=["4, and warm."]))
    assert reply_text(await turn(tool_client, "r2")) == "4, and warm."
    sent = fake.requests[1].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["function"]["name"] for c in sent[1]["tool_calls"]] == ["demo__calculate", "get_weather"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:]] == [(own.call_id, "2+2 = 4"), (handed.call_id, "warm")]


async def test_a_call_the_client_never_answered_is_told_so(tool_client, fake, http_runs: HttpRuns):
    http_runs.add("r1", RunRequest(client_tools=[WEATHER]))
    fake.push(tool_reply(ToolCallReply("get_weather", "{}", id="call_w")))
    assert (await turn(tool_client, "r1", "weather?"))["stopReason"] == "tool_calls"
    (handed,) = await calls_of("r1")
    await turn(tool_client, "r2", "never mind")  # a plain chat.send: no results
    tool = fake.requests[1].messages[2]
    assert tool["role"] == "tool" and tool["tool_call_id"] == handed.call_id and "sent none" in tool["content"]


def test_tool_choice_and_sampling_in_openais_terms():
    named = RunRequest(tool_choice={"type": "function", "function": {"name": "f"}})  # OpenAI's own shape
    assert request_options.tool_choice(named, 1) == {"type": "function", "function": {"name": "f"}}
    assert request_options.tool_choice(named, 2) == "auto"
    assert request_options.tool_choice(RunRequest(tool_choice="auto"), 3) == "auto"
    assert request_options.tool_choice(RunRequest(), 1) is None
    asked = RunRequest(params={"seed": 0, "top_p": None, "parallel_tool_calls": True})
    assert request_options.sampling(asked, with_tools=False) == {"seed": 0}
    assert request_options.sampling(asked, with_tools=True) == {"seed": 0, "parallel_tool_calls": True}
