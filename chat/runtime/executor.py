"""The run executor: each active run owned by this process is one asyncio task.

A client disconnect never kills a run. An abort reaches the task by cancellation
(locally, or routed here through the channel layer); every delta is stored before
it is broadcast, so nothing of a run is sent after its terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.conf import settings

from chat.delivery.broadcaster import broadcaster, chat_message
from chat.protocol import wire
from chat.runtime.backends import BackendError, BackendTimeout, DispatchError, RunContext, capped, get_backend
from chat.runtime.db import db_read, db_write
from chat.runtime.tools.host import ToolHost, config_error, tool_config
from chat.runtime.tools.servers import model_name
from chat.web import metrics
from gatewayproject import logs
from sessions_app import gateway_reads
from sessions_app.lifecycle import runs
from sessions_app.models import Run, RunState

log = logging.getLogger(__name__)


class RunExecutor:
    """Executes runs as tasks and wakes those waiting for a run's end."""

    def __init__(self) -> None:
        # who owns the queued successor a run's end starts: this process, or '' while it drains
        self.successor_owner = ""
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.cancel_started: dict[int, float] = {}
        self.finishing: set[int] = set()
        self.ended_early: set[int] = set()  # runs that ended before their task was started
        self.waiters: dict[int, set[asyncio.Event]] = {}
        self.bookkeeping: set[asyncio.Future[None]] = set()

    def reset(self, server_id: str) -> None:
        self.successor_owner = server_id
        self.tasks.clear()
        self.cancel_started.clear()
        self.finishing.clear()
        self.ended_early.clear()
        self.waiters.clear()

    async def stop(self) -> None:
        """Cancel local run tasks (the database is left as it is: recovery ends them)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self.tasks.clear()

    # --- entry points (on the loop) -------------------------------------------------------------

    def submit(self, run_pk: int, committed: Run | None = None) -> None:
        """Start executing an active run owned by this process (`committed`: as its dispatch committed)."""
        if run_pk in self.tasks:
            return
        if run_pk in self.ended_early:  # its end overtook its hand-off: the backend is never called
            self.ended_early.discard(run_pk)
            return
        # A clean context: the caller's may carry asgiref's thread-executor markers, which
        # would make the run's own sync calls look re-entrant.
        task = asyncio.get_running_loop().create_task(self._execute(run_pk, committed), context=contextvars.Context())
        self.tasks[run_pk] = task
        task.add_done_callback(functools.partial(self._task_done, run_pk))

    def cancel(self, run_pk: int) -> None:
        """The run ended elsewhere (abort, reset, timeout sweep): stop its work now."""
        if run_pk in self.finishing:
            return  # the task is ending the run itself (or lost the race to do so)
        task = self.tasks.get(run_pk)
        if task is None:
            # Not started yet (on PostgreSQL an abort's commit can overtake the hand-off).
            self.ended_early.add(run_pk)
            if len(self.ended_early) > 10_000:
                self.ended_early.clear()
        elif not task.done():
            self.cancel_started[run_pk] = time.monotonic()
            task.cancel()

    def notify(self, run_pk: int) -> None:
        """The run changed: wake its waiters."""
        for event in self.waiters.get(run_pk, ()):
            event.set()

    def _task_done(self, run_pk: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(run_pk, None)
        started = self.cancel_started.pop(run_pk, None)
        if started is not None:
            # An abort's cost: from the cancellation to the backend's work being released.
            self._store_cancel_ms(run_pk, int((time.monotonic() - started) * 1000))

    def _store_cancel_ms(self, run_pk: int, elapsed_ms: int) -> None:
        task = asyncio.ensure_future(db_write(runs.record_cancel_ms, run_pk, elapsed_ms))
        self.bookkeeping.add(task)
        task.add_done_callback(self.bookkeeping.discard)

    # --- waiting (chat.send waitMs, a tool call awaiting its approval) ----------------------------

    async def wait_terminal(self, run_pk: int, timeout: float) -> Run | None:
        """Wait until the run is terminal or `timeout` passes; return the run as stored."""
        deadline = time.monotonic() + timeout
        with self._waiter(run_pk) as event:
            while True:
                run = await db_read(gateway_reads.get_run, run_pk)
                if run is None or run.is_terminal:
                    return run
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return run
                event.clear()
                # The local notification is fast; the poll covers runs on other processes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, 0.5))

    async def wait_change(self, run_pk: int, timeout: float) -> None:
        """Until the run (or one of its tool calls or approvals) changes here, or `timeout` passes."""
        with self._waiter(run_pk) as event, contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    @contextlib.contextmanager
    def _waiter(self, run_pk: int) -> Iterator[asyncio.Event]:
        """An event `notify(run_pk)` sets, registered for as long as the block lasts."""
        event = asyncio.Event()
        self.waiters.setdefault(run_pk, set()).add(event)
        try:
            yield event
        finally:
            events = self.waiters.get(run_pk)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.waiters[run_pk]

    # --- execution ------------------------------------------------------------------------------

    async def _execute(self, run_pk: int, committed: Run | None = None) -> None:
        try:
            logs.run_id.set(str(run_pk))
            # Handed over by its own dispatch: as committed (an abort since then is caught by
            # `mark_running`, before the backend streams). Otherwise (a claim, a lost hand-off) read.
            run = committed
            if run is None:
                run = await db_read(gateway_reads.get_run, run_pk)
            if run is None or run.state != RunState.DISPATCHING:
                return
            logs.run_id.set(run.run_id)
            backend = get_backend(run.session.agent_id)
            window = backend.context_messages if backend is not None else 0
            transcript = await db_read(_transcript, run, window) if window else []
            ctx = _context_for(run, transcript)
            if config_error(ctx.agent) is None:  # a bad one failed the send before its ack
                ctx.tools = ToolHost(run, run.session.agent_id, tool_config(ctx.agent), self.wait_change)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Not even loaded: end it rather than leave the row `running` (§8).
            log.exception("run %s could not be prepared", run_pk)
            await self.finish(run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + run.timeout_ms / 1000
        try:
            async with asyncio.timeout_at(deadline):
                if backend is None:
                    raise DispatchError(f"agent {run.session.agent_id!r} has no usable backend")
                stream = capped(await backend.start(ctx), ctx)  # no event may outgrow maxPayload
                if not await db_write(runs.mark_running, run_pk):
                    await _aclose(stream)
                    return  # an abort owns the run: the backend never streams
                text = await self._pump(run, stream)
            await self.finish(run_pk, RunState.DONE, reply=text, stop_reason=ctx.stop_reason, usage=ctx.usage)
        except DispatchError as exc:
            await self.finish(
                run_pk,
                RunState.FAILED,
                error_kind="dispatch",
                error_message=str(exc) or "dispatch failed",
                reason="chat.dispatch-error",
            )
        # Partial text needs no passing on: every delta was stored before it was sent,
        # and an ending without `reply` keeps what is stored.
        except TimeoutError:
            # The backend's work was cancelled at the deadline and its stream closed on the
            # way out: how long that took is the run's cancellation time.
            measured = max(0, int((loop.time() - deadline) * 1000))
            await self.finish(
                run_pk,
                RunState.TIMEOUT,
                error_kind="timeout",
                stop_reason="timeout",
                error_message=f"run exceeded its budget of {run.timeout_ms} ms (timeoutMs)",
                cancel_ms=ctx.cancel_ms if ctx.cancel_ms is not None else measured,
            )
        except BackendTimeout as exc:
            await self.finish(
                run_pk,
                RunState.TIMEOUT,
                error_kind="timeout",
                stop_reason="timeout",
                error_message=exc.message,
                cancel_ms=ctx.cancel_ms,
            )
        except BackendError as exc:
            await self.finish(run_pk, RunState.FAILED, error_kind=exc.kind, error_message=exc.message)
        except asyncio.CancelledError:
            raise  # the run was ended elsewhere; that transition already broadcast
        except Exception:
            log.exception("run %s crashed", run_pk)
            await self.finish(run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error")

    async def _pump(self, run: Run, stream: AsyncIterator[str]) -> str:
        """Stream chunks to clients, coalesced to one delta per interval, each stored first.

        The interval counts from the start of the stream, and text held back by it goes out
        when the interval ends, whether or not more arrives: a reply that comes whole within
        one interval is one delta, and a model that pauses mid-reply still shows what it said.
        """
        interval = settings.GATEWAY_DELTA_INTERVAL_MS / 1000
        text = sent = ""
        last = time.monotonic()
        chunks = stream.__aiter__()
        pending: asyncio.Future[str] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(chunks.__anext__())
                if text != sent and not pending.done():
                    # Held-back text: wait for more only until the interval ends.
                    done, _ = await asyncio.wait({pending}, timeout=max(0.0, last + interval - time.monotonic()))
                    if not done:
                        if not await self._flush(run, text, sent):
                            raise asyncio.CancelledError()  # ended elsewhere while streaming
                        sent, last = text, time.monotonic()
                        continue
                try:
                    chunk = await pending
                except StopAsyncIteration:
                    break
                finally:
                    pending = None if pending.done() else pending
                if chunk and not text:
                    metrics.first_token(run.session.agent_id, run.dispatched_at)
                text += chunk
                now = time.monotonic()
                if now - last >= interval:
                    if not await self._flush(run, text, sent):
                        raise asyncio.CancelledError()  # ended elsewhere while streaming
                    sent, last = text, now
            if text != sent:
                await self._flush(run, text, sent)
            return text
        except BackendError:
            if text != sent:
                await self._flush(run, text, sent)
            raise
        finally:
            if pending is not None:
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
                elif not pending.cancelled():
                    pending.exception()  # retrieved: a stream that ended while the run was ending is no error
            await _aclose(stream)

    async def _flush(self, run: Run, text: str, sent: str) -> bool:
        seq = await db_write(runs.record_delta, run.pk, text)
        if seq is None:
            return False  # the run ended: no delta may follow its terminal event
        payload = wire.delta_payload(
            run.run_id, run.session.key, str(run.session_generation), seq, text[len(sent) :], text, wire.now_ms()
        )
        owner = run.session.owner_id
        broadcaster.send(owner, chat_message(owner, run.pk, payload))
        return True

    async def finish(self, run_pk: int, state: str, **kwargs: Any) -> None:
        """End the run from its own task: retried on database errors, never cut short.

        While it runs the task is `finishing`: the run's own end (and the reconcile
        loop) must not cancel it halfway through its on-commit callbacks and the
        hand-off to the next queued run (which this process then owns).
        """
        self.finishing.add(run_pk)
        try:
            for attempt in range(5):
                try:
                    await asyncio.shield(
                        db_write(runs.finish_run, run_pk, state, owner_process=self.successor_owner, **kwargs)
                    )
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("ending run %s failed (attempt %d)", run_pk, attempt + 1)
                    await asyncio.sleep(0.2 * 2**attempt)
            # Still failing: the reconcile loop and the recovery sweep will end it.
        finally:
            self.finishing.discard(run_pk)


async def _aclose(stream: Any) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()


def _transcript(run: Run, window: int) -> list[dict[str, Any]]:
    """The newest `window` messages of the run's generation (as much as its backend reads).

    An assistant message of a run that called tools carries them (`tools`: id, the model's
    function name, arguments, result, status and where in the text each came), so the model
    is sent its calls and their results again rather than calling again to learn them.
    """
    messages = gateway_reads.context_messages(run, limit=window)
    calls = gateway_reads.tool_calls_of({m.run_id for m in messages if m.role == "assistant" and m.run_id})
    out = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "text": m.text, "aborted": m.aborted, "run": m.run_id}
        if m.role == "assistant" and m.run_id in calls:
            item["tools"] = [
                {
                    "id": c.call_id,
                    "name": model_name(c.server, c.tool),
                    "arguments": c.arguments,
                    "result": c.result,
                    "status": c.state,
                    "step": c.step,
                    "offset": c.reply_offset,
                }
                for c in calls[m.run_id]
            ]
        out.append(item)
    return out


def _context_for(run: Run, transcript: list[dict[str, Any]]) -> RunContext:
    """The backend's context: the run and its transcript."""
    return RunContext(
        run_pk=run.pk,
        run_id=run.run_id,
        session_key=run.session.key,
        session_id=str(run.session_generation),
        agent_id=run.session.agent_id,
        agent=dict(settings.GATEWAY_AGENTS.get(run.session.agent_id, {})),
        message=run.message,
        attachments=list(run.attachments or []),
        transcript=transcript,
        timeout_ms=run.timeout_ms,
    )
