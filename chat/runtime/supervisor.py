"""The background loops of a server process, and its drain on shutdown.

- heartbeat: keep this process alive in the registry, end the runs of dead ones
  (the recovery sweep), claim runs that nobody executes;
- reconcile: make this process's tasks and the database agree, both ways;
- repair (§9): one database pass for all connections of the process;
- layer: every LAYER_CHECK_SECONDS ask the layer whether it still holds the process's own
  group (a Redis restarted without persistence forgets every group) and re-add them all at
  once if not; and every GATEWAY_GROUP_REFRESH_SECONDS anyway (`group_expiry`).

When the database or the channel layer is away (`chat.runtime.availability`, which logs the
outage once) every loop goes on trying, without a traceback per pass; `/readyz` says why the
process is unready. A process does not count against a peer the time it could not reach the
database itself (`blind`, `process.live_process_ids`): it could not have seen a heartbeat then.

(What the channel layer routes to the process, events and aborts, arrives through `chat.delivery.hub`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.utils import timezone

from chat.delivery import repair
from chat.delivery.hub import Hub
from chat.delivery.layers import layer_unreachable
from chat.runtime import availability, health
from chat.runtime.availability import Unavailable
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
LAYER_CHECK_SECONDS = 1.0  # how soon a restarted Redis gets the process's groups back
LAYER_CHECK_TIMEOUT_SECONDS = 5.0
OUTAGE_RETRY_SECONDS = 1.0  # a loop's pace while the database is away (never slower than its own)


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
        # When this process could not write its heartbeat (the database away, or a stall of its own).
        self.blind: deque[tuple[datetime, datetime]] = deque()

    def start(self) -> None:
        self.scanner = repair.Scanner()
        self.blind = deque()
        availability.database.reset()
        availability.channel_layer.reset()
        self.tasks = [
            asyncio.ensure_future(loop())
            for loop in (self._heartbeat_loop, self._reconcile_loop, self._repair_loop, self._layer_loop)
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

    def beat_after(self, gap: float) -> None:
        """A heartbeat went through `gap` seconds after the one before: remember any blind time.

        Beyond the usual interval the process could not reach the database (or could not run):
        neither could it have seen its peers' heartbeats then. Spans older than the recovery
        window can no longer save anyone and are forgotten.
        """
        interval = settings.GATEWAY_HEARTBEAT_SECONDS
        now = timezone.now()
        if gap > 2 * interval + OUTAGE_RETRY_SECONDS:  # (late by less is jitter: the window absorbs it)
            self.blind.append((now - timedelta(seconds=gap - interval), now))
        horizon = now - timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS + 3 * interval)
        while self.blind and self.blind[0][1] < horizon:
            self.blind.popleft()

    async def _heartbeat_loop(self) -> None:
        rt = self.runtime
        interval = settings.GATEWAY_HEARTBEAT_SECONDS
        beat_at = time.monotonic()
        while not rt.stopping:
            ok = health.snapshot().get("sweep")
            await asyncio.sleep(interval if ok is None or ok.ok else min(interval, OUTAGE_RETRY_SECONDS))
            try:
                await db_write(process.heartbeat, rt.server_id)
                now = time.monotonic()
                self.beat_after(now - beat_at)
                beat_at = now
                swept = await db_write(recovery.sweep, rt.server_id, list(self.blind))
                for pk in await db_read(process.unowned_active_runs):
                    if rt.accepting and await db_write(runs.claim_run, pk, server_id=rt.server_id):
                        rt.executor.submit(pk)
                metrics.sweep_done(swept.ended, swept.forgotten)
                health.ok("sweep")
            except Unavailable as exc:  # logged once by `availability`; tried again next pass
                metrics.SWEEPS.labels("error").inc()
                health.failed("sweep", exc)
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
            except Unavailable as exc:
                health.failed("reconcile", exc)
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
            except Unavailable as exc:
                metrics.REPAIR_PASSES.labels("error").inc()
                health.failed("repair", exc)
            except Exception as exc:
                metrics.REPAIR_PASSES.labels("error").inc()
                health.failed("repair", exc)
                log.exception("repair pass failed")

    async def _layer_loop(self) -> None:
        """Group memberships live in the layer, which may lose them; idempotent re-adds restore them.

        The check each second is one command without retries: it also tells
        `availability.channel_layer` at once when Redis goes away and when it is back.
        """
        rt = self.runtime
        refresh = settings.GATEWAY_GROUP_REFRESH_SECONDS
        refreshed_at = time.monotonic()
        while not rt.stopping:
            await asyncio.sleep(LAYER_CHECK_SECONDS)
            try:
                if refresh > 0 and time.monotonic() - refreshed_at >= refresh:
                    refreshed_at = time.monotonic()
                    await asyncio.wait_for(rt.hub.regroup(), LAYER_CHECK_TIMEOUT_SECONDS)
                else:
                    await asyncio.wait_for(rt.hub.watch(), LAYER_CHECK_TIMEOUT_SECONDS)
                health.ok("regroup")
            except Exception as exc:
                health.failed("regroup", exc)
                metrics.channel_layer_failed("regroup")
                rt.hub.stale = True  # whatever it missed is re-added once the layer answers
                if layer_unreachable(exc):  # an outage: logged once by `availability`
                    availability.channel_layer.failed(exc)
                else:  # a bug or a bad reply, not the layer gone: worth its traceback
                    log.exception("layer check failed; trying again in %.0f s", LAYER_CHECK_SECONDS)

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
        try:
            await db_write(runs.interrupt_runs_of_process, rt.server_id, actor=Actor.SYSTEM, message=SHUTDOWN_MESSAGE)
            await db_write(process.mark_stopped, rt.server_id)
        except Unavailable:
            # Stopping while the database is away: the other processes' sweeps end these runs once
            # this process's heartbeat is stale (not counting the time they could not reach the database).
            log.warning("draining: the database is unavailable; the runs left are ended by the recovery sweep")
        # Deliver the interruptions from the database before closing: the layer messages
        # carrying them may still be queued behind this drain.
        with contextlib.suppress(Exception):
            await self.repair_now()
        for connection in rt.connections:
            with contextlib.suppress(Exception):
                await connection.close(code=4001)
