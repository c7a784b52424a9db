"""§13 through the real consumer with the built-in demo MCP server: the scripted directive, events,
approvals (allow, deny, abort), history, and the row's `waitingFor`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.communicator import open_client
from tests.support.db import open_tool_calls
from tests.support.tools import TOOL_CONNECT, tool_events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def notes_dir(tmp_path: Path, settings: Any) -> Path:
    server = {**settings.DEMO_MCP_SERVER, "env": {"AGENTGATE_NOTES_DIR": str(tmp_path)}}
    settings.GATEWAY_AGENTS = {"main": {"backend": "scripted", "model": "scripted", "mcp_servers": {"demo": server}}}
    return tmp_path


@pytest.fixture
async def tool_client(alice: tuple[Any, str], notes_dir: Path) -> Any:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


async def send(client: Any, message: str, run_id: str) -> dict[str, Any]:
    return await client.ok("chat.send", {"sessionKey": "main", "message": message, "idempotencyKey": run_id})


async def test_read_only_tool_runs_without_approval_and_is_in_history(tool_client: Any) -> None:
    ack = await send(tool_client, 'calc [[tool:demo.calculate {"expression": "6*7"}]]', "r1")
    assert ack["status"] == "started"
    final = await tool_client.wait_terminal("r1", timeout=20)
    assert final["state"] == "final", final
    assert "42" in final["message"]["content"][0]["text"]
    start, result = tool_events(tool_client, "r1")
    assert start["phase"] == "start" and start["name"] == "demo.calculate" and start["args"] == {"expression": "6*7"}
    assert result["phase"] == "result" and result["status"] == "succeeded" and not result["isError"]
    assert result["toolCallId"] == start["toolCallId"] and start["toolCallId"].startswith("tc_")
    history = await tool_client.ok("chat.history", {"sessionKey": "main"})
    roles = [m["role"] for m in history["messages"]]
    assert roles == ["user", "assistant", "toolResult"], roles
    blocks = history["messages"][1]["content"]
    assert {
        "type": "toolCall",
        "id": start["toolCallId"],
        "name": "demo.calculate",
        "arguments": {"expression": "6*7"},
    } in blocks
    assert history["messages"][2]["toolCallId"] == start["toolCallId"]
    assert "42" in history["messages"][2]["content"][0]["text"]


async def test_writing_tool_waits_for_approval_then_runs_once(tool_client: Any, notes_dir: Path) -> None:
    await send(tool_client, 'note [[tool:demo.add_note {"text": "buy milk"}]]', "r2")
    requested = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    approval = requested["payload"]
    assert approval["request"]["toolName"] == "demo.add_note"
    assert approval["request"]["allowedDecisions"] == ["allow-once", "deny"]
    assert approval["expiresAtMs"] > approval["createdAtMs"]
    row = await tool_client.wait_event(
        lambda e: e["event"] == "sessions.changed" and e["payload"]["session"].get("waitingFor") == "approval"
    )
    assert row["payload"]["session"]["status"] == "running"
    listed = await tool_client.ok("plugin.approval.list", {})
    assert [a["id"] for a in listed] == [approval["id"]]
    assert not (notes_dir / "notes.jsonl").exists()  # nothing ran before the decision
    resolved = await tool_client.ok("plugin.approval.resolve", {"id": approval["id"], "decision": "allow-once"})
    assert resolved["decision"] == "allow-once" and resolved["resolvedBy"] == "alice"
    again = await tool_client.ok("plugin.approval.resolve", {"id": approval["id"], "decision": "deny"})
    assert again["decision"] == "allow-once"  # the first decision wins
    final = await tool_client.wait_terminal("r2", timeout=20)
    assert final["state"] == "final", final
    lines = (notes_dir / "notes.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["text"] == "buy milk"
    assert [d["status"] for d in tool_events(tool_client, "r2") if d["phase"] == "result"] == ["succeeded"]
    assert await tool_client.ok("plugin.approval.list", {}) == []
    rows = await tool_client.ok("sessions.list", {})
    assert rows["sessions"][0]["waitingFor"] is None


async def test_denied_call_never_runs_and_the_reply_says_so(tool_client: Any, notes_dir: Path) -> None:
    await send(tool_client, 'note [[tool:demo.add_note {"text": "x"}]]', "r3")
    requested = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    await tool_client.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "deny"})
    final = await tool_client.wait_terminal("r3", timeout=20)
    assert "denied" in final["message"]["content"][0]["text"]
    result = [d for d in tool_events(tool_client, "r3") if d["phase"] == "result"]
    assert [r["status"] for r in result] == ["denied"]
    assert not (notes_dir / "notes.jsonl").exists()


async def test_abort_while_waiting_for_approval_cancels_it_in_the_same_transaction(tool_client: Any) -> None:
    await send(tool_client, 'note [[tool:demo.add_note {"text": "y"}]]', "r4")
    requested = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    await tool_client.ok("chat.abort", {"sessionKey": "main", "runId": "r4"})
    end = await tool_client.wait_terminal("r4")
    assert end["state"] == "aborted"
    resolved = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.resolved")
    assert resolved["payload"]["decision"] == "cancelled" and resolved["payload"]["id"] == requested["payload"]["id"]
    late = await tool_client.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"})
    assert late["decision"] == "cancelled"
    results = [d for d in tool_events(tool_client, "r4") if d["phase"] == "result"]
    assert [r["status"] for r in results] == ["cancelled"]
    rows = await tool_client.ok("sessions.list", {})
    assert rows["sessions"][0]["waitingFor"] is None and rows["sessions"][0]["status"] == "killed"
    assert await open_tool_calls() == 0


async def test_unknown_tool_fails_without_reaching_a_server(tool_client: Any) -> None:
    await send(tool_client, "[[tool:demo.nope {}]]", "r5")
    final = await tool_client.wait_terminal("r5", timeout=20)
    assert final["state"] == "final"
    (result,) = [d for d in tool_events(tool_client, "r5") if d["phase"] == "result"]
    assert (
        result["status"] == "failed" and result["isError"] and "unknown tool" in result["result"]["content"][0]["text"]
    )


async def test_other_users_cannot_see_or_answer_an_approval(tool_client: Any, make_user: Any) -> None:
    await send(tool_client, 'note [[tool:demo.add_note {"text": "z"}]]', "r6")
    requested = await tool_client.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    from channels.db import database_sync_to_async

    _bob, token = await database_sync_to_async(make_user)("bob")
    bob = await open_client(token, params=TOOL_CONNECT)
    try:
        assert await bob.ok("plugin.approval.list", {}) == []
        res = await bob.call("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"})
        assert not res["ok"] and res["error"]["code"] == "NOT_FOUND"
    finally:
        await bob.close()
    await tool_client.ok("chat.abort", {"sessionKey": "main"})
    await tool_client.wait_terminal("r6")


async def test_without_the_cap_no_tool_events_and_without_the_scope_no_approvals(alice: Any, notes_dir: Path) -> None:
    plain = await open_client(alice[1])
    try:
        await plain.ok("chat.send", {"sessionKey": "main", "message": "[[tool:demo.clock]]", "idempotencyKey": "r7"})
        await plain.wait_terminal("r7", timeout=20)
        assert tool_events(plain, "r7") == []
        res = await plain.call("plugin.approval.list", {})
        assert not res["ok"] and res["error"]["code"] == "FORBIDDEN"
    finally:
        await plain.close()
