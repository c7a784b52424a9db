"""The gateway WebSocket consumer: frames in, frames out.

Parsing lives in `protocol`, the handshake in `handshake`, methods in `methods`,
what this connection may be told in `connection.ConnectionState`, state changes in
`sessions_app.lifecycle`. The consumer translates between those and the socket.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
import uuid
from collections import deque
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from chat.base import metrics
from chat.base.availability import Unavailable
from chat.base.db import db_read, db_write
from chat.delivery import groups
from chat.delivery.connection import ConnectionState, HeldRun
from chat.delivery.messages import (
    OPERATORS_VIA,
    AccessMessage,
    ChatMessage,
    GatewayMessage,
    SessionMessage,
    ToolMessage,
    untyped,
)
from chat.methods import registry
from chat.protocol import errors, frames, run_events, scopes
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.frames import encode
from chat.runtime.gateway import runtime
from chat.websocket import access, handshake, outbound
from chat.websocket.ratelimit import TokenBucket
from gatewayproject import logs
from sessions_app.tokens import current_access, use_key

log = logging.getLogger(__name__)


class GatewayConsumer(AsyncWebsocketConsumer):
    """One client connection speaking protocol v4."""

    # No channel of its own: the process's one channel receives for all its connections
    # and hands each event to those that joined its group (`chat.delivery.hub`).
    channel_layer_alias = None  # type: ignore[assignment]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # However the consumer ends (a handler fault, a failed send, cancellation), it leaves
        # the registry and its groups: nothing keeps a dead connection alive.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()

    async def connect(self) -> None:
        self.conn_id = uuid.uuid4().hex
        logs.conn_id.set(self.conn_id)
        self.state = ConnectionState()
        self.outbound = outbound.Outbound(self, self.scope, self.release)
        self.event_seq = 0
        self.token_hash: str | None = None
        self.session_key: str | None = None  # the login session of a cookie socket
        self.key_scopes: frozenset[str] | None = None  # what an API key may grant (None: a login session)
        self.identity = access.Identity()
        self.bucket = TokenBucket()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.busy = False
        self.deferred: deque[GatewayMessage] = deque()
        try:
            await runtime.ensure_started()
        except Exception as exc:  # a process that starts while the database or Redis is away
            if isinstance(exc, Unavailable):
                metrics.UNAVAILABLE_ANSWERS.labels(exc.dependency).inc()
            else:  # not an outage: worth its traceback, but still a documented close, not a crash
                log.exception("the gateway runtime could not start")
            await self.accept()
            await self.close(code=handshake.CLOSE_UNAVAILABLE)
            return
        await self.accept()
        await self.send_event("connect.challenge", {"nonce": secrets.token_hex(16), "ts": frames.now_ms()})
        self._spawn(self._connect_deadline())

    async def disconnect(self, code: int) -> None:
        metrics.websocket_closed(code)
        await self.release()

    async def release(self) -> None:
        """Leave the registry and every group, stop this connection's tasks (idempotent)."""
        runtime.connections.discard(self)
        await runtime.hub.leave_all(self)
        current = asyncio.current_task()
        for task in list(getattr(self, "tasks", ())):
            if task is not current:
                task.cancel()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its hop to the one sync thread before every message.

        Channels closes stale database connections there (`aclose_old_connections`) for
        handlers that use the ORM on that thread. This consumer never does: all database
        work goes through `chat.base.db`, which looks after its own threads' connections. With
        every event of every connection queueing for that one thread, the hop was the
        gateway's main cost under fan-out.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        if not message["type"].startswith("websocket."):
            await handler(message)
            return
        # A client frame: events that arrive while it is handled wait for its answer, as a
        # consumer's own channel would have made them (no event of a run before the ack
        # that closes it for this connection, §4).
        self.busy = True
        try:
            await handler(message)
        finally:
            while self.deferred:
                await self.dispatch(untyped(self.deferred.popleft()))
            self.busy = False

    async def deliver(self, message: GatewayMessage) -> None:
        """An event from the process's channel (`chat.delivery.hub`): now, or after the frame being handled."""
        if self.busy:
            self.deferred.append(message)
        else:
            await self.dispatch(untyped(message))

    # --- inbound --------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None or text_data is None:
            if not self.state.authed:
                await self._reject_first_frame(None)  # §2: any other first frame closes 4008
                return
            await self._reply_rate_limited_or("invalid", invalid("binary frames are not supported"))
            return
        if len(text_data) > settings.GATEWAY_MAX_PAYLOAD or len(text_data.encode()) > settings.GATEWAY_MAX_PAYLOAD:
            await self.close(code=1009)  # daphne's own frame limit normally fires first
            return
        try:
            request = frames.parse_frame(text_data)
        except ProtocolError as exc:
            if not self.state.authed:
                await self._reject_first_frame(getattr(exc, "request_id", None))
                return
            await self._reply_rate_limited_or(getattr(exc, "request_id", None) or "invalid", exc)
            return
        if not self.state.authed:
            if request.method != "connect":
                await self._reject_first_frame(request.id)
                return
            await self._handshake(request)
            return
        await self._dispatch(request)

    async def _reply_rate_limited_or(self, rid: str, exc: ProtocolError) -> None:
        """Answer a frame that is not a request; it costs a token like any request."""
        try:
            self.bucket.take()
        except ProtocolError as limited:
            exc = limited
        await self._reply_error(rid, exc)

    async def _dispatch(self, request: frames.Request) -> None:
        try:
            self.bucket.take()
            if request.method == "connect":
                raise invalid("already connected", field="method")
            reply = await registry.dispatch(self, request.method, request.params)
        except ProtocolError as exc:
            await self._reply_error(request.id, exc)
            return
        except Unavailable as exc:  # an outage, not a fault: logged once by `availability`
            await self._reply_unavailable(request.id, exc)
            return
        except Exception:
            log.exception("handler %s failed", request.method)
            await self._reply_error(request.id, ProtocolError("INTERNAL", "internal error"))
            return
        if reply.wait is not None:
            if reply.payload is not None or reply.error is not None:
                await self._send_reply(request.id, reply)  # the first of two answers (agent)
            self.state.held_acks += 1
            self._spawn(self._send_held(request.id, reply))
            return
        await self._send_reply(request.id, reply)

    async def _send_held(self, rid: str, reply: registry.Reply) -> None:
        assert reply.wait is not None
        try:
            final = await reply.wait()
        except Unavailable as exc:
            await self._reply_unavailable(rid, exc)
            return
        except Exception:
            log.exception("held ack failed")
            await self._reply_error(rid, ProtocolError("INTERNAL", "internal error"))
            return
        finally:
            self.state.held_acks -= 1
        await self._send_reply(rid, final)

    async def _send_reply(self, rid: str, reply: registry.Reply) -> None:
        if reply.error is not None:
            await self._send_frame(frames.response_error(rid, reply.error, reply.payload))
        else:
            await self._send_frame(frames.response_ok(rid, reply.payload if reply.payload is not None else {}))

    # --- handshake ---------------------------------------------------------------------------------

    async def _reject_first_frame(self, rid: str | None) -> None:
        await self._reply_error(rid or "invalid", invalid("first request must be connect"))
        await self.close(code=handshake.CLOSE_POLICY)

    async def _handshake(self, request: frames.Request) -> None:
        try:
            params = handshake.parse_connect(request.params)
        except handshake.HandshakeError as exc:
            await self._reply_error(request.id, exc.error)
            await self.close(code=exc.close_code)
            return
        try:
            identity = await self._identify(params)
        except Unavailable as exc:
            # A clear answer and a documented close: the client reconnects after retryAfterMs.
            await self._reply_unavailable(request.id, exc)
            await self.close(code=handshake.CLOSE_UNAVAILABLE)
            return
        if identity is None:
            await self._reply_error(request.id, ProtocolError("UNAUTHORIZED", "authentication required"))
            await self.close(code=handshake.CLOSE_POLICY)
            return
        state = self.state
        if len(runtime.connections.of_user(identity[0])) >= settings.GATEWAY_MAX_CONNECTIONS_PER_USER:
            # one user cannot crowd out everyone else (per process)
            await self._reply_error(
                request.id,
                ProtocolError(
                    "RATE_LIMITED",
                    f"at most {settings.GATEWAY_MAX_CONNECTIONS_PER_USER} connections per user",
                    reason="too-many-connections",
                    retryable=True,
                    retry_after_ms=5000,
                ),
            )
            await self.close(code=handshake.CLOSE_TOO_MANY_CONNECTIONS)
            return
        state.user_id, state.username, staff = identity
        self.identity = access.Identity(self.token_hash, access.session_digest(self.session_key))
        state.scopes = handshake.granted_scopes(params.requested_scopes, staff=staff, key=self.key_scopes)
        state.caps = params.caps
        state.status_phases = run_events.status_phases(params.client_id)
        state.authed = True
        await self.join_group(groups.user_group(state.user_id))
        runtime.connections.add(self)
        hello = handshake.hello_ok(
            conn_id=self.conn_id, scopes=state.scopes, username=state.username, methods=registry.listed_methods()
        )
        await self._send_frame(frames.response_ok(request.id, hello))
        self._spawn(self._tick_loop())

    async def _identify(self, params: handshake.ConnectParams) -> tuple[int, str, bool] | None:
        """Who this is (user id, name, staff); a key's scopes cap what it is granted (`key_scopes`)."""
        if params.has_token:
            holder = await db_write(use_key, params.token, urgent=True)
            if holder is None:
                return None
            self.token_hash = holder.token_hash
            self.key_scopes = scopes.of_key(holder.scopes)
            return holder.user_id, holder.username, holder.is_staff
        user = await db_read(_scope_user, self.scope)
        if user is None:
            return None
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        return int(user.pk), user.get_username(), bool(getattr(user, "is_staff", False))

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(settings.GATEWAY_CONNECT_TIMEOUT_MS / 1000)
        if not self.state.authed:
            await self.close(code=handshake.CLOSE_POLICY)

    async def join_group(self, group: str) -> None:
        """Receive a group's events for the rest of the connection (left on disconnect)."""
        # a run found open by a read before it listened may have ended unheard (`first_sight`)
        self.state.listening_since = math.inf
        await runtime.hub.join(group, self)
        self.state.listening_since = time.monotonic()

    # --- revocation (chat.websocket.access) ---------------------------------------------------------------------

    async def gateway_access(self, message: AccessMessage) -> None:
        """Something this user's sockets relied on was revoked."""
        if not self.state.authed:
            return
        what = access.verdict(self.identity, message)
        if what == "close":
            await self.outbound.end(handshake.CLOSE_POLICY)
        elif what == "downgrade":
            await self._downgrade()

    async def _downgrade(self) -> None:
        """No longer staff: no admin scope, no view of other users' sessions."""
        state = self.state
        if not state.is_admin:
            return
        state.scopes = [s for s in state.scopes if s != scopes.Scope.ADMIN]
        if state.subscribed_all:
            state.set_subscription(True)
        await runtime.hub.leave(groups.OPERATORS, self)

    # --- outbound: layer events -----------------------------------------------------------------------

    async def gateway_chat(self, message: ChatMessage) -> None:
        """A run event from the layer (its payload already encoded: see `delivery.chat_message`)."""
        if not self._held(message):
            await self._chat(message)

    async def _chat(self, message: ChatMessage) -> None:
        state = self.state
        run_pk = int(message["run"])
        if (
            state.authed
            and state.may_see(int(message["owner"]), via_operators=message.get("via") == OPERATORS_VIA)
            and state.admit_chat(run_pk, message["payload"], written_at=message.get("at"))
        ):
            chat_json = state.chat_json(message["payload"], message["json"])
            if chat_json is not None:
                await self._send_event_json("chat", chat_json)
            # then its `agent` events (§12), per connection: what this one has had of the reply
            _chat, *followers = state.follow(run_pk, message["payload"], message.get("agent"))
            await self.send_events(followers)

    async def gateway_tool(self, message: ToolMessage) -> None:
        """A tool call's or approval's events (TOOLS.md §13.3, §13.5), to those entitled to them."""
        if not self._held(message):
            await self._tool(message)

    async def _tool(self, message: ToolMessage) -> None:
        state = self.state
        if state.authed and state.may_see(int(message["owner"]), via_operators=message.get("via") == OPERATORS_VIA):
            await self.send_events(state.tool_events(message))

    def _held(self, message: ChatMessage | ToolMessage) -> bool:
        """Whether a run event waits for its run as stored: the first event of a run this connection
        never heard of (`ConnectionState.first_heard`), and every event of that run behind it."""
        state = self.state
        run_pk = int(message["run"])
        held = state.held.get(run_pk)
        if held is not None:
            held.events.append(message)
            return True
        if (
            message["type"] != "gateway.chat"
            or not state.authed
            or not state.may_see(int(message["owner"]), via_operators=message.get("via") == OPERATORS_VIA)
            or not state.first_heard(run_pk, message["payload"], written_at=message.get("at"))
        ):
            return False
        state.held[run_pk] = HeldRun(message, [message])
        self._spawn(self._first_sight(run_pk))
        return True

    async def _first_sight(self, run_pk: int) -> None:
        """Settle a held run (one read per process, shared) and hand on what its events came to, in order."""
        state = self.state
        try:
            try:
                stored = await runtime.hub.first_sight.stored(run_pk, state.listening_since)
            except Exception:  # (the database away) followed, as before the check: repair ends it
                log.debug("a run first heard of could not be read", exc_info=True)
                stored = None
            state.settle(run_pk, stored)
            events = state.held[run_pk].events
            while events:
                if self.busy:
                    # after the answer to the frame being handled, as `deliver` would have had them
                    self.deferred.extend(events)
                    return
                message = events.pop(0)
                if message["type"] == "gateway.chat":
                    await self._chat(message)
                else:
                    await self._tool(message)
        except Exception:  # as the hub's delivery: a closing socket is no error of the process
            log.debug("delivery of a run first heard of failed", exc_info=True)
        finally:
            state.held.pop(run_pk, None)

    async def gateway_session(self, message: SessionMessage) -> None:
        """A sessions.changed from the layer (encoded: see `delivery.session_message`)."""
        state = self.state
        if (
            state.authed
            and state.may_see(int(message["owner"]), via_operators=message.get("via") == OPERATORS_VIA)
            and state.admit_encoded_row(message)
        ):
            await self._send_event_json("sessions.changed", message["json"])

    # --- sending ----------------------------------------------------------------------------------------

    async def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        for name, payload in events:
            await self.send_event(name, payload)

    async def send_event(self, name: str, payload: dict[str, Any]) -> None:
        await self._send_event_json(name, encode(payload))

    async def _send_event_json(self, name: str, payload_json: str) -> None:
        self.event_seq += 1
        await self.outbound.send(frames.event_frame_json(name, payload_json, self.event_seq))

    async def send_shutdown(self, reason: str) -> None:
        await self.send_event("shutdown", {"reason": reason})

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        # Within maxPayload and maxBufferedBytes, or the connection ends cleanly (chat.websocket.outbound).
        await self.outbound.send(encode(frame), response_id=frame["id"] if frame["type"] == "res" else None)

    async def _reply_error(self, rid: str, exc: ProtocolError) -> None:
        await self._send_frame(frames.response_error(rid, exc.to_error()))

    async def _reply_unavailable(self, rid: str, exc: Unavailable) -> None:
        metrics.UNAVAILABLE_ANSWERS.labels(exc.dependency).inc()
        await self._reply_error(rid, errors.unavailable(exc.dependency, retry_after_ms=exc.retry_after_ms))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.GATEWAY_TICK_INTERVAL_MS / 1000)
            # The backstop of chat.websocket.access: whatever was revoked ends (or narrows) the socket within a tick.
            try:
                now = await db_read(current_access, self.state.user_id, self.token_hash, self.session_key)
            except Unavailable:
                now = None  # the database is away (logged once): checked again next tick
            except Exception:
                log.warning("authorization re-check failed; trying again next tick", exc_info=True)
                now = None
            if now is not None and not now.valid:
                await self.outbound.end(handshake.CLOSE_POLICY)
                return
            if now is not None and not now.staff:
                await self._downgrade()
            await self.send_event("tick", {"ts": frames.now_ms()})
            if self.outbound.closing:
                return

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _scope_user(scope: Any) -> Any:
    user = scope.get("user")
    if user is None:
        return None
    # Resolve the lazy user here, on a worker thread.
    return user if getattr(user, "is_authenticated", False) and user.is_active else None
