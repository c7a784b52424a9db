"""A client that leaves while its run is inside a slow MCP tool call (HTTP-API.md §14.4, TOOLS.md §13):
without an Idempotency-Key the run is aborted (stopReason `disconnect`) within a second and its call
ends cancelled, the MCP server told so; with a key the run and its call go on, and a retry reattaches
and gets the whole answer once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.http.support import Gateway, sse_data, start_gateway
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions

pytestmark = pytest.mark.server

REATTACH_SECONDS = 4.0


@pytest.fixture(scope="module")
def count_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "count.txt"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, count_file: Path) -> Iterator[Gateway]:
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
    gateway = start_gateway(
        tmp_path_factory.mktemp("disconnect-tools"),
        GATEWAY_AGENTS=json.dumps(agents),
        GATEWAY_HTTP_REATTACH_SECONDS=str(REATTACH_SECONDS),
        GATEWAY_HTTP_KEEPALIVE_SECONDS="0.5",
    )
    yield gateway
    gateway.stop()


def db_rows(gw: Gateway, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
        return db.execute(sql, params).fetchall()


def calls_of(gw: Gateway, run_id: str) -> list[tuple[str, str]]:
    """The tool calls of a run as stored: (tool, state)."""
    return db_rows(
        gw,
        "SELECT c.server || '.' || c.tool, c.state FROM sessions_app_toolcall c "
        "JOIN sessions_app_run r ON c.run_id = r.id WHERE r.run_id = ? ORDER BY c.id",
        run_id,
    )


async def until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} within {seconds}s"
        await asyncio.sleep(0.02)


def cancellations(count_file: Path) -> int:
    """How many calls of its `slow` tool the test MCP server saw cancelled."""
    return count_file.read_text().count("cancelled") if count_file.exists() else 0


def body(text: str) -> dict[str, Any]:
    return {"model": "main", "messages": [{"role": "user", "content": text}], "stream": True}


def text_of(answer: str) -> str:
    return "".join(
        d["choices"][0]["delta"].get("content") or ""
        for d in sse_data(answer)
        if isinstance(d, dict) and d.get("choices")
    )


async def test_leaving_inside_a_slow_tool_without_a_key_aborts_the_run_and_cancels_the_call(
    gw: Gateway, count_file: Path
) -> None:
    cancelled_before = cancellations(count_file)
    async with gw.ws(params=TOOL_CONNECT) as ws, gw.async_http() as http:
        async with http.stream("POST", "/v1/chat/completions", json=body('go [[tool:t.slow {"ms": 60000}]]')) as got:
            run_id, key = got.headers["x-agentgate-run-id"], got.headers["x-agentgate-session-key"]
            await until(lambda: calls_of(gw, run_id) == [("t.slow", "running")], 20, "the call running")
            await asyncio.sleep(0.3)  # inside the call (the MCP server has it)
        left = time.monotonic()
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 5000})
        ended_after = time.monotonic() - left
        assert waited["status"] == "error" and waited["aborted"] is True and waited["stopReason"] == "disconnect"
        # within a second (HTTP-API.md §14.4): the abort does not wait for the 60 s call to end
        assert ended_after < 1.0, ended_after
        await until(lambda: calls_of(gw, run_id) == [("t.slow", "cancelled")], 5, "the call ended cancelled")
        # the MCP server was told, and stopped the call (it records a cancellation it sees)
        await until(
            lambda: cancellations(count_file) == cancelled_before + 1,
            5,
            "the MCP server stopped the call",
        )
        await ws.drain(0.5)
        results = [
            p["data"] for p in ws.agent_events(run_id) if p["stream"] == "tool" and p["data"]["phase"] == "result"
        ]
        listed = await ws.ok("sessions.list", {"kinds": ["api"], "search": key.rsplit(":", 1)[1]})
    assert [r.get("status") for r in results] == ["cancelled"], results  # one terminal, told once
    (row,) = listed["sessions"]
    assert row["activeRunIds"] == [] and row["queuedRunIds"] == [] and row["status"] == "killed"
    assert db_rows(gw, "SELECT state, stop_reason FROM sessions_app_run WHERE run_id = ?", run_id) == [
        ("killed", "disconnect")
    ]


async def test_leaving_inside_a_slow_tool_with_a_key_keeps_the_run_and_a_retry_gets_it_whole(
    gw: Gateway, count_file: Path
) -> None:
    key = f"k-tool-{time.monotonic_ns()}"
    request = body(f'go [[tool:t.count {{"arg": "{key}", "ms": 2500}}]] [[words:5]]')
    ran_before = executions(count_file)
    async with gw.async_http(**{"Idempotency-Key": key}) as http:
        async with http.stream("POST", "/v1/chat/completions", json=request) as got:
            assert got.headers["x-agentgate-run-id"] == key
            await until(lambda: calls_of(gw, key) == [("t.count", "running")], 20, "the call running")
        await asyncio.sleep(0.5)  # gone, inside the call
        assert calls_of(gw, key) == [("t.count", "running")]  # the call goes on
        # the server saw it go: kept open, marked detached, for a retry to reattach within the window
        assert db_rows(gw, "SELECT state, detached_at IS NOT NULL FROM sessions_app_run WHERE run_id = ?", key) == [
            ("running", 1)
        ]
        retry = await http.post("/v1/chat/completions", json=request)
    assert retry.status_code == 200 and retry.headers["x-agentgate-run-id"] == key
    assert "x-agentgate-idempotent-replay" not in retry.headers  # reattached while it ran
    data = sse_data(retry.text)
    assert data[-1] == "[DONE]" and data[-2]["choices"][0]["finish_reason"] == "stop"
    ran = executions(count_file) - ran_before
    assert ran == 1  # the tool ran once, and its result is in the answer once
    assert text_of(retry.text) == f"echo: word1 word2 word3 word4 word5 {executions(count_file)}", retry.text
    assert calls_of(gw, key) == [("t.count", "succeeded")]
    assert db_rows(gw, "SELECT state, stop_reason FROM sessions_app_run WHERE run_id = ?", key) == [("done", "stop")]
