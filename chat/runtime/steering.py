"""A running run's steering messages (docs/protocol-notes.md, "Steering"): checked for at each boundary
of its steps, taken through the lifecycle (`sessions_app.lifecycle.steering.deliver`), handed to the
backend for its next request.

The check is a read of the database, where every steer is admitted: so a steer reaches the run
whichever process admitted it, as a queued run reaches the process that starts it. Nothing interrupts
work under way: a tool already running finishes, and a steer waits for the next boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from chat.base.db import db_read, db_write
from sessions_app import gateway_reads
from sessions_app.lifecycle import steering
from sessions_app.lifecycle.steering import Delivered
from sessions_app.models import Run

T = TypeVar("T")


class _DatabaseWait(Protocol):
    async def patiently(
        self, call: Callable[..., Awaitable[Any]], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T: ...


class SteerInbox:
    """The steering messages one run has taken, until its backend sends them to its model."""

    def __init__(self, run: Run, db_wait: _DatabaseWait) -> None:
        self.run = run
        self.db = db_wait
        self.taken_at: int | None = None  # the step after which steers were last taken
        self.unsent: list[Delivered] = []

    async def take(self, step: int, reply_text: str) -> bool:
        """Take the steers waiting after step `step` (the reply so far: `reply_text`): True when this
        step took any. A step takes steers once. Raises CancelledError when the run has ended."""
        if self.taken_at == step:
            return True
        if not await self.db.patiently(db_read, gateway_reads.steer_waiting, self.run.session_id):
            return False
        delivered = await self.db.patiently(db_write, steering.deliver, self.run.pk, step=step, reply_text=reply_text)
        if delivered is None:
            raise asyncio.CancelledError()  # the run ended elsewhere (an abort won)
        if not delivered:
            return False  # withdrawn meanwhile
        self.taken_at = step
        self.unsent.extend(delivered)
        return True

    def drain(self) -> list[Delivered]:
        """The steers taken and not yet given to the model, oldest first."""
        taken, self.unsent = self.unsent, []
        return taken
