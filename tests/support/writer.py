"""Driving the SQLite writer (`chat.runtime.db.Writer`) from tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from chat.runtime.db import Writer

WAIT = 10.0  # seconds; a caller left unanswered fails the test instead of hanging it


@contextlib.contextmanager
def held(writer: Writer) -> Iterator[None]:
    """Keep the writer busy: what is submitted meanwhile queues up, then runs as one batch."""
    started, release = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(WAIT)

    holding = writer.submit(hold, urgent=True)
    assert started.wait(WAIT)
    try:
        yield
    finally:
        release.set()
    assert holding.result(WAIT)
