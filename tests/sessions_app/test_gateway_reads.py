"""Reads: lists, transcripts, queue positions, bounded context; rows read with their runs in one statement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app import gateway_reads, statements
from sessions_app.lifecycle import branches, runs, sessions
from sessions_app.models import ChatSession, Message, RunState

pytestmark = pytest.mark.django_db


def test_list_filters_search_and_pages(owner: Any, request_for: Callable[..., Any]) -> None:
    for i in range(5):
        sessions.create_session(owner_id=owner.pk, key=f"agent:main:s{i}", label=f"Label {i}")
    runs.admit_send(request_for("r1", key="agent:main:s1"), owner_process="")
    page = gateway_reads.list_sessions(owner.pk, limit=2, offset=0)
    assert page.total == 5 and [s.key for s in page.sessions] == ["agent:main:s1", "agent:main:s4"]
    assert [s.key for s in gateway_reads.list_sessions(owner.pk, status="running").sessions] == ["agent:main:s1"]
    assert gateway_reads.list_sessions(owner.pk, status="none").total == 4
    assert [s.key for s in gateway_reads.list_sessions(owner.pk, search="label 3").sessions] == ["agent:main:s3"]
    assert gateway_reads.list_sessions(owner.pk + 1).total == 0


def test_a_session_and_the_runs_its_row_names_come_in_one_statement(request_for: Callable[..., Any]) -> None:
    outcome = runs.admit_send(request_for("r1"), owner_process="")
    with CaptureQueriesContext(connection) as ctx:
        session = gateway_reads.session_by_pk(outcome.session.pk)
        assert session is not None
        assert statements.run_id_of(session, "active_run") == "r1" and statements.run_id_of(session, "last_run") == "r1"
        assert [s.key for s in gateway_reads.owner_sessions(outcome.session.owner_id)] == [session.key]
        assert statements.run_id_of(gateway_reads.owner_sessions(None).get(), "active_run") == "r1"
    assert len(ctx.captured_queries) == 3


def test_transcript_pages_and_open_runs(owner: Any, request_for: Callable[..., Any]) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="")
    runs.admit_send(request_for("r2"), owner_process="")
    session = first.session
    chain(session, [f"m{i}" for i in range(4)])
    page = gateway_reads.transcript(session, limit=3)
    assert [m.text for m in page.messages] == ["m1", "m2", "m3"] and page.has_more
    older = gateway_reads.transcript(session, limit=3, before_id=page.messages[0].pk)
    assert [m.text for m in older.messages] == ["hello", "m0"] and not older.has_more
    assert page.active is not None and page.active.run_id == "r1"
    assert [r.run_id for r in page.queued] == ["r2"]


def chain(session: ChatSession, texts: list[str]) -> None:
    """Messages appended to the session's active branch, as the lifecycle appends them."""
    parent = session.active_leaf_id
    for text in texts:
        parent = Message.objects.create(
            session=session, session_generation=session.session_id, role="user", text=text, parent_id=parent
        ).pk
    ChatSession.objects.filter(pk=session.pk).update(active_leaf_id=parent)
    session.active_leaf_id = parent


def test_queue_position(request_for: Callable[..., Any]) -> None:
    active = runs.admit_send(request_for("r1"), owner_process="").run
    queued = [runs.admit_send(request_for(f"q{i}"), owner_process="").run for i in range(3)]
    assert gateway_reads.queue_position(active) is None  # type: ignore[arg-type]
    assert [gateway_reads.queue_position(r) for r in queued] == [1, 2, 3]  # type: ignore[arg-type]


def test_context_is_bounded_by_what_the_backend_reads(request_for: Callable[..., Any]) -> None:
    first = runs.admit_send(request_for("r0", "first"), owner_process="")
    assert first.run is not None and runs.finish_run(first.run.pk, RunState.DONE, owner_process="", reply="ok")
    session = ChatSession.objects.get(pk=first.session.pk)
    chain(session, [f"old{i}" for i in range(50)])
    side = Message.objects.create(  # a sibling branch of the last one: not this run's
        session=session, session_generation=session.session_id, role="user", text="other branch", parent_id=None
    )
    outcome = runs.admit_send(request_for("r1", "latest"), owner_process="")
    run = outcome.run
    assert run is not None and side.pk not in {m.pk for m in gateway_reads.context_messages(run, limit=1000)}
    assert gateway_reads.context_messages(run, limit=0) == []
    # the newest messages of the run's branch up to its own message, oldest first, however long it is
    assert [m.text for m in gateway_reads.context_messages(run, limit=3)] == ["old48", "old49", "latest"]
    assert len(gateway_reads.context_messages(run, limit=1000)) == 53  # first, ok, old0..old49, latest


def test_open_run_counts(request_for: Callable[..., Any]) -> None:
    runs.admit_send(request_for("r1"), owner_process="")
    runs.admit_send(request_for("r2"), owner_process="")
    assert gateway_reads.open_run_counts() == (1, 1)
    assert gateway_reads.get_run(999) is None


def steered_transcript(session: ChatSession, run: Any) -> list[Message]:
    """A steered run's reply in two parts around the steering message (as the lifecycle writes it)."""
    made = []
    parent = session.active_leaf_id
    for role, text, start, first, last in (
        ("assistant", "Part one.", 0, 1, 1),
        ("user", "steer here", 0, 1, 0),
        ("assistant", "Part two.", 9, 2, 0),
    ):
        parent = Message.objects.create(
            session=session,
            session_generation=session.session_id,
            role=role,
            text=text,
            run=run if role == "assistant" else None,
            parent_id=parent,
            reply_start=start,
            first_step=first,
            last_step=last,
        ).pk
        made.append(Message.objects.get(pk=parent))
    ChatSession.objects.filter(pk=session.pk).update(active_leaf_id=parent)
    return made


def test_a_steered_runs_reply_is_its_last_part(request_for: Callable[..., Any]) -> None:
    outcome = runs.admit_send(request_for("r1"), owner_process="")
    assert outcome.run is not None
    parts = steered_transcript(outcome.session, outcome.run)
    # a continuation of the run (`previous_response_id`) follows its whole reply, steer included
    assert gateway_reads.reply_of(outcome.run.pk) == parts[-1].pk


def test_a_fork_keeps_which_part_of_a_steered_reply_each_copy_is(owner: Any, request_for: Callable[..., Any]) -> None:
    outcome = runs.admit_send(request_for("r1"), owner_process="")
    assert outcome.run is not None
    steered_transcript(outcome.session, outcome.run)
    assert runs.finish_run(outcome.run.pk, RunState.DONE, owner_process="", streamed=True)
    cut = branches.fork(owner_id=owner.pk, key=outcome.session.key, entry_id=None)
    copies = list(Message.objects.filter(session=cut.session, role="assistant").order_by("id"))
    # (the run's end adds a last part of its own, after these)
    assert [(m.text, m.reply_start, m.first_step, m.last_step) for m in copies[:2]] == [
        ("Part one.", 0, 1, 1),
        ("Part two.", 9, 2, 0),
    ]
