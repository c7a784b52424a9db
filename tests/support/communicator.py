"""The protocol client over Channels' WebsocketCommunicator (in-process, real consumer)."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.testing import WebsocketCommunicator

from tests.support.client import ProtocolClient


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
    token: str | None = None,
    *,
    path: str = "/ws/gateway",
    headers: list[tuple[bytes, bytes]] | None = None,
    connect: bool = True,
    subscribe: bool = True,
    params: dict[str, Any] | None = None,
) -> Client:
    """Open a connection to the real ASGI application; by default connect and subscribe."""
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
