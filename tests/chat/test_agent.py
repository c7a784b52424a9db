"""§12: the `agent` method (two answers under one id) and `agent` events, over the real consumer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import get_channel_layer

from chat.delivery import agent_events, groups
from tests.support.communicator import open_client
from tests.support.db import audit, counts, run_row, terminal_events

pytestmark = pytest.mark.django_db(transaction=True)


def agent_params(message: str, run_id: str, key: str | None = "main", **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"message": message, "idempotencyKey": run_id, **extra}
    if key is not None:
        params["sessionKey"] = key
    return params


async def call_agent(client: Any, params: dict[str, Any], timeout: float = 5.0) -> tuple[dict[str, Any], ...]:
    """Send `agent` with the request id the Node client uses (its idempotencyKey); both answers."""
    rid = await client.send("agent", params, rid=params["idempotencyKey"])
    first, second = await client.wait_answers(rid, 2, timeout)
    return first, second


def terminal_agent(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["stream"] == "lifecycle" and e["data"]["phase"] in ("end", "error")]


async def wait_agent_end(client: Any, run_id: str, timeout: float = 5.0) -> dict[str, Any]:
    ev = await client.wait_event(
        lambda e: (
            e["event"] == "agent"
            and e["payload"]["runId"] == run_id
            and e["payload"]["stream"] == "lifecycle"
            and e["payload"]["data"]["phase"] in ("end", "error")
        ),
        timeout,
    )
    payload: dict[str, Any] = ev["payload"]
    return payload


def assert_well_formed(events: list[dict[str, Any]]) -> None:
    """seq 1, 2, 3…; exactly one end or error, and nothing after it."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), events
    ends = terminal_agent(events)
    assert len(ends) == 1 and events[-1] is ends[0], events


async def test_two_answers_then_events_in_order(client):
    accepted, final = await call_agent(client, agent_params("hello agent", "a1"))
    assert accepted["ok"] and accepted["payload"]["status"] == "accepted"
    assert accepted["payload"]["runId"] == "a1" and accepted["payload"]["sessionKey"] == "agent:main:main"
    assert accepted["payload"]["agentId"] == "main" and isinstance(accepted["payload"]["acceptedAt"], int)
    assert final["ok"] and final["payload"]["status"] == "ok" and final["payload"]["summary"] == "completed"
    result = final["payload"]["result"]
    assert result["payloads"] == [{"text": "echo: hello agent", "mediaUrl": None}]
    meta = result["meta"]["agentMeta"]
    assert meta["provider"] == "scripted" and meta["sessionId"] == accepted["payload"]["sessionId"]
    assert set(meta["usage"]) == {"input", "output", "total"} and result["meta"]["durationMs"] >= 0

    frames = client.frames
    i_acc, i_fin = frames.index(accepted), frames.index(final)
    run_frames = [i for i, f in enumerate(frames) if f["type"] == "event" and f["payload"].get("runId") == "a1"]
    assert i_acc < min(run_frames) and max(run_frames) < i_fin  # accepted first, final last

    events = client.agent_events("a1")
    assert_well_formed(events)
    assert [e["data"]["phase"] for e in events if e["stream"] == "lifecycle"] == ["start", "running", "end"]
    assert events[0]["data"]["startedAt"] and events[-1]["data"]["aborted"] is False
    assert events[-1]["data"]["stopReason"] == "stop"
    text = "".join(e["data"]["delta"] for e in events if e["stream"] == "assistant")
    assert text == "echo: hello agent"
    assert all(e["sessionKey"] == "agent:main:main" and e["agentId"] == "main" for e in events)
    # the chat events are there too, unchanged
    assert terminal_events(client.events, "a1")[0]["state"] == "final"
    seqs = [f["seq"] for f in frames if f["type"] == "event"]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_every_connection_gets_the_same_agent_events(alice, client):
    other = await open_client(alice[1], subscribe=False)  # speaks only chat.send
    try:
        await call_agent(client, agent_params("one two three four", "a1"))
        await wait_agent_end(other, "a1")
        await asyncio.gather(client.drain(0.1), other.drain(0.1))
        mine, theirs = client.agent_events("a1"), other.agent_events("a1")
        assert_well_formed(theirs)
        strip = [[(e["seq"], e["stream"], e["data"]) for e in evs] for evs in (mine, theirs)]
        assert strip[0] == strip[1]
    finally:
        await other.close()


async def test_chat_send_runs_get_agent_events_too(client):
    ack = await client.ok("chat.send", {"sessionKey": "main", "message": "hi", "idempotencyKey": "c1"})
    assert ack["status"] == "started"  # the chat.send ack is unchanged
    await wait_agent_end(client, "c1")
    assert_well_formed(client.agent_events("c1"))


async def test_replay_of_a_finished_key_is_the_final_answer_alone(client):
    await call_agent(client, agent_params("again", "a1"))
    rid = await client.send("agent", agent_params("again", "a1"), rid="second")
    res = await client.response(rid)
    assert res["ok"] and res["payload"]["status"] == "ok"
    assert res["payload"]["result"]["payloads"][0]["text"] == "echo: again"
    await client.drain(0.3)
    assert len(client.answers("second")) == 1
    assert (await counts())["runs"] == 1
    assert len(terminal_agent(client.agent_events("a1"))) == 1


async def test_replay_of_an_open_key_is_accepted_then_final_on_the_new_id(client):
    rid1 = await client.send("agent", agent_params("a b c d [[tick:80]]", "a1"), rid="first")
    rid2 = await client.send("agent", agent_params("a b c d [[tick:80]]", "a1"), rid="second")
    for rid in (rid1, rid2):
        accepted, final = await client.wait_answers(rid, 2)
        assert accepted["payload"]["status"] == "accepted" and final["payload"]["status"] == "ok"
    assert (await counts())["runs"] == 1
    assert_well_formed(client.agent_events("a1"))


async def test_conflict_and_setup_failure_are_one_answer(client):
    res = await client.call("agent", agent_params("x [[fail:setup]]", "s1"))
    assert res["ok"] is False and res["error"]["code"] == "UNAVAILABLE"
    assert res["error"]["details"] == {"runId": "s1", "errorKind": "dispatch"}
    await client.drain(0.3)
    assert client.agent_events("s1") == [] and len(client.answers(res["id"])) == 1
    await call_agent(client, agent_params("first", "k1"))
    conflict = await client.call("agent", agent_params("second", "k1"))
    assert conflict["error"]["code"] == "CONFLICT"


async def test_dispatch_failure_is_one_error_and_the_session_is_not_left_running(client):
    accepted, final = await call_agent(client, agent_params("[[fail:dispatch]]", "d1"))
    assert accepted["payload"]["status"] == "accepted"
    assert final["ok"] is False and final["error"]["details"]["errorKind"] == "dispatch"
    events = client.agent_events("d1")
    assert_well_formed(events)
    assert events[-1]["data"]["phase"] == "error" and events[-1]["data"]["error"] == final["error"]["message"]
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["status"] == "failed" and row["hasActiveRun"] is False


async def test_abort_mid_stream(client):
    rid = await client.send("agent", agent_params("w [[words:50]] [[tick:40]]", "a1"), rid="a1")
    await client.wait_event(lambda e: e["event"] == "agent" and e["payload"]["stream"] == "assistant")
    assert (await client.ok("chat.abort", {"sessionKey": "main", "runId": "a1"}))["aborted"] is True
    _accepted, final = await client.wait_answers(rid, 2)
    assert final["ok"] is False and final["payload"]["status"] == "aborted"
    assert final["error"]["details"] == {"runId": "a1", "stopReason": "rpc"}
    events = client.agent_events("a1")
    assert_well_formed(events)
    assert events[-1]["data"] | {"endedAt": 0, "startedAt": 0} == {
        "phase": "end",
        "aborted": True,
        "stopReason": "rpc",
        "endedAt": 0,
        "startedAt": 0,
    }
    await client.drain(0.3)
    assert len(terminal_agent(client.agent_events("a1"))) == 1


async def test_abort_racing_the_end_has_one_terminal_that_the_answer_agrees_with(client):
    for i in range(5):
        rid = await client.send(
            "agent", agent_params(f"quick {i}", f"r{i}"), rid=f"agent-r{i}"
        )  # apart from the client's own ids
        await asyncio.sleep(0.01 * i)
        await client.send("chat.abort", {"sessionKey": "main", "runId": f"r{i}"})
        _accepted, final = await client.wait_answers(rid, 2)
        chat_end = await client.wait_terminal(f"r{i}")
        await wait_agent_end(client, f"r{i}")
        events = client.agent_events(f"r{i}")
        assert_well_formed(events)
        if chat_end["state"] == "final":
            assert final["ok"] and events[-1]["data"]["aborted"] is False
        else:
            assert chat_end["state"] == "aborted" and final["payload"]["status"] == "aborted"
            assert events[-1]["data"]["aborted"] is True
        assert [a[1] for a in await audit(f"r{i}")].count("done") + [a[1] for a in await audit(f"r{i}")].count(
            "killed"
        ) == 1


async def test_timeout_is_in_seconds_and_ends_with_an_error(client):
    _accepted, final = await call_agent(client, agent_params("[[hang]]", "t1", timeout=1), timeout=5)
    assert (await run_row("t1")).timeout_ms == 1000
    assert final["ok"] is False and final["payload"]["status"] == "timeout"
    assert final["error"]["details"]["errorKind"] == "timeout"
    events = client.agent_events("t1")
    assert_well_formed(events)
    assert events[-1]["data"]["phase"] == "error" and "timeoutMs" in events[-1]["data"]["error"]


async def test_queued_run_is_accepted_with_its_position(client):
    await client.send("agent", agent_params("first [[tick:60]] a b", "q0"), rid="q0")
    accepted, final = await call_agent(client, agent_params("second", "q1"))
    assert accepted["payload"]["queuePosition"] == 1 and final["payload"]["status"] == "ok"
    events = client.agent_events("q1")
    assert_well_formed(events)
    assert [e["data"]["phase"] for e in events if e["stream"] == "lifecycle"] == ["queued", "start", "running", "end"]


async def test_closing_the_connection_never_ends_the_run(alice, client):
    other = await open_client(alice[1])
    try:
        await other.send("agent", agent_params("a b c [[tick:50]]", "a1"), rid="a1")
        await other.wait_answers("a1", 1)
        await other.close()
        final = await client.wait_terminal("a1")
        assert final["state"] == "final"
    finally:
        await other.close()


async def test_without_session_key_the_run_goes_to_the_main_session(client):
    accepted, _final = await call_agent(client, agent_params("hi", "m1", key=None))
    assert accepted["payload"]["sessionKey"] == "agent:main:main"
    res = await client.call("agent", agent_params("hi", "m2", key=None, agentId="nope"))
    assert res["error"]["code"] == "NOT_FOUND" and res["error"]["details"]["field"] == "agentId"


async def test_ignored_params_and_bad_params(client):
    extra = {
        "thinking": "low",
        "deliver": False,
        "channel": "x",
        "label": "l",
        "model": "m",
        "provider": "p",
        "extraSystemPrompt": "be brief",
    }
    _accepted, final = await call_agent(client, agent_params("hi", "i1", **extra))
    assert final["payload"]["status"] == "ok"
    for bad, field in (
        (agent_params("hi", "b1", timeout="5"), "timeout"),
        (agent_params("", "b2"), "message"),
        ({"message": "hi", "sessionKey": "main"}, "idempotencyKey"),
    ):
        res = await client.call("agent", bad)
        assert res["error"]["code"] == "INVALID_REQUEST" and res["error"]["details"]["field"] == field
    assert (await counts())["runs"] == 1


async def test_hello_lists_the_method_and_the_event(client):
    assert "agent" in client.hello["features"]["methods"] and "agent" in client.hello["features"]["events"]


async def test_key_is_a_synonym_of_session_key(client):
    await call_agent(client, agent_params("hi", "k1", key="bots"))
    history = await client.ok("chat.history", {"key": "bots"})
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
    reset = await client.ok("sessions.reset", {"key": "bots"})
    assert reset["session"]["key"] == "agent:main:bots" and reset["session"]["status"] is None
    res = await client.call("sessions.reset", {"key": "bad key!"})
    assert res["error"]["details"]["field"] == "key" and res["error"]["message"].startswith("key ")
    res = await client.call("sessions.reset", {})
    assert res["error"]["message"] == "sessionKey is required"
    res = await client.call("sessions.reset", {"key": "a", "sessionKey": "b"})
    assert res["error"]["code"] == "INVALID_REQUEST"
    created = await client.ok("sessions.create", {"key": "made"})
    assert created["session"]["key"] == "agent:main:made"
    assert (await client.ok("sessions.delete", {"key": "made"}))["deleted"] is True


def test_translation_fills_in_what_a_connection_missed() -> None:
    """A connection that missed a delta gets the rest in the next one, and the tail at the end."""
    base = {"runId": "r", "sessionKey": "agent:main:k", "sessionId": "s"}
    message = {"role": "assistant", "content": [{"type": "text", "text": "one two three"}], "timestamp": 5}
    delta, replied = agent_events.agent_events(
        {
            **base,
            "seq": 4,
            "state": "delta",
            "deltaText": " two",
            "message": {**message, "content": [{"type": "text", "text": "one two"}]},
        },
        None,
        3,
    )
    assert [(e["seq"], e["data"]["delta"]) for e in delta] == [(4, " two")] and replied == 7
    final, replied = agent_events.agent_events(
        {**base, "seq": 6, "state": "final", "stopReason": "stop", "message": message},
        {"outputTokens": 3, "startedAt": 1},
        7,
    )
    assert [(e["seq"], e["stream"]) for e in final] == [(6, "assistant"), (7, "usage"), (8, "lifecycle")]
    assert final[0]["data"] == {"text": "one two three", "delta": " three"}
    assert final[1]["data"] == {"outputTokens": 3} and final[2]["data"]["endedAt"] == 5
    # nothing missed: just the end, at the terminal's own seq
    final, _ = agent_events.agent_events(
        {**base, "seq": 6, "state": "final", "stopReason": "stop", "message": message}, None, 13
    )
    assert [(e["seq"], e["data"]["phase"]) for e in final] == [(6, "end")]


async def test_a_caller_that_missed_every_event_still_gets_them_before_its_final_answer(alice, client):
    """The layer loses all of the run's events for this connection: it sends them itself, then answers."""
    layer = get_channel_layer()
    group = groups.user_group(alice[0].pk)
    for name in list(layer.groups[group]):
        await layer.group_discard(group, name)
    _accepted, final = await call_agent(client, agent_params("nobody hears this", "lost"), timeout=8)
    assert final["payload"]["status"] == "ok"
    events = client.agent_events("lost")
    assert client.frames.index(final) > max(i for i, f in enumerate(client.frames) if f.get("event") == "agent")
    ends = terminal_agent(events)
    assert len(ends) == 1 and events[-1] is ends[0]
    text = "".join(e["data"]["delta"] for e in events if e["stream"] == "assistant")
    assert text == "echo: nobody hears this"
