"""One supervised MCP client session: one agent's connection to one of its servers.

The session lives in an asyncio task of its own, which enters the SDK's ``Client`` (and with it the
transport's task groups) and exits it again: the SDK's context managers are never entered in one
task and left in another. Callers talk to a started session through its ``Client``; the SDK's
dispatcher serves any number of concurrent requests. Any connection loss (stdout closed, HTTP
stream gone) retires the session: the calls in flight fail with ``ToolServerError`` and the next
use starts the server again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp.types as mcp_types
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from chat.runtime.tools import transport
from chat.runtime.tools.config import ToolSpec
from chat.runtime.tools.results import ProgressGate, ToolOutcome, ToolServerError, describe, listed_spec, outcome

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0  # spawn + handshake
LIST_TIMEOUT_S = 30.0  # tools/list, all pages
MAX_LIST_PAGES = 100
MAX_GARBAGE_LOGS = 3  # unparseable lines from a server logged per session
CLIENT_INFO = mcp_types.Implementation(name="agentgate", version="0.1.0")

_HTTP_SESSION_GONE = "Session terminated"  # what the SDK's HTTP transport reports for a 404 on a session id


class ServerSession:
    """An agent's session with one MCP server, started in its own task (`task`) and supervised."""

    def __init__(
        self, agent_id: str, name: str, config: dict[str, Any], forget: Callable[[ServerSession], None]
    ) -> None:
        self.agent_id = agent_id
        self.name = name
        self.config = config
        self.stdio = "command" in config
        self.client: Client | None = None
        self.pid: int | None = None
        self.error: ToolServerError | None = None
        self.settled = asyncio.Event()  # started, or failed to
        self.ended = asyncio.Event()  # the session's task is over
        self.closing = False  # stopping, lost, or killed: no new calls
        self.tools: list[ToolSpec] | None = None
        self._forget = forget  # the pool's: the session is no longer its (agent, server)'s
        self._tools_generation = 0
        self._stop = asyncio.Event()
        self._pidfile: transport.Pidfile | None = None
        self._garbage = 0
        self.task = asyncio.create_task(self._run(), name=f"mcp-server {agent_id}/{name}")

    # -- lifecycle (all of it inside self.task) ---------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        timed_out = False
        try:
            with anyio.CancelScope() as scope:

                def startup_timeout() -> None:
                    nonlocal timed_out
                    if not self.settled.is_set():
                        timed_out = True
                        scope.cancel()

                timer = loop.call_later(STARTUP_TIMEOUT_S, startup_timeout)
                try:
                    async with AsyncExitStack() as stack:
                        client = await self._start(stack)
                        timer.cancel()
                        self._started(client)
                        async with anyio.create_task_group() as tg:
                            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                                tg.start_soon(self._listen, client)
                            await self._stop.wait()
                            tg.cancel_scope.cancel()
                finally:
                    timer.cancel()
            if timed_out:
                self._fail(ToolServerError(f"MCP server {self.name!r} did not start within {STARTUP_TIMEOUT_S:g} s"))
        except ToolServerError as exc:
            self._fail(exc)
        except Exception as exc:
            self._fail(ToolServerError(f"MCP server {self.name!r} could not start: {describe(exc)}"), exc)
        finally:
            self.closing = True
            self.client = None
            if self._pidfile is not None:
                self._pidfile.remove()
            self.settled.set()
            self.ended.set()
            self._forget(self)
            logger.info("MCP server %r of agent %r stopped", self.name, self.agent_id)

    async def _start(self, stack: AsyncExitStack) -> Client:
        """Connect and hand-shake; the connection and the client close with `stack`."""
        if self.stdio:
            self._pidfile = transport.Pidfile()
            streams = transport.stdio(self.name, self.config, self._pidfile, self._on_connection_end)
        else:
            streams = await transport.http(self.config, stack, self._on_connection_end)
        client = Client(streams, cache=None, message_handler=self._on_message, client_info=CLIENT_INFO)
        await stack.enter_async_context(client)
        return client

    def _started(self, client: Client) -> None:
        self.pid = self._pidfile.read(self.name) if self._pidfile is not None else None
        self.client = client
        self.settled.set()
        logger.info(
            "MCP server %r of agent %r started (%s, protocol %s%s)",
            self.name,
            self.agent_id,
            "stdio" if self.stdio else "HTTP",
            client.protocol_version,
            f", pid {self.pid}" if self.pid else "",
        )

    def _fail(self, error: ToolServerError, exc: BaseException | None = None) -> None:
        if self.error is None and not self.settled.is_set():
            self.error = error
            logger.warning("%s", error.message, exc_info=exc is not None and logger.isEnabledFor(logging.DEBUG))
        elif exc is not None:
            logger.warning("MCP server %r of agent %r ended with an error: %s", self.name, self.agent_id, describe(exc))

    def _on_connection_end(self) -> None:
        if not self.closing and self.settled.is_set():
            logger.warning("MCP server %r of agent %r exited or closed the connection", self.name, self.agent_id)
        self.close()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self._garbage += 1
            if self._garbage <= MAX_GARBAGE_LOGS:
                logger.warning("MCP server %r sent something unreadable: %s", self.name, describe(message))
        elif isinstance(message, mcp_types.ToolListChangedNotification):
            self.invalidate_tools()

    async def _listen(self, client: Client) -> None:
        """Modern (2026-07-28) servers announce tool changes only on a subscriptions/listen stream."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self.invalidate_tools()
        except (ListenNotSupportedError, MCPError) as exc:
            logger.debug("MCP server %r offers no change notifications: %s", self.name, describe(exc))
        except SubscriptionLost:
            logger.info("MCP server %r dropped its change notifications; tools are listed afresh", self.name)
            self.invalidate_tools()
        except Exception as exc:
            logger.warning("MCP server %r: change notifications failed: %s", self.name, describe(exc))

    def close(self) -> None:
        """Ask the session to end (in its own task); no new calls are given to it."""
        self.closing = True
        self._stop.set()
        self._forget(self)

    def kill(self) -> bool:
        """SIGKILL the server's process group; the session then ends as the connection closes."""
        pid = self.pid
        if pid is None or self.ended.is_set():
            return False
        self.close()
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        except PermissionError:
            logger.exception("MCP server %r (pid %d) could not be killed", self.name, pid)
            return False
        return True

    # -- use (from any task) ------------------------------------------------------------------

    def invalidate_tools(self) -> None:
        self._tools_generation += 1
        self.tools = None

    def _client(self) -> Client:
        client = self.client
        if client is None or self.closing:
            raise ToolServerError(f"MCP server {self.name!r} exited or closed the connection")
        return client

    async def list_tools(self) -> list[ToolSpec]:
        cached = self.tools
        if cached is not None:
            return cached
        generation = self._tools_generation
        client = self._client()
        specs: list[ToolSpec] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(LIST_TIMEOUT_S):
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    specs.extend(spec for tool in page.tools if (spec := listed_spec(self.name, tool)) is not None)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except TimeoutError:
            raise ToolServerError(
                f"MCP server {self.name!r} did not list its tools within {LIST_TIMEOUT_S:g} s"
            ) from None
        except Exception as exc:
            raise self._trouble("could not list its tools", exc) from exc
        if generation == self._tools_generation:
            self.tools = specs
        return specs

    async def call_tool(self, tool: str, arguments: dict[str, Any], progress: ProgressGate | None) -> ToolOutcome:
        client = self._client()
        try:
            result = await client.call_tool(tool, arguments, progress_callback=progress)
        except Exception as exc:
            raise self._trouble(f"failed calling {tool!r}", exc) from exc
        return outcome(self.name, tool, result)

    def _trouble(self, doing: str, exc: Exception) -> ToolServerError:
        if self.closing or (isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED):
            if not self.stdio:
                self.close()  # reconnect on the next use
            return ToolServerError(f"MCP server {self.name!r} exited or closed the connection ({doing})")
        if isinstance(exc, MCPError) and exc.code == mcp_types.INVALID_REQUEST and exc.message == _HTTP_SESSION_GONE:
            self.close()  # a restarted 2025-era HTTP server forgot our session: start a new one next time
            return ToolServerError(f"MCP server {self.name!r} ended our session ({doing})")
        if isinstance(exc, MCPError):
            return ToolServerError(f"MCP server {self.name!r} {doing}: {exc.message} (MCP error {exc.code})")
        if isinstance(exc, ValidationError | RuntimeError):
            return ToolServerError(f"MCP server {self.name!r} answered garbage ({doing}): {describe(exc)}")
        # Transport trouble (HTTP errors and the like): start over on the next use.
        self.close()
        return ToolServerError(f"MCP server {self.name!r} is unreachable ({doing}): {describe(exc)}")

    async def responsive(self, timeout: float) -> bool:
        """Whether the server answers a tools/list within `timeout` seconds (any answer counts)."""
        client = self.client
        if client is None or self.closing:
            return True  # already on its way out: nothing to kill
        try:
            async with asyncio.timeout(timeout):
                await client.session.list_tools()
        except TimeoutError:
            return False
        except Exception:
            return True
        return True
