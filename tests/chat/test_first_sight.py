"""A run a connection first hears of from an event is followed only if it has not ended.

A lagging layer hands a new connection late events of runs killed before (or just after) it
opened; their terminal went out before it listened. It gets the run's terminal, or nothing,
never a delta that leaves the run `running` on it (`chat.delivery.first_sight`).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chat.delivery import first_sight
from chat.delivery.broadcaster import agroup_send_all, chat_message
from chat.delivery.connection import STALE_EVENT_SECONDS
from chat.protocol import run_events
from chat.runtime.gateway import runtime
from tests.support.communicator import open_client
from tests.support.db import plant_run

pytestmark = pytest.mark.django_db(transaction=True)


async def send_delta(owner_id: int, run: Any, seq: int, written_at: float) -> None:
    """A delta of `run` as the broadcaster sends it (through the layer to each process's hub), written then."""
    text = "word " * seq
    payload = run_events.delta_payload(run.run_id, run.session.key, str(run.session_generation), seq, "word ", text, 0)
    message = chat_message(owner_id, run.pk, payload)
    message["at"] = written_at
    await agroup_send_all(owner_id, message)


def only_connection() -> Any:
    (conn,) = runtime.connections
    return conn


async def test_a_late_delta_of_a_run_killed_before_the_connection_opened_brings_nothing(
    client: Any, alice: Any
) -> None:
    owner = alice[0].pk
    state = only_connection().state
    opened = state.connected_at
    run = await plant_run(owner, "killed-before", "killed", stream_seq=3, ended_at=opened - timedelta(seconds=1.5))
    # written just before it connected: inside the clocks' slack, so not dropped as stale
    await send_delta(owner, run, 2, opened.timestamp() - STALE_EVENT_SECONDS / 2)
    await client.drain(0.5)
    assert client.chat_events("killed-before") == []
    assert client.agent_events("killed-before") == []
    assert state.open_run_pks() == [] and state.runs[run.pk].terminal  # closed here: later ones are dropped too
    await send_delta(owner, run, 3, time.time())
    await client.drain(0.2)
    assert client.chat_events("killed-before") == []


async def test_a_late_delta_of_a_run_killed_after_the_connection_opened_brings_its_terminal(
    client: Any, alice: Any
) -> None:
    owner = alice[0].pk
    state = only_connection().state
    opened = state.connected_at
    run = await plant_run(owner, "killed-after", "killed", stream_seq=3, stop_reason="abort", ended_at=timezone.now())
    await send_delta(owner, run, 2, opened.timestamp() - STALE_EVENT_SECONDS / 2)
    await client.wait_terminal("killed-after", 2)
    await client.drain(0.3)
    assert [(p["seq"], p["state"]) for p in client.chat_events("killed-after")] == [(3, "aborted")]
    assert state.open_run_pks() == []


async def test_an_open_run_first_heard_of_is_followed_in_order_after_one_read_per_process(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events that arrive while the run is being read wait for it and keep their order;
    two connections that both never heard of the run share one read."""
    reads: list[set[int]] = []
    real = first_sight._stored_runs

    def slow_read(pks: set[int], read_at: float) -> dict[int, first_sight.Stored]:
        reads.append(set(pks))
        time.sleep(0.3)  # (on the database thread) the deltas behind the first arrive meanwhile
        return real(pks, read_at)

    monkeypatch.setattr(first_sight, "_stored_runs", slow_read)
    clients = [await open_client(alice[1]), await open_client(alice[1])]
    owner = alice[0].pk
    run = await plant_run(owner, "open", stream_seq=1)
    for seq in (2, 3, 4):
        await send_delta(owner, run, seq, time.time())
    for c in clients:
        await c.wait_event(lambda e: e["event"] == "chat" and e["payload"]["seq"] == 4, 3)
        await c.drain(0.1)
        assert [(p["seq"], p["state"]) for p in c.chat_events("open")] == [(2, "delta"), (3, "delta"), (4, "delta")]
    assert reads == [{run.pk}]
    await send_delta(owner, run, 5, time.time())  # followed now: no read
    for c in clients:
        await c.wait_event(lambda e: e["event"] == "chat" and e["payload"]["seq"] == 5, 2)
        await c.close()
    assert reads == [{run.pk}]
