"""Steering a working run (docs/protocol-notes.md, "Steering"), through the real consumer: the model is the
fake OpenAI-compatible server calling the test MCP server's non-idempotent `count` tool, which notes each
execution, so a tool that ran twice would show.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from sessions_app.models import LifecycleEvent, Message, Run, ToolCall
from tests.support import services
from tests.support.communicator import Client, open_client
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions, results

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

KEY = "agent:llm:chat"
SKIPPED = "Skipped to process an incoming message."


@pytest.fixture
def count_file(settings: Any, fake: FakeOpenAI, tmp_path: Path) -> Path:
    """Agent `llm`: the fake model with the test MCP server `t` (its `count` tool notes each run here)."""
    path = tmp_path / "count.txt"
    server = {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(path)}}
    settings.GATEWAY_AGENTS = {
        **settings.GATEWAY_AGENTS,
        "llm": agent_config(fake, mcp_servers={"t": server}, approval={"*": "never"}),
    }
    return path


@pytest.fixture
async def client(alice: tuple[Any, str], count_file: Path) -> Any:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


def count(arg: str, ms: int, call_id: str) -> ToolCallReply:
    return ToolCallReply("t__count", json.dumps({"arg": arg, "ms": ms}), id=call_id, pieces=2)


async def send(client: Client, run_id: str, message: str, **extra: Any) -> dict[str, Any]:
    params = {"sessionKey": KEY, "message": message, "idempotencyKey": run_id, **extra}
    return await client.ok("chat.send", params, 30)


@database_sync_to_async
def calls_of(run_id: str) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run__run_id=run_id).order_by("seq"))


@database_sync_to_async
def run_row(run_id: str) -> Run:
    return Run.objects.get(run_id=run_id, session__key=KEY)


@database_sync_to_async
def user_messages(text: str) -> int:
    return Message.objects.filter(session__key=KEY, role="user", text=text).count()


async def wait_call_running(run_id: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not any(c.state == "running" for c in await calls_of(run_id)):
        assert time.monotonic() < deadline, [(c.state, c.result) for c in await calls_of(run_id)]
        await asyncio.sleep(0.02)


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


async def test_a_steer_during_a_running_tool_skips_its_sibling_and_reaches_the_next_request_in_order(
    client, fake, count_file
):
    """The tool under way finishes (and ran once), the call after it is not started and gets a paired
    `skipped` result, both steers reach the next model request after the results, in the order sent;
    history shows the calls, their results, then the steering messages, then the rest of the reply."""
    fake.push(
        tool_reply(count("first", 1200, "call_a"), count("second", 0, "call_b"), chunks=["Counting."]),
        Reply(chunks=["Changed course."], first_delay=1.0),
    )
    assert (await send(client, "r1", "count twice"))["status"] == "started"
    await wait_call_running("r1")
    ack1 = await send(client, "s1", "stop counting", queueMode="steer")
    ack2 = await client.ok("sessions.steer", {"sessionKey": KEY, "message": "and say hi", "idempotencyKey": "s2"})
    for ack, steer in ((ack1, "s1"), (ack2, "s2")):
        assert (ack["status"], ack["runId"], ack["steered"], ack["steerRunId"]) == ("started", "r1", True, steer)

    # while the model answers them: the part before the steers is history, only the rest is in flight
    await fake.wait_request(2, timeout=20)
    during = await client.ok("chat.history", {"sessionKey": KEY})
    assert roles(during["messages"]) == ["user", "assistant", "toolResult", "toolResult", "user", "user"]
    assert during["inFlightRun"]["runId"] == "r1" and during["inFlightRun"]["text"] == ""
    assert during["inFlightRun"].get("tools", []) == []

    final = await client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final" and final["message"]["content"][0]["text"].endswith("Changed course."), final
    assert executions(count_file) == 1  # the running tool finished; its sibling never ran

    _first, second = fake.requests
    assert roles(second.messages) == ["user", "assistant", "tool", "tool", "user", "user"]
    assert second.messages[2] == {"role": "tool", "tool_call_id": "call_a", "content": "1"}
    assert second.messages[3] == {"role": "tool", "tool_call_id": "call_b", "content": SKIPPED}
    assert [m["content"] for m in second.messages[4:]] == ["stop counting", "and say hi"]

    a, b = await calls_of("r1")
    assert (a.state, b.state, b.error_kind, b.result, b.started_at) == (
        "succeeded",
        "skipped",
        "skipped",
        SKIPPED,
        None,
    )
    skipped = [r for r in results(client, "r1") if r["toolCallId"] == b.call_id]
    assert len(skipped) == 1 and skipped[0]["status"] == "skipped" and skipped[0]["errorKind"] == "skipped"
    for steer in ("s1", "s2"):
        row = await run_row(steer)
        assert (row.state, row.stop_reason) == ("killed", "steered")  # §8: a queued run never ends done
        (event,) = [e for e in client.chat_events(steer) if e["state"] == "aborted"]
        assert event["stopReason"] == "steered"
        assert await user_messages({"s1": "stop counting", "s2": "and say hi"}[steer]) == 1

    history = (await client.ok("chat.history", {"sessionKey": KEY}))["messages"]
    assert roles(history) == ["user", "assistant", "toolResult", "toolResult", "user", "user", "assistant"]
    part = history[1]["content"]
    assert [c["type"] for c in part] == ["text", "toolCall", "toolCall"] and part[0]["text"] == "Counting."
    assert [h["status"] for h in history[2:4]] == ["succeeded", "skipped"]
    assert [h["runId"] for h in history[4:6]] == ["s1", "s2"]
    assert history[6]["content"] == [{"type": "text", "text": "Changed course."}] and history[6]["runId"] == "r1"

    # the next run's model is sent the same conversation, paired
    fake.push(Reply(chunks=["ok"]))
    await send(client, "r2", "next")
    assert (await client.wait_terminal("r2", timeout=30))["state"] == "final"
    third = fake.requests[2]
    assert roles(third.messages) == ["user", "assistant", "tool", "tool", "user", "user", "assistant", "user"]
    assert third.messages[3]["content"] == SKIPPED and third.messages[6]["content"] == "Changed course."


async def test_a_steer_the_run_ends_before_taking_becomes_a_follow_up_the_client_is_told_of(client, fake, count_file):
    """The run's last step (no calls) is streaming when the steer comes: the run ends without taking it,
    the client is told (a `chat` status event of the steer: `steer: followup`), and it runs once, as its own run."""
    fake.push(
        tool_reply(count("only", 0, "call_a")),
        Reply(chunks=["Done", " now", "."], first_delay=0.6, tick=0.1),
        Reply(chunks=["Follow-up answered."]),
    )
    await send(client, "r1", "count once")
    await fake.wait_request(2, timeout=20)  # the last step's request: no boundary after it
    ack = await send(client, "s1", "one more thing", queueMode="steer")
    assert (ack["status"], ack["runId"], ack["steered"]) == ("started", "r1", True)

    assert (await client.wait_terminal("r1", timeout=30))["state"] == "final"
    told = await client.wait_event(
        lambda e: e["event"] == "chat" and e["payload"]["runId"] == "s1" and e["payload"].get("steer") == "followup", 10
    )
    assert told["payload"]["state"] == "status" and told["payload"]["phase"] == "queued"
    end = await client.wait_terminal("s1", timeout=30)
    assert end["state"] == "final" and end["message"]["content"][0]["text"] == "Follow-up answered."
    await client.drain(0.3)
    assert len(fake.requests) == 3 and fake.requests[2].messages[-1] == {"role": "user", "content": "one more thing"}
    assert len([e for e in client.chat_events("s1") if e["state"] == "final"]) == 1
    assert await user_messages("one more thing") == 1
    reasons = await database_sync_to_async(
        lambda: list(LifecycleEvent.objects.filter(run__run_id="s1").values_list("reason", flat=True))
    )()
    assert reasons[:2] == ["steer.queued", "steer.followup"] and "run.steered" not in reasons


async def test_steers_racing_the_runs_end_are_each_taken_once_or_run_once(client, fake, count_file):
    """Steers sent at moments around the end of a step's tool call: each is either taken by the run
    (in its next request, once) or, when the run ended first, run as a follow-up of its own (once)."""
    for i, delay in enumerate((0.0, 0.1, 0.14, 0.16, 0.18, 0.2, 0.22, 0.26, 0.35)):
        fake.requests.clear()
        last = Reply(chunks=[f"reply {i}"], first_delay=0.05)
        fake.push(tool_reply(count(f"c{i}", 150, f"call_{i}")), last, Reply(chunks=["later"]))
        await send(client, f"r{i}", f"run {i}")
        await wait_call_running(f"r{i}")
        await asyncio.sleep(delay)  # from while the tool runs, through its last step, to past the run's end
        ack = await send(client, f"s{i}", f"steer {i}", queueMode="steer")
        assert (await client.wait_terminal(f"r{i}", timeout=30))["state"] == "final"
        steer = await run_row(f"s{i}")
        deadline = time.monotonic() + 20
        while steer.state not in ("done", "failed", "killed", "timeout"):
            assert time.monotonic() < deadline, steer.state
            await asyncio.sleep(0.05)
            steer = await run_row(f"s{i}")
        sent = [m for r in fake.requests for m in r.messages if m == {"role": "user", "content": f"steer {i}"}]
        if ack.get("steered") and steer.stop_reason == "steered":
            # taken: the run's next request carried it, and no run of its own was made
            assert len(fake.requests) == 2 and len(sent) == 1, i
            assert not [e for e in client.chat_events(f"s{i}") if e["state"] == "delta"]
        else:
            # a follow-up the client was told of (or, after the run's end, a plain run): its own request, once
            if ack.get("steered"):
                await client.wait_terminal(f"s{i}", timeout=10)
                told = [e for e in client.chat_events(f"s{i}") if e.get("steer") == "followup"]
                assert len(told) == 1 and told[0]["phase"] == "queued", (i, client.chat_events(f"s{i}"))
            assert steer.state == "done" and steer.stop_reason != "steered", (i, steer.stop_reason)
            assert sent and fake.requests[-1].messages[-1]["content"] == f"steer {i}", i
            assert len([r for r in fake.requests if r.messages[-1]["content"] == f"steer {i}"]) == 1, i
        assert await user_messages(f"steer {i}") == 1, i
        assert executions(count_file) == i + 1  # each tool ran once
        await client.drain(0.1)
        fake.replies.clear()


async def test_a_steer_racing_an_abort_of_the_run_is_neither_lost_nor_run_twice(client, fake, count_file):
    """A steer sent together with `chat.abort` of the run: whichever lands first, the steer runs exactly once
    (a follow-up of the aborted run, or a run of the idle session) and is never delivered into the dead run."""
    for i in range(4):
        fake.requests.clear()
        fake.push(tool_reply(count(f"a{i}", 400, f"call_{i}")), Reply(chunks=["steered answer"]))
        await send(client, f"r{i}", f"run {i}")
        await wait_call_running(f"r{i}")
        steer = asyncio.ensure_future(send(client, f"s{i}", f"steer {i}", queueMode="steer"))
        if i % 2:
            await asyncio.sleep(0)
        aborted = await client.ok("chat.abort", {"sessionKey": KEY, "runId": f"r{i}"})
        await steer
        assert aborted["aborted"] and aborted["runIds"] == [f"r{i}"]
        assert (await client.wait_terminal(f"r{i}", timeout=30))["state"] == "aborted"
        end = await client.wait_terminal(f"s{i}", timeout=30)
        assert end["state"] == "final" and end["message"]["content"][0]["text"] == "steered answer", end
        await client.drain(0.3)
        assert [r.messages[-1]["content"] for r in fake.requests] == [f"run {i}", f"steer {i}"]
        assert len([e for e in client.chat_events(f"s{i}") if e["state"] == "final"]) == 1
        assert await user_messages(f"steer {i}") == 1
        fake.replies.clear()


async def test_abort_by_the_steers_id_withdraws_it_before_it_is_taken(client, fake, count_file):
    """`chat.abort` with the steer's own id (`steerRunId`) withdraws it: the run goes on as if it had never
    come (the next call of the step runs), and it is never run."""
    fake.push(tool_reply(count("a", 800, "call_a"), count("b", 0, "call_b")), Reply(chunks=["Both counted."]))
    await send(client, "r1", "count twice")
    await wait_call_running("r1")
    ack = await send(client, "s1", "never mind", queueMode="steer")
    withdrawn = await client.ok("chat.abort", {"sessionKey": KEY, "runId": ack["steerRunId"]})
    assert withdrawn == {"aborted": True, "runIds": ["s1"]}
    assert (await client.wait_terminal("s1"))["state"] == "aborted"
    final = await client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final"
    assert [c.state for c in await calls_of("r1")] == ["succeeded", "succeeded"]
    assert executions(count_file) == 2
    assert all(m["content"] != "never mind" for r in fake.requests for m in r.messages)
    assert (await run_row("s1")).state == "killed" and await user_messages("never mind") == 0
    # taken already, a steer cannot be withdrawn: the abort changes nothing
    assert await client.ok("chat.abort", {"sessionKey": KEY, "runId": "s1"}) == {"aborted": False, "runIds": []}


async def test_a_steer_to_an_idle_session_starts_a_run(client, fake, count_file):
    fake.push(Reply(chunks=["Hello."]))
    ack = await send(client, "s1", "hi", queueMode="steer")
    assert ack["status"] == "started" and ack["runId"] == "s1" and "steered" not in ack
    assert (await client.wait_terminal("s1", timeout=30))["state"] == "final"


async def test_a_steer_a_run_cannot_take_is_queued_as_a_follow_up(client, fake, count_file, settings):
    """Waiting on an approval, a run cannot take a steer: it is queued (`queued`), and runs after it."""
    settings.GATEWAY_AGENTS["llm"]["approval"] = {"t.count": "always"}
    fake.push(tool_reply(count("a", 0, "call_a")), Reply(chunks=["Denied, fine."]), Reply(chunks=["Queued one."]))
    await send(client, "r1", "count")
    request = await client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    ack = await send(client, "s1", "meanwhile", queueMode="steer")
    assert ack["status"] == "queued" and ack["runId"] == "s1" and "steered" not in ack
    await client.ok("plugin.approval.resolve", {"id": request["payload"]["id"], "decision": "deny"})
    assert (await client.wait_terminal("r1", timeout=30))["state"] == "final"
    assert (await client.wait_terminal("s1", timeout=30))["message"]["content"][0]["text"] == "Queued one."
    assert all(m["content"] != "meanwhile" for m in fake.requests[1].messages)


async def test_interrupt_still_stops_the_run_and_starts_the_message(client, fake, count_file):
    fake.push(tool_reply(count("a", 3000, "call_a")), Reply(chunks=["Fresh start."]))
    await send(client, "r1", "count slowly")
    await wait_call_running("r1")
    ack = await send(client, "i1", "stop that", queueMode="interrupt")
    assert ack["status"] == "started" and ack["runId"] == "i1" and ack.get("interruptedActiveRun") is True
    end = await client.wait_terminal("r1", timeout=30)
    assert (end["state"], end["stopReason"]) == ("aborted", "interrupt")
    assert (await client.wait_terminal("i1", timeout=30))["state"] == "final"
    assert [c.state for c in await calls_of("r1")] == ["cancelled"]


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_steering_holds_on_postgres() -> None:
    """This file again, in a child pytest whose database is PostgreSQL (its row locks, its commits racing)."""
    services.rerun_on_postgres(__file__, "steering", 8, REDIS_URL="")
