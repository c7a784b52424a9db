"""The gateway WebSocket consumer: frames in, frames out.

Parsing lives in `protocol`, the handshake in `handshake`, methods in `methods`,
what this connection may be told in `connection.ConnectionState`, state changes in
`sessions_app.lifecycle`. The consumer translates between those and the socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from typing import Any

from autobahn.exception import Disconnected
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from gatewayproject import logs
from sessions_app.tokens import authenticate_token, hash_token, still_authorized

from . import groups, handshake, methods, metrics, protocol, wire
from .connection import ConnectionState
from .db import db_read, db_write
from .protocol import ProtocolError, invalid
from .ratelimit import TokenBucket
from .runtime.gateway import runtime

log = logging.getLogger(__name__)


class GatewayConsumer(AsyncWebsocketConsumer):
    """One client connection speaking protocol v4."""

    async def connect(self) -> None:
        self.conn_id = uuid.uuid4().hex
        logs.conn_id.set(self.conn_id)
        self.state = ConnectionState()
        self.event_seq = 0
        self.token_hash: str | None = None
        self.bucket = TokenBucket()
        self.tasks: set[asyncio.Task[Any]] = set()
        await runtime.ensure_started()
        await self.accept()
        await self.send_event("connect.challenge", {"nonce": secrets.token_hex(16), "ts": wire.now_ms()})
        self._spawn(self._connect_deadline())

    async def disconnect(self, code: int) -> None:
        # Channels leaves `self.groups` after this returns.
        metrics.websocket_closed(code)
        for task in list(self.tasks):
            task.cancel()
        runtime.connections.discard(self)

    # --- inbound --------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None or text_data is None:
            await self._reply_error("invalid", invalid("binary frames are not supported"))
            return
        if len(text_data) > settings.GATEWAY_MAX_PAYLOAD or len(text_data.encode()) > settings.GATEWAY_MAX_PAYLOAD:
            await self.close(code=1009)  # daphne's own frame limit normally fires first
            return
        try:
            request = protocol.parse_frame(text_data)
        except ProtocolError as exc:
            if not self.state.authed:
                await self._reject_first_frame(getattr(exc, "request_id", None))
                return
            await self._reply_error(getattr(exc, "request_id", None) or "invalid", exc)
            return
        if not self.state.authed:
            if request.method != "connect":
                await self._reject_first_frame(request.id)
                return
            await self._handshake(request)
            return
        await self._dispatch(request)

    async def _dispatch(self, request: protocol.Request) -> None:
        try:
            self.bucket.take()
            if request.method == "connect":
                raise invalid("already connected", field="method")
            reply = await methods.dispatch(self, request.method, request.params)
        except ProtocolError as exc:
            await self._reply_error(request.id, exc)
            return
        except Exception:
            log.exception("handler %s failed", request.method)
            await self._reply_error(request.id, ProtocolError("INTERNAL", "internal error"))
            return
        if reply.wait is not None:
            self.state.held_acks += 1
            self._spawn(self._send_held(request.id, reply))
            return
        await self._send_reply(request.id, reply)

    async def _send_held(self, rid: str, reply: methods.Reply) -> None:
        assert reply.wait is not None
        try:
            final = await reply.wait()
        except Exception:
            log.exception("held ack failed")
            await self._reply_error(rid, ProtocolError("INTERNAL", "internal error"))
            return
        finally:
            self.state.held_acks -= 1
        await self._send_reply(rid, final)

    async def _send_reply(self, rid: str, reply: methods.Reply) -> None:
        if reply.error is not None:
            await self._send_frame(protocol.response_error(rid, reply.error, reply.payload))
        else:
            await self._send_frame(protocol.response_ok(rid, reply.payload or {}))

    # --- handshake ---------------------------------------------------------------------------------

    async def _reject_first_frame(self, rid: str | None) -> None:
        await self._reply_error(rid or "invalid", invalid("first request must be connect"))
        await self.close(code=handshake.CLOSE_POLICY)

    async def _handshake(self, request: protocol.Request) -> None:
        try:
            params = handshake.parse_connect(request.params)
        except handshake.HandshakeError as exc:
            await self._reply_error(request.id, exc.error)
            await self.close(code=exc.close_code)
            return
        identity = await self._identify(params)
        if identity is None:
            await self._reply_error(request.id, ProtocolError("UNAUTHORIZED", "authentication required"))
            await self.close(code=handshake.CLOSE_POLICY)
            return
        state = self.state
        state.user_id, state.username, staff = identity
        state.scopes = handshake.granted_scopes(params.requested_scopes, staff=staff)
        state.authed = True
        await self.join_group(groups.user_group(state.user_id))
        runtime.connections.add(self)
        hello = handshake.hello_ok(conn_id=self.conn_id, scopes=state.scopes, username=state.username,
                                   methods=list(methods.METHODS))
        await self._send_frame(protocol.response_ok(request.id, hello))
        self._spawn(self._tick_loop())

    async def _identify(self, params: handshake.ConnectParams) -> tuple[int, str, bool] | None:
        if params.has_token:
            user = await db_write(authenticate_token, params.token)
            self.token_hash = hash_token(params.token) if params.token is not None else None
        else:
            user = await db_read(_scope_user, self.scope)
        if user is None:
            return None
        return int(user.pk), user.get_username(), bool(getattr(user, "is_staff", False))

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(settings.GATEWAY_CONNECT_TIMEOUT_MS / 1000)
        if not self.state.authed:
            await self.close(code=handshake.CLOSE_POLICY)

    async def join_group(self, group: str) -> None:
        """Join a group for the rest of the connection (Channels leaves `self.groups` on disconnect)."""
        if group not in self.groups:
            self.groups.append(group)
            await self.channel_layer.group_add(group, self.channel_name)

    # --- outbound: layer events -----------------------------------------------------------------------

    async def gateway_chat(self, message: dict[str, Any]) -> None:
        """A run event from the layer."""
        state = self.state
        if state.authed and state.may_see(int(message["owner"]), via_operators=message.get("via") == "operators"):
            payload = message["payload"]
            if state.admit_chat(int(message["run"]), payload):
                await self.send_event("chat", payload)

    async def gateway_session(self, message: dict[str, Any]) -> None:
        """A sessions.changed from the layer."""
        state = self.state
        if state.authed and state.may_see(int(message["owner"]), via_operators=message.get("via") == "operators"):
            payload = message["payload"]
            if state.admit_row(int(message["session"]), payload):
                await self.send_event("sessions.changed", payload)

    # --- sending ----------------------------------------------------------------------------------------

    async def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        for name, payload in events:
            await self.send_event(name, payload)

    async def send_event(self, name: str, payload: dict[str, Any]) -> None:
        self.event_seq += 1
        await self._send_frame(protocol.event_frame(name, payload, self.event_seq))

    async def send_shutdown(self, reason: str) -> None:
        await self.send_event("shutdown", {"reason": reason})

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        try:
            await self.send(text_data=json.dumps(frame, separators=(",", ":")))
        except Disconnected:
            # The client closed while an event was on its way: its disconnect follows, and
            # a traceback here would only say that a peer went away.
            log.debug("frame not sent: the client is gone")

    async def _reply_error(self, rid: str, exc: ProtocolError) -> None:
        await self._send_frame(protocol.response_error(rid, exc.to_error()))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.GATEWAY_TICK_INTERVAL_MS / 1000)
            # A revoked token or a deactivated user ends open connections too, within a tick.
            try:
                authorized = await db_read(still_authorized, self.state.user_id, self.token_hash)
            except Exception:
                log.warning("authorization re-check failed; trying again next tick", exc_info=True)
                authorized = True
            if not authorized:
                await self.close(code=handshake.CLOSE_POLICY)
                return
            await self.send_event("tick", {"ts": wire.now_ms()})

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
