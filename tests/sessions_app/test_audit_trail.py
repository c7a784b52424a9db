"""The audit receivers: one row per change, in the change's own transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from sessions_app.lifecycle import runs, sessions
from sessions_app.models import LifecycleEvent, Run, RunState

pytestmark = pytest.mark.django_db


def test_every_transition_leaves_one_audit_row(owner: Any, request_for: Callable[..., Any]) -> None:
    run = runs.admit_send(request_for("r1"), owner_process="").run
    assert run is not None
    runs.mark_running(run.pk)
    runs.finish_run(run.pk, RunState.FAILED, owner_process="", error_kind="backend", error_message="boom")
    trail = list(
        LifecycleEvent.objects.filter(run=run).order_by("id").values_list("from_state", "to_state", "reason", "detail")
    )
    assert trail == [
        ("queued", "dispatching", "send", ""),
        ("dispatching", "running", "run.running", ""),
        ("running", "failed", "run.failed", "boom"),
    ]
    assert LifecycleEvent.objects.filter(run=None, reason="create").count() == 1


def test_audit_rolls_back_with_its_change(owner: Any, request_for: Callable[..., Any]) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        runs.admit_send(request_for("r1"), owner_process="")
        raise RuntimeError("the unit fails after the transition")
    assert not Run.objects.exists() and not LifecycleEvent.objects.exists()


def test_a_patch_is_audited_with_its_actor(owner: Any) -> None:
    sessions.create_session(owner_id=owner.pk, key="agent:main:s")
    sessions.patch_session(owner_id=owner.pk, key="agent:main:s", label="x", actor="operator")
    assert list(LifecycleEvent.objects.order_by("id").values_list("reason", "actor")) == [
        ("create", "user"),
        ("patch", "operator"),
    ]
