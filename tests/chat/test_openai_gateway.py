"""The `openai` backend through the WebSocket gateway, against the fake server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async

from sessions_app.models import Run
from tests.support.communicator import Client
from tests.support.db import send_params
from tests.support.fake_openai import Reply, closed_port_url

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "agent:llm:chat"


async def get_run(run_id: str) -> Run:
    return await database_sync_to_async(Run.objects.get)(run_id=run_id, session__key=KEY)


async def cancel_ms_of(run_id: str, timeout: float = 2.0) -> int | None:
    """Run.cancel_ms, which is written just after the run's task ends."""
    deadline = time.monotonic() + timeout
    while True:
        run = await get_run(run_id)
        if run.cancel_ms is not None or time.monotonic() > deadline:
            return run.cancel_ms
        await asyncio.sleep(0.05)


async def send(client: Client, key: str, message: str, **params: Any) -> dict[str, Any]:
    return await client.ok("chat.send", send_params(KEY, message, key, **params))


async def first_delta(client: Client, run_id: str) -> dict[str, Any]:
    ev = await client.wait_event(
        lambda e: e["event"] == "chat" and e["payload"]["runId"] == run_id and e["payload"]["state"] == "delta"
    )
    return ev["payload"]


# --- the conversation -------------------------------------------------------------------------------


async def test_streams_a_reply_and_the_next_message_carries_the_first_exchange(client, fake, use_agent):
    use_agent(system_prompt="You are terse.")
    fake.push(Reply(chunks=["Hi", " Alice", "!"], tick=0.06, usage={"prompt_tokens": 12, "completion_tokens": 3}))
    ack = await send(client, "k1", "hello")
    assert ack["status"] == "started" and ack["sessionKey"] == KEY
    final = await client.wait_terminal("k1")
    assert final["state"] == "final" and final["stopReason"] == "stop"
    assert final["message"]["content"][0]["text"] == "Hi Alice!"
    deltas = [e for e in client.chat_events("k1") if e["state"] == "delta"]
    assert deltas and deltas[-1]["message"]["content"][0]["text"] == "Hi Alice!"
    run = await get_run("k1")
    assert (run.state, run.reply, run.prompt_tokens, run.completion_tokens) == ("done", "Hi Alice!", 12, 3)

    fake.push(Reply(chunks=["Still", " here"]))
    await send(client, "k2", "are you there?")
    assert (await client.wait_terminal("k2"))["message"]["content"][0]["text"] == "Still here"
    assert fake.requests[1].messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi Alice!"},
        {"role": "user", "content": "are you there?"},
    ]


async def test_reset_starts_a_fresh_conversation(client, fake, use_agent):
    await send(client, "k1", "remember me")
    await client.wait_terminal("k1")
    await client.ok("sessions.reset", {"sessionKey": KEY})
    await send(client, "k2", "who am I?")
    await client.wait_terminal("k2")
    assert fake.requests[1].messages == [{"role": "user", "content": "who am I?"}]


async def test_length_stop_is_a_final_with_the_models_reason(client, fake, use_agent):
    fake.push(Reply(chunks=["one", " two"], finish_reason="length"))
    await send(client, "k1", "count")
    final = await client.wait_terminal("k1")
    assert final["state"] == "final" and final["stopReason"] == "length"
    assert final["message"]["content"][0]["text"] == "one two"


# --- stopping a run closes the model's connection -------------------------------------------------


async def test_abort_closes_the_connection_records_cancel_time_and_keeps_the_partial_reply(client, fake, use_agent):
    fake.push(Reply(chunks=["Partial", " answer"], stall_after=1))
    await send(client, "k1", "tell me a story")
    await first_delta(client, "k1")
    aborted_at = time.monotonic()
    assert (await client.ok("chat.abort", {"sessionKey": KEY, "runId": "k1"}))["aborted"] is True
    terminal = await client.wait_terminal("k1")
    assert terminal["state"] == "aborted" and terminal["stopReason"] == "rpc"
    req = fake.requests[0]
    await asyncio.wait_for(req.disconnected.wait(), 1)
    assert req.disconnected_at is not None and req.disconnected_at - aborted_at < 1
    assert not req.completed
    cancel_ms = await cancel_ms_of("k1")
    assert cancel_ms is not None and 0 <= cancel_ms < 1000

    await send(client, "k2", "go on")
    await client.wait_terminal("k2")
    assert fake.requests[1].messages == [
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "Partial"},  # as it was shown before the abort
        {"role": "user", "content": "go on"},
    ]


async def test_abort_during_dispatch_closes_the_connection(client, fake, use_agent):
    fake.push(Reply(headers_delay=30))
    await send(client, "k1", "hello")
    req = await fake.wait_request()
    await client.ok("chat.abort", {"sessionKey": KEY, "runId": "k1"})
    assert (await client.wait_terminal("k1"))["state"] == "aborted"
    await asyncio.wait_for(req.disconnected.wait(), 1)
    assert await cancel_ms_of("k1") is not None


@pytest.mark.parametrize("how", ["interrupt", "reset", "delete", "stop"])
async def test_every_way_of_stopping_a_run_closes_the_connection(client, fake, use_agent, how):
    fake.push(Reply(chunks=["Working", " on it"], stall_after=1))
    await send(client, "k1", "long job")
    await first_delta(client, "k1")
    stopped_at = time.monotonic()
    if how == "interrupt":
        await send(client, "k2", "never mind", queueMode="interrupt")
    elif how == "reset":
        await client.ok("sessions.reset", {"sessionKey": KEY})
    elif how == "delete":
        await client.ok("sessions.delete", {"sessionKey": KEY})
    else:
        await send(client, "k2", "/stop")
    terminal = await client.wait_terminal("k1")
    assert terminal["state"] == "aborted"
    assert terminal["stopReason"] == how
    req = fake.requests[0]
    await asyncio.wait_for(req.disconnected.wait(), 1)
    assert req.disconnected_at is not None and req.disconnected_at - stopped_at < 1
    if how == "interrupt":  # (a steer no longer stops a run: tests/chat/test_steering.py)
        assert (await client.wait_terminal("k2"))["state"] == "final"
        assert fake.requests[1].messages[-2:] == [
            {"role": "assistant", "content": "Working"},
            {"role": "user", "content": "never mind"},
        ]


# --- timeouts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "agent", "reply", "send_params", "expected"),
    [
        (
            "first token",
            {"first_token_timeout_ms": 300},
            Reply(first_delay=30),
            {},
            "no first token from the model within 300 ms (first_token_timeout_ms)",
        ),
        (
            "idle",
            {"idle_timeout_ms": 300},
            Reply(chunks=["Hmm", "..."], stall_after=1),
            {},
            "the model sent nothing for 300 ms after its last token (idle_timeout_ms)",
        ),
        (
            "run budget",
            {"idle_timeout_ms": 5000},
            Reply(chunks=["word "] * 100, tick=0.05),
            {"timeoutMs": 1000},
            "run exceeded its budget of 1000 ms (timeoutMs)",
        ),
    ],
)
async def test_each_timeout_ends_the_run_as_timeout_with_its_own_message(
    client, fake, use_agent, which, agent, reply, send_params, expected
):
    use_agent(**agent)
    fake.push(reply)
    await send(client, "k1", "hello", **send_params)
    terminal = await client.wait_terminal("k1", timeout=5)
    assert terminal["state"] == "error"
    assert terminal["errorKind"] == "timeout"
    assert terminal["errorMessage"] == expected
    run = await get_run("k1")
    assert (run.state, run.error_kind, run.error_message) == ("timeout", "timeout", expected)
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)
    assert await cancel_ms_of("k1") is not None
    rows = await client.ok("sessions.list", {})
    row = next(r for r in rows["sessions"] if r["key"] == KEY)
    assert row["status"] == "timeout" and row["lastRunError"] == expected and row["hasActiveRun"] is False
    if which != "first token":
        assert run.reply.startswith("Hmm" if which == "idle" else "word")  # the partial text is kept


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replies", "kind", "words"),
    [
        (
            [Reply(status=429, headers={"retry-after": "0.05"}, error={"message": "Rate limit reached"})] * 3,
            "rate_limit",
            "retry-after 50 ms",
        ),
        (
            [
                Reply(
                    status=400,
                    error={
                        "message": "This model's maximum context length is 4096 tokens",
                        "code": "context_length_exceeded",
                    },
                )
            ],
            "context_length",
            "maximum context length is 4096 tokens",
        ),
        ([Reply(status=500, error={"message": "CUDA out of memory"})] * 3, "backend", "HTTP 500: CUDA out of memory"),
        ([Reply(chunks=["Half", " a", " reply"], drop_after=1)], "backend", "closed the connection"),
    ],
    ids=["429", "context-length", "5xx", "cut-mid-reply"],
)
async def test_errors_map_to_error_kinds(client, fake, use_agent, replies, kind, words):
    fake.push(*replies)
    await send(client, "k1", "hello")
    terminal = await client.wait_terminal("k1")
    assert terminal["state"] == "error" and terminal["errorKind"] == kind
    assert words in terminal["errorMessage"]
    run = await get_run("k1")
    assert run.state == "failed" and run.error_kind == kind and words in run.error_message
    assert len(fake.requests) == len(replies)


async def test_429_then_success_is_invisible_to_the_client(client, fake, use_agent):
    fake.push(Reply(status=429, headers={"retry-after": "0.1"}), Reply(status=503), Reply(chunks=["ok"]))
    await send(client, "k1", "hello")
    final = await client.wait_terminal("k1")
    assert final["state"] == "final" and final["message"]["content"][0]["text"] == "ok"
    assert len(fake.requests) == 3


# --- dispatch failures --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cause", ["connection-refused", "bad-key", "unknown-model"])
async def test_unreachable_or_refusing_model_is_a_dispatch_failure(client, fake, use_agent, cause):
    if cause == "connection-refused":
        use_agent(base_url=closed_port_url(), retry_backoff_ms=5)
    else:
        fake.push(Reply(status=401 if cause == "bad-key" else 404, error={"message": "no"}))
    ack = await send(client, "k1", "hello")
    assert ack["status"] == "started"
    terminal = await client.wait_terminal("k1")
    assert terminal["state"] == "error" and terminal["errorKind"] == "dispatch"
    changed = await client.wait_event(
        lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "chat.dispatch-error"
    )
    row = changed["payload"]["session"]
    assert row["status"] == "failed" and row["hasActiveRun"] is False
    assert row["lastRunError"] == terminal["errorMessage"]
    listed = next(r for r in (await client.ok("sessions.list", {}))["sessions"] if r["key"] == KEY)
    assert listed["status"] == "failed" and listed["hasActiveRun"] is False
    run = await get_run("k1")
    assert run.state == "failed" and run.error_kind == "dispatch" and run.started_at is None


async def test_a_missing_api_key_fails_before_the_ack(client, use_agent, monkeypatch):
    monkeypatch.delenv("AGENTGATE_TEST_MISSING_KEY", raising=False)
    use_agent(api_key_env="AGENTGATE_TEST_MISSING_KEY")
    res = await client.call("chat.send", {"sessionKey": KEY, "message": "hello", "idempotencyKey": "k1"})
    assert res["ok"] is False and res["payload"]["status"] == "error"
    assert "AGENTGATE_TEST_MISSING_KEY is not set" in res["payload"]["summary"]
