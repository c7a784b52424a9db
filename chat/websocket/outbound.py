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
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from autobahn.exception import Disconnected
from django.conf import settings

from chat.protocol import frames, wire

log = logging.getLogger(__name__)

# close codes (documented in docs/protocol-notes.md)
CLOSE_SLOW_CONSUMER = 4009  # more than maxBufferedBytes waiting for this client
CLOSE_SEND_FAILED = 4011  # an event could not be sent (over maxPayload, or the transport refused it)

# ASGI scope extension: a callable giving the bytes the transport holds for this client
BUFFER_PROBE = "agentgate.buffered"
# room left in every frame for its envelope (type, id of up to 128 chars, seq, keys)
ENVELOPE_BYTES = 4096


def encoded_len(text: str) -> int:
    """Bytes `text` takes inside an encoded frame (without its quotes)."""
    if text.isascii() and '"' not in text and "\\" not in text and text.isprintable():
        return len(text)
    return len(json.dumps(text)) - 2


def frame_bytes(text: str) -> int:
    """Bytes of an encoded frame on the wire (UTF-8)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def fit_text(text: str, budget: int) -> str:
    """The longest prefix of `text` whose encoding fits in `budget` bytes."""
    if encoded_len(text) <= budget:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # binary search on the prefix length: encoding grows with it
        mid = (lo + hi + 1) // 2
        if encoded_len(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def frame_budget() -> int:
    """Bytes one response's payload may take: `maxPayload` less the room kept for its envelope."""
    return int(settings.GATEWAY_MAX_PAYLOAD) - ENVELOPE_BYTES


def max_reply_bytes() -> int:
    """The budget of one reply's text: a delta carries it twice (the text so far and the new part)."""
    return int(settings.GATEWAY_MAX_REPLY_BYTES)


# --- chat.history by a byte budget ----------------------------------------------------------------


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def fit_history(payload: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
    """Keep the newest messages that fit in one frame; `hasMore` says older ones are left.

    Queued texts share at most an eighth of the budget. When not even the newest message
    fits, it is sent cut, with `truncated: true`, so the client can still page past it.
    """
    if budget is None:
        budget = frame_budget()
    messages: list[dict[str, Any]] = payload["messages"]
    queued: list[dict[str, Any]] = payload.get("queuedRuns") or []
    if queued and _size(queued) > budget // 8:
        share = max(64, budget // 8 // len(queued) - 64)
        payload["queuedRuns"] = queued = [_cut_queued(item, share) for item in queued]
    fixed = _size({**payload, "messages": []})
    room = budget - fixed
    kept: list[dict[str, Any]] = []
    for item in reversed(messages):
        size = _size(item) + 1
        if size > room:
            break
        kept.append(item)
        room -= size
    if len(kept) < len(messages):
        payload["hasMore"] = True
        if not kept and messages:
            kept.append(_cut_message(messages[-1], room))
    kept.reverse()
    payload["messages"] = kept
    return payload


# --- list pages by a byte budget -------------------------------------------------------------------

# The smallest a session row encodes to (a bare row is about 450 bytes): no page can hold more rows
# than the frame has room for at this size, so no more are read.
MIN_ROW_BYTES = 256
# Rows read for one page at most, whatever the limit and the frame: rows are read (and made into
# rows) before the frame is measured, and a page of real rows this long already fills ~0.5 MiB.
MAX_LIST_ROWS = 1000


def rows_that_may_fit(limit: int, budget: int | None = None) -> int:
    """How many rows to read for a page of `limit`: at most what one frame can hold, and at most
    `MAX_LIST_ROWS` (the page's paging fields then say where to go on)."""
    room = (frame_budget() if budget is None else budget) // MIN_ROW_BYTES
    return max(1, min(limit, room, MAX_LIST_ROWS))


def fit_list(payload: dict[str, Any], offset: int, budget: int | None = None) -> dict[str, Any]:
    """Keep the first rows of a `sessions.list` page that fit in one frame; the paging fields
    (`count`, `hasMore`, `nextOffset`) then describe the rows sent, so paging on loses none."""
    if budget is None:
        budget = frame_budget()
    rows: list[dict[str, Any]] = payload["sessions"]
    room = budget - _size({**payload, "sessions": [], "nextOffset": 10**12})
    kept = 0
    for row in rows:
        size = _size(row) + 1
        if size > room and kept > 0:
            break  # (a first row that does not fit alone is sent: PAYLOAD_TOO_LARGE, not an empty page)
        room -= size
        kept += 1
    if kept < len(rows):
        payload["sessions"] = rows[:kept]
        wire.paged(payload, offset)
    return payload


def _cut_queued(item: dict[str, Any], share: int) -> dict[str, Any]:
    text = fit_text(item["text"], share)
    return item if text == item["text"] else {**item, "text": text, "truncated": True}


def _cut_message(item: dict[str, Any], room: int) -> dict[str, Any]:
    text = item["content"][0]["text"] if item.get("content") else ""
    rest = room - _size({**item, "content": [{"type": "text", "text": ""}], "truncated": True}) - 16
    return {**item, "content": [{"type": "text", "text": fit_text(text, max(0, rest))}], "truncated": True}


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
