"""The gateway runtime of one server process: its identity, executor, loops and connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

from chat.base import availability, health
from chat.base.availability import ChannelLayerUnavailable
from chat.base.db import db_write
from chat.delivery import groups
from chat.delivery.broadcaster import broadcaster
from chat.delivery.hub import Hub
from chat.delivery.layers import layer_unreachable
from chat.delivery.messages import ProcessMessage
from chat.runtime.executor import RunExecutor
from chat.runtime.registry import connections
from chat.runtime.supervisor import Supervisor
from chat.runtime.tools.pool import close_pool
from sessions_app import process

log = logging.getLogger(__name__)


class GatewayRuntime:
    """Bound to the serving event loop from the first connection (or `serve`'s start) until `stop`."""

    def __init__(self) -> None:
        self.server_id = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accepting = True
        self.stopping = False
        self.executor = RunExecutor()
        self.connections = connections
        self.supervisor = Supervisor(self)
        self.hub = Hub()
        self._started: asyncio.Task[None] | None = None  # the start, done once it has finished
        self.start_error = ""  # why the last start failed ('' once one succeeded, or none was tried)

    @property
    def running(self) -> bool:
        return self.loop is not None and not self.loop.is_closed() and self.loop.is_running()

    def owner_for_new_runs(self) -> str:
        """Who executes a run started now: this process, or '' (any live process claims it)."""
        return self.server_id if self.running and self.accepting else ""

    async def ensure_started(self) -> None:
        """Start on the running loop (idempotent); a caller arriving while it starts waits for it.

        A connection that went on before the hub was open would join groups the hub then
        forgot: it would get no live event until it reconnected. The start is a task of its
        own: a caller that is cancelled (its client left) neither aborts it nor cancels the
        others waiting for it.
        """
        loop = asyncio.get_running_loop()
        if self.loop is loop:
            if self._started is not None and not self._started.done():
                await asyncio.shield(self._started)
            return
        if self.running:
            raise RuntimeError("the gateway runtime is serving another event loop")
        self.loop = loop
        started = self._started = loop.create_task(self._start_or_reset())
        started.add_done_callback(lambda task: task.cancelled() or task.exception())  # retrieved
        await asyncio.shield(started)

    def started(self) -> bool:
        """Running and done starting (for /readyz)."""
        return self.running and self._started is not None and self._started.done()

    async def _start_or_reset(self) -> None:
        try:
            await self._start()
            self.start_error = ""
        except BaseException as exc:
            self.start_error = availability.describe(exc) if isinstance(exc, Exception) else "cancelled"
            # Not started: the next connection tries again (a database that was down at boot).
            self.loop, self._started = None, None
            with contextlib.suppress(Exception):
                await self.hub.stop()
                await broadcaster.stop()
            raise

    async def _start(self) -> None:
        self.server_id = f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.accepting = True
        self.stopping = False
        self.executor.reset(self.server_id)
        health.reset()
        self.connections.clear()
        broadcaster.start()
        await db_write(process.register, self.server_id)
        if get_channel_layer() is not None:
            try:
                await self.hub.start(groups.process_group(self.server_id), on_control=self._control)
            except Exception as exc:
                if not layer_unreachable(exc):
                    raise
                availability.channel_layer.failed(exc)  # logged once; `serve` tries again
                raise ChannelLayerUnavailable(availability.describe(exc)) from exc
        self.supervisor.start()
        log.info("gateway runtime %s started", self.server_id)

    def stop_accepting(self) -> None:
        """From now on runs are left for other processes, including successors of runs that end here."""
        self.accepting = False
        self.executor.successor_owner = ""

    async def drain_and_stop(self, drain_seconds: float) -> None:
        """SIGTERM: drain (see `Supervisor.drain`), then stop."""
        await self.supervisor.drain(drain_seconds)
        await self.stop()

    async def stop(self) -> None:
        """Stop the loops and local run tasks; runs are not ended in the database (recovery does)."""
        if self.loop is None:
            return
        self.stopping = True
        await self.supervisor.stop()
        await self.hub.stop()
        await self.executor.stop()
        await close_pool()  # no MCP server outlives the runtime that started it
        await broadcaster.stop()
        self.connections.clear()
        self.loop = None

    def _control(self, message: ProcessMessage) -> None:
        """A message for the process itself: an abort routed from another process."""
        if message["type"] == "run.cancel":
            self.executor.cancel(message["run"])

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the serving loop, from any thread; a no-op when it is not serving."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(fn, *args)


runtime = GatewayRuntime()
