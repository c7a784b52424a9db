"""The run executor: each active run owned by this process is one asyncio task.

A client disconnect never kills a run. An abort reaches the task by cancellation
(locally, or routed here through the channel layer); every delta is stored before
it is broadcast, so nothing of a run is sent after its terminal event.

While the database is away a run goes on reading its model's stream: its text is held back
(never sent unstored) and goes out with the first write that succeeds; its end is written
once the database is back. A tool step's writes wait the same way (`DatabaseWait.patiently`,
handed to the run's `ToolHost`). A run that has been unable to write for
GATEWAY_RUN_DB_WAIT_SECONDS stops and ends `failed` (errorKind `unavailable`), with the text
it had, when the database is back (docs/deployment.md, "When PostgreSQL or Redis goes away").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction

from chat.base import availability, metrics
from chat.base.availability import Unavailable
from chat.base.db import db_read, db_write
from chat.delivery.broadcaster import broadcaster, chat_message
from chat.protocol import frames, run_events
from chat.runtime import inputs, run_usage
from chat.runtime.backends import (
    AgentBackend,
    BackendError,
    BackendTimeout,
    DispatchError,
    RunContext,
    capped,
    get_backend,
)
from chat.runtime.tools.config import config_error, tool_config
from chat.runtime.tools.host import ToolHost
from gatewayproject import logs
from sessions_app import gateway_reads
from sessions_app.lifecycle import runs
from sessions_app.models import Run, RunErrorKind, RunState

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_SECONDS = 0.5  # between a run's attempts to write while the database is away
FINISH_RETRY_MAX_SECONDS = 2.0


class DatabaseWaitOver(Exception):
    """The run has been unable to write for GATEWAY_RUN_DB_WAIT_SECONDS: it stops and fails."""


class DatabaseWait:
    """How long one run has been unable to write; past GATEWAY_RUN_DB_WAIT_SECONDS it may wait no more."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self) -> None:
        """A write (or read) of the run found the database away; raises `DatabaseWaitOver` past the limit."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since >= settings.GATEWAY_RUN_DB_WAIT_SECONDS:
            raise DatabaseWaitOver()

    def cleared(self) -> None:
        self.since = None

    async def patiently(
        self, call: Callable[..., Awaitable[Any]], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """A database call of the run (`db_read` or `db_write` of `fn`), tried again while the
        database is away, for as long as the run may wait (then `DatabaseWaitOver`).

        A write whose error left its commit unclear is tried again as it is: the caller makes
        sure a second try cannot do twice what the first may have done.
        """
        while True:
            try:
                result: T = await call(fn, *args, **kwargs)
            except Unavailable:
                self.failed()
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self.cleared()
            return result


@dataclass
class Progress:
    """A run's reply so far, how much of it is stored (and sent), and how far the run has gone."""

    text: str = ""
    stored: str = ""
    streaming: bool = False  # the backend's stream has begun
    started: bool = False  # `running` is written
    # the last delta sent, until the channel layer has it (`Broadcaster.send_tracked`)
    sending: asyncio.Future[None] | None = None

    def unstored(self) -> str | None:
        """The whole reply, when part of it is not stored yet (for the run's ending to store)."""
        return self.text if self.text != self.stored else None


def stalled_message() -> str:
    return (
        f"the database was unavailable for more than {settings.GATEWAY_RUN_DB_WAIT_SECONDS:g} s "
        "(GATEWAY_RUN_DB_WAIT_SECONDS); the run was stopped"
    )


class RunExecutor:
    """Executes runs as tasks and wakes those waiting for a run's end."""

    def __init__(self) -> None:
        # who owns the queued successor a run's end starts: this process, or '' while it drains
        self.successor_owner = ""
        self.server_id = ""  # this process (its runs' owner_process)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.cancel_started: dict[int, float] = {}
        self.finishing: set[int] = set()
        self.ended_early: set[int] = set()  # runs that ended before their task was started
        self.waiters: dict[int, set[asyncio.Event]] = {}
        self.bookkeeping: set[asyncio.Future[None]] = set()

    def reset(self, server_id: str) -> None:
        self.successor_owner = self.server_id = server_id
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
        task = asyncio.ensure_future(_unless_unavailable(db_write(runs.record_cancel_ms, run_pk, elapsed_ms)))
        self.bookkeeping.add(task)
        task.add_done_callback(self.bookkeeping.discard)

    # --- waiting (chat.send waitMs, a tool call awaiting its approval) ----------------------------

    async def wait_terminal(self, run_pk: int, timeout: float) -> Run | None:
        """Wait until the run is terminal or `timeout` passes; return the run as stored.

        Once the run has been read, a database outage does not end the wait: the answer is
        then the run as last read. `Unavailable` only if it could not be read at all.
        """
        deadline = time.monotonic() + timeout
        last: Run | None = None
        read = False
        with self._waiter(run_pk) as event:
            while True:
                try:
                    run = await db_read(gateway_reads.get_run, run_pk)
                except Unavailable:
                    if not read:
                        raise
                else:
                    read, last = True, run
                    if run is None or run.is_terminal:
                        return run
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return last
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
        wait = DatabaseWait()
        progress = Progress()
        prepared = await self._prepare(run_pk, committed, wait, progress)
        if prepared is None:
            return
        run, backend, ctx = prepared
        loop = asyncio.get_running_loop()
        deadline = loop.time() + run.timeout_ms / 1000
        try:
            async with asyncio.timeout_at(deadline):
                text = await self._stream(run, backend, ctx, wait, progress)
            # the rest of the reply is stored with the run's end, and sent just before it
            await self.finish(
                run_pk,
                RunState.DONE,
                reply=text,
                stop_reason=ctx.stop_reason,
                usage=ctx.usage,
                calls=run_usage.calls_at_end(run, ctx, progress.text),
                wait=wait,
                streamed=True,
                announce_reply=self._announcer(run, progress),
            )
        except asyncio.CancelledError:
            raise  # the run was ended elsewhere; that transition already broadcast
        except Exception as exc:
            overrun_ms = max(0, int((loop.time() - deadline) * 1000))
            state, ending = _ending(exc, run, ctx, progress, overrun_ms)
            if isinstance(exc, BackendError):  # what it had said goes out before its error, as any delta
                ending["announce_reply"] = self._announcer(run, progress)
            if progress.streaming:  # the model was called: what it cost is recorded with the run's end
                ending["calls"] = run_usage.calls_at_end(run, ctx, progress.text)
            await self.finish(run_pk, state, streamed=progress.streaming, **ending)

    async def _prepare(
        self, run_pk: int, committed: Run | None, wait: DatabaseWait, progress: Progress
    ) -> tuple[Run, AgentBackend | None, RunContext] | None:
        """The run, its backend and its context; None when there is nothing to execute (any more)."""
        try:
            logs.run_id.set(str(run_pk))
            # Handed over by its own dispatch: as committed (an abort since then is caught by the
            # run's first write, `running`). Otherwise (a claim, a lost hand-off) read.
            run = committed
            if run is None:
                run = await wait.patiently(db_read, gateway_reads.get_run, run_pk)
            if run is None or run.state != RunState.DISPATCHING:
                return None
            logs.run_id.set(run.run_id)
            backend = get_backend(run.session.agent_id)
            request = inputs.request_of(run)
            window = backend.context_messages if backend is not None and inputs.reads_transcript(request) else 0
            transcript: list[dict[str, Any]] = []
            answered: list[dict[str, str]] = []
            if window or request.tool_results:
                transcript, answered = await wait.patiently(db_read, inputs.read, run, window, request)
            ctx = inputs.context_for(run, transcript, request, answered)
            ctx.record_call = functools.partial(run_usage.record_call, wait.patiently, run.pk, ctx)
            if config_error(ctx.agent) is None:  # a bad one failed the send before its ack
                ctx.tools = ToolHost(run, run.session.agent_id, tool_config(ctx.agent), self.wait_change, wait)
                # a tool step is the run's doing: `running` is written before it
                ctx.tools.before_writes = functools.partial(self._started, run, wait, progress)
            return run, backend, ctx
        except asyncio.CancelledError:
            raise
        except DatabaseWaitOver:
            await self.finish(
                run_pk, RunState.FAILED, error_kind=RunErrorKind.UNAVAILABLE, error_message=stalled_message()
            )
        except Exception:
            # Not even loaded: end it rather than leave the row `running` (§8).
            log.exception("run %s could not be prepared", run_pk)
            await self.finish(run_pk, RunState.FAILED, error_kind=RunErrorKind.UNKNOWN, error_message="internal error")
        return None

    async def _stream(
        self, run: Run, backend: AgentBackend | None, ctx: RunContext, wait: DatabaseWait, progress: Progress
    ) -> str:
        """Dispatch, then pump the stream: the whole reply (its end not stored yet: the run's end stores it).

        `running` is written with the reply's first delta, or alone when the first delta interval
        ends without text or a tool step comes first (`_pump`, `_started`): the status of a run is
        coalesced as its deltas are. Its compare-and-set is the run's first write: if an abort owned
        the run before it, the run stops there (CancelledError), its stream read no further.
        """
        if backend is None:
            raise DispatchError(f"agent {run.session.agent_id!r} has no usable backend")
        stream = capped(await backend.start(ctx), ctx)  # no event may outgrow maxPayload
        progress.streaming = True
        return await self._pump(run, stream, wait, progress)

    async def _pump(self, run: Run, stream: AsyncIterator[str], wait: DatabaseWait, progress: Progress) -> str:
        """Stream chunks to clients, coalesced to one delta per interval, each stored first; the
        whole reply, its last part neither stored nor sent (the run's end does both).

        The interval counts from the start of the stream, and text held back by it goes out
        when the interval ends, whether or not more arrives: a reply that comes whole within
        one interval is one delta, and a model that pauses mid-reply still shows what it said.
        `running` goes with the first delta, or alone when the first interval ends without text.
        The stream is read by a task of its own (`_read`) while deltas are stored and sent
        here, one at a time: the next once the interval has passed, it is stored, and the one
        before has reached the channel layer. So a run's deltas coalesce as far as the database
        or the layer is behind, instead of queueing up behind them, and the model is never kept
        waiting for them; and reading a chunk costs no more than the chunk (no task, no wait of
        its own). While the database is away the stream is still read and the text held back;
        it is tried again every RETRY_SECONDS.
        """
        interval = settings.GATEWAY_DELTA_INTERVAL_MS / 1000
        more = asyncio.Event()  # the reader added text, or ended
        reader = asyncio.ensure_future(self._read(run, stream, progress, more))
        sent = ""
        last = time.monotonic()
        running_due = last + interval  # `running` alone, if no delta has taken it by then
        try:
            while not reader.done():
                if progress.text == sent:
                    more.clear()
                    if progress.started:
                        await more.wait()
                        continue
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, running_due - time.monotonic())):
                            await more.wait()
                    quiet = progress.text == sent and not reader.done() and time.monotonic() >= running_due
                    if quiet and not await self._started(run, wait, progress, once=True):
                        running_due = time.monotonic() + RETRY_SECONDS
                    continue
                due = last + interval - time.monotonic()
                if due > 0:
                    await asyncio.wait({reader}, timeout=due)  # the interval, or the reply's end
                    continue
                text = progress.text
                last = time.monotonic()
                if not await self._flush(run, text, sent, wait, progress):
                    await asyncio.sleep(RETRY_SECONDS)  # the database away: the stream is read on meanwhile
                    continue
                sent = text
            return reader.result()  # or the stream's error: what it said goes out with the run's end
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(BaseException):
                await reader  # retrieved: a stream that failed while the run was ending is no error of its own
            await _aclose(stream)

    async def _read(self, run: Run, stream: AsyncIterator[str], progress: Progress, more: asyncio.Event) -> str:
        """Read the stream into `progress.text`, saying so (`more`) as it grows and when it ends."""
        try:
            async for chunk in stream:
                if chunk and not progress.text:
                    metrics.first_token(run.session.agent_id, run.dispatched_at)
                progress.text += chunk
                more.set()
            return progress.text
        finally:
            more.set()

    async def _flush(self, run: Run, text: str, sent: str, wait: DatabaseWait, progress: Progress) -> bool:
        """Store the text (with `running`, the first time), then send what of it is new, once the layer
        has the delta before (its send overlaps this one's write): True; False when the database is
        away (held back).

        Raises CancelledError when the run ended elsewhere (no delta may follow its terminal
        event), and `DatabaseWaitOver` once the run may wait no longer.
        """
        try:
            if progress.started:
                seq = await db_write(runs.record_delta, run.pk, text)
            else:
                seq = await db_write(runs.start_reply, run.pk, text, owner_process=self.server_id)
        except Unavailable:
            wait.failed()
            return False
        wait.cleared()
        if seq is None:
            raise asyncio.CancelledError()  # ended elsewhere while streaming
        progress.started = True
        progress.stored = text
        payload = run_events.delta_payload(
            run.run_id, run.session.key, str(run.session_generation), seq, text[len(sent) :], text, frames.now_ms()
        )
        owner = run.session.owner_id
        if progress.sending is not None:
            await progress.sending
        progress.sending = broadcaster.send_tracked(owner, chat_message(owner, run.pk, payload))
        return True

    async def _started(self, run: Run, wait: DatabaseWait, progress: Progress, *, once: bool = False) -> bool:
        """Write `running` (without text) unless it is: True once it is. Tried again while the database
        is away, unless `once`; raises as `_flush` does."""
        while not progress.started:
            try:
                seq = await db_write(runs.start_reply, run.pk, owner_process=self.server_id)
            except Unavailable:
                wait.failed()
                if once:
                    return False
                await asyncio.sleep(RETRY_SECONDS)
                continue
            wait.cleared()
            if seq is None:
                raise asyncio.CancelledError()  # ended elsewhere before it ran
            progress.started = True
        return True

    def _announcer(self, run: Run, progress: Progress) -> Callable[[int], None] | None:
        """What sends the rest of the reply, stored with the run's end, as its last delta: registered
        in that transaction (`runs.finish_run`), so that it goes out after commit, before the end."""
        if progress.text == progress.stored:
            return None
        text, sent, owner = progress.text, progress.stored, run.session.owner_id

        def announce(seq: int) -> None:
            payload = run_events.delta_payload(
                run.run_id, run.session.key, str(run.session_generation), seq, text[len(sent) :], text, frames.now_ms()
            )
            transaction.on_commit(
                functools.partial(broadcaster.send, owner, chat_message(owner, run.pk, payload)), robust=True
            )

        return announce

    async def finish(self, run_pk: int, state: str, *, wait: DatabaseWait | None = None, **kwargs: Any) -> None:
        """End the run from its own task: retried on database errors, never cut short.

        While the database is away the ending is tried again (every RETRY_SECONDS, backing off to
        FINISH_RETRY_MAX_SECONDS) until it is back: a run's end is never made up or dropped. A
        `done` that could not be written within the run's `wait` becomes `failed` (unavailable):
        a run whose writes failed is not reported done. Other errors: five tries, then the
        reconcile loop and the recovery sweep end it.

        While it runs the task is `finishing`: the run's own end (and the reconcile
        loop) must not cancel it halfway through its on-commit callbacks and the
        hand-off to the next queued run (which this process then owns).
        """
        self.finishing.add(run_pk)
        attempt = 0
        delay = RETRY_SECONDS
        try:
            while True:
                try:
                    await asyncio.shield(
                        db_write(runs.finish_run, run_pk, state, owner_process=self.successor_owner, **kwargs)
                    )
                    return
                except asyncio.CancelledError:
                    raise
                except Unavailable:
                    if wait is not None and state == RunState.DONE:
                        try:
                            wait.failed()
                        except DatabaseWaitOver:
                            state, wait = RunState.FAILED, None
                            kwargs = {
                                "reply": kwargs.get("reply"),
                                "streamed": kwargs.get("streamed", False),
                                "calls": kwargs.get("calls"),
                                "error_kind": RunErrorKind.UNAVAILABLE,
                                "error_message": stalled_message(),
                            }
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, FINISH_RETRY_MAX_SECONDS)
                except Exception:
                    attempt += 1
                    log.exception("ending run %s failed (attempt %d)", run_pk, attempt)
                    if attempt >= 5:
                        return  # still failing: the reconcile loop and the recovery sweep will end it
                    await asyncio.sleep(0.2 * 2 ** (attempt - 1))
        finally:
            self.finishing.discard(run_pk)


def _ending(
    exc: Exception, run: Run, ctx: RunContext, progress: Progress, overrun_ms: int
) -> tuple[RunState, dict[str, Any]]:
    """How a run that raised ends: its terminal state and what is stored with it.

    Partial text needs no passing on when it is stored: every delta was stored before it was
    sent, and an ending without `reply` keeps what is stored. Text held back (the interval, or
    the database away) is stored with the ending (`reply`).
    """
    reply = progress.unstored()
    if isinstance(exc, DispatchError):
        return RunState.FAILED, {
            "error_kind": RunErrorKind.DISPATCH,
            "error_message": str(exc) or "dispatch failed",
            "reason": "chat.dispatch-error",
        }
    if isinstance(exc, DatabaseWaitOver):
        return RunState.FAILED, {
            "error_kind": RunErrorKind.UNAVAILABLE,
            "error_message": stalled_message(),
            "reply": reply,
        }
    if isinstance(exc, TimeoutError):
        # The backend's work was cancelled at the deadline and its stream closed on the way out:
        # how long that took is the run's cancellation time.
        return RunState.TIMEOUT, {
            "error_kind": RunErrorKind.TIMEOUT,
            "stop_reason": "timeout",
            "error_message": f"run exceeded its budget of {run.timeout_ms} ms (timeoutMs)",
            "cancel_ms": ctx.cancel_ms if ctx.cancel_ms is not None else overrun_ms,
            "reply": reply,
        }
    if isinstance(exc, BackendTimeout):
        return RunState.TIMEOUT, {
            "error_kind": RunErrorKind.TIMEOUT,
            "stop_reason": "timeout",
            "error_message": exc.message,
            "cancel_ms": ctx.cancel_ms,
            "reply": reply,
        }
    if isinstance(exc, BackendError):
        return RunState.FAILED, {"error_kind": exc.kind, "error_message": exc.message, "reply": reply}
    if isinstance(exc, Unavailable):
        # A step that cannot wait for a service (a layer send): the run fails, written once the
        # database is back. (A tool step's writes wait, as the stream's do.)
        return RunState.FAILED, {
            "error_kind": RunErrorKind.UNAVAILABLE,
            "error_message": f"the {availability.named(exc.dependency)} was unavailable mid-run",
            "reply": reply,
        }
    log.error("run %s crashed", run.pk, exc_info=exc)
    return RunState.FAILED, {"error_kind": RunErrorKind.UNKNOWN, "error_message": "internal error", "reply": reply}


async def _unless_unavailable(write: Awaitable[Any]) -> None:
    """A measurement that is not worth waiting for: lost when the database is away."""
    with contextlib.suppress(Unavailable):
        await write


async def _aclose(stream: Any) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()
