"""Direct tests of the run services: admission, the run's steps, first terminal wins, after-commit events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sessions_app import gateway_reads
from sessions_app.lifecycle import runs, sessions
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run, RunState, SessionStatus
from tests.sessions_app.conftest import chat_states, rows

pytestmark = pytest.mark.django_db


def test_started_run_is_active_and_announced_only_after_commit(
    request_for: Callable[..., Any], broadcasts: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        outcome = runs.admit_send(request_for("r1"), owner_process="proc-a")
        assert broadcasts == []  # nothing leaves before the commit
    assert outcome.admission == "started" and callbacks
    run = Run.objects.get(run_id="r1")
    session = ChatSession.objects.get(pk=run.session_id)
    assert run.state == RunState.DISPATCHING and run.owner_process == "proc-a" and run.stream_seq == 1
    assert session.active_run_id == run.pk and session.status == SessionStatus.RUNNING
    assert list(Message.objects.values_list("role", "text")) == [("user", "hello")]
    assert chat_states(broadcasts) == [("r1", "dispatching", 1)]
    # the session created by this send is announced as committed: already running r1
    assert [(reason, row["status"], row["activeRunIds"], row["lastRunId"]) for reason, row in rows(broadcasts)] == [
        ("create", "running", ["r1"], "r1"),
        ("send", "running", ["r1"], "r1"),
    ]


def test_run_steps_and_first_terminal_wins(
    request_for: Callable[..., Any], broadcasts: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    with django_capture_on_commit_callbacks(execute=True):
        assert runs.mark_running(run.pk)
        assert runs.record_delta(run.pk, "hel") == 3
        assert runs.finish_run(run.pk, RunState.DONE, owner_process="", reply="hello")
        # every later end loses and says nothing
        assert not runs.finish_run(run.pk, RunState.FAILED, owner_process="", error_kind="backend")
        assert runs.record_delta(run.pk, "late") is None
        assert not runs.mark_running(run.pk)
    run.refresh_from_db()
    assert run.state == RunState.DONE and run.reply == "hello" and run.stream_seq == 4
    assert chat_states(broadcasts) == [("r1", "running", 2), ("r1", "final", 4)]
    terminals = LifecycleEvent.objects.filter(run=run, to_state__in=[RunState.DONE, RunState.FAILED])
    assert terminals.count() == 1
    session = ChatSession.objects.get(pk=run.session_id)
    assert session.active_run_id is None and session.status == SessionStatus.DONE
    transcript = list(Message.objects.order_by("id").values_list("role", "text"))
    assert transcript == [("user", "hello"), ("assistant", "hello")]


def test_replay_conflict_queue_and_rejection(request_for: Callable[..., Any], settings: Any) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="")
    assert runs.admit_send(request_for("r1"), owner_process="").admission == "existing"
    assert runs.admit_send(request_for("r1", "other text"), owner_process="").admission == "conflict"
    queued = runs.admit_send(request_for("r2"), owner_process="")
    assert queued.admission == "queued" and queued.queue_position == 1
    settings.GATEWAY_QUEUE_MAX = 1
    assert runs.admit_send(request_for("r3"), owner_process="").admission == "queue_full"
    rejected = runs.admit_send(request_for("r4", setup_error="no backend"), owner_process="")
    assert rejected.admission == "rejected" and rejected.run is not None
    assert rejected.run.state == RunState.FAILED and rejected.run.error_kind == "dispatch"
    # a failed side-send never masks the live run
    session = ChatSession.objects.get(pk=first.session.pk)
    assert session.status == SessionStatus.RUNNING and session.active_run_id == first.run.pk  # type: ignore[union-attr]


def test_ending_the_active_run_starts_the_next_owned_by_the_ender(request_for: Callable[..., Any]) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="proc-a").run
    runs.admit_send(request_for("r2"), owner_process="proc-a")
    assert first is not None and runs.mark_running(first.pk)
    assert runs.finish_run(first.pk, RunState.DONE, owner_process="proc-b", reply="x")
    second = Run.objects.get(run_id="r2")
    assert second.state == RunState.DISPATCHING and second.owner_process == "proc-b"


def test_a_run_whose_session_was_deleted_ends_quietly(request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    killed = sessions.delete_session(owner_id=run.created_by_id, key="agent:main:main")
    assert killed == ["r1"]
    assert runs.mark_running(run.pk) is False
    assert runs.finish_run(run.pk, RunState.DONE, owner_process="", reply="late") is False
    assert runs.record_delta(run.pk, "late") is None


def test_interrupt_a_run_of_a_dead_process(request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="dead").run
    assert run is not None
    assert runs.interrupt_run(run.pk, message="gone") is True
    run.refresh_from_db()
    assert run.state == RunState.FAILED and run.error_kind == "interrupted"


def test_claim_only_unowned_dispatching_runs(request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    assert runs.claim_run(run.pk, server_id="proc-a")
    assert not runs.claim_run(run.pk, server_id="proc-b")
    assert gateway_reads.get_run(run.pk).owner_process == "proc-a"  # type: ignore[union-attr]
