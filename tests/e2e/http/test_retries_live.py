"""Retries and disconnects against a real server (HTTP-API.md §14.4, §14.6): a retried request never
runs twice, a retry reattaches to its stream and gets the whole answer exactly once, a client that
leaves without a key stops its run within a second, and with a key the run waits for a retry."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
from openai.types.responses import ResponseErrorEvent

from tests.e2e.http.support import Gateway, sse_data, start_gateway
from tests.support.servers import manage

pytestmark = pytest.mark.server

REATTACH_SECONDS = 2.0
TICK_SECONDS = 1.0
SESSION = "x-agentgate-session-key"
KEYS = {
    "alice": ("alice", None),
    "victim": ("vic", None),
    "witness": ("vic", None),
    "leaver": ("lea", None),
    "streamer": ("ann", None),  # two keys of one user revoked under an answer, and one that stays
    "waiter": ("ann", None),
    "onlooker": ("ann", None),
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("retries"),
        keys=KEYS,
        GATEWAY_TICK_INTERVAL_MS=str(int(TICK_SECONDS * 1000)),
        GATEWAY_HTTP_REATTACH_SECONDS=str(REATTACH_SECONDS),
        GATEWAY_HTTP_KEEPALIVE_SECONDS="0.5",
    )
    yield gateway
    gateway.stop()


def body(text: str, *, stream: bool = True) -> dict[str, Any]:
    return {"model": "main", "messages": [{"role": "user", "content": text}], "stream": stream}


def words(n: int) -> str:
    return "echo:" + "".join(f" word{i + 1}" for i in range(n))


def text_of(lines: list[str]) -> str:
    return "".join(
        d["choices"][0]["delta"].get("content") or ""
        for d in sse_data("\n".join(lines))
        if isinstance(d, dict) and d.get("choices")
    )


async def wait_run(gw: Gateway, run_id: str, key: str, timeout_ms: int = 5000) -> dict[str, Any]:
    async with gw.ws() as ws:
        return await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": timeout_ms}, timeout=10)


def test_a_retry_gets_the_same_answer_and_another_body_is_a_409(gw: Gateway) -> None:
    client = gw.sdk()
    key = {"Idempotency-Key": "k-replay"}
    messages = [{"role": "user", "content": "only once"}]
    first = client.chat.completions.with_raw_response.create(model="main", messages=messages, extra_headers=key)
    again = client.chat.completions.with_raw_response.create(model="main", messages=messages, extra_headers=key)
    assert again.headers["x-agentgate-idempotent-replay"] == "true"
    assert "x-agentgate-idempotent-replay" not in first.headers
    assert again.parse().model_dump() == first.parse().model_dump()
    assert again.headers["x-agentgate-run-id"] == first.headers["x-agentgate-run-id"] == "k-replay"
    streamed = client.chat.completions.create(model="main", messages=messages, extra_headers=key, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "echo: only once"
    with pytest.raises(openai.ConflictError) as conflict:
        client.chat.completions.create(model="main", messages=[{"role": "user", "content": "other"}], extra_headers=key)
    assert conflict.value.response.headers["x-should-retry"] == "false"
    assert conflict.value.body["param"] == "Idempotency-Key"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="main", messages=messages, extra_headers={"Idempotency-Key": "k" * 129})
    assert bad.value.body["param"] == "Idempotency-Key"


async def test_a_streaming_retry_racing_the_first_gets_the_whole_text_exactly_once(gw: Gateway) -> None:
    request = body("[[words:40]] [[tick:25]]")
    headers = {"Idempotency-Key": "k-race"}
    async with (
        gw.async_http(**headers) as first_http,
        gw.async_http(**headers) as second_http,
        first_http.stream("POST", "/v1/chat/completions", json=request) as first,
    ):
        first_lines: list[str] = []
        reading = first.aiter_lines()
        async for line in reading:
            first_lines.append(line)
            if "word3" in line:
                break
        second = await second_http.post("/v1/chat/completions", json=request)
        first_lines += [line async for line in reading]
    assert second.headers["x-agentgate-run-id"] == first.headers["x-agentgate-run-id"] == "k-race"
    assert "x-agentgate-idempotent-replay" not in second.headers  # reattached while it ran
    assert text_of(first_lines) == text_of(second.text.splitlines()) == words(40)
    assert sse_data(second.text)[-1] == "[DONE]"
    async with gw.ws() as ws:
        history = await ws.ok("chat.history", {"sessionKey": first.headers["x-agentgate-session-key"]})
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]  # one run


async def test_one_key_on_requests_for_two_sessions_racing_makes_one_run_and_a_409(gw: Gateway) -> None:
    request = body("[[words:10]] [[tick:20]]", stream=False)
    async with gw.async_http() as http:
        for i in range(3):
            key = f"k-split-{i}"
            # one names a session, one is stateless: each admission locks only its own session
            a, b = await asyncio.gather(
                http.post("/v1/chat/completions", json=request, headers={"Idempotency-Key": key, SESSION: f"s{i}"}),
                http.post("/v1/chat/completions", json=request, headers={"Idempotency-Key": key}),
            )
            assert sorted([a.status_code, b.status_code]) == [200, 409], (a.text, b.text)
            won = a if a.status_code == 200 else b
            assert won.json()["choices"][0]["message"]["content"] == words(10)
            with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
                stored = db.execute("SELECT count(*) FROM sessions_app_run WHERE run_id = ?", (key,)).fetchall()
            assert stored == [(1,)]


async def test_a_client_that_leaves_without_a_key_aborts_its_run_within_a_second(gw: Gateway) -> None:
    async with gw.async_http() as http, gw.ws() as ws:
        async with http.stream("POST", "/v1/chat/completions", json=body("[[hang]]")) as answer:
            run_id, key = answer.headers["x-agentgate-run-id"], answer.headers["x-agentgate-session-key"]
            async for line in answer.aiter_lines():
                if '"role":"assistant"' in line:
                    break  # running: now leave
        left = time.monotonic()
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 3000})
        assert time.monotonic() - left < 1.0
    assert waited["status"] == "error" and waited["aborted"] is True and waited["stopReason"] == "disconnect"


async def post_and_leave(gw: Gateway, who: str, request: dict[str, Any], after: float, **headers: str) -> None:
    """Send a whole request on a socket of its own and close it `after` seconds later, answered or not."""
    url, payload = urlparse(gw.server.url), json.dumps(request).encode()
    lines = {"host": url.netloc, "authorization": f"Bearer {gw.keys[who]}", **headers}
    lines.update({"content-type": "application/json", "content-length": str(len(payload))})
    head = "POST /v1/chat/completions HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n"
    _reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(head.encode() + payload)
    await writer.drain()
    await asyncio.sleep(after)
    writer.close()


async def runs_of(gw: Gateway, who: str) -> tuple[int, list[str]]:
    """How many stateless sessions `who` has, and the runs still open in them."""
    async with gw.ws(who) as ws:
        listed = await ws.ok("sessions.list", {"kinds": ["api"], "limit": 1000})
    sessions = listed["sessions"]
    return len(sessions), [run for s in sessions for run in [*s["activeRunIds"], *s["queuedRunIds"]]]


async def test_clients_that_leave_while_their_runs_are_admitted_leave_no_run_open(gw: Gateway) -> None:
    # forty at once, each leaving 0-390 ms after sending: before, while and after its run is admitted
    request = body("[[words:300]] [[tick:100]]")  # 30 s unless the disconnect rule ends it
    await asyncio.gather(*(post_and_leave(gw, "leaver", request, i / 100) for i in range(40)))
    await asyncio.sleep(1.5)
    admitted, still_open = await runs_of(gw, "leaver")
    assert admitted > 0 and still_open == []
    # with a key, each admitted run is detached: aborted once the reattach window has passed
    leaving = (post_and_leave(gw, "leaver", request, i / 100, **{"Idempotency-Key": f"k-gone-{i}"}) for i in range(40))
    await asyncio.gather(*leaving)
    await asyncio.sleep(REATTACH_SECONDS + 2.5)
    keyed, still_open = await runs_of(gw, "leaver")
    assert keyed > admitted and still_open == []


async def test_with_a_key_the_run_outlives_its_client_and_a_retry_reattaches(gw: Gateway) -> None:
    request, headers = body("[[words:30]] [[tick:60]]"), {"Idempotency-Key": "k-survive"}
    async with gw.async_http(**headers) as http:
        async with http.stream("POST", "/v1/chat/completions", json=request) as answer:
            key = answer.headers["x-agentgate-session-key"]
            async for line in answer.aiter_lines():
                if "word2" in line:
                    break
        await asyncio.sleep(0.5)
        still = await wait_run(gw, "k-survive", key, timeout_ms=0)
        assert still["status"] == "pending"
        retry = await http.post("/v1/chat/completions", json=request)
    assert retry.headers["x-agentgate-run-id"] == "k-survive"
    assert text_of(retry.text.splitlines()) == words(30)
    assert (await wait_run(gw, "k-survive", key))["status"] == "ok"


async def test_a_detached_run_no_retry_comes_back_for_is_aborted_after_the_reattach_window(gw: Gateway) -> None:
    async with (
        gw.async_http(**{"Idempotency-Key": "k-leave"}) as http,
        http.stream("POST", "/v1/chat/completions", json=body("[[hang]]")) as answer,
    ):
        key = answer.headers["x-agentgate-session-key"]
        async for line in answer.aiter_lines():
            if '"role":"assistant"' in line:
                break
    left = time.monotonic()
    waited = await wait_run(gw, "k-leave", key, timeout_ms=8000)
    assert waited["aborted"] is True and waited["stopReason"] == "disconnect"
    assert REATTACH_SECONDS - 0.2 < time.monotonic() - left < REATTACH_SECONDS + 3


async def test_a_queued_request_whose_client_leaves_removes_its_queued_run(gw: Gateway) -> None:
    async with gw.ws() as ws, gw.async_http(**{"x-agentgate-session-key": "busy"}) as http:
        await ws.ok("chat.send", {"sessionKey": "busy", "message": "[[hang]]", "idempotencyKey": "holder"})
        async with http.stream("POST", "/v1/chat/completions", json=body("wait your turn")) as answer:
            run_id = answer.headers["x-agentgate-run-id"]
            lines = answer.aiter_lines()  # held: a dropped iterator closes the response, and the connection
            async for line in lines:
                assert line in ("", ": keep-alive")  # queued: nothing but keep-alive comments
                if line:
                    break
            listed = await ws.ok("sessions.list", {"search": "busy"})
            assert listed["sessions"][0]["queuedRunIds"] == [run_id]
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": "agent:main:busy", "timeoutMs": 3000})
        assert waited["aborted"] is True and waited["stopReason"] == "disconnect"
        listed = await ws.ok("sessions.list", {"search": "busy"})
        assert listed["sessions"][0]["queuedRunIds"] == [] and listed["sessions"][0]["activeRunIds"] == ["holder"]
        await ws.ok("chat.abort", {"sessionKey": "busy"})


async def test_a_stream_queued_past_a_keep_alive_whose_run_fails_at_dispatch_ends_with_the_error_then_done(
    gw: Gateway,
) -> None:
    async with gw.ws() as ws, gw.async_http(**{"x-agentgate-session-key": "busy-fail"}) as http:
        await ws.ok("chat.send", {"sessionKey": "busy-fail", "message": "[[hang]]", "idempotencyKey": "holder-f"})
        async with http.stream("POST", "/v1/chat/completions", json=body("[[fail:dispatch]]")) as answer:
            assert answer.status_code == 200  # the headers went out with the first keep-alive
            lines = answer.aiter_lines()
            async for line in lines:
                if line == ": keep-alive":
                    break
            await ws.ok("chat.abort", {"sessionKey": "busy-fail", "runId": "holder-f"})  # its turn: it fails
            rest = [line async for line in lines]
    data = sse_data("\n".join(rest))
    assert data == [{"error": data[0]["error"]}, "[DONE]"] and data[0]["error"]["code"] == "dispatch"


async def test_a_key_revoked_mid_stream_ends_the_stream_within_a_tick_and_leaves_the_run(gw: Gateway) -> None:
    async with gw.async_http("victim") as http:
        async with http.stream("POST", "/v1/chat/completions", json=body("[[hang]]")) as answer:
            run_id, key = answer.headers["x-agentgate-run-id"], answer.headers["x-agentgate-session-key"]
            lines = answer.aiter_lines()
            async for line in lines:
                if '"role":"assistant"' in line:
                    break
            # revoked by another process (the command): the tick's re-check is what notices it here
            await asyncio.to_thread(manage, gw.env, "revoke_api_token", "--prefix", gw.keys["victim"][:12])
            revoked = time.monotonic()
            rest = [line async for line in lines]
        assert time.monotonic() - revoked < TICK_SECONDS + 1.5
        assert (await http.get("/v1/models")).status_code == 401
    data = sse_data("\n".join(rest))
    assert data[-1] == "[DONE]" and data[-2]["error"]["code"] == "key_revoked"
    async with gw.ws("witness") as ws:  # another key of the same user
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 3000})
    assert waited["aborted"] is True and waited["stopReason"] == "disconnect"


def revoke(gw: Gateway, who: str) -> None:
    manage(gw.env, "revoke_api_token", "--prefix", gw.keys[who][:12])


def sse_events(lines: list[str]) -> list[tuple[str | None, Any]]:
    """(event name, JSON data) of each event of a Responses stream."""
    out: list[tuple[str | None, Any]] = []
    name: str | None = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
            name = None
    return out


async def test_a_key_revoked_mid_stream_ends_a_responses_stream_with_its_error_event_and_leaves_the_run(
    gw: Gateway,
) -> None:
    request = {"model": "main", "input": "[[hang]]", "stream": True}
    async with gw.async_http("streamer") as http, http.stream("POST", "/v1/responses", json=request) as answer:
        run_id, key = answer.headers["x-agentgate-run-id"], answer.headers["x-agentgate-session-key"]
        lines, reading = [], answer.aiter_lines()
        async for line in reading:
            lines.append(line)
            if line == "event: response.in_progress":
                break  # running
        await asyncio.to_thread(revoke, gw, "streamer")
        lines += [line async for line in reading]
    events = sse_events(lines)
    (name, last), (_, before) = events[-1], events[-2]
    assert name == "error" and last["type"] == "error" and last["code"] == "key_revoked"
    assert last["sequence_number"] == before["sequence_number"] + 1
    assert ResponseErrorEvent.model_validate(last).message == "the API key of this request was revoked"
    assert not any(n in ("response.completed", "response.failed", "response.cancelled") for n, _ in events)
    async with gw.ws("onlooker") as ws:
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 3000})
    assert waited["aborted"] is True and waited["stopReason"] == "disconnect"


async def test_a_key_revoked_under_a_whole_answer_is_a_401_with_the_runs_headers(gw: Gateway) -> None:
    async with gw.async_http("waiter") as http, gw.ws("onlooker") as ws:
        asking = asyncio.ensure_future(http.post("/v1/chat/completions", json=body("[[hang]] whole", stream=False)))
        while not [s for s in (await ws.ok("sessions.list", {"kinds": ["api"]}))["sessions"] if s["activeRunIds"]]:
            await asyncio.sleep(0.05)  # admitted and running
        await asyncio.to_thread(revoke, gw, "waiter")
        answer = await asking
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "key_revoked"
        run_id, key = answer.headers["x-agentgate-run-id"], answer.headers["x-agentgate-session-key"]
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 3000})
    assert waited["aborted"] is True and waited["stopReason"] == "disconnect"
