"""Error answers (§1): the error object every method and the handshake raise."""

from __future__ import annotations

from typing import Any

from chat.base import availability


class ProtocolError(Exception):
    """An error response: code, message and optional details (§1)."""

    def __init__(
        self,
        code: str,
        message: str,
        /,
        *,
        field: str | None = None,
        retry_after_ms: int | None = None,
        retryable: bool | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details)
        if field is not None:
            self.details["field"] = field
        self.retry_after_ms = retry_after_ms
        self.retryable = retryable

    def to_error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        if self.retryable is not None:
            err["retryable"] = self.retryable
        if self.retry_after_ms is not None:
            err["retryAfterMs"] = self.retry_after_ms
        return err


def invalid(message: str, /, *, field: str | None = None, **details: Any) -> ProtocolError:
    return ProtocolError("INVALID_REQUEST", message, field=field, **details)


def unavailable(dependency: str, *, retry_after_ms: int) -> ProtocolError:
    """A service the request needs is away (docs/protocol-notes.md): retry after `retry_after_ms`
    (a `chat.send` with the same idempotencyKey, which is safe whether or not it was stored)."""
    return ProtocolError(
        "UNAVAILABLE",
        f"the {availability.named(dependency)} is unavailable; try again shortly",
        reason=f"{dependency.replace('_', '-')}-unavailable",
        retryable=True,
        retry_after_ms=retry_after_ms,
    )
