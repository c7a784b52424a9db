"""The connection to one MCP server: stdio under the leash, or streamable HTTP; both report their end.

A stdio server runs under ``leash.py`` (see there), so it cannot outlive the gateway, and reports
its pid through a pidfile (`Pidfile`). Either transport's read stream tells the session when the
server's side ends (the server exited, stdout closed, the HTTP stream gone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import httpx2
from mcp import StdioServerParameters
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from chat.runtime.tools import leash
from chat.runtime.tools.results import ToolServerError

logger = logging.getLogger(__name__)

HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)

Transport = contextlib.AbstractAsyncContextManager[TransportStreams]


def stdio(name: str, config: dict[str, Any], pidfile: Pidfile, on_end: Callable[[], None]) -> Transport:
    """The server's command under the leash, which writes its pid to `pidfile`."""
    env = dict(config.get("env") or {})
    _check_command(name, config, env.get("PATH", os.environ.get("PATH", os.defpath)))
    env[leash.PARENT_ENV] = str(os.getpid())
    env[leash.PIDFILE_ENV] = pidfile.path
    leashed = leash.command_line([config["command"], *config.get("args", [])])
    params = StdioServerParameters(
        command=leashed[0],
        args=leashed[1:],
        env=env,
        cwd=config.get("cwd"),
    )
    return _watched(stdio_client(params), on_end)


async def http(config: dict[str, Any], stack: AsyncExitStack, on_end: Callable[[], None]) -> Transport:
    """A streamable HTTP connection; its HTTP client closes with `stack`."""
    client = await stack.enter_async_context(
        httpx2.AsyncClient(headers=config.get("headers") or None, timeout=HTTP_TIMEOUT)
    )
    return _watched(streamable_http_client(config["url"], http_client=client), on_end)


def _check_command(name: str, config: dict[str, Any], path: str) -> None:
    """A missing command is named here; past the launcher's exec it would only be a closed connection."""
    command = config["command"]
    if os.sep in command:
        found = os.access(os.path.join(config.get("cwd") or os.getcwd(), command), os.X_OK)
    else:
        found = shutil.which(command, path=path) is not None
    if not found:
        raise ToolServerError(f"MCP server {name!r} could not start: command {command!r} not found")


class Pidfile:
    """Where the leash reports the server's pid (``leash.PIDFILE_ENV``): read once, removed after."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="agentgate-mcp-", suffix=".pid")
        os.close(fd)
        self._removed = False

    def read(self, name: str) -> int | None:
        """The pid the launcher wrote (None, logged, if it wrote none); the file is removed."""
        try:
            return int(Path(self.path).read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            logger.warning("MCP server %r: the launcher did not report a pid", name)
            return None
        finally:
            self.remove()

    def remove(self) -> None:
        # once only: after its removal the name may be another session's new pidfile
        if not self._removed:
            self._removed = True
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class _WatchedReadStream:
    """The transport's read stream, reporting its end (the server exited or the connection dropped)."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:  # e.g. `last_context` of the HTTP transport's stream
        return getattr(self._inner, name)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None


@asynccontextmanager
async def _watched(inner: Transport, on_end: Callable[[], None]) -> AsyncIterator[TransportStreams]:
    async with inner as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream
