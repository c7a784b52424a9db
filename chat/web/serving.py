"""Transport guards for `serve` (daphne on Twisted): a deadline for a request's headers, and
bounds (size, time) for the bodies of HTTP API requests.

Twisted's idle timeout restarts with every byte, so a client sending one header line
every few seconds (slowloris) could hold a connection for as long as it liked. Here
each new HTTP connection must finish its first request's headers within
GATEWAY_HEADER_TIMEOUT_SECONDS, or it is dropped.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from chat.base import metrics
from chat.httpapi.errors import ApiError

log = logging.getLogger(__name__)


def header_deadline(factory: Any, seconds: float, reactor: Any) -> None:
    """Make every protocol `factory` builds drop its connection if headers take over `seconds`."""
    if seconds <= 0:
        return
    build = factory.buildProtocol

    def build_with_deadline(addr: Any) -> Any:
        built = build(addr)
        # Twisted wraps the HTTPChannel in a proxy (for HTTP/2 negotiation): patch the channel
        protocol = getattr(built, "_channel", built)
        if protocol is None:
            return built
        made, headers_done, lost = protocol.connectionMade, protocol.allHeadersReceived, protocol.connectionLost
        pending: dict[str, Any] = {}

        def cancel() -> None:
            call = pending.pop("call", None)
            if call is not None and call.active():
                call.cancel()

        def expire() -> None:
            pending.pop("call", None)
            log.info("headers not complete within %ss: connection dropped", seconds)
            transport = getattr(protocol, "transport", None)
            if transport is not None:
                transport.abortConnection()

        def connection_made() -> None:
            made()
            pending["call"] = reactor.callLater(seconds, expire)

        def all_headers_received() -> None:
            cancel()
            headers_done()

        def connection_lost(reason: Any) -> None:
            cancel()
            lost(reason)

        protocol.connectionMade = connection_made
        protocol.allHeadersReceived = all_headers_received
        protocol.connectionLost = connection_lost
        return built

    factory.buildProtocol = build_with_deadline


def _raw_answer(status: int, reason: str, error: ApiError) -> bytes:
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def body_guard(factory: Any, max_bytes: int, seconds: float, reactor: Any, prefix: bytes = b"/v1/") -> None:
    """Bound the bodies of HTTP API requests (paths under `prefix`) on every protocol `factory` builds:
    over `max_bytes` is a 413 as soon as that is known (its Content-Length, or the bytes so far), a
    body not all there `seconds` after its headers a 408; either way the connection is closed.

    Daphne reads a whole body before the application sees it, so the API's own bounds
    (`chat.httpapi.app`) could not stop a huge or endless one: here the transport does."""
    build = factory.buildProtocol

    def build_guarded(addr: Any) -> Any:
        built = build(addr)
        protocol = getattr(built, "_channel", built)
        if protocol is not None:
            _guard(protocol, max_bytes, seconds, reactor, prefix)
        return built

    factory.buildProtocol = build_guarded


def _guard(protocol: Any, max_bytes: int, seconds: float, reactor: Any, prefix: bytes) -> None:
    headers_done, content_done, lost = protocol.allHeadersReceived, protocol.allContentReceived, protocol.connectionLost
    pending: dict[str, Any] = {}

    def cancel() -> None:
        call = pending.pop("call", None)
        if call is not None and call.active():
            call.cancel()

    def refuse(status: int, reason: str, error: ApiError) -> None:
        cancel()
        pending["refused"] = True  # the request is never handed on, whatever the decoder still has
        metrics.HTTP_REQUESTS.labels("transport", str(status)).inc()
        protocol.dataReceived = lambda data: None  # the rest of the body is not read
        transport = getattr(protocol, "transport", None)
        if transport is not None:
            transport.write(_raw_answer(status, reason, error))
            transport.loseConnection()

    def too_large() -> None:
        refuse(
            413,
            "Payload Too Large",
            ApiError(413, f"the request body is over {max_bytes} bytes", code="request_too_large"),
        )

    def all_headers_received() -> None:
        headers_done()
        if not (getattr(protocol, "_path", b"") or b"").startswith(prefix):
            return
        if protocol.length is not None and protocol.length > max_bytes:
            too_large()
            return
        request = protocol.requests[-1]
        chunk, received = request.handleContentChunk, [0]

        def counted(data: bytes) -> None:
            received[0] += len(data)
            if received[0] > max_bytes:
                if not pending.get("refused"):
                    too_large()
                return
            chunk(data)

        request.handleContentChunk = counted
        if protocol.length != 0 and seconds > 0:
            slow = ApiError(408, f"the request body did not arrive within {seconds:g} s", code="body_timeout")
            pending["call"] = reactor.callLater(seconds, refuse, 408, "Request Timeout", slow)

    def all_content_received() -> None:
        cancel()
        if not pending.get("refused"):
            content_done()

    def connection_lost(reason: Any) -> None:
        cancel()
        lost(reason)

    protocol.allHeadersReceived = all_headers_received
    protocol.allContentReceived = all_content_received
    protocol.connectionLost = connection_lost
