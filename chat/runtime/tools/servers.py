"""The MCP server pool: this process's sessions with MCP servers, one per (agent, server name).

A session starts on first use and lives in an asyncio task of its own, which enters the SDK's
``Client`` (and with it the transport's task groups) and exits it again: the SDK's context managers
are never entered in one task and left in another. Callers talk to a started session through its
``Client``; the SDK's dispatcher serves any number of concurrent requests.

Supervision:

- A stdio server runs under ``leash.py`` (see there), so it cannot outlive the gateway, and the pool
  learns its pid. If its process dies, the calls in flight fail with ``ToolServerError`` and the next
  use starts it again. Any connection loss (stdout closed, HTTP stream gone) retires the session.
- A call that is abandoned (the caller's task cancelled, or its timeout passed) sends the SDK's
  ``notifications/cancelled``; the caller gets its ``CancelledError``/``TimeoutError`` at once, and a
  background task of the pool then checks that the server is still answering: a stdio server that
  does not answer a ``tools/list`` within 2 s of the abandonment is taken to be stuck in the request
  and is killed (its whole process group) and started afresh on next use. MCP forbids answering a
  cancelled request, so "the request has not ended" cannot be observed directly; an unresponsive
  server is the observable case (a server that keeps running the request in the background while
  answering others is left alone).
- What a server can do to us is bounded: progress reaches ``on_progress`` at most 10 times a second
  (the rest is dropped, never queued), and a result over 8 MiB of text is refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp.types as mcp_types
from mcp import Client, StdioServerParameters
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from chat.runtime.tools import leash

logger = logging.getLogger(__name__)

SERVER_NAME_RE = re.compile(r"^[a-z0-9_-]{1,32}$")
MODEL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names

STARTUP_TIMEOUT_S = 30.0  # spawn + handshake
LIST_TIMEOUT_S = 30.0  # tools/list, all pages
ABANDON_GRACE_S = 2.0  # a stdio server silent this long after a cancellation is killed
CLOSE_TIMEOUT_S = 8.0  # aclose(): the SDK's own shutdown (stdin closed, SIGTERM, SIGKILL) takes up to ~6 s
PROGRESS_INTERVAL_S = 0.1  # on_progress at most 10 times a second
MAX_PROGRESS_MESSAGE = 1000  # characters of a progress message passed on
MAX_RESULT_BYTES = 8 * 1024 * 1024
MAX_LIST_PAGES = 100
MAX_GARBAGE_LOGS = 3  # unparseable lines from a server logged per session
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
CLIENT_INFO = mcp_types.Implementation(name="agentgate", version="0.1.0")

_STDIO_KEYS = frozenset({"command", "args", "env", "cwd"})
_HTTP_KEYS = frozenset({"url", "headers"})
_LEASH_PATH = str(Path(leash.__file__).resolve())
_HTTP_SESSION_GONE = "Session terminated"  # what the SDK's HTTP transport reports for a 404 on a session id

ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]


def model_name(server: str, tool: str) -> str:
    """The OpenAI function name of a server's tool (`NAME__tool`); a bare name for one of no server."""
    return f"{server}__{tool}" if server else tool


@dataclass(frozen=True)
class ToolSpec:
    server: str  # config name, ^[a-z0-9_-]{1,32}$
    tool: str  # the MCP tool name
    description: str
    input_schema: dict[str, Any]
    read_only: bool  # annotations.readOnlyHint is True

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.tool}"

    @property
    def model_name(self) -> str:
        return model_name(self.server, self.tool)


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # text blocks joined with "\n"; other blocks described; structured content as JSON if no text
    is_error: bool  # CallToolResult.is_error


class ToolServerError(Exception):
    """The server is missing, could not start, crashed, or answered garbage."""

    def __init__(self, message: str, kind: str = "tool_server") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


# ---------------------------------------------------------------------------------------------
# Configuration


def validate_servers(config: Any) -> str | None:
    """The agent's ``mcp_servers`` value checked: an error text naming what is wrong, or None."""
    if not isinstance(config, dict):
        return "mcp_servers must be an object of NAME: {command, args, env, cwd} or NAME: {url, headers}"
    for name, entry in config.items():
        if not isinstance(name, str) or not SERVER_NAME_RE.fullmatch(name):
            return f"mcp_servers: bad server name {name!r} (names match ^[a-z0-9_-]{{1,32}}$)"
        error = _validate_server(name, entry)
        if error is not None:
            return error
    return None


def _validate_server(name: str, entry: Any) -> str | None:
    where = f"mcp_servers.{name}"
    if not isinstance(entry, dict):
        return f"{where} must be an object with either command (stdio) or url (streamable HTTP)"
    unknown = sorted(str(key) for key in entry if key not in _STDIO_KEYS | _HTTP_KEYS)
    if unknown:
        return f"{where}: unknown key(s) {', '.join(unknown)} (allowed: command, args, env, cwd, or url, headers)"
    if ("command" in entry) == ("url" in entry):
        return f"{where} needs exactly one of command (a stdio server) or url (a streamable HTTP server)"
    if "command" in entry:
        misplaced = sorted(_HTTP_KEYS & entry.keys())
        if misplaced:
            return f"{where}: {', '.join(misplaced)} is for url servers, not command servers"
        command = entry["command"]
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            return f"{where}.command must be a non-empty string"
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            return f"{where}.args must be a list of strings"
        env = entry.get("env", {})
        if not _is_str_map(env) or not all(k and "=" not in k for k in env):
            return f"{where}.env must be an object of strings (names without '=')"
        cwd = entry.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
            return f"{where}.cwd must be a non-empty string"
        return None
    misplaced = sorted(_STDIO_KEYS & entry.keys())
    if misplaced:
        return f"{where}: {', '.join(misplaced)} is for command servers, not url servers"
    url = entry["url"]
    if not isinstance(url, str):
        return f"{where}.url must be a string"
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        hostname = None
    if parts.scheme not in ("http", "https") or not hostname:
        return f"{where}.url must be an http:// or https:// URL, got {url!r}"
    headers = entry.get("headers", {})
    if not _is_str_map(headers) or not all(k and "\n" not in k + v and "\r" not in k + v for k, v in headers.items()):
        return f"{where}.headers must be an object of strings"
    return None


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


# ---------------------------------------------------------------------------------------------
# Results


def _render(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type} {block.mime_type}, {_b64_size(block.data)} bytes]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(f"[resource {resource.uri}]\n{resource.text}")
                has_text = True
            else:
                size = _b64_size(resource.blob)
                parts.append(f"[resource {resource.uri}, {resource.mime_type or 'binary'}, {size} bytes]")
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content]")
    if result.structured_content is not None and not has_text:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _b64_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _too_big(text: str) -> bool:
    return len(text) > MAX_RESULT_BYTES or (len(text) * 4 > MAX_RESULT_BYTES and len(text.encode()) > MAX_RESULT_BYTES)


def _spec(server: str, tool: mcp_types.Tool) -> ToolSpec | None:
    spec = ToolSpec(
        server=server,
        tool=tool.name,
        description=tool.description or tool.title or "",
        input_schema=dict(tool.input_schema) if tool.input_schema else {"type": "object", "properties": {}},
        read_only=tool.annotations is not None and tool.annotations.read_only_hint is True,
    )
    if not MODEL_NAME_RE.fullmatch(spec.model_name):
        logger.warning("MCP server %r: tool %r skipped, its name cannot be a model function name", server, tool.name)
        return None
    return spec


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class _ProgressGate:
    """Passes progress on at most every PROGRESS_INTERVAL_S, and never two at once; drops the rest."""

    def __init__(self, deliver: ProgressCallback) -> None:
        self._deliver = deliver
        self._last = float("-inf")
        self._busy = False
        self.closed = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self.closed or self._busy:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._busy = True
        try:
            await self._deliver(progress, total, message[:MAX_PROGRESS_MESSAGE] if message else message)
        except Exception:
            logger.exception("on_progress raised")
        finally:
            self._busy = False


# ---------------------------------------------------------------------------------------------
# Transport: notices when the server's side of the connection ends


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
async def _watched(
    inner: contextlib.AbstractAsyncContextManager[TransportStreams], on_end: Callable[[], None]
) -> AsyncIterator[TransportStreams]:
    async with inner as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream


# ---------------------------------------------------------------------------------------------
# One session


class _Session:
    def __init__(self, pool: ServerPool, agent_id: str, name: str, config: dict[str, Any]) -> None:
        self.pool = pool
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
        self._tools_generation = 0
        self._stop = asyncio.Event()
        self._pidfile: str | None = None
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
                        transport = await self._transport(stack)
                        client = Client(
                            transport, cache=None, message_handler=self._on_message, client_info=CLIENT_INFO
                        )
                        await stack.enter_async_context(client)
                        timer.cancel()
                        self.pid = self._read_pid()
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
            self._fail(ToolServerError(f"MCP server {self.name!r} could not start: {_describe(exc)}"), exc)
        finally:
            self.closing = True
            self.client = None
            self._remove_pidfile()
            self.settled.set()
            self.ended.set()
            self.pool._forget(self)
            logger.info("MCP server %r of agent %r stopped", self.name, self.agent_id)

    def _fail(self, error: ToolServerError, exc: BaseException | None = None) -> None:
        if self.error is None and not self.settled.is_set():
            self.error = error
            logger.warning("%s", error.message, exc_info=exc is not None and logger.isEnabledFor(logging.DEBUG))
        elif exc is not None:
            logger.warning(
                "MCP server %r of agent %r ended with an error: %s", self.name, self.agent_id, _describe(exc)
            )

    async def _transport(self, stack: AsyncExitStack) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
        config = self.config
        if self.stdio:
            fd, self._pidfile = tempfile.mkstemp(prefix="agentgate-mcp-", suffix=".pid")
            os.close(fd)
            env = dict(config.get("env") or {})
            self._check_command(config["command"], env.get("PATH", os.environ.get("PATH", os.defpath)))
            env[leash.PARENT_ENV] = str(os.getpid())
            env[leash.PIDFILE_ENV] = self._pidfile
            params = StdioServerParameters(
                command=sys.executable,
                args=["-I", _LEASH_PATH, "--", config["command"], *config.get("args", [])],
                env=env,
                cwd=config.get("cwd"),
            )
            return _watched(stdio_client(params), self._on_connection_end)
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=config.get("headers") or None, timeout=HTTP_TIMEOUT)
        )
        return _watched(streamable_http_client(config["url"], http_client=http), self._on_connection_end)

    def _check_command(self, command: str, path: str) -> None:
        """A missing command is named here; past the launcher's exec it would only be a closed connection."""
        if os.sep in command:
            found = os.access(os.path.join(self.config.get("cwd") or os.getcwd(), command), os.X_OK)
        else:
            found = shutil.which(command, path=path) is not None
        if not found:
            raise ToolServerError(f"MCP server {self.name!r} could not start: command {command!r} not found")

    def _read_pid(self) -> int | None:
        if self._pidfile is None:
            return None
        try:
            return int(Path(self._pidfile).read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            logger.warning("MCP server %r: the launcher did not report a pid", self.name)
            return None
        finally:
            self._remove_pidfile()

    def _remove_pidfile(self) -> None:
        if self._pidfile is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._pidfile)
            self._pidfile = None

    def _on_connection_end(self) -> None:
        if not self.closing and self.settled.is_set():
            logger.warning("MCP server %r of agent %r exited or closed the connection", self.name, self.agent_id)
        self.close()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self._garbage += 1
            if self._garbage <= MAX_GARBAGE_LOGS:
                logger.warning("MCP server %r sent something unreadable: %s", self.name, _describe(message))
        elif isinstance(message, mcp_types.ToolListChangedNotification):
            self.invalidate_tools()

    async def _listen(self, client: Client) -> None:
        """Modern (2026-07-28) servers announce tool changes only on a subscriptions/listen stream."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self.invalidate_tools()
        except (ListenNotSupportedError, MCPError) as exc:
            logger.debug("MCP server %r offers no change notifications: %s", self.name, _describe(exc))
        except SubscriptionLost:
            logger.info("MCP server %r dropped its change notifications; tools are listed afresh", self.name)
            self.invalidate_tools()
        except Exception as exc:
            logger.warning("MCP server %r: change notifications failed: %s", self.name, _describe(exc))

    def close(self) -> None:
        """Ask the session to end (in its own task); no new calls are given to it."""
        self.closing = True
        self._stop.set()
        self.pool._forget(self)

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
                    specs.extend(spec for tool in page.tools if (spec := _spec(self.name, tool)) is not None)
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

    async def call_tool(self, tool: str, arguments: dict[str, Any], progress: _ProgressGate | None) -> ToolOutcome:
        client = self._client()
        try:
            result = await client.call_tool(tool, arguments, progress_callback=progress)
        except Exception as exc:
            raise self._trouble(f"failed calling {tool!r}", exc) from exc
        text = _render(result)
        if _too_big(text):
            limit = f"{MAX_RESULT_BYTES / 1024 / 1024:g} MiB"
            raise ToolServerError(f"MCP server {self.name!r} answered {tool!r} with too much text (over {limit})")
        return ToolOutcome(text=text, is_error=bool(result.is_error))

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
            return ToolServerError(f"MCP server {self.name!r} answered garbage ({doing}): {_describe(exc)}")
        # Transport trouble (HTTP errors and the like): start over on the next use.
        self.close()
        return ToolServerError(f"MCP server {self.name!r} is unreachable ({doing}): {_describe(exc)}")

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


# ---------------------------------------------------------------------------------------------
# The pool


class ServerPool:
    """MCP sessions of this process: one per (agent_id, server name), started lazily and supervised."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._live: set[_Session] = set()  # including retired sessions still shutting down
        self._background: set[asyncio.Task[Any]] = set()
        self._kills = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def list_tools(self, agent_id: str, servers: dict[str, dict[str, Any]]) -> list[ToolSpec]:
        """Every tool of the agent's servers, in config order; a server that cannot start raises, naming it."""
        names = list(servers)
        results = await asyncio.gather(*(self._tools_of(agent_id, servers, n) for n in names), return_exceptions=True)
        specs: list[ToolSpec] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            specs.extend(result)
        return specs

    async def _tools_of(self, agent_id: str, servers: dict[str, dict[str, Any]], name: str) -> list[ToolSpec]:
        for attempt in (1, 2):
            session = await self._session(agent_id, servers, name)
            try:
                return await session.list_tools()
            except ToolServerError:
                if attempt == 2 or not session.closing:
                    raise
        raise AssertionError("unreachable")

    async def call(
        self,
        agent_id: str,
        servers: dict[str, dict[str, Any]],
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        on_progress: ProgressCallback | None = None,
    ) -> ToolOutcome:
        """Call one tool. Raises TimeoutError (the request cancelled at the server) or ToolServerError.

        The timeout covers starting the server too. A cancellation of the calling task propagates at
        once; the pool cancels the request and watches the server in the background.
        """
        gate = _ProgressGate(on_progress) if on_progress is not None else None
        try:
            async with asyncio.timeout(timeout_s):
                session = await self._session(agent_id, servers, server)
                inner = asyncio.create_task(
                    session.call_tool(tool, arguments, gate), name=f"mcp-call {agent_id}/{server}.{tool}"
                )
                inner.add_done_callback(_retrieve)
                try:
                    return await asyncio.shield(inner)
                except asyncio.CancelledError:
                    if not inner.done():
                        inner.cancel()  # the SDK sends notifications/cancelled as it unwinds
                        self._spawn(self._watch_abandoned(session, inner, time.monotonic()))
                    raise
        finally:
            if gate is not None:
                gate.closed = True

    def kill_count(self) -> int:
        """How many stdio server processes were killed for ignoring a cancellation."""
        return self._kills

    async def aclose(self) -> None:
        """Stop every session; stdio servers end (stdin closed, then SIGTERM, then SIGKILL)."""
        self._bind_loop()  # sessions of another (finished) loop are killed, not awaited
        for task in list(self._background):
            task.cancel()
        sessions = list(self._live)
        self._sessions.clear()
        for session in sessions:
            session.close()
        tasks = [s.task for s in sessions if not s.task.done()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for session in sessions:
                if session.task in pending:
                    session.kill()
                    session.task.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=1.0)

    # -- internals ------------------------------------------------------------------------

    async def _session(self, agent_id: str, servers: dict[str, dict[str, Any]], name: str) -> _Session:
        config = servers.get(name)
        if config is None:
            raise ToolServerError(f"no MCP server named {name!r} is configured for this agent")
        error = _validate_server(name, config)
        if error is not None:
            raise ToolServerError(error)
        self._bind_loop()
        for _attempt in (1, 2):
            key = (agent_id, name)
            session = self._sessions.get(key)
            if session is not None and session.config != config:
                session.close()  # the configuration changed: retire the old one
                session = None
            if session is None:
                session = _Session(self, agent_id, name, copy.deepcopy(config))
                self._sessions[key] = session
                self._live.add(session)
            await session.settled.wait()
            if session.error is not None:
                raise ToolServerError(session.error.message, session.error.kind)
            if not session.closing:
                return session
        raise ToolServerError(f"MCP server {name!r} exited right after it started")

    def _forget(self, session: _Session) -> None:
        key = (session.agent_id, session.name)
        if self._sessions.get(key) is session:
            del self._sessions[key]
        if session.ended.is_set():
            self._live.discard(session)

    def _bind_loop(self) -> None:
        """Sessions belong to one event loop; on another loop (tests, a restarted runtime) start over."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            for session in list(self._live):
                session.kill()
            self._sessions.clear()
            self._live.clear()
            self._background.clear()
        self._loop = loop

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve)

    async def _watch_abandoned(self, session: _Session, inner: asyncio.Task[ToolOutcome], since: float) -> None:
        """After a cancelled call: kill a stdio server that does not answer within ABANDON_GRACE_S."""
        await asyncio.wait([inner], timeout=ABANDON_GRACE_S)  # the cancellation notice goes out
        if not session.stdio or session.closing:
            return
        remaining = ABANDON_GRACE_S - (time.monotonic() - since)
        if await session.responsive(max(remaining, 0.25)):
            return
        if session.kill():
            self._kills += 1
            logger.warning(
                "MCP server %r of agent %r (pid %s) ignored a cancellation for %g s: killed",
                session.name,
                session.agent_id,
                session.pid,
                ABANDON_GRACE_S,
            )


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen (no "exception was never retrieved" noise)."""
    if not task.cancelled():
        exc = task.exception()
        if exc is not None and not isinstance(exc, ToolServerError):
            logger.debug("MCP background task failed: %s", _describe(exc))


_POOL: ServerPool | None = None


def pool() -> ServerPool:
    """The process's one pool."""
    global _POOL
    if _POOL is None:
        _POOL = ServerPool()
    return _POOL


async def close_pool() -> None:
    """Stop every MCP session of this process (the runtime's stop); the next use starts afresh."""
    global _POOL
    current, _POOL = _POOL, None
    if current is not None:
        await current.aclose()
