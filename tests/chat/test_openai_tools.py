"""§13 with the `openai` backend: a model (the fake server) calling MCP tools, through the real consumer.

The model is `tests/support/fake_openai.py`, streaming `delta.tool_calls` fragments as OpenAI does;
the tools are real MCP servers: the built-in demo server, and the test server for a slow tool.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.runtime.tools.pool import pool
from sessions_app.models import Run, ToolCall
from tests.support.communicator import Client, open_client
from tests.support.db import open_tool_calls
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, results, tool_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

KEY = "agent:llm:chat"


@pytest.fixture
def use_agent(settings: Any, fake: FakeOpenAI, tmp_path: Path) -> Any:
    """Agent `llm`: the fake model, with the demo MCP server (notes in a temporary directory)."""

    def configure(**overrides: Any) -> dict[str, Any]:
        demo = {**settings.DEMO_MCP_SERVER, "env": {"AGENTGATE_NOTES_DIR": str(tmp_path)}}
        overrides.setdefault("mcp_servers", {"demo": demo})
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


async def send(client: Client, run_id: str, message: str) -> dict[str, Any]:
    # The first send of a test starts the MCP server before its ack: allow for a slow machine.
    return await client.ok("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id}, 30)


def result_text(event: dict[str, Any]) -> str:
    return str(event["result"]["content"][0]["text"])


def reply_text(final: dict[str, Any]) -> str:
    return str(final["message"]["content"][0]["text"])


@database_sync_to_async
def calls_of(run_id: str) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run__run_id=run_id).order_by("seq"))


@database_sync_to_async
def run_row(run_id: str) -> Run:
    return Run.objects.get(run_id=run_id, session__key=KEY)


def calc(expression: str, call_id: str = "call_a", pieces: int = 4) -> ToolCallReply:
    return ToolCallReply("demo__calculate", json.dumps({"expression": expression}), id=call_id, pieces=pieces)


# --- one step of calls, then the answer -----------------------------------------------------------------


async def test_a_call_streamed_in_pieces_runs_once_and_the_model_gets_its_result(tool_client, fake):
    args = json.dumps({"expression": "6*7"})
    fake.push(
        tool_reply(
            ToolCallReply("demo__calculate", args, id="call_a", pieces=5),
            chunks=["Let me", " work it out."],
            usage={"prompt_tokens": 20, "completion_tokens": 9},
        ),
        Reply(chunks=["It is", " 42."], usage={"prompt_tokens": 40, "completion_tokens": 4}),
    )
    assert (await send(tool_client, "r1", "what is 6*7?"))["status"] == "started"
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and final["stopReason"] == "stop", final
    assert reply_text(final) == "Let me work it out.\n\nIt is 42."  # a new paragraph after the tool

    start, result = tool_events(tool_client, "r1")
    assert start["phase"] == "start" and start["name"] == "demo.calculate" and start["args"] == {"expression": "6*7"}
    assert result["toolCallId"] == start["toolCallId"] and result["status"] == "succeeded" and not result["isError"]
    assert result_text(result) == "6*7 = 42"

    first, second = fake.requests
    assert first.tool_names == ["demo__clock", "demo__calculate", "demo__add_note", "demo__list_notes"]
    calculate = next(t for t in first.body["tools"] if t["function"]["name"] == "demo__calculate")
    assert calculate["type"] == "function" and "expression" in calculate["function"]["parameters"]["properties"]
    assert second.tool_names == first.tool_names  # every request offers the tools
    assert second.messages == [
        {"role": "user", "content": "what is 6*7?"},
        {
            "role": "assistant",
            "content": "Let me work it out.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "demo__calculate", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "6*7 = 42"},
    ]

    (call,) = await calls_of("r1")
    assert (call.call_id, call.model_call_id, call.state, call.step) == (start["toolCallId"], "call_a", "succeeded", 1)
    assert call.reply_offset == len("Let me work it out.")
    run = await run_row("r1")
    assert (run.reply, run.prompt_tokens, run.completion_tokens) == ("Let me work it out.\n\nIt is 42.", 60, 13)
    history = await tool_client.ok("chat.history", {"sessionKey": KEY})
    assert [m["role"] for m in history["messages"]] == ["user", "assistant", "toolResult"]


async def test_two_parallel_calls_are_recorded_in_order_and_both_answered(tool_client, fake):
    fake.push(
        tool_reply(calc("1+1", "call_x", pieces=3), calc("2*3", "call_y", pieces=3)),
        Reply(chunks=["2 and 6."]),
    )
    await send(tool_client, "r1", "two sums")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and reply_text(final) == "2 and 6."  # no text before the tools: no break

    starts = [d for d in tool_events(tool_client, "r1") if d["phase"] == "start"]
    assert [s["args"] for s in starts] == [{"expression": "1+1"}, {"expression": "2*3"}]
    done = results(tool_client, "r1")
    assert [r["toolCallId"] for r in done] == [s["toolCallId"] for s in starts]
    assert [result_text(r) for r in done] == ["1+1 = 2", "2*3 = 6"]
    rows = await calls_of("r1")
    assert [(c.model_call_id, c.state, c.step) for c in rows] == [
        ("call_x", "succeeded", 1),
        ("call_y", "succeeded", 1),
    ]

    assistant, *tool_messages = fake.requests[1].messages[1:]
    assert assistant["content"] is None
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_x", "call_y"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "call_x", "content": "1+1 = 2"},
        {"role": "tool", "tool_call_id": "call_y", "content": "2*3 = 6"},
    ]


# --- calls that fail before reaching a server ----------------------------------------------------------


async def test_bad_json_arguments_fail_the_call_and_the_model_is_told(tool_client, fake):
    fake.push(
        tool_reply(ToolCallReply("demo__calculate", '{"expression": "1+', id="call_bad", pieces=3)),
        Reply(chunks=["Sorry, let me retry later."]),
    )
    await send(tool_client, "r1", "compute")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and reply_text(final) == "Sorry, let me retry later."
    (result,) = results(tool_client, "r1")
    assert result["status"] == "failed" and result["isError"]
    assert "not valid JSON" in result_text(result)
    (row,) = await calls_of("r1")
    assert row.started_at is None  # never ran: it never reached a server

    assistant, tool = fake.requests[1].messages[1:]
    # The broken arguments are not sent back: servers refuse a history whose call arguments do not parse.
    assert assistant["tool_calls"][0]["function"] == {"name": "demo__calculate", "arguments": "{}"}
    assert tool["tool_call_id"] == "call_bad" and "not valid JSON" in tool["content"]


async def test_an_unknown_function_fails_as_unknown_tool_and_the_run_goes_on(tool_client, fake):
    fake.push(tool_reply(ToolCallReply("demo__nope", "{}", id="call_n")), Reply(chunks=["No such tool."]))
    await send(tool_client, "r1", "use nope")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and reply_text(final) == "No such tool."
    (result,) = results(tool_client, "r1")
    assert result["status"] == "failed" and "unknown tool" in result_text(result)
    assert fake.requests[1].messages[-1]["tool_call_id"] == "call_n"
    assert "unknown tool" in fake.requests[1].messages[-1]["content"]


# --- limits ---------------------------------------------------------------------------------------------


async def test_a_model_that_keeps_calling_stops_at_max_steps_as_tool_limit(tool_client, fake, use_agent):
    use_agent(max_steps=3)
    fake.default = tool_reply(calc("1+2", "call_same"))  # the same id every step, as some servers do
    await send(tool_client, "r1", "loop")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and final["stopReason"] == "tool_limit", final
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 3  # max_steps model calls, and no more
    assert [r["status"] for r in results(tool_client, "r1")] == ["succeeded"] * 3
    rows = await calls_of("r1")
    assert [c.step for c in rows] == [1, 2, 3]
    # Each step's call has an id of its own in the conversation sent back.
    third = fake.requests[2].messages
    ids = [c["id"] for m in third if m["role"] == "assistant" for c in m["tool_calls"]]
    assert len(ids) == 2 and len(set(ids)) == 2 and ids[0] == "call_same"
    assert [m["tool_call_id"] for m in third if m["role"] == "tool"] == ids
    assert (await run_row("r1")).stop_reason == "tool_limit"


async def test_max_tool_calls_ends_the_run_as_tool_limit(tool_client, fake, use_agent):
    use_agent(max_tool_calls=1)
    fake.push(tool_reply(calc("1+1", "call_1"), calc("2+2", "call_2")))
    await send(tool_client, "r1", "two")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and final["stopReason"] == "tool_limit"
    assert [r["status"] for r in results(tool_client, "r1")] == ["succeeded", "failed"]
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 1


# --- retries never run a call twice ----------------------------------------------------------------------


async def test_a_step_cut_after_its_call_fragments_is_retried_and_the_call_runs_once(tool_client, fake):
    fake.push(
        tool_reply(calc("5*5", "call_cut"), drop_before_finish=True),  # no finish: the call never runs
        tool_reply(calc("5*5", "call_ok")),
        Reply(status=503),  # the next step's first attempt fails, and is retried
        Reply(chunks=["25."]),
    )
    await send(tool_client, "r1", "square")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and reply_text(final) == "25."
    assert len(fake.requests) == 4
    rows = await calls_of("r1")
    assert [(c.model_call_id, c.state) for c in rows] == [("call_ok", "succeeded")]
    assert len(results(tool_client, "r1")) == 1
    assert fake.requests[3].messages == fake.requests[2].messages  # the retry sends the same conversation
    assert fake.requests[3].messages[-1] == {"role": "tool", "tool_call_id": "call_ok", "content": "5*5 = 25"}


# --- later turns -------------------------------------------------------------------------------------------


async def test_a_later_turn_sends_the_earlier_calls_and_results(tool_client, fake):
    args = json.dumps({"expression": "6*7"})
    fake.push(
        tool_reply(ToolCallReply("demo__calculate", args, id="call_a"), chunks=["Checking."]),
        Reply(chunks=["It is 42."]),
        Reply(chunks=["Still 42."]),
    )
    await send(tool_client, "r1", "what is 6*7?")
    await tool_client.wait_terminal("r1", timeout=30)
    (start,) = [d for d in tool_events(tool_client, "r1") if d["phase"] == "start"]

    await send(tool_client, "r2", "and again?")
    final = await tool_client.wait_terminal("r2", timeout=30)
    assert reply_text(final) == "Still 42." and results(tool_client, "r2") == []
    gateway_id = start["toolCallId"]  # history names the call by the gateway's id (model ids collide across runs)
    assert fake.requests[2].messages == [
        {"role": "user", "content": "what is 6*7?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": gateway_id, "type": "function", "function": {"name": "demo__calculate", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": gateway_id, "content": "6*7 = 42"},
        {"role": "assistant", "content": "It is 42."},
        {"role": "user", "content": "and again?"},
    ]


# --- abort ----------------------------------------------------------------------------------------------------


async def _wait_running(run_id: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not any(c.state == "running" for c in await calls_of(run_id)):
        assert time.monotonic() < deadline, "the call never started"
        await asyncio.sleep(0.05)


@pytest.fixture
def count_file(tmp_path: Path, use_agent: Any) -> Path:
    """Agent `llm` with the test MCP server (`t.slow`, …), which notes each cancellation in this file."""
    path = tmp_path / "count.txt"
    server = {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(path)}}
    use_agent(mcp_servers={"t": server})
    return path


async def test_the_models_timers_do_not_run_while_a_tool_does(tool_client, fake, count_file):
    # first_token_timeout_ms and idle_timeout_ms are 2000 ms (agent_config): the tool takes longer
    fake.push(tool_reply(ToolCallReply("t__slow", json.dumps({"ms": 2500}), id="call_s")), Reply(chunks=["Rested."]))
    await send(tool_client, "r1", "rest a bit")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and reply_text(final) == "Rested.", final
    assert [result_text(r) for r in results(tool_client, "r1")] == ["slept 2500 ms"]


async def test_the_run_budget_ending_during_a_tool_cancels_the_call(tool_client, fake, count_file):
    fake.push(tool_reply(ToolCallReply("t__slow", json.dumps({"ms": 30_000}), id="call_s")))
    params = {"sessionKey": KEY, "message": "slow", "idempotencyKey": "r1", "timeoutMs": 4000}
    await tool_client.ok("chat.send", params, 30)
    end = await tool_client.wait_terminal("r1", timeout=30)
    assert end["state"] == "error" and end["errorKind"] == "timeout", end
    assert [r["status"] for r in results(tool_client, "r1")] == ["cancelled"]
    assert (await run_row("r1")).cancel_ms is not None
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 1
    assert await open_tool_calls() == 0


async def test_abort_during_a_slow_tool_cancels_the_call_and_asks_the_model_nothing_more(tool_client, fake, count_file):
    fake.push(tool_reply(ToolCallReply("t__slow", json.dumps({"ms": 30_000}), id="call_s")))
    await send(tool_client, "r1", "take your time")
    await _wait_running("r1")
    await tool_client.ok("chat.abort", {"sessionKey": KEY, "runId": "r1"})
    end = await tool_client.wait_terminal("r1")
    assert end["state"] == "aborted"
    (result,) = results(tool_client, "r1")
    assert result["status"] == "cancelled"
    assert [c.state for c in await calls_of("r1")] == ["cancelled"]
    assert await open_tool_calls() == 0
    deadline = time.monotonic() + 5
    while "cancelled" not in (count_file.read_text() if count_file.exists() else ""):
        assert time.monotonic() < deadline, "the server never saw the cancellation"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 1  # the model is not asked again


async def test_abort_while_a_call_waits_for_approval_cancels_it(tool_client, fake):
    fake.push(tool_reply(ToolCallReply("demo__add_note", json.dumps({"text": "milk"}), id="call_w")))
    await send(tool_client, "r1", "note it")
    await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    await tool_client.ok("chat.abort", {"sessionKey": KEY, "runId": "r1"})
    assert (await tool_client.wait_terminal("r1"))["state"] == "aborted"
    assert [r["status"] for r in results(tool_client, "r1")] == ["cancelled"]
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 1
    assert await open_tool_calls() == 0


# --- model function names --------------------------------------------------------------------------------

COLLISION = "tools 't._echo' and 't_.echo' would both be the model function 't___echo'"


def _two_servers(use_agent: Any, extra: str = "", **overrides: Any) -> dict[str, Any]:
    """Servers `t` and `t_`; `t` also lists `extra` tools: with `_echo`, `t._echo` and `t_.echo` are
    both the model function `t___echo`."""
    plain = {"command": sys.executable, "args": [TEST_SERVER]}
    servers = {"t": {**plain, "env": {"MCP_EXTRA_TOOLS": extra}}, "t_": plain}
    config: dict[str, Any] = use_agent(mcp_servers=servers, **overrides)
    return config


async def test_two_tools_with_one_model_function_name_refuse_the_send_naming_both(tool_client, fake, use_agent):
    _two_servers(use_agent, "_echo")
    params = {"sessionKey": KEY, "message": "echo", "idempotencyKey": "r1"}
    ack = (await tool_client.call("chat.send", params, 30))["payload"]
    assert ack["status"] == "error" and COLLISION in ack["summary"], ack
    assert fake.requests == []  # nothing reached the model

    # allow only one of the two: the model knows each function by one name
    _two_servers(use_agent, "_echo", tools=["t.*", "t_.slow"])
    fake.push(Reply(chunks=["ok"]))
    await send(tool_client, "r2", "echo")
    assert (await tool_client.wait_terminal("r2", timeout=30))["state"] == "final"
    names = [t["function"]["name"] for t in fake.requests[0].body["tools"]]
    assert "t___echo" in names and "t___slow" in names and len(names) == len(set(names)), names


async def test_a_list_that_comes_to_collide_fails_the_queued_run_when_it_starts(tool_client, fake, use_agent):
    """A run accepted while the lists did not collide reads them again when it starts: `t` grew
    `_echo` meanwhile, so it fails at dispatch naming both, and never reaches the model."""
    config = _two_servers(use_agent)
    fake.push(
        tool_reply(ToolCallReply("t__grow", json.dumps({"name": "_echo"}), id="call_g")),
        tool_reply(ToolCallReply("t__count", "{}", id="call_c")),
        Reply(chunks=["Grown."]),
    )
    await send(tool_client, "r1", "grow")
    grow = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    assert (await send(tool_client, "r2", "later"))["status"] == "queued"
    await tool_client.ok("plugin.approval.resolve", {"id": grow["payload"]["id"], "decision": "allow-once"})
    count = await tool_client.wait_event(
        lambda e: e["event"] == "plugin.approval.requested" and e["payload"]["id"] != grow["payload"]["id"], 20
    )
    deadline = time.monotonic() + 10
    while "_echo" not in {s.tool for s in await pool().list_tools("llm", config["mcp_servers"])}:
        assert time.monotonic() < deadline, "t's tool list was not refreshed"
        await asyncio.sleep(0.05)
    await tool_client.ok("plugin.approval.resolve", {"id": count["payload"]["id"], "decision": "deny"})
    assert (await tool_client.wait_terminal("r1", timeout=30))["state"] == "final"
    end = await tool_client.wait_terminal("r2", timeout=30)
    assert end["state"] == "error" and end["errorKind"] == "dispatch" and COLLISION in end["errorMessage"], end
    assert len(fake.requests) == 3  # r1's three steps; r2 never reached the model
