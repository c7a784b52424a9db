"""§9: delivery survives a lossy channel layer — repair brings every connection up to date."""

import asyncio
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from tests.support.communicator import open_client
from tests.support.db import (
    drop_broadcasts,
    is_row_message,
    is_terminal_message,
    rows_from_events,
    send_params,
    terminal_events,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_dropped_terminal_event_is_repaired(client, monkeypatch, settings):
    drop_broadcasts(monkeypatch, is_terminal_message)
    await client.ok("chat.send", send_params("main", "hello", "k"))
    started = time.monotonic()
    ev = await client.wait_terminal("k", settings.GATEWAY_REPAIR_SECONDS + 3)
    assert time.monotonic() - started <= settings.GATEWAY_REPAIR_SECONDS + 1.5
    assert ev["state"] == "final" and ev["message"]["content"][0]["text"] == "echo: hello"
    await client.drain(settings.GATEWAY_REPAIR_SECONDS * 1.5)
    assert len(terminal_events(client.events, "k")) == 1


async def test_dropped_row_changes_are_repaired(client, monkeypatch, settings):
    await client.ok("sessions.create", {"sessionKey": "s1"})
    await client.wait_event(lambda e: e["event"] == "sessions.changed")
    drop_broadcasts(monkeypatch, is_row_message)
    await client.ok("chat.send", send_params("s1", "hi", "k"))
    await client.wait_terminal("k")
    await client.ok("sessions.delete", {"sessionKey": "s1"})
    await client.drain(settings.GATEWAY_REPAIR_SECONDS * 2 + 0.5)
    assert rows_from_events(client.events) == {}
    reasons = [e["payload"]["reason"] for e in client.events if e["event"] == "sessions.changed"]
    assert "delete" in reasons


async def test_flood_with_tiny_layer_capacity(alice, settings):
    """Many runs streaming at once through a layer that holds 3 messages per channel."""
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 3}}
    }
    settings.GATEWAY_DELTA_INTERVAL_MS = 0  # no coalescing: as many deltas as words
    clients = [await open_client(alice[1]) for _ in range(3)]
    sender = clients[0]
    run_ids = []
    for s in range(8):
        for r in range(2):
            run_id = f"s{s}r{r}"
            run_ids.append(run_id)
            await sender.ok("chat.send", send_params(f"sess{s}", "[[words:25]] [[tick:2]]", run_id))
    deadline = time.monotonic() + 30
    for c in clients:
        for run_id in run_ids:
            await c.wait_terminal(run_id, max(1.0, deadline - time.monotonic()))
    await asyncio.sleep(settings.GATEWAY_REPAIR_SECONDS * 2)
    fresh = {r["key"]: r for r in (await sender.ok("sessions.list", {"limit": 500}))["sessions"]}
    for c in clients:
        await c.drain(0.2)
        assert rows_from_events(c.events) == fresh
        for run_id in run_ids:
            assert len(terminal_events(c.events, run_id)) == 1
            seqs = [e["seq"] for e in c.chat_events(run_id)]
            assert seqs == sorted(set(seqs)), run_id
        event_seqs = [e["seq"] for e in c.events]
        assert event_seqs == list(range(1, len(event_seqs) + 1))
    assert all(r["status"] == "done" for r in fresh.values())
    await asyncio.gather(*(c.close() for c in clients))


@database_sync_to_async
def _end_runs(owner_id: int, prefix: str, n: int, ended_at) -> None:
    """Plant `n` runs that ended at `ended_at` (a burst such as a recovery sweep makes)."""
    from sessions_app.models import ChatSession, Run

    s, _ = ChatSession.objects.get_or_create(owner_id=owner_id, key="agent:main:bulk", defaults={"agent_id": "main"})
    base = Run.objects.filter(session=s).count()
    Run.objects.bulk_create(
        [
            Run(
                session=s,
                run_id=f"{prefix}{i}",
                session_generation=s.session_id,
                message="m",
                body_hash="h",
                timeout_ms=60000,
                state="done",
                reply="r",
                ended_at=ended_at,
                stream_seq=1,
                queue_seq=base + i + 1,
            )
            for i in range(n)
        ]
    )


async def test_repair_scan_moves_past_a_full_batch_of_ended_runs(client, alice, monkeypatch):
    """A burst bigger than a batch, all at one instant: later terminals are still repaired."""
    from chat.delivery import repair
    from chat.runtime.gateway import runtime

    monkeypatch.setattr(repair, "BATCH", 3)
    conn = next(iter(runtime.connections))
    await _end_runs(alice[0].pk, "burst", 7, conn.state.connected_at + timedelta(milliseconds=5))
    await client.drain(1.2)
    await _end_runs(alice[0].pk, "late", 1, timezone.now())  # its broadcast never happened
    await client.drain(2.5)
    for run_id in [f"burst{i}" for i in range(7)] + ["late0"]:
        assert len(terminal_events(client.events, run_id)) == 1, run_id


async def test_repair_scan_moves_past_a_full_batch_of_rows(client, monkeypatch):
    from chat.delivery import repair

    monkeypatch.setattr(repair, "BATCH", 3)
    for i in range(5):
        await client.ok("sessions.create", {"sessionKey": f"s{i}"})
    await client.drain(1.2)
    drop_broadcasts(monkeypatch, is_row_message)  # the layer drops what follows
    await client.ok("sessions.create", {"sessionKey": "late"})
    await client.drain(2.5)
    keys = [e["payload"]["sessionKey"] for e in client.events if e["event"] == "sessions.changed"]
    assert "agent:main:late" in keys


async def test_tick_survives_a_failed_authorization_check(alice, monkeypatch, settings):
    from django.db import OperationalError

    from chat.websocket import consumer

    settings.GATEWAY_TICK_INTERVAL_MS = 200
    calls = {"n": 0}
    real = consumer.current_access

    def flaky(user_id, token_hash, session_key):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OperationalError("database is locked")
        return real(user_id, token_hash, session_key)

    monkeypatch.setattr(consumer, "current_access", flaky)
    c = await open_client(alice[1])
    await c.drain(2.0)
    assert len([e for e in c.events if e["event"] == "tick"]) >= 6 and c.closed is None
    await c.close()
