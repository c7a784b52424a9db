"""Steering across processes (docs/protocol-notes.md, "Steering"): a run executing in one server process
takes a steer admitted by another, on PostgreSQL and Redis. The model is the fake OpenAI-compatible server
(in this test's process), the tool the test MCP server's `count`, which notes each execution.

Skipped, with the reason, when PostgreSQL or Redis is not reachable.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, running_fake, tool_reply
from tests.support.servers import ws_client
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

KEY = "agent:llm:steer"


def count(arg: str, ms: int, call_id: str) -> ToolCallReply:
    return ToolCallReply("t__count", json.dumps({"arg": arg, "ms": ms}), id=call_id, pieces=2)


async def wait_running_call(c: Any, run_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    sql = (
        "select t.state from sessions_app_toolcall t join sessions_app_run r on r.id = t.run_id "
        "where r.run_id = %s order by t.seq"
    )
    while ("running",) not in c.query(sql, run_id):
        assert time.monotonic() < deadline, c.query(sql, run_id)
        await asyncio.sleep(0.05)


async def test_a_steer_admitted_by_another_process_reaches_the_run(tmp_path: Path) -> None:
    count_file = tmp_path / "count.txt"
    async with running_fake() as fake:
        fake: FakeOpenAI  # type: ignore[no-redef]
        server = {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}
        agents = {"llm": agent_config(fake, mcp_servers={"t": server}, approval={"*": "never"})}
        with cluster(tmp_path, 2, GATEWAY_AGENTS=json.dumps(agents)) as c:
            token = c.token("steerer")
            a_srv, b_srv = c.servers
            async with (
                ws_client(a_srv, token, params=TOOL_CONNECT) as a,
                ws_client(b_srv, token, params=TOOL_CONNECT) as b,
            ):
                # each process starts the MCP server before its first ack: done here, not during the steer
                for client, key in ((a, "agent:llm:warm-a"), (b, "agent:llm:warm-b")):
                    fake.push(Reply(chunks=["warm"]))
                    await client.ok("chat.send", {"sessionKey": key, "message": "warm", "idempotencyKey": "w"}, 60)
                    await client.wait_event(
                        lambda e, key=key: (
                            e["event"] == "chat"
                            and e["payload"]["sessionKey"] == key
                            and e["payload"]["state"] == "final"
                        ),
                        30,
                    )
                fake.requests.clear()
                fake.push(
                    tool_reply(count("a", 1500, "call_a"), count("b", 0, "call_b")),
                    Reply(chunks=["Steered."]),
                )
                params = {"sessionKey": KEY, "message": "count twice", "idempotencyKey": "r1"}
                assert (await a.ok("chat.send", params, 60))["status"] == "started"
                await wait_running_call(c, "r1")
                steer = {"sessionKey": KEY, "message": "from elsewhere", "idempotencyKey": "s1"}
                ack = await b.ok("sessions.steer", steer, 30)
                assert (ack["status"], ack["runId"], ack.get("steered"), ack.get("steerRunId")) == (
                    "started",
                    "r1",
                    True,
                    "s1",
                ), ack
                for client in (a, b):
                    end = await client.wait_event(
                        lambda e: (
                            e["event"] == "chat" and e["payload"]["runId"] == "r1" and e["payload"]["state"] == "final"
                        ),
                        30,
                    )
                    assert end["payload"]["message"]["content"][0]["text"] == "Steered."
            second = fake.requests[1].messages
            assert [m["role"] for m in second] == ["user", "assistant", "tool", "tool", "user"]
            assert second[3]["content"] == "Skipped to process an incoming message."
            assert second[4] == {"role": "user", "content": "from elsewhere"}
            assert executions(count_file) == 1
            states = c.query(
                "select r.run_id, r.state, r.stop_reason from sessions_app_run r where r.run_id != 'w' order by r.id",
            )
            assert states == [("r1", "done", "stop"), ("s1", "killed", "steered")]
