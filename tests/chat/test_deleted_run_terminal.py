"""§5/§8 with a lagging connection: a run ends, its session is deleted, repair catches the laggard up.

The laggard loses every event from the run's first on (as a full channel of a shrunk layer
would drop them), so it learns the end of the run only from repair (§9). Whatever the order of the end, the
delete and the repair pass, it gets the run's one real terminal or nothing, never one
made up per connection (an `aborted`/`delete` with its own seq).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chat.runtime.gateway import runtime
from tests.support.communicator import Client, open_client
from tests.support.db import send_params, terminal_events

pytestmark = pytest.mark.django_db(transaction=True)


def connection_of(client: Client) -> Any:
    assert client.hello is not None
    conn_id = client.hello["server"]["connId"]
    return next(c for c in runtime.connections if c.conn_id == conn_id)


def choke(monkeypatch: pytest.MonkeyPatch, connection: Any, full: Callable[[], bool]) -> None:
    """While `full()`, every event the process's channel hands this connection is lost."""
    real = connection.deliver

    async def deliver(message: dict[str, Any]) -> None:
        if not full():
            await real(message)

    monkeypatch.setattr(connection, "deliver", deliver)


async def lagging_pair(alice: Any, monkeypatch: pytest.MonkeyPatch, settings: Any) -> tuple[Client, Client, list[bool]]:
    settings.GATEWAY_REPAIR_SECONDS = 3600  # repair passes only when the test asks for one
    sender, laggard = await open_client(alice[1]), await open_client(alice[1])
    lag = [False]
    choke(monkeypatch, connection_of(laggard), lambda: lag[0])
    return sender, laggard, lag


async def start_and_end_one_run(sender: Client, laggard: Client, lag: list[bool]) -> dict[str, Any]:
    await sender.ok("chat.send", send_params("doomed", "one two three four [[tick:40]]", "r1"))
    await laggard.wait_event(lambda e: e["event"] == "chat" and e["payload"]["runId"] == "r1")
    lag[0] = True  # the laggard saw the run open, and nothing more
    final = await sender.wait_terminal("r1", 10)
    assert final["state"] == "final"
    return final


async def test_run_ended_then_session_deleted_before_repair_gets_nothing_made_up(alice, monkeypatch, settings):
    sender, laggard, lag = await lagging_pair(alice, monkeypatch, settings)
    final = await start_and_end_one_run(sender, laggard, lag)
    await sender.ok("sessions.delete", {"sessionKey": "doomed"})
    lag[0] = False
    await runtime.supervisor.repair_now()
    await runtime.supervisor.repair_now()
    await laggard.drain(0.5)
    got = terminal_events(laggard.events, "r1")
    assert got in ([], [final]), f"made-up terminal {got} (the run ended {final})"
    assert any(e["event"] == "sessions.changed" and e["payload"]["session"].get("deleted") for e in laggard.events), (
        "the row's deletion is how the laggard learns the rest"
    )
    seqs = [p["seq"] for p in laggard.chat_events("r1")]
    assert seqs == sorted(set(seqs))
    await sender.close()
    await laggard.close()


async def test_run_ended_and_repaired_before_the_delete_gets_the_real_terminal_once(alice, monkeypatch, settings):
    sender, laggard, lag = await lagging_pair(alice, monkeypatch, settings)
    final = await start_and_end_one_run(sender, laggard, lag)
    lag[0] = False
    await runtime.supervisor.repair_now()
    assert await laggard.wait_terminal("r1", 2) == final  # the run's own terminal, its seq
    await sender.ok("sessions.delete", {"sessionKey": "doomed"})
    await runtime.supervisor.repair_now()
    await laggard.drain(0.5)
    assert terminal_events(laggard.events, "r1") == [final]
    await sender.close()
    await laggard.close()
