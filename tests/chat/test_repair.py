"""The repair snapshot: what the database says about the runs and rows connections care about."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.delivery.repair import Position, Scanner, take_snapshot
from sessions_app.lifecycle import runs, sessions
from tests.support.db import admit_send

pytestmark = pytest.mark.django_db


def test_snapshot_of_open_ended_and_deleted() -> None:
    owner = get_user_model().objects.create_user(username="o")
    past = timezone.now() - timedelta(minutes=1)
    scanner = Scanner(Position(past), Position(past))
    live = admit_send(owner, "live").run
    done = admit_send(owner, "done", key="agent:main:other").run
    runs.mark_running(done.pk)
    runs.finish_run(done.pk, "done", owner_process="", reply="x")
    gone = admit_send(owner, "gone", key="agent:main:gone")
    sessions.delete_session(owner_id=owner.pk, key="agent:main:gone")
    snap = take_snapshot(scanner, {live.pk, done.pk, gone.run.pk}, {owner.pk}, True, {gone.session.pk})
    assert snap.runs[live.pk] == {"state": "dispatching"}
    assert snap.runs[done.pk]["payload"]["state"] == "final"
    assert gone.run.pk not in snap.runs  # deleted with its session: nothing to say about it
    assert done.pk in snap.ended and snap.ended[done.pk].payload["seq"] == 3
    assert snap.checked == {gone.session.pk} and snap.existing == set()
    assert {row["key"] for _owner, row in snap.rows.values()} == {"agent:main:main", "agent:main:other"}
    # caught up: the next pass starts from this one (less the look-back margin)
    assert scanner.runs.since > past and scanner.runs.cursor is None
