"""The number of SQL statements of one complete turn and of one resend, pinned, on SQLite and on
PostgreSQL (`test_the_counts_hold_on_postgres` runs this file again on a PostgreSQL database).

A turn (a new run in an existing session: admit -> dispatching -> running -> delta -> final, with
its audit rows, transcript messages and row encodings) and a resend (a key the session already has:
answered from one read on one database thread, no write, whether its run has finished or is still
running or queued) are the gateway's hot path: a change that adds statements to them must show up
here, and be a choice. A turn is 13 statements in 2 transactions on SQLite, 12 on PostgreSQL
(docs/performance.md, "Statements"):

- the key's read, which finds it new and reads the session as admission needs it (1 SELECT);
- admission (BEGIN; the run inserted `dispatching` by the statement that checks the session is
  still as read and takes its lock; the row; the user's message; the audit row: 4 + BEGIN);
- the run's end, a reply within one delta interval carrying its `running` step and its delta
  (BEGIN; session and run read under their locks; the run's one compare-and-set; the row; the
  reply's message; both audit rows in one INSERT; the model call's usage row (docs/usage.md; the
  session's usage totals ride with the row): 6 + BEGIN; on PostgreSQL the audit rows and the usage
  row are one statement, a data-modifying `WITH`: 5 + BEGIN). A session no budget applies to pays
  nothing more: budgets cost statements only where they apply.

BEGIN counts on both (PostgreSQL's is sent by the driver, counted where Django opens the
transaction); COMMIT does not.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from chat.base import availability
from tests.support import services
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]

# SQLite; on PostgreSQL the run's end puts its audit rows and its usage row in one statement (`WITH`)
TURN = {"SELECT": 2, "INSERT": 6, "UPDATE": 3, "BEGIN": 2}
TURN_STATEMENTS = 13
TURN_ON_POSTGRES = {"SELECT": 2, "INSERT": 4, "WITH": 1, "UPDATE": 3, "BEGIN": 2}
TURN_STATEMENTS_ON_POSTGRES = 12
RESEND_STATEMENTS = 1


class Statements:
    """Every statement any thread executes while counting, and every call the event loop hands
    to a database thread (`chat.base.db`: each runs through `availability.guarded` there)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str] = []
        self.sql: list[str] = []
        self.calls: list[tuple[str, str]] = []  # (thread, function) of each database call
        self.counting = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = CursorWrapper._execute
        guarded = availability.guarded
        set_autocommit = BaseDatabaseWrapper.set_autocommit

        def counted(cursor: Any, sql: str, params: Any, *ignored: Any) -> Any:
            if self.counting:
                with self.lock:
                    self.seen.append(sql.split(None, 1)[0].upper())
                    self.sql.append(sql[:150])
            return real(cursor, sql, params, *ignored)

        def counted_call(fn: Any, *args: Any) -> Any:
            if self.counting:
                with self.lock:
                    self.calls.append((threading.current_thread().name, getattr(fn, "__qualname__", repr(fn))))
            return guarded(fn, *args)

        def begun(connection: Any, autocommit: bool, *args: Any, **kwargs: Any) -> None:
            # PostgreSQL: the driver sends BEGIN before the transaction's first statement (SQLite's
            # BEGIN IMMEDIATE goes through a cursor, and is counted there)
            if self.counting and not autocommit and connection.vendor == "postgresql":
                with self.lock:
                    self.seen.append("BEGIN")
                    self.sql.append("BEGIN")
            set_autocommit(connection, autocommit, *args, **kwargs)

        monkeypatch.setattr(CursorWrapper, "_execute", counted)
        monkeypatch.setattr(availability, "guarded", counted_call)
        monkeypatch.setattr(BaseDatabaseWrapper, "set_autocommit", begun)

    def take(self) -> list[str]:
        with self.lock:
            taken, self.seen = self.seen, []
        return taken

    def take_calls(self) -> list[tuple[str, str]]:
        with self.lock:
            taken, self.calls = self.calls, []
        return taken


def one_read(calls: list[tuple[str, str]]) -> bool:
    """A resend's database work: one call, on a reader thread (not the writer)."""
    return len(calls) == 1 and calls[0][0].startswith("agentgate-db") and calls[0][1] == "_known_send"


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Statements:
    # no background passes inside the window
    settings.GATEWAY_HEARTBEAT_SECONDS = 3600
    settings.GATEWAY_REPAIR_SECONDS = 3600
    # One delta write per reply, however slow the turn. The delta interval counts from the start of the
    # stream and text arriving after it has passed is written at once: a turn whose first word came
    # over 50 ms in (a tool call on a loaded machine) wrote its reply in two UPDATEs, one more than
    # pinned. How deltas are coalesced is timing, not the cost of a turn or of a tool call.
    settings.GATEWAY_DELTA_INTERVAL_MS = 60_000
    # the child run of `test_the_counts_hold_on_postgres` says which database it must be on
    assert connection.vendor == os.environ.get("AGENTGATE_EXPECT_VENDOR", connection.vendor)
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
    pinned, count = (
        (TURN_ON_POSTGRES, TURN_STATEMENTS_ON_POSTGRES)
        if connection.vendor == "postgresql"
        else (TURN, TURN_STATEMENTS)
    )
    assert collections.Counter(turn) == pinned and len(turn) == count, statements.sql[-len(turn) :]

    statements.take_calls()
    assert (await client.ok("chat.send", send_params("s", message, "k1")))["status"] == "ok"
    await client.drain(0.1)
    resend = statements.take()
    assert resend == ["SELECT"] * RESEND_STATEMENTS, statements.sql[-6:]
    assert one_read(statements.take_calls())


async def test_a_resend_of_a_live_run_is_one_read(statements: Statements, client: Any) -> None:
    """A resend of a running run, or of a queued one (its place in the queue with it), is one read too."""
    sends = [("live", "[[hang]] working"), ("q1", "next"), ("q2", "after that")]
    for run_id, message in sends:
        await client.ok("chat.send", send_params("s", message, run_id))
    await client.drain(0.3)  # the first one running (and silent), the others queued behind it

    statements.counting = True
    for (run_id, message), position in zip(sends, (None, 1, 2), strict=True):
        statements.take()
        statements.take_calls()
        ack = await client.ok("chat.send", send_params("s", message, run_id))
        await client.drain(0.1)
        assert ack["status"] == "in_flight" and ack.get("queuePosition") == position, ack
        assert statements.take() == ["SELECT"] * RESEND_STATEMENTS, (run_id, statements.sql[-6:])
        assert one_read(calls := statements.take_calls()), (run_id, calls)
    statements.counting = False
    assert (await client.ok("chat.abort", {"sessionKey": "s"}))["aborted"]


# What one read-only tool call adds to a turn (docs/performance.md): the run's `running`, written
# alone before the step's calls are (4: BEGIN, session and run locked, UPDATE run, audit; a plain
# turn's rides with its end), recorded (5: BEGIN, session and run locked, INSERT call, UPDATE run
# seq, audit), started (6: BEGIN, the call's run, session and run locked, call, UPDATE, audit),
# ended (7: the same three reads, UPDATE call, UPDATE run seq, audit, BEGIN), the runner's read of
# the committed result (1), the run's end looking for open calls (1).
TOOL_CALL_STATEMENTS = 24


async def test_a_tool_call_costs_a_pinned_number_of_statements(
    statements: Statements, client: Any, settings: Any, tmp_path: Any
) -> None:
    """A turn with one tool call (no approval) costs the plain turn plus a fixed number, whatever the tool."""

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


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_the_counts_hold_on_postgres() -> None:
    """This file again, in a child pytest whose database is PostgreSQL: the same counts."""
    services.rerun_on_postgres(__file__, "counts", 3, REDIS_URL="")
