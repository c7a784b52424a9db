"""The door of the HTTP API: an ASGI app in front of Django that serves `/v1/`.

Per request, in order: the API switched on (else 404), CORS for the configured origins only, the
route (404/405), the key (401), its scope (403) and rate (429), the body within its bound (413)
and time (408), then the handler. While the database is away the answer is 503 with `Retry-After`;
a fault of ours is a 500 that says nothing of it, never bad input. A closed connection is noticed
at once (ASGI `http.disconnect`): the handler is cancelled and the request's disconnect hooks run.
A handler that fails after its run was admitted answers with the run's headers, and the hooks run
as for a client that left: the client was not told how its run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from chat.base import metrics
from chat.base.availability import Unavailable
from chat.httpapi import routes
from chat.httpapi.auth import authenticate, require, take_rate
from chat.httpapi.errors import ApiError
from chat.httpapi.http import Answer, JsonAnswer, Request, error_answer, failure

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[..., Awaitable[None]]], Any]
PREFIX = "/v1/"
CORS_ALLOW_HEADERS = (
    "authorization, content-type, idempotency-key, x-agentgate-session-key, x-openclaw-session-key, "
    "x-agentgate-model, x-openclaw-model, openai-organization, openai-project, x-stainless-*"
)
CORS_EXPOSE_HEADERS = "x-agentgate-run-id, x-agentgate-session-key, x-agentgate-idempotent-replay, retry-after"


def is_api_path(path: str) -> bool:
    return path == PREFIX.rstrip("/") or path.startswith(PREFIX)


class HttpApi:
    """Serves `/v1/` itself; hands everything else to `inner` (Django and the static files)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        routes.load_handlers()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not is_api_path(scope.get("path", "")):
            return await self.inner(scope, receive, send)
        await Exchange(scope, receive, send).serve()


def _request(scope: dict[str, Any]) -> Request:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
    return Request(scope["method"].upper(), scope["path"], query, headers)


def _cors_headers(origin: str | None) -> dict[str, str]:
    allowed = settings.GATEWAY_HTTP_CORS_ORIGINS
    if not origin or not (origin in allowed or "*" in allowed):
        return {}
    return {
        "access-control-allow-origin": origin,
        "access-control-expose-headers": CORS_EXPOSE_HEADERS,
        "vary": "origin",
    }


class Exchange:
    """One request and its answer."""

    def __init__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.receive = receive
        self.raw_send = send
        self.req = _request(scope)
        self.route_name = "unmatched"
        self.status = 0
        self.started = time.perf_counter()
        self.answered = False  # the whole answer handed to the server
        self.cors = _cors_headers(self.req.headers.get("origin"))
        self.handler: routes.Handler | None = None  # the route's, once the request may go to it
        self.params: dict[str, Any] = {}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message = {**message, "headers": [*message["headers"], *_encode(self.cors)]}
            metrics.HTTP_REQUEST_SECONDS.labels(self.route_name).observe(time.perf_counter() - self.started)
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.answered = True  # before the server hears of it: its `http.disconnect` follows at once
        await self.raw_send(message)

    async def serve(self) -> None:
        watcher: asyncio.Task[None] | None = None
        try:
            answer = await self._prepare()
            if answer is None:
                watcher = asyncio.ensure_future(self._watch())
                answer = await self._handle()
            if answer is not None:
                await answer.send(self.send, self.req)
        except OSError:  # the connection went away while we wrote
            pass
        finally:
            self.answered = True
            if watcher is not None:
                watcher.cancel()
            metrics.HTTP_REQUESTS.labels(self.route_name, str(self.status or 499)).inc()

    async def _prepare(self) -> Answer | None:
        """An early answer (an error, a CORS preflight), or None once the request may go to its handler."""
        req = self.req
        if not settings.GATEWAY_HTTP_API:
            return error_answer(ApiError(404, "the HTTP API is switched off on this gateway", code="api_disabled"))
        if req.method == "OPTIONS" and self.cors and "access-control-request-method" in req.headers:
            preflight = {
                "access-control-allow-methods": "GET, POST, DELETE, OPTIONS",
                "access-control-allow-headers": CORS_ALLOW_HEADERS,
                "access-control-max-age": "600",
            }
            return JsonAnswer(None, 204, preflight)
        try:
            route, params = routes.resolve(req.method, req.path)
            self.route_name = route.name
            self._check_length()
            req.caller = await authenticate(req.headers.get("authorization"))
            require(req.caller, route.scope)
            take_rate(req.caller)
            req.body = await self._read_body()
        except ApiError as error:
            return error_answer(error)
        except Unavailable as exc:
            return error_answer(failure(exc, req.method))
        self.params, self.handler = params, route.handler
        return None

    def _check_length(self) -> None:
        declared = self.req.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > settings.GATEWAY_HTTP_MAX_BODY:
            raise _too_large()

    async def _read_body(self) -> bytes:
        """The whole body, within GATEWAY_HTTP_MAX_BODY bytes (413) and the body timeout (408)."""
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + float(settings.GATEWAY_HTTP_BODY_TIMEOUT_SECONDS)
        while True:
            try:
                message = await asyncio.wait_for(self.receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise ApiError(408, "the request body did not arrive in time", code="body_timeout") from None
            if message["type"] == "http.disconnect":
                self.req.disconnected.set()
                raise ApiError(400, "the client left before its body was read")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > settings.GATEWAY_HTTP_MAX_BODY:
                raise _too_large()
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _handle(self) -> Answer | None:
        """The handler's answer; None if the client left first (the handler is then cancelled)."""
        assert self.handler is not None
        handler = asyncio.ensure_future(self.handler(self.req, **self.params))
        gone = asyncio.ensure_future(self.req.disconnected.wait())
        try:
            await asyncio.wait({handler, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not handler.done():
            handler.cancel()
            with contextlib.suppress(BaseException):
                await handler
            return None
        try:
            return handler.result()
        except Exception as exc:
            self.req.abandon()  # (a run admitted, if any: its client will not hear how it ends)
            return error_answer(failure(exc, f"{self.req.method} {self.route_name}"), self.req.run_headers)

    async def _watch(self) -> None:
        """Notice the client leaving; then, unless the answer was done, run the request's disconnect hooks."""
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                break
        self.req.disconnected.set()
        if not self.answered:
            self.req.abandon()


def _encode(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _too_large() -> ApiError:
    limit = settings.GATEWAY_HTTP_MAX_BODY
    return ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")
