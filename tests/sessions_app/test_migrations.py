"""Migrations that change data, run with Django's executor on the test database: forward over rows
written at the schema before them, backward, and forward again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("sessions_app", "0004_tools")]
SETTINGS = [("sessions_app", "0005_session_settings")]


@pytest.fixture
def executor() -> Iterator[MigrationExecutor]:
    """An executor; the database is back at the newest migrations afterwards, whatever the test did."""
    executor = MigrationExecutor(connection)
    yield executor
    executor = MigrationExecutor(connection)  # the graph as the test left it
    executor.migrate(executor.loader.graph.leaf_nodes())


def migrate(executor: MigrationExecutor, target: list[tuple[str, str]]) -> Any:
    """Migrate to `target`; the models as they are there."""
    executor.loader.build_graph()
    executor.migrate(target)
    return executor.loader.project_state(target).apps


def test_0005_copies_each_sessions_last_run_tokens(executor: MigrationExecutor) -> None:
    old = migrate(executor, BEFORE)
    user = old.get_model("auth", "User").objects.create(username="old", password="x")
    ChatSession, Run = old.get_model("sessions_app", "ChatSession"), old.get_model("sessions_app", "Run")

    def session_with_runs(key: str, *tokens: tuple[int | None, int | None]) -> Any:
        session = ChatSession.objects.create(owner=user, key=key)
        for i, (prompt, completion) in enumerate(tokens):
            session.last_run = Run.objects.create(
                session=session,
                run_id=f"r{i}",
                session_generation=session.session_id,
                state="done",
                body_hash="h",
                timeout_ms=1000,
                prompt_tokens=prompt,
                completion_tokens=completion,
            )
        session.save()
        return session

    ran = session_with_runs("agent:main:ran", (1, 2), (30, 40))  # the last run's counts, not the first's
    unreported = session_with_runs("agent:main:unreported", (5, 6), (None, None))
    never = session_with_runs("agent:main:never")
    stamps = dict(ChatSession.objects.values_list("key", "updated_at"))

    new = migrate(executor, SETTINGS)
    rows = {
        s.key: (s.input_tokens, s.output_tokens, s.updated_at)
        for s in new.get_model("sessions_app", "ChatSession").objects.all()
    }
    assert rows == {
        ran.key: (30, 40, stamps[ran.key]),
        unreported.key: (None, None, stamps[unreported.key]),
        never.key: (None, None, stamps[never.key]),
    }

    # backward: the columns go with their values; forward again: copied again
    migrate(executor, BEFORE)
    again = migrate(executor, SETTINGS).get_model("sessions_app", "ChatSession")
    assert again.objects.get(key=ran.key).input_tokens == 30
    assert uuid.UUID(str(again.objects.get(key=ran.key).session_id)) == ran.session_id
