"""Transport guards for `serve` (daphne on Twisted): a deadline for a request's headers.

Twisted's idle timeout restarts with every byte, so a client sending one header line
every few seconds (slowloris) could hold a connection for as long as it liked. Here
each new HTTP connection must finish its first request's headers within
GATEWAY_HEADER_TIMEOUT_SECONDS, or it is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

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
