"""While the database is away, as this process knows it (`chat.runtime.availability`): calls are
refused at once but one trial at a time goes through, clients hear `UNAVAILABLE` (never
`INTERNAL`), a handshake is answered and closed with 4013, and an outage is logged once each way.

The database here is real and up: the outage is what the process believes after a failure it saw
(`failed`), and a trial that has not come back yet is held open with the breaker's own `admit`.
The real thing, PostgreSQL stopped under load with its pool, is tests/e2e/test_service_outages.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from prometheus_client import REGISTRY, generate_latest

from chat.runtime import availability
from chat.runtime.availability import DatabaseUnavailable, Dependency, Unavailable
from chat.runtime.db import db_read
from chat.web import metrics
from sessions_app.lifecycle import runs
from sessions_app.models import Run
from tests.support.communicator import open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _available_again() -> Iterator[None]:
    yield
    availability.database.reset()
    availability.channel_layer.reset()


def _users() -> int:
    return get_user_model().objects.count()


def _away_with_a_trial_in_flight() -> None:
    """The database went away, and the one call allowed to try it has not come back yet."""
    database = availability.database
    database.failed(OSError("connection refused"))
    time.sleep(availability.TRIAL_SECONDS)
    assert database.admit() is True  # this caller is let through to try,
    assert database.claim(True) is True  # and on its thread is the trial (not reporting back yet)


def test_an_outage_is_logged_once_each_way_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    dep = Dependency("example", DatabaseUnavailable)
    counted = metrics.DEPENDENCY_OUTAGES.labels("example")._value.get()
    with caplog.at_level(logging.INFO, logger="chat.runtime.availability"):
        began = time.monotonic()
        for _ in range(5):
            dep.failed(OSError("connection refused"))
        with pytest.raises(Unavailable, match="connection refused"):
            dep.check()
        dep.ok(began)  # a call that began before the outage was seen proves nothing about now
        assert not dep.available and dep.outage_seconds() > 0
        dep.ok(time.monotonic())
        dep.ok()
    assert dep.available and dep.back_at is not None
    lines = [record.getMessage() for record in caplog.records]
    assert sum("example unavailable: OSError: connection refused" in line for line in lines) == 1, lines
    assert sum("example available again after" in line and "(1 calls refused" in line for line in lines) == 1, lines
    assert metrics.DEPENDENCY_OUTAGES.labels("example")._value.get() == counted + 1


async def test_calls_are_refused_at_once_and_a_trial_ends_the_outage(
    make_user: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = availability.database
    database.failed(OSError("connection refused"))
    # the first call is the trial: it finds the database there, and the outage is over
    assert await db_read(_users) == 0
    assert database.available
    database.failed(OSError("connection refused"))
    ran: list[object] = []
    real_guarded = availability.guarded
    monkeypatch.setattr(availability, "guarded", lambda fn, *rest: ran.append(fn) or real_guarded(fn, *rest))
    with pytest.raises(DatabaseUnavailable):  # the last trial was just now: refused without trying
        await db_read(_users)
    assert ran == []  # refused on the loop: no database thread, no probe, no pool wait
    assert not database.available
    await asyncio.sleep(availability.TRIAL_SECONDS)
    assert await db_read(_users) == 0
    assert database.available


async def test_requests_get_unavailable_with_retry_after_and_nothing_is_stored(client: object) -> None:
    _away_with_a_trial_in_flight()
    refused = metrics.UNAVAILABLE_ANSWERS.labels("database")._value.get()
    for method, params in (
        ("chat.send", send_params("main", "hello", "k1")),
        ("sessions.list", {}),
        ("chat.history", {"sessionKey": "main"}),
    ):
        res = await client.call(method, params)  # type: ignore[attr-defined]
        assert not res["ok"], res
        assert res["error"] == {
            "code": "UNAVAILABLE",
            "message": "the database is unavailable; try again shortly",
            "details": {"reason": "database-unavailable"},
            "retryable": True,
            "retryAfterMs": availability.RETRY_AFTER_MS,
        }
    assert client.closed is None  # type: ignore[attr-defined]
    assert metrics.UNAVAILABLE_ANSWERS.labels("database")._value.get() == refused + 3
    scraped = generate_latest(REGISTRY).decode()
    assert 'agentgate_dependency_available{dependency="database"} 0.0' in scraped
    assert 'agentgate_dependency_available{dependency="channel_layer"} 1.0' in scraped
    assert "agentgate_scrape_database_error 1.0" in scraped
    availability.database.end_trial()
    assert await database_sync_to_async(Run.objects.count)() == 0
    # the trial came back; a later call tries again and finds the database: the resend is stored
    deadline = time.monotonic() + 5
    while True:
        await asyncio.sleep(availability.RETRY_AFTER_MS / 4000)
        res = await client.call("chat.send", send_params("main", "hello", "k1"))  # type: ignore[attr-defined]
        if res["ok"] or time.monotonic() > deadline:
            break
    assert res["ok"] and res["payload"]["status"] == "started", res
    assert (await client.wait_terminal("k1", 5))["state"] == "final"  # type: ignore[attr-defined]


async def test_a_handshake_is_answered_unavailable_and_closed_with_4013(alice: tuple[object, str]) -> None:
    c = await open_client(alice[1], connect=False)
    _away_with_a_trial_in_flight()
    res = await c.call(
        "connect", {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "t"}, "auth": {"token": alice[1]}}
    )
    assert res["error"]["code"] == "UNAVAILABLE" and res["error"]["retryAfterMs"] > 0, res
    assert await c.wait_closed(5) == 4013
    availability.database.end_trial()


async def test_a_caller_let_through_but_cancelled_before_its_thread_ran_blocks_nothing(make_user: object) -> None:
    """A caller let through to try (a /readyz check past its deadline, a client gone) whose
    call never ran holds no trial: the next caller tries once TRIAL_SECONDS have passed."""
    database = availability.database
    database.failed(OSError("connection refused"))
    await asyncio.sleep(availability.TRIAL_SECONDS)
    assert database.admit() is True  # ... and then cancelled: `claim` never runs
    with pytest.raises(DatabaseUnavailable):
        await db_read(_users)  # too soon after that one
    await asyncio.sleep(availability.TRIAL_SECONDS)
    assert await db_read(_users) == 0
    assert database.available


async def test_the_trial_ends_the_outage_before_its_call_and_whatever_the_call_raises(make_user: object) -> None:
    database = availability.database

    def seen_available() -> bool:
        return database.available

    database.failed(OSError("connection refused"))
    await asyncio.sleep(availability.TRIAL_SECONDS)
    assert await db_read(seen_available) is True  # over once the probe and the pooled SELECT 1 answered

    def missing() -> object:
        return get_user_model().objects.get(pk=-1)

    database.failed(OSError("connection refused"))
    await asyncio.sleep(availability.TRIAL_SECONDS)
    with pytest.raises(get_user_model().DoesNotExist):
        await db_read(missing)
    assert database.available  # the server answered: an ordinary error is no outage


async def test_a_run_whose_running_was_committed_but_not_acknowledged_carries_on(
    client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection broke after `mark_running` committed: the retry finds the run `running`
    (owned by this process), and the run goes on instead of being left to fail."""
    real = runs.mark_running
    lost = {"n": 0}

    def committed_then_lost(run_pk: int) -> bool:
        done = real(run_pk)
        if not lost["n"]:
            lost["n"] += 1
            raise DatabaseUnavailable("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(runs, "mark_running", committed_then_lost)
    await client.ok("chat.send", send_params("main", "hello [[words:3]]", "k1"))  # type: ignore[attr-defined]
    terminal = await client.wait_terminal("k1", 10)  # type: ignore[attr-defined]
    assert lost["n"] == 1 and terminal["state"] == "final", terminal


async def test_a_slow_or_failed_broadcast_is_no_outage_the_layer_check_is_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One group_send past its wait (a busy Redis) is counted, not declared an outage that
    would skip every broadcast after it: only the layer check says the layer is away."""
    from channels.layers import get_channel_layer
    from redis.exceptions import ConnectionError as RedisConnectionError

    from chat.delivery import broadcaster

    layer = get_channel_layer()
    assert layer is not None
    failures = metrics.CHANNEL_LAYER_FAILURES.labels("broadcast")._value.get()

    async def slow(group: str, message: dict[str, object]) -> None:
        await asyncio.sleep(60)

    monkeypatch.setattr(broadcaster, "BROADCAST_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(layer, "group_send", slow)
    await broadcaster.agroup_send_all(1, {"type": "gateway.chat", "owner": 1})  # type: ignore[typeddict-item]
    assert availability.channel_layer.available

    async def refused(group: str, message: dict[str, object]) -> None:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(layer, "group_send", refused)
    await broadcaster.agroup_send_all(1, {"type": "gateway.chat", "owner": 1})  # type: ignore[typeddict-item]
    assert availability.channel_layer.available
    assert metrics.CHANNEL_LAYER_FAILURES.labels("broadcast")._value.get() == failures + 2
