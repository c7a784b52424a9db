"""§13 promises through the real consumer, with the test MCP server (tests/support/mcp_test_server.py):
at most once across resends, limits, timeouts, caps on results, approval expiry, reset and delete,
a server that crashes, and repair of a missed result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.protocol.frames import encode
from sessions_app.models import LifecycleEvent, ToolApproval, ToolCall
from tests.support.communicator import open_client
from tests.support.db import open_tool_calls
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions, results

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def count_file(tmp_path: Path) -> Path:
    return tmp_path / "count.txt"


@pytest.fixture
def agent(settings: Any, count_file: Path) -> dict[str, Any]:
    config: dict[str, Any] = {
        "backend": "scripted",
        "model": "scripted",
        "mcp_servers": {
            "t": {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}
        },
        "approval": {"*": "never", "t.count": "always"},
    }
    settings.GATEWAY_AGENTS = {"main": config}
    return config


@pytest.fixture
async def tc(alice: tuple[Any, str], agent: dict[str, Any]) -> Any:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


async def send(client: Any, message: str, run_id: str) -> dict[str, Any]:
    res = await client.call("chat.send", {"sessionKey": "main", "message": message, "idempotencyKey": run_id})
    payload: dict[str, Any] = res["payload"]
    return payload


@database_sync_to_async
def call_rows() -> list[tuple[str, str, str]]:
    return list(ToolCall.objects.order_by("id").values_list("call_id", "state", "error_kind"))


async def test_resends_while_waiting_and_after_never_run_the_tool_again(tc: Any, count_file: Path) -> None:
    message = '[[tool:t.count {"arg": "x"}]]'
    assert (await send(tc, message, "c1"))["status"] == "started"
    requested = await tc.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    assert (await send(tc, message, "c1"))["status"] == "in_flight"
    await tc.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"})
    await tc.wait_terminal("c1", 20)
    for _ in range(3):
        assert (await send(tc, message, "c1"))["status"] == "ok"
    assert executions(count_file) == 1
    assert len(await call_rows()) == 1


async def test_each_call_ends_exactly_once_with_one_result_event(tc: Any) -> None:
    message = '[[tool:t.echo {"text": "a"}]] [[tool:t.fail {}]] [[tool:t.nope {}]] [[tool:t.echo "bad"]]'
    await send(tc, message, "e1")
    final = await tc.wait_terminal("e1", 20)
    assert final["state"] == "final"
    got = results(tc, "e1")
    assert [r["status"] for r in got] == ["succeeded", "failed", "failed"]
    assert len({r["toolCallId"] for r in got}) == 3
    rows = await call_rows()
    assert [s for _id, s, _k in rows] == ["succeeded", "failed", "failed"]
    assert [k for _id, _s, k in rows] == ["", "tool_error", "unknown_tool"]

    @database_sync_to_async
    def audit() -> list[tuple[str, str]]:
        return list(LifecycleEvent.objects.filter(tool_call__isnull=False).values_list("from_state", "to_state"))

    trail = await audit()
    assert ("running", "succeeded") in trail and ("", "pending") in trail


async def test_bad_json_arguments_fail_without_reaching_the_server(tc: Any, agent: dict[str, Any]) -> None:
    await send(tc, '[[tool:t.echo {"text": oops}]]', "b1")
    await tc.wait_terminal("b1", 20)
    (result,) = results(tc, "b1")
    assert result["status"] == "failed" and "not valid JSON" in result["result"]["content"][0]["text"]


async def test_call_limit_ends_the_run_with_tool_limit(tc: Any, agent: dict[str, Any]) -> None:
    agent["max_tool_calls"] = 2
    await send(tc, " ".join(['[[tool:t.echo {"text": "n"}]]'] * 3), "l1")
    final = await tc.wait_terminal("l1", 20)
    assert final["state"] == "final" and final["stopReason"] == "tool_limit"
    assert [r["status"] for r in results(tc, "l1")] == ["succeeded", "succeeded", "failed"]


async def test_tool_timeout_fails_just_the_call(tc: Any, agent: dict[str, Any], count_file: Path) -> None:
    agent["tool_timeout_ms"] = 500
    await send(tc, '[[tool:t.slow {"ms": 10000}]]', "t1")
    final = await tc.wait_terminal("t1", 20)
    assert final["state"] == "final"
    (result,) = results(tc, "t1")
    assert result["status"] == "failed" and "did not answer within 500 ms" in result["result"]["content"][0]["text"]
    assert (await call_rows())[0][2] == "tool_timeout"


async def test_run_timeout_while_a_tool_runs_cancels_the_call(tc: Any) -> None:
    await tc.call(
        "chat.send",
        {"sessionKey": "main", "message": '[[tool:t.slow {"ms": 10000}]]', "idempotencyKey": "t2", "timeoutMs": 1500},
    )
    end = await tc.wait_terminal("t2", 20)
    assert end["state"] == "error" and end["errorKind"] == "timeout"
    assert [r["status"] for r in results(tc, "t2")] == ["cancelled"]
    assert await open_tool_calls() == 0


async def test_big_result_is_capped_head_and_tail_and_every_frame_fits(tc: Any, agent: dict[str, Any]) -> None:
    agent["max_tool_result_bytes"] = 4096
    await send(tc, '[[tool:t.big {"n": 200000}]]', "g1")
    await tc.wait_terminal("g1", 20)
    (result,) = results(tc, "g1")
    text = result["result"]["content"][0]["text"]
    assert len(text.encode()) <= 4096 and "bytes cut" in text
    history = await tc.ok("chat.history", {"sessionKey": "main"})
    assert history["messages"][-1]["content"][0]["text"] == text  # the model, events and history see the same
    assert all(len(encode(f)) <= 1_048_576 for f in tc.frames)


async def test_approval_expiry_fails_closed(tc: Any, agent: dict[str, Any], count_file: Path) -> None:
    agent["approval_timeout_ms"] = 800
    await send(tc, '[[tool:t.count {"arg": "late"}]]', "x1")
    resolved = await tc.wait_event(lambda e: e["event"] == "plugin.approval.resolved", 20)
    assert resolved["payload"]["decision"] == "expired"
    await tc.wait_terminal("x1", 20)
    assert [r["status"] for r in results(tc, "x1")] == ["expired"]
    late = await tc.ok("plugin.approval.resolve", {"id": resolved["payload"]["id"], "decision": "allow-once"})
    assert late["decision"] == "expired"
    assert executions(count_file) == 0


@pytest.mark.parametrize("how", ["reset", "delete"])
async def test_reset_and_delete_cancel_a_pending_approval(tc: Any, how: str, count_file: Path) -> None:
    await send(tc, '[[tool:t.count {"arg": "r"}]]', "x2")
    requested = await tc.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    await tc.ok(f"sessions.{how}", {"sessionKey": "main"})
    if how == "reset":
        resolved = await tc.wait_event(lambda e: e["event"] == "plugin.approval.resolved", 5)
        assert resolved["payload"]["decision"] == "cancelled"
        assert await tc.ok("plugin.approval.list", {}) == []
    else:
        res = await tc.call("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"})
        assert not res["ok"] and res["error"]["code"] == "NOT_FOUND"  # gone with its session
    assert executions(count_file) == 0
    assert await open_tool_calls() == 0


async def test_a_crashing_server_fails_the_call_and_the_next_call_works(tc: Any) -> None:
    await send(tc, "[[tool:t.crash {}]]", "k1")
    await tc.wait_terminal("k1", 20)
    (result,) = results(tc, "k1")
    assert result["status"] == "failed"
    await send(tc, '[[tool:t.echo {"text": "back"}]]', "k2")
    final = await tc.wait_terminal("k2", 20)
    assert "back" in final["message"]["content"][0]["text"]


async def test_a_missed_result_is_repaired(tc: Any) -> None:
    """Drop the result on its way (the connection's filter never sees it): repair sends it, once."""
    from chat.delivery import connection

    original = connection.ConnectionState.tool_events
    dropped: list[str] = []

    def lossy(self: Any, message: Any) -> Any:
        if message["event"] == "result" and not dropped:
            dropped.append(message["call"])
            return []  # as if the layer lost it
        return original(self, message)

    connection.ConnectionState.tool_events = lossy  # type: ignore[method-assign]
    try:
        await send(tc, '[[tool:t.echo {"text": "r"}]]', "p1")
        await tc.wait_terminal("p1", 20)
        await tc.wait_event(
            lambda e: (
                e["event"] == "agent" and e["payload"]["stream"] == "tool" and e["payload"]["data"]["phase"] == "result"
            ),
            5,
        )
        await tc.drain(2.5)
    finally:
        connection.ConnectionState.tool_events = original  # type: ignore[method-assign]
    assert dropped
    assert [r["toolCallId"] for r in results(tc, "p1")] == dropped  # once, the one that was lost


async def test_pending_approval_sets_and_clears_waiting_for_with_one_row_each(tc: Any) -> None:
    await send(tc, '[[tool:t.count {"arg": "w"}]]', "w1")
    requested = await tc.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    rows = await tc.ok("sessions.list", {})
    assert rows["sessions"][0]["waitingFor"] == "approval" and rows["sessions"][0]["hasActiveRun"]
    await tc.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "deny"})
    await tc.wait_terminal("w1", 20)
    rows = await tc.ok("sessions.list", {})
    assert rows["sessions"][0]["waitingFor"] is None

    @database_sync_to_async
    def approval_row() -> tuple[str, str]:
        a = ToolApproval.objects.get()
        return a.decision, a.decided_by

    assert await approval_row() == ("deny", "alice")


@database_sync_to_async
def admin_page(name: str, *args: Any, **query: str) -> str:
    """An admin page as a superuser sees it."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    root, _ = get_user_model().objects.get_or_create(username="root", defaults={"is_staff": True, "is_superuser": True})
    browser = Client()
    browser.force_login(root)
    res = browser.get(reverse(name, args=args), query)
    assert res.status_code == 200
    return res.content.decode()


async def test_every_ended_call_says_its_error_kind_in_events_history_and_the_admin(
    tc: Any, agent: dict[str, Any]
) -> None:
    """TOOLS.md §13.6: a tool's own timeout ends the call `failed` with `errorKind: "tool_timeout"`;
    every ended call that has a kind says it the same in its `result` event, its `toolResult`
    message, `inFlightRun.tools` and the admin (a call that succeeded has none)."""
    agent["tool_timeout_ms"] = 500
    agent["tools"] = ["t.slow", "t.echo", "t.count"]  # t.big is not allowed
    message = (
        '[[tool:t.slow {"ms": 10000}]] [[tool:t.echo {"text": oops}]] [[tool:t.big {"n": 1}]] '
        '[[tool:t.echo {"text": "fine"}]] [[tool:t.count {"arg": "no"}]]'
    )
    await send(tc, message, "k1")
    requested = await tc.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    # the run is still open (t.count waits for approval): its ended calls say their kind there too
    open_run = (await tc.ok("chat.history", {"sessionKey": "main"}))["inFlightRun"]
    kinds = ["tool_timeout", "bad_arguments", "unknown_tool", None]
    assert [t.get("errorKind") for t in open_run["tools"]] == [*kinds, None], open_run["tools"]
    await tc.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "deny"})
    assert (await tc.wait_terminal("k1", 20))["state"] == "final"

    kinds.append("deny")
    got = results(tc, "k1")
    assert [r["status"] for r in got] == ["failed", "failed", "failed", "succeeded", "denied"]
    assert [r.get("errorKind") for r in got] == kinds, got
    history = await tc.ok("chat.history", {"sessionKey": "main"})
    tool_results = [m for m in history["messages"] if m["role"] == "toolResult"]
    assert [m.get("errorKind") for m in tool_results] == kinds, tool_results
    assert [m["toolCallId"] for m in tool_results] == [r["toolCallId"] for r in got]

    timed_out = got[0]["toolCallId"]
    listed = await admin_page("admin:sessions_app_toolcall_changelist", error_kind="tool_timeout")
    assert timed_out in listed and got[1]["toolCallId"] not in listed
    call_pk = (await call_rows_by_id())[timed_out]
    assert "error: tool_timeout" in await admin_page("admin:sessions_app_toolcall_change", call_pk)


@database_sync_to_async
def call_rows_by_id() -> dict[str, int]:
    return dict(ToolCall.objects.values_list("call_id", "pk"))
