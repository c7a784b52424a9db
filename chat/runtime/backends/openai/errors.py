"""The model server's failures (SDK exceptions) as the run's errors, and whether to try again."""

from __future__ import annotations

import logging
import math
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import openai

from chat.runtime.backends.base import BackendError, DispatchError

log = logging.getLogger(__name__)

MAX_ERROR_DETAIL = 300
# Providers word "prompt too long" differently: OpenAI and vLLM ("maximum context
# length"), llama.cpp ("exceeds the available context size"), others ("context window").
CONTEXT_LENGTH_RE = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|prompt is too long|too many tokens|"
    r"exceeds? the (available |maximum )?context",
    re.IGNORECASE,
)
CONTEXT_LENGTH_CODES = {"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"}


@dataclass
class Failure:
    """A classified failure of one attempt."""

    error: BackendError | DispatchError
    retryable: bool = False
    retry_after: float | None = None  # seconds, from the server


def classify(exc: Exception, agent_id: str, *, before_start: bool) -> Failure:
    """Map an SDK exception to the run's failure and say whether another attempt may help.

    `before_start`: still in the dispatch phase, where failing to reach the server,
    a bad key or an unknown model are dispatch failures (§8), not backend errors.
    """
    where = f"agent {agent_id!r}"
    if isinstance(exc, openai.APIStatusError):
        return _status_failure(exc, where, before_start=before_start)
    if isinstance(exc, openai.APIConnectionError):
        cause, retryable = _connection_cause(exc)
        if before_start:
            return Failure(DispatchError(f"cannot reach the model server of {where} ({cause})"), retryable)
        return Failure(BackendError(f"the connection to the model server failed ({cause})"), retryable)
    if isinstance(exc, openai.APIError):  # an error event inside a 200 stream
        detail = _detail(exc)
        if _is_context_length(exc):
            return Failure(_too_long(detail))
        if (exc.code or "") in ("429", "rate_limit_exceeded") or "rate limit" in detail.lower():
            return Failure(_rate_limited(detail), retryable=True)
        return Failure(BackendError(f"the model server reported an error: {detail}"), retryable=True)
    log.warning("unexpected error from the model server of %s: %r", where, exc)
    text = f"unexpected failure talking to the model server of {where}: {type(exc).__name__}"
    return Failure(DispatchError(text) if before_start else BackendError(text))


def _status_failure(exc: openai.APIStatusError, where: str, *, before_start: bool) -> Failure:
    """An HTTP error status: rate limit, too long, the server's failure, or a refusal."""
    status = exc.status_code
    detail = _detail(exc)
    if status == 429:
        after = _retry_after(exc)
        hint = f" (retry-after {_format_seconds(after)})" if after is not None else ""
        return Failure(_rate_limited(f"HTTP 429{hint}: {detail}"), retryable=True, retry_after=after)
    if _is_context_length(exc):
        return Failure(_too_long(detail))
    if status >= 500 or status in (408, 409):
        return Failure(BackendError(f"the model server failed: HTTP {status}: {detail}"), retryable=True)
    if status in (401, 403):
        text = f"the model server rejected the API key of {where}: HTTP {status}: {detail}"
    elif status == 404:
        text = f"the model server does not know the model of {where}: HTTP 404: {detail}"
    else:
        text = f"the model server refused the request of {where}: HTTP {status}: {detail}"
    return Failure(DispatchError(text) if before_start else BackendError(text))


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
