"""Restart recovery with real server processes (PROTOCOL.md §8, §9): kill -9, SIGTERM, recover_runs."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import FAST_ENV, create_token, manage, prepare_database, start_server, ws_client

pytestmark = pytest.mark.server

RECOVERY_SECONDS = 8.0  # a dead process is stale after max(8/2, 0.5*3) = 4 s: time to restart and connect
HEARTBEAT_SECONDS = float(FAST_ENV["GATEWAY_HEARTBEAT_SECONDS"])  # a process sweeps on each
STALE_SECONDS = max(RECOVERY_SECONDS / 2, HEARTBEAT_SECONDS * 3)  # how old a live process's heartbeat may be


def db_rows(env: dict[str, str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    path = env["DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path, timeout=10) as db:
        return db.execute(sql, params).fetchall()


def run_row(env: dict[str, str], run_id: str) -> tuple[str, str, str]:
    rows = db_rows(env, "SELECT state, error_kind, owner_process FROM sessions_app_run WHERE run_id = ?", run_id)
    assert rows, run_id
    return rows[0]


def is_chat(event: dict[str, Any], run_id: str, state: str | None = None, phase: str | None = None) -> bool:
    if event["event"] != "chat" or event["payload"]["runId"] != run_id:
        return False
    if phase is not None:
        return event["payload"].get("phase") == phase
    return state is None or event["payload"]["state"] == state


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return prepare_database(tmp_path, GATEWAY_RECOVERY_SECONDS=str(RECOVERY_SECONDS))


async def start_hanging_run(client: Any) -> None:
    ack = await client.ok("chat.send", {"sessionKey": "main", "message": "hi [[hang]]", "idempotencyKey": "k1"})
    assert ack["status"] == "started"
    queued = await client.ok("chat.send", {"sessionKey": "main", "message": "second", "idempotencyKey": "k2"})
    assert queued["status"] == "queued"
    await client.wait_event(lambda e: is_chat(e, "k1", phase="running"))


async def test_kill_9_mid_run_then_restart_fails_the_run_and_tells_clients(env: dict[str, str]) -> None:
    token = create_token(env, "bob")
    first = start_server(env=env)
    first.wait_ready()
    async with ws_client(first, token) as client:
        await start_hanging_run(client)
        first.kill()
        killed_at = time.monotonic()
    assert run_row(env, "k1")[0] == "running"  # nobody is left to end it

    second = start_server(env=env)
    try:
        second.wait_ready()
        ready_after = time.monotonic() - killed_at
        async with ws_client(second, token) as client:
            mark = len(client.events)
            assert client.hello is not None
            error = await client.wait_event(lambda e: is_chat(e, "k1", "error"), timeout=RECOVERY_SECONDS + 2)
            recovered_after = time.monotonic() - killed_at
            assert error["payload"]["errorKind"] == "interrupted"
            changed = await client.wait_event(
                lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "run.interrupted", timeout=2
            )
            assert changed["payload"]["runId"] == "k1"
            assert client.events.index(changed) >= mark
            # The queued run starts on the new process and completes there.
            final = await client.wait_event(lambda e: is_chat(e, "k2", "final"), timeout=10)
            assert final["payload"]["message"]["content"][0]["text"] == "echo: second"
            listed = await client.ok("sessions.list", {})
            assert listed["sessions"][0]["status"] == "done" and listed["sessions"][0]["hasActiveRun"] is False
        # The promise is RECOVERY_SECONDS from the death, but only a live process can keep it, and on a
        # loaded machine (load ~9 on 2 cores) the restart alone took most of that window: the run was
        # failed 8.53 s after the kill. So the bound is the later of the promise and the new process's
        # readiness plus a few of its heartbeats (it sweeps on each; the client must connect and hear).
        limit = max(RECOVERY_SECONDS, ready_after + 4 * HEARTBEAT_SECONDS)
        assert recovered_after <= limit, (recovered_after, ready_after)
        assert run_row(env, "k1")[:2] == ("failed", "interrupted")
        assert db_rows(
            env,
            "SELECT reason, actor FROM sessions_app_lifecycleevent e JOIN sessions_app_run r ON e.run_id = r.id "
            "WHERE r.run_id = 'k1' AND e.to_state = 'failed'",
        ) == [("run.interrupted", "reaper")]
        assert run_row(env, "k2")[0] == "done"
    finally:
        second.kill()


async def test_sigterm_mid_run_drains_interrupts_and_hands_queued_runs_on(env: dict[str, str]) -> None:
    token = create_token(env, "bob")
    server = start_server(env=env)
    server.wait_ready()
    async with ws_client(server, token) as client:
        await start_hanging_run(client)
        owner = run_row(env, "k1")[2]
        server.terminate()
        shutdown = await client.wait_event(lambda e: e["event"] == "shutdown", timeout=5)
        assert shutdown["payload"]["reason"]
        error = await client.wait_event(lambda e: is_chat(e, "k1", "error"), timeout=5)
        assert error["payload"]["errorKind"] == "interrupted"
        assert await client.wait_closed() == 4001
    assert server.wait(15) == 0
    assert run_row(env, "k1")[:2] == ("failed", "interrupted")
    # Nothing is left running on the stopped process; the queued run was handed on, unowned.
    assert db_rows(
        env,
        "SELECT count(*) FROM sessions_app_run WHERE owner_process = ? AND state IN ('dispatching', 'running')",
        owner,
    ) == [(0,)]
    assert run_row(env, "k2")[0] == "dispatching" and run_row(env, "k2")[2] == ""
    assert db_rows(
        env, "SELECT stopped_at IS NOT NULL FROM sessions_app_gatewayprocess WHERE server_id = ?", owner
    ) == [(1,)]

    successor = start_server(env=env)
    try:
        successor.wait_ready()
        deadline = time.monotonic() + 10
        while run_row(env, "k2")[0] != "done" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert run_row(env, "k2")[0] == "done"  # claimed and run by the next process
    finally:
        successor.kill()


async def test_recover_runs_command_and_ops_endpoints_against_a_real_server(env: dict[str, str]) -> None:
    token = create_token(env, "bob")
    server = start_server(env=env)
    server.wait_ready()
    async with ws_client(server, token) as client:
        await start_hanging_run(client)
        status, body = server.get("/readyz")
        assert status == 200 and json.loads(body)["ok"] is True
        status, body = server.get("/metrics")
        assert status == 200
        assert "agentgate_active_runs 1.0" in body and "agentgate_connected_sockets 1.0" in body
        assert 'agentgate_chat_send_acks_total{method="chat.send",status="started"} 1.0' in body
        server.kill()
    ((beat,),) = db_rows(env, "SELECT heartbeat_at FROM sessions_app_gatewayprocess")
    stale_at = datetime.fromisoformat(beat).replace(tzinfo=UTC) + timedelta(seconds=STALE_SECONDS)
    asked_at = datetime.now(UTC)
    dry = json.loads(manage(env, "recover_runs", "--dry-run", "--json").stdout)
    answered_at = datetime.now(UTC)
    # Only a command that ran inside the window can say "not stale yet": on a loaded machine (load ~9
    # on 2 cores) starting it took longer than the whole window. One that started after it must list
    # the run; one that straddled its end may say either, and no claim is made of it.
    if answered_at < stale_at:
        assert dry["runs"] == []  # the process is not stale yet: its last heartbeat is fresh
    elif asked_at >= stale_at:
        assert [r["runId"] for r in dry["runs"]] == ["k1"]
    await asyncio.sleep(max(0.0, (stale_at - datetime.now(UTC)).total_seconds()) + 0.2)
    dry = json.loads(manage(env, "recover_runs", "--dry-run", "--json").stdout)
    assert [r["runId"] for r in dry["runs"]] == ["k1"] and run_row(env, "k1")[0] == "running"
    done = json.loads(manage(env, "recover_runs", "--json").stdout)
    assert done["ended"] == 1
    assert run_row(env, "k1")[:2] == ("failed", "interrupted")
    assert run_row(env, "k2") == ("dispatching", "", "")  # waits, unowned, for a live process
    # With no server running nothing will claim it: the admin shows it stuck, and the doctor
    # agrees (exit 1, one finding) instead of reporting clean.
    with pytest.raises(RuntimeError, match=r"failed \(1\)") as raised:
        manage(env, "gateway_doctor", "--json")
    assert '"kind": "unclaimed_run"' in str(raised.value) and '"runId": "k2"' in str(raised.value)
    # A server started now claims it, and the doctor is clean again.
    server = start_server(env=env)
    try:
        server.wait_ready()
        for _ in range(50):
            if run_row(env, "k2")[2]:  # claimed by the new server
                break
            await asyncio.sleep(0.2)
        doctor = manage(env, "gateway_doctor", "--json")
        assert json.loads(doctor.stdout)["ok"] is True
    finally:
        server.kill()
