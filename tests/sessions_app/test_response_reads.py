"""Responses rows and their reads (sessions_app/lifecycle/responses.py, sessions_app/response_reads.py):
a response is its owner's only and only while stored; its run, calls and approvals come in two
statements; forgetting one leaves its run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sessions_app import response_reads
from sessions_app.lifecycle import responses, runs, sessions, toolcalls
from sessions_app.models import ApiResponse, Run

pytestmark = pytest.mark.django_db


def respond(request_for: Callable[..., Any], run_id: str, **spec: Any) -> tuple[Run, ApiResponse]:
    """Admit a send and record its response, in one transaction (as admission's hook does)."""
    with transaction.atomic():
        run = runs.admit_send(request_for(run_id), owner_process="").run
        assert run is not None
        recorder = responses.recorder(responses.ResponseSpec(owner_id=run.session.owner_id, model="main", **spec))
        recorder(run)
    assert recorder.row is not None
    return run, recorder.row


def test_a_response_is_found_by_its_owner_only_while_stored(owner: Any, request_for: Callable[..., Any]) -> None:
    run, row = respond(request_for, "r1", input_items=[{"id": "msg_1", "type": "message"}], metadata={"k": "v"})
    assert row.response_id.startswith("resp_") and len(row.response_id) == 37
    found = response_reads.find(owner.pk, row.response_id)
    assert found is not None and found.run.pk == run.pk and found.metadata == {"k": "v"}
    assert found.run.session_key == "agent:main:main" and found.run.state == run.state
    other = get_user_model().objects.create_user(username="other", password="pw-12345678")
    assert response_reads.find(other.pk, row.response_id) is None
    assert response_reads.input_items(other.pk, row.response_id) is None
    assert response_reads.input_items(owner.pk, row.response_id) == [{"id": "msg_1", "type": "message"}]
    assert not responses.forget(owner_id=other.pk, response_id=row.response_id)
    assert responses.forget(owner_id=owner.pk, response_id=row.response_id)
    assert response_reads.find(owner.pk, row.response_id) is None
    assert not responses.forget(owner_id=owner.pk, response_id=row.response_id)
    assert Run.objects.filter(pk=run.pk).exists()  # forgetting a response leaves its run


def test_an_unstored_response_is_followed_by_its_run_but_never_found_by_id(
    owner: Any, request_for: Callable[..., Any]
) -> None:
    run, row = respond(request_for, "r1", store=False)
    assert response_reads.find(owner.pk, row.response_id) is None
    assert not responses.forget(owner_id=owner.pk, response_id=row.response_id)
    followed = response_reads.of_run(run.pk)
    assert followed is not None and followed.response_id == row.response_id and followed.store is False


def test_a_rolled_back_admission_leaves_no_response(owner: Any, request_for: Callable[..., Any]) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        respond(request_for, "r1")
        raise RuntimeError("the admission's transaction fails after the row")
    assert not ApiResponse.objects.exists() and not Run.objects.exists()


def test_the_run_its_calls_and_approvals_in_two_statements(owner: Any, request_for: Callable[..., Any]) -> None:
    run, row = respond(request_for, "r1")
    runs.record_delta(run.pk, "echo:")
    new = [toolcalls.NewCall("m1", "demo", "add", "{}"), toolcalls.NewCall("m2", "demo", "add", "{}")]
    calls = toolcalls.record_calls(run.pk, step=1, calls=new, reply_offset=5, recorded_before=0)
    assert calls is not None
    approval = toolcalls.request_approval(calls[0].pk, expires_at=timezone.now() + timedelta(minutes=1))
    assert approval is not None
    with CaptureQueriesContext(connection) as ctx:
        found = response_reads.find(owner.pk, row.response_id)
    assert len(ctx.captured_queries) == 2
    assert found is not None and found.run.reply == "echo:"
    first, second = found.run.calls
    assert (first.approval_id, first.approval_pending, first.state) == (approval.approval_id, True, "pending_approval")
    assert (second.approval_id, second.reply_offset, second.started) == ("", 5, False)
    toolcalls.resolve_approval(approval.approval_id, decision="deny", user_id=owner.pk, user_name="owner")
    again = response_reads.refreshed(found)
    assert again is not None and again.run.calls[0].approval_decision == "deny" and again.run.calls[0].state == "denied"


def test_a_run_without_calls_is_one_statement_and_gone_with_its_session(
    owner: Any, request_for: Callable[..., Any]
) -> None:
    _run, row = respond(request_for, "r1")
    found = response_reads.find(owner.pk, row.response_id)
    assert found is not None
    with CaptureQueriesContext(connection) as ctx:
        assert response_reads.refreshed(found) is not None
    assert len(ctx.captured_queries) == 1
    sessions.delete_session(owner_id=owner.pk, key="agent:main:main")
    assert response_reads.refreshed(found) is None
    assert response_reads.find(owner.pk, row.response_id) is None


def test_admission_records_a_response_for_each_new_run_only(owner: Any, request_for: Callable[..., Any]) -> None:
    def admit(run_id: str, message: str = "hello", **extra: Any) -> tuple[str, ApiResponse | None]:
        recorder = responses.recorder(responses.ResponseSpec(owner_id=owner.pk, model="main"))
        outcome = runs.admit_send(request_for(run_id, message, on_admitted=recorder, **extra), owner_process="")
        return outcome.admission, recorder.row

    started, row = admit("r1")
    assert started == "started" and row is not None and row.run.run_id == "r1"
    queued, row = admit("r2")
    assert queued == "queued" and row is not None and row.run.run_id == "r2"
    assert admit("r1") == ("existing", None)  # a retry under its key finds its response by its run
    assert admit("r1", "another message") == ("conflict", None)
    assert list(ApiResponse.objects.order_by("id").values_list("run__run_id", flat=True)) == ["r1", "r2"]
