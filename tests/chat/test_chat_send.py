"""§4: every chat.send ack status, commands, validation that stores nothing."""

import asyncio

import pytest

from tests.support.communicator import open_client
from tests.support.db import audit, counts, run_row, send_params, terminal_events

pytestmark = pytest.mark.django_db(transaction=True)


async def test_started_then_final_then_ok_replay(client):
    ack = await client.ok("chat.send", send_params("main", "hello there", "r1"))
    assert ack["status"] == "started" and ack["runId"] == "r1" and ack["sessionKey"] == "agent:main:main"
    final = await client.wait_terminal("r1")
    assert final["state"] == "final" and final["stopReason"] == "stop"
    assert final["message"]["content"][0]["text"] == "echo: hello there"
    events = client.chat_events("r1")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert any(e["state"] == "delta" for e in events)
    replay = await client.ok("chat.send", send_params("main", "hello there", "r1"))
    assert replay["status"] == "ok" and replay["reply"] == "echo: hello there"
    await client.drain(0.2)
    assert len(terminal_events(client.events, "r1")) == 1
    assert [a[1] for a in await audit("r1")] == ["dispatching", "running", "done"]


async def test_queued_with_position_then_runs_in_order(client):
    await client.ok("chat.send", send_params("main", "one [[tick:60]] a b c", "a"))
    q1 = await client.ok("chat.send", send_params("main", "two", "b"))
    q2 = await client.ok("chat.send", send_params("main", "three", "c"))
    assert (q1["status"], q1["queuePosition"]) == ("queued", 1)
    assert (q2["status"], q2["queuePosition"]) == ("queued", 2)
    dup = await client.ok("chat.send", send_params("main", "three", "c"))
    assert dup["status"] == "in_flight" and dup["queuePosition"] == 2
    finals = [await client.wait_terminal(r) for r in ("a", "b", "c")]
    assert [f["state"] for f in finals] == ["final"] * 3
    ends = [i for i, e in enumerate(client.events) if e["event"] == "chat" and e["payload"]["state"] == "final"]
    order = [client.events[i]["payload"]["runId"] for i in ends]
    assert order == ["a", "b", "c"]


async def test_in_flight_for_active_duplicate(client):
    await client.ok("chat.send", send_params("main", "x [[hang]]", "h"))
    dup = await client.ok("chat.send", send_params("main", "x [[hang]]", "h"))
    assert dup["status"] == "in_flight"
    assert (await counts())["runs"] == 1


async def test_conflict_on_same_key_different_message(client):
    await client.ok("chat.send", send_params("main", "first", "k"))
    res = await client.call("chat.send", send_params("main", "second", "k"))
    assert res["error"]["code"] == "CONFLICT"
    assert res["error"]["details"]["reason"] == "idempotency-conflict"
    await client.wait_terminal("k")
    assert (await run_row("k")).message == "first"


async def test_timeout_ack_for_aborted_run(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "h"))
    res = await client.ok("chat.abort", {"sessionKey": "main", "runId": "h"})
    assert res == {"aborted": True, "runIds": ["h"]}
    replay = await client.ok("chat.send", send_params("main", "[[hang]]", "h"))
    assert replay["status"] == "timeout" and replay["stopReason"] == "rpc"


async def test_run_budget_timeout(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "t", timeoutMs=1000))
    ev = await client.wait_terminal("t", 4)
    assert ev["state"] == "error" and ev["errorKind"] == "timeout" and "timeoutMs" in ev["errorMessage"]
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["status"] == "timeout" and not row["hasActiveRun"]
    replay = await client.ok("chat.send", send_params("main", "[[hang]]", "t", timeoutMs=1000))
    assert replay["status"] == "timeout" and replay["stopReason"] == "timeout"


async def test_fail_setup_is_error_ack_persisted_failed(client):
    res = await client.call("chat.send", send_params("main", "x [[fail:setup]]", "s"))
    assert res["ok"] is False and res["error"]["code"] == "UNAVAILABLE"
    assert res["payload"]["status"] == "error" and res["payload"]["summary"]
    changed = await client.wait_event(
        lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "chat.dispatch-error"
    )
    assert changed["payload"]["session"]["status"] == "failed" and not changed["payload"]["session"]["hasActiveRun"]
    await client.drain(0.2)
    assert client.chat_events("s") == []  # a terminal ack: nothing for this run follows on this connection
    run = await run_row("s")
    assert run.state == "failed" and run.error_kind == "dispatch"
    again = await client.call("chat.send", send_params("main", "x [[fail:setup]]", "s"))
    assert again["payload"]["status"] == "error"


async def test_fail_dispatch_after_ack(client):
    ack = await client.ok("chat.send", send_params("main", "x [[fail:dispatch]]", "d"))
    assert ack["status"] == "started"
    ev = await client.wait_terminal("d")
    assert ev["state"] == "error" and ev["errorKind"] == "dispatch"
    changed = await client.wait_event(
        lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "chat.dispatch-error"
    )
    row = changed["payload"]["session"]
    assert row["status"] == "failed" and row["hasActiveRun"] is False and row["lastRunId"] == "d"
    listed = (await client.ok("sessions.list"))["sessions"][0]
    assert listed == row  # nothing changed the session after the failure it announced


async def test_fail_stream_keeps_partial_text(client):
    await client.ok("chat.send", send_params("main", "a b c d [[fail:stream]]", "f"))
    ev = await client.wait_terminal("f")
    assert ev["state"] == "error" and ev["errorKind"] == "backend"
    assert ev["message"]["content"][0]["text"].startswith("echo:")
    hist = await client.ok("chat.history", {"sessionKey": "main"})
    assert hist["messages"][-1]["aborted"] is True


async def test_wait_ms_returns_terminal_ack(client):
    ack = await client.ok("chat.send", send_params("main", "quick", "w", waitMs=5000))
    assert ack["status"] == "ok" and ack["reply"] == "echo: quick"


async def test_wait_ms_expires_with_started(client):
    ack = await client.ok("chat.send", send_params("main", "[[hang]]", "w", waitMs=300))
    assert ack["status"] == "started"
    # the held ack did not block the connection: abort works and is answered
    assert (await client.ok("chat.abort", {"sessionKey": "main"}))["runIds"] == ["w"]


async def test_wait_ms_does_not_block_other_requests(client):
    rid = await client.send("chat.send", send_params("main", "[[hang]]", "w", waitMs=3000))
    res = await client.ok("chat.abort", {"sessionKey": "main", "runId": "w"})
    assert res["aborted"] is True
    held = await client.response(rid)
    assert held["payload"]["status"] == "timeout" and held["payload"]["stopReason"] == "rpc"


async def test_queue_full(settings, client):
    settings.GATEWAY_QUEUE_MAX = 2
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    await client.ok("chat.send", send_params("main", "b", "b"))
    await client.ok("chat.send", send_params("main", "c", "c"))
    # `a` is stored `running` a delta interval after its start (it has no text): counted after that
    for _ in range(200):
        if (await run_row("a")).state == "running":
            break
        await asyncio.sleep(0.02)
    before = await counts()
    res = await client.call("chat.send", send_params("main", "d", "d"))
    assert res["error"]["code"] == "RATE_LIMITED" and res["error"]["details"]["reason"] == "queue-full"
    assert await counts() == before


async def test_interrupt_aborts_active_and_keeps_queue(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    await client.ok("chat.send", send_params("main", "queued one", "b"))
    ack = await client.ok("chat.send", send_params("main", "urgent", "c", queueMode="interrupt"))
    assert ack["status"] == "started" and ack["interruptedActiveRun"] is True
    aborted = await client.wait_terminal("a")
    assert aborted["state"] == "aborted" and aborted["stopReason"] == "interrupt"
    assert (await client.wait_terminal("c"))["state"] == "final"
    assert (await client.wait_terminal("b"))["state"] == "final"


async def test_queue_mode_steer_on_a_backend_that_takes_no_steering_is_a_follow_up(client):
    """OpenClaw's Control UI sends `queueMode: "steer"` when the user types during a run. The scripted
    agent takes no steering (docs/protocol-notes.md, "Steering"): the message waits as a follow-up, in
    order behind the queue, and the run is not stopped."""
    await client.ok("chat.send", send_params("main", "[[delay:300]] first", "a"))
    await client.ok("chat.send", send_params("main", "queued one", "b"))
    ack = await client.ok("chat.send", send_params("main", "new direction", "c", queueMode="steer"))
    assert ack["status"] == "queued" and ack["runId"] == "c" and ack["queuePosition"] == 2 and "steered" not in ack
    assert (await client.wait_terminal("a"))["state"] == "final"
    assert (await client.wait_terminal("b"))["state"] == "final"
    assert (await client.wait_terminal("c"))["state"] == "final"
    # on an idle session it simply starts; a replay is a replay
    assert (await client.ok("chat.send", send_params("main", "idle", "d", queueMode="steer")))["status"] == "started"
    assert (await client.ok("chat.send", send_params("main", "new direction", "c")))["status"] == "ok"


async def test_steer_keeps_terminal_status(client):
    ack = await client.ok("sessions.steer", send_params("main", "[[hang]]", "a"))
    assert ack["status"] == "started"
    ack2 = await client.ok("sessions.steer", send_params("main", "new direction", "b"))
    assert ack2["status"] == "queued"
    await client.ok("chat.abort", {"sessionKey": "main", "runId": "a"})
    assert (await client.wait_terminal("a"))["stopReason"] == "rpc"
    await client.wait_terminal("b")
    replay = await client.ok("sessions.steer", send_params("main", "new direction", "b"))
    assert replay["status"] == "ok"
    failed = await client.call("sessions.steer", send_params("main", "[[fail:setup]]", "c"))
    assert failed["ok"] is False and failed["payload"]["status"] == "error"


async def test_stop_command(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    await client.ok("chat.send", send_params("main", "later", "b"))
    res = await client.ok("chat.send", send_params("main", "/stop", "s1"))
    assert res["status"] == "ok" and res["aborted"] is True and sorted(res["runIds"]) == ["a", "b"]
    assert (await client.wait_terminal("a"))["stopReason"] == "stop"
    assert (await client.wait_terminal("b"))["stopReason"] == "stop"
    assert (await counts())["runs"] == 2  # the command created no run


async def test_new_command_rotates_session(client):
    first = await client.ok("chat.send", send_params("main", "hi", "a", waitMs=3000))
    res = await client.ok("chat.send", send_params("main", "/new", "n1"))
    assert res["status"] == "ok" and res["sessionId"] != first["sessionId"]
    hist = await client.ok("chat.history", {"sessionKey": "main"})
    assert hist["messages"] == [] and hist["sessionId"] == res["sessionId"]


@pytest.mark.parametrize(
    "params",
    [
        send_params("main", "", "e"),
        send_params("main", 5, "e"),
        send_params("main", "hi", ""),
        send_params("bad key", "hi", "e"),
        send_params("agent:ghost:main", "hi", "e"),
        send_params("main", "hi", "e", timeoutMs=10),
    ],
)
async def test_invalid_send_stores_nothing(client, params):
    res = await client.call("chat.send", params)
    assert not res["ok"] and res["error"]["code"] in ("INVALID_REQUEST", "NOT_FOUND")
    assert await counts() == {"sessions": 0, "runs": 0, "messages": 0, "audit": 0}


async def test_users_do_not_see_each_other(client, make_user):
    from channels.db import database_sync_to_async

    _bob, token = await database_sync_to_async(make_user)("bob")
    bob = await open_client(token)
    await client.ok("chat.send", send_params("secret", "mine", "a", waitMs=3000))
    assert (await bob.ok("sessions.list"))["totalCount"] == 0
    for method, params in [
        ("chat.abort", {"sessionKey": "secret"}),
        ("sessions.reset", {"sessionKey": "secret"}),
        ("sessions.delete", {"sessionKey": "secret"}),
    ]:
        res = await bob.call(method, params)
        assert res["error"]["code"] == "NOT_FOUND", method
    hist = await bob.ok("chat.history", {"sessionKey": "secret"})
    assert hist["messages"] == []
    await bob.drain(0.2)
    assert [e for e in bob.events if e["event"] in ("chat", "sessions.changed")] == []
    # sessions.patch creates a key not used yet (as OpenClaw's): bob's own "secret", not alice's
    bobs = (await bob.ok("sessions.patch", {"sessionKey": "secret", "label": "x"}))["session"]
    assert bobs["label"] == "x" and bobs["status"] is None
    alices = (await client.ok("sessions.list"))["sessions"]
    assert [(r["key"], r["label"], r["status"]) for r in alices] == [("agent:main:secret", "", "done")]
    await bob.close()


async def test_two_connections_same_key_at_once(alice):
    a = await open_client(alice[1])
    b = await open_client(alice[1])
    for i in range(5):
        key = f"race{i}"
        ra = await a.send("chat.send", send_params("main", f"m{i}", key))
        rb = await b.send("chat.send", send_params("main", f"m{i}", key))
        acks = [(await a.response(ra))["payload"]["status"], (await b.response(rb))["payload"]["status"]]
        assert sorted(acks) in (
            ["in_flight", "started"],
            ["in_flight", "queued"],
            ["ok", "started"],
            ["ok", "queued"],
        ), acks
        await a.wait_terminal(key)
    assert (await counts())["runs"] == 5
    await asyncio.gather(a.close(), b.close())
