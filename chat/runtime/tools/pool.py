"""The MCP server pool: this process's sessions with MCP servers, one per (agent, server name).

A session (`session.py`) starts on first use. Supervision:

- A stdio server runs under the leash (`transport.py`), so it cannot outlive the gateway, and the
  pool learns its pid. If its process dies, the calls in flight fail with ``ToolServerError`` and
  the next use starts it again.
- A call that is abandoned (the caller's task cancelled, or its timeout passed) sends the SDK's
  ``notifications/cancelled``; the caller gets its ``CancelledError``/``TimeoutError`` at once, and a
  background task of the pool then checks that the server is still answering: a stdio server that
  does not answer a ``tools/list`` within 2 s of the abandonment is taken to be stuck in the request
  and is killed (its whole process group) and started afresh on next use. MCP forbids answering a
  cancelled request, so "the request has not ended" cannot be observed directly; an unresponsive
  server is the observable case (a server that keeps running the request in the background while
  answering others is left alone).
- What a server can do to us is bounded (`results.py`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable
from typing import Any

from chat.runtime.tools.config import ToolSpec, validate_server
from chat.runtime.tools.results import ProgressCallback, ProgressGate, ToolOutcome, ToolServerError, describe
from chat.runtime.tools.session import ServerSession

logger = logging.getLogger(__name__)

ABANDON_GRACE_S = 2.0  # a stdio server silent this long after a cancellation is killed
CLOSE_TIMEOUT_S = 8.0  # aclose(): the SDK's own shutdown (stdin closed, SIGTERM, SIGKILL) takes up to ~6 s


class ServerPool:
    """MCP sessions of this process: one per (agent_id, server name), started lazily and supervised."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], ServerSession] = {}
        self._live: set[ServerSession] = set()  # including retired sessions still shutting down
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
        gate = ProgressGate(on_progress) if on_progress is not None else None
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

    async def _session(self, agent_id: str, servers: dict[str, dict[str, Any]], name: str) -> ServerSession:
        config = servers.get(name)
        if config is None:
            raise ToolServerError(f"no MCP server named {name!r} is configured for this agent")
        error = validate_server(name, config)
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
                session = ServerSession(agent_id, name, copy.deepcopy(config), self._forget)
                self._sessions[key] = session
                self._live.add(session)
            await session.settled.wait()
            if session.error is not None:
                raise ToolServerError(session.error.message, session.error.kind)
            if not session.closing:
                return session
        raise ToolServerError(f"MCP server {name!r} exited right after it started")

    def _forget(self, session: ServerSession) -> None:
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

    async def _watch_abandoned(self, session: ServerSession, inner: asyncio.Task[ToolOutcome], since: float) -> None:
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
            logger.debug("MCP background task failed: %s", describe(exc))


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
