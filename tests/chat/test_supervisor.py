"""This process's heartbeat keeps its schedule whatever holds up the event loop and the database
writes (`chat.runtime.supervisor.Heartbeat`): a loaded process whose beats ran late was declared
dead by its peers, which ended its runs while it lived."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from chat.base.db import db_write
from chat.runtime.gateway import runtime
from sessions_app.models import GatewayProcess

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL = 0.2
LATENESS = "agentgate_heartbeat_lateness_seconds"


def watch(server_id: str, stop: threading.Event, seen: list[float]) -> None:
    """When each new heartbeat of `server_id` became visible, read on a connection of this thread's own."""
    last = None
    try:
        while not stop.is_set():
            beat = GatewayProcess.objects.filter(server_id=server_id).values_list("heartbeat_at", flat=True).first()
            if beat != last:
                last = beat
                seen.append(time.monotonic())
            time.sleep(0.02)
    finally:
        connection.close()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_heartbeat_keeps_its_schedule_while_the_loop_and_the_writes_are_held_up(settings: Any) -> None:
    settings.GATEWAY_HEARTBEAT_SECONDS = INTERVAL
    await runtime.ensure_started()
    counted_before = sample(f"{LATENESS}_count"), sample(f"{LATENESS}_bucket", le="1.0")
    seen: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(runtime.server_id, stop, seen))
    watcher.start()
    try:
        await asyncio.sleep(1.0)
        # Writes queued for seconds (on SQLite the writer's queue, on PostgreSQL the database threads')...
        backlog = [asyncio.ensure_future(db_write(time.sleep, 0.005)) for _ in range(800)]
        await asyncio.sleep(0.1)
        # ...and the event loop itself held for 3 s (a CPU-starved process).
        time.sleep(3.0)  # noqa: ASYNC251  # blocking the loop is the point
        await asyncio.gather(*backlog)
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        watcher.join()
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    assert len(seen) > 4.5 / INTERVAL * 0.6, seen
    assert max(gaps) < INTERVAL + 1.0, [round(g, 2) for g in gaps]
    # Each beat's lateness is exported; none was late by a second.
    # (read as one snapshot: the beats go on, and one landing between two reads is not a late one)
    while True:
        beats = sample(f"{LATENESS}_count") - counted_before[0]
        on_time = sample(f"{LATENESS}_bucket", le="1.0") - counted_before[1]
        if sample(f"{LATENESS}_count") - counted_before[0] == beats:
            break
    assert beats >= len(seen) - 2
    assert on_time == beats
