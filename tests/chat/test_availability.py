"""While the database is away, as this process knows it (`chat.base.availability`): calls are
refused at once but one trial at a time goes through, clients hear `UNAVAILABLE` (never
`INTERNAL`), a handshake is answered and closed with 4013, and an outage is logged once each way.

The database here is real and up: the outage is what the process believes after a failure it saw
(`failed`), and a trial that has not come back yet is held open with the breaker's own `admit`.
The real thing, PostgreSQL stopped under load with its pool, is tests/e2e/test_service_outages.py.

A tool step rides out an outage as the stream does: its calls' writes wait (for as long as
GATEWAY_RUN_DB_WAIT_SECONDS), a call runs once whatever happens, and a write whose answer was
lost is never done twice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest

from chat.base import availability, metrics
from chat.base.availability import DatabaseUnavailable, Dependency, Unavailable
from chat.base.db import db_read
from chat.runtime import executor
from chat.runtime.tools import host
from sessions_app.lifecycle import runs
from sessions_app.models import Run, ToolApproval, ToolCall
from tests.support.communicator import Client, open_client
from tests.support.db import send_params
from tests.support.tools import TEST_SERVER, TOOL_CONNECT, executions, results

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
    with caplog.at_level(logging.INFO, logger="chat.base.availability"):
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
    """The connection broke after the run's `running` (`runs.start_reply`, with or without its first
    text) committed: the retry finds the run `running` under this process, and the run goes on
    instead of being left to fail."""
    real = runs.start_reply
    lost = {"n": 0}

    def committed_then_lost(run_pk: int, text: str | None = None, *, owner_process: str | None = None) -> int | None:
        done = real(run_pk, text, owner_process=owner_process)
        if not lost["n"]:
            lost["n"] += 1
            raise DatabaseUnavailable("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(runs, "start_reply", committed_then_lost)
    # words slower than the delta interval: `running` is written before the reply's end
    await client.ok("chat.send", send_params("main", "hello [[words:3]] [[tick:100]]", "k1"))  # type: ignore[attr-defined]
    terminal = await client.wait_terminal("k1", 10)  # type: ignore[attr-defined]
    assert lost["n"] == 1 and terminal["state"] == "final", terminal
    assert terminal["message"]["content"][0]["text"] == "echo: word1 word2 word3", terminal


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


# --- a tool step through an outage ---------------------------------------------------------------


@pytest.fixture
def count_file(tmp_path: Path) -> Path:
    return tmp_path / "count.txt"


@pytest.fixture
def tool_agent(settings: Any, count_file: Path) -> dict[str, Any]:
    """The scripted agent with the test MCP server, whose `count` runs are counted (no approvals)."""
    server = {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}
    config: dict[str, Any] = {"backend": "scripted", "mcp_servers": {"t": server}, "approval": {"*": "never"}}
    settings.GATEWAY_AGENTS = {"main": config}
    return config


@pytest.fixture
async def tc(alice: tuple[Any, str], tool_agent: dict[str, Any]) -> AsyncIterator[Client]:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


@database_sync_to_async
def _calls() -> list[ToolCall]:
    return list(ToolCall.objects.order_by("id"))


class Refusals:
    """When each kind of write of the runtime (`fn.__name__`) was first refused while the database
    was away: a look at the db bridge as the tool host and the executor call it, nothing changed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.first: dict[str, float] = {}
        for module in (host, executor):
            monkeypatch.setattr(module, "db_write", self._watched(module.db_write))

    def _watched(self, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def db_write(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            try:
                return await real(fn, *args, **kwargs)
            except Unavailable:
                self.first.setdefault(fn.__name__, time.monotonic())
                raise

        return db_write

    async def of(self, name: str, timeout: float = 20) -> float:
        deadline = time.monotonic() + timeout
        while name not in self.first:
            assert time.monotonic() < deadline, f"no {name} was refused ({self.first})"
            await asyncio.sleep(0.02)
        return self.first[name]


async def _away_while_the_tool_runs(tc: Client, count_file: Path) -> datetime:
    """Send a run whose one call (`t.count`, two seconds long) is under way at the server when the
    database goes away, so that its result comes back during the outage; when it went away."""
    message = '[[tick:0]] go [[tool:t.count {"arg": "x", "ms": 2000}]]'
    await tc.ok("chat.send", send_params("main", message, "o1"), timeout=20)  # the server starts first
    deadline = time.monotonic() + 20
    while not executions(count_file):  # the request reached the server: its `running` committed
        assert time.monotonic() < deadline, "the tool never ran"
        await asyncio.sleep(0.02)
    went = timezone.now()
    _away_with_a_trial_in_flight()
    return went


def _back() -> datetime:
    """The trial under way comes back: the next one finds the database there."""
    back = timezone.now()
    availability.database.end_trial()
    return back


async def test_a_tool_step_rides_out_an_outage_shorter_than_the_runs_wait(
    tc: Client, count_file: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's result comes back while the database is away: it is stored once the database is
    back, and the run goes on to `final` (it never tried to end meanwhile). The tool ran once."""
    settings.GATEWAY_RUN_DB_WAIT_SECONDS = 10
    refused = Refusals(monkeypatch)
    went = await _away_while_the_tool_runs(tc, count_file)
    await refused.of("finish_call")
    await asyncio.sleep(1.5)  # tried again, refused again
    back = _back()
    terminal = await tc.wait_terminal("o1", 20)
    assert terminal["state"] == "final", terminal
    assert "finish_run" not in refused.first
    (call,) = await _calls()
    assert (call.state, call.result) == ("succeeded", "1")
    assert call.started_at is not None and call.ended_at is not None
    assert call.started_at < went and call.ended_at > back  # it ran before, and was stored after
    assert [r["status"] for r in results(tc, "o1")] == ["succeeded"]
    assert executions(count_file) == 1


async def test_a_result_not_stored_within_the_runs_wait_fails_the_run_and_the_call_is_unknown(
    tc: Client, count_file: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result cannot be stored for GATEWAY_RUN_DB_WAIT_SECONDS: the run stops and ends `failed`
    (`unavailable`) once the database is back, and its end marks the call `unknown` (it ran, its
    result is lost): it is not run again."""
    settings.GATEWAY_RUN_DB_WAIT_SECONDS = 1
    refused = Refusals(monkeypatch)
    await _away_while_the_tool_runs(tc, count_file)
    waited_from = await refused.of("finish_call")
    gave_up = await refused.of("finish_run")  # the run stopped waiting: its end waits for the database
    assert gave_up - waited_from >= 1
    back = _back()
    terminal = await tc.wait_terminal("o1", 20)
    assert (terminal["state"], terminal["errorKind"]) == ("error", "unavailable"), terminal
    assert "GATEWAY_RUN_DB_WAIT_SECONDS" in terminal["errorMessage"], terminal
    (call,) = await _calls()
    assert (call.state, call.error_kind) == ("unknown", "unknown")
    assert call.ended_at is not None and call.ended_at > back
    assert [r["status"] for r in results(tc, "o1")] == ["unknown"]
    assert executions(count_file) == 1


@pytest.mark.parametrize("write", ["record_calls", "request_approval", "begin_call", "finish_call"])
async def test_a_tool_write_committed_but_not_acknowledged_is_not_done_twice(
    tc: Client, tool_agent: dict[str, Any], count_file: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """The connection broke after a write of the step committed: its retry gets back what the
    first try made, or (a compare-and-set that now says no) the call is read to learn why. The run
    ends `final` with one call, asked about once, run once."""
    real = host.db_write
    lost: list[str] = []

    async def answer_lost(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        done = await real(fn, *args, **kwargs)  # committed
        if fn.__name__ == write and not lost:
            lost.append(write)
            raise DatabaseUnavailable("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(host, "db_write", answer_lost)
    tool_agent["approval"] = {"*": "always"}
    await tc.ok("chat.send", send_params("main", '[[tool:t.count {"arg": "x"}]]', "l1"), timeout=20)
    requested = await tc.wait_event(lambda e: e["event"] == "plugin.approval.requested", 20)
    await tc.ok("plugin.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"})
    terminal = await tc.wait_terminal("l1", 20)
    assert lost == [write] and terminal["state"] == "final", (lost, terminal)
    assert [(c.state, c.result) for c in await _calls()] == [("succeeded", "1")]
    assert [r["status"] for r in results(tc, "l1")] == ["succeeded"]
    assert await database_sync_to_async(ToolApproval.objects.count)() == 1
    assert executions(count_file) == 1
