"""The background loops of a server process, its heartbeat, and its drain on shutdown.

- heartbeat: keep this process alive in the registry, from a thread of its own (`Heartbeat`);
- sweep: end the runs of dead processes (the recovery sweep), claim runs that nobody executes,
  abort HTTP runs whose client left and did not come back;
- reconcile: make this process's tasks and the database agree, both ways;
- repair (§9): one database pass for all connections of the process;
- layer: every LAYER_CHECK_SECONDS ask the layer whether it still holds the process's own
  group (a Redis restarted without persistence forgets every group) and re-add them all at
  once if not; and every GATEWAY_GROUP_REFRESH_SECONDS anyway (`group_expiry`).

When the database or the channel layer is away (`chat.base.availability`, which logs the
outage once) every loop goes on trying, without a traceback per pass; `/readyz` says why the
process is unready. A process does not count against a peer the time it could not reach the
database itself (`blind`, `process.live_process_ids`): it could not have seen a heartbeat then.

(What the channel layer routes to the process, events and aborts, arrives through `chat.delivery.hub`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from chat.base import availability, health, metrics
from chat.base.availability import Unavailable
from chat.base.db import close_own_connection, db_read, db_write, write_soon
from chat.delivery import repair
from chat.delivery.hub import Hub
from chat.delivery.layers import layer_unreachable
from chat.runtime.executor import RunExecutor
from chat.runtime.registry import ConnectionRegistry
from sessions_app import gateway_reads, process
from sessions_app.lifecycle import runs
from sessions_app.models import Actor, RunState
from sessions_app.operations import recovery

log = logging.getLogger(__name__)
LOST_WORKER_MESSAGE = "the run lost its worker in this gateway process"
SHUTDOWN_MESSAGE = "gateway process shut down before the run finished"
LAYER_CHECK_SECONDS = 1.0  # how soon a restarted Redis gets the process's groups back
LAYER_CHECK_TIMEOUT_SECONDS = 5.0
OUTAGE_RETRY_SECONDS = 1.0  # a loop's pace while the database is away (never slower than its own)
BEAT_TIMEOUT_SECONDS = 5.0  # a heartbeat not written by then is tried again at the next beat
HEARTBEAT_STOP_SECONDS = 1.0  # how long stopping waits for a beat under way
# After the drain, each step in its time: what still runs is cancelled, the process marked
# stopped, its runs ended, its clients told. Under two seconds whatever the load (`serve` allows
# two), so that a rolling restart takes the drain and a few seconds; the recovery sweep does the rest.
STOP_TASKS_SECONDS = 0.3
MARK_STOPPED_SECONDS = 0.3
END_RUNS_SECONDS = 1.0
LAST_REPAIR_SECONDS = 0.3


def blind_after(interval: float) -> float:
    """A gap between two heartbeats longer than this was time the process could not see."""
    return 2 * interval + OUTAGE_RETRY_SECONDS


class HeartbeatOverdue(Exception):
    """This process's own heartbeat has not gone through lately: it does not judge its peers."""


class Supervised(Protocol):
    """What the loops need of the runtime they serve (`chat.runtime.gateway.GatewayRuntime`)."""

    server_id: str
    accepting: bool
    stopping: bool
    executor: RunExecutor
    hub: Hub
    connections: ConnectionRegistry

    def stop_accepting(self) -> None: ...


class Heartbeat:
    """This process's heartbeat, written by a thread of its own on a fixed schedule.

    Nothing the gateway's load can hold up stands between the schedule and the write: not the
    event loop (its timers ran seconds late on a CPU-starved process), not the database threads,
    the SQLite writer's queue or the pool's wait (the runs' writes queue there: `db.write_soon`).
    Written from the loop, beside the sweep, a loaded process's beats came up to 4.5 s apart,
    and its peers declared it dead and ended its runs while it lived.

    Each beat's lateness (`agentgate_heartbeat_lateness_seconds`) counts from when the first
    beat it owed was due, so a beat that could not be written counts until one is; `seen` gets
    the time since the last beat that went through (the supervisor's blind spans).
    """

    def __init__(self, server_id: str, seen: Callable[[float], None]) -> None:
        self.server_id = server_id
        self.seen = seen
        self.last_ok = time.monotonic()  # `process.register` wrote the first one
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agentgate-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """No more beats (at once: a beat under way is not waited for)."""
        self._stopped.set()

    def age(self) -> float:
        """Seconds since the last beat that went through."""
        return time.monotonic() - self.last_ok

    def _run(self) -> None:
        interval = settings.GATEWAY_HEARTBEAT_SECONDS
        start = time.monotonic()
        due = next_at = start + interval  # `due`: when the first beat not yet written was due
        failing = False
        try:
            while not self._stopped.wait(max(0.0, next_at - time.monotonic())):
                try:
                    write_soon(process.heartbeat, self.server_id, timeout=BEAT_TIMEOUT_SECONDS)
                except Exception as exc:  # the database away, or too slow: tried again soon
                    if not failing:
                        log.warning("heartbeat not written: %s; trying again", availability.describe(exc))
                    failing = True
                    now = time.monotonic()
                    next_at = min(
                        start + (math.floor((now - start) / interval) + 1) * interval, now + OUTAGE_RETRY_SECONDS
                    )
                    continue
                now = time.monotonic()
                metrics.HEARTBEAT_LATENESS.observe(max(0.0, now - due))
                self.seen(now - self.last_ok)
                if failing:
                    log.info("heartbeat written again after %.1f s", now - self.last_ok)
                failing, self.last_ok = False, now
                # The next beat on the schedule (one missed while this one was late is not made up).
                due = next_at = start + (math.floor((now - start) / interval) + 1) * interval
        finally:
            close_own_connection()


class Supervisor:
    """Starts and stops the heartbeat and the loops of one runtime."""

    def __init__(self, runtime: Supervised) -> None:
        self.runtime = runtime
        self.tasks: list[asyncio.Task[None]] = []
        self.heartbeat: Heartbeat | None = None
        self.scanner = repair.Scanner()
        # When this process could not write its heartbeat (the database away, or a stall of its own);
        # added to by the heartbeat's thread, read by the sweep.
        self.blind: deque[tuple[datetime, datetime]] = deque()
        self._blind_lock = threading.Lock()

    def start(self) -> None:
        self.scanner = repair.Scanner()
        self.blind = deque()
        availability.database.reset()
        availability.channel_layer.reset()
        self.heartbeat = Heartbeat(self.runtime.server_id, self.beat_after)
        self.heartbeat.start()
        self.tasks = [
            asyncio.ensure_future(loop())
            for loop in (self._sweep_loop, self._reconcile_loop, self._repair_loop, self._layer_loop)
        ]

    async def stop(self) -> None:
        beat = self.heartbeat
        if beat is not None:
            beat.stop()
            # A beat under way lands before `stop` returns (a test's next database is clean), or
            # is given up on: it writes nothing but the heartbeat.
            waited_until = time.monotonic() + HEARTBEAT_STOP_SECONDS
            while beat.thread.is_alive() and time.monotonic() < waited_until:
                await asyncio.sleep(0.01)
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
        with self._blind_lock:
            if gap > blind_after(interval):  # (late by less is jitter: the window absorbs it)
                self.blind.append((now - timedelta(seconds=gap - interval), now))
            horizon = now - timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS + 3 * interval)
            while self.blind and self.blind[0][1] < horizon:
                self.blind.popleft()

    def blind_spans(self) -> list[tuple[datetime, datetime]]:
        with self._blind_lock:
            return list(self.blind)

    async def _sweep_loop(self) -> None:
        """Every heartbeat interval: end the runs of dead processes, claim runs nobody executes.

        Not while this process's own heartbeat is overdue: it may not be able to reach the
        database, and the time it could not is known (a blind span) only once a beat goes through.
        Overdue past the window its peers judge it by, the process is unready (`/readyz`).
        """
        rt = self.runtime
        interval = settings.GATEWAY_HEARTBEAT_SECONDS
        while not rt.stopping:
            ok = health.snapshot().get("sweep")
            await asyncio.sleep(interval if ok is None or ok.ok else min(interval, OUTAGE_RETRY_SECONDS))
            beat = self.heartbeat
            age = beat.age() if beat is not None and beat.thread.is_alive() else math.inf
            if blind_after(interval) < age <= process.stale_window_seconds():
                continue  # no verdict on peers until a beat goes through (then the gap is a blind span)
            try:
                if age > process.stale_window_seconds():  # to its peers this process is dead: unready
                    raise HeartbeatOverdue(f"this process's heartbeat has not been written for {age:.1f} s")
                swept = await db_write(recovery.sweep, rt.server_id, self.blind_spans())
                await self._abort_detached()
                for pk in await db_read(process.unowned_active_runs):
                    if rt.accepting and await db_write(runs.claim_run, pk, server_id=rt.server_id):
                        rt.executor.submit(pk)
                metrics.sweep_done(swept.ended, swept.forgotten)
                health.ok("sweep")
            except (Unavailable, HeartbeatOverdue) as exc:  # logged once elsewhere; tried again next pass
                metrics.SWEEPS.labels("error").inc()
                health.failed("sweep", exc)
            except Exception as exc:
                metrics.SWEEPS.labels("error").inc()
                health.failed("sweep", exc)
                log.exception("recovery sweep failed")

    async def _abort_detached(self) -> None:
        """HTTP runs whose client left with an Idempotency-Key are aborted once no retry has
        reattached within GATEWAY_HTTP_REATTACH_SECONDS (HTTP-API.md §14.4; any process may)."""
        cutoff = timezone.now() - timedelta(seconds=settings.GATEWAY_HTTP_REATTACH_SECONDS)
        ended = await db_write(runs.abort_detached, cutoff=cutoff, owner_process=self.runtime.executor.successor_owner)
        if ended:
            log.info("aborted %d HTTP runs left without a client: %s", len(ended), ", ".join(ended))

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
                        await db_write(
                            runs.interrupt_run,
                            pk,
                            message=LOST_WORKER_MESSAGE,
                            owner_process=executor.successor_owner,
                            actor=Actor.SYSTEM,
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
        """SIGTERM: stop taking runs, tell clients, let runs finish briefly, interrupt the rest.

        Within the drain and two seconds more, whatever the load. Runs still going when the drain
        ends are cancelled first: their streams would compete with their endings for the CPU and
        the database threads (a loaded process took 13 s to end a hundred of them one by one while
        they streamed on). Then the process is marked stopped and they are ended together; those
        not ended in time are left to the other processes' recovery sweep (which takes a stopped
        process's runs at once), as are all of them when the database is away.
        """
        rt = self.runtime
        rt.stop_accepting()
        for connection in rt.connections:
            with contextlib.suppress(Exception):
                await connection.send_shutdown("server shutting down")
        deadline = time.monotonic() + drain_seconds
        while rt.executor.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        running = list(rt.executor.tasks.values())
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=STOP_TASKS_SECONDS)
        # Stopped first: from now on the other processes end whatever this one leaves.
        await _in_time(
            db_write(process.mark_stopped, rt.server_id, urgent=True), MARK_STOPPED_SECONDS, "marking it stopped"
        )
        await _in_time(self._end_own_runs(), END_RUNS_SECONDS, "ending this process's runs")
        # Deliver the interruptions from the database before closing: the layer messages
        # carrying them may still be queued behind this drain.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.repair_now(), LAST_REPAIR_SECONDS)
        await self.close_connections()

    async def close_connections(self) -> None:
        """Close every connection with 4001 (the drain's last step; also `serve`'s when the drain runs
        out of time: a connection the process exits under sees 1006 and never learns why)."""
        for connection in self.runtime.connections:
            with contextlib.suppress(Exception):
                await connection.close(code=4001)

    async def _end_own_runs(self) -> None:
        """End this process's active runs as interrupted, several at a time (on PostgreSQL, one
        per database thread; on SQLite in the writer's shared commits)."""
        rt = self.runtime
        pks = await db_read(process.active_runs_of, rt.server_id)
        ended = await asyncio.gather(
            *(db_write(runs.interrupt_run, pk, actor=Actor.SYSTEM, message=SHUTDOWN_MESSAGE) for pk in pks),
            return_exceptions=True,
        )
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome


async def _in_time(step: Awaitable[Any], seconds: float, what: str) -> None:
    """A step of the drain's end, given `seconds`: what it leaves undone, the other processes'
    recovery sweeps do (at once once the process is marked stopped, else once its heartbeat is
    stale, not counting the time they could not reach the database)."""
    try:
        await asyncio.wait_for(step, seconds)
    except Unavailable:
        log.warning("draining: %s: the database is unavailable; the recovery sweep ends the runs left", what)
    except TimeoutError:
        log.warning("draining: %s took over %.1f s; the recovery sweep ends the runs left", what, seconds)
    except Exception:
        log.exception("draining: %s failed; the recovery sweep ends the runs left", what)
