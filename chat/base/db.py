"""The bridge from the event loop to the ORM: reads on a pool of threads, writes on the writer.

SQLite takes one writer at a time. Threads racing for its lock wait in its busy handler,
which sleeps in growing steps: that is where multi-second tails come from. So on SQLite
every write runs on one dedicated thread, and what has queued up while it was busy runs
together in one transaction (group commit): each write in its own savepoint, so one that
fails changes nothing and the others stand; its caller hears back only once the whole
transaction has committed, so nothing is acknowledged before it is durable. The busier
the gateway, the more writes share a commit: throughput rises with load. A write that
panics (raises a BaseException that is not an Exception) takes the whole transaction with
it: its caller gets its error, those that had succeeded or not yet run `BatchRolledBack`.
Admissions go first (`urgent`), so an ack never waits behind the deltas of other runs.
Reads run beside the writer (WAL). On PostgreSQL writes are spread over the pool like
reads: its row locks serialise only what touches the same session.

Each call is a plain function run on a thread (no asgiref context hop); the thread's
connection is kept (SQLite) or handed back to the pool (PostgreSQL) after each call.

Every call reports to `availability.database`: an error that means the server is gone
becomes `DatabaseUnavailable` (and the pool forgets its dead connections); while the
database is known to be away, calls are refused at once, but for one trial at a time.

`write_soon` is for the heartbeat's thread: a write that waits neither for the event loop nor
behind the process's other database work (`chat.runtime.supervisor.Heartbeat`).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connection, connections, transaction
from django.db.utils import load_backend

from chat.base import availability

T = TypeVar("T")
log = logging.getLogger(__name__)
BATCH_MAX = 64  # writes sharing one commit, at most
# A statement on a thread's own PostgreSQL connection (`write_soon`) gives up after this.
OWN_STATEMENT_TIMEOUT_MS = 5000

_readers: ThreadPoolExecutor | None = None
_threads: list[threading.Thread] = []  # the readers' (`shutdown`)
_writer: Writer | None = None
_lock = threading.Lock()


def _started() -> None:
    _threads.append(threading.current_thread())


def single_writer() -> bool:
    """Whether writes go through one thread (SQLite)."""
    return connection.vendor == "sqlite"


@dataclass(order=True)
class _Job:
    rank: tuple[int, int]
    call: Callable[[], Any] = field(compare=False)
    future: Future[Any] = field(compare=False)


class BatchRolledBack(DatabaseError):
    """Another write of the batch panicked: the batch's transaction, this write with it, rolled back."""


class WritePanicked(RuntimeError):
    """The write raised a BaseException that is not an Exception (its `__cause__`).

    Handed to its caller in this form: a KeyboardInterrupt or SystemExit re-raised in a
    task on the event loop would stop the whole server, not just fail one request.
    """


class Writer:
    """One thread that runs the process's writes, several to a transaction."""

    def __init__(self) -> None:
        self.jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self.order = itertools.count()
        self.thread = threading.Thread(target=self._run, name="agentgate-writer", daemon=True)
        self.thread.start()

    def submit(self, call: Callable[[], T], *, urgent: bool, first: bool = False) -> Future[T]:
        """Queue a write; `first` ones (the heartbeat) before the urgent, and each in a commit of its own."""
        future: Future[T] = Future()
        self.jobs.put(_Job((-1 if first else 0 if urgent else 1, next(self.order)), call, future))
        return future

    def _run(self) -> None:
        while True:
            batch = [self.jobs.get()]
            while len(batch) < BATCH_MAX and batch[0].rank[0] >= 0:
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            # A write whose caller gave up before it started is not made; once started, it is.
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                self._answer(batch, self._commit(batch))
            except BaseException as exc:  # never lose the writer, nor leave a caller waiting for ever
                log.exception("writer failed")
                error = exc if isinstance(exc, Exception) else _panicked(exc)
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)

    def _commit(self, batch: list[_Job]) -> list[tuple[bool, Any]]:
        """Run the batch; one (ok, result or error) per job."""
        try:
            return [self._alone(batch[0])] if len(batch) == 1 else self._together(batch)
        finally:
            close_old_connections()

    @staticmethod
    def _alone(job: _Job) -> tuple[bool, Any]:
        # Alone: its own transaction (or autocommit) is the commit.
        try:
            return True, job.call()
        except Exception as exc:
            return False, exc
        except BaseException as exc:  # a panic: its caller hears of it, the writer lives on
            log.error("write panicked", exc_info=True)
            return False, _panicked(exc)

    @staticmethod
    def _together(batch: list[_Job]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with transaction.atomic():
                for job in batch:
                    try:
                        with transaction.atomic():  # its own savepoint: a failure undoes only this write
                            outcomes.append((True, job.call()))
                    except Exception as exc:
                        outcomes.append((False, exc))
        except Exception as exc:  # the commit itself failed: nothing of the batch happened
            log.warning("write batch of %d failed to commit", len(batch), exc_info=True)
            return [(False, exc)] * len(batch)
        except BaseException as exc:
            # A panic left the outer block too, which rolled the whole batch back: every
            # caller must hear so, the writes that had succeeded and those never run alike.
            log.error("write batch of %d rolled back: a write panicked", len(batch), exc_info=True)
            # Those that had failed keep their own error (their writes were undone anyway).
            answers = [(False, _rolled_back(exc)) if ok else (ok, value) for ok, value in outcomes]
            if len(answers) < len(batch):  # else the commit itself panicked
                answers.append((False, _panicked(exc)))
            answers += [(False, _rolled_back(exc)) for _job in batch[len(answers) :]]
            return answers
        return outcomes

    @staticmethod
    def _answer(batch: list[_Job], outcomes: list[tuple[bool, Any]]) -> None:
        for job, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)


def _panicked(cause: BaseException) -> WritePanicked:
    error = WritePanicked(f"write panicked: {cause!r}")
    error.__cause__ = cause
    return error


def _rolled_back(cause: BaseException) -> BatchRolledBack:
    # One per caller: an exception raised in several tasks would pile up their tracebacks.
    error = BatchRolledBack(f"write batch rolled back: another write panicked ({cause!r})")
    error.__cause__ = cause
    return error


def _executors() -> tuple[ThreadPoolExecutor, Writer | None]:
    global _readers, _writer
    if _readers is not None:  # every call after the first: no lock (set once, `_writer` first)
        return _readers, _writer
    with _lock:
        if _readers is None:
            _writer = Writer() if single_writer() else None
            # Sized below the PostgreSQL pool, so a burst of calls queues here instead of
            # timing out on the pool; separate from the loop's default executor (DNS lookups).
            _readers = ThreadPoolExecutor(
                max_workers=settings.GATEWAY_DB_THREADS, thread_name_prefix="agentgate-db", initializer=_started
            )
    return _readers, _writer


def shutdown(timeout: float) -> bool:
    """At exit: drop the database calls still queued, close the pool (a call waiting for one of
    its connections fails at once), and wait at most `timeout` seconds for the calls under way.

    False if one still runs (a statement): then the process must not wait for it, and Python's
    exit would (it joins every database thread, however long its call).
    """
    global _readers, _writer
    with _lock:
        readers, _readers, _writer = _readers, None, None  # (the writer's thread is a daemon: not waited for)
    if readers is None:
        return True
    readers.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + timeout
    pool = getattr(connection, "pool", None)  # Django >= 5.1 on PostgreSQL with DB_POOL
    if pool is not None:
        try:
            pool.close(timeout=timeout)
        except Exception:  # closing what is left is all that matters here
            log.debug("closing the connection pool failed", exc_info=True)
    threads = list(_threads)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def _run(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], candidate: bool) -> T:
    try:
        return availability.guarded(fn, args, kwargs, candidate)
    finally:
        # Hands a PostgreSQL connection back to the pool; keeps a healthy SQLite one.
        close_old_connections()


def _bound(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], T]:
    # A clean context: the caller's may carry asgiref markers that would make the ORM
    # call look re-entrant.
    return functools.partial(contextvars.Context().run, fn, *args, **kwargs)


async def db_read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a read (`sessions_app.gateway_reads`) on a database thread.

    Raises `DatabaseUnavailable` when the database is away (at once while that is known).
    """
    readers, _writer = _executors()
    candidate = availability.database.admit()
    return await asyncio.get_running_loop().run_in_executor(readers, _bound(_run, (fn, args, kwargs, candidate), {}))


def write_soon(fn: Callable[..., T], *args: Any, timeout: float) -> T:
    """Run a small write from a thread of the caller's own (the heartbeat's), not the event loop's:
    never behind the process's other database work.

    On SQLite at the head of the writer's queue, in a commit of its own: it waits only for the
    batch under way, at most `timeout` seconds (then `TimeoutError`, and it is not made). SQLite
    takes one writer at a time: a connection of its own would wait for that same batch in
    SQLite's busy handler, and could lose every race for the lock to a writer never idle.
    Elsewhere on a connection of the calling thread's own, outside the pool, so never waiting
    for a pooled connection (bounded by the connect timeout and, on PostgreSQL, a statement
    timeout of OWN_STATEMENT_TIMEOUT_MS); after an error it is closed and the next call opens
    another. Not counted by `availability`: its breaker speaks for the pool, not this connection.
    """
    _readers, writer = _executors()
    if writer is not None:
        future = writer.submit(_bound(fn, args, {}), urgent=True, first=True)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise
    _use_own_connection()
    try:
        return fn(*args)
    except Exception:
        connection.close()
        raise


_own = threading.local()


def _use_own_connection() -> None:
    """Give the calling thread a connection of its own to the default database, outside the pool.

    Django's connections are per thread: the one installed here is this thread's alone.
    """
    if getattr(_own, "installed", False):
        return
    params = copy.deepcopy(connections.settings[DEFAULT_DB_ALIAS])
    options = params.setdefault("OPTIONS", {})
    options.pop("pool", None)
    if connection.vendor == "postgresql":
        timeout = f"-c statement_timeout={OWN_STATEMENT_TIMEOUT_MS}"
        options["options"] = f"{options.get('options', '')} {timeout}".strip()
    params["CONN_MAX_AGE"] = None  # kept open between calls
    connections[DEFAULT_DB_ALIAS] = load_backend(params["ENGINE"]).DatabaseWrapper(params, DEFAULT_DB_ALIAS)
    _own.installed = True


def close_own_connection() -> None:
    """Close the calling thread's own connection (`write_soon`), if it has one."""
    if getattr(_own, "installed", False):
        connection.close()


async def db_write(fn: Callable[..., T], *args: Any, urgent: bool = False, **kwargs: Any) -> T:
    """Run a write (a lifecycle service, or another write) on the writer; `urgent` ones go first.

    Raises `DatabaseUnavailable` as `db_read` does: the write was then not made, or (when the
    connection broke during its commit) its fate is unknown, as after any lost connection.
    """
    readers, writer = _executors()
    candidate = availability.database.admit()
    if writer is None:
        call = _bound(_run, (fn, args, kwargs, candidate), {})
        return await asyncio.get_running_loop().run_in_executor(readers, call)
    guarded = _bound(availability.guarded, (fn, args, kwargs, candidate), {})
    return await asyncio.wrap_future(writer.submit(guarded, urgent=urgent))
