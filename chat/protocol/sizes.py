"""Frame budgets: no frame larger than `maxPayload` (text cut to fit, history and list pages fitted to one frame)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

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
        paged(payload, offset)
    return payload


def _cut_queued(item: dict[str, Any], share: int) -> dict[str, Any]:
    text = fit_text(item["text"], share)
    return item if text == item["text"] else {**item, "text": text, "truncated": True}


def _cut_message(item: dict[str, Any], room: int) -> dict[str, Any]:
    text = item["content"][0]["text"] if item.get("content") else ""
    rest = room - _size({**item, "content": [{"type": "text", "text": ""}], "truncated": True}) - 16
    return {**item, "content": [{"type": "text", "text": fit_text(text, max(0, rest))}], "truncated": True}


def paged(payload: dict[str, Any], offset: int) -> dict[str, Any]:
    """Set a list page's `count`, `hasMore` and `nextOffset` from the rows it holds."""
    count = len(payload["sessions"])
    has_more = offset + count < payload["totalCount"]
    payload.update({"count": count, "hasMore": has_more, "nextOffset": offset + count if has_more else None})
    return payload
