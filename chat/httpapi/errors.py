"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}` (HTTP-API.md §14.1)."""

from __future__ import annotations

import math
from typing import Any

from chat.protocol.errors import ProtocolError

# The `type` an OpenAI client expects for each status, when the raiser names none.
DEFAULT_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


# On an answer a client's automatic retry must not send again (the official SDKs honour it; they retry 409
# and 5xx by default, with no Idempotency-Key): the end of a run that already ran — an abort, a failure, a
# timeout — is not undone by running the request again.
NO_RETRY = {"x-should-retry": "false"}


class ApiError(Exception):
    """An answer that is an error: its status, OpenAI-shaped body and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,  # OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or DEFAULT_TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})  # more fields of the error object (a run's stopReason, say)

    def error_object(self) -> dict[str, Any]:
        """The inner object (`{"message", "type", "param", "code", ...}`), as streams send it too."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}

    def body(self) -> dict[str, Any]:
        return {"error": self.error_object()}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, code: str | None = None) -> ApiError:
    return ApiError(404, message, code=code)


# The gateway's error codes (PROTOCOL.md §1) as HTTP statuses.
PROTOCOL_STATUS = {
    "INVALID_REQUEST": 400,
    "UNKNOWN_METHOD": 400,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "RATE_LIMITED": 429,
    "UNAVAILABLE": 503,
}


def from_protocol(exc: ProtocolError, *, param: str | None = None) -> ApiError:
    """A gateway error (what admission and the lifecycle raise) in the HTTP API's words; `param`
    names the request field that the error's `field` stands for, when the caller knows it."""
    status = PROTOCOL_STATUS.get(exc.code, 500)
    headers: dict[str, str] = {}
    if exc.retry_after_ms is not None:
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after_ms / 1000)))
    code = str(exc.details.get("reason") or exc.code.lower())
    field = exc.details.get("field")
    return ApiError(status, exc.message, param=param or (str(field) if field else None), code=code, headers=headers)
