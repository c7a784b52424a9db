"""Driving the SQLite writer (`chat.base.db.Writer`) from tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.db import connection

from chat.base.db import Writer

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


def _close_connection() -> None:
    connection.close()  # looked up when called: the writer thread's own connection


@contextlib.contextmanager
def own_writer() -> Iterator[Writer]:
    """A writer of the test's own; its thread's connection is closed at the end (its thread idles)."""
    writer = Writer()
    try:
        yield writer
    finally:
        writer.submit(_close_connection, urgent=True).result(WAIT)
