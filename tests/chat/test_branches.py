"""Branches of a transcript through the real consumer: regenerate and edit make siblings, rewind, fork and
branch switches move the active branch, and the model (the fake OpenAI-compatible server) is sent only
the branch it answers on, tool calls included."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from sessions_app.models import ChatSession, LifecycleEvent, Message, Run
from tests.support.communicator import Client, open_client
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.tools import TOOL_CONNECT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

KEY = "agent:llm:chat"
BRANCH_METHODS = ("sessions.branches.list", "sessions.branches.switch", "sessions.rewind", "sessions.fork")


@pytest.fixture
async def tab2(alice: tuple[Any, str]) -> AsyncIterator[Client]:
    """A second connection of the same user: another browser tab."""
    c = await open_client(alice[1])
    yield c
    await c.close()


async def say(client: Client, fake: FakeOpenAI, run_id: str, message: str, reply: str, **extra: Any) -> None:
    fake.push(Reply(chunks=[reply]))
    ack = await client.ok("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": run_id, **extra})
    assert ack["status"] == "started", ack
    assert (await client.wait_terminal(run_id))["state"] == "final"


async def regenerate(client: Client, run_id: str, entry: str, **extra: Any) -> dict[str, Any]:
    params = {"sessionKey": KEY, "entryId": entry, "idempotencyKey": run_id, **extra}
    return await client.ok("chat.regenerate", params)


async def history(client: Client, key: str = KEY) -> list[dict[str, Any]]:
    return list((await client.ok("chat.history", {"sessionKey": key}))["messages"])


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"][0]["text"]) for m in messages if m["role"] in ("user", "assistant")]


def sent(fake: FakeOpenAI, index: int = -1) -> list[tuple[str, Any]]:
    """What the model was sent in one request, system prompt left out."""
    return [(m["role"], m.get("content")) for m in fake.requests[index].messages if m["role"] != "system"]


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["__openclaw"]["id"] for m in messages]


async def branches(client: Client, key: str = KEY) -> list[dict[str, Any]]:
    return list((await client.ok("sessions.branches.list", {"sessionKey": key}))["branches"])


# --- regenerate and edit -------------------------------------------------------------------------------


async def test_a_regenerated_reply_is_a_sibling_and_each_branch_sends_the_model_only_its_own(client, fake, use_agent):
    await say(client, fake, "r1", "pick a colour", "Blue.")
    first = await history(client)
    assert texts(first) == [("user", "pick a colour"), ("assistant", "Blue.")]
    blue = ids(first)[1]

    fake.push(Reply(chunks=["Green."]))
    ack = await regenerate(client, "r2", blue)
    assert ack["status"] == "started" and ack["runId"] == "r2" and ack["sessionKey"] == KEY
    assert (await client.wait_terminal("r2"))["message"]["content"][0]["text"] == "Green."
    # the model was asked the same question again, without the reply it is replacing
    assert sent(fake) == [("user", "pick a colour")]
    now = await history(client)
    assert texts(now) == [("user", "pick a colour"), ("assistant", "Green.")]
    assert ids(now)[0] == ids(first)[0]  # the same user message, answered again: nothing copied
    assert [(m["role"], m.get("siblings")) for m in now] == [
        ("user", None),
        ("assistant", {"index": 2, "count": 2, "leaves": [blue, ids(now)[1]]}),
    ]

    listed = await branches(client)
    assert [(b["leafEntryId"], b["messageCount"], b["active"], b["headline"]) for b in listed] == [
        (ids(now)[1], 2, True, "Green."),
        (blue, 2, False, "Blue."),
    ]
    assert all(isinstance(b["updatedAt"], str) and b["updatedAt"] for b in listed)

    # back to the first reply; the next message continues that branch, and the model sees it alone
    assert await client.ok("sessions.branches.switch", {"sessionKey": KEY, "leafEntryId": blue}) == {}
    await client.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "branch-switch")
    await say(client, fake, "r3", "why?", "It is calm.")
    assert sent(fake) == [("user", "pick a colour"), ("assistant", "Blue."), ("user", "why?")]
    assert texts(await history(client)) == [
        ("user", "pick a colour"),
        ("assistant", "Blue."),
        ("user", "why?"),
        ("assistant", "It is calm."),
    ]
    assert await database_sync_to_async(Message.objects.count)() == 5  # nothing deleted


async def test_an_edited_user_message_and_a_resent_one_start_sibling_branches(client, fake, use_agent):
    await say(client, fake, "q1", "one", "1")
    await say(client, fake, "q2", "two", "2")
    two = ids(await history(client))[2]

    fake.push(Reply(chunks=["TWO"]))
    ack = await regenerate(client, "q2-edit", two, message="two, in capitals")
    assert ack["status"] == "started"
    await client.wait_terminal("q2-edit")
    assert sent(fake) == [("user", "one"), ("assistant", "1"), ("user", "two, in capitals")]
    edited = await history(client)
    assert texts(edited) == [("user", "one"), ("assistant", "1"), ("user", "two, in capitals"), ("assistant", "TWO")]
    assert edited[2]["siblings"]["count"] == 2 and edited[2]["siblings"]["index"] == 2

    # the first message sent again, unchanged: a branch of its own, the model sent it alone
    one = ids(edited)[0]
    fake.push(Reply(chunks=["uno"]))
    await regenerate(client, "q1-again", one)
    await client.wait_terminal("q1-again")
    assert sent(fake) == [("user", "one")]
    assert texts(await history(client)) == [("user", "one"), ("assistant", "uno")]
    assert len(await branches(client)) == 3

    # a retry of the regenerate under its key is the same run: nothing starts again
    again = await regenerate(client, "q1-again", one)
    assert again["runId"] == "q1-again" and again["status"] in ("ok", "final", "done", "in_flight", "started")
    assert await database_sync_to_async(Run.objects.filter(run_id="q1-again").count)() == 1
    # the same key with another entry is a conflict
    res = await client.call("chat.regenerate", {"sessionKey": KEY, "entryId": two, "idempotencyKey": "q1-again"})
    assert not res["ok"] and res["error"]["code"] == "CONFLICT"


async def test_regenerate_refuses_what_it_cannot_branch_from_and_changes_nothing(client, fake, use_agent):
    await say(client, fake, "s1", "hello", "hi")
    user, reply = ids(await history(client))
    bad = [
        ({"entryId": "999999"}, "INVALID_REQUEST"),
        ({"entryId": "nope"}, "INVALID_REQUEST"),
        ({"entryId": reply, "message": "edit of a reply"}, "INVALID_REQUEST"),
        ({"entryId": user, "message": "   "}, "INVALID_REQUEST"),
    ]
    for extra, code in bad:
        res = await client.call("chat.regenerate", {"sessionKey": KEY, "idempotencyKey": "bad", **extra})
        assert not res["ok"] and res["error"]["code"] == code, (extra, res)
    assert await database_sync_to_async(Run.objects.count)() == 1
    assert texts(await history(client)) == [("user", "hello"), ("assistant", "hi")]


# --- rewind and fork -----------------------------------------------------------------------------------


async def test_rewind_goes_back_before_a_user_message_and_keeps_the_branch_it_left(client, fake, use_agent):
    await say(client, fake, "a1", "first", "F")
    await say(client, fake, "a2", "second", "S")
    before = await history(client)
    second = ids(before)[2]

    res = await client.call("sessions.rewind", {"sessionKey": KEY, "entryId": ids(before)[1]})
    assert not res["ok"] and res["error"]["code"] == "INVALID_REQUEST"  # a reply is not a user message
    assert await client.ok("sessions.rewind", {"sessionKey": KEY, "entryId": second}) == {"editorText": "second"}
    await client.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "rewind")
    assert texts(await history(client)) == [("user", "first"), ("assistant", "F")]
    listed = await branches(client)
    assert [(b["leafEntryId"], b["active"], b["messageCount"]) for b in listed] == [
        (ids(before)[1], True, 2),
        (ids(before)[3], False, 4),
    ]
    # the rewound-from message is off the active path now
    res = await client.call("sessions.rewind", {"sessionKey": KEY, "entryId": second})
    assert not res["ok"] and res["error"]["details"]["reason"] == "off-active-path"

    await say(client, fake, "a3", "second, again", "S2")
    assert sent(fake) == [("user", "first"), ("assistant", "F"), ("user", "second, again")]
    audit = await database_sync_to_async(
        lambda: list(LifecycleEvent.objects.filter(reason="rewind").values_list("detail", flat=True))
    )()
    assert audit == [f"active leaf {ids(before)[3]} -> {ids(before)[1]}"]


async def test_fork_makes_a_new_session_with_the_prefix_and_the_model_continues_from_it(client, fake, use_agent):
    await say(client, fake, "f1", "plan a trip", "Where to?")
    await say(client, fake, "f2", "Rome", "Great choice.")
    source = await history(client)

    forked = await client.ok("sessions.fork", {"sessionKey": KEY, "entryId": ids(source)[2]})
    assert set(forked) == {"sessionKey", "editorText"} and forked["editorText"] == "Rome"
    new_key = forked["sessionKey"]
    assert new_key.startswith("agent:llm:") and new_key != KEY
    announced = ("fork", new_key)
    await client.wait_event(
        lambda e: e["event"] == "sessions.changed" and (e["payload"]["reason"], e["payload"]["sessionKey"]) == announced
    )
    assert texts(await history(client, new_key)) == [("user", "plan a trip"), ("assistant", "Where to?")]
    assert texts(await history(client)) == texts(source)  # the source is unchanged

    fake.push(Reply(chunks=["Paris it is."]))
    ack = await client.ok("chat.send", {"sessionKey": new_key, "message": "Paris", "idempotencyKey": "f3"})
    assert ack["status"] == "started"
    await client.wait_terminal("f3")
    assert sent(fake) == [("user", "plan a trip"), ("assistant", "Where to?"), ("user", "Paris")]

    # sessions.create {parentSessionKey, fork: true}: the whole active branch
    created = await client.ok("sessions.create", {"parentSessionKey": KEY, "fork": True, "agentId": "llm"})
    assert created["ok"] is True and created["key"] not in (KEY, new_key)
    assert texts(await history(client, created["key"])) == texts(source)
    # a key in use is not taken over
    res = await client.call("sessions.create", {"key": new_key, "parentSessionKey": KEY, "fork": True})
    assert not res["ok"] and res["error"]["code"] == "CONFLICT"
    assert texts(await history(client, new_key))[-1] == ("assistant", "Paris it is.")


# --- refusals while the agent works ------------------------------------------------------------------


async def test_branch_changes_are_refused_while_a_run_is_active_or_queued(client, fake, use_agent):
    await say(client, fake, "b1", "hi", "hello")
    user, reply = ids(await history(client))
    fake.push(Reply(chunks=["slow", " one"], first_delay=1.5), Reply(chunks=["queued one"]))
    await client.ok("chat.send", {"sessionKey": KEY, "message": "take your time", "idempotencyKey": "b2"})
    for state in ("active", "queued"):
        if state == "queued":
            ack = await client.ok("chat.send", {"sessionKey": KEY, "message": "and then", "idempotencyKey": "b3"})
            assert ack["status"] == "queued"
        for method, params in (
            ("sessions.branches.switch", {"leafEntryId": reply}),
            ("sessions.rewind", {"entryId": user}),
            ("sessions.fork", {"entryId": user}),
            ("chat.regenerate", {"entryId": reply, "idempotencyKey": f"regen-{state}"}),
        ):
            res = await client.call(method, {"sessionKey": KEY, **params})
            assert not res["ok"] and res["error"]["code"] == "UNAVAILABLE", (state, method, res)
    await client.wait_terminal("b3", timeout=10)
    assert await database_sync_to_async(ChatSession.objects.count)() == 1  # no fork made
    assert await database_sync_to_async(Run.objects.filter(run_id__startswith="regen").count)() == 0
    # the branch is linear: each message follows the one before it
    assert texts(await history(client)) == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "take your time"),
        ("assistant", "slow one"),
        ("user", "and then"),
        ("assistant", "queued one"),
    ]


# --- two tabs ------------------------------------------------------------------------------------------


async def test_a_send_expecting_a_leaf_another_tab_switched_away_from_is_refused(client, tab2, fake, use_agent):
    res = await client.call(
        "chat.send", {"sessionKey": KEY, "message": "x", "idempotencyKey": "t0", "expectedLeafEntryId": "1"}
    )
    assert not res["ok"] and res["error"]["details"]["reason"] == "active-leaf-changed"
    await say(client, fake, "t1", "hello", "one", expectedLeafEntryId=None)
    leaf_seen_by_tab1 = ids(await history(client))[-1]

    # tab 2 regenerates the reply: the active leaf moves
    fake.push(Reply(chunks=["two"]))
    await regenerate(tab2, "t2", leaf_seen_by_tab1)
    await tab2.wait_terminal("t2")
    # tab 1 sends after what it showed: refused, nothing stored; it learns of the change
    stale = {"sessionKey": KEY, "message": "on top of one", "idempotencyKey": "t3"}
    res = await client.call("chat.send", {**stale, "expectedLeafEntryId": leaf_seen_by_tab1})
    assert not res["ok"] and res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"]["reason"] == "active-leaf-changed"
    assert await database_sync_to_async(Run.objects.filter(run_id="t3").exists)() is False

    # tab 2 switches back: tab 1's expectation holds again, its send goes on the branch it showed
    await tab2.ok("sessions.branches.switch", {"sessionKey": KEY, "leafEntryId": leaf_seen_by_tab1})
    await say(client, fake, "t4", "on top of one", "ok", expectedLeafEntryId=leaf_seen_by_tab1)
    assert sent(fake) == [("user", "hello"), ("assistant", "one"), ("user", "on top of one")]
    # and tab 2's stale leaf is now the one refused
    stale = ids(await history(tab2))[-3]
    res = await tab2.call(
        "chat.send", {"sessionKey": KEY, "message": "late", "idempotencyKey": "t5", "expectedLeafEntryId": stale}
    )
    assert not res["ok"] and res["error"]["details"]["reason"] == "active-leaf-changed"


async def test_two_tabs_switching_while_one_sends_never_lands_a_message_on_a_branch_it_did_not_expect(
    client, tab2, fake, use_agent
):
    await say(client, fake, "u1", "q", "a")
    a = ids(await history(client))[-1]
    fake.push(Reply(chunks=["b"]))
    await regenerate(client, "u2", a)
    await client.wait_terminal("u2")
    b = ids(await history(client))[-1]
    # tab 2 flips between the two branches while tab 1 sends expecting `a`, many times
    outcomes = []
    for i in range(6):
        target = a if i % 2 else b
        switch = await tab2.send("sessions.branches.switch", {"sessionKey": KEY, "leafEntryId": target})
        fake.push(Reply(chunks=[f"r{i}"]))
        res = await client.call(
            "chat.send", {"sessionKey": KEY, "message": f"m{i}", "idempotencyKey": f"u-{i}", "expectedLeafEntryId": a}
        )
        await tab2.response(switch)
        if res["ok"]:
            await client.wait_terminal(f"u-{i}")
            parent = await database_sync_to_async(
                lambda i=i: Message.objects.get(run__run_id=f"u-{i}", role="user").parent_id
            )()
            assert str(parent) == a  # it went where it was expected, or nowhere
            outcomes.append("sent")
            # back to `a` for the next round (its new leaf is now the tip of that branch)
            a = ids(await history(client))[-1]
        else:
            assert res["error"]["details"]["reason"] == "active-leaf-changed"
            outcomes.append("refused")
    assert "refused" in outcomes or "sent" in outcomes


# --- tool calls belong to their branch -------------------------------------------------------------------


async def test_the_model_of_a_regenerated_branch_is_not_sent_the_other_branchs_tool_calls(
    alice, fake, settings, tmp_path
):
    demo = {**settings.DEMO_MCP_SERVER, "env": {"AGENTGATE_NOTES_DIR": str(tmp_path)}}
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": agent_config(fake, mcp_servers={"demo": demo})}
    c = await open_client(alice[1], params=TOOL_CONNECT)
    try:
        call = ToolCallReply("demo__calculate", json.dumps({"expression": "6*7"}), id="call_a")
        fake.push(tool_reply(call, chunks=["Let me see."]), Reply(chunks=["42."]))
        await c.ok("chat.send", {"sessionKey": KEY, "message": "6*7?", "idempotencyKey": "w1"}, 30)
        assert (await c.wait_terminal("w1", timeout=30))["state"] == "final"
        fake.push(Reply(chunks=["Forty-two."]))
        await c.ok("chat.send", {"sessionKey": KEY, "message": "in words?", "idempotencyKey": "w2"})
        await c.wait_terminal("w2", timeout=30)
        roles = [m["role"] for m in fake.requests[-1].messages if m["role"] != "system"]
        assert roles == ["user", "assistant", "tool", "assistant", "user"]  # the call is on this branch

        reply = ids(await history(c))[1]  # the reply that called the tool
        fake.push(Reply(chunks=["It is 42."]))
        await regenerate(c, "w3", reply)
        await c.wait_terminal("w3", timeout=30)
        assert sent(fake) == [("user", "6*7?")]  # no call, no result, no later message
    finally:
        await c.close()


# --- what the gateway says it can do -------------------------------------------------------------------


async def test_the_branch_methods_are_advertised(client):
    methods = client.hello["features"]["methods"]
    for name in (*BRANCH_METHODS, "chat.regenerate"):
        assert name in methods


async def test_branch_list_of_an_unknown_or_empty_session_is_empty(client):
    assert await branches(client, "agent:main:never-used") == []
    res = await client.call("sessions.branches.switch", {"sessionKey": "agent:main:never-used", "leafEntryId": "1"})
    assert not res["ok"] and res["error"]["code"] == "NOT_FOUND"
