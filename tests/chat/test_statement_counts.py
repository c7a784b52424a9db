"""The number of SQL statements of one complete turn and of one resend, pinned.

A turn (new run in an existing session: admit → dispatching → running → deltas → final,
with its audit rows, transcript messages and row encodings) and a resend of a finished
key (answered from one read, no write) are the gateway's hot path: a change that adds
statements to them must show up here, and be a choice.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db.backends.utils import CursorWrapper

from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)

TURN_STATEMENTS = 26  # 11 SELECT, 6 INSERT, 6 UPDATE, 3 BEGIN (see docs/performance.md)
RESEND_STATEMENTS = 1


class Statements:
    """Every statement any thread executes while counting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str] = []
        self.sql: list[str] = []
        self.counting = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = CursorWrapper._execute

        def counted(cursor: Any, sql: str, params: Any, *ignored: Any) -> Any:
            if self.counting:
                with self.lock:
                    self.seen.append(sql.split(None, 1)[0].upper())
                    self.sql.append(sql[:150])
            return real(cursor, sql, params, *ignored)

        monkeypatch.setattr(CursorWrapper, "_execute", counted)

    def take(self) -> list[str]:
        with self.lock:
            taken, self.seen = self.seen, []
        return taken


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Statements:
    # no background passes inside the window
    settings.GATEWAY_HEARTBEAT_SECONDS = 3600
    settings.GATEWAY_REPAIR_SECONDS = 3600
    counter = Statements()
    counter.install(monkeypatch)
    return counter


async def test_one_turn_and_one_resend(statements: Statements, client: Any) -> None:
    message = "[[tick:0]] the quick brown fox jumps"
    await client.ok("chat.send", send_params("s", message, "warm"))
    await client.wait_terminal("warm")
    await client.drain(0.2)

    statements.counting = True
    ack = await client.ok("chat.send", send_params("s", message, "k1"))
    assert ack["status"] == "started"
    await client.wait_terminal("k1")
    await client.drain(0.2)
    turn = statements.take()
    assert len(turn) == TURN_STATEMENTS, sorted(turn)

    assert (await client.ok("chat.send", send_params("s", message, "k1")))["status"] == "ok"
    await client.drain(0.1)
    resend = statements.take()
    assert resend == ["SELECT"] * RESEND_STATEMENTS, statements.sql[-6:]


# What one read-only tool call adds to a turn (docs/performance.md): recorded (6: BEGIN, session
# lock, run, INSERT call, UPDATE run seq, audit), started (7: BEGIN, the call's run, lock, run, call,
# UPDATE, audit), ended (8: the same four reads, UPDATE call, UPDATE run seq, audit, BEGIN), the
# runner's read of the committed result (1), the run's end looking for open calls (1).
TOOL_CALL_STATEMENTS = 23


async def test_a_tool_call_costs_a_pinned_number_of_statements(
    statements: Statements, client: Any, settings: Any, tmp_path: Any
) -> None:
    """A turn with one tool call (no approval) costs the plain turn plus a fixed number, whatever the tool."""
    import sys

    from tests.support.tools import TEST_SERVER as server

    settings.GATEWAY_AGENTS = {
        "main": {
            "backend": "scripted",
            "mcp_servers": {"t": {"command": sys.executable, "args": [server]}},
            "approval": {"*": "never"},
        }
    }
    tool = '[[tool:t.echo {"text": "x"}]]'
    await client.ok("chat.send", send_params("s", f"[[tick:0]] warm {tool}", "warm"))
    await client.wait_terminal("warm", 20)
    await client.drain(0.2)

    statements.counting = True
    await client.ok("chat.send", send_params("s", "[[tick:0]] the quick brown fox jumps", "plain"))
    await client.wait_terminal("plain")
    await client.drain(0.2)
    plain = statements.take()
    await client.ok("chat.send", send_params("s", f"[[tick:0]] the quick brown fox jumps {tool}", "tool"))
    await client.wait_terminal("tool", 20)
    await client.drain(0.2)
    with_tool = statements.take()
    assert len(with_tool) - len(plain) == TOOL_CALL_STATEMENTS, (sorted(with_tool), statements.sql[-40:])
