"""The per-process run manager: runs execute as its asyncio tasks, not the socket's.

A client disconnect never kills a run. Each run is one task; aborts reach it
wherever it executes: locally by cancelling the task, across processes through
the channel layer (`proc.<server_id>` group), and, as a backstop for a dropped
layer message, by a reconcile loop that cancels local tasks whose run the
database says has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from chat.db import db_sync_to_async
from gatewayproject import logs
from sessions_app import lifecycle, process
from sessions_app.models import ACTIVE_STATES, Message, Run, RunState

from .. import delivery, groups, metrics, protocol
from . import health
from .backends import BackendError, BackendTimeout, DispatchError, RunContext, get_backend

log = logging.getLogger(__name__)


class RunManager:
    """Owns the run tasks and background loops of this process."""

    def __init__(self) -> None:
        self.server_id = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.cancel_started: dict[int, float] = {}
        self.finishing: set[int] = set()
        self.waiters: dict[int, set[asyncio.Event]] = {}
        self.consumers: set[Any] = set()
        self.scanner = _new_scanner()
        self.background: list[asyncio.Task[None]] = []
        self.bookkeeping: set[asyncio.Future[None]] = set()
        self.accepting = True
        self.stopping = False
        self.channel_name: str | None = None

    # --- lifecycle of the manager ----------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.loop is not None and not self.loop.is_closed() and self.loop.is_running()

    async def ensure_started(self) -> None:
        """Start on the current loop (idempotent; restarts if a test brought a new loop)."""
        loop = asyncio.get_running_loop()
        if self.loop is loop:
            return
        if self.loop is not None:
            self._forget()
        self.loop = loop
        self.server_id = f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.accepting = True
        self.stopping = False
        self.scanner = _new_scanner()
        health.reset()
        process.set_current(self.server_id)
        await db_sync_to_async(process.register)(self.server_id)
        self.background = [
            asyncio.ensure_future(self._heartbeat_loop()),
            asyncio.ensure_future(self._reconcile_loop()),
            asyncio.ensure_future(self._repair_loop()),
            asyncio.ensure_future(self._listen_loop()),
        ]
        log.info("run manager %s started", self.server_id)

    def _forget(self) -> None:
        """Drop state bound to an old event loop (tests start a new loop per test)."""
        for task in [*self.tasks.values(), *self.background]:
            if not task.done() and task.get_loop().is_running():
                task.cancel()
        self.tasks.clear()
        self.background.clear()
        self.waiters.clear()
        self.consumers.clear()
        self.channel_name = None
        process.set_current("")
        self.loop = None

    async def stop(self) -> None:
        """Stop background loops and local runs (tests); runs are not ended in the DB."""
        self.stopping = True
        tasks = [*self.background, *self.tasks.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            # A client library may swallow a cancellation (redis-py turns it into its own
            # TimeoutError); the `stopping` flag ends those loops, and we never wait forever.
            await asyncio.wait(tasks, timeout=5)
        self._forget()

    # --- thread-safe entry points (from on-commit callbacks) ----------------------------------

    def call_threadsafe(self, fn: Any, *args: Any) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # loop closed meanwhile
                # A clean context: the caller's carries asgiref's thread-executor
                # markers, which would make the run's own sync calls look re-entrant.
                loop.call_soon_threadsafe(fn, *args, context=contextvars.Context())

    def submit(self, run_pk: int) -> None:
        """Start executing an active run owned by this process (on the loop)."""
        if run_pk in self.tasks or self.loop is None:
            return
        task = self.loop.create_task(self._execute(run_pk), context=contextvars.Context())
        self.tasks[run_pk] = task
        task.add_done_callback(functools.partial(self._task_done_cb, run_pk))

    def cancel(self, run_pk: int) -> None:
        """The run ended elsewhere (abort, reset, timeout sweep): stop its work now."""
        if run_pk in self.finishing:
            return  # the task is ending the run itself (or lost the race to do so)
        task = self.tasks.get(run_pk)
        if task is not None and not task.done():
            self.cancel_started[run_pk] = time.monotonic()
            task.cancel()

    def notify(self, run_pk: int) -> None:
        for event in self.waiters.get(run_pk, ()):
            event.set()

    def _task_done_cb(self, run_pk: int, _task: asyncio.Task[None]) -> None:
        self._task_done(run_pk)

    def _task_done(self, run_pk: int) -> None:
        self.tasks.pop(run_pk, None)
        started = self.cancel_started.pop(run_pk, None)
        if started is not None and self.loop is not None:
            elapsed = int((time.monotonic() - started) * 1000)
            task = asyncio.ensure_future(db_sync_to_async(lifecycle.record_cancel_ms)(run_pk, elapsed))
            self.bookkeeping.add(task)
            task.add_done_callback(self.bookkeeping.discard)

    # --- waiting (chat.send waitMs) ------------------------------------------------------------

    async def wait_terminal(self, run_pk: int, timeout: float) -> Run | None:
        """Wait until the run is terminal or `timeout` passes; return the run as stored."""
        event = asyncio.Event()
        self.waiters.setdefault(run_pk, set()).add(event)
        deadline = time.monotonic() + timeout
        try:
            while True:
                run = await db_sync_to_async(lifecycle.get_run)(run_pk)
                if run is None or run.is_terminal:
                    return run
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return run
                event.clear()
                # The local notification is fast; the poll covers runs on other processes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, 0.5))
        finally:
            events = self.waiters.get(run_pk)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.waiters[run_pk]

    # --- execution -------------------------------------------------------------------------------

    async def _execute(self, run_pk: int) -> None:
        try:
            logs.run_id.set(str(run_pk))
            run = await db_sync_to_async(lifecycle.get_run)(run_pk)
            if run is None or run.state != RunState.DISPATCHING:
                return
            logs.run_id.set(run.run_id)
            ctx = await db_sync_to_async(_context_for)(run)
            backend = get_backend(run.session.agent_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Not even loaded: end it rather than leave the row `running` (§8).
            log.exception("run %s could not be prepared", run_pk)
            await self._finish(run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error")
            return
        text = ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + run.timeout_ms / 1000
        try:
            async with asyncio.timeout_at(deadline):
                if backend is None:
                    raise DispatchError(f"agent {run.session.agent_id!r} has no usable backend")
                stream = await backend.start(ctx)
                if not await db_sync_to_async(lifecycle.mark_running)(run_pk):
                    await _aclose(stream)
                    return  # an abort owns the run: the backend never streams
                text = await self._pump(run, stream)
            await self._finish(run_pk, RunState.DONE, reply=text, stop_reason=ctx.stop_reason, usage=ctx.usage)
        except DispatchError as exc:
            await self._finish(
                run_pk, RunState.FAILED, error_kind="dispatch", error_message=str(exc) or "dispatch failed",
                reason="chat.dispatch-error",
            )
        # Partial text needs no passing on: every delta was stored before it was sent,
        # and an ending without `reply` keeps what is stored.
        except TimeoutError:
            # The backend's work was cancelled at the deadline and its stream closed on the
            # way out: how long that took is the run's cancellation time.
            await self._finish(
                run_pk, RunState.TIMEOUT, error_kind="timeout", stop_reason="timeout",
                error_message=f"run exceeded its budget of {run.timeout_ms} ms (timeoutMs)",
                cancel_ms=max(0, int((loop.time() - deadline) * 1000)),
            )
        except BackendTimeout as exc:
            await self._finish(
                run_pk, RunState.TIMEOUT, error_kind="timeout", stop_reason="timeout",
                error_message=exc.message,
            )
        except BackendError as exc:
            await self._finish(
                run_pk, RunState.FAILED, error_kind=exc.kind, error_message=exc.message,
            )
        except asyncio.CancelledError:
            raise  # the run was ended elsewhere; that transition already broadcast
        except Exception:
            log.exception("run %s crashed", run_pk)
            await self._finish(run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error")

    async def _pump(self, run: Run, stream: AsyncIterator[str]) -> str:
        """Stream chunks to clients, coalesced to one delta per interval, persisted first."""
        interval = settings.GATEWAY_DELTA_INTERVAL_MS / 1000
        text = ""
        sent = ""
        last = 0.0
        key = run.session.key
        gen = str(run.session_generation)
        owner = run.session.owner_id
        try:
            async for chunk in stream:
                if chunk and not text:
                    metrics.first_token(run.session.agent_id, run.dispatched_at)
                text += chunk
                now = time.monotonic()
                if now - last >= interval:
                    if not await self._flush(run, owner, key, gen, text, sent):
                        break
                    sent, last = text, now
            else:
                if text != sent:
                    await self._flush(run, owner, key, gen, text, sent)
                return text
        except BackendError:
            if text != sent:
                await self._flush(run, owner, key, gen, text, sent)
            raise
        finally:
            await _aclose(stream)
        raise asyncio.CancelledError()  # ended elsewhere while streaming

    async def _flush(self, run: Run, owner: int, key: str, gen: str, text: str, sent: str) -> bool:
        seq = await db_sync_to_async(lifecycle.record_delta)(run.pk, text)
        if seq is None:
            return False  # the run ended: no delta may follow its terminal event
        payload = protocol.delta_payload(run.run_id, key, gen, seq, text[len(sent):], text, protocol.now_ms())
        await delivery.agroup_send_all(owner, delivery.chat_message(owner, run.pk, payload))
        return True

    async def _finish(self, run_pk: int, state: str, **kwargs: Any) -> None:
        """End the run from its own task: retried on database errors, never cut short.

        While it runs the task is `finishing`: the run's own end (and the reconcile
        loop) must not cancel it halfway through its on-commit broadcasts and the
        hand-off to the next queued run.
        """
        self.finishing.add(run_pk)
        try:
            for attempt in range(5):
                try:
                    await asyncio.shield(db_sync_to_async(lifecycle.finish_run)(run_pk, state, **kwargs))
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("ending run %s failed (attempt %d)", run_pk, attempt + 1)
                    await asyncio.sleep(0.2 * 2**attempt)
            # Still failing: the reconcile loop and the recovery sweep will end it.
        finally:
            self.finishing.discard(run_pk)

    # --- background loops ------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        from sessions_app import recovery

        while not self.stopping:
            await asyncio.sleep(settings.GATEWAY_HEARTBEAT_SECONDS)
            try:
                await db_sync_to_async(process.heartbeat)(self.server_id)
                swept = await db_sync_to_async(recovery.sweep)(self.server_id)
                for pk in await db_sync_to_async(process.unowned_active_runs)():
                    if self.accepting and await db_sync_to_async(lifecycle.claim_run)(pk, self.server_id):
                        self.submit(pk)
                metrics.sweep_done(swept.ended, swept.forgotten)
                health.ok("sweep")
            except Exception as exc:
                metrics.SWEEPS.labels("error").inc()
                health.failed("sweep", exc)
                log.exception("heartbeat/recovery sweep failed")

    async def _reconcile_loop(self) -> None:
        """Make this process's tasks and the database agree, both ways.

        - a local task whose run ended elsewhere (a dropped abort message) is cancelled;
        - an active run owned by this process with no task (a lost hand-off, a task that
          died) is executed if still dispatching, or ended failed/interrupted if it was
          already running: nothing is left `running` with nothing behind it.
        """
        while not self.stopping:
            await asyncio.sleep(settings.GATEWAY_REPAIR_SECONDS)
            try:
                local = list(self.tasks)
                ended, orphans = await db_sync_to_async(_reconcile_snapshot)(self.server_id, local)
                for pk in ended:
                    self.cancel(pk)
                for pk, state in orphans:
                    if pk in self.tasks or pk in self.finishing or not self.accepting:
                        continue  # (while draining, the drain ends whatever is left)
                    if state == RunState.DISPATCHING and self.accepting:
                        self.submit(pk)
                    else:
                        await self._finish(
                            pk, RunState.FAILED, error_kind="interrupted", reason="run.interrupted",
                            error_message="the run lost its worker in this gateway process",
                        )
                health.ok("reconcile")
            except Exception as exc:
                health.failed("reconcile", exc)
                log.exception("reconcile failed")

    async def _repair_loop(self) -> None:
        """§9: one database pass for all connections of this process, twice per repair window."""
        from .. import repair

        interval = max(0.2, settings.GATEWAY_REPAIR_SECONDS / 2)
        while not self.stopping:
            await asyncio.sleep(interval)
            try:
                await repair.repair(list(self.consumers), self.scanner)
                metrics.REPAIR_PASSES.labels("ok").inc()
                health.ok("repair")
            except Exception as exc:
                metrics.REPAIR_PASSES.labels("error").inc()
                health.failed("repair", exc)
                log.exception("repair pass failed")

    async def _listen_loop(self) -> None:
        """Cross-process aborts and hand-offs (`proc.<server_id>`); restarted, and logged, when it fails."""
        layer = get_channel_layer()
        if layer is None:
            return
        delay = 1.0
        while not self.stopping:
            try:
                self.channel_name = await layer.new_channel()
                await layer.group_add(groups.process_group(self.server_id), self.channel_name)
                health.ok("listener")
                delay = 1.0
                while not self.stopping:
                    message = await layer.receive(self.channel_name)
                    health.ok("listener")
                    if message.get("type") == "run.cancel":
                        self.cancel(int(message["run"]))
                    elif message.get("type") == "run.submit":
                        self.submit(int(message["run"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.stopping:
                    return
                health.failed("listener", exc, restart=True)
                metrics.channel_layer_failed("listener")
                metrics.BACKGROUND_RESTARTS.labels("listener").inc()
                log.exception("process channel listener failed; restarting in %.0fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # --- shutdown ----------------------------------------------------------------------------------

    async def drain_and_stop(self, drain_seconds: float) -> None:
        """SIGTERM: stop taking runs, tell clients, let runs finish briefly, interrupt the rest."""
        self.accepting = False
        # Runs started from now on (the queued successors of runs that end during the
        # drain) are left unowned, so a live process claims them instead of this one.
        process.set_current("")
        for consumer in list(self.consumers):
            with contextlib.suppress(Exception):
                await consumer.send_shutdown("server shutting down")
        deadline = time.monotonic() + drain_seconds
        while self.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await db_sync_to_async(lifecycle.interrupt_runs_of_process)(
            self.server_id, actor="system", message="gateway process shut down before the run finished"
        )
        await db_sync_to_async(process.mark_stopped)(self.server_id)
        # Deliver the interruptions from the database before closing: the layer messages
        # carrying them may still be queued behind this drain.
        from .. import repair

        with contextlib.suppress(Exception):
            await repair.repair(list(self.consumers), self.scanner)
        for consumer in list(self.consumers):
            with contextlib.suppress(Exception):
                await consumer.close(code=4001)
        await self.stop()


async def _aclose(stream: Any) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()


def _reconcile_snapshot(server_id: str, local: list[int]) -> tuple[list[int], list[tuple[int, str]]]:
    """(local runs that are no longer active, active runs of this process without a local task)."""
    active = set(Run.objects.filter(pk__in=local, state__in=ACTIVE_STATES).values_list("pk", flat=True))
    ended = [pk for pk in local if pk not in active]
    mine = Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).exclude(pk__in=local)
    return ended, list(mine.values_list("pk", "state"))


def _context_for(run: Run) -> RunContext:
    """Build the backend context: the run plus the transcript of its generation."""
    msgs = Message.objects.filter(session_id=run.session_id, session_generation=run.session_generation).order_by("id")
    transcript = [{"role": m.role, "text": m.text, "aborted": m.aborted, "run": m.run_id} for m in msgs]
    return RunContext(
        run_pk=run.pk, run_id=run.run_id, session_key=run.session.key, session_id=str(run.session_generation),
        agent_id=run.session.agent_id, agent=dict(settings.GATEWAY_AGENTS.get(run.session.agent_id, {})),
        message=run.message, attachments=list(run.attachments or []), transcript=transcript,
        timeout_ms=run.timeout_ms,
    )


def _new_scanner() -> Any:
    from ..repair import Scanner

    return Scanner()


run_manager = RunManager()
