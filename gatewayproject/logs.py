"""Log lines an on-call can use: request, connection and run ids on every line, JSON on demand.

The ids live in context variables, so they follow the code that handles a request,
a WebSocket connection or a run (asyncio tasks and the ORM's worker threads copy the
context): `RequestIdMiddleware` sets the request id (and echoes it as X-Request-ID),
the consumer sets the connection id, the run manager the run id. `ContextFilter`
copies them onto every record; `JsonFormatter` writes one JSON object per line
(`LOG_FORMAT=json`).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("agentgate_request_id", default="")
conn_id: contextvars.ContextVar[str] = contextvars.ContextVar("agentgate_conn_id", default="")
run_id: contextvars.ContextVar[str] = contextvars.ContextVar("agentgate_run_id", default="")

CONTEXT_FIELDS = (("request_id", request_id), ("conn_id", conn_id), ("run_id", run_id))
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class ContextFilter(logging.Filter):
    """Put the current request, connection and run ids on the record (empty when unset)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in CONTEXT_FIELDS:
            if not getattr(record, name, ""):
                setattr(record, name, var.get())
        return True


def _ids(record: logging.LogRecord) -> dict[str, str]:
    return {name: value for name, _ in CONTEXT_FIELDS if (value := getattr(record, name, ""))}


class PlainFormatter(logging.Formatter):
    """`time LEVEL logger: message [request_id=… conn_id=… run_id=…]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = _ids(record)
        if not ids:
            return text
        suffix = " ".join(f"{k}={v}" for k, v in ids.items())
        first, sep, rest = text.partition("\n")  # keep a traceback below the line
        return f"{first} [{suffix}]{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the ids, extras, exc_info."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_ids(record),
        }
        for key, value in record.__dict__.items():
            if (
                key not in _STANDARD
                and key not in doc
                and not key.startswith("_")
                and key
                not in (
                    "request_id",
                    "conn_id",
                    "run_id",
                    "request",
                    "server_time",
                    "status_code",
                )
            ):
                doc[key] = value if isinstance(value, str | int | float | bool) or value is None else str(value)
        status = getattr(record, "status_code", None)
        if status is not None:
            doc["status"] = status
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _request_id_for(request: HttpRequest) -> str:
    given = request.headers.get("X-Request-ID", "")
    return given if _SAFE_ID.match(given) else uuid.uuid4().hex


class RequestIdMiddleware:
    """A request id per HTTP request (the client's X-Request-ID if sane), echoed in the response."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        rid = _request_id_for(request)
        token = request_id.set(rid)
        try:
            response: HttpResponse = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-ID"] = rid
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        rid = _request_id_for(request)
        token = request_id.set(rid)
        try:
            response: HttpResponse = await self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-ID"] = rid
        return response


class AccessLog:
    """daphne's `action_logger`: one line per HTTP response and WebSocket event, on `chat.websocket.access`."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def __call__(self, protocol: Any, action: str, details: dict[str, Any]) -> None:
        client = details.get("client") or "-"
        path = details.get("path", "")
        if protocol == "http" and action == "complete":
            took = details.get("time_taken")
            ms = round(float(took) * 1000, 1) if took is not None else None
            self.logger.info(
                '%s "%s %s" %s %s %sms',
                client,
                details.get("method"),
                path,
                details.get("status"),
                details.get("size"),
                ms,
                extra={
                    "client": client,
                    "method": details.get("method"),
                    "path": path,
                    "status": details.get("status"),
                    "size": details.get("size"),
                    "duration_ms": ms,
                },
            )
        elif protocol == "websocket":
            self.logger.info(
                '%s "WS %s" %s', client, path, action, extra={"client": client, "path": path, "ws_event": action}
            )


def access_logger(target: str) -> AccessLog:
    """An access log writing to `target` ('-' = stdout, else a file), formatted per LOG_FORMAT."""
    logger = logging.getLogger("chat.websocket.access")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler: logging.Handler = (
        logging.StreamHandler(sys.stdout) if target == "-" else logging.FileHandler(target, encoding="utf-8")
    )
    handler.setFormatter(JsonFormatter() if settings.LOG_FORMAT == "json" else PlainFormatter())
    handler.addFilter(ContextFilter())
    logger.handlers = [handler]
    return AccessLog(logger)
