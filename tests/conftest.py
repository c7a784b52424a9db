"""Shared fixtures: users, tokens, a protocol-speaking WebSocket client, runtime reset."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from chat.runtime.manager import run_manager
from sessions_app.tokens import issue_token
from tests.protocol_client import ProtocolClient


@pytest.fixture(autouse=True)
async def _fresh_runtime() -> AsyncIterator[None]:
    """Each test gets a fresh channel layer and run manager bound to its own loop."""
    channel_layers.backends.clear()
    yield
    await run_manager.stop()
    channel_layers.backends.clear()


class Client(ProtocolClient):
    """The protocol client over Channels' WebsocketCommunicator."""

    def __init__(self, comm: WebsocketCommunicator) -> None:
        super().__init__()
        self.comm = comm

    async def _receive(self, timeout: float) -> str | None:
        # Not receive_output(): its timeout cancels the application.
        if self.comm.future.done() and self.comm.output_queue.empty():
            self.comm.future.result()  # raise the app's exception, if any
            self.closed = self.closed or 1006
            return None
        message = await asyncio.wait_for(self.comm.output_queue.get(), timeout)
        if message["type"] == "websocket.close":
            self.closed = message.get("code", 1000)
            return None
        text: str = message["text"]
        return text

    async def send_raw(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

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
