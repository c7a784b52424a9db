"""The hot path's shortcuts in the run services, held to what the long way does.

- Admission against the session as the gateway read it with the key (`SendRequest.seen`): the
  same outcomes as under the lock, whatever changed in between.
- A run that ends before its `running` was written ends through it (`finish_run(streamed=True)`),
  with the rest of its reply as its own delta: three events, three seqs, two audit rows, one write.
- `start_reply`: `running` with the first text, and a retry of it by its owner.
- The queue read with the locked row, kept as the lifecycle changes it, and (on PostgreSQL, where a
  lock wait re-reads the row but not what was read with it) not trusted when the row moved meanwhile.

`test_on_postgres` runs this file again on a PostgreSQL database.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from sessions_app import gateway_reads, statements
from sessions_app.lifecycle import core, runs
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run, RunState, RunSurface
from tests.sessions_app.conftest import chat_states, rows
from tests.support import services

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
KEY = "agent:main:main"


@pytest.fixture(autouse=True)
def _on_the_expected_database() -> None:
    # the child run of `test_on_postgres` says which database it must be on
    assert connection.vendor == os.environ.get("AGENTGATE_EXPECT_VENDOR", connection.vendor)


def seen(owner_id: int, run_id: str) -> ChatSession:
    """The session as the gateway's key read finds it for a new key."""
    keyed = gateway_reads.find_run(owner_id, KEY, run_id)
    assert keyed is not None and keyed.run is None
    return keyed.session


def audit(run: Run) -> list[tuple[str, str, str]]:
    return list(LifecycleEvent.objects.filter(run=run).order_by("id").values_list("from_state", "to_state", "reason"))


# --- admission against the session as read ---------------------------------------------------------


def test_a_send_against_the_session_as_read_starts_in_one_write_of_each(
    request_for: Callable[..., Any],
    owner: Any,
    broadcasts: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    runs.admit_send(request_for("r0"), owner_process="")
    assert runs.finish_run(Run.objects.get(run_id="r0").pk, RunState.DONE, owner_process="", reply="x")
    broadcasts.clear()
    req = request_for("r1", seen=seen(owner.pk, "r1"))
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        outcome = runs.admit_send(req, owner_process="proc-a")
    kinds = [q["sql"].split(None, 1)[0].upper() for q in queries]
    # the run, the user's message, the row (which names that message its active leaf), the audit row
    assert [k for k in kinds if k not in ("BEGIN", "SAVEPOINT", "RELEASE")] == ["INSERT", "INSERT", "UPDATE", "INSERT"]
    assert outcome.admission == "started" and outcome.run is not None
    run = Run.objects.get(pk=outcome.run.pk)
    assert (run.state, run.owner_process, run.stream_seq, run.queue_seq) == (RunState.DISPATCHING, "proc-a", 1, 2)
    assert audit(run) == [(RunState.QUEUED, RunState.DISPATCHING, "send")]
    assert chat_states(broadcasts) == [("r1", "dispatching", 1)]
    ((reason, row),) = rows(broadcasts)
    assert (reason, row["status"], row["activeRunIds"], row["queuedRunIds"]) == ("send", "running", ["r1"], [])
    session = ChatSession.objects.get(pk=run.session_id)
    assert session.active_run_id == run.pk and row["version"] == session.version


def test_a_send_against_a_busy_session_as_read_is_queued_behind_the_queue(
    request_for: Callable[..., Any],
    owner: Any,
    broadcasts: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    runs.admit_send(request_for("r1"), owner_process="")
    runs.admit_send(request_for("r2"), owner_process="")
    broadcasts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        outcome = runs.admit_send(request_for("r3", seen=seen(owner.pk, "r3")), owner_process="")
    assert outcome.admission == "queued" and outcome.queue_position == 2
    ((reason, row),) = rows(broadcasts)
    assert (reason, row["activeRunIds"], row["queuedRunIds"]) == ("queued", ["r1"], ["r2", "r3"])
    assert gateway_reads.queues_of([ChatSession.objects.get(pk=outcome.session.pk)]) == {
        outcome.session.pk: ["r2", "r3"]
    }


def test_a_session_that_moved_since_it_was_read_is_admitted_as_it_is_now(
    request_for: Callable[..., Any], owner: Any, settings: Any
) -> None:
    runs.admit_send(request_for("r0"), owner_process="")  # the session exists, r0 active
    assert runs.finish_run(Run.objects.get(run_id="r0").pk, RunState.DONE, owner_process="", reply="x")
    stale = seen(owner.pk, "r2")  # idle when read...
    runs.admit_send(request_for("r1"), owner_process="")  # ...busy since
    outcome = runs.admit_send(request_for("r2", seen=stale), owner_process="")
    assert outcome.admission == "queued" and outcome.queue_position == 1
    # the key taken meanwhile: that run, as under the lock
    stale = seen(owner.pk, "r3")
    runs.admit_send(request_for("r3"), owner_process="")
    assert runs.admit_send(request_for("r3", seen=stale), owner_process="").admission == "existing"
    assert runs.admit_send(request_for("r3", "other", seen=stale), owner_process="").admission == "conflict"
    # a queue that may be full is counted under the lock
    settings.GATEWAY_QUEUE_MAX = 2
    full = runs.admit_send(request_for("r4", seen=seen(owner.pk, "r4")), owner_process="")
    assert full.admission == "queue_full" and not Run.objects.filter(run_id="r4").exists()
    assert list(Run.objects.filter(state=RunState.QUEUED).order_by("queue_seq").values_list("run_id", flat=True)) == [
        "r2",
        "r3",
    ]


# --- ending through `running`, with the reply's last delta -------------------------------------------


def test_a_run_that_ends_before_its_running_was_written_ends_through_it_in_one_write(
    request_for: Callable[..., Any], broadcasts: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    announced: list[int] = []

    def announce(seq: int) -> None:  # as the executor does: the delta leaves after commit, in order
        announced.append(seq)
        transaction.on_commit(
            lambda: broadcasts.append(
                {"type": "gateway.chat", "json": f'{{"runId": "r1", "state": "delta", "seq": {seq}}}'}
            )
        )

    broadcasts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert runs.finish_run(
            run.pk, RunState.DONE, owner_process="", reply="hello", streamed=True, announce_reply=announce
        )
    run.refresh_from_db()
    assert announced == [3] and chat_states(broadcasts) == [
        ("r1", "running", 2),
        ("r1", "delta", 3),
        ("r1", "final", 4),
    ]
    assert (run.state, run.reply, run.stream_seq) == (RunState.DONE, "hello", 4) and run.started_at is not None
    assert audit(run)[1:] == [
        (RunState.DISPATCHING, RunState.RUNNING, "run.running"),
        (RunState.RUNNING, RunState.DONE, "run.completed"),
    ]
    assert list(Message.objects.filter(run=run).order_by("id").values_list("role", "text")) == [
        ("user", "hello"),
        ("assistant", "hello"),
    ]


def test_a_run_that_never_streamed_fails_straight_from_dispatching(request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    assert runs.finish_run(run.pk, RunState.FAILED, owner_process="", error_kind="dispatch", error_message="no")
    assert audit(run)[1:] == [(RunState.DISPATCHING, RunState.FAILED, "run.failed")]


def test_an_http_runs_last_delta_keeps_its_mark(request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("h1"), owner_process="").run
    assert run is not None
    Run.objects.filter(pk=run.pk).update(surface=RunSurface.HTTP)
    assert runs.start_reply(run.pk, "Hel") == 3
    assert runs.finish_run(
        run.pk, RunState.DONE, owner_process="", reply="Hello", streamed=True, announce_reply=lambda seq: None
    )
    run.refresh_from_db()
    assert run.marks == [3, 5] and run.reply == "Hello" and run.stream_seq == 5


# --- `running` with the first text ---------------------------------------------------------------------


def test_running_goes_with_the_first_text_and_its_owners_retry_carries_on(
    request_for: Callable[..., Any], broadcasts: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="proc-a").run
    assert run is not None
    broadcasts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert runs.start_reply(run.pk, "hel", owner_process="proc-a") == 3  # the delta's seq
    assert chat_states(broadcasts) == [("r1", "running", 2)]  # (the caller sends the delta)
    # the same write again (its first answer lost): the owner's carries on, stored as a delta
    assert runs.start_reply(run.pk, "hello", owner_process="proc-a") == 4
    assert runs.start_reply(run.pk, owner_process="proc-a") == 4
    # anyone else's finds it running already
    assert runs.start_reply(run.pk, "x", owner_process="proc-b") is None and runs.mark_running(run.pk) is False
    run.refresh_from_db()
    assert (run.state, run.reply) == (RunState.RUNNING, "hello")
    assert [a[1] for a in audit(run)] == [RunState.DISPATCHING, RunState.RUNNING]
    runs.finish_run(run.pk, RunState.KILLED, owner_process="", stop_reason="rpc")
    assert runs.start_reply(run.pk, "late", owner_process="proc-a") is None


# --- the queue read with the locked row -----------------------------------------------------------------


def test_the_queue_read_with_the_row_is_kept_as_the_lifecycle_changes_it(
    request_for: Callable[..., Any], broadcasts: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="").run
    for run_id in ("r2", "r3", "r4"):
        runs.admit_send(request_for(run_id), owner_process="")
    assert first is not None
    with transaction.atomic():
        found = core.lock_run(first.pk)
        assert found is not None
        session, _run = found
        assert statements.known_queue(session) == ["r2", "r3", "r4"]
        with CaptureQueriesContext(connection) as queries:
            assert gateway_reads.queues_of([session]) == {session.pk: ["r2", "r3", "r4"]}
        assert len(queries) == 0
    broadcasts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        runs.finish_run(first.pk, RunState.DONE, owner_process="", reply="x")  # r2 starts
    # each change announced with the row as committed (`chat.delivery.receivers`)
    assert [(reason, row["activeRunIds"], row["queuedRunIds"]) for reason, row in rows(broadcasts)] == [
        ("run.completed", ["r2"], ["r3", "r4"]),
        ("run.started", ["r2"], ["r3", "r4"]),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_row_that_moved_while_its_lock_was_awaited_is_not_trusted_with_its_queue(
    request_for: Callable[..., Any],
) -> None:
    """On PostgreSQL a lock wait re-reads the locked row as committed, and the rest of the statement
    as it was before the wait: the queue read with it is then left unknown (read again when needed),
    and the run, locked too, is read as committed."""
    first = runs.admit_send(request_for("r1"), owner_process="").run
    assert first is not None
    holding, done = threading.Event(), threading.Event()

    def holder() -> None:  # queues r2 and starts r1 running while the other waits for the lock
        try:
            with transaction.atomic():
                assert core.lock_run(first.pk) is not None
                holding.set()
                runs.admit_send(request_for("r2"), owner_process="")
                assert runs.mark_running(first.pk)
                done.wait(0.5)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(10)
    with transaction.atomic():
        found = core.lock_run(first.pk)  # waits on PostgreSQL (SQLite's writers never overlap)
        assert found is not None
        session, run = found
        assert run.state == RunState.RUNNING
        # (SQLite's writers never overlap: its read came after the other's commit)
        assert statements.known_queue(session) == (None if connection.vendor == "postgresql" else ["r2"])
        assert gateway_reads.queues_of([session]) == {session.pk: ["r2"]}
    done.set()
    thread.join(10)


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_on_postgres() -> None:
    """This file again, in a child pytest whose database is PostgreSQL (row locks, lock waits)."""
    services.rerun_on_postgres(__file__, "shortcuts", 9, REDIS_URL="")
