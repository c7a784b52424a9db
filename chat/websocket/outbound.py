"""Outbound limits: no frame larger than the client accepts, no more waiting than it was promised.

`hello-ok` announces `policy.maxPayload` (the largest frame either side sends) and
`policy.maxBufferedBytes` (how much the server keeps waiting for a client that does not
read). `Outbound` enforces both for one connection; a frame it cannot send, or a send
that fails, ends the connection with a close code that says "reconnect and resync", and
releases the connection's registry entry and groups first, so nothing is left behind.

Budgets are counted as `json.dumps` encodes text (ASCII escapes): an upper bound for the
UTF-8 frames `frames.encode` makes of the same text.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import autobahn.util
from autobahn.exception import Disconnected
from django.conf import settings

from chat.protocol import frames
from chat.protocol.sizes import frame_bytes

log = logging.getLogger(__name__)

# close codes (documented in docs/protocol-notes.md)
CLOSE_SLOW_CONSUMER = 4009  # more than maxBufferedBytes waiting for this client
CLOSE_SEND_FAILED = 4011  # an event could not be sent (over maxPayload, or the transport refused it)

# ASGI scope extension: a callable giving the bytes the transport holds for this client
BUFFER_PROBE = "agentgate.buffered"


# --- chat.history by a byte budget ----------------------------------------------------------------


# --- list pages by a byte budget -------------------------------------------------------------------


# --- one connection's sender ------------------------------------------------------------------------


class Sink(Protocol):
    """What `Outbound` needs from the consumer."""

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None: ...

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None: ...


class Outbound:
    """Sends one connection's frames within `maxPayload` and `maxBufferedBytes`."""

    def __init__(self, sink: Sink, scope: Mapping[str, Any], release: Callable[[], Awaitable[None]]) -> None:
        self.sink = sink
        self.release = release
        probe = (scope.get("extensions") or {}).get(BUFFER_PROBE)
        self.buffered: Callable[[], int] | None = probe if callable(probe) else None
        self.closing = False

    async def send(self, text: str, *, response_id: str | None = None) -> None:
        """Send one encoded frame; `response_id` marks a response (an oversize one becomes an error)."""
        if self.closing:
            return
        size = frame_bytes(text)
        max_payload = int(settings.GATEWAY_MAX_PAYLOAD)
        if size > max_payload:
            if response_id is None:
                log.warning("event of %d bytes is over maxPayload (%d): closing", size, max_payload)
                await self.end(CLOSE_SEND_FAILED)
                return
            log.warning("response of %d bytes is over maxPayload (%d): answered with an error", size, max_payload)
            text = frames.encode(too_large(response_id, size, max_payload))
            size = len(text)
        if self.buffered is not None:
            try:
                waiting = self.buffered()
            except Exception:  # a probe of transport internals must never break sending
                waiting = 0
            # what already waits decides: one frame alone (≤ maxPayload) always gets its chance
            if waiting > 0 and waiting + size > int(settings.GATEWAY_MAX_BUFFERED_BYTES):
                log.warning("client is not reading (%d bytes waiting): closing", waiting)
                await self.end(CLOSE_SLOW_CONSUMER)
                return
        try:
            await self.sink.send(text_data=text)
        except Disconnected:
            # The client closed while a frame was on its way: its disconnect follows, and a
            # traceback would only say that a peer went away.
            log.debug("frame not sent: the client is gone")
            await self.end(CLOSE_SEND_FAILED)
        except Exception:
            log.warning("sending a frame failed: closing", exc_info=True)
            await self.end(CLOSE_SEND_FAILED)

    async def end(self, code: int) -> None:
        """Release the connection everywhere, then close it (nothing more is sent)."""
        if self.closing:
            return
        self.closing = True
        try:
            await self.release()
        finally:
            try:
                await self.sink.close(code=code)
            except Exception:
                log.warning("closing the socket failed", exc_info=True)


def too_large(rid: str, size: int, limit: int) -> dict[str, Any]:
    return {
        "type": "res",
        "id": rid,
        "ok": False,
        "error": {
            "code": "PAYLOAD_TOO_LARGE",
            "message": f"the response ({size} bytes) is over maxPayload ({limit})",
            "details": {"size": size, "maxPayload": limit},
        },
    }


# --- the transport probe (daphne) -------------------------------------------------------------------


def transport_buffered(transport: Any) -> int:
    """Bytes a Twisted transport holds unsent (its write buffers)."""
    data = getattr(transport, "dataBuffer", b"")
    return len(data) - int(getattr(transport, "offset", 0)) + int(getattr(transport, "_tempDataLen", 0))


def plain_frame_logging() -> None:
    """autobahn formats the arguments of a debug line for every frame it writes, whether debug
    logging is on or not, in click's colours when click is installed: about 8 µs a frame on the
    event loop. Uncoloured, the same line costs 3 µs; the colours only ever showed in autobahn's
    own debug output."""
    autobahn.util._HAS_CLICK = False


def with_buffer_probe(application: Any) -> Any:
    """Wrap the ASGI app so WebSocket scopes can see how much their transport holds unsent.

    daphne hands each application instance `send = partial(server.handle_reply, protocol)`;
    the protocol's transport is where frames wait for a client that does not read.
    """

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and isinstance(send, functools.partial) and send.args:
            transport = getattr(send.args[0], "transport", None)
            if transport is not None:
                extensions = dict(scope.get("extensions") or {})
                extensions[BUFFER_PROBE] = functools.partial(transport_buffered, transport)
                scope = {**scope, "extensions": extensions}
        return await application(scope, receive, send)

    return app
