"""The gateway's receivers: events encoded in the transaction, sent only once it commits."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from chat.delivery import broadcaster, receivers
from sessions_app.lifecycle import runs, sessions
from sessions_app.models import ChatSession
from tests.support.db import admit_send
from tests.support.writer import WAIT, held, own_writer

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    monkeypatch.setattr(broadcaster.broadcaster, "send", lambda owner_id, message: messages.append(message))
    return messages


def test_rolled_back_changes_send_nothing(sent: list[dict[str, Any]], django_capture_on_commit_callbacks: Any) -> None:
    owner = get_user_model().objects.create_user(username="o")
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        admit_send(owner, "r1")
        raise RuntimeError("rolled back")
    assert sent == []


@pytest.mark.django_db(transaction=True)
def test_two_changes_in_one_transaction_both_carry_the_committed_row(sent: list[dict[str, Any]]) -> None:
    """A run ends and the next starts in one commit: one event per change, each with the row as committed."""
    owner = get_user_model().objects.create_user(username="o")
    first = admit_send(owner, "r1").run
    admit_send(owner, "r2")
    assert first is not None and runs.mark_running(first.pk)
    sent.clear()
    runs.finish_run(first.pk, "done", owner_process="", reply="ok")
    rows = [(m["reason"], json.loads(m["row"])) for m in sent if m["type"] == "gateway.session"]
    assert [(reason, row["status"], row["activeRunIds"], row["lastRunId"]) for reason, row in rows] == [
        ("run.completed", "running", ["r2"], "r2"),
        ("run.started", "running", ["r2"], "r2"),
    ]
    assert rows[0][1] == rows[1][1]
    chats = [(m["runId"], m["state"]) for m in sent if m["type"] == "gateway.chat"]
    assert chats == [("r1", "final"), ("r2", "status")]


def test_a_session_created_by_its_first_send_is_announced_as_committed(
    sent: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    owner = get_user_model().objects.create_user(username="o")
    with django_capture_on_commit_callbacks(execute=True):
        admit_send(owner, "r1")
    rows = [(m["reason"], json.loads(m["row"])["activeRunIds"]) for m in sent if m["type"] == "gateway.session"]
    assert rows == [("create", ["r1"]), ("send", ["r1"])]


@pytest.mark.django_db(transaction=True)
def test_changes_after_a_rollback_are_still_announced(sent: list[dict[str, Any]]) -> None:
    owner = get_user_model().objects.create_user(username="o")
    first = admit_send(owner, "r1")
    with pytest.raises(RuntimeError), transaction.atomic():
        admit_send(owner, "r2")  # queued: the row changed
        raise RuntimeError("rolled back")
    sent.clear()
    admit_send(owner, "r3")
    assert first.run is not None
    rows = [json.loads(m["row"])["queuedRunIds"] for m in sent if m["type"] == "gateway.session"]
    assert rows == [["r3"]]


# --- changes undone with their savepoint (the writer's batches) ---------------------------------


def row_events(sent: list[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    """(reason, label, version, deleted) of each row event sent."""
    rows = [(m["reason"], json.loads(m["row"])) for m in sent if m["type"] == "gateway.session"]
    return [(reason, row["label"], row["version"], bool(row.get("deleted"))) for reason, row in rows]


def new_session() -> ChatSession:
    owner = get_user_model().objects.create_user(username="o")
    return sessions.create_session(owner_id=owner.pk, key="agent:main:s")


def stored(session: ChatSession) -> tuple[str, int]:
    row = ChatSession.objects.get(pk=session.pk)
    return row.label, row.version


def rename_then_fail(session: ChatSession, label: str) -> None:
    sessions.patch_session(label=label, pk=session.pk)
    raise RuntimeError("failed after its change")


@pytest.mark.django_db(transaction=True)
def test_a_write_that_fails_in_the_writers_batch_lends_its_row_to_no_event(sent: list[dict[str, Any]]) -> None:
    """Two renames of one session share a commit; the second fails after its change."""
    session = new_session()
    sent.clear()
    with own_writer() as writer:
        with held(writer):
            renamed = writer.submit(partial(sessions.patch_session, label="committed", pk=session.pk), urgent=False)
            failed = writer.submit(partial(rename_then_fail, session, "rolled-back"), urgent=False)
        assert renamed.result(WAIT).label == "committed"
        assert isinstance(failed.exception(WAIT), RuntimeError)
    assert stored(session) == ("committed", session.version + 1)
    assert row_events(sent) == [("patch", "committed", session.version + 1, False)]


def fail() -> None:
    raise RuntimeError("another write failed")


@pytest.mark.django_db(transaction=True)
def test_an_unrelated_rollback_between_two_changes_keeps_them_one_holders(sent: list[dict[str, Any]]) -> None:
    """A savepoint's rollback rebuilds Django's on-commit entries: the holder must still be
    found, so both changes carry the row as committed (not the first its intermediate row)."""
    session = new_session()
    sent.clear()
    with own_writer() as writer:
        with held(writer):
            first = writer.submit(partial(sessions.patch_session, label="first", pk=session.pk), urgent=False)
            failed = writer.submit(fail, urgent=False)
            second = writer.submit(partial(sessions.patch_session, label="second", pk=session.pk), urgent=False)
        assert first.result(WAIT).label == "first" and second.result(WAIT).label == "second"
        assert isinstance(failed.exception(WAIT), RuntimeError)
    final = session.version + 2
    assert stored(session) == ("second", final)
    assert row_events(sent) == [("patch", "second", final, False), ("patch", "second", final, False)]


@pytest.mark.django_db(transaction=True)
def test_a_change_rolled_back_with_its_savepoint_is_not_announced(sent: list[dict[str, Any]]) -> None:
    session = new_session()
    sent.clear()
    with transaction.atomic():
        sessions.patch_session(label="committed", pk=session.pk)
        with pytest.raises(RuntimeError), transaction.atomic():
            rename_then_fail(session, "rolled-back")
    assert stored(session) == ("committed", session.version + 1)
    assert row_events(sent) == [("patch", "committed", session.version + 1, False)]


@pytest.mark.django_db(transaction=True)
def test_the_change_after_a_rolled_back_first_one_is_announced_alone(sent: list[dict[str, Any]]) -> None:
    """The holder was made in the savepoint that rolled back: it still announces what followed."""
    session = new_session()
    sent.clear()
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            rename_then_fail(session, "rolled-back")
        sessions.patch_session(label="committed", pk=session.pk)
    assert row_events(sent) == [("patch", "committed", session.version + 1, False)]


@pytest.mark.django_db(transaction=True)
def test_a_deletion_rolled_back_with_its_savepoint_is_not_announced(sent: list[dict[str, Any]]) -> None:
    session = new_session()
    sent.clear()
    with transaction.atomic():
        sessions.patch_session(label="kept", pk=session.pk)
        with pytest.raises(RuntimeError), transaction.atomic():
            sessions.delete_session(pk=session.pk)
            raise RuntimeError("rolled back")
    assert stored(session) == ("kept", session.version + 1)
    assert row_events(sent) == [("patch", "kept", session.version + 1, False)]


@pytest.mark.django_db(transaction=True)
def test_a_committed_deletion_is_the_only_news(sent: list[dict[str, Any]]) -> None:
    session = new_session()
    sent.clear()
    with transaction.atomic():
        sessions.patch_session(label="renamed", pk=session.pk)
        sessions.delete_session(pk=session.pk)
    assert row_events(sent) == [("delete", "renamed", session.version + 2, True)]


@pytest.mark.django_db(transaction=True)
def test_a_holder_left_by_a_rolled_back_transaction_is_not_reused(sent: list[dict[str, Any]]) -> None:
    """Its unmarked changes would never be sent, but they must not pile up either."""
    session = new_session()
    with pytest.raises(RuntimeError), transaction.atomic():
        rename_then_fail(session, "rolled-back")
    left = receivers._pending()[session.pk]
    sent.clear()
    with transaction.atomic():
        sessions.patch_session(label="committed", pk=session.pk)
        holder = receivers._pending()[session.pk]
        assert holder is not left and [change.reason for change in holder.changes] == ["patch"]
    assert session.pk not in receivers._pending()
    assert row_events(sent) == [("patch", "committed", session.version + 1, False)]


@pytest.mark.django_db(transaction=True)
def test_django_on_commit_list_behaves_as_the_row_holders_rely_on() -> None:
    """Pins Django's on-commit bookkeeping (5.2) that `chat.delivery.receivers._PendingRow` builds on.

    Entries are `(savepoint ids, func, robust)` tuples; rolling back a savepoint drops the
    entries naming it and keeps one with no ids; a commit runs the list in order; a full
    rollback clears it. If an upgrade changes any of this, the receivers must change too.
    """
    ran: list[str] = []
    conn = transaction.get_connection()
    with transaction.atomic():
        kept: tuple[set[str], Any, bool] = (set(), partial(ran.append, "kept"), True)
        conn.run_on_commit.append(kept)
        with pytest.raises(RuntimeError), transaction.atomic():
            transaction.on_commit(partial(ran.append, "dropped"), robust=True)
            sids, _func, robust = conn.run_on_commit[-1]
            assert sids == set(conn.savepoint_ids) and len(sids) == 1 and robust is True
            raise RuntimeError("savepoint rolled back")
        assert conn.run_on_commit == [kept]
        with transaction.atomic():
            transaction.on_commit(partial(ran.append, "released"))
        conn.run_on_commit.append((set(), partial(ran.append, "last"), True))
        assert ran == []
    assert ran == ["kept", "released", "last"]  # in list order, after the commit
    with pytest.raises(RuntimeError), transaction.atomic():
        conn.run_on_commit.append((set(), partial(ran.append, "discarded"), True))
        raise RuntimeError("rolled back")
    assert conn.run_on_commit == [] and ran == ["kept", "released", "last"]
