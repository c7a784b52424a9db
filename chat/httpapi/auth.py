"""Who is calling: a per-user API key (`Authorization: Bearer …`), its scopes and its rate limit.

The key check is a read; recording its use (`last_used_at`) is a write done apart, at most once a
minute per key, so a request's check costs no write on its way. The rate limit is the WebSocket's
per-connection token bucket (PROTOCOL.md §10, GATEWAY_RATE_PER_SEC/BURST), kept per key.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from chat.base.db import db_read, db_write
from chat.httpapi.errors import ApiError
from chat.protocol.errors import ProtocolError
from chat.websocket.ratelimit import TokenBucket
from sessions_app import tokens
from sessions_app.models import KeyScope

log = logging.getLogger(__name__)
NOTE_USE_SECONDS = 60.0  # `last_used_at` is this fresh at worst
MAX_TRACKED_KEYS = 10_000  # buckets and use notes kept, least recently used forgotten first


@dataclass(frozen=True)
class Caller:
    """The user an API key acts as, and what the key may do."""

    user_id: int
    username: str
    token_id: int
    token_hash: str
    scopes: frozenset[str]
    is_staff: bool = False

    def may(self, scope: KeyScope) -> bool:
        return scope.value in self.scopes or KeyScope.ADMIN.value in self.scopes


class _Keys:
    """Per-key state of this process: rate buckets and when each key's use was last recorded."""

    def __init__(self) -> None:
        self.buckets: OrderedDict[int, TokenBucket] = OrderedDict()
        self.noted: OrderedDict[int, float] = OrderedDict()
        self.pending: set[asyncio.Task[None]] = set()

    def bucket(self, token_id: int) -> TokenBucket:
        bucket = self.buckets.pop(token_id, None) or TokenBucket()
        self.buckets[token_id] = bucket
        while len(self.buckets) > MAX_TRACKED_KEYS:
            self.buckets.popitem(last=False)
        return bucket

    def note_use(self, token_id: int) -> None:
        now = time.monotonic()
        last = self.noted.get(token_id)
        if last is not None and now - last < NOTE_USE_SECONDS:
            return
        self.noted[token_id] = now
        self.noted.move_to_end(token_id)
        while len(self.noted) > MAX_TRACKED_KEYS:
            self.noted.popitem(last=False)
        task = asyncio.ensure_future(_note_use(token_id))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)


async def _note_use(token_id: int) -> None:
    try:
        await db_write(tokens.note_use, token_id)
    except Exception as exc:  # a lost use note is harmless; the request goes on
        log.info("recording an API key's use failed: %s", exc)


keys = _Keys()


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    kind, _, value = authorization.strip().partition(" ")
    if kind.lower() != "bearer":
        return None
    return value.strip() or None


async def authenticate(authorization: str | None) -> Caller:
    """The caller of this `Authorization` header, or a 401 (the same for a wrong, revoked or missing key)."""
    raw = bearer(authorization)
    holder = await db_read(tokens.find_key, raw) if raw else None
    if holder is None:
        raise ApiError(
            401,
            "missing or invalid API key: send `Authorization: Bearer <key>`",
            code="invalid_api_key",
            headers={"www-authenticate": "Bearer"},
        )
    keys.note_use(holder.token_id)
    return Caller(holder.user_id, holder.username, holder.token_id, holder.token_hash, holder.scopes, holder.is_staff)


def require(caller: Caller, scope: KeyScope) -> None:
    """403 unless the key has `scope`."""
    if not caller.may(scope):
        raise ApiError(403, f"this API key lacks the `{scope.value}` scope", code="insufficient_scope")


def take_rate(caller: Caller) -> None:
    """Spend one request of the key's rate, or a 429 with `Retry-After`."""
    try:
        keys.bucket(caller.token_id).take()
    except ProtocolError as exc:
        wait_ms = int(getattr(exc, "retry_after_ms", None) or 1000)
        raise ApiError(
            429,
            "too many requests for this API key",
            code="rate_limited",
            headers={"retry-after": str(max(1, math.ceil(wait_ms / 1000))), "retry-after-ms": str(wait_ms)},
        ) from exc
