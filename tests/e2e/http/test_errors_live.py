"""The HTTP API's errors and limits against a real server (HTTP-API.md §14.1, §14.4): OpenAI's shape and
statuses, bad input changes nothing, bodies bounded in size and time at the transport, the rate per
key, CORS for the configured origins only, and the requests counted in /metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.http.support import Gateway, start_gateway

pytestmark = pytest.mark.server

MAX_BODY = 65536
KEYS = {"alice": ("alice", None), "reader": ("rita", ["read"]), "hasty": ("hank", None)}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("errors"),
        keys=KEYS,
        GATEWAY_HTTP_MAX_BODY=str(MAX_BODY),
        GATEWAY_HTTP_BODY_TIMEOUT_SECONDS="1",
        GATEWAY_HTTP_CORS_ORIGINS="http://app.example",
        GATEWAY_RATE_PER_SEC="50",
        GATEWAY_RATE_BURST="20",
    )
    yield gateway
    gateway.stop()


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "main", "messages": [{"role": "user", "content": "hi"}], **fields}


def error_of(answer: Any) -> dict[str, Any]:
    error: dict[str, Any] = answer.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


def test_keys_401_and_scopes_403(gw: Gateway) -> None:
    with gw.http(None) as anonymous:
        missing = anonymous.get("/v1/models")
        wrong = anonymous.get("/v1/models", headers={"authorization": "Bearer agt_not-a-key"})
        basic = anonymous.get("/v1/models", headers={"authorization": "Basic YWxpY2U6eA=="})
    for answer in (missing, wrong, basic):
        assert answer.status_code == 401 and error_of(answer)["type"] == "authentication_error"
        assert answer.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="agt_nobody", max_retries=0).models.list()
    reader = gw.sdk("reader")
    assert [m.id for m in reader.models.list().data] == ["main"]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        reader.chat.completions.create(model="main", messages=[{"role": "user", "content": "x"}])
    assert denied.value.body["type"] == "permission_error"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": "high"}, "top_p"),
        ({"n": 2}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": []}, "reasoning_effort"),
        ({"reasoning_effort": {}}, "reasoning_effort"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": 0}}]},
            "tools[0].function.description",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": 0}, {"role": "user", "content": "x"}]},
            "messages[0].tool_calls",
        ),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages[0].role"),
        ({"model": None}, "model"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
                ]
            },
            "messages[0].content[0].image_url",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0]"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(gw: Gateway, fields: dict[str, Any], param: str) -> None:
    with gw.http() as http:
        answer = http.post("/v1/chat/completions", json=chat(**fields))
    assert answer.status_code == 400, answer.text
    error = error_of(answer)
    assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_bad_input_changes_nothing_and_unknown_fields_are_ignored(gw: Gateway) -> None:
    async with gw.ws() as ws:
        before = (await ws.ok("sessions.list", {"kinds": ["direct", "api"]}))["totalCount"]
        with gw.http() as http:
            assert http.post("/v1/chat/completions", content=b"{not json").status_code == 400
            assert http.post("/v1/chat/completions", json=[1, 2]).status_code == 400
            assert http.post("/v1/chat/completions", json=chat(temperature=-1)).status_code == 400
            named = http.post("/v1/chat/completions", json=chat(n=3), headers={"x-agentgate-session-key": "kept-out"})
            assert named.status_code == 400
        assert (await ws.ok("sessions.list", {"kinds": ["direct", "api"]}))["totalCount"] == before
    with gw.http() as http:
        fine = http.post("/v1/chat/completions", json=chat(frobnicate=True, logit_bias={"1": 2}, n=1))
    assert fine.status_code == 200 and fine.json()["choices"][0]["message"]["content"] == "echo: hi"


def test_unknown_path_404_and_wrong_method_405(gw: Gateway) -> None:
    with gw.http() as http:
        unknown = http.get("/v1/engines")
        wrong = http.get("/v1/chat/completions")
        put = http.put("/v1/models", json={})
    assert unknown.status_code == 404 and error_of(unknown)["type"] == "not_found_error"
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert put.status_code == 405 and put.headers["allow"] == "GET"


def test_a_body_over_the_bound_is_a_413(gw: Gateway) -> None:
    big = json.dumps(chat(padding="x" * MAX_BODY)).encode()
    with gw.http() as http:
        declared = http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        chunked = http.post("/v1/chat/completions", content=iter([big[:40000], big[40000:]]))
    for answer in (declared, chunked):
        assert answer.status_code == 413 and error_of(answer)["code"] == "request_too_large"
    with gw.http() as http:
        assert http.get("/v1/models").status_code == 200  # the server is fine


def test_a_slow_body_is_dropped_with_a_408(gw: Gateway) -> None:
    body = json.dumps(chat()).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.keys['alice']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=5) as sock:
        sock.sendall(head + body[:10])
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_timeout"
    assert 0.9 < time.monotonic() - started < 3


async def test_the_rate_per_key_is_a_429_with_retry_after(gw: Gateway) -> None:
    async with gw.async_http("hasty") as hasty, gw.async_http("alice") as other:
        answers = await asyncio.gather(*(hasty.get("/v1/models") for _ in range(80)))
        assert (await other.get("/v1/models")).status_code == 200  # another key has its own rate
    limited = [a for a in answers if a.status_code == 429]
    assert limited and sum(a.status_code == 200 for a in answers) >= 20
    assert int(limited[0].headers["retry-after"]) >= 1
    assert error_of(limited[0])["type"] == "rate_limit_error"


def test_cors_only_for_the_configured_origins(gw: Gateway) -> None:
    preflight = {"origin": "http://app.example", "access-control-request-method": "POST"}
    with gw.http(None) as http:
        allowed = http.options("/v1/chat/completions", headers=preflight)
        refused = http.options("/v1/chat/completions", headers={**preflight, "origin": "http://evil.example"})
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert "authorization" in allowed.headers["access-control-allow-headers"]
    assert "access-control-allow-origin" not in refused.headers
    with gw.http() as http:
        mine = http.get("/v1/models", headers={"origin": "http://app.example"})
        theirs = http.get("/v1/models", headers={"origin": "http://evil.example"})
    assert mine.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-agentgate-run-id" in mine.headers["access-control-expose-headers"]
    assert "access-control-allow-origin" not in theirs.headers


def test_requests_are_counted_by_route_and_status(gw: Gateway) -> None:
    with gw.http() as http:
        http.post("/v1/chat/completions", json=chat())
        http.get("/v1/models/nobody")
    status, text = gw.server.get("/metrics")
    assert status == 200
    assert 'agentgate_http_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert 'agentgate_http_requests_total{route="/v1/models/{model_id}",status="404"}' in text
    assert 'agentgate_runs_ended_total{agent="main",error_kind="",state="done",surface="http"}' in text
    assert 'agentgate_runs_started_total{agent="main",surface="http"}' in text
