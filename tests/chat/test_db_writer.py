"""The SQLite writer (`chat.base.db.Writer`): group commit, savepoints, admissions first, panics.

Each test holds the writer busy with a first job while it queues the writes it means to
batch, so that they run together in one transaction, as under load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from chat.base.db import BatchRolledBack, WritePanicked, Writer
from chat.delivery import broadcaster
from sessions_app.lifecycle import sessions
from sessions_app.models import ChatSession
from tests.support.writer import WAIT, held, own_writer

pytestmark = pytest.mark.django_db(transaction=True)  # the writer's own thread commits for real


class Panic(BaseException):
    """Not an Exception: what a write that must not be caught as a failure raises."""


@pytest.fixture
def writer(transactional_db: None) -> Iterator[Writer]:
    """A writer of the test's own; its thread's connection is closed at the end (its thread idles)."""
    with own_writer() as writer:
        yield writer


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    monkeypatch.setattr(broadcaster.broadcaster, "send", lambda owner_id, message: messages.append(message))
    return messages


def in_batch() -> bool:
    """Whether the calling write runs inside the writer's shared transaction (a batch)."""
    return transaction.get_connection().in_atomic_block


def make_sessions(*keys: str) -> list[ChatSession]:
    owner = get_user_model().objects.create_user(username="o")
    return [sessions.create_session(owner_id=owner.pk, key=key) for key in keys]


def label(session: ChatSession) -> str:
    return ChatSession.objects.get(pk=session.pk).label


def rename(session: ChatSession, new_label: str, then: Callable[[], None] | None = None) -> bool:
    """A lifecycle write (then, optionally, a failure); says whether it ran batched."""
    sessions.patch_session(label=new_label, pk=session.pk)
    if then is not None:
        then()
    return in_batch()


def fail(exc: BaseException) -> None:
    raise exc


def test_a_failing_write_undoes_only_itself(writer: Writer) -> None:
    s1, s2, s3 = make_sessions("agent:main:a", "agent:main:b", "agent:main:c")
    with held(writer):
        first = writer.submit(partial(rename, s1, "a"), urgent=False)
        failing = writer.submit(partial(rename, s2, "b", partial(fail, ValueError("b failed"))), urgent=False)
        last = writer.submit(partial(rename, s3, "c"), urgent=False)
    assert first.result(WAIT) is True and last.result(WAIT) is True  # both stand, batched
    error = failing.exception(WAIT)
    assert isinstance(error, ValueError) and str(error) == "b failed"
    assert (label(s1), label(s2), label(s3)) == ("a", "", "c")  # the failing one's rename undone


def test_a_failing_commit_fails_every_caller_and_keeps_nothing(writer: Writer, sent: list[dict[str, Any]]) -> None:
    (session,) = make_sessions("agent:main:a")
    committed: list[str] = []
    sent.clear()

    def rename_and_note() -> None:
        rename(session, "renamed")
        transaction.on_commit(partial(committed.append, "rename"))

    def dangling() -> None:
        # SQLite checks foreign keys (deferred) only at COMMIT: the batch's commit fails.
        ChatSession.objects.create(owner_id=10**9, key="agent:main:dangling")

    with held(writer):
        renamed = writer.submit(rename_and_note, urgent=False)
        broken = writer.submit(dangling, urgent=False)
    assert isinstance(renamed.exception(WAIT), IntegrityError)
    assert isinstance(broken.exception(WAIT), IntegrityError)
    assert label(session) == "" and not ChatSession.objects.filter(key="agent:main:dangling").exists()
    assert committed == [] and sent == []  # no on-commit callback of the batch ran


def test_admissions_go_first_in_a_batch(writer: Writer) -> None:
    ran: list[tuple[str, bool]] = []

    def job(name: str) -> None:
        ran.append((name, in_batch()))

    with held(writer):
        futures = [
            writer.submit(partial(job, "later-1"), urgent=False),
            writer.submit(partial(job, "later-2"), urgent=False),
            writer.submit(partial(job, "urgent-1"), urgent=True),
            writer.submit(partial(job, "urgent-2"), urgent=True),
        ]
    for future in futures:
        future.result(WAIT)
    assert ran == [("urgent-1", True), ("urgent-2", True), ("later-1", True), ("later-2", True)]


def test_a_write_whose_caller_gave_up_is_not_made(writer: Writer) -> None:
    s1, s2 = make_sessions("agent:main:a", "agent:main:b")
    with held(writer):
        given_up = writer.submit(partial(rename, s1, "never"), urgent=True)
        assert given_up.cancel()  # as asyncio.wrap_future does when the awaiting task is cancelled
        kept = writer.submit(partial(rename, s2, "kept"), urgent=False)
    assert kept.result(WAIT) is False  # alone in its batch: the cancelled one was dropped
    assert given_up.cancelled()
    assert (label(s1), label(s2)) == ("", "kept")


@pytest.mark.parametrize("panic", [Panic, KeyboardInterrupt])
def test_a_panic_answers_every_caller_of_its_batch_and_spares_the_writer(
    writer: Writer, sent: list[dict[str, Any]], panic: type[BaseException]
) -> None:
    s1, s2 = make_sessions("agent:main:a", "agent:main:b")
    sent.clear()
    with held(writer):
        before = writer.submit(partial(rename, s1, "before"), urgent=False)
        failing = writer.submit(partial(fail, ValueError("failed on its own")), urgent=False)
        panicking = writer.submit(partial(rename, s2, "panicking", partial(fail, panic("boom"))), urgent=False)
        after = writer.submit(partial(rename, s2, "after"), urgent=False)
    error = panicking.exception(WAIT)
    # wrapped: a KeyboardInterrupt re-raised on the event loop would stop the server
    assert isinstance(error, WritePanicked) and isinstance(error.__cause__, panic) and str(error.__cause__) == "boom"
    assert isinstance(failing.exception(WAIT), ValueError)  # its own error, not the batch's
    for other in (before, after):
        rolled_back = other.exception(WAIT)
        assert isinstance(rolled_back, BatchRolledBack) and rolled_back.__cause__ is error.__cause__
    # The whole transaction rolled back: nothing stored, nothing announced.
    assert (label(s1), label(s2)) == ("", "")
    assert sent == []
    # And the writer serves the next batch.
    with held(writer):
        next_ones = [writer.submit(partial(rename, s1, "next"), urgent=False), writer.submit(in_batch, urgent=False)]
    assert [future.result(WAIT) for future in next_ones] == [True, True]
    assert writer.thread.is_alive() and label(s1) == "next"


@pytest.mark.parametrize("panic", [Panic, KeyboardInterrupt])
def test_a_write_that_panics_alone_is_answered_and_spares_the_writer(
    writer: Writer, panic: type[BaseException]
) -> None:
    (session,) = make_sessions("agent:main:a")
    panicking = writer.submit(partial(fail, panic("alone")), urgent=True)
    error = panicking.exception(WAIT)
    assert isinstance(error, WritePanicked) and isinstance(error.__cause__, panic)
    assert writer.submit(partial(rename, session, "next"), urgent=False).result(WAIT) is False
    assert label(session) == "next"


def test_every_caller_is_answered_when_the_writer_itself_fails(writer: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure outside any write (here: answering) still answers the batch's callers."""

    real = Writer._answer

    def broken(batch: list[Any], outcomes: list[tuple[bool, Any]]) -> None:
        if len(batch) == 1:
            return real(batch, outcomes)  # the holding job's
        raise RuntimeError("answering failed")

    monkeypatch.setattr(Writer, "_answer", staticmethod(broken))
    with held(writer):
        futures: list[Future[Any]] = [writer.submit(in_batch, urgent=False) for _ in range(2)]
    errors = [future.exception(WAIT) for future in futures]
    monkeypatch.undo()
    assert all(isinstance(error, RuntimeError) and str(error) == "answering failed" for error in errors)
    assert writer.submit(in_batch, urgent=False).result(WAIT) is False
