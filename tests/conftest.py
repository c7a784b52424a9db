"""Shared fixtures: users, tokens, a protocol-speaking WebSocket client, runtime reset."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from chat.runtime.manager import run_manager
from sessions_app.tokens import issue_token

_ids = itertools.count(1)


@pytest.fixture(autouse=True)
async def _fresh_runtime() -> AsyncIterator[None]:
    """Each test gets a fresh channel layer and run manager bound to its own loop."""
    channel_layers.backends.clear()
    yield
    await run_manager.stop()
    channel_layers.backends.clear()


class Client:
    """A protocol v4 client over Channels' WebsocketCommunicator."""

    def __init__(self, comm: WebsocketCommunicator) -> None:
        self.comm = comm
        self.events: list[dict[str, Any]] = []
        self.responses: dict[str, dict[str, Any]] = {}
        self.closed: int | None = None
        self.hello: dict[str, Any] | None = None

    async def _pump_one(self, timeout: float) -> dict[str, Any] | None:
        # Not receive_output(): its timeout cancels the application.
        if self.comm.future.done() and self.comm.output_queue.empty():
            self.comm.future.result()  # raise the app's exception, if any
            self.closed = self.closed or 1006
            return None
        message = await asyncio.wait_for(self.comm.output_queue.get(), timeout)
        if message["type"] == "websocket.close":
            self.closed = message.get("code", 1000)
            return None
        frame = json.loads(message["text"])
        if frame["type"] == "event":
            self.events.append(frame)
        elif frame["type"] == "res":
            self.responses[frame["id"]] = frame
        return frame

    async def send_raw(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

    async def send(self, method: str, params: dict[str, Any] | None = None, rid: str | None = None) -> str:
        rid = rid or f"r{next(_ids)}"
        frame: dict[str, Any] = {"type": "req", "id": rid, "method": method}
        if params is not None:
            frame["params"] = params
        await self.comm.send_to(text_data=json.dumps(frame))
        return rid

    async def response(self, rid: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while rid not in self.responses:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed is not None:
                raise AssertionError(f"no response to {rid}; closed={self.closed}")
            await self._pump_one(remaining)
        return self.responses.pop(rid)

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        return await self.response(await self.send(method, params), timeout)

    async def ok(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        res = await self.call(method, params, timeout)
        assert res["ok"], res
        return res["payload"]

    async def wait_event(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = 5.0, *, start: int = 0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        idx = start
        while True:
            while idx < len(self.events):
                if pred(self.events[idx]):
                    return self.events[idx]
                idx += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed is not None:
                raise AssertionError(f"event not seen; closed={self.closed}; events={self.events[-5:]}")
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                continue

    async def wait_terminal(self, run_id: str, timeout: float = 5.0) -> dict[str, Any]:
        ev = await self.wait_event(
            lambda e: e["event"] == "chat" and e["payload"]["runId"] == run_id
            and e["payload"]["state"] in ("final", "error", "aborted"),
            timeout,
        )
        return ev["payload"]

    async def drain(self, seconds: float) -> None:
        """Collect whatever arrives for `seconds`."""
        deadline = time.monotonic() + seconds
        while self.closed is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                return

    def chat_events(self, run_id: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["event"] == "chat" and e["payload"]["runId"] == run_id]

    async def close(self) -> None:
        await self.comm.disconnect()


async def open_client(
    token: str | None = None, *, path: str = "/ws/gateway", headers: list[tuple[bytes, bytes]] | None = None,
    connect: bool = True, subscribe: bool = True, params: dict[str, Any] | None = None,
) -> Client:
    from gatewayproject.asgi import application

    comm = WebsocketCommunicator(application, path, headers=headers or [])
    accepted, _ = await comm.connect()
    assert accepted
    client = Client(comm)
    challenge = await client._pump_one(2)
    assert challenge and challenge["event"] == "connect.challenge"
    if connect:
        p: dict[str, Any] = {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "test", "version": "1"}}
        if token is not None:
            p["auth"] = {"token": token}
        p.update(params or {})
        client.hello = await client.ok("connect", p)
        if subscribe:
            await client.ok("sessions.subscribe", {})
    return client


@pytest.fixture
def make_user(transactional_db: None) -> Callable[..., Any]:
    def make(username: str = "alice", *, staff: bool = False) -> tuple[Any, str]:
        user = get_user_model().objects.create_user(username=username, password="pw-12345678", is_staff=staff)
        _token, raw = issue_token(user)
        return user, raw

    return make


@pytest.fixture
async def alice(make_user: Callable[..., Any]) -> tuple[Any, str]:
    return await database_sync_to_async(make_user)("alice")


@pytest.fixture
async def client(alice: tuple[Any, str]) -> AsyncIterator[Client]:
    c = await open_client(alice[1])
    yield c
    await c.close()
