"""The `openai` backend: streaming chat completions from any OpenAI-compatible server.

Works with OpenAI itself and with the local servers that speak its API (Ollama,
vLLM, llama.cpp's server, LM Studio). Configuration, timeouts, retries and error
mapping are described in docs/agents.md.

Phases, as the run manager sees them:

- `start()` is the dispatch phase: it opens the streaming request and returns once
  the server has answered with its headers. Failing to reach the server at all,
  a rejected key, an unknown model or a refused request raise `DispatchError`.
- The returned stream yields the reply's text. Before its first token a failed
  attempt may be retried; once text has been shown it never is.

With tools (TOOLS.md §13, an agent with `mcp_servers`), a run is a loop of steps, one
request each: a step that ends with tool calls has them carried out by the run's
`ToolHost`, and the next request sends the model its calls and their results. Text
of a later step is a new paragraph of the same reply. The loop ends when a step makes
no calls, or at a limit (stopReason `tool_limit`), without asking the model again.

Every way a run stops early (abort, interrupt, steer, reset, delete, any timeout)
reaches this code as a cancellation or a timeout, and every one of them closes the
HTTP connection, so the model server stops generating instead of finishing a
reply nobody reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import secrets
import socket
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import openai

from chat.runtime import catalog
from chat.runtime.backends.base import AgentBackend, BackendError, BackendTimeout, DispatchError, RunContext
from chat.runtime.tools.host import MAX_ARGUMENT_BYTES, ModelCall, ToolHost, ToolResult
from chat.runtime.tools.servers import MODEL_NAME_RE, ToolServerError
from sessions_app.models import TOOL_TERMINAL_STATES, ToolCallState

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local servers ignore the key but the SDK insists on one.
PLACEHOLDER_API_KEY = "not-needed"
CHARS_PER_TOKEN = 4  # the budget approximation: a token is about four characters of English
MAX_ERROR_DETAIL = 300
# Once the model has said why it stopped, only the usage chunk and [DONE] are still
# due; a server that then keeps the connection open must not turn a finished reply
# into an idle timeout.
AFTER_FINISH_GRACE_S = 2.0
# Text written after tool calls starts a new paragraph of the same reply.
PARAGRAPH = "\n\n"
# What one step may ask for: more calls are ignored, longer arguments are cut (the
# host then fails the call as too large) — a server must not make us hold unbounded text.
MAX_CALLS_PER_STEP = 128
MAX_ARGUMENT_CHARS = 2 * MAX_ARGUMENT_BYTES
MAX_CALL_ID = 128
RUN_ENDED_STATES = (ToolCallState.CANCELLED, ToolCallState.UNKNOWN)  # set only by the end of the call's run

# Providers word "prompt too long" differently: OpenAI and vLLM ("maximum context
# length"), llama.cpp ("exceeds the available context size"), others ("context window").
CONTEXT_LENGTH_RE = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|prompt is too long|too many tokens|"
    r"exceeds? the (available |maximum )?context",
    re.IGNORECASE,
)
CONTEXT_LENGTH_CODES = {"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"}
# A session's thinking level (OpenClaw's names) is sent as the request's `reasoning_effort`, under
# the same word but for these: OpenAI's API refuses "max" (it goes up to "xhigh"), and `off` sends
# none, since models that do not reason refuse the parameter (docs/agents.md).
REASONING_EFFORT_RENAMED: dict[str, str | None] = {"off": None, "max": "xhigh"}


def reasoning_effort(level: str) -> str | None:
    """The `reasoning_effort` a thinking level is sent as, or None for none."""
    return REASONING_EFFORT_RENAMED.get(level, level)


@dataclass(frozen=True)
class AgentSettings:
    """One agent's validated configuration (see docs/agents.md for each key)."""

    model: str
    base_url: str = DEFAULT_BASE_URL
    api_key_env: str | None = None
    system_prompt: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    context_chars: int = 32_000
    first_token_timeout_ms: int = 60_000
    idle_timeout_ms: int = 30_000
    connect_timeout_ms: int = 10_000
    max_retries: int = 2
    retry_backoff_ms: int = 500
    max_retry_wait_ms: int = 20_000
    stream_usage: bool = True
    extra_body: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, agent_id: str, config: dict[str, Any]) -> AgentSettings:
        """Validate `config`; raise ValueError with a message fit for the user."""
        where = f"agent {agent_id!r}"
        model = config.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{where} has no model configured")

        def number(key: str, default: int, minimum: int = 0) -> int:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                raise ValueError(f"{where}: {key} must be a number >= {minimum}")
            return int(value)

        def flag(key: str, default: bool) -> bool:
            value = config.get(key, default)
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {key} must be true or false")
            return value

        def optional_str(key: str) -> str | None:
            value = config.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}: {key} must be a string")
            return value or None

        budget = number("context_chars", cls.context_chars, 1)
        if "context_tokens" in config:
            by_tokens = number("context_tokens", 0, 1) * CHARS_PER_TOKEN
            budget = min(budget, by_tokens) if "context_chars" in config else by_tokens
        temperature = config.get("temperature")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, float | int)):
            raise ValueError(f"{where}: temperature must be a number")
        max_tokens = config.get("max_tokens")
        if max_tokens is not None:
            max_tokens = number("max_tokens", 1, 1)
        extra_body = config.get("extra_body")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ValueError(f"{where}: extra_body must be an object")
        problem = catalog.models_error(config) or catalog.thinking_error(config)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        base_url = optional_str("base_url") or DEFAULT_BASE_URL
        try:
            parts = urlsplit(base_url)
            _ = parts.port  # raises ValueError for a malformed or out-of-range port
            valid_url = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            valid_url = False
        if not valid_url:
            raise ValueError(f"{where}: base_url must be an http:// or https:// URL")
        return cls(
            model=model.strip(),
            base_url=base_url,
            api_key_env=optional_str("api_key_env"),
            system_prompt=optional_str("system_prompt") or "",
            temperature=float(temperature) if temperature is not None else None,
            max_tokens=max_tokens,
            context_chars=budget,
            first_token_timeout_ms=number("first_token_timeout_ms", cls.first_token_timeout_ms, 1),
            idle_timeout_ms=number("idle_timeout_ms", cls.idle_timeout_ms, 1),
            connect_timeout_ms=number("connect_timeout_ms", cls.connect_timeout_ms, 1),
            max_retries=number("max_retries", cls.max_retries),
            retry_backoff_ms=number("retry_backoff_ms", cls.retry_backoff_ms),
            max_retry_wait_ms=number("max_retry_wait_ms", cls.max_retry_wait_ms),
            stream_usage=flag("stream_usage", True),
            extra_body=extra_body,
        )

    def api_key(self, agent_id: str) -> str:
        """The key from the environment; raise ValueError when a named variable is unset."""
        if self.api_key_env is None:
            return PLACEHOLDER_API_KEY
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ValueError(f"agent {agent_id!r}: environment variable {self.api_key_env} is not set")
        return key


# --- the conversation ---------------------------------------------------------------------


def build_messages(ctx: RunContext, settings: AgentSettings) -> list[dict[str, Any]]:
    """The request's messages: system prompt plus the transcript, trimmed to the budget.

    `ctx.transcript` is the current generation oldest first and already holds this
    run's user message; anything stored after it (nothing, normally) is not part of
    this run's context. Aborted partial replies are sent as they were shown. Whole
    messages are dropped from the oldest end until the texts fit `context_chars`;
    the run's own message is always kept (an oversize one is the server's to refuse).
    An assistant message that called tools becomes its steps (`assistant_messages`),
    kept or dropped as one, so a tool message never loses the call it answers.
    """
    history: list[list[dict[str, Any]]] = []
    current: str | None = None
    for entry in ctx.transcript:
        role = entry.get("role")
        if role == "user" and entry.get("run") == ctx.run_pk:
            current = str(entry.get("text") or "")
            break
        if role == "user" and entry.get("text"):
            history.append([{"role": "user", "content": str(entry["text"])}])
        elif role == "assistant":
            group = assistant_messages(entry)
            if group:
                history.append(group)
    if current is None:  # transcript unavailable (e.g. a run of an older generation)
        current = ctx.message
    current = _with_attachments(current, ctx.attachments)

    budget = settings.context_chars - len(settings.system_prompt) - len(current)
    kept: list[list[dict[str, Any]]] = []
    for group in reversed(history):
        budget -= sum(_size(message) for message in group)
        if budget < 0:
            break
        kept.append(group)
    kept.reverse()
    system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    return [*system, *(message for group in kept for message in group), {"role": "user", "content": current}]


def assistant_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant transcript entry as the model's messages, its tool calls included (§13.4).

    In order: per step, the text written before its calls with the calls (named by their
    gateway ids), then one `tool` message per call; the text after the last step closes it.
    Only calls that reached their terminal state are sent, so every call sent has its
    result and the request stays valid (a call still open belongs to a run not yet ended).
    """
    text = str(entry.get("text") or "")
    calls = [c for c in entry.get("tools") or [] if c.get("status") in TOOL_TERMINAL_STATES and c.get("id")]
    if not calls:
        return [{"role": "assistant", "content": text}] if text else []
    steps: dict[int, list[dict[str, Any]]] = {}
    for c in calls:
        steps.setdefault(int(c.get("step") or 0), []).append(c)
    out: list[dict[str, Any]] = []
    pos = 0
    for step in sorted(steps):
        group = steps[step]
        offset = min(max(int(group[0].get("offset") or 0), pos), len(text))
        out.append(
            {
                "role": "assistant",
                "content": _text_between(text, pos, offset) or None,
                "tool_calls": [_tool_call(str(c["id"]), str(c.get("name") or ""), c.get("arguments")) for c in group],
            }
        )
        out.extend(
            {"role": "tool", "tool_call_id": str(c["id"]), "content": _result_text(c.get("result"), c.get("status"))}
            for c in group
        )
        pos = offset
    rest = _text_between(text, pos, len(text))
    if rest:
        out.append({"role": "assistant", "content": rest})
    return out


def _text_between(text: str, start: int, end: int) -> str:
    """The reply's text of one step, without the paragraph break the gateway put before it."""
    part = text[start:end]
    return part.removeprefix(PARAGRAPH) if start else part


def _tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A call as an assistant message carries it, in a form every server accepts back.

    Servers that render history through a chat template parse the arguments, and refuse
    the whole request (every later turn of the session, too) when a past call's arguments
    are not a JSON object: such a call is sent with `{}`; its result says what was wrong.
    The same goes for a function name outside OpenAI's rule.
    """
    args = arguments if isinstance(arguments, str) else ""
    try:
        valid = isinstance(json.loads(args), dict)
    except ValueError:
        valid = False
    if not MODEL_NAME_RE.fullmatch(name):
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "unknown_tool"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args if valid else "{}"}}


def _result_text(result: Any, status: Any) -> str:
    text = str(result or "")
    return text if text else f"(no output; the call ended {status})"


def _size(message: dict[str, Any]) -> int:
    """A message's characters for the context budget: its text, and its calls' names and arguments."""
    size = len(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        size += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return size


def _with_attachments(text: str, attachments: list[dict[str, Any]]) -> str:
    """Inline text attachments after the message (images are refused in check_setup)."""
    parts = [text] if text else []
    for item in attachments:
        if item.get("text") is not None:
            name = item.get("fileName") or "attachment"
            parts.append(f"[{name}]\n{item['text']}")
    return "\n\n".join(parts)


# --- errors -------------------------------------------------------------------------------------


@dataclass
class _Failure:
    """A classified failure of one attempt."""

    error: BackendError | DispatchError
    retryable: bool = False
    retry_after: float | None = None  # seconds, from the server


def _detail(exc: openai.APIError) -> str:
    """The server's own error message, short, without the SDK's 'Error code' prefix."""
    message = exc.message
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]
    message = " ".join(str(message).split())
    return message[:MAX_ERROR_DETAIL] + ("…" if len(message) > MAX_ERROR_DETAIL else "")


def _is_context_length(exc: openai.APIError) -> bool:
    return (
        (exc.code or "") in CONTEXT_LENGTH_CODES
        or (exc.type or "") in CONTEXT_LENGTH_CODES
        or bool(CONTEXT_LENGTH_RE.search(_detail(exc)))
    )


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """Seconds from `retry-after-ms`, or `retry-after` in seconds or as an HTTP date."""
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                continue
            seconds = max(0.0, seconds)
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _format_seconds(seconds: float) -> str:
    return f"{round(seconds, 1):g} s" if seconds >= 1 else f"{round(seconds * 1000)} ms"


def _connection_cause(exc: BaseException) -> tuple[str, bool]:
    """A short, address-free reason for a connection failure, and whether retrying may help."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused", True
        if isinstance(seen, socket.gaierror):
            return "host name not found", False
        if isinstance(seen, ConnectionResetError):
            return "connection reset", True
        if isinstance(seen, TimeoutError | openai.APITimeoutError):
            return "timed out", True
        if type(seen).__name__ == "RemoteProtocolError":
            return "the server closed the connection mid-response", True
        seen = seen.__cause__ or seen.__context__
    return "connection error", True


def _rate_limited(detail: str) -> BackendError:
    return BackendError(f"the model server is rate limiting requests: {detail}", "rate_limit")


def _too_long(detail: str) -> BackendError:
    return BackendError(f"the conversation is too long for the model: {detail}", "context_length")


def classify(exc: Exception, agent_id: str, *, before_start: bool) -> _Failure:
    """Map an SDK exception to the run's failure and say whether another attempt may help.

    `before_start`: still in the dispatch phase, where failing to reach the server,
    a bad key or an unknown model are dispatch failures (§8), not backend errors.
    """
    where = f"agent {agent_id!r}"
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _detail(exc)
        if status == 429:
            after = _retry_after(exc)
            hint = f" (retry-after {_format_seconds(after)})" if after is not None else ""
            return _Failure(_rate_limited(f"HTTP 429{hint}: {detail}"), retryable=True, retry_after=after)
        if _is_context_length(exc):
            return _Failure(_too_long(detail))
        if status >= 500 or status in (408, 409):
            return _Failure(BackendError(f"the model server failed: HTTP {status}: {detail}"), retryable=True)
        if status in (401, 403):
            text = f"the model server rejected the API key of {where}: HTTP {status}: {detail}"
        elif status == 404:
            text = f"the model server does not know the model of {where}: HTTP 404: {detail}"
        else:
            text = f"the model server refused the request of {where}: HTTP {status}: {detail}"
        return _Failure(DispatchError(text) if before_start else BackendError(text))
    if isinstance(exc, openai.APIConnectionError):
        cause, retryable = _connection_cause(exc)
        if before_start:
            return _Failure(DispatchError(f"cannot reach the model server of {where} ({cause})"), retryable)
        return _Failure(BackendError(f"the connection to the model server failed ({cause})"), retryable)
    if isinstance(exc, openai.APIError):  # an error event inside a 200 stream
        detail = _detail(exc)
        if _is_context_length(exc):
            return _Failure(_too_long(detail))
        if (exc.code or "") in ("429", "rate_limit_exceeded") or "rate limit" in detail.lower():
            return _Failure(_rate_limited(detail), retryable=True)
        return _Failure(BackendError(f"the model server reported an error: {detail}"), retryable=True)
    log.warning("unexpected error from the model server of %s: %r", where, exc)
    text = f"unexpected failure talking to the model server of {where}: {type(exc).__name__}"
    return _Failure(DispatchError(text) if before_start else BackendError(text))


# --- clients ------------------------------------------------------------------------------------

_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str, int], openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def _client_for(settings: AgentSettings, api_key: str) -> openai.AsyncOpenAI:
    """A client per event loop and endpoint, reused across runs.

    Building one blocks the loop for ~20 ms (TLS setup), and a shared pool keeps
    connections to a hosted API warm. Runs never share a connection at once, and a
    run stopped early closes its connection instead of returning it to the pool.
    """
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (settings.base_url, api_key, settings.connect_timeout_ms)
    client = clients.get(key)
    if client is None or client.is_closed():
        client = clients[key] = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=settings.base_url,
            # Retries and read timeouts are ours: the SDK's would retry after text was
            # shown and could not tell a slow first token from a stalled stream.
            max_retries=0,
            timeout=openai.Timeout(None, connect=settings.connect_timeout_ms / 1000),
        )
    return client


async def close_clients() -> None:
    """Close this event loop's cached clients and their idle pooled connections (shutdown, tests)."""
    clients = _CLIENTS.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        with contextlib.suppress(Exception):
            await client.close()


# --- the backend ------------------------------------------------------------------------------------


class OpenAIBackend(AgentBackend):
    """Streams chat completions from an OpenAI-compatible endpoint."""

    # The transcript read for a run: the newest messages that can fit `context_chars`
    # are then chosen by `build_messages`; this only bounds the read.
    context_messages = 1000

    def _settings(self) -> AgentSettings:
        return AgentSettings.from_config(self.agent_id, self.config)

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        try:
            self._settings().api_key(self.agent_id)
        except ValueError as exc:
            return str(exc)
        if any(item.get("text") is None for item in attachments):
            # Image bytes are not kept with the run, so they could not be sent: refuse
            # rather than silently answering without them.
            return f"agent {self.agent_id!r} accepts only text attachments"
        return None

    async def start(self, ctx: RunContext) -> AsyncIterator[str]:
        try:
            settings = self._settings()
            api_key = settings.api_key(self.agent_id)
        except ValueError as exc:
            raise DispatchError(str(exc)) from exc
        call = _Call(self.agent_id, settings, api_key, ctx, self.config)
        try:
            await call.load_tools()
            await call.open(before_start=True)
        except BaseException:
            await call.close()
            raise
        return call.stream()


class _Call:
    """One run's request to the model: attempts, retries, timeouts and cleanup."""

    def __init__(
        self, agent_id: str, settings: AgentSettings, api_key: str, ctx: RunContext, config: dict[str, Any]
    ) -> None:
        self.agent_id = agent_id
        self.settings = settings
        self.ctx = ctx
        # what the session chose, as the catalog rules it (an override the agent no longer lists is not used)
        self.model = catalog.session_model(config, ctx.model)
        self.reasoning_effort = reasoning_effort(catalog.session_thinking(config, ctx.thinking_level))
        self.loop = asyncio.get_running_loop()
        # The run manager's budget (timeoutMs) started just before dispatch.
        self.budget_deadline = self.loop.time() + ctx.timeout_ms / 1000
        self.retries_left = settings.max_retries
        self.attempt = 0
        self.attempt_started = 0.0
        self.messages = build_messages(ctx, settings)
        self.client = _client_for(settings, api_key)
        self.response: openai.AsyncStream[Any] | None = None
        self.closed = False
        # tools (TOOLS.md §13): set by load_tools when the agent has MCP servers
        self.tools: ToolHost | None = None
        self.tool_defs: list[dict[str, Any]] = []
        self.step = 1
        self.reply_len = 0  # characters of reply text yielded so far, in all steps
        self.call_ids: set[str] = set()  # the model's call ids sent in this run (they must not repeat)
        # this attempt's output: text, tool-call fragments by index, usage
        self.step_text: list[str] = []
        self.step_calls: dict[int, _PartialCall] = {}
        self.attempt_usage: dict[str, int] = {}
        self.usage_before: dict[str, int] = {}  # the usage of the steps already finished
        task = asyncio.current_task()
        if task is not None:
            # Backstop: whatever ends the run's task (even a cancellation between
            # dispatch and the first read, where nobody holds the stream), the
            # connection is closed.
            task.add_done_callback(self._task_done)

    # --- opening -------------------------------------------------------------------------------

    async def load_tools(self) -> None:
        """The agent's tools, listed during dispatch: a server that cannot start is a dispatch failure."""
        host = self.ctx.tools
        if host is None or not host.configured:
            return
        try:
            await host.load()
        except ToolServerError as exc:
            raise DispatchError(exc.message) from exc
        self.tools = host
        self.tool_defs = host.openai_tools()

    async def open(self, *, before_start: bool) -> None:
        """Send the request and wait for the response headers, retrying what may be retried."""
        while True:
            self.attempt += 1
            self.attempt_started = self.loop.time()
            try:
                async with asyncio.timeout(self.settings.first_token_timeout_ms / 1000):
                    self.response = await self.client.chat.completions.create(**self._request())
                return
            except TimeoutError:
                raise await self._first_token_timeout() from None
            except Exception as exc:  # SDK errors, and anything else sending the request can raise
                failure = classify(exc, self.agent_id, before_start=before_start)
                log.info("run %s attempt %s failed: %s", self.ctx.run_id, self.attempt, failure.error)
                await self._backoff_or_raise(failure)

    def _request(self) -> dict[str, Any]:
        s = self.settings
        request: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": True}
        if self.reasoning_effort is not None:
            request["reasoning_effort"] = self.reasoning_effort
        if self.tool_defs:
            request["tools"] = self.tool_defs
        if s.stream_usage:
            request["stream_options"] = {"include_usage": True}
        if s.temperature is not None:
            request["temperature"] = s.temperature
        if s.max_tokens is not None:
            request["max_tokens"] = s.max_tokens
        if s.extra_body:
            request["extra_body"] = s.extra_body
        return request

    async def _backoff_or_raise(self, failure: _Failure) -> None:
        """Sleep before the next attempt, or raise the failure when none is left or worth it."""
        if not failure.retryable or self.retries_left <= 0:
            raise failure.error
        used = self.settings.max_retries - self.retries_left
        delay = self.settings.retry_backoff_ms / 1000 * (2**used) * (1 + random.random() / 4)
        if failure.retry_after is not None:
            if failure.retry_after * 1000 > self.settings.max_retry_wait_ms:
                raise failure.error  # the server asks for longer than we are willing to hold the run
            delay = max(delay, failure.retry_after)
        if self.loop.time() + delay >= self.budget_deadline:
            raise failure.error  # waiting would only end in the run's own timeout
        self.retries_left -= 1
        await self._close_response()
        await asyncio.sleep(delay)

    # --- streaming ---------------------------------------------------------------------------------

    def stream(self) -> _ReplyStream:
        return _ReplyStream(self)

    async def chunks(self) -> AsyncGenerator[str, None]:
        """Yield the reply's text, step by step; retry a failed attempt only while its step showed nothing.

        Tool calls run only here, after their step's stream has finished, and a step is
        retried only before it produced any output, then never read again: a retried step
        starts its calls afresh from the new response, and no call of a step runs twice.
        """
        try:
            while True:
                shown = False
                while True:  # the attempts of this step
                    try:
                        async for text in self._read_attempt():
                            shown = True
                            yield text
                        break
                    except _AttemptFailed as failed:
                        if shown:
                            raise failed.failure.error from None
                        log.info("run %s attempt %s failed: %s", self.ctx.run_id, self.attempt, failed)
                        await self._backoff_or_raise(failed.failure)
                        await self.open(before_start=False)
                self.usage_before = _add_usage(self.usage_before, self.attempt_usage)
                calls = self._step_calls()
                if not calls or self.tools is None:
                    return
                await self._close_response()  # read to its end: the connection goes back to the pool
                results = await self.tools.run_calls(self.step, calls, reply_offset=self.reply_len)
                if any(r.status in RUN_ENDED_STATES for r in results):
                    # Only a run's end gives a call these states (an abort while the call waited
                    # for approval returns here before the run's task is cancelled): the run is
                    # over, and the model is not asked again.
                    raise asyncio.CancelledError()
                self._add_step(calls, results)
                if self.step >= self.tools.config.max_steps or self.tools.limit_reached:
                    self.ctx.stop_reason = "tool_limit"  # the model is not asked again
                    return
                self.step += 1
                self.retries_left = self.settings.max_retries  # the retry rules apply per request
                await self.open(before_start=False)
        except asyncio.CancelledError:
            await self._close_after_cancel()
            raise
        finally:
            await self.close()

    async def _read_attempt(self) -> AsyncIterator[str]:
        """Read one response; the first-token and idle timers run only while waiting on it."""
        response = self.response
        assert response is not None
        first = True
        deadline = self.attempt_started + self.settings.first_token_timeout_ms / 1000
        finished = False
        self.step_text, self.step_calls, self.attempt_usage = [], {}, {}
        while True:
            try:
                # The timer covers the network wait only, never the consumer's work
                # between chunks (no `yield` inside the timeout block).
                async with asyncio.timeout_at(deadline):
                    chunk = await response.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if finished:
                    break  # the reply is complete; only a late usage chunk was missing
                raise (await self._first_token_timeout() if first else await self._idle_timeout()) from None
            except openai.OpenAIError as exc:
                raise _AttemptFailed(classify(exc, self.agent_id, before_start=False)) from exc
            except Exception as exc:  # a malformed event (bad JSON) is not worth a retry
                log.warning("run %s: bad event from the model server: %r", self.ctx.run_id, exc)
                raise BackendError("the model server sent a malformed stream event") from exc

            usage = getattr(chunk, "usage", None)
            if usage is not None:
                counts = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}
                self.attempt_usage = {k: int(v) for k, v in counts.items() if isinstance(v, int)}
                self.ctx.usage = _add_usage(self.usage_before, self.attempt_usage) or None
            produced = False
            for choice in chunk.choices or []:
                delta = choice.delta
                text = (delta.content or "") if delta is not None else ""
                refusal = getattr(delta, "refusal", None) if delta is not None else None
                if refusal:
                    text += refusal  # a refusal is the model's answer, shown as such
                # Reasoning models stream their thinking in a side field first: it is
                # not part of the reply but proves the model is alive.
                thinking = _reasoning(delta)
                fragments = (getattr(delta, "tool_calls", None) or []) if delta is not None else []
                for fragment in fragments:
                    self._add_fragment(fragment)
                if text or thinking or fragments:
                    produced = True
                if choice.finish_reason:
                    self.ctx.stop_reason = str(choice.finish_reason)
                    finished = True
                if self.step > 1 and not self.step_text:
                    text = text.lstrip()  # the paragraph break below separates the steps
                if text:
                    first = False
                    out = (PARAGRAPH if self.step > 1 and not self.step_text and self.reply_len else "") + text
                    self.step_text.append(text)
                    self.reply_len += len(out)
                    yield out
            if finished:
                deadline = self.loop.time() + min(AFTER_FINISH_GRACE_S, self.settings.idle_timeout_ms / 1000)
            elif produced:
                first = False  # thinking tokens count as tokens for the timers
                deadline = self.loop.time() + self.settings.idle_timeout_ms / 1000
        if not finished:
            cut = BackendError("the model server closed the stream before the reply was finished")
            raise _AttemptFailed(_Failure(cut, retryable=True))

    # --- tool calls -----------------------------------------------------------------------------------

    def _add_fragment(self, fragment: Any) -> None:
        """One streamed piece of a tool call: id and name come first, arguments in pieces, by `index`."""
        index = getattr(fragment, "index", None)
        call_id = getattr(fragment, "id", None) or ""
        if not isinstance(index, int):  # a server that leaves out the index: a new id starts a call
            known = next((i for i, c in self.step_calls.items() if call_id and c.id == call_id), None)
            if known is not None:
                index = known
            elif call_id or not self.step_calls:
                index = max(self.step_calls, default=-1) + 1
            else:
                index = max(self.step_calls)
        call = self.step_calls.get(index)
        if call is None:
            if len(self.step_calls) >= MAX_CALLS_PER_STEP:
                return
            call = self.step_calls[index] = _PartialCall()
        if call_id and not call.id:
            call.id = str(call_id)
        function = getattr(fragment, "function", None)
        name = getattr(function, "name", None) if function is not None else None
        if name and not call.name:
            call.name = str(name)[:200]
        arguments = getattr(function, "arguments", None) if function is not None else None
        if arguments and call.size <= MAX_ARGUMENT_CHARS:
            call.arguments.append(str(arguments))
            call.size += len(arguments)

    def _step_calls(self) -> list[ModelCall]:
        """The finished step's calls in index order, each with an id unique in this run."""
        calls = []
        for number, (_index, partial) in enumerate(sorted(self.step_calls.items()), start=1):
            call_id = partial.id
            if not call_id or len(call_id) > MAX_CALL_ID or call_id in self.call_ids:
                call_id = f"call_{self.step}_{number}_{secrets.token_hex(4)}"
            self.call_ids.add(call_id)
            calls.append(ModelCall(call_id, partial.name, "".join(partial.arguments)))
        return calls

    def _add_step(self, calls: list[ModelCall], results: list[ToolResult]) -> None:
        """The next request's messages: the step's text and calls, then each call's result."""
        self.messages.append(
            {
                "role": "assistant",
                "content": "".join(self.step_text) or None,
                "tool_calls": [_tool_call(c.id, c.name, c.arguments) for c in calls],
            }
        )
        by_id = {r.model_call_id: r for r in results}
        for c in calls:
            result = by_id.get(c.id)
            text = _result_text(result.text, result.status) if result else "(no result: the call was not run)"
            self.messages.append({"role": "tool", "tool_call_id": c.id, "content": text})

    # --- timeouts and cleanup -----------------------------------------------------------------------

    async def _first_token_timeout(self) -> BackendTimeout:
        ms = self.settings.first_token_timeout_ms
        await self._close_and_record(self.attempt_started + ms / 1000)
        return BackendTimeout(f"no first token from the model within {ms} ms (first_token_timeout_ms)")

    async def _idle_timeout(self) -> BackendTimeout:
        ms = self.settings.idle_timeout_ms
        await self._close_and_record(self.loop.time())
        return BackendTimeout(f"the model sent nothing for {ms} ms after its last token (idle_timeout_ms)")

    async def _close_after_cancel(self) -> None:
        """A cancellation: the run manager records an abort's cost itself; a budget timeout it does not."""
        if self.loop.time() >= self.budget_deadline - 0.05:
            await self._close_and_record(self.budget_deadline)
        else:
            await self.close()

    async def _close_and_record(self, since: float) -> None:
        """Close the connection and report how long stopping took (stored as Run.cancel_ms)."""
        await self.close()
        self.ctx.cancel_ms = max(0, int((self.loop.time() - since) * 1000))

    async def _close_response(self) -> None:
        response, self.response = self.response, None
        if response is not None:
            with contextlib.suppress(Exception):
                await response.close()

    async def close(self) -> None:
        """Close the response (idempotent).

        Closing a response whose body was not read to the end closes its connection
        (it is not returned to the pool), which is what tells the server to stop.
        """
        if self.closed:
            return
        self.closed = True
        await self._close_response()

    def _task_done(self, _task: asyncio.Task[Any]) -> None:
        if self.closed or self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            cleanup = self.loop.create_task(self.close())
            _CLEANUPS.add(cleanup)
            cleanup.add_done_callback(_CLEANUPS.discard)


_CLEANUPS: set[asyncio.Task[None]] = set()


@dataclass
class _PartialCall:
    """A tool call being streamed."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


def _add_usage(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in (*a, *(k for k in b if k not in a))}


def _reasoning(delta: Any) -> bool:
    """True when the delta carries reasoning text (vLLM/DeepSeek `reasoning_content`, Ollama `reasoning`)."""
    if delta is None:
        return False
    extra = getattr(delta, "model_extra", None) or {}
    return bool(extra.get("reasoning_content") or extra.get("reasoning"))


class _AttemptFailed(Exception):
    """An attempt failed in a way that may be retried if nothing was shown yet."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(str(failure.error))
        self.failure = failure


class _ReplyStream:
    """The text stream handed to the run manager.

    A plain async generator would not do: `aclose()` on one that never started
    skips its cleanup, and the manager closes an unstarted stream when an abort
    wins the race to mark the run running.
    """

    def __init__(self, call: _Call) -> None:
        self._call = call
        self._chunks = call.chunks()

    def __aiter__(self) -> _ReplyStream:
        return self

    async def __anext__(self) -> str:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._call.close()
