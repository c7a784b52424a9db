"""Direct tests of the session services and operator actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sessions_app.lifecycle import LifecycleError, SessionNotFound, operators, runs, sessions
from sessions_app.models import ChatSession, LifecycleEvent, Run, RunState, SessionStatus
from tests.sessions_app.conftest import chat_states, rows

pytestmark = pytest.mark.django_db
KEY = "agent:main:main"


@pytest.mark.django_db(transaction=True)
def test_create_patch_and_conflict(owner: Any, broadcasts: list[dict[str, Any]]) -> None:
    session = sessions.create_session(owner_id=owner.pk, key="agent:main:s1", label="One")
    sessions.patch_session(owner_id=owner.pk, key="agent:main:s1", label="Two")
    with pytest.raises(LifecycleError) as exc:
        sessions.create_session(owner_id=owner.pk, key="agent:main:s1")
    assert exc.value.code == "CONFLICT"
    assert [(reason, row["label"], row["version"]) for reason, row in rows(broadcasts)] == [
        ("create", "One", 1),
        ("patch", "Two", 2),
    ]
    assert ChatSession.objects.get(pk=session.pk).version == 2


def test_abort_one_run_starts_the_next(request_for: Callable[..., Any], owner: Any) -> None:
    runs.admit_send(request_for("r1"), owner_process="")
    runs.admit_send(request_for("r2"), owner_process="")
    outcome = sessions.abort(owner_id=owner.pk, key=KEY, run_id="r1", owner_process="proc-a")
    assert outcome.aborted and outcome.run_ids == ["r1"]
    assert Run.objects.get(run_id="r2").owner_process == "proc-a"
    assert sessions.abort(owner_id=owner.pk, key=KEY, run_id="r1", owner_process="").aborted is False
    assert sessions.abort(owner_id=owner.pk, key=KEY, run_id="nope", owner_process="").run_ids == []


def test_abort_all_kills_queued_first_and_starts_nothing(
    request_for: Callable[..., Any],
    owner: Any,
    broadcasts: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    for run_id in ("r1", "r2", "r3"):
        runs.admit_send(request_for(run_id), owner_process="")
    with django_capture_on_commit_callbacks(execute=True):
        _session, killed = sessions.abort_all(owner_id=owner.pk, key=KEY, stop_reason="stop", actor="user")
    assert killed == ["r1", "r2", "r3"]
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.KILLED}
    assert [state for _run, state, _seq in chat_states(broadcasts)] == ["aborted"] * 3
    assert ChatSession.objects.get().status == SessionStatus.KILLED


def test_reset_rotates_the_generation(request_for: Callable[..., Any], owner: Any) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="")
    session, killed = sessions.reset_session(owner_id=owner.pk, key=KEY)
    assert killed == ["r1"] and session.session_id != first.session.session_id and session.status is None
    assert Run.objects.get(run_id="r1").stop_reason == "reset"


def test_delete_announces_the_deleted_row_and_keeps_no_audit(
    request_for: Callable[..., Any],
    owner: Any,
    broadcasts: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    runs.admit_send(request_for("r1"), owner_process="")
    with django_capture_on_commit_callbacks(execute=True):
        assert sessions.delete_session(owner_id=owner.pk, key=KEY) == ["r1"]
    reason, row = rows(broadcasts)[-1]
    assert reason == "delete" and row["deleted"] is True and row["status"] == "killed"
    assert not ChatSession.objects.exists() and not LifecycleEvent.objects.exists()
    with pytest.raises(SessionNotFound):
        sessions.delete_session(owner_id=owner.pk, key=KEY)


def test_operator_mark_failed_and_repair(request_for: Callable[..., Any]) -> None:
    outcome = runs.admit_send(request_for("r1"), owner_process="")
    assert operators.mark_failed(outcome.session.pk, reason_text="stuck") == ["r1"]
    assert Run.objects.get(run_id="r1").error_message == "marked failed by operator: stuck"
    # a row left `running` with nothing behind it is repaired to the last run's outcome
    ChatSession.objects.filter(pk=outcome.session.pk).update(status=SessionStatus.RUNNING)
    assert operators.repair_session_row(outcome.session.pk) == ["status"]
    assert ChatSession.objects.get().status == SessionStatus.FAILED


def test_operator_start_next(request_for: Callable[..., Any]) -> None:
    first = runs.admit_send(request_for("r1"), owner_process="")
    runs.admit_send(request_for("r2"), owner_process="")
    assert operators.start_next(first.session.pk) is None  # the slot is taken
    # an active run that ended without releasing the slot is the doctor's to repair
    Run.objects.filter(run_id="r1").update(state=RunState.DONE)
    ChatSession.objects.filter(pk=first.session.pk).update(active_run=None)
    assert operators.start_next(first.session.pk) == "r2"


def _answer(session: ChatSession, killed: list[str]) -> str:
    return f"{session.session_id} stopped {killed}"


@pytest.mark.django_db(transaction=True)
def test_an_inline_command_is_done_once_under_its_key(
    request_for: Callable[..., Any],
    owner: Any,
    broadcasts: list[dict[str, Any]],
) -> None:
    """A retried /new answers its first answer from its receipt (which the reset it made does not
    clear) and resets nothing again; only an exchange stored in the transcript is announced as a
    `chat` `final` of the command's key."""
    runs.admit_send(request_for("r1"), owner_process="")
    reset = sessions.InlineCommand("k-new", "/new", "reset")
    first = sessions.answer_command(owner_id=owner.pk, key=KEY, agent_id="main", command=reset, answer=_answer)
    generation = first.session.session_id
    assert not first.replayed and first.receipt.run_ids == ["r1"] and first.receipt.session_generation == generation
    runs.admit_send(request_for("r2"), owner_process="")
    sent = len(broadcasts)
    again = sessions.answer_command(owner_id=owner.pk, key=KEY, agent_id="main", command=reset, answer=_answer)
    assert again.replayed and again.receipt.pk == first.receipt.pk and again.receipt.reply == first.receipt.reply
    assert (
        ChatSession.objects.get().session_id == generation
        and Run.objects.get(run_id="r2").state == RunState.DISPATCHING
    )
    assert broadcasts[sent:] == []  # nothing done, nothing announced
    for clash in (sessions.InlineCommand("k-new", "/stop", "stop"), sessions.InlineCommand("r2", "/new", "reset")):
        with pytest.raises(LifecycleError) as exc:
            sessions.answer_command(owner_id=owner.pk, key=KEY, agent_id="main", command=clash, answer=_answer)
        assert exc.value.code == "CONFLICT" and exc.value.details["reason"] == "idempotency-conflict"
    assert Run.objects.get(run_id="r2").state == RunState.DISPATCHING
    assert not [m for m in broadcasts if m["type"] == "gateway.chat" and m["runId"] == "k-new"]
    status = sessions.InlineCommand("k-status", "/status")
    stored = sessions.answer_command(owner_id=owner.pk, key=KEY, agent_id="main", command=status, answer=_answer)
    [final] = [m for m in broadcasts if m["type"] == "gateway.chat" and m["runId"] == "k-status"]
    assert final["run"] == -stored.receipt.pk and final["state"] == "final" and final["seq"] == 1
    assert final["payload"]["message"]["content"][0]["text"] == stored.receipt.reply
    assert final["payload"]["message"]["command"] is True
