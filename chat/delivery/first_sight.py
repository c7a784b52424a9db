"""How a run a connection first hears of from an event is stored, read once per process.

A connection follows a run from an event only once it knows the run has not ended: under a
lagging layer a new connection is handed events of runs killed before (or just after) it
opened, whose terminal went out before it listened. Followed, such a run would stay
`running` on it until repair's next pass. The first connection of the process to ask about
a run starts a read; those asking meanwhile share it, and the runs asked about while a read
is under way are read together in the next one (`gateway_reads.runs_with_sessions`, as repair).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from chat.base.db import db_read
from chat.delivery import agent_events
from chat.delivery.broadcaster import chat_message
from chat.delivery.messages import ChatMessage
from chat.protocol import run_events
from sessions_app import gateway_reads
from sessions_app.models import TERMINAL_STATES

MAX_KNOWN = 4096  # answers kept (an ended run's holds for good)


@dataclass(frozen=True)
class Stored:
    """A run as a read found it: open, ended (with its terminal event), or gone with its session."""

    read_at: float  # time.monotonic() when the read began
    found: bool = True
    terminal: ChatMessage | None = None  # its terminal event, as the broadcast built it
    ended_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.found and self.terminal is None


@dataclass(eq=False)
class _Batch:
    done: asyncio.Future[dict[int, Stored]]
    pks: set[int] = field(default_factory=set)
    started: float = float("inf")  # until it is read: no connection's answer yet


class FirstSight:
    """The runs this process's connections first heard of from an event, as stored.

    An ended or gone run's answer holds for good. An open run's holds only for a connection
    that was already listening when it was read (`since`): a terminal sent after the read
    reaches it (or repair sends it, the run being open there), while a connection that began
    listening later may have missed it and needs a read of its own.
    """

    def __init__(self) -> None:
        self.known: OrderedDict[int, Stored] = OrderedDict()
        self._next: _Batch | None = None  # gathering runs to read
        self._reading: _Batch | None = None
        self._task: asyncio.Task[None] | None = None

    async def stored(self, run_pk: int, since: float) -> Stored:
        """The run as stored, read no earlier than `since` unless it had ended (a monotonic time)."""
        known = self.known.get(run_pk)
        if known is not None and (not known.open or known.read_at >= since):
            self.known.move_to_end(run_pk)
            return known
        batch = self._reading
        if batch is None or run_pk not in batch.pks or batch.started < since:
            if self._next is None:
                self._next = _Batch(asyncio.get_running_loop().create_future())
                self._next.done.add_done_callback(_retrieved)
            batch = self._next
            batch.pks.add(run_pk)
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._read())
        # shielded: one connection leaving must not cancel the others' answer
        found = await asyncio.shield(batch.done)
        return found[run_pk]

    async def _read(self) -> None:
        while (batch := self._next) is not None:
            self._next = None
            self._reading = batch
            batch.started = time.monotonic()
            try:
                found = await db_read(_stored_runs, set(batch.pks), batch.started)
            except asyncio.CancelledError:  # the loop is closing: nobody waits on
                for waiting in (batch, self._next):
                    if waiting is not None:
                        waiting.done.cancel()
                raise
            except Exception as exc:  # (the database away) each asker decides what to do
                batch.done.set_exception(exc)
                continue
            finally:
                self._reading = None
            for pk, stored in found.items():
                self.known[pk] = stored
                self.known.move_to_end(pk)
            while len(self.known) > MAX_KNOWN:
                self.known.popitem(last=False)
            batch.done.set_result(found)


def _stored_runs(pks: set[int], read_at: float) -> dict[int, Stored]:
    found = {pk: Stored(read_at, found=False) for pk in pks}
    for run in gateway_reads.runs_with_sessions(pks):
        if run.state not in TERMINAL_STATES:
            found[run.pk] = Stored(read_at)
            continue
        terminal = chat_message(run.session.owner_id, run.pk, run_events.chat_payload(run, run.session.key))
        terminal["agent"] = agent_events.run_facts(run)
        found[run.pk] = Stored(read_at, terminal=terminal, ended_at=run.ended_at)
    return found


def _retrieved(done: asyncio.Future[dict[int, Stored]]) -> None:
    """A failed read whose askers all left is no unretrieved error (each asker hears of it)."""
    if not done.cancelled():
        done.exception()
