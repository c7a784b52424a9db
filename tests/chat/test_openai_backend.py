"""The `openai` backend on its own, against the fake server: streaming, errors, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from chat.runtime.backends import BackendError, BackendTimeout, DispatchError, RunContext
from chat.runtime.backends.openai import OpenAIBackend
from tests.support.fake_openai import FakeOpenAI, Reply, agent_config, closed_port_url


def make_ctx(message: str = "hi", history: list[dict[str, Any]] | None = None, **kwargs: Any) -> RunContext:
    """A context whose transcript ends with this run's own user message, as the manager builds it."""
    transcript = [*(history or []), {"role": "user", "text": message, "aborted": False, "run": 7}]
    values: dict[str, Any] = dict(
        run_pk=7,
        run_id="r7",
        session_key="agent:llm:t",
        session_id="gen",
        agent_id="llm",
        agent={},
        message=message,
        transcript=transcript,
        timeout_ms=60_000,
    )
    values.update(kwargs)
    return RunContext(**values)


async def run_backend(backend: OpenAIBackend, ctx: RunContext) -> list[str]:
    stream = await backend.start(ctx)
    return [chunk async for chunk in stream]


async def run_until_error(backend: OpenAIBackend, ctx: RunContext) -> tuple[list[str], BaseException]:
    """Run and return (chunks received, the exception that ended it)."""
    got: list[str] = []
    try:
        stream = await backend.start(ctx)
        async for chunk in stream:
            got.append(chunk)
    except Exception as exc:
        return got, exc
    raise AssertionError(f"the run did not fail; got {got}")


# --- the request ---------------------------------------------------------------------------------


async def test_streams_text_usage_and_sends_the_configured_request(fake: FakeOpenAI, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test-123")
    fake.push(Reply(chunks=["Hel", "lo", " world"], usage={"prompt_tokens": 11, "completion_tokens": 3}))
    backend = OpenAIBackend(
        "llm",
        agent_config(
            fake,
            api_key_env="FAKE_KEY",
            system_prompt="Be brief.",
            temperature=0.2,
            max_tokens=64,
            extra_body={"keep_alive": "5m"},
        ),
    )
    ctx = make_ctx(
        "hi there",
        history=[
            {"role": "user", "text": "earlier", "aborted": False, "run": 1},
            {"role": "assistant", "text": "earlier reply", "aborted": False, "run": 1},
        ],
    )
    assert await run_backend(backend, ctx) == ["Hel", "lo", " world"]
    assert ctx.stop_reason == "stop"
    assert ctx.usage == {"prompt_tokens": 11, "completion_tokens": 3}
    req = fake.requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-123"
    assert req.body["model"] == "fake-model"
    assert req.body["stream"] is True
    assert req.body["stream_options"] == {"include_usage": True}
    assert req.body["temperature"] == 0.2
    assert req.body["max_tokens"] == 64
    assert req.body["keep_alive"] == "5m"
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "earlier reply"},
        {"role": "user", "content": "hi there"},
    ]
    assert req.completed


async def test_usage_is_optional_and_can_be_switched_off(fake: FakeOpenAI):
    backend = OpenAIBackend("llm", agent_config(fake, stream_usage=False))
    ctx = make_ctx()
    assert "".join(await run_backend(backend, ctx)) == "Hello there!"
    assert ctx.usage is None
    assert "stream_options" not in fake.requests[0].body
    assert fake.requests[0].headers["authorization"] == "Bearer not-needed"  # local servers want any key


def test_check_setup_refuses_what_cannot_work(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    backend = OpenAIBackend("llm", {"backend": "openai", "model": "m", "api_key_env": "NO_SUCH_KEY_VAR"})
    assert "NO_SUCH_KEY_VAR is not set" in (backend.check_setup("hi", []) or "")
    assert "no model" in (OpenAIBackend("llm", {"backend": "openai"}).check_setup("hi", []) or "")
    bad = OpenAIBackend("llm", {"backend": "openai", "model": "m", "idle_timeout_ms": "soon"})
    assert "idle_timeout_ms" in (bad.check_setup("hi", []) or "")
    not_a_flag = OpenAIBackend("llm", {"backend": "openai", "model": "m", "stream_usage": "no"})
    assert "stream_usage must be true or false" in (not_a_flag.check_setup("hi", []) or "")
    no_scheme = OpenAIBackend("llm", {"backend": "openai", "model": "m", "base_url": "localhost:11434/v1"})
    assert "base_url must be an http:// or https:// URL" in (no_scheme.check_setup("hi", []) or "")
    ok = OpenAIBackend("llm", {"backend": "openai", "model": "m"})
    assert ok.check_setup("hi", [{"mimeType": "text/plain", "fileName": None, "text": "x"}]) is None
    assert "not marked `vision: true`" in (ok.check_setup("hi", [{"mimeType": "image/png", "text": None}]) or "")
    seeing = OpenAIBackend("llm", {"backend": "openai", "model": "m", "vision": True})
    assert seeing.check_setup("hi", [{"mimeType": "image/png", "text": None}]) is None


# --- finish reasons are not errors ----------------------------------------------------------------


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_length_and_content_filter_stops_end_the_run_normally(fake: FakeOpenAI, reason: str):
    fake.push(Reply(chunks=["cut", " short"], finish_reason=reason))
    ctx = make_ctx()
    assert await run_backend(OpenAIBackend("llm", agent_config(fake)), ctx) == ["cut", " short"]
    assert ctx.stop_reason == reason


async def test_a_refusal_is_the_reply(fake: FakeOpenAI):
    fake.push(Reply(chunks=[], refusal="I can't help with that."))
    ctx = make_ctx()
    assert "".join(await run_backend(OpenAIBackend("llm", agent_config(fake)), ctx)) == "I can't help with that."
    assert ctx.stop_reason == "stop"


async def test_a_server_that_keeps_the_stream_open_after_finishing_does_not_time_out(fake: FakeOpenAI):
    fake.push(Reply(done=False, hang_after_done=True))
    ctx = make_ctx()
    started = time.monotonic()
    chunks = await run_backend(OpenAIBackend("llm", agent_config(fake, idle_timeout_ms=300)), ctx)
    assert "".join(chunks) == "Hello there!" and ctx.stop_reason == "stop"
    assert time.monotonic() - started < 1.5
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)


# --- timeouts -------------------------------------------------------------------------------------


async def test_first_token_timeout_after_headers(fake: FakeOpenAI):
    fake.push(Reply(first_delay=30))
    backend = OpenAIBackend("llm", agent_config(fake, first_token_timeout_ms=300))
    started = time.monotonic()
    got, exc = await run_until_error(backend, make_ctx())
    assert got == []
    assert isinstance(exc, BackendTimeout) and exc.kind == "timeout"
    assert exc.message == "no first token from the model within 300 ms (first_token_timeout_ms)"
    assert 0.25 < time.monotonic() - started < 1.5
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)  # closed, not left generating
    assert len(fake.requests) == 1  # a slow model is not hammered with retries


async def test_first_token_timeout_while_waiting_for_headers(fake: FakeOpenAI):
    fake.push(Reply(headers_delay=30))
    backend = OpenAIBackend("llm", agent_config(fake, first_token_timeout_ms=300))
    with pytest.raises(BackendTimeout, match=r"first_token_timeout_ms"):
        await backend.start(make_ctx())
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)


async def test_reasoning_tokens_keep_the_first_token_timer_happy(fake: FakeOpenAI):
    """A thinking model streams `reasoning_content` first; that is not a stall."""

    # 0.5 s of thinking before the answer, against a 0.4 s first-token timeout.
    fake.push(Reply(reasoning=["Let", " me", " think", " it", " over."], chunks=["answer"], tick=0.1))
    backend = OpenAIBackend("llm", agent_config(fake, first_token_timeout_ms=400, idle_timeout_ms=400))
    assert await run_backend(backend, make_ctx()) == ["answer"]  # thinking is not part of the reply


async def test_idle_timeout_between_tokens(fake: FakeOpenAI):
    fake.push(Reply(chunks=["one", " two", " three"], stall_after=2))
    backend = OpenAIBackend("llm", agent_config(fake, idle_timeout_ms=300))
    got, exc = await run_until_error(backend, make_ctx())
    assert got == ["one", " two"]
    assert isinstance(exc, BackendTimeout)
    assert exc.message == "the model sent nothing for 300 ms after its last token (idle_timeout_ms)"
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)
    assert len(fake.requests) == 1


async def test_slow_but_steady_stream_is_not_idle(fake: FakeOpenAI):
    # 0.6 s in all, against a 0.4 s idle timeout: only the gaps count.
    fake.push(Reply(chunks=["a", "b", "c", "d", "e", "f", "g"], tick=0.1))
    backend = OpenAIBackend("llm", agent_config(fake, idle_timeout_ms=400, first_token_timeout_ms=400))
    assert "".join(await run_backend(backend, make_ctx())) == "abcdefg"


# --- errors and retries ---------------------------------------------------------------------------


async def test_429_is_retried_after_the_servers_retry_after(fake: FakeOpenAI):
    fake.push(Reply(status=429, headers={"retry-after": "0.3"}, error={"message": "slow down"}), Reply())
    backend = OpenAIBackend("llm", agent_config(fake))
    assert "".join(await run_backend(backend, make_ctx())) == "Hello there!"
    assert len(fake.requests) == 2
    assert fake.requests[1].received_at - fake.requests[0].received_at >= 0.3


async def test_429_after_two_retries_fails_as_rate_limit_with_retry_after(fake: FakeOpenAI):
    limited = Reply(status=429, headers={"retry-after": "0.05"}, error={"message": "Rate limit reached"})
    fake.push(limited, limited, limited, Reply())
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "rate_limit"
    assert "retry-after 50 ms" in exc.message and "Rate limit reached" in exc.message
    assert len(fake.requests) == 3  # the first attempt and at most two retries


async def test_429_asking_for_a_long_wait_fails_at_once(fake: FakeOpenAI):
    fake.push(Reply(status=429, headers={"retry-after": "120"}))
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "rate_limit"
    assert "retry-after 120 s" in exc.message
    assert len(fake.requests) == 1


async def test_429_retry_after_as_an_http_date(fake: FakeOpenAI):
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    fake.push(Reply(status=429, headers={"retry-after": when}))
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "rate_limit"
    assert re.search(r"retry-after 1(19|20)(\.\d)? s", exc.message), exc.message
    assert len(fake.requests) == 1  # longer than max_retry_wait_ms: not waited out


async def test_5xx_is_retried_with_backoff_then_fails_as_backend(fake: FakeOpenAI):
    fake.push(Reply(status=503), Reply())
    assert "".join(await run_backend(OpenAIBackend("llm", agent_config(fake)), make_ctx())) == "Hello there!"
    fake.requests.clear()
    fake.push(*[Reply(status=500, error={"message": "boom"})] * 3)
    backend = OpenAIBackend("llm", agent_config(fake, retry_backoff_ms=100))
    _got, exc = await run_until_error(backend, make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "backend"
    assert exc.message == "the model server failed: HTTP 500: boom"
    times = [r.received_at for r in fake.requests]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.1 and times[2] - times[1] >= 0.2  # exponential backoff


async def test_max_retries_zero_means_one_attempt(fake: FakeOpenAI):
    fake.push(Reply(status=502), Reply())
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake, max_retries=0)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "backend"
    assert len(fake.requests) == 1


async def test_context_length_errors(fake: FakeOpenAI):
    fake.push(
        Reply(
            status=400,
            error={
                "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            },
        )
    )
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "context_length"
    assert "maximum context length is 8192 tokens" in exc.message
    # llama.cpp words it differently, and may say it inside the stream.
    fake.push(
        Reply(
            chunks=[],
            stream_error={
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "code": 400,
            },
        )
    )
    _got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert isinstance(exc, BackendError) and exc.kind == "context_length"
    assert len(fake.requests) == 2  # neither was retried


async def test_no_retry_once_text_was_streamed(fake: FakeOpenAI):
    fake.push(Reply(chunks=["partial", " answer", " more"], drop_after=2), Reply())
    got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert got == ["partial", " answer"]
    assert isinstance(exc, BackendError) and exc.kind == "backend"
    assert "closed the connection" in exc.message
    assert len(fake.requests) == 1


async def test_a_stream_cut_before_the_first_token_is_retried(fake: FakeOpenAI):
    fake.push(Reply(drop_after=0), Reply(chunks=[], stream_error={"message": "overloaded"}), Reply())
    ctx = make_ctx()
    assert "".join(await run_backend(OpenAIBackend("llm", agent_config(fake)), ctx)) == "Hello there!"
    assert len(fake.requests) == 3
    assert all(r.body == fake.requests[0].body for r in fake.requests)


async def test_a_stream_without_a_finish_reason_is_not_a_clean_end(fake: FakeOpenAI):
    fake.push(Reply(chunks=["half"], finish_reason=None, done=False))
    got, exc = await run_until_error(OpenAIBackend("llm", agent_config(fake)), make_ctx())
    assert got == ["half"] and isinstance(exc, BackendError) and exc.kind == "backend"


# --- dispatch failures ----------------------------------------------------------------------------


async def test_connection_refused_is_a_dispatch_failure():
    backend = OpenAIBackend(
        "llm", {"backend": "openai", "model": "m", "base_url": closed_port_url(), "retry_backoff_ms": 10}
    )
    with pytest.raises(DispatchError, match=r"cannot reach the model server of agent 'llm' \(connection refused\)"):
        await backend.start(make_ctx())


@pytest.mark.parametrize(("status", "words"), [(401, "rejected the API key"), (404, "does not know the model")])
async def test_bad_key_and_unknown_model_are_dispatch_failures(fake: FakeOpenAI, status: int, words: str):
    fake.push(Reply(status=status, error={"message": "nope"}))
    with pytest.raises(DispatchError, match=words):
        await OpenAIBackend("llm", agent_config(fake)).start(make_ctx())
    assert len(fake.requests) == 1


# --- cancellation ---------------------------------------------------------------------------------


async def test_cancelling_a_streaming_run_closes_the_connection(fake: FakeOpenAI):
    fake.push(Reply(chunks=["a", "b"], stall_after=1))
    backend = OpenAIBackend("llm", agent_config(fake, idle_timeout_ms=30_000))
    got: list[str] = []

    async def consume() -> None:
        stream = await backend.start(make_ctx())
        try:
            async for chunk in stream:
                got.append(chunk)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    task = asyncio.ensure_future(consume())
    while not got:
        await asyncio.sleep(0.01)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    req = fake.requests[0]
    await asyncio.wait_for(req.disconnected.wait(), 1)
    assert req.disconnected_at is not None and req.disconnected_at - cancelled_at < 1
    assert not req.completed


async def test_cancelling_while_waiting_for_headers_closes_the_connection(fake: FakeOpenAI):
    fake.push(Reply(headers_delay=30))
    task = asyncio.ensure_future(OpenAIBackend("llm", agent_config(fake)).start(make_ctx()))
    await fake.wait_request()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)


async def test_closing_a_stream_that_was_never_read_closes_the_connection(fake: FakeOpenAI):
    """An abort can win between dispatch and the first read: the manager then only closes the stream."""
    fake.push(Reply(first_delay=30))
    stream = await OpenAIBackend("llm", agent_config(fake)).start(make_ctx())
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)


async def test_a_run_task_that_ends_without_closing_still_closes_the_connection(fake: FakeOpenAI):
    fake.push(Reply(first_delay=30))
    backend = OpenAIBackend("llm", agent_config(fake))

    async def dispatch_only() -> None:
        await backend.start(make_ctx())  # the stream is dropped, as on a cancel right after dispatch

    await asyncio.ensure_future(dispatch_only())
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 1)
