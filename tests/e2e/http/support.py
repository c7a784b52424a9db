"""A live gateway for the HTTP API's tests: a `manage.py serve` process, users with keys, and the
clients people use against it (the official `openai` SDK, plain HTTP, a WebSocket client).

Usage (one server per module)::

    @pytest.fixture(scope="module")
    def gw(tmp_path_factory):
        gateway = start_gateway(tmp_path_factory.mktemp("http"), keys={"alice": ("alice", None)})
        yield gateway
        gateway.stop()

    gw.sdk("alice").chat.completions.create(model="main", messages=[...])
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.fake_openai import FakeOpenAI, Reply
from tests.support.servers import ServerHandle, WsClient, base_env, manage, start_server, ws_client

# label -> (username, scopes or None for the default scopes)
KeySpec = dict[str, tuple[str, list[str] | None]]
DEFAULT_KEYS: KeySpec = {"alice": ("alice", None), "bob": ("bob", None)}

# One process migrates and makes the keys (each Django start-up costs seconds on a loaded machine).
_MAKE_KEYS = """
import json
from django.core.management import call_command
from sessions_app.tokens import get_or_create_user, issue_token
call_command("migrate", interactive=False, verbosity=0)
spec = json.loads({spec!r})
out = {{}}
for label, (username, scopes) in spec.items():
    token, raw = issue_token(get_or_create_user(username, create=True), name=label)
    if scopes is not None:
        token.scopes = scopes
        token.save(update_fields=["scopes"])
    out[label] = raw
print("KEYS" + json.dumps(out))
"""


def make_keys(env: dict[str, str], spec: KeySpec) -> dict[str, str]:
    """The database migrated, users (created if missing) and one key each; label -> the raw key."""
    out = manage(env, "shell", "-c", _MAKE_KEYS.format(spec=json.dumps(spec))).stdout
    line = next(line for line in out.splitlines() if line.startswith("KEYS"))
    return dict(json.loads(line[4:]))


@dataclass
class Gateway:
    server: ServerHandle
    env: dict[str, str]
    keys: dict[str, str]

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def sdk(self, who: str = "alice", **kwargs: Any) -> openai.OpenAI:
        """The official client, as an application would make it (no retries: tests retry on purpose)."""
        return openai.OpenAI(base_url=self.base_url, api_key=self.keys[who], max_retries=0, timeout=30, **kwargs)

    def async_sdk(self, who: str = "alice", **kwargs: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.keys[who], max_retries=0, timeout=30, **kwargs)

    def http(self, who: str | None = "alice", **headers: str) -> httpx.Client:
        """A plain HTTP client for what the SDK hides (status lines, raw events, odd requests)."""
        auth = {"authorization": f"Bearer {self.keys[who]}"} if who else {}
        return httpx.Client(base_url=self.server.url, headers={**auth, **headers}, timeout=30)

    def async_http(self, who: str | None = "alice", **headers: str) -> httpx.AsyncClient:
        auth = {"authorization": f"Bearer {self.keys[who]}"} if who else {}
        return httpx.AsyncClient(base_url=self.server.url, headers={**auth, **headers}, timeout=30)

    @contextlib.asynccontextmanager
    async def ws(self, who: str = "alice", **kwargs: Any) -> AsyncIterator[WsClient]:
        """A protocol client over the WebSocket, with the same user's key."""
        async with ws_client(self.server, self.keys[who], **kwargs) as client:
            yield client

    def stop(self) -> None:
        self.server.stop()


def start_gateway(tmp: Path, *, keys: KeySpec | None = None, **env: str) -> Gateway:
    """A migrated database, users and keys, and a ready server with `env` on top of the fast timings."""
    prepared = base_env(tmp / "gateway.sqlite3", **env)
    made = make_keys(prepared, keys or DEFAULT_KEYS)
    server = start_server(env=prepared, log_dir=tmp)
    server.wait_ready()
    return Gateway(server, prepared, made)


def sse_lines(text: str) -> list[str]:
    """The non-empty lines of an event stream as sent (comments included)."""
    return [line for line in text.splitlines() if line]


def sse_data(text: str) -> list[Any]:
    """The `data:` payloads of an event stream, JSON decoded (`[DONE]` as the string)."""
    out: list[Any] = []
    for line in sse_lines(text):
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@contextlib.contextmanager
def model_server(default: Reply | None = None) -> Iterator[FakeOpenAI]:
    """The fake model server (tests/support/fake_openai.py) on a loop of its own thread, for a gateway
    process's `openai` agents to call while a test (sync or async) drives the gateway. `push` replies
    and read `requests` from the test as usual."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-model", daemon=True)
    thread.start()

    async def started() -> FakeOpenAI:
        fake = FakeOpenAI()  # made on its loop: its events belong there
        if default is not None:
            fake.default = default
        await fake.start()
        return fake

    fake = asyncio.run_coroutine_threadsafe(started(), loop).result(10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
