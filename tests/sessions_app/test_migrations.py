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


RECEIPTS = [("sessions_app", "0006_command_receipts")]


def test_0006_gives_each_stored_command_its_receipt(executor: MigrationExecutor) -> None:
    """A command answered before receipts existed (its exchange in the transcript) still replays."""
    old = migrate(executor, SETTINGS)
    user = old.get_model("auth", "User").objects.create(username="old", password="x")
    ChatSession, Message = old.get_model("sessions_app", "ChatSession"), old.get_model("sessions_app", "Message")
    session = ChatSession.objects.create(owner=user, key="agent:main:main")
    gen = session.session_id
    for role, text, key in (
        ("user", "hello", ""),
        ("assistant", "echo: hello", ""),
        ("user", "/think high", "c1"),
        ("assistant", "Thinking level set to high.", "c1"),
        ("user", "/status", "c2"),
        ("assistant", "Session agent:main:main", "c2"),
    ):
        Message.objects.create(session=session, session_generation=gen, role=role, text=text, command_key=key)

    new = migrate(executor, RECEIPTS)
    receipts = new.get_model("sessions_app", "CommandReceipt").objects.order_by("key")
    assert [(r.session_id, r.key, r.text, r.reply, r.run_ids, r.session_generation) for r in receipts] == [
        (session.pk, "c1", "/think high", "Thinking level set to high.", [], gen),
        (session.pk, "c2", "/status", "Session agent:main:main", [], gen),
    ]
    # backward: the receipts go; forward again: made again
    migrate(executor, SETTINGS)
    assert migrate(executor, RECEIPTS).get_model("sessions_app", "CommandReceipt").objects.count() == 2


STAFF_KEYS = [("sessions_app", "0008_staff_keys_keep_admin")]


def test_0007_and_0008_keep_what_every_key_could_do(executor: MigrationExecutor) -> None:
    """Keys made before scopes get the default ones; a staff user's key keeps `admin`, which its
    clients were granted when they asked (PROTOCOL.md §2.4)."""
    old = migrate(executor, RECEIPTS)
    User, Token = old.get_model("auth", "User"), old.get_model("sessions_app", "ApiToken")
    plain = User.objects.create(username="plain", password="x")
    staff = User.objects.create(username="staff", password="x", is_staff=True)
    for user, digest in ((plain, "a"), (staff, "b"), (staff, "c")):
        Token.objects.create(user=user, prefix="agt_" + digest, token_hash=digest * 64)

    new = migrate(executor, STAFF_KEYS).get_model("sessions_app", "ApiToken")
    scopes = {t.token_hash[0]: t.scopes for t in new.objects.all()}
    assert scopes == {
        "a": ["read", "write", "approvals"],
        "b": ["read", "write", "approvals", "admin"],
        "c": ["read", "write", "approvals", "admin"],
    }
    # backward to before the column, forward again: the same
    migrate(executor, RECEIPTS)
    again = migrate(executor, STAFF_KEYS).get_model("sessions_app", "ApiToken")
    assert sorted(t.scopes[-1] for t in again.objects.all()) == ["admin", "admin", "approvals"]


def test_0012_makes_each_transcript_one_branch_ending_at_its_newest_message(executor: MigrationExecutor) -> None:
    old = migrate(executor, [("sessions_app", "0011_stored_files")])
    user = old.get_model("auth", "User").objects.create(username="old", password="x")
    ChatSession, Message = old.get_model("sessions_app", "ChatSession"), old.get_model("sessions_app", "Message")
    talked = ChatSession.objects.create(owner=user, key="agent:main:talked")
    reset = ChatSession.objects.create(owner=user, key="agent:main:reset")
    silent = ChatSession.objects.create(owner=user, key="agent:main:silent")
    earlier = uuid.uuid4()  # `reset`'s transcript before its reset
    rows = [
        (talked, talked.session_id, "user", "a"),
        (reset, earlier, "user", "old"),
        (talked, talked.session_id, "assistant", "b"),
        (reset, earlier, "assistant", "old reply"),
        (reset, reset.session_id, "user", "new"),
        (talked, talked.session_id, "user", "c"),
    ]
    made = [Message.objects.create(session=s, session_generation=g, role=role, text=text) for s, g, role, text in rows]

    new = migrate(executor, [("sessions_app", "0012_message_branches")])
    Message, ChatSession = new.get_model("sessions_app", "Message"), new.get_model("sessions_app", "ChatSession")
    parents = dict(Message.objects.values_list("text", "parent__text"))
    assert parents == {"a": None, "b": "a", "c": "b", "old": None, "old reply": "old", "new": None}
    leaves = dict(ChatSession.objects.values_list("key", "active_leaf_id"))
    assert leaves == {"agent:main:talked": made[5].pk, "agent:main:reset": made[4].pk, "agent:main:silent": None}
    assert silent.pk in ChatSession.objects.values_list("pk", flat=True)
