"""The HTTP API on two gateway processes sharing PostgreSQL and Redis (HTTP-API.md §14.5-§14.7): the
same keyed request sent to both at once makes one run and one answer (and one key on two different
requests racing makes one run and a 409), a background response lives on
whichever process is asked about it, and a WebSocket client on one process stops an HTTP stream on
the other.

Skipped, with the reason, when PostgreSQL or Redis is not reachable (failed under
AGENTGATE_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.http.support import Gateway, sse_data
from tests.support.cluster import Cluster, cluster
from tests.support.servers import ws_client

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis]

RACES = 5
TERMINALS = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Gateway, Gateway]]:
    with cluster(tmp_path_factory.mktemp("http-cluster"), 2, GATEWAY_HTTP_KEEPALIVE_SECONDS="0.5") as c:
        keys = c.tokens("alice")
        yield c, Gateway(c.servers[0], c.env, keys), Gateway(c.servers[1], c.env, keys)


def words(n: int) -> str:
    return "echo:" + "".join(f" word{i + 1}" for i in range(n))


def text_of(data: list[Any]) -> str:
    return "".join(
        d["choices"][0]["delta"].get("content") or "" for d in data if isinstance(d, dict) and d.get("choices")
    )


def runs_under(c: Cluster, run_id: str) -> list[tuple[str, str]]:
    """Every run stored under this runId (any session): its state and session key."""
    return [
        (state, key)
        for state, key in c.query(
            "select r.state, s.key from sessions_app_run r join sessions_app_chatsession s on s.id = r.session_id "
            "where r.run_id = %s",
            run_id,
        )
    ]


async def _stream_post(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    """A streamed POST read to its end (the whole text kept on the response)."""
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
        await answer.aread()
    return answer


async def test_the_same_keyed_request_sent_to_both_processes_at_once_runs_once(two) -> None:
    c, p1, p2 = two
    request = {"model": "main", "messages": [{"role": "user", "content": "[[words:40]] [[tick:40]]"}], "stream": True}
    async with p1.async_http() as h1, p2.async_http() as h2:
        # connections opened first, so that both requests leave at the same moment
        assert [(await h.get("/v1/models")).status_code for h in (h1, h2)] == [200, 200]
        for i in range(RACES):
            key = f"race-{uuid.uuid4().hex[:8]}-{i}"
            headers = {"Idempotency-Key": key}
            a, b = await asyncio.gather(_stream_post(h1, request, headers), _stream_post(h2, request, headers))
            assert (a.status_code, b.status_code) == (200, 200), (a.text, b.text)
            assert a.headers["x-agentgate-run-id"] == b.headers["x-agentgate-run-id"] == key
            assert a.headers["x-agentgate-session-key"] == b.headers["x-agentgate-session-key"]
            for answer in (a, b):
                data = sse_data(answer.text)
                assert text_of(data) == words(40), answer.text
                assert data[-1] == "[DONE]" and data[-2]["choices"][0]["finish_reason"] == "stop"
            assert runs_under(c, key) == [("done", a.headers["x-agentgate-session-key"])], f"race {i}"
        async with p2.ws() as ws:
            history = await ws.ok("chat.history", {"sessionKey": a.headers["x-agentgate-session-key"]})
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]  # one run, one reply


async def test_one_key_on_two_requests_for_different_sessions_racing_makes_one_run_and_a_409(two) -> None:
    c, p1, p2 = two
    request = {"model": "main", "messages": [{"role": "user", "content": "[[words:20]] [[tick:40]]"}], "stream": True}
    async with p1.async_http() as h1, p2.async_http() as h2:
        assert [(await h.get("/v1/models")).status_code for h in (h1, h2)] == [200, 200]
        for i in range(RACES):
            key = f"split-{uuid.uuid4().hex[:8]}-{i}"
            # the same key, one request naming a session and one stateless: two sessions, each locked alone
            a, b = await asyncio.gather(
                _stream_post(h1, request, {"Idempotency-Key": key, "x-agentgate-session-key": "split"}),
                _stream_post(h2, request, {"Idempotency-Key": key}),
            )
            assert sorted([a.status_code, b.status_code]) == [200, 409], (a.text, b.text)
            won, lost = (a, b) if a.status_code == 200 else (b, a)
            assert json.loads(lost.text)["error"]["param"] == "Idempotency-Key"
            assert text_of(sse_data(won.text)) == words(20)
            assert runs_under(c, key) == [("done", won.headers["x-agentgate-session-key"])], f"race {i}"


def test_a_background_response_is_followed_resumed_and_cancelled_on_the_other_process(two) -> None:
    c, p1, p2 = two
    made = p1.sdk().responses.create(model="main", input="[[words:300]] [[tick:40]]", background=True)
    other = p2.sdk()
    seen = other.responses.retrieve(made.id)
    assert seen.id == made.id and seen.status in ("queued", "in_progress") and seen.background is True
    resumed: list[dict[str, Any]] = []
    live = other.responses.retrieve(made.id, stream=True, starting_after=2)
    for event in live:
        resumed.append(event.model_dump(mode="json", exclude_unset=True))
        if event.type == "response.output_text.delta" and "word3" in event.delta:
            cancelled = other.responses.cancel(made.id)  # on process 2; the run is process 1's
            assert cancelled.status == "cancelled" and cancelled.error.code == "run_aborted"
    assert resumed[0]["sequence_number"] == 3
    assert [e["type"] for e in resumed if e["type"] in TERMINALS] == ["response.cancelled"]
    ((state, stop_reason, owner, reply),) = c.query(
        "select r.state, r.stop_reason, r.owner_process, r.reply from sessions_app_run r "
        "join sessions_app_apiresponse a on a.run_id = r.id where a.response_id = %s",
        made.id,
    )
    assert (state, stop_reason) == ("killed", "cancel")
    assert len(reply.split()) < 301  # stopped before it could finish
    # process 1, where it ran, says the same, event for event
    mine = p1.sdk()
    assert mine.responses.retrieve(made.id).status == "cancelled"
    whole = [e.model_dump(mode="json", exclude_unset=True) for e in mine.responses.retrieve(made.id, stream=True)]
    assert whole[3:] == resumed
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert mine.responses.retrieve(made.id).model_dump() == other.responses.retrieve(made.id).model_dump()
    assert owner, "the run was owned by a process"


async def test_chat_abort_on_one_process_stops_an_http_stream_on_the_other(two) -> None:
    c, p1, p2 = two
    body = {"model": "main", "messages": [{"role": "user", "content": "[[words:400]] [[tick:25]]"}], "stream": True}
    async with p1.async_http() as http, ws_client(p2.server, p2.keys["alice"]) as ws:
        async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
            run_id, key = answer.headers["x-agentgate-run-id"], answer.headers["x-agentgate-session-key"]
            lines: list[str] = []
            reading = answer.aiter_lines()
            async for line in reading:
                lines.append(line)
                if "word3" in line:
                    break
            aborted_at = time.monotonic()
            assert await ws.ok("chat.abort", {"sessionKey": key, "runId": run_id}) == {
                "aborted": True,
                "runIds": [run_id],
            }
            lines += [line async for line in reading]
        ended_after = time.monotonic() - aborted_at
    data = sse_data("\n".join(lines))
    assert data[-1] == "[DONE]"
    error = data[-2]["error"]
    assert (error["code"], error["stopReason"]) == ("run_aborted", "rpc"), error
    assert not any(d["choices"][0]["finish_reason"] for d in data[:-2])  # no finish_reason: the error is the end
    streamed = text_of(data)
    assert words(400).startswith(streamed) and streamed != words(400)
    assert ended_after < 5, ended_after  # the abort reached process 1 (at worst its 1 s poll of the run)
    ((state, stop_reason, reply),) = c.query(
        "select state, stop_reason, reply from sessions_app_run where run_id = %s", run_id
    )
    assert (state, stop_reason) == ("killed", "rpc") and reply.startswith(streamed)
    assert [d for d in data if isinstance(d, dict) and "error" in d] == [data[-2]]  # one end, once
