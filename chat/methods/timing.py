"""Method calls timed and counted, with `chat.send`'s ack status (the handlers' call wrapper)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from chat.base.availability import Unavailable
from chat.base.metrics import CHAT_SEND_ACKS, CHAT_SEND_SECONDS, METHOD_CALLS, METHOD_SECONDS
from chat.protocol.frames import ProtocolError

ACK_METHODS = ("chat.send", "sessions.steer")


def _count_ack(method: str, reply: Any) -> None:
    payload = reply.payload if isinstance(reply.payload, dict) else {}
    status = payload.get("status") or ("error" if reply.error is not None else "ok")
    CHAT_SEND_ACKS.labels(method, str(status)).inc()


async def call_handler(method: str, handler: Callable[..., Awaitable[Any]], conn: Any, params: dict[str, Any]) -> Any:
    """Invoke a method handler, metering its latency and outcome (and chat.send's ack status)."""
    started = time.perf_counter()
    acks = method in ACK_METHODS
    try:
        reply = await handler(conn, params)
    except ProtocolError as exc:
        METHOD_CALLS.labels(method, exc.code.lower()).inc()
        if acks:
            CHAT_SEND_ACKS.labels(method, exc.code.lower()).inc()
        raise
    except Unavailable:  # answered UNAVAILABLE (chat.websocket.consumer), not a fault
        METHOD_CALLS.labels(method, "unavailable").inc()
        if acks:
            CHAT_SEND_ACKS.labels(method, "unavailable").inc()
        raise
    except Exception:
        METHOD_CALLS.labels(method, "internal").inc()
        if acks:
            CHAT_SEND_ACKS.labels(method, "internal").inc()
        raise
    finally:
        seconds = time.perf_counter() - started
        METHOD_SECONDS.labels(method).observe(seconds)
        if acks:
            CHAT_SEND_SECONDS.labels(method).observe(seconds)
    METHOD_CALLS.labels(method, "ok" if reply.error is None else "error").inc()
    if not acks:
        return reply
    if reply.wait is None:
        _count_ack(method, reply)
        return reply
    inner = reply.wait

    async def wait() -> Any:
        final = await inner()
        _count_ack(method, final)
        return final

    return dataclasses.replace(reply, wait=wait)
