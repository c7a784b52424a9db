"""Tools with real server processes (TOOLS.md §13.6): kill -9 mid-call, then recovery and the next turn;
the stdio MCP server dies with its gateway; a resend never runs a tool again."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_recovery_process import db_rows, is_chat
from tests.support.servers import create_token, prepare_database, start_server, ws_client
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions

pytestmark = pytest.mark.server

RECOVERY_SECONDS = 8.0


@pytest.fixture
def count_file(tmp_path: Path) -> Path:
    return tmp_path / "count.txt"


@pytest.fixture
def env(tmp_path: Path, count_file: Path) -> dict[str, str]:
    agents = {
        "main": {
            "backend": "scripted",
            "model": "scripted",
            "mcp_servers": {
                "t": {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}
            },
            "approval": {"*": "never"},
        }
    }
    return prepare_database(tmp_path, GATEWAY_RECOVERY_SECONDS=str(RECOVERY_SECONDS), GATEWAY_AGENTS=json.dumps(agents))


def saw_cancellation(count_file: Path) -> bool:
    return count_file.exists() and "cancelled" in count_file.read_text()


def wait_gone(pids: list[int], seconds: float) -> bool:
    """Whether every one of `pids` has ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(pid_alive(p) for p in pids)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def mcp_children(gateway_pid: int) -> list[int]:
    """Processes whose command line runs the test MCP server, started under this gateway."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (proc / "status").read_text()
        except OSError:
            continue
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        if "mcp_test_server.py" in cmd and ppid == gateway_pid:
            found.append(int(proc.name))
    return found


async def test_kill_9_mid_tool_ends_it_unknown_never_reruns_it_and_the_next_turn_works(
    env: dict[str, str], count_file: Path
) -> None:
    token = create_token(env, "bob")
    first = start_server(env=env)
    first.wait_ready()
    async with ws_client(first, token) as client:
        ack = await client.ok(
            "chat.send",
            {"sessionKey": "main", "message": 'go [[tool:t.count {"arg": "a", "ms": 60000}]]', "idempotencyKey": "k1"},
        )
        assert ack["status"] == "started"
        deadline = time.monotonic() + 20
        while executions(count_file) == 0 and time.monotonic() < deadline:
            await client.drain(0.1)
        assert executions(count_file) == 1  # the tool has started: its side effect is done
        children = mcp_children(first.pid)
        assert children, "the stdio MCP server runs under the gateway"
        first.kill()
    # the leash: the MCP server dies with its gateway, even on kill -9
    assert wait_gone(children, 5), "an MCP server outlived its gateway"
    assert db_rows(env, "SELECT state FROM sessions_app_toolcall")[0][0] == "running"

    second = start_server(env=env)
    try:
        second.wait_ready()
        async with ws_client(second, token) as client:
            error = await client.wait_event(lambda e: is_chat(e, "k1", "error"), timeout=RECOVERY_SECONDS + 4)
            assert error["payload"]["errorKind"] == "interrupted"
            ((state, result),) = db_rows(env, "SELECT state, result FROM sessions_app_toolcall")
            assert state == "unknown" and "not known" in result and "not run again" in result
            history = await client.ok("chat.history", {"sessionKey": "main"})
            tool_results = [m for m in history["messages"] if m["role"] == "toolResult"]
            assert [m["status"] for m in tool_results] == ["unknown"]
            assert "not known" in tool_results[0]["content"][0]["text"]
            # a resend of the same key is answered from the stored run; nothing runs again
            again = await client.call(
                "chat.send",
                {
                    "sessionKey": "main",
                    "message": 'go [[tool:t.count {"arg": "a", "ms": 60000}]]',
                    "idempotencyKey": "k1",
                },
            )
            assert not again["ok"] and again["payload"]["status"] == "error"
            # the next turn works, and starts the server afresh
            await client.ok(
                "chat.send",
                {"sessionKey": "main", "message": '[[tool:t.echo {"text": "fine"}]]', "idempotencyKey": "k2"},
            )
            final = await client.wait_event(lambda e: is_chat(e, "k2", "final"), timeout=20)
            assert "fine" in final["payload"]["message"]["content"][0]["text"]
        assert executions(count_file) == 1  # run exactly once, whatever happened since
    finally:
        second.stop()


async def test_abort_reaches_the_tool_within_a_second_and_the_next_turn_works(
    env: dict[str, str], count_file: Path
) -> None:
    token = create_token(env, "carol")
    server = start_server(env=env)
    try:
        server.wait_ready()
        async with ws_client(server, token) as client:
            await client.ok(
                "chat.send",
                {"sessionKey": "main", "message": '[[tool:t.slow {"ms": 60000}]]', "idempotencyKey": "s1"},
            )
            await client.wait_event(lambda e: is_chat(e, "s1", phase="running"), timeout=10)
            await client.drain(1.5)  # the call is under way at the server
            aborted_at = time.monotonic()
            await client.ok("chat.abort", {"sessionKey": "main", "runId": "s1"})
            end = await client.wait_event(lambda e: is_chat(e, "s1", "aborted"), timeout=5)
            assert end["payload"]["stopReason"] == "rpc"
            while not saw_cancellation(count_file):
                assert time.monotonic() - aborted_at < 2.0, "the MCP server never saw the cancellation"
                await client.drain(0.05)
            ((state,),) = db_rows(env, "SELECT state FROM sessions_app_toolcall")
            assert state == "cancelled"
            await client.ok(
                "chat.send",
                {"sessionKey": "main", "message": '[[tool:t.echo {"text": "next"}]]', "idempotencyKey": "s2"},
            )
            final = await client.wait_event(lambda e: is_chat(e, "s2", "final"), timeout=20)
            assert "next" in final["payload"]["message"]["content"][0]["text"]
    finally:
        server.stop()


async def test_a_restart_cancels_a_pending_approval_and_nothing_runs(env: dict[str, str], count_file: Path) -> None:
    agents = json.loads(env["GATEWAY_AGENTS"])
    agents["main"]["approval"] = {"*": "always"}
    env = {**env, "GATEWAY_AGENTS": json.dumps(agents)}
    token = create_token(env, "dave")
    first = start_server(env=env)
    first.wait_ready()
    async with ws_client(first, token, params=TOOL_CONNECT) as client:
        await client.ok(
            "chat.send", {"sessionKey": "main", "message": '[[tool:t.count {"arg": "a"}]]', "idempotencyKey": "a1"}
        )
        requested = await client.wait_event(lambda e: e["event"] == "plugin.approval.requested", timeout=20)
        first.kill()
    second = start_server(env=env)
    try:
        second.wait_ready()
        async with ws_client(second, token, params=TOOL_CONNECT) as client:
            await client.wait_event(lambda e: is_chat(e, "a1", "error"), timeout=RECOVERY_SECONDS + 4)
            late = await client.ok(
                "plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"}
            )
            assert late["decision"] == "cancelled"
            assert await client.ok("plugin.approval.list", {}) == []
            ((state,),) = db_rows(env, "SELECT state FROM sessions_app_toolcall")
            assert state == "cancelled"
        assert executions(count_file) == 0
    finally:
        second.stop()
