"""The background loops of a server process, and its drain on shutdown.

- heartbeat: keep this process alive in the registry, end the runs of dead ones
  (the recovery sweep), claim runs that nobody executes;
- reconcile: make this process's tasks and the database agree, both ways;
- repair (§9): one database pass for all connections of the process;
- regroup: re-add the process's channel to its layer groups, because Redis forgets them
  (after `group_expiry`, and on a restart without persistence).

(What the channel layer routes to the process, events and aborts, arrives through `chat.delivery.hub`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from django.conf import settings

from chat.delivery import repair
from chat.delivery.hub import Hub
from chat.runtime import health
from chat.runtime.db import db_read, db_write
from chat.runtime.executor import RunExecutor
from chat.runtime.registry import ConnectionRegistry
from chat.web import metrics
from sessions_app import gateway_reads, process
from sessions_app.lifecycle import runs
from sessions_app.models import Actor, RunState
from sessions_app.operations import recovery

log = logging.getLogger(__name__)
SHUTDOWN_MESSAGE = "gateway process shut down before the run finished"


class Supervised(Protocol):
    """What the loops need of the runtime they serve (`chat.runtime.gateway.GatewayRuntime`)."""

    server_id: str
    accepting: bool
    stopping: bool
    executor: RunExecutor
    hub: Hub
    connections: ConnectionRegistry

    def stop_accepting(self) -> None: ...


class Supervisor:
    """Starts and stops the loops of one runtime."""

    def __init__(self, runtime: Supervised) -> None:
        self.runtime = runtime
        self.tasks: list[asyncio.Task[None]] = []
        self.scanner = repair.Scanner()

    def start(self) -> None:
        self.scanner = repair.Scanner()
        self.tasks = [
            asyncio.ensure_future(loop())
            for loop in (self._heartbeat_loop, self._reconcile_loop, self._repair_loop, self._regroup_loop)
        ]

    async def stop(self) -> None:
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            # A client library may swallow a cancellation (redis-py turns it into its own
            # TimeoutError); the runtime's `stopping` flag ends those loops, and we never wait forever.
            await asyncio.wait(tasks, timeout=5)

    async def repair_now(self) -> None:
        await repair.repair(self.runtime.connections.snapshot(), self.scanner)

    # --- loops ------------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        rt = self.runtime
        while not rt.stopping:
            await asyncio.sleep(settings.GATEWAY_HEARTBEAT_SECONDS)
            try:
                await db_write(process.heartbeat, rt.server_id)
                swept = await db_write(recovery.sweep, rt.server_id)
                for pk in await db_read(process.unowned_active_runs):
                    if rt.accepting and await db_write(runs.claim_run, pk, server_id=rt.server_id):
                        rt.executor.submit(pk)
                metrics.sweep_done(swept.ended, swept.forgotten)
                health.ok("sweep")
            except Exception as exc:
                metrics.SWEEPS.labels("error").inc()
                health.failed("sweep", exc)
                log.exception("heartbeat/recovery sweep failed")

    async def _reconcile_loop(self) -> None:
        """- a local task whose run ended elsewhere (a dropped abort message) is cancelled;
        - an active run owned by this process with no task (a lost hand-off, a task that
          died) is executed if still dispatching, or ended failed/interrupted if it was
          already running: nothing is left `running` with nothing behind it.
        """
        rt = self.runtime
        executor = rt.executor
        while not rt.stopping:
            await asyncio.sleep(settings.GATEWAY_REPAIR_SECONDS)
            try:
                ended, orphans = await db_read(gateway_reads.reconcile_snapshot, rt.server_id, list(executor.tasks))
                for pk in ended:
                    executor.cancel(pk)
                for pk, state in orphans:
                    if pk in executor.tasks or pk in executor.finishing or not rt.accepting:
                        continue  # (while draining, the drain ends whatever is left)
                    if state == RunState.DISPATCHING:
                        executor.submit(pk)
                    else:
                        await executor.finish(
                            pk,
                            RunState.FAILED,
                            error_kind="interrupted",
                            reason="run.interrupted",
                            error_message="the run lost its worker in this gateway process",
                        )
                health.ok("reconcile")
            except Exception as exc:
                health.failed("reconcile", exc)
                log.exception("reconcile failed")

    async def _repair_loop(self) -> None:
        """§9: twice per repair window."""
        interval = max(0.2, settings.GATEWAY_REPAIR_SECONDS / 2)
        while not self.runtime.stopping:
            await asyncio.sleep(interval)
            try:
                await self.repair_now()
                metrics.REPAIR_PASSES.labels("ok").inc()
                health.ok("repair")
            except Exception as exc:
                metrics.REPAIR_PASSES.labels("error").inc()
                health.failed("repair", exc)
                log.exception("repair pass failed")

    async def _regroup_loop(self) -> None:
        """Group memberships live in the layer, which may lose them; idempotent re-adds restore them."""
        rt = self.runtime
        if settings.GATEWAY_GROUP_REFRESH_SECONDS <= 0:
            return
        while not rt.stopping:
            await asyncio.sleep(settings.GATEWAY_GROUP_REFRESH_SECONDS)
            try:
                await rt.hub.regroup()
                health.ok("regroup")
            except Exception as exc:
                health.failed("regroup", exc)
                metrics.channel_layer_failed("regroup")
                log.warning("re-adding layer groups failed; trying again next pass", exc_info=True)

    # --- shutdown -------------------------------------------------------------------------------

    async def drain(self, drain_seconds: float) -> None:
        """SIGTERM: stop taking runs, tell clients, let runs finish briefly, interrupt the rest."""
        rt = self.runtime
        rt.stop_accepting()
        for connection in rt.connections:
            with contextlib.suppress(Exception):
                await connection.send_shutdown("server shutting down")
        deadline = time.monotonic() + drain_seconds
        while rt.executor.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await db_write(runs.interrupt_runs_of_process, rt.server_id, actor=Actor.SYSTEM, message=SHUTDOWN_MESSAGE)
        await db_write(process.mark_stopped, rt.server_id)
        # Deliver the interruptions from the database before closing: the layer messages
        # carrying them may still be queued behind this drain.
        with contextlib.suppress(Exception):
            await self.repair_now()
        for connection in rt.connections:
            with contextlib.suppress(Exception):
                await connection.close(code=4001)
