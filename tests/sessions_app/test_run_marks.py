"""`record_delta` keeps an HTTP run's delta boundaries (`Run.marks`) in its one statement, on SQLite and on
PostgreSQL (HTTP-API.md §14.5: a resumed Responses stream replays the same deltas)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.lifecycle import runs
from sessions_app.models import Run, RunState, RunSurface
from tests.support import services

ROOT = Path(__file__).resolve().parents[2]


def _run_of(request_for: Callable[..., Any], run_id: str, surface: str) -> Run:
    # the child run of `test_marks_on_postgres` says which database it must be on
    assert connection.vendor == os.environ.get("AGENTGATE_EXPECT_VENDOR", connection.vendor)
    run = runs.admit_send(request_for(run_id, key=f"agent:main:{run_id}"), owner_process="").run
    assert run is not None
    Run.objects.filter(pk=run.pk).update(surface=surface)
    assert runs.mark_running(run.pk)
    return run


@pytest.mark.django_db
def test_an_http_run_keeps_the_length_after_each_delta_in_one_statement(request_for: Callable[..., Any]) -> None:
    run = _run_of(request_for, "h1", RunSurface.HTTP)
    texts = ["Hel", "Hello, wo", "Hello, world — ünïcode ✓"]
    for text in texts:
        with CaptureQueriesContext(connection) as queries:
            assert runs.record_delta(run.pk, text) is not None
        assert len(queries) == 1, [q["sql"] for q in queries]
    run.refresh_from_db()
    # characters, as Python (and a client slicing the reply) counts them
    assert run.marks == [len(t) for t in texts] == [3, 9, 24]
    assert run.reply == texts[-1]
    assert [run.reply[:m] for m in run.marks] == texts

    runs.finish_run(run.pk, RunState.DONE, owner_process="", reply=texts[-1])
    assert runs.record_delta(run.pk, "late") is None  # an ended run: nothing stored, no mark
    run.refresh_from_db()
    assert run.marks == [3, 9, 24]


@pytest.mark.django_db
def test_a_websocket_run_keeps_no_marks(request_for: Callable[..., Any]) -> None:
    run = _run_of(request_for, "w1", RunSurface.WEBSOCKET)
    for text in ("a", "ab", "abc"):
        assert runs.record_delta(run.pk, text) is not None
    run.refresh_from_db()
    assert run.marks == [] and run.reply == "abc"


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_marks_on_postgres() -> None:
    """This file again, in a child pytest whose database is PostgreSQL (jsonb `marks`)."""
    services.rerun_on_postgres(__file__, "marks", 2)
