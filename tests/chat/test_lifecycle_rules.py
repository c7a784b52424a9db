"""§5-§8 over the wire: one terminal per run, abort ownership, queue hand-off, generations, races."""

import asyncio
import random

import pytest
from channels.db import database_sync_to_async

from chat.runtime.gateway import runtime
from sessions_app.lifecycle import runs
from tests.support.communicator import open_client
from tests.support.db import (
    audit,
    counts,
    rows_from_events,
    run_row,
    send_params,
    terminal_audit_count,
    terminal_events,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_abort_while_dispatching_never_calls_backend(client):
    await client.ok("chat.send", send_params("main", "slow [[delay:400]]", "k"))
    res = await client.ok("chat.abort", {"sessionKey": "main", "runId": "k"})
    assert res == {"aborted": True, "runIds": ["k"]}
    # persisted before the response: a list right now already shows it
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["status"] == "killed" and row["abortedLastRun"] and row["endedAt"] and not row["hasActiveRun"]
    ev = await client.wait_terminal("k")
    assert ev["state"] == "aborted" and ev["stopReason"] == "rpc"
    await client.drain(0.6)
    assert "running" not in [a[1] for a in await audit("k")]
    assert len(terminal_events(client.events, "k")) == 1


async def test_session_abort_pipelined_with_send_finds_the_run(client):
    rid_send = await client.send("chat.send", send_params("main", "x [[delay:200]]", "k"))
    rid_abort = await client.send("chat.abort", {"sessionKey": "main"})
    assert (await client.response(rid_send))["payload"]["status"] == "started"
    assert (await client.response(rid_abort))["payload"] == {"aborted": True, "runIds": ["k"]}


async def test_abort_then_late_dispatch_failure_changes_nothing(client, monkeypatch):
    """Hold the run in dispatching, abort it, then let the dispatch fail: the abort owns the run."""
    monkeypatch.setattr(runtime.executor, "cancel", lambda pk: None)  # the task is NOT stopped by the abort
    await client.ok("chat.send", send_params("main", "x [[delay:300]] [[fail:dispatch]]", "k"))
    assert (await client.ok("chat.abort", {"sessionKey": "main", "runId": "k"}))["aborted"] is True
    await client.drain(0.8)  # the dispatch failure happens in here
    terminals = terminal_events(client.events, "k")
    assert [t["state"] for t in terminals] == ["aborted"]
    run = await run_row("k")
    assert run.state == "killed" and run.error_kind == ""
    assert await terminal_audit_count("k") == 1
    assert (await client.ok("sessions.list"))["sessions"][0]["status"] == "killed"
    replay = await client.ok("chat.send", send_params("main", "x [[delay:300]] [[fail:dispatch]]", "k"))
    assert replay["status"] == "timeout"


async def test_abort_then_late_stream_completion_changes_nothing(client, monkeypatch):
    monkeypatch.setattr(runtime.executor, "cancel", lambda pk: None)
    await client.ok("chat.send", send_params("main", "a b c d e f [[tick:60]]", "k"))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("state") == "delta")
    await client.ok("chat.abort", {"sessionKey": "main", "runId": "k"})
    await client.drain(0.8)
    states = [e["state"] for e in client.chat_events("k")]
    assert states[-1] == "aborted" and states.count("aborted") == 1 and "final" not in states
    assert (await run_row("k")).state == "killed"


async def test_error_first_then_abort(client):
    await client.ok("chat.send", send_params("main", "[[fail:dispatch]]", "k"))
    await client.wait_terminal("k")
    assert await client.ok("chat.abort", {"sessionKey": "main", "runId": "k"}) == {"aborted": False, "runIds": []}
    await client.drain(0.2)
    assert [t["state"] for t in terminal_events(client.events, "k")] == ["error"]
    assert (await run_row("k")).state == "failed"


async def test_abort_unknown_or_foreign_run(client):
    await client.ok("chat.send", send_params("other", "hi", "k1", waitMs=3000))
    await client.ok("chat.send", send_params("main", "hi", "k2", waitMs=3000))
    assert await client.ok("chat.abort", {"sessionKey": "main", "runId": "nope"}) == {"aborted": False, "runIds": []}
    res = await client.call("chat.abort", {"sessionKey": "main", "runId": "k1"})
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert await client.ok("chat.abort", {"sessionKey": "main", "runId": "k2"}) == {"aborted": False, "runIds": []}


@pytest.mark.parametrize("trial", range(12))
async def test_abort_races_short_stream(alice, trial):
    """Abort at a random moment of a short stream: each receiver sees exactly one terminal."""
    a = await open_client(alice[1])
    b = await open_client(alice[1])
    key = f"k{trial}"
    await a.ok("chat.send", send_params("main", "w1 w2 [[tick:5]]", key))
    await asyncio.sleep(random.uniform(0, 0.05))
    res = await a.ok("chat.abort", {"sessionKey": "main", "runId": key})
    await a.wait_terminal(key)
    await b.wait_terminal(key)
    await a.drain(0.15)
    await b.drain(0.05)
    ta, tb = terminal_events(a.events, key), terminal_events(b.events, key)
    assert len(ta) == 1 and len(tb) == 1 and ta[0]["state"] == tb[0]["state"]
    assert (ta[0]["state"] == "aborted") == res["aborted"]
    for c in (a, b):
        seqs = [e["seq"] for e in c.chat_events(key)]
        assert seqs == sorted(set(seqs))
    run = await run_row(key)
    assert {"done": "final", "killed": "aborted"}[run.state] == ta[0]["state"]
    assert await terminal_audit_count(key) == 1
    row = (await a.ok("sessions.list"))["sessions"][0]
    assert row["status"] == run.state and not row["hasActiveRun"]
    await asyncio.gather(a.close(), b.close())


@pytest.mark.parametrize(
    "first, how",
    [
        ("x y z [[tick:60]] [[fail:stream]]", "error"),
        ("x [[delay:200]] [[fail:dispatch]]", "error"),
        ("[[hang]]", "abort"),
        ("[[hang]]", "timeout"),
        ("fine and slow [[tick:60]]", "final"),
    ],
)
async def test_queue_drains_after_every_kind_of_end(client, first, how):
    extra = {"timeoutMs": 1000} if how == "timeout" else {}
    await client.ok("chat.send", send_params("main", first, "r1", **extra))
    assert (await client.ok("chat.send", send_params("main", "second", "r2")))["status"] == "queued"
    assert (await client.ok("chat.send", send_params("main", "third", "r3")))["status"] == "queued"
    if how == "abort":
        await client.ok("chat.abort", {"sessionKey": "main", "runId": "r1"})
    await client.wait_terminal("r1", 4)
    assert (await client.wait_terminal("r2"))["state"] == "final"
    assert (await client.wait_terminal("r3"))["state"] == "final"
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["status"] == "done" and row["queuedRunIds"] == [] and row["lastRunId"] == "r3"


async def test_failed_session_accepts_next_message(client):
    await client.ok("chat.send", send_params("main", "[[fail:dispatch]]", "r1"))
    await client.wait_terminal("r1")
    assert (await client.ok("chat.send", send_params("main", "again", "r2")))["status"] == "started"
    assert (await client.wait_terminal("r2"))["state"] == "final"


async def test_disconnect_does_not_kill_the_run(alice):
    a = await open_client(alice[1])
    b = await open_client(alice[1])
    await a.ok("chat.send", send_params("main", "a b c [[tick:50]]", "k"))
    await a.close()
    assert (await b.wait_terminal("k"))["state"] == "final"
    await b.close()


async def test_reset_aborts_and_rotates(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    await client.ok("chat.send", send_params("main", "q", "b"))
    before = (await client.ok("sessions.list"))["sessions"][0]["sessionId"]
    row = (await client.ok("sessions.reset", {"sessionKey": "main"}))["session"]
    assert row["sessionId"] != before and row["status"] is None and not row["hasActiveRun"]
    assert (await client.wait_terminal("a"))["stopReason"] == "reset"
    assert (await client.wait_terminal("b"))["stopReason"] == "reset"
    hist = await client.ok("chat.history", {"sessionKey": "main"})
    assert hist["messages"] == []


async def test_late_transition_of_old_generation_never_touches_row(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    await client.ok("sessions.reset", {"sessionKey": "main"})
    row_before = (await client.ok("sessions.list"))["sessions"][0]
    run = await run_row("a")
    assert await database_sync_to_async(runs.finish_run)(run.pk, "done", owner_process="", reply="late") is False
    assert await database_sync_to_async(runs.mark_running)(run.pk) is False
    assert (await client.ok("sessions.list"))["sessions"][0] == row_before


async def test_delete_aborts_runs(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    assert (await client.ok("sessions.delete", {"sessionKey": "main"}))["deleted"] is True
    assert (await client.wait_terminal("a"))["stopReason"] == "delete"
    gone = await client.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "delete")
    assert gone["payload"]["session"]["deleted"] is True
    assert (await client.ok("sessions.list"))["totalCount"] == 0
    assert (await counts())["runs"] == 0


async def test_history_in_flight_and_paging(client):
    for i in range(3):
        await client.ok("chat.send", send_params("main", f"m{i}", f"k{i}", waitMs=3000))
    await client.ok("chat.send", send_params("main", "a b c d e f g h [[tick:80]]", "live"))
    await client.wait_event(
        lambda e: e["event"] == "chat" and e["payload"]["runId"] == "live" and e["payload"]["state"] == "delta"
    )
    hist = await client.ok("chat.history", {"sessionKey": "main", "limit": 4})
    assert hist["hasMore"] is True and len(hist["messages"]) == 4
    assert hist["inFlightRun"]["runId"] == "live" and hist["inFlightRun"]["text"].startswith("echo:")
    assert hist["session"]["hasActiveRun"] is True
    older = await client.ok("chat.history", {"sessionKey": "main", "beforeId": hist["messages"][0]["id"]})
    assert [m["role"] for m in older["messages"]] == ["user", "assistant", "user"]
    assert older["hasMore"] is False
    await client.ok("chat.abort", {"sessionKey": "main"})
    hist = await client.ok("chat.history", {"sessionKey": "main"})
    assert "inFlightRun" not in hist and hist["messages"][-1]["aborted"] is True


async def test_rows_from_events_equal_fresh_list(client):
    c = client
    await c.ok("sessions.create", {"sessionKey": "s1", "label": "one"})
    await c.ok("chat.send", send_params("s2", "[[hang]]", "a"))
    await c.ok("chat.send", send_params("s2", "next", "b"))
    await c.ok("sessions.patch", {"sessionKey": "s2", "label": "two"})
    await c.ok("chat.send", send_params("s3", "[[fail:dispatch]]", "c"))
    await c.ok("chat.abort", {"sessionKey": "s2", "runId": "a"})
    await c.ok("chat.send", send_params("s4", "x", "d"))
    await c.ok("sessions.delete", {"sessionKey": "s4"})
    await c.ok("sessions.reset", {"sessionKey": "s1"})
    await c.wait_terminal("b")
    await c.drain(0.3)
    fresh = {r["key"]: r for r in (await c.ok("sessions.list"))["sessions"]}
    assert rows_from_events(c.events) == fresh


async def test_sessions_crud(client):
    created = (await client.ok("sessions.create", {"label": "hello"}))["session"]
    assert created["key"].startswith("agent:main:s-") and created["status"] is None and created["label"] == "hello"
    dup = await client.call("sessions.create", {"sessionKey": created["key"]})
    assert dup["error"]["code"] == "CONFLICT"
    patched = (await client.ok("sessions.patch", {"sessionKey": created["key"], "label": "renamed"}))["session"]
    assert patched["label"] == "renamed" and patched["version"] > created["version"]
    listing = await client.ok("sessions.list", {"search": "renam"})
    assert listing["totalCount"] == 1
    # as OpenClaw's: patching a key not used yet creates the session (settings before the first message)
    made = (await client.ok("sessions.patch", {"sessionKey": "nope", "label": "x"}))["session"]
    assert made["key"] == "agent:main:nope" and made["label"] == "x" and made["status"] is None


async def test_list_filters_and_paging(client):
    for i in range(5):
        await client.ok("chat.send", send_params(f"s{i}", "x", f"k{i}", waitMs=3000))
    await client.ok("chat.send", send_params("live", "[[hang]]", "h"))
    page = await client.ok("sessions.list", {"limit": 2})
    assert page["count"] == 2 and page["totalCount"] == 6 and page["hasMore"] and page["nextOffset"] == 2
    assert page["sessions"][0]["key"] == "agent:main:live"
    assert (await client.ok("sessions.list", {"activeOnly": True}))["totalCount"] == 1
    assert (await client.ok("sessions.list", {"status": "done"}))["totalCount"] == 5
    bad = await client.call("sessions.list", {"limit": 0})
    assert bad["error"]["details"]["field"] == "limit"
