"""The Redis round trips of one complete turn, and of a batch of events each way, pinned.

Every event of a run crosses Redis on the scale-out configuration: sent by the process that
committed it (`chat.delivery.broadcaster`) to its user's group and the operators' group, and
read back by each process that holds a connection of that user (`chat.delivery.hub`). A
change that adds round trips to that path must show up here, and be a choice. Counted at
redis-py's connection: each request written is one round trip (a pipeline, or a script, is
one), each command in it one command. The process's once-a-second layer check and its group
refresh are turned off for the count; nothing else talks to Redis while a turn runs.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

from chat.delivery.layers import GatewayRedisChannelLayer
from chat.runtime import supervisor
from tests.support import services
from tests.support.communicator import Client, open_client
from tests.support.db import send_params

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

# One turn (admitted, dispatched, running, one delta, final) broadcasts six events in two commits:
# the `chat` status `dispatching` with the session row at admission; the status `running`, the
# delta and the final with the row at the end (a reply within one delta interval is written with
# the run's end). The broadcaster hands each commit's events to Redis as one batch, one round trip
# (two, should a commit's events reach it apart), and the process's channel reads what arrived in
# one (see docs/performance.md: 43-48 round trips a turn before).
TURN_EVENTS = 6
TURN_COMMITS = 2
ONE_TURN = {"EVALSHA", "BZMPOP"}  # the batch's script, the channel's blocking read: nothing else


class RoundTrips:
    """Requests written to Redis (round trips) and the commands in them, while counting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trips = 0
        self.commands: Counter[str] = Counter()
        self.counting = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        send = AbstractConnection.send_packed_command
        pack = AbstractConnection.pack_command
        pack_many = AbstractConnection.pack_commands

        async def counted_send(connection: Any, command: Any, check_health: bool = True) -> None:
            if self.counting:
                with self.lock:
                    self.trips += 1
            await send(connection, command, check_health)

        def counted_pack(connection: Any, *args: Any) -> Any:
            self._named([args])
            return pack(connection, *args)

        def counted_pack_many(connection: Any, commands: Any) -> Any:
            commands = list(commands)
            self._named(commands)
            return pack_many(connection, commands)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", counted_send)
        monkeypatch.setattr(AbstractConnection, "pack_command", counted_pack)
        monkeypatch.setattr(AbstractConnection, "pack_commands", counted_pack_many)

    def _named(self, commands: Any) -> None:
        if self.counting:
            with self.lock:
                for args in commands:
                    name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
                    self.commands[name.split()[0].upper()] += 1

    def take(self) -> tuple[int, Counter[str]]:
        with self.lock:
            taken = self.trips, self.commands
            self.trips, self.commands = 0, Counter()
        return taken


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch, settings: Any) -> RoundTrips:
    services.require_redis()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.delivery.layers.GatewayRedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": services.REDIS_URL}],
                "prefix": f"rt{uuid.uuid4().hex[:8]}",
                "capacity": settings.GATEWAY_CHANNEL_CAPACITY,
                "channel_capacity": {"gateway.*": settings.GATEWAY_PROCESS_CHANNEL_CAPACITY},
            },
        }
    }
    settings.GATEWAY_HEARTBEAT_SECONDS = 3600
    settings.GATEWAY_REPAIR_SECONDS = 3600
    settings.GATEWAY_GROUP_REFRESH_SECONDS = 0
    settings.GATEWAY_DELTA_INTERVAL_MS = 60_000  # one delta per reply (see test_statement_counts.py)
    monkeypatch.setattr(supervisor, "LAYER_CHECK_SECONDS", 3600.0)
    counter = RoundTrips()
    counter.install(monkeypatch)
    return counter


async def _turn(client: Client, run_id: str, message: str) -> None:
    ack = await client.ok("chat.send", send_params("s", message, run_id))
    assert ack["status"] == "started"
    await client.wait_terminal(run_id)
    await client.drain(0.3)


async def test_one_turn(round_trips: RoundTrips, alice: tuple[Any, str]) -> None:
    client = await open_client(alice[1])
    try:
        await _turn(client, "warm", "[[tick:0]] the quick brown fox jumps")
        round_trips.counting = True
        before = len(client.events)
        await _turn(client, "k1", "[[tick:0]] the quick brown fox jumps")
        trips, commands = round_trips.take()
    finally:
        await client.close()
    broadcast = [e for e in client.events[before:] if e["event"] in ("chat", "sessions.changed")]
    assert len(broadcast) == TURN_EVENTS, broadcast
    assert set(commands) == ONE_TURN, commands
    assert trips == sum(commands.values())  # one command a round trip: no pipeline, no second step
    assert TURN_COMMITS <= commands["EVALSHA"] <= TURN_EVENTS, commands
    assert 1 <= commands["BZMPOP"] <= commands["EVALSHA"], commands


async def test_a_batch_is_one_round_trip_each_way(round_trips: RoundTrips, settings: Any) -> None:
    """However many group sends a batch holds, and however many messages wait on the process's channel."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    assert isinstance(layer, GatewayRedisChannelLayer)
    hub = await layer.new_channel(prefix="gateway")
    for group in ("user.1", "user.2", "operators"):
        await layer.group_add(group, hub)
    sends = [(f"user.{1 + i % 2}", {"type": "e", "i": i}) for i in range(200)] + [("nobody", {"type": "e"})]
    round_trips.counting = True
    await layer.group_send_many(sends)
    assert round_trips.take()[0] == 1
    got = await layer.receive_many(hub)
    assert round_trips.take()[0] == 1
    assert [m["i"] for m in got] == list(range(200))
    await layer.flush()
