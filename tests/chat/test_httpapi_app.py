"""The HTTP API's door as an ASGI app (chat.httpapi.app), with the real database: switched off, the
database away, bodies bounded by the app itself (behind servers other than `serve`), a fault of its
own, and event streams (keep-alive comments, a client that leaves, an error before the first event).

An answer that ends before its run (anything raised mid-stream, a whole answer that cannot be
built) ends once, with the run's headers, and applies the disconnect rule; with real runs, the
database away as the process sees it (its breaker held open, as tests/chat/test_availability.py
does): a stream rides out a short outage, and one that outlasts GATEWAY_RUN_DB_WAIT_SECONDS ends
with its error terminal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import override_settings

from chat.base import availability
from chat.base.availability import DatabaseUnavailable
from chat.httpapi import routes
from chat.httpapi.app import HttpApi
from chat.httpapi.errors import ApiError
from chat.httpapi.http import EventStream, JsonAnswer, Request, SseEvent
from sessions_app.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


class Exchange:
    """One request to an ASGI app: what the client sends, and what it gets back."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for message in messages:
            self.inbox.put_nowait(message)
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


def scope(method: str, path: str, token: str | None = None) -> dict[str, Any]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {"type": "http", "method": method, "path": path, "query_string": b"", "headers": headers}


async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What stands behind the door (Django): answers 299 so a pass-through shows."""
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"django"})


BODY = {"type": "http.request", "body": b"", "more_body": False}


@pytest.fixture
def temporary_route() -> AsyncIterator[list[Any]]:
    """Routes a test adds, taken out again after it."""
    added: list[Any] = []
    before = list(routes.ROUTES)
    yield added
    routes.ROUTES[:] = before


async def test_switched_off_every_v1_path_is_a_404_and_the_rest_passes_through(alice: tuple[Any, str]) -> None:
    app = HttpApi(inner)
    with override_settings(GATEWAY_HTTP_API=False):
        off = Exchange(BODY)
        await app(scope("GET", "/v1/models", alice[1]), off.receive, off.send)
    assert off.status == 404 and json.loads(off.body)["error"]["code"] == "api_disabled"
    page = Exchange(BODY)
    await app(scope("GET", "/v1x", alice[1]), page.receive, page.send)
    assert page.status == 299
    on = Exchange(BODY)
    await app(scope("GET", "/v1/models", alice[1]), on.receive, on.send)
    assert on.status == 200 and json.loads(on.body)["object"] == "list"


async def test_while_the_database_is_away_the_answer_is_503_with_retry_after(alice: tuple[Any, str]) -> None:
    database = availability.database
    database.failed(OSError("connection refused"))
    await asyncio.sleep(availability.TRIAL_SECONDS)
    assert database.admit() and database.claim(True)  # a trial is under way: every other call is refused
    try:
        exchange = Exchange(BODY)
        await HttpApi(inner)(scope("GET", "/v1/models", alice[1]), exchange.receive, exchange.send)
    finally:
        database.end_trial()
        database.reset()
    assert exchange.status == 503 and int(exchange.headers["retry-after"]) >= 1
    error = json.loads(exchange.body)["error"]
    assert error["code"] == "unavailable" and "database" in error["message"]


@override_settings(GATEWAY_HTTP_MAX_BODY=100, GATEWAY_HTTP_BODY_TIMEOUT_SECONDS=0.3)
async def test_the_app_bounds_bodies_itself(alice: tuple[Any, str]) -> None:
    app = HttpApi(inner)
    chunk = {"type": "http.request", "body": b"x" * 60, "more_body": True}
    big = Exchange(chunk, chunk, BODY)
    await app(scope("POST", "/v1/chat/completions", alice[1]), big.receive, big.send)
    assert big.status == 413
    slow = Exchange(chunk)  # and then nothing
    started = time.monotonic()
    await app(scope("POST", "/v1/chat/completions", alice[1]), slow.receive, slow.send)
    assert slow.status == 408 and time.monotonic() - started < 2


async def test_a_fault_of_the_gateway_is_a_500_that_tells_nothing(
    alice: tuple[Any, str], temporary_route: list[Any]
) -> None:
    @routes.route("GET", r"^/v1/test-fault$")
    async def fault(req: Request) -> JsonAnswer:
        raise RuntimeError("secret internals")

    exchange = Exchange(BODY)
    await HttpApi(inner)(scope("GET", "/v1/test-fault", alice[1]), exchange.receive, exchange.send)
    assert exchange.status == 500 and b"secret" not in exchange.body


@override_settings(GATEWAY_HTTP_KEEPALIVE_SECONDS=0.05)
async def test_a_stream_keeps_alive_and_notices_a_client_that_leaves_at_once(
    alice: tuple[Any, str], temporary_route: list[Any]
) -> None:
    closed = asyncio.Event()
    left: list[float] = []

    async def events(req: Request) -> AsyncIterator[SseEvent]:
        try:
            yield SseEvent({"n": 1})
            await asyncio.Event().wait()  # a long tool step: nothing to send
            yield SseEvent({"n": 2})
        finally:
            closed.set()

    @routes.route("GET", r"^/v1/test-stream$")
    async def stream(req: Request) -> EventStream:
        async def hook() -> None:
            left.append(time.monotonic())

        req.on_disconnect(hook)
        return EventStream(events(req))

    exchange = Exchange(BODY)
    serving = asyncio.ensure_future(
        HttpApi(inner)(scope("GET", "/v1/test-stream", alice[1]), exchange.receive, exchange.send)
    )
    await asyncio.sleep(0.3)
    assert exchange.headers["content-type"].startswith("text/event-stream")
    assert exchange.body.startswith(b'data: {"n":1}\n\n: keep-alive\n\n')
    gone = time.monotonic()
    exchange.inbox.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(closed.wait(), 1)
    await asyncio.wait_for(serving, 1)
    assert left and left[0] - gone < 0.2 and time.monotonic() - gone < 0.5


async def test_a_stream_that_fails_before_its_first_event_is_answered_with_that_status(
    alice: tuple[Any, str], temporary_route: list[Any]
) -> None:
    async def refused() -> AsyncIterator[SseEvent]:
        raise ApiError(409, "no", code="run_aborted", headers={"x-agentgate-run-id": "r1"})
        yield SseEvent({})  # (an async generator)

    @routes.route("GET", r"^/v1/test-refused$")
    async def stream(req: Request) -> EventStream:
        return EventStream(refused())

    exchange = Exchange(BODY)
    await HttpApi(inner)(scope("GET", "/v1/test-refused", alice[1]), exchange.receive, exchange.send)
    assert exchange.status == 409 and exchange.headers["x-agentgate-run-id"] == "r1"
    assert json.loads(exchange.body)["error"]["code"] == "run_aborted"


# --- an answer that ends before its run -------------------------------------------------------------


def post(path: str, token: str, body: dict[str, Any], **headers: str) -> tuple[dict[str, Any], Exchange]:
    """A POST's scope and its exchange, the JSON body sent whole."""
    sent = [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")]
    sent += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    request = {"type": "http", "method": "POST", "path": path, "query_string": b"", "headers": sent}
    return request, Exchange({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})


def chat(text: str, *, stream: bool) -> dict[str, Any]:
    return {"model": "main", "messages": [{"role": "user", "content": text}], "stream": stream}


def events_of(body: bytes) -> list[Any]:
    """The `data:` payloads of an event stream (`[DONE]` as the string), and its comments as `:`."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block.startswith(":"):
            out.append(":")
        elif block.startswith("data: "):
            out.append(block[6:] if block == "data: [DONE]" else json.loads(block[6:]))
    return out


async def until(condition: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
    return found


async def run_row(run_id: str) -> Run | None:
    return await database_sync_to_async(lambda: Run.objects.filter(run_id=run_id).first())()


async def run_until(run_id: str, check: Callable[[Run], bool], timeout: float = 5.0) -> Run:
    deadline = time.monotonic() + timeout
    while (run := await run_row(run_id)) is None or not check(run):
        assert time.monotonic() < deadline, f"run {run_id}: {run and (run.state, run.stop_reason, run.detached_at)}"
        await asyncio.sleep(0.05)
    return run


@contextlib.contextmanager
def database_away() -> Iterator[None]:
    """The database away as this process sees it: its breaker open, a trial held, every call refused."""
    database = availability.database
    database.failed(OSError("connection refused"))
    time.sleep(availability.TRIAL_SECONDS)
    assert database.admit() and database.claim(True)
    try:
        yield
    finally:
        database.end_trial()
        database.reset()


async def test_whatever_a_stream_raises_ends_it_once_and_abandons_its_run(
    alice: tuple[Any, str], temporary_route: list[Any]
) -> None:
    abandoned: list[str] = []
    faults = {"fault": RuntimeError("secret internals"), "away": DatabaseUnavailable("connection refused")}

    async def failing(case: str) -> AsyncIterator[SseEvent]:
        if case != "first":
            yield SseEvent({"n": 1})
        raise faults.get(case, DatabaseUnavailable("connection refused"))

    def ending(error: ApiError, last: SseEvent | None) -> list[SseEvent]:
        return [SseEvent({"end": error.code, "after": last.data if last else None}), SseEvent("[DONE]")]

    @routes.route("GET", r"^/v1/test-failing/(?P<case>\w+)$")
    async def stream(req: Request, case: str) -> EventStream:
        async def hook() -> None:
            abandoned.append(case)

        req.on_disconnect(hook)
        return EventStream(failing(case), headers={"x-agentgate-run-id": "r1"}, ending=ending)

    answers = {}
    for case in ("fault", "away", "first"):
        answers[case] = exchange = Exchange(BODY)
        await HttpApi(inner)(scope("GET", f"/v1/test-failing/{case}", alice[1]), exchange.receive, exchange.send)
    await until(lambda: len(abandoned) == 3)  # (hooks run in tasks of their own)
    assert sorted(abandoned) == ["away", "fault", "first"]
    fault, away, first = answers["fault"], answers["away"], answers["first"]
    assert fault.status == 200 and b"secret" not in fault.body
    assert events_of(fault.body) == [{"n": 1}, {"end": "internal_error", "after": {"n": 1}}, "[DONE]"]
    assert fault.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert events_of(away.body) == [{"n": 1}, {"end": "unavailable", "after": {"n": 1}}, "[DONE]"]
    # nothing sent yet: the answer is the error's, with the stream's (the run's) headers
    assert first.status == 503 and int(first.headers["retry-after"]) >= 1
    assert first.headers["x-agentgate-run-id"] == "r1"
    assert json.loads(first.body)["error"]["code"] == "unavailable"


async def test_a_handler_that_fails_after_its_run_was_admitted_answers_with_its_headers_and_abandons_it(
    alice: tuple[Any, str], temporary_route: list[Any]
) -> None:
    abandoned: list[bool] = []

    @routes.route("GET", r"^/v1/test-lost$")
    async def lost(req: Request) -> JsonAnswer:
        async def hook() -> None:
            abandoned.append(True)

        req.on_disconnect(hook)
        req.run_headers = {"x-agentgate-run-id": "r2", "x-agentgate-session-key": "agent:main:api-x"}
        raise DatabaseUnavailable("connection refused")  # the answer could not be built

    exchange = Exchange(BODY)
    await HttpApi(inner)(scope("GET", "/v1/test-lost", alice[1]), exchange.receive, exchange.send)
    assert exchange.status == 503 and int(exchange.headers["retry-after"]) >= 1
    assert exchange.headers["x-agentgate-run-id"] == "r2"
    assert exchange.headers["x-agentgate-session-key"] == "agent:main:api-x"
    await until(lambda: abandoned)


@override_settings(GATEWAY_RUN_DB_WAIT_SECONDS=4.0, GATEWAY_HTTP_KEEPALIVE_SECONDS=0.2)
async def test_a_stream_rides_out_a_short_outage(alice: tuple[Any, str]) -> None:
    request, exchange = post("/v1/chat/completions", alice[1], chat("[[words:8]] [[tick:150]]", stream=True))
    serving = asyncio.ensure_future(HttpApi(inner)(request, exchange.receive, exchange.send))
    await until(lambda: b"word1" in exchange.body)
    with database_away():
        await asyncio.sleep(1.5)  # longer than a follower waits between reads of its run
    await asyncio.wait_for(serving, 10)
    data = events_of(exchange.body)
    assert ":" in data  # keep-alives while the run's text waited for the database
    text = "".join(d["choices"][0]["delta"].get("content") or "" for d in data if isinstance(d, dict))
    assert text == "echo:" + "".join(f" word{i + 1}" for i in range(8))
    assert data[-2]["choices"][0]["finish_reason"] == "stop" and data[-1] == "[DONE]"


@override_settings(GATEWAY_RUN_DB_WAIT_SECONDS=1.0, GATEWAY_HTTP_KEEPALIVE_SECONDS=0.2)
async def test_a_stream_whose_database_stays_away_ends_with_its_error_and_its_run_is_aborted(
    alice: tuple[Any, str],
) -> None:
    request, exchange = post("/v1/chat/completions", alice[1], chat("[[hang]]", stream=True))
    serving = asyncio.ensure_future(HttpApi(inner)(request, exchange.receive, exchange.send))
    await until(lambda: b'"role":"assistant"' in exchange.body)
    run_id = exchange.headers["x-agentgate-run-id"]
    with database_away():
        away = time.monotonic()
        await until(lambda: exchange.body.endswith(b"data: [DONE]\n\n"), timeout=6)
        assert time.monotonic() - away >= 1.0  # it waited as long as a run would
    await asyncio.wait_for(serving, 2)
    data = events_of(exchange.body)
    assert data[-2]["error"]["code"] == "unavailable" and data[-1] == "[DONE]"
    # back: no key, so the run of a client that was told it ended is aborted
    run = await run_until(run_id, lambda run: run.is_terminal)
    assert (run.state, run.stop_reason) == ("killed", "disconnect")


@override_settings(GATEWAY_RUN_DB_WAIT_SECONDS=1.0)
async def test_a_whole_answer_whose_database_stays_away_is_a_503_and_its_keyed_run_waits_for_a_retry(
    alice: tuple[Any, str],
) -> None:
    request, exchange = post(
        "/v1/chat/completions", alice[1], chat("[[hang]]", stream=False), **{"Idempotency-Key": "k-away"}
    )
    serving = asyncio.ensure_future(HttpApi(inner)(request, exchange.receive, exchange.send))
    await run_until("k-away", lambda run: run.state == "running")
    with database_away():
        await asyncio.wait_for(serving, 6)
    assert exchange.status == 503 and int(exchange.headers["retry-after"]) >= 1
    assert exchange.headers["x-agentgate-run-id"] == "k-away"
    assert json.loads(exchange.body)["error"]["code"] == "unavailable"
    # back: with a key the run is detached (a retry may reattach), not aborted
    run = await run_until("k-away", lambda run: run.detached_at is not None)
    assert run.state == "running"
