"""Whether the services this process needs are there: the database and the channel layer.

Each is a `Dependency` that the code using it tells of failures (`failed`) and successes
(`ok`). An outage is logged twice however many calls fail during it: once when it is first
seen, once when it is over (with how long it lasted). /metrics shows it too:
`agentgate_dependency_available{dependency}`, `agentgate_dependency_outages_total` and
`agentgate_dependency_outage_seconds` (docs/deployment.md, "When PostgreSQL or Redis goes away").

The database is also a circuit breaker (`admit`, used by `chat.base.db`): while it is known
to be away, calls fail at once with `DatabaseUnavailable` instead of each waiting for the
connection pool, so the database threads stay free and a client hears `UNAVAILABLE` within
milliseconds. At most every `TRIAL_SECONDS` one call is let through (`admit`, on the event
loop); on its thread it becomes the trial (`claim`) unless another trial is under way. The
trial opens a throwaway connection with a short timeout (`probe`), then runs `SELECT 1` on
the pooled connection its call will use; that success ends the outage, before the call's own
work (`guarded`). The trial is claimed and released on the same thread, so a caller cancelled
before its thread ran it (a /readyz deadline, a client gone) leaves nothing behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import InterfaceError, connections
from django.utils import timezone

from chat.base import metrics
from sessions_app.operations.dbcheck import probe_database

log = logging.getLogger(__name__)
T = TypeVar("T")

DATABASE = "database"
CHANNEL_LAYER = "channel_layer"
# each dependency as messages name it ("the database was unavailable", "the channel layer ...")
NAMES = {DATABASE: "database", CHANNEL_LAYER: "channel layer"}


def named(dependency: str) -> str:
    """A dependency as messages name it."""
    return NAMES.get(dependency, dependency.replace("_", " "))


RETRY_AFTER_MS = 2000  # what a client refused for an outage is told to wait before trying again
TRIAL_SECONDS = 0.5  # while the database is away, how often a call may try it
# A trial ends within the probe's and the pool's timeouts; one whose thread hung past this no
# longer blocks the next (a safety net: it is claimed and released on one thread).
TRIAL_ABANDONED_SECONDS = 15.0
# PostgreSQL error classes that mean "the server is not there" (not "your statement failed"):
# connection exceptions; the server shutting down, crashing or still starting up; and what a
# failover or restart answers before the server is really back (too many connections while
# the old ones are not yet gone, a password check against a replica not yet promoted).
_GONE_STATES = ("57P01", "57P02", "57P03", "53300", "28P01")


class Unavailable(Exception):
    """A service this call needs is away; the caller may try again after `retry_after_ms`."""

    def __init__(self, dependency: str, detail: str) -> None:
        super().__init__(f"{dependency} unavailable: {detail}")
        self.dependency = dependency
        self.detail = detail
        self.retry_after_ms = RETRY_AFTER_MS


class DatabaseUnavailable(Unavailable):
    def __init__(self, detail: str) -> None:
        super().__init__(DATABASE, detail)


class ChannelLayerUnavailable(Unavailable):
    def __init__(self, detail: str) -> None:
        super().__init__(CHANNEL_LAYER, detail)


def describe(exc: BaseException | str) -> str:
    """One readable line of an error (the first line of its message)."""
    if isinstance(exc, str):
        return exc[:300]
    text = str(exc).strip()
    return (f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__)[:300]


class Dependency:
    """One service as this process sees it: available or not, since when, and the last error."""

    def __init__(self, name: str, error: Callable[[str], Unavailable]) -> None:
        self.name = name
        self._error = error
        self._lock = threading.Lock()  # calls report from database threads and the event loop
        self.available = True
        self.down_since = 0.0  # time.monotonic() when the outage was first seen
        self.back_at: datetime | None = None  # when the last outage ended (None: never saw one)
        self.detail = ""
        self.refused = 0  # calls refused during the current outage
        self._trial = False
        self._trial_at = 0.0  # when the trial under way was claimed
        self._offered_at = 0.0  # when a call was last let through to try
        metrics.DEPENDENCY_OUTAGES.labels(name)  # exported as 0 before the first outage

    def reset(self) -> None:
        """As at start: available, no outage seen (a test, or a runtime started afresh)."""
        with self._lock:
            self.available, self.back_at, self.detail, self.refused, self._trial = True, None, "", 0, False
            self._offered_at = 0.0

    def failed(self, exc: BaseException | str) -> None:
        """A call found the service away: the first such call starts an outage (logged once)."""
        detail = describe(exc)
        with self._lock:
            self.detail = detail
            if not self.available:
                return
            self.available, self.down_since, self.refused = False, time.monotonic(), 0
        metrics.DEPENDENCY_OUTAGES.labels(self.name).inc()
        log.warning("%s unavailable: %s; waiting for it to come back", self.name, detail)

    def ok(self, started: float | None = None) -> None:
        """A call succeeded: an outage, if there was one, is over (logged once, with its length).

        `started` (time.monotonic()): when the call began. One that began before the outage was
        seen proves nothing about now (it may have had its connection before the server went).
        """
        if self.available:  # the hot path: no lock
            return
        with self._lock:
            if self.available or (started is not None and started <= self.down_since):
                return
            self.available, self.back_at = True, timezone.now()
            lasted, refused = time.monotonic() - self.down_since, self.refused
        metrics.DEPENDENCY_OUTAGE_SECONDS.labels(self.name).observe(lasted)
        log.info("%s available again after %.1f s (%d calls refused meanwhile)", self.name, lasted, refused)

    def outage_seconds(self) -> float:
        """How long the current outage has lasted (0 when available)."""
        return 0.0 if self.available else time.monotonic() - self.down_since

    def refuse(self) -> Unavailable:
        """The error for a call refused during the outage (counted for the closing log line)."""
        with self._lock:
            self.refused += 1
            detail = self.detail
        return self._error(f"{detail or 'unreachable'} (for {self.outage_seconds():.1f} s)")

    def admit(self) -> bool:
        """On the event loop, before a call: go ahead (False), go ahead and try to be the trial
        (True: pass it to `claim` on the call's thread), or raise `Unavailable`.

        Nothing is held for the caller: a call let through but never run (cancelled) only
        means the next one is let through TRIAL_SECONDS later.
        """
        if self.available:
            return False
        now = time.monotonic()
        with self._lock:
            if self.available:
                return False
            if not self._trial_blocking(now) and now - self._offered_at >= TRIAL_SECONDS:
                self._offered_at = now
                return True
        raise self.refuse()

    def claim(self, candidate: bool) -> bool:
        """On the call's thread, before its work: whether it is the trial (then `end_trial` in a
        `finally` on this thread), or raise `Unavailable` while the outage goes on. A call queued
        before the outage was seen is refused here, not after the pool's wait."""
        if self.available:
            return False
        now = time.monotonic()
        with self._lock:
            if self.available:
                return False
            if candidate and not self._trial_blocking(now):
                self._trial, self._trial_at = True, now
                return True
        raise self.refuse()

    def _trial_blocking(self, now: float) -> bool:
        return self._trial and now - self._trial_at <= TRIAL_ABANDONED_SECONDS

    def end_trial(self) -> None:
        with self._lock:
            self._trial = False

    def trial_under_way(self) -> bool:
        return self._trial

    def check(self) -> None:
        """Raise `Unavailable` if the service is known to be away (a call queued before that was seen)."""
        if not self.available:
            raise self.refuse()


database = Dependency(DATABASE, DatabaseUnavailable)
channel_layer = Dependency(CHANNEL_LAYER, ChannelLayerUnavailable)


def database_unreachable(exc: BaseException) -> bool:
    """Whether a database error means the server is not there (not that a statement failed).

    Only PostgreSQL's: SQLite's errors ("database is locked") are contention, and its file
    does not go away.
    """
    if connections["default"].vendor != "postgresql":
        return False
    # only on PostgreSQL: a SQLite deployment need not have psycopg
    import psycopg
    import psycopg_pool

    seen: BaseException | None = exc
    for _depth in range(6):  # Django wraps psycopg's error: look along the chain
        if seen is None:
            return False
        if isinstance(seen, InterfaceError | psycopg.InterfaceError | psycopg_pool.PoolTimeout):
            return True  # a closed connection, or no connection to be had in time
        if isinstance(seen, psycopg.OperationalError):
            state = getattr(seen, "sqlstate", None)
            return state is None or state.startswith("08") or state in _GONE_STATES
        seen = seen.__cause__ or seen.__context__
    return False


def probe() -> None:
    """The trial's first step: a throwaway connection with a short timeout (never the pool)."""
    try:
        probe_database()
    except Exception as exc:
        database.failed(exc)
        raise DatabaseUnavailable(describe(exc)) from exc


def _select_one() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def guarded(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], candidate: bool) -> T:
    """Run one database call on its thread, telling `database` how it went.

    `candidate`: what `admit` said on the loop. The trial (`claim`) is the probe and a pooled
    `SELECT 1`; their success ends the outage before `fn` runs, so a long or failing `fn` does
    not keep it open. An error that is not the server gone (an IntegrityError, DoesNotExist)
    still proves the server answered.
    """
    started = time.monotonic()
    try:
        if database.claim(candidate):
            try:
                probe()
                _select_one()
            finally:
                database.end_trial()
            database.ok(started)
        return_value = fn(*args, **kwargs)
    except Unavailable:
        raise
    except Exception as exc:
        if not database_unreachable(exc):
            database.ok(started)
            raise
        database.failed(exc)
        forget_pooled_connections()
        raise DatabaseUnavailable(describe(exc)) from exc
    database.ok(started)
    return return_value


def forget_pooled_connections() -> None:
    """After the server went away: the pool's connections are dead; its pool makes new ones.

    Those in use now are discarded when they come back (psycopg-pool's `drain`), so no call
    after the outage is handed a connection from before it.
    """
    pool = getattr(connections["default"], "pool", None)  # Django >= 5.1 on PostgreSQL with DB_POOL
    if pool is not None:
        try:
            pool.drain()
        except Exception:  # a closed pool (shutting down) has nothing to forget
            log.debug("draining the connection pool failed", exc_info=True)
