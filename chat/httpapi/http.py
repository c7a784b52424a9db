"""A request of the HTTP API and its answers: JSON, or a server-sent event stream.

The stream notices a closed connection at once (the app watches ASGI `http.disconnect`), not at
its next write, and sends `: keep-alive` comments while nothing else happens so proxies keep a
long tool step open. Event streams are never compressed (some clients cannot read them so).

An answer that ends before its run does for any other reason than the client leaving (an error,
the database away, a revoked key) does to the run what the client leaving would (`abandon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

from chat.base import metrics
from chat.base.availability import Unavailable
from chat.httpapi.errors import ApiError, bad_request

if TYPE_CHECKING:
    from chat.httpapi.auth import Caller

log = logging.getLogger(__name__)
Send = Callable[[dict[str, Any]], Awaitable[None]]
DisconnectHook = Callable[[], Awaitable[None]]
_background: set[asyncio.Task[Any]] = set()  # disconnect hooks under way


@dataclass
class Request:
    """One HTTP request, its body read whole (bounded), and who sent it once authenticated."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # names lowercase; repeated ones joined by ","
    body: bytes = b""
    caller: Caller | None = None
    # set as soon as the client closes the connection (before the answer is done)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    hooks: list[DisconnectHook] = field(default_factory=list)
    # the headers of the run this request admitted or found: every answer after that carries them
    run_headers: dict[str, str] = field(default_factory=dict)

    def header(self, *names: str) -> str | None:
        """The first of these headers that is present (aliases: `x-agentgate-…`, `x-openclaw-…`)."""
        for name in names:
            if name in self.headers:
                return self.headers[name]
        return None

    def json(self) -> dict[str, Any]:
        """The body as a JSON object, or a 400."""
        if not self.body:
            raise bad_request("the request body must be a JSON object")
        try:
            value = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise bad_request("the request body must be a JSON object")
        return value

    @property
    def user(self) -> Caller:
        """The authenticated caller (routes are authenticated before their handler runs)."""
        assert self.caller is not None
        return self.caller

    def on_disconnect(self, hook: DisconnectHook) -> Callable[[], None]:
        """Run `hook` if the client leaves before the answer is done; returns its removal.
        Hooks run in a task of their own: the request's handler being cancelled does not stop them."""
        self.hooks.append(hook)
        return lambda: self.hooks.remove(hook) if hook in self.hooks else None

    def abandon(self) -> None:
        """The answer ends before its run does (the client left, its key was revoked, it failed): do
        to the run what the client leaving does. Each hook runs once, in a task of its own."""
        hooks, self.hooks = list(self.hooks), []
        for hook in hooks:
            task = asyncio.ensure_future(hook())
            _background.add(task)
            task.add_done_callback(_hook_done)


def _hook_done(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("a disconnect hook failed: %s", task.exception())


class Answer(Protocol):
    status: int
    headers: dict[str, str]

    async def send(self, send: Send, request: Request) -> None: ...


def _header_list(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass
class JsonAnswer:
    """A whole JSON answer."""

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    async def send(self, send: Send, request: Request) -> None:
        payload = b"" if self.status == 204 else dumps(self.body)
        headers = {"content-length": str(len(payload)), **self.headers}
        if payload:
            headers["content-type"] = "application/json"
        await send({"type": "http.response.start", "status": self.status, "headers": _header_list(headers)})
        await send({"type": "http.response.body", "body": payload})


def error_answer(error: ApiError, headers: dict[str, str] | None = None) -> JsonAnswer:
    """The error as a whole answer, with `headers` (the run's) beside its own."""
    return JsonAnswer(error.body(), error.status, {**(headers or {}), **error.headers})


def failure(exc: Exception, where: str) -> ApiError:
    """What an answer that failed with `exc` says: an `ApiError` as it is; the database (or channel
    layer) away is a 503 with `Retry-After`; a fault of ours is logged and a 500 that says nothing of it."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Unavailable):
        metrics.UNAVAILABLE_ANSWERS.labels(exc.dependency).inc()
        return ApiError(
            503,
            f"the gateway's {exc.dependency.replace('_', ' ')} is unavailable; try again shortly",
            code="unavailable",
            headers={"retry-after": str(max(1, math.ceil(exc.retry_after_ms / 1000)))},
        )
    log.error("the HTTP API failed on %s", where, exc_info=exc)
    return ApiError(500, "the gateway failed to answer this request", code="internal_error")


@dataclass(frozen=True)
class SseEvent:
    """One event: `data` (a dict sent as JSON, a str as is, e.g. `[DONE]`) and, for Responses, its `event` name."""

    data: Any
    event: str | None = None

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else dumps(self.data).decode("utf-8")
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n".encode()


KEEPALIVE = b": keep-alive\n\n"
# A stream's error terminal: its events for an error, given the last event sent (None: none yet).
Ending = Callable[[ApiError, "SseEvent | None"], list[SseEvent]]


def error_object_ending(error: ApiError, last: SseEvent | None) -> list[SseEvent]:
    return [SseEvent(error.body())]


class ClientGone(Exception):
    """The client left while its stream was being sent (its disconnect hooks are the app's to run)."""


class StreamFailed(Exception):
    """The stream's iterator raised (`__cause__`); not what the connection did while it was written."""


class EventStream:
    """A `text/event-stream` answer fed by an async iterator of `SseEvent`s.

    Whatever the iterator raises ends the answer once, and the run is abandoned (`Request.abandon`):
    before the first event, the error is answered as such instead of a stream (§14.4: a streaming
    request that fails before its first event gets that status), with the stream's headers; after,
    the stream ends with its own error terminal (`ending`). The iterator is closed when the client
    leaves (`aclose`: its `finally` runs) or when it ends.
    """

    def __init__(
        self,
        events: AsyncIterator[SseEvent],
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        ending: Ending = error_object_ending,
    ):
        self.events = events
        self.status = status
        self.headers = dict(headers or {})
        self.ending = ending
        self.keepalive = float(settings.GATEWAY_HTTP_KEEPALIVE_SECONDS)
        self.gone: asyncio.Future[Any] | None = None  # done once the client has left (while sending)

    async def send(self, send: Send, request: Request) -> None:
        self.gone = gone = asyncio.ensure_future(request.disconnected.wait())
        try:
            await self._send(send, request)
        finally:
            gone.cancel()
            with contextlib.suppress(Exception):
                await self.events.aclose()  # type: ignore[attr-defined]

    async def _next(self, pending: asyncio.Future[SseEvent] | None) -> tuple[Any, Any]:
        """(the next event or None at the end, the still-pending fetch) within one keep-alive interval;
        raises ClientGone if the client left first, StreamFailed if the iterator raised."""
        fetch, gone = pending or asyncio.ensure_future(anext(self.events)), self.gone
        assert gone is not None
        done, _ = await asyncio.wait({fetch, gone}, timeout=self.keepalive, return_when=asyncio.FIRST_COMPLETED)
        if fetch in done:
            try:
                return fetch.result(), None
            except StopAsyncIteration:
                return None, None
            except Exception as exc:
                raise StreamFailed() from exc
        if gone in done:
            fetch.cancel()
            with contextlib.suppress(BaseException):
                await fetch
            raise ClientGone()
        return KEEPALIVE, fetch

    async def _send(self, send: Send, request: Request) -> None:
        try:
            # headers wait for the first event (or error) for one keep-alive interval at most
            item, pending = await self._next(None)
        except ClientGone:
            return
        except StreamFailed as failed:
            request.abandon()
            error = failure(_cause(failed), f"{request.method} {request.path}")
            await error_answer(error, self.headers).send(send, request)
            return
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",  # nginx: pass each event on at once
            **self.headers,
        }
        await send({"type": "http.response.start", "status": self.status, "headers": _header_list(headers)})
        last: SseEvent | None = None
        try:
            while item is not None:
                if item is not KEEPALIVE:
                    last = item
                body = item if item is KEEPALIVE else item.encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
                item, pending = await self._next(pending)
        except ClientGone:
            return
        except StreamFailed as failed:  # the stream ends before its run: with its error terminal, exactly once
            request.abandon()
            error = failure(_cause(failed), f"{request.method} {request.path}")
            body = b"".join(event.encode() for event in self.ending(error, last))
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _cause(failed: StreamFailed) -> Exception:
    cause = failed.__cause__
    assert isinstance(cause, Exception)
    return cause
