"""The run executor: each active run owned by this process is one asyncio task.

A client disconnect never kills a run. An abort reaches the task by cancellation
(locally, or routed here through the channel layer); every delta is stored before
it is broadcast, so nothing of a run is sent after its terminal event.

While the database is away a run goes on reading its model's stream: its text is held back
(never sent unstored) and goes out with the first write that succeeds; its end is written
once the database is back. A run that has been unable to write for
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

from chat.delivery.broadcaster import broadcaster, chat_message
from chat.protocol import wire
from chat.runtime.availability import Unavailable
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
T = TypeVar("T")
_SERVICE_NAMES = {"database": "database", "channel_layer": "channel layer"}
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


@dataclass
class Progress:
    """A run's reply so far, and how much of it is stored."""

    text: str = ""
    stored: str = ""

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
        try:
            logs.run_id.set(str(run_pk))
            # Handed over by its own dispatch: as committed (an abort since then is caught by
            # `mark_running`, before the backend streams). Otherwise (a claim, a lost hand-off) read.
            run = committed
            if run is None:
                run = await _patiently(wait, db_read, gateway_reads.get_run, run_pk)
            if run is None or run.state != RunState.DISPATCHING:
                return
            logs.run_id.set(run.run_id)
            backend = get_backend(run.session.agent_id)
            window = backend.context_messages if backend is not None else 0
            transcript = await _patiently(wait, db_read, _transcript, run, window) if window else []
            ctx = _context_for(run, transcript)
            if config_error(ctx.agent) is None:  # a bad one failed the send before its ack
                ctx.tools = ToolHost(run, run.session.agent_id, tool_config(ctx.agent), self.wait_change)
        except asyncio.CancelledError:
            raise
        except DatabaseWaitOver:
            await self.finish(run_pk, RunState.FAILED, error_kind="unavailable", error_message=stalled_message())
            return
        except Exception:
            # Not even loaded: end it rather than leave the row `running` (§8).
            log.exception("run %s could not be prepared", run_pk)
            await self.finish(run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + run.timeout_ms / 1000
        progress = Progress()
        try:
            async with asyncio.timeout_at(deadline):
                if backend is None:
                    raise DispatchError(f"agent {run.session.agent_id!r} has no usable backend")
                stream = capped(await backend.start(ctx), ctx)  # no event may outgrow maxPayload
                try:
                    running = await _patiently(wait, db_write, runs.mark_running, run_pk)
                except BaseException:
                    await _aclose(stream)
                    raise
                if not running and not await self._already_running(run_pk, wait):
                    await _aclose(stream)
                    return  # an abort owns the run: the backend never streams
                text = await self._pump(run, stream, wait, progress)
            await self.finish(
                run_pk, RunState.DONE, reply=text, stop_reason=ctx.stop_reason, usage=ctx.usage, wait=wait
            )
        except DispatchError as exc:
            await self.finish(
                run_pk,
                RunState.FAILED,
                error_kind="dispatch",
                error_message=str(exc) or "dispatch failed",
                reason="chat.dispatch-error",
            )
        except DatabaseWaitOver:
            await self.finish(
                run_pk,
                RunState.FAILED,
                error_kind="unavailable",
                error_message=stalled_message(),
                reply=progress.unstored(),
            )
        # Partial text needs no passing on when it is stored: every delta was stored before it
        # was sent, and an ending without `reply` keeps what is stored. Text held back (the
        # interval, or the database away) is stored with the ending.
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
                reply=progress.unstored(),
            )
        except BackendTimeout as exc:
            await self.finish(
                run_pk,
                RunState.TIMEOUT,
                error_kind="timeout",
                stop_reason="timeout",
                error_message=exc.message,
                cancel_ms=ctx.cancel_ms,
                reply=progress.unstored(),
            )
        except BackendError as exc:
            await self.finish(
                run_pk, RunState.FAILED, error_kind=exc.kind, error_message=exc.message, reply=progress.unstored()
            )
        except asyncio.CancelledError:
            raise  # the run was ended elsewhere; that transition already broadcast
        except Unavailable as exc:
            # A step that cannot wait for a service (a tool call's write, a layer send): the run
            # fails, written once the database is back.
            await self.finish(
                run_pk,
                RunState.FAILED,
                error_kind="unavailable",
                error_message=f"the {_SERVICE_NAMES.get(exc.dependency, exc.dependency)} was unavailable mid-run",
                reply=progress.unstored(),
            )
        except Exception:
            log.exception("run %s crashed", run_pk)
            await self.finish(
                run_pk, RunState.FAILED, error_kind="unknown", error_message="internal error", reply=progress.unstored()
            )

    async def _already_running(self, run_pk: int, wait: DatabaseWait) -> bool:
        """`mark_running` said no: was it our own earlier try, committed before its connection
        broke (the retry then finds the run `running`)? Then the run carries on."""
        run = await _patiently(wait, db_read, gateway_reads.get_run, run_pk)
        return run is not None and run.state == RunState.RUNNING and run.owner_process == self.server_id

    async def _pump(self, run: Run, stream: AsyncIterator[str], wait: DatabaseWait, progress: Progress) -> str:
        """Stream chunks to clients, coalesced to one delta per interval, each stored first.

        The interval counts from the start of the stream, and text held back by it goes out
        when the interval ends, whether or not more arrives: a reply that comes whole within
        one interval is one delta, and a model that pauses mid-reply still shows what it said.
        While the database is away the stream is still read and the text held back; it is
        tried again every RETRY_SECONDS, and all of it is stored before the stream's end counts.
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
                        if await self._flush(run, text, sent, wait, progress):
                            sent, last = text, time.monotonic()
                        else:
                            last = time.monotonic() + RETRY_SECONDS - interval
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
                progress.text = text
                now = time.monotonic()
                if now - last >= interval:
                    if await self._flush(run, text, sent, wait, progress):
                        sent, last = text, now
                    else:
                        last = now + RETRY_SECONDS - interval
            while text != sent:  # the reply's end: stored and sent before the run may end
                if await self._flush(run, text, sent, wait, progress):
                    sent = text
                else:
                    await asyncio.sleep(RETRY_SECONDS)
            return text
        except BackendError:
            if text != sent:
                with contextlib.suppress(DatabaseWaitOver):  # else the ending stores it
                    await self._flush(run, text, sent, wait, progress)
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

    async def _flush(self, run: Run, text: str, sent: str, wait: DatabaseWait, progress: Progress) -> bool:
        """Store the text, then send what of it is new: True; False when the database is away (held back).

        Raises CancelledError when the run ended elsewhere (no delta may follow its terminal
        event), and `DatabaseWaitOver` once the run may wait no longer.
        """
        try:
            seq = await db_write(runs.record_delta, run.pk, text)
        except Unavailable:
            wait.failed()
            return False
        wait.cleared()
        if seq is None:
            raise asyncio.CancelledError()  # ended elsewhere while streaming
        progress.stored = text
        payload = wire.delta_payload(
            run.run_id, run.session.key, str(run.session_generation), seq, text[len(sent) :], text, wire.now_ms()
        )
        owner = run.session.owner_id
        broadcaster.send(owner, chat_message(owner, run.pk, payload))
        return True

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
                                "error_kind": "unavailable",
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


async def _patiently(wait: DatabaseWait, call: Callable[..., Awaitable[T]], fn: Callable[..., Any], *args: Any) -> T:
    """A database call of a run, tried again while the database is away, for as long as the run may wait."""
    while True:
        try:
            result = await call(fn, *args)
        except Unavailable:
            wait.failed()
            await asyncio.sleep(RETRY_SECONDS)
            continue
        wait.cleared()
        return result


async def _unless_unavailable(write: Awaitable[Any]) -> None:
    """A measurement that is not worth waiting for: lost when the database is away."""
    with contextlib.suppress(Unavailable):
        await write


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
        model=run.session.model_override,
        thinking_level=run.session.thinking_level,
    )
