"""Typed getters of request params: each refuses a bad value with INVALID_REQUEST naming its field (§10)."""

from __future__ import annotations

import re
from typing import Any

from chat.protocol.errors import invalid

MESSAGE_ID_RE = re.compile(r"[0-9]{1,19}")
RUN_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Control characters other than tab, LF and CR are stripped from messages.
CONTROL_RE = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
# setTimeout's largest delay, the bound OpenClaw's clients put on a wait
MAX_WAIT_MS = 2_147_483_647
# The largest count a client may ask for where more is simply cut to what is served (a page, a history,
# a byte budget): OpenClaw's clients put no bound on theirs (its ACP bridge asks for a million messages).
ANY_COUNT = 2**31 - 1


def get_str(
    params: dict[str, Any],
    name: str,
    *,
    required: bool = True,
    min_len: int = 1,
    max_len: int = 10_000,
    pattern: re.Pattern[str] | None = None,
) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise invalid(f"{name} is required", field=name)
        return None
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string", field=name)
    require_unicode(value, name)
    if not (min_len <= len(value) <= max_len):
        raise invalid(f"{name} must be {min_len}..{max_len} characters", field=name)
    if pattern is not None and not pattern.fullmatch(value):
        raise invalid(f"{name} has invalid characters", field=name)
    return value


def require_unicode(value: str, name: str) -> None:
    """Refuse a lone surrogate (JSON lets `"\\ud800"` through; UTF-8, the database and hashing do not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{name} must be valid Unicode text (no lone surrogates)", field=name) from exc


def get_message_id(params: dict[str, Any], name: str) -> int | None:
    """A message id: ASCII digits (or an integer) that fit a 64-bit primary key."""
    raw = params.get(name)
    if raw is None:
        return None
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not MESSAGE_ID_RE.fullmatch(text) or int(text) >= 2**63:
        raise invalid(f"{name} must be a message id", field=name)
    return int(text)


def get_int(params: dict[str, Any], name: str, *, lo: int, hi: int, default: int | None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer", field=name)
    if not (lo <= value <= hi):
        raise invalid(f"{name} must be between {lo} and {hi}", field=name)
    return value


def get_bool(params: dict[str, Any], name: str, *, default: bool = False) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", field=name)
    return value
