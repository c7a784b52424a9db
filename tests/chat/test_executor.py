"""Faults around a run's worker: nothing may leave a session `running` with nothing behind it.

Each test injects a fault into one step (a transient database error, a failing or slow
broadcast, a deleted session under a held ack) and checks that the run still ends,
the queue still drains, and clients still hear exactly one honest outcome.
"""

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError

from chat.delivery import broadcaster
from chat.runtime import executor as ex
from sessions_app.lifecycle import runs
from sessions_app.models import Run
from tests.support.communicator import open_client
from tests.support.db import run_row, send_params, terminal_events

pytestmark = pytest.mark.django_db(transaction=True)


def flaky(real, failures: int, exc: Exception):
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= failures:
            raise exc
        return real(*args, **kwargs)

    return wrapper


async def test_db_error_while_preparing_the_run_still_ends_it(client, monkeypatch):
    failing = flaky(ex.inputs.context_for, 1, OperationalError("database is locked"))
    monkeypatch.setattr(ex.inputs, "context_for", failing)
    assert (await client.ok("chat.send", send_params("main", "hello", "k1")))["status"] == "started"
    ev = await client.wait_terminal("k1", 5)
    assert ev["state"] == "error"
    assert (await client.ok("chat.send", send_params("main", "next", "k2")))["status"] == "started"
    assert (await client.wait_terminal("k2"))["state"] == "final"


async def test_db_errors_while_ending_the_run_are_retried(client, monkeypatch):
    monkeypatch.setattr(runs, "finish_run", flaky(runs.finish_run, 2, OperationalError("locked")))
    await client.ok("chat.send", send_params("main", "hello", "k1"))
    assert (await client.wait_terminal("k1", 8))["state"] == "final"
    assert (await run_row("k1")).state == "done"


async def test_failing_broadcast_never_costs_the_run_its_worker(client, monkeypatch):
    monkeypatch.setattr(broadcaster, "send_batch", flaky(broadcaster.send_batch, 1, OperationalError("gone")))
    res = await client.call("chat.send", send_params("main", "hello", "k1"))
    assert res["ok"] and res["payload"]["status"] == "started"
    assert (await client.wait_terminal("k1", 5))["state"] == "final"


async def test_slow_final_broadcast_does_not_lose_the_queued_successor(client, monkeypatch, settings):
    """The reconcile loop must not cancel a run's task while it broadcasts its own end."""
    real = broadcaster.send_batch

    async def slow(sends):
        for _group, message in sends:
            if message["type"] == "gateway.chat" and message["runId"] == "r1" and message["state"] == "final":
                await asyncio.sleep(settings.GATEWAY_REPAIR_SECONDS * 2.5)
                break
        await real(sends)

    monkeypatch.setattr(broadcaster, "send_batch", slow)
    await client.ok("chat.send", send_params("main", "one", "r1"))
    await client.ok("chat.send", send_params("main", "two", "r2"))
    assert (await client.wait_terminal("r2", settings.GATEWAY_REPAIR_SECONDS * 8))["state"] == "final"


async def test_run_lost_by_its_process_is_picked_up(client, monkeypatch, settings):
    """A committed hand-off whose submit never happened (the hook was lost) is executed anyway."""
    from chat.runtime import hooks

    monkeypatch.setattr(hooks, "run_dispatching", lambda run, owner: None)
    await client.ok("chat.send", send_params("main", "hello", "k1"))
    assert (await client.wait_terminal("k1", settings.GATEWAY_REPAIR_SECONDS * 4))["state"] == "final"


async def test_normal_completion_is_not_a_cancellation(client):
    await client.ok("chat.send", send_params("main", "hello", "k1"))
    await client.wait_terminal("k1")
    await client.drain(0.3)
    assert (await run_row("k1")).cancel_ms is None


async def test_abort_records_cancellation_time(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "k1"))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("phase") == "running")
    await client.ok("chat.abort", {"sessionKey": "main"})
    await client.wait_terminal("k1")
    for _ in range(20):
        if (await run_row("k1")).cancel_ms is not None:
            break
        await asyncio.sleep(0.05)
    assert (await run_row("k1")).cancel_ms is not None


async def test_held_ack_of_deleted_session_is_terminal(client):
    rid = await client.send("chat.send", send_params("main", "x [[hang]]", "k", waitMs=3000))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("phase") == "dispatching")
    await client.ok("sessions.delete", {"sessionKey": "main"})
    ack = await client.response(rid, timeout=5)
    assert ack["payload"]["status"] == "timeout" and ack["payload"]["stopReason"] == "delete"


async def test_held_queued_ack_has_a_fresh_position(client):
    await client.ok("chat.send", send_params("main", "a b c [[tick:100]]", "k1"))
    rid = await client.send("chat.send", send_params("main", "[[hang]]", "k2", waitMs=600))
    ack = await client.response(rid, timeout=5)
    assert ack["payload"]["status"] == "started"  # k1 ended while the ack was held: k2 runs now
    assert "queuePosition" not in ack["payload"]


async def test_held_acks_are_capped_per_connection(client, settings):
    settings.GATEWAY_MAX_HELD_ACKS = 2
    for i in range(2):
        await client.send("chat.send", send_params(f"s{i}", "[[hang]]", f"k{i}", waitMs=5000))
    await asyncio.sleep(0.3)
    before = await database_sync_to_async(Run.objects.count)()
    res = await client.call("chat.send", send_params("s9", "[[hang]]", "k9", waitMs=5000))
    assert res["error"]["code"] == "RATE_LIMITED" and res["error"]["details"]["reason"] == "too-many-held-acks"
    assert await database_sync_to_async(Run.objects.count)() == before
    ok = await client.ok("chat.send", send_params("s9", "hi", "k9"))  # without waitMs: fine
    assert ok["status"] == "started"


async def test_connection_that_missed_every_event_gets_the_terminal(alice, settings):
    """Tab B drops out of the group for a whole run: repair still brings it the terminal."""
    a = await open_client(alice[1])
    b = await open_client(alice[1])
    from channels.layers import get_channel_layer

    from chat.delivery import groups

    # find B's consumer channel through the layer's group membership
    layer = get_channel_layer()
    members = list(layer.groups[groups.user_group(alice[0].pk)])
    for name in members:
        await layer.group_discard(groups.user_group(alice[0].pk), name)
    await layer.group_add(groups.user_group(alice[0].pk), members[0])  # only one connection hears events
    await a.ok("chat.send", send_params("main", "hello", "k1"))
    for c in (a, b):
        ev = await c.wait_terminal("k1", settings.GATEWAY_REPAIR_SECONDS * 3)
        assert ev["state"] == "final"
        await c.drain(settings.GATEWAY_REPAIR_SECONDS)
        assert len(terminal_events(c.events, "k1")) == 1
    await asyncio.gather(a.close(), b.close())


async def test_stop_on_a_new_key_announces_the_session(client):
    await client.ok("chat.send", send_params("fresh", "/stop", "s1"))
    changed = await client.wait_event(lambda e: e["event"] == "sessions.changed")
    assert changed["payload"]["reason"] == "create" and changed["payload"]["sessionKey"] == "agent:main:fresh"


# --- `running`, coalesced as deltas are -------------------------------------------------------------


def _chat_steps(client, run_id):
    return [(e["state"] if e["state"] != "status" else e["phase"], e["seq"]) for e in client.chat_events(run_id)]


async def test_a_reply_within_one_interval_is_its_steps_in_order_from_one_write(client, monkeypatch):
    """`running`, the reply's one delta and `final` come from the run's one write after admission,
    each event at its own seq, in order, as they came from three writes before."""
    writes: list[str] = []
    real = ex.db_write

    async def counted(fn, *args, **kwargs):
        writes.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(ex, "db_write", counted)
    await client.ok("chat.send", send_params("main", "[[tick:0]] the quick brown fox", "k1"))
    await client.wait_terminal("k1")
    await client.drain(0.2)
    assert writes == ["finish_run"]
    assert _chat_steps(client, "k1") == [("dispatching", 1), ("running", 2), ("delta", 3), ("final", 4)]
    delta = client.chat_events("k1")[2]
    assert delta["message"]["content"][0]["text"] == delta["deltaText"] == "echo: the quick brown fox"
    assert [e["data"]["phase"] for e in client.agent_events("k1") if e["stream"] == "lifecycle"] == [
        "start",
        "running",
        "end",
    ]
    assert (await run_row("k1")).reply == "echo: the quick brown fox"


async def test_a_silent_run_is_running_once_its_first_interval_ends(client, settings):
    settings.GATEWAY_DELTA_INTERVAL_MS = 100
    await client.ok("chat.send", send_params("main", "[[hang]]", "k1"))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("phase") == "running", 5)
    assert (await run_row("k1")).state == "running"
    assert _chat_steps(client, "k1") == [("dispatching", 1), ("running", 2)]
    await client.ok("chat.abort", {"sessionKey": "main"})
    assert (await client.wait_terminal("k1"))["state"] == "aborted"


async def test_a_tool_step_before_any_text_comes_after_running(alice, settings):
    """A model that calls a tool first: its run is `running` before the call is recorded."""
    import sys

    from tests.support.tools import TEST_SERVER, TOOL_CONNECT

    settings.GATEWAY_DELTA_INTERVAL_MS = 60_000  # no interval ends during the turn: the step writes it
    settings.GATEWAY_AGENTS = {
        "main": {
            "backend": "scripted",
            "mcp_servers": {"t": {"command": sys.executable, "args": [TEST_SERVER]}},
            "approval": {"*": "never"},
        }
    }
    client = await open_client(alice[1], params=TOOL_CONNECT)
    try:
        await client.ok("chat.send", send_params("main", '[[tick:0]] [[tool:t.echo {"text": "x"}]]', "k1"), timeout=20)
        assert (await client.wait_terminal("k1", 20))["state"] == "final"
        await client.drain(0.2)

        def step(event):  # the run's `running` and its tool events, in the order received
            payload = event["payload"]
            if event["event"] == "chat" and payload.get("phase") == "running":
                return "running"
            return "tool" if event["event"] == "agent" and payload["stream"] == "tool" else None

        order = [step(e) for e in client.events if e["payload"].get("runId") == "k1" and step(e)]
        assert order[0] == "running" and "tool" in order[1:], order
    finally:
        await client.close()
