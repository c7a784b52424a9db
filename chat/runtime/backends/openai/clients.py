"""The SDK clients: one per event loop and endpoint, reused across runs."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

import openai

from chat.runtime.backends.openai.settings import AgentSettings

_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str, int], openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def client_for(settings: AgentSettings, api_key: str) -> openai.AsyncOpenAI:
    """A client per event loop and endpoint, reused across runs.

    Building one blocks the loop for ~20 ms (TLS setup), and a shared pool keeps
    connections to a hosted API warm. Runs never share a connection at once, and a
    run stopped early closes its connection instead of returning it to the pool.
    """
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (settings.base_url, api_key, settings.connect_timeout_ms)
    client = clients.get(key)
    if client is None or client.is_closed():
        client = clients[key] = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=settings.base_url,
            # Retries and read timeouts are ours: the SDK's would retry after text was
            # shown and could not tell a slow first token from a stalled stream.
            max_retries=0,
            timeout=openai.Timeout(None, connect=settings.connect_timeout_ms / 1000),
        )
    return client


async def close_clients() -> None:
    """Close this event loop's cached clients and their idle pooled connections (shutdown, tests)."""
    clients = _CLIENTS.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        with contextlib.suppress(Exception):
            await client.close()
