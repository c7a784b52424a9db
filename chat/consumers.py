"""The gateway WebSocket consumer: handshake, request dispatch, event delivery and repair.

The consumer stays thin: parsing lives in `protocol`, methods in `methods`, state
changes in `sessions_app.lifecycle`. What it owns is per-connection delivery
state, so that each run's events reach the client in `seq` order with exactly
one terminal, rows never go backwards, and whatever the channel layer dropped is
repaired from the database within GATEWAY_REPAIR_SECONDS (§9).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from chat.db import db_sync_to_async
from sessions_app.models import TERMINAL_STATES
from sessions_app.tokens import authenticate_token, hash_token, still_authorized

from . import groups, methods, protocol
from .protocol import ProtocolError, invalid
from .repair import Position, Scanner, Snapshot
from .repair import repair as repair_pass
from .runtime.manager import run_manager

log = logging.getLogger(__name__)
TERMINAL_CHAT_STATES = ("final", "error", "aborted")
MAX_TRACKED_RUNS = 2000
MAX_TRACKED_ROWS = 5000


@dataclass
class RunView:
    """What this connection has delivered of one run."""

    run_id: str
    session_key: str
    session_id: str
    seq: int = 0
    terminal: bool = False


class GatewayConsumer(AsyncWebsocketConsumer):
    """One client connection speaking protocol v4."""

    user_id: int
    is_admin: bool

    async def connect(self) -> None:
        self.conn_id = uuid.uuid4().hex
        self.authed = False
        self.user_id = 0
        self.username = ""
        self.is_admin = False
        self.scopes: list[str] = []
        self.event_seq = 0
        self.subscribed = False
        self.subscribed_all = False
        self.runs: OrderedDict[int, RunView] = OrderedDict()
        self.rows: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.connected_at = timezone.now()
        self.held_acks = 0
        self.token_hash: str | None = None
        self.tokens = float(settings.GATEWAY_RATE_BURST)
        self.tokens_at = time.monotonic()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.groups_joined: list[str] = []
        await run_manager.ensure_started()
        await self.accept()
        await self.send_event("connect.challenge", {"nonce": secrets.token_hex(16), "ts": protocol.now_ms()})
        self._spawn(self._connect_deadline())

    async def disconnect(self, code: int) -> None:
        for task in list(self.tasks):
            task.cancel()
        run_manager.consumers.discard(self)
        for group in self.groups_joined:
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group, self.channel_name)

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
            if not self.authed:
                await self._reject_first_frame(getattr(exc, "request_id", None))
                return
            await self._reply_error(getattr(exc, "request_id", None) or "invalid", exc)
            return
        if not self.authed:
            if request.method != "connect":
                await self._reject_first_frame(request.id)
                return
            await self._handshake(request)
            return
        await self._dispatch(request)

    async def _dispatch(self, request: protocol.Request) -> None:
        try:
            self._take_token()
            if request.method == "connect":
                raise invalid("already connected", field="method")
            handler = methods.HANDLERS.get(request.method)
            if handler is None:
                raise invalid(f"unknown method: {request.method}", code="UNKNOWN_METHOD", field="method")
            scope = protocol.METHOD_SCOPES[request.method]
            if scope not in self.scopes:
                raise ProtocolError("FORBIDDEN", f"{request.method} needs scope {scope}")
            reply = await handler(self, request.params)
        except ProtocolError as exc:
            await self._reply_error(request.id, exc)
            return
        except Exception:
            log.exception("handler %s failed", request.method)
            await self._reply_error(request.id, ProtocolError("INTERNAL", "internal error"))
            return
        if reply.wait is not None:
            self.held_acks += 1
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
            self.held_acks -= 1
        await self._send_reply(rid, final)

    async def _send_reply(self, rid: str, reply: methods.Reply) -> None:
        if reply.error is not None:
            await self._send_frame(protocol.response_error(rid, reply.error, reply.payload))
        else:
            await self._send_frame(protocol.response_ok(rid, reply.payload or {}))

    def _take_token(self) -> None:
        now = time.monotonic()
        rate = settings.GATEWAY_RATE_PER_SEC
        self.tokens = min(float(settings.GATEWAY_RATE_BURST), self.tokens + (now - self.tokens_at) * rate)
        self.tokens_at = now
        if self.tokens < 1:
            wait_ms = max(1, int((1 - self.tokens) / rate * 1000) + 1)
            raise ProtocolError("RATE_LIMITED", "too many requests on this connection", retry_after_ms=wait_ms,
                                retryable=True)
        self.tokens -= 1

    # --- handshake ---------------------------------------------------------------------------------

    async def _reject_first_frame(self, rid: str | None) -> None:
        await self._reply_error(rid or "invalid", invalid("first request must be connect"))
        await self.close(code=4008)

    async def _handshake(self, request: protocol.Request) -> None:
        params = request.params
        try:
            lo = protocol.get_int(params, "minProtocol", lo=0, hi=1_000_000, default=None)
            hi = protocol.get_int(params, "maxProtocol", lo=0, hi=1_000_000, default=None)
            if lo is None or hi is None:
                raise invalid("minProtocol and maxProtocol are required",
                              field="minProtocol" if lo is None else "maxProtocol")
            client = params.get("client")
            if not isinstance(client, dict) or not isinstance(client.get("id"), str) or not client["id"]:
                raise invalid("client.id is required", field="client.id")
            role = params.get("role", "operator")
            if role != "operator":
                raise invalid("role must be 'operator'", field="role")
        except ProtocolError as exc:
            await self._reply_error(request.id, exc)
            await self.close(code=4008)
            return
        if not (lo <= protocol.PROTOCOL_VERSION <= hi):
            err = invalid("protocol version mismatch", code="PROTOCOL_MISMATCH",
                          expectedProtocol=protocol.PROTOCOL_VERSION)
            await self._reply_error(request.id, err)
            await self.close(code=4002)
            return
        auth = params.get("auth") if isinstance(params.get("auth"), dict) else {}
        identity = await self._identify(auth.get("token") if auth else None)
        if identity is None:
            await self._reply_error(request.id, ProtocolError("UNAUTHORIZED", "authentication required"))
            await self.close(code=4008)
            return
        self.user_id, self.username, staff = identity
        allowed = ["operator.read", "operator.write"] + (["operator.admin"] if staff else [])
        requested = params.get("scopes")
        if isinstance(requested, list) and requested:
            self.scopes = [s for s in allowed if s in requested]
        else:
            self.scopes = allowed
        self.is_admin = "operator.admin" in self.scopes
        self.authed = True
        for group in (groups.user_group(self.user_id),):
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        run_manager.consumers.add(self)
        await self._send_frame(protocol.response_ok(request.id, self._hello()))
        self._spawn(self._tick_loop())

    async def _identify(self, token: Any) -> tuple[int, str, bool] | None:
        if token is not None:
            user = await db_sync_to_async(authenticate_token)(token if isinstance(token, str) else None)
            self.token_hash = hash_token(token) if isinstance(token, str) else None
        else:
            user = await db_sync_to_async(_scope_user)(self.scope)
        if user is None:
            return None
        return int(user.pk), user.get_username(), bool(getattr(user, "is_staff", False))

    def _hello(self) -> dict[str, Any]:
        return {
            "type": "hello-ok",
            "protocol": protocol.PROTOCOL_VERSION,
            "server": {"version": settings.GATEWAY_VERSION, "connId": self.conn_id},
            "features": {"methods": protocol.METHODS, "events": protocol.EVENTS},
            "snapshot": {"sessionDefaults": {"defaultAgentId": "main", "mainKey": "main",
                                             "mainSessionKey": "agent:main:main"}},
            "auth": {"role": "operator", "scopes": self.scopes, "user": self.username},
            "policy": {"maxPayload": settings.GATEWAY_MAX_PAYLOAD,
                       "maxBufferedBytes": settings.GATEWAY_MAX_BUFFERED_BYTES,
                       "tickIntervalMs": settings.GATEWAY_TICK_INTERVAL_MS,
                       "maxMessageChars": settings.GATEWAY_MAX_MESSAGE_CHARS,
                       "sessionKeyNamePattern": protocol.KEY_NAME_RE.pattern,
                       "agentIdPattern": protocol.AGENT_ID_RE.pattern},
        }

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(settings.GATEWAY_CONNECT_TIMEOUT_MS / 1000)
        if not self.authed:
            await self.close(code=4008)

    # --- connection state used by methods -----------------------------------------------------------

    def track_run(self, run_pk: int, *, terminal: bool, run_id: str, session_key: str, session_id: str) -> None:
        """Remember a run this client knows of; a terminal ack closes it for this connection."""
        view = self.runs.get(run_pk)
        if view is None:
            view = RunView(run_id, session_key, session_id)
            self._remember(run_pk, view)
        if terminal:
            view.terminal = True

    def set_subscription(self, subscribed: bool, *, all_sessions: bool = False) -> None:
        self.subscribed = subscribed
        self.subscribed_all = subscribed and all_sessions
        if self.subscribed_all and groups.OPERATORS not in self.groups_joined:
            self.groups_joined.append(groups.OPERATORS)
            self._spawn(self.channel_layer.group_add(groups.OPERATORS, self.channel_name))

    def _remember(self, run_pk: int, view: RunView) -> None:
        self.runs[run_pk] = view
        self.runs.move_to_end(run_pk)
        while len(self.runs) > MAX_TRACKED_RUNS:
            self.runs.popitem(last=False)

    # --- outbound: layer events -----------------------------------------------------------------------

    def _entitled(self, message: dict[str, Any]) -> bool:
        """Own sessions come through the user group; others' only to admins subscribed to all."""
        own = int(message["owner"]) == self.user_id
        if message.get("via") == "operators":
            return not own and self.subscribed_all and self.is_admin
        return own

    async def gateway_chat(self, message: dict[str, Any]) -> None:
        """A run event from the layer: deliver in seq order, one terminal, nothing after it."""
        if not self.authed or not self._entitled(message):
            return
        await self._deliver_chat(int(message["run"]), message["payload"])

    async def _deliver_chat(self, run_pk: int, payload: dict[str, Any]) -> None:
        view = self.runs.get(run_pk)
        seq = int(payload.get("seq", 0))
        if view is None:
            view = RunView(payload["runId"], payload["sessionKey"], payload["sessionId"])
            self._remember(run_pk, view)
        self.runs.move_to_end(run_pk)
        if view.terminal or seq <= view.seq:
            return
        view.seq = seq
        view.terminal = payload.get("state") in TERMINAL_CHAT_STATES
        await self.send_event("chat", payload)

    async def gateway_session(self, message: dict[str, Any]) -> None:
        """A sessions.changed from the layer: subscribed connections only, never an older row."""
        if not self.authed or not self.subscribed or not self._entitled(message):
            return
        await self._deliver_row(int(message["session"]), message["payload"])

    async def _deliver_row(self, session_pk: int, payload: dict[str, Any]) -> None:
        row = payload["session"]
        known = self.rows.get(session_pk)
        if known is not None and (row["version"] < known["version"] or known.get("deleted")):
            return
        self.rows[session_pk] = row
        self.rows.move_to_end(session_pk)
        while len(self.rows) > MAX_TRACKED_ROWS:
            self.rows.popitem(last=False)
        await self.send_event("sessions.changed", payload)

    # --- repair (§9): the run manager runs one pass for all connections of the process ---------------

    def open_run_pks(self) -> list[int]:
        return [pk for pk, view in self.runs.items() if not view.terminal]

    def _may_see(self, owner_id: int) -> bool:
        return owner_id == self.user_id or (self.subscribed_all and self.is_admin)

    async def repair(self) -> None:
        """Deliver, from the database, what this connection missed (one pass, now)."""
        # A one-off scan from this connection's start, apart from the process's scan positions.
        await repair_pass([self], Scanner(Position(self.connected_at), Position(self.connected_at)))

    async def apply_repair(self, snap: Snapshot) -> None:
        """Send this connection's share of a repair snapshot; the filters drop what it had."""
        for pk, ended in snap.ended.items():
            # not runs that ended before this connection existed: they are not its news
            if ended.ended_at >= self.connected_at and self._may_see(ended.owner_id):
                await self._deliver_chat(pk, ended.payload)
        for pk in self.open_run_pks():
            view = self.runs.get(pk)
            if view is None or pk not in snap.asked:
                continue  # evicted, or opened after the snapshot was read: the next pass covers it
            stored = snap.runs.get(pk)
            if stored is None:
                # The run is gone with its deleted session: close it as aborted (delete).
                await self._deliver_chat(pk, {"runId": view.run_id, "sessionKey": view.session_key,
                                              "sessionId": view.session_id, "seq": view.seq + 1,
                                              "state": "aborted", "stopReason": "delete"})
            elif stored["state"] in TERMINAL_STATES:
                await self._deliver_chat(pk, stored["payload"])
        if not self.subscribed:
            return
        for session_pk, (owner_id, row) in snap.rows.items():
            known = self.rows.get(session_pk)
            if self._may_see(owner_id) and (known is None or row["version"] > known["version"]):
                await self._deliver_row(session_pk, {"sessionKey": row["key"], "reason": "resync",
                                                     "ts": protocol.now_ms(), "session": row})
        for session_pk in [pk for pk in self.rows if pk in snap.checked and pk not in snap.existing]:
            known = self.rows.get(session_pk)
            if known is not None and not known.get("deleted"):
                gone = {**known, "deleted": True, "version": known["version"] + 1}
                await self._deliver_row(session_pk, {"sessionKey": known["key"], "reason": "delete",
                                                     "ts": protocol.now_ms(), "session": gone})

    # --- sending ----------------------------------------------------------------------------------------

    async def send_event(self, name: str, payload: dict[str, Any]) -> None:
        self.event_seq += 1
        await self._send_frame(protocol.event_frame(name, payload, self.event_seq))

    async def send_shutdown(self, reason: str) -> None:
        await self.send_event("shutdown", {"reason": reason})

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(frame, separators=(",", ":")))

    async def _reply_error(self, rid: str, exc: ProtocolError) -> None:
        await self._send_frame(protocol.response_error(rid, exc.to_error()))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.GATEWAY_TICK_INTERVAL_MS / 1000)
            # A revoked token or a deactivated user ends open connections too, within a tick.
            try:
                authorized = await db_sync_to_async(still_authorized)(self.user_id, self.token_hash)
            except Exception:
                log.warning("authorization re-check failed; trying again next tick", exc_info=True)
                authorized = True
            if not authorized:
                await self.close(code=4008)
                return
            await self.send_event("tick", {"ts": protocol.now_ms()})

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
