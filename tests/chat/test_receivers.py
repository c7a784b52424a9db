"""The gateway's receivers: events encoded in the transaction, sent only once it commits."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from chat import delivery
from sessions_app.lifecycle import runs
from sessions_app.lifecycle.runs import SendRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    monkeypatch.setattr(delivery.broadcaster, "send", lambda owner_id, message: messages.append(message))
    return messages


def send(owner: Any, run_id: str) -> runs.SendOutcome:
    request = SendRequest(
        owner_id=owner.pk,
        key="agent:main:main",
        agent_id="main",
        run_id=run_id,
        message="hi",
        body_hash=hashlib.sha256(b"hi").hexdigest(),
        timeout_ms=60_000,
    )
    return runs.admit_send(request, owner_process="")


def test_rolled_back_changes_send_nothing(sent: list[dict[str, Any]], django_capture_on_commit_callbacks: Any) -> None:
    owner = get_user_model().objects.create_user(username="o")
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        send(owner, "r1")
        raise RuntimeError("rolled back")
    assert sent == []


@pytest.mark.django_db(transaction=True)
def test_two_changes_in_one_transaction_both_carry_the_committed_row(sent: list[dict[str, Any]]) -> None:
    """A run ends and the next starts in one commit: one event per change, each with the row as committed."""
    owner = get_user_model().objects.create_user(username="o")
    first = send(owner, "r1").run
    send(owner, "r2")
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
        send(owner, "r1")
    rows = [(m["reason"], json.loads(m["row"])["activeRunIds"]) for m in sent if m["type"] == "gateway.session"]
    assert rows == [("create", ["r1"]), ("send", ["r1"])]


@pytest.mark.django_db(transaction=True)
def test_changes_after_a_rollback_are_still_announced(sent: list[dict[str, Any]]) -> None:
    owner = get_user_model().objects.create_user(username="o")
    first = send(owner, "r1")
    with pytest.raises(RuntimeError), transaction.atomic():
        send(owner, "r2")  # queued: the row changed
        raise RuntimeError("rolled back")
    sent.clear()
    send(owner, "r3")
    assert first.run is not None
    rows = [json.loads(m["row"])["queuedRunIds"] for m in sent if m["type"] == "gateway.session"]
    assert rows == [["r3"]]
