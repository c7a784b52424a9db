"""The methods, each declared with its scope; a request looked up, checked and timed; answers and
the lifecycle's errors in the protocol's words.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from chat.base.db import db_write
from chat.delivery.connection import ConnectionState
from chat.methods import timing
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.scopes import Scope
from sessions_app.lifecycle import LifecycleError


class Conn(Protocol):
    """What handlers need from the connection."""

    state: ConnectionState

    async def join_group(self, group: str) -> None: ...

    async def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None: ...


@dataclass
class Reply:
    """A response: ok payload, or error (with an optional payload, as the `error` ack has)."""

    payload: dict[str, Any] | list[Any] | None = None
    error: dict[str, Any] | None = None
    # A held answer (waitMs; agent's final), sent later. With a payload or error too, that is
    # answered first: two responses under one request id (agent, §12).
    wait: Callable[[], Awaitable[Reply]] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


Handler = Callable[[Conn, dict[str, Any]], Awaitable[Reply]]


@dataclass(frozen=True)
class Method:
    name: str
    scope: Scope
    handler: Handler
    # In `hello-ok.features.methods`: False for a method that only says a feature is not here.
    listed: bool = True


METHODS: dict[str, Method] = {}


def method(name: str, *, scope: Scope, listed: bool = True) -> Callable[[Handler], Handler]:
    """Register a handler for `name`, callable with `scope`; `listed: False` leaves it out of
    `hello-ok.features.methods` (it still answers when called)."""

    def register(fn: Handler) -> Handler:
        METHODS[name] = Method(name, scope, fn, listed)
        return fn

    return register


def listed_methods() -> list[str]:
    """The methods `hello-ok` announces: those that do what their name says."""
    return [m.name for m in METHODS.values() if m.listed]


def lookup(name: str, state: ConnectionState) -> Method:
    """The method a request names, if it exists and the connection has its scope."""
    found = METHODS.get(name)
    if found is None:
        raise invalid(f"unknown method: {name}", code="UNKNOWN_METHOD", field="method")
    if found.scope not in state.scopes:
        raise ProtocolError("FORBIDDEN", f"{name} needs scope {found.scope}")
    return found


async def dispatch(conn: Conn, name: str, params: dict[str, Any]) -> Reply:
    """Run the handler of a request, metered."""
    reply: Reply = await timing.call_handler(name, lookup(name, conn.state).handler, conn, params)
    return reply


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a lifecycle service on the writer, mapping domain errors to protocol errors."""
    try:
        return await db_write(fn, *args, urgent=True, **kwargs)  # a client waits for its answer
    except LifecycleError as exc:
        raise ProtocolError(exc.code, exc.message, **exc.details) from exc


def check_held(conn: Conn, field: str) -> None:
    """Refuse one more held answer over the connection's limit (nothing is stored)."""
    if conn.state.held_acks >= settings.GATEWAY_MAX_HELD_ACKS:
        raise ProtocolError(
            "RATE_LIMITED",
            f"at most {settings.GATEWAY_MAX_HELD_ACKS} answers may be held at once",
            field=field,
            reason="too-many-held-acks",
            retryable=True,
            retry_after_ms=1000,
        )
