"""The frame envelope (§1): a client frame parsed, responses and events made, JSON encoded once, the
protocol's times.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chat.protocol.errors import ProtocolError, invalid

PROTOCOL_VERSION = 4


EVENTS = [
    "connect.challenge",
    "chat",
    "agent",
    "sessions.changed",
    "plugin.approval.requested",
    "plugin.approval.resolved",
    "tick",
    "shutdown",
]


FRAME_KEYS = {"type", "id", "method", "params"}
_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(value: Any) -> str:
    """Compact JSON, as every frame and event payload is sent: UTF-8 text, not ASCII escapes
    (a reply in Chinese is a third the size); a lone surrogate, which UTF-8 cannot carry,
    is escaped instead, as JSON allows (then the whole value is)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii() and _SURROGATE.search(text):
        return json.dumps(value, separators=(",", ":"))
    return text


@dataclass
class Request:
    id: str
    method: str
    params: dict[str, Any]


def parse_frame(text: str) -> Request:
    """Parse one client frame; raise ProtocolError with `.request_id` set when it was readable."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _frame_error("frame is not valid JSON", None) from exc
    if not isinstance(data, dict):
        raise _frame_error("frame must be a JSON object", None)
    raw_id = data.get("id")
    rid = raw_id if isinstance(raw_id, str) and 1 <= len(raw_id) <= 128 else None
    extra = set(data) - FRAME_KEYS
    if extra:
        raise _frame_error(f"unknown frame keys: {', '.join(sorted(extra))}", rid, field=sorted(extra)[0])
    if data.get("type") != "req":
        raise _frame_error("frame type must be 'req'", rid, field="type")
    if rid is None:
        raise _frame_error("id must be a string of 1..128 chars", None, field="id")
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise _frame_error("method must be a non-empty string", rid, field="method")
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _frame_error("params must be an object", rid, field="params")
    return Request(rid, method, params)


def _frame_error(message: str, rid: str | None, **details: Any) -> ProtocolError:
    err = invalid(message, **details)
    err.request_id = rid  # type: ignore[attr-defined]
    return err


def response_ok(rid: str, payload: dict[str, Any] | list[Any]) -> dict[str, Any]:
    return {"type": "res", "id": rid, "ok": True, "payload": payload}


def response_error(
    rid: str, error: dict[str, Any], payload: dict[str, Any] | list[Any] | None = None
) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "res", "id": rid, "ok": False, "error": error}
    if payload is not None:
        frame["payload"] = payload
    return frame


def event_frame(name: str, payload: dict[str, Any], seq: int) -> dict[str, Any]:
    return {"type": "event", "event": name, "payload": payload, "seq": seq}


def event_frame_json(name: str, payload_json: str, seq: int) -> str:
    """`event_frame` as text, around a payload already encoded (`name` is one of ours: no escaping needed)."""
    return f'{{"type":"event","event":"{name}","payload":{payload_json},"seq":{seq}}}'


def ms(value: datetime | None) -> int | None:
    """Epoch milliseconds (the protocol's time format), or None."""
    return None if value is None else int(value.timestamp() * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)
