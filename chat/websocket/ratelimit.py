"""A token bucket: the per-connection request rate limit."""

from __future__ import annotations

import time

from django.conf import settings

from chat.protocol.errors import ProtocolError


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; one per request."""

    def __init__(self, rate: float | None = None, burst: float | None = None) -> None:
        self.rate = float(settings.GATEWAY_RATE_PER_SEC if rate is None else rate)
        self.burst = float(settings.GATEWAY_RATE_BURST if burst is None else burst)
        self.tokens = self.burst
        self.at = time.monotonic()

    def take(self) -> None:
        """Spend a token, or raise RATE_LIMITED with how long to wait."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            wait_ms = max(1, int((1 - self.tokens) / self.rate * 1000) + 1)
            raise ProtocolError(
                "RATE_LIMITED", "too many requests on this connection", retry_after_ms=wait_ms, retryable=True
            )
        self.tokens -= 1
