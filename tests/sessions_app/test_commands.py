"""Operator commands via call_command: dry runs change nothing, --json parses, repairs clear findings."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from sessions_app.lifecycle.idle import prune_idle_sessions
from sessions_app.models import (
    ApiToken,
    ChatSession,
    GatewayProcess,
    LifecycleEvent,
    Message,
    Run,
    RunState,
    SessionStatus,
)
from sessions_app.operations import doctor
from sessions_app.tokens import authenticate_token, find_key, issue_token
from tests.support import opsdata
from tests.support.opsdata import doctor_json

pytestmark = pytest.mark.django_db


def run(*args: Any, **options: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def run_json(*args: Any, **options: Any) -> dict[str, Any]:
    return json.loads(run(*args, json=True, **options))


def snapshot() -> list[tuple[Any, ...]]:
    """Everything a command could change, to prove a dry run changed nothing."""
    return [
        *Run.objects.order_by("pk").values_list("pk", "state", "owner_process", "error_kind"),
        *ChatSession.objects.order_by("pk").values_list("pk", "status", "active_run_id", "version", "session_id"),
        ("audit", LifecycleEvent.objects.count()),
        ("messages", Message.objects.count()),
    ]


# --- recover_runs ---------------------------------------------------------------------------------------------


@pytest.fixture
def dead_process_session() -> tuple[Run, Run]:
    """An active run owned by a process that stopped heartbeating, with a queued run behind it."""
    owner = opsdata.user()
    opsdata.register_dead_process("crashed-1")
    active = opsdata.own(opsdata.send(owner, "busy", "k1"), "crashed-1")
    queued = opsdata.send(owner, "busy", "k2", message="second")
    return active, queued


def test_recover_runs_dry_run_changes_nothing(dead_process_session: tuple[Run, Run]) -> None:
    before = snapshot()
    data = run_json("recover_runs", dry_run=True)
    assert data["dryRun"] is True and data["deadProcesses"] == ["crashed-1"]
    assert [r["runId"] for r in data["runs"]] == ["k1"] and data["ended"] == 0
    assert "would end: run k1" in run("recover_runs", dry_run=True)
    assert snapshot() == before


def test_recover_runs_ends_dead_runs_and_starts_the_next(dead_process_session: tuple[Run, Run]) -> None:
    active, queued = dead_process_session
    data = run_json("recover_runs")
    assert data["ended"] == 1
    active.refresh_from_db()
    queued.refresh_from_db()
    assert (active.state, active.error_kind) == (RunState.FAILED, "interrupted")
    # Started from a command: unowned, so the next live server process claims it.
    assert (queued.state, queued.owner_process) == (RunState.DISPATCHING, "")
    session = ChatSession.objects.get(pk=active.session_id)
    assert session.active_run_id == queued.pk and session.status == SessionStatus.RUNNING
    audit = LifecycleEvent.objects.get(run=active, to_state=RunState.FAILED)
    assert (audit.reason, audit.actor) == ("run.interrupted", "reaper")
    assert "No active runs of dead processes." in run("recover_runs")


def test_recover_runs_leaves_live_processes_alone() -> None:
    opsdata.register_live_process()
    run_ = opsdata.own(opsdata.send(opsdata.user(), "busy", "k1"), opsdata.LIVE_PROCESS)
    assert run_json("recover_runs")["runs"] == []
    run_.refresh_from_db()
    assert run_.state == RunState.DISPATCHING


# --- prune_sessions ----------------------------------------------------------------------------------------------


@pytest.fixture
def retention_data() -> dict[str, ChatSession]:
    owner = opsdata.user()
    data: dict[str, ChatSession] = {}
    for name in ("old-idle-1", "old-idle-2"):
        run_ = opsdata.finish(opsdata.send(owner, name, f"{name}-r1"))
        opsdata.finish(opsdata.send(owner, name, f"{name}-r2"))
        data[name] = opsdata.session_of(run_)
    data["old-active"] = opsdata.session_of(opsdata.send(owner, "old-active", "a1"))
    data["old-queued"] = opsdata.session_of(opsdata.send(owner, "old-queued", "q1"))
    opsdata.send(owner, "old-queued", "q2")
    Run.objects.filter(run_id="q1").update(state=RunState.DONE)
    ChatSession.objects.filter(key="agent:main:old-queued").update(active_run=None, status="done")
    data["fresh-idle"] = opsdata.session_of(opsdata.finish(opsdata.send(owner, "fresh-idle", "f1")))
    for name in ("old-idle-1", "old-idle-2", "old-active", "old-queued"):
        opsdata.age_session(data[name], days=40)
    return data


def test_prune_dry_run_counts_and_changes_nothing(retention_data: dict[str, ChatSession]) -> None:
    before = snapshot()
    data = run_json("prune_sessions", older_than_days=30, dry_run=True)
    assert data["dryRun"] is True
    assert (data["sessions"], data["runs"], data["messages"]) == (2, 4, 8)
    assert data["audit"] >= 8
    assert sorted(data["sampleKeys"]) == ["agent:main:old-idle-1", "agent:main:old-idle-2"]
    assert snapshot() == before
    assert "Would delete 2 session(s)" in run("prune_sessions", older_than_days=30, dry_run=True)


def test_prune_deletes_idle_sessions_and_keeps_busy_ones(retention_data: dict[str, ChatSession]) -> None:
    idle_pks = [retention_data["old-idle-1"].pk, retention_data["old-idle-2"].pk]
    data = run_json("prune_sessions", older_than_days=30, batch_size=1)
    assert (data["sessions"], data["runs"], data["messages"]) == (2, 4, 8)
    assert not ChatSession.objects.filter(pk__in=idle_pks).exists()
    for model in (Run, Message, LifecycleEvent):
        assert not model.objects.filter(session_id__in=idle_pks).exists()
    kept = set(ChatSession.objects.values_list("key", flat=True))
    assert kept == {"agent:main:old-active", "agent:main:old-queued", "agent:main:fresh-idle"}
    assert Run.objects.filter(run_id="a1", state=RunState.DISPATCHING).exists()
    assert Run.objects.filter(run_id="q2", state=RunState.QUEUED).exists()


def test_prune_rechecks_under_the_lock(retention_data: dict[str, ChatSession]) -> None:
    """A session that got a run after it was selected is skipped, not deleted."""
    session = retention_data["old-idle-1"]
    owner = session.owner
    opsdata.send(owner, "old-idle-1", "late-run")  # busy again (and fresh)
    ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(days=40))
    batch = prune_idle_sessions([session.pk], idle_before=timezone.now() - timedelta(days=30))
    assert (batch.sessions, batch.skipped) == (0, 1)
    assert ChatSession.objects.filter(pk=session.pk).exists()


def test_prune_validates_arguments() -> None:
    with pytest.raises(CommandError):
        run("prune_sessions", older_than_days=-1)
    with pytest.raises(CommandError):
        run("prune_sessions", older_than_days=1, batch_size=0)


# --- gateway_doctor ----------------------------------------------------------------------------------------------


def plant(kind: str) -> None:
    """Create exactly one inconsistency of `kind` (a plain UPDATE: only tests bend rows like this)."""
    owner = opsdata.user()
    live = opsdata.register_live_process().server_id
    if kind == "dead_process_run":
        opsdata.own(opsdata.send(owner, "s", "r1"), "gone-process")
    elif kind == "unclaimed_run":  # no server running to claim it
        opsdata.send(owner, "s", "r1")
        GatewayProcess.objects.update(stopped_at=timezone.now())
    elif kind == "long_running_run":  # within its own budget, past GATEWAY_STUCK_RUN_SECONDS
        run = opsdata.own(opsdata.send(owner, "s", "r1"), live, dispatched_ago=timedelta(hours=2))
        Run.objects.filter(pk=run.pk).update(timeout_ms=24 * 3600 * 1000)
    elif kind == "overdue_run":
        opsdata.own(opsdata.send(owner, "s", "r1"), live, dispatched_ago=timedelta(hours=2))
    elif kind == "stale_generation_run":
        opsdata.own(opsdata.send(owner, "s", "r1"), live)
        queued = opsdata.send(owner, "s", "r2")
        Run.objects.filter(pk=queued.pk).update(session_generation=opsdata.random_generation())
    elif kind == "stray_active_run":
        active = opsdata.own(opsdata.send(owner, "s", "r1"), live)
        stray = opsdata.send(owner, "s", "r2")
        Run.objects.filter(pk=stray.pk).update(state=RunState.RUNNING, owner_process=live, dispatched_at=timezone.now())
        assert ChatSession.objects.get(pk=active.session_id).active_run_id == active.pk
    elif kind == "active_run_not_active":
        active = opsdata.own(opsdata.send(owner, "s", "r1"), live)
        Run.objects.filter(pk=active.pk).update(state=RunState.DONE, ended_at=timezone.now(), reply="done")
    elif kind == "running_without_active_run":
        done = opsdata.finish(opsdata.send(owner, "s", "r1"))
        ChatSession.objects.filter(pk=done.session_id).update(status=SessionStatus.RUNNING)
    elif kind == "active_without_running_status":
        active = opsdata.own(opsdata.send(owner, "s", "r1"), live)
        ChatSession.objects.filter(pk=active.session_id).update(status=SessionStatus.DONE)
    elif kind == "queued_without_active_run":
        active = opsdata.own(opsdata.send(owner, "s", "r1"), live)
        opsdata.send(owner, "s", "r2")
        Run.objects.filter(pk=active.pk).update(state=RunState.DONE, ended_at=timezone.now())
        ChatSession.objects.filter(pk=active.session_id).update(active_run=None, status=SessionStatus.DONE)
    else:
        raise AssertionError(kind)


def test_doctor_is_quiet_on_a_consistent_database() -> None:
    owner = opsdata.user()
    opsdata.register_live_process()
    opsdata.finish(opsdata.send(owner, "done", "d1"))
    opsdata.own(opsdata.send(owner, "busy", "b1"), opsdata.LIVE_PROCESS)
    opsdata.send(owner, "busy", "b2")  # queued behind a healthy active run
    data, code = doctor_json()
    assert (data["ok"], data["findings"], code) == (True, [], 0)
    assert "No findings" in run("gateway_doctor")


@pytest.mark.parametrize("kind", [k for k in doctor.CHECKS if k not in doctor.TOOL_CHECKS])
def test_doctor_finds_and_fixes_each_kind(kind: str) -> None:
    """(The tool-call kinds, planted with tool calls: tests/sessions_app/test_tool_operations.py.)"""
    plant(kind)
    data, code = doctor_json()
    assert code == 1 and data["ok"] is False
    assert [f["kind"] for f in data["findings"]] == [kind]
    with pytest.raises(CommandError) as raised:
        run("gateway_doctor")  # human output, same exit status
    assert raised.value.returncode == 1

    before = snapshot()
    data, code = doctor_json(fix=True, dry_run=True)
    assert code == 1 and data["repairs"] and not any(r["changed"] for r in data["repairs"])
    assert snapshot() == before

    data, code = doctor_json(fix=True)
    assert (code, data["ok"], data["remaining"]) == (0, True, [])
    assert any(r["changed"] for r in data["repairs"])
    assert doctor.check() == []
    # Repairs are lifecycle transitions: audited like any other change.
    assert LifecycleEvent.objects.filter(actor__in=["operator", "reaper"]).exists()
    # §7: running iff an active run, on every row.
    for session in ChatSession.objects.all():
        assert (session.status == SessionStatus.RUNNING) == (session.active_run_id is not None)


def test_doctor_lists_its_checks() -> None:
    assert set(run_json("gateway_doctor", list_checks=True)["checks"]) == set(doctor.CHECKS)


# --- tokens --------------------------------------------------------------------------------------------------------


def test_create_api_token_json_and_plain() -> None:
    data = run_json("create_api_token", "erin", create_user=True, name="ci")
    assert data["user"] == "erin" and data["token"].startswith(data["prefix"])
    assert authenticate_token(data["token"]).get_username() == "erin"
    raw = run("create_api_token", "erin").strip().splitlines()[-1]
    assert authenticate_token(raw) is not None
    with pytest.raises(CommandError):
        run("create_api_token", "nobody")


def test_create_api_token_with_scopes() -> None:
    data = run_json("create_api_token", "erin", create_user=True, name="reader", read_only=True)
    assert data["scopes"] == ["read"] and find_key(data["token"]).scopes == {"read"}
    data = run_json("create_api_token", "erin", scopes="approvals, read,write")
    assert data["scopes"] == ["read", "write", "approvals"]  # each once, in their order
    assert run_json("create_api_token", "erin")["scopes"] == ["read", "write", "approvals"]  # the default
    out = run("create_api_token", "erin", "--scopes", "read,write")
    assert "with scopes read,write" in out and find_key(out.strip().splitlines()[-1]).scopes == {"read", "write"}
    opsdata.user("root", is_staff=True)
    assert run_json("create_api_token", "root", scopes="read,admin")["scopes"] == ["read", "admin"]


@pytest.mark.parametrize(
    ("args", "options", "error"),
    [
        (("erin",), {"scopes": "read,admin"}, "only a staff user's key may have the admin scope"),
        (("erin",), {"scopes": "write"}, "every key has the read scope"),
        (("erin",), {"scopes": "read,sudo"}, "unknown scope 'sudo'"),
        (("erin",), {"scopes": ""}, "every key has the read scope"),
        (("erin", "--read-only", "--scopes", "read"), {}, "not allowed with argument"),
        (("newbie",), {"create_user": True, "scopes": "read,admin"}, "admin scope"),
    ],
)
def test_create_api_token_refuses_bad_scopes_and_changes_nothing(
    args: tuple[str, ...], options: dict[str, Any], error: str
) -> None:
    opsdata.user("erin")
    with pytest.raises(CommandError, match=error):
        run("create_api_token", *args, **options)
    assert not ApiToken.objects.exists()
    assert not get_user_model().objects.filter(username="newbie").exists()  # no user made for a refused key


def test_create_api_token_keeps_to_the_limit(settings: Any) -> None:
    settings.GATEWAY_MAX_API_KEYS_PER_USER = 2
    run("create_api_token", "erin", create_user=True)
    run("create_api_token", "erin")
    with pytest.raises(CommandError, match="at most 2 active keys per user"):
        run("create_api_token", "erin")
    assert ApiToken.objects.count() == 2


def test_revoke_api_token_by_prefix_id_and_user() -> None:
    erin = opsdata.user("erin")
    one, raw_one = issue_token(erin, name="one")
    two, raw_two = issue_token(erin, name="two")
    _three, raw_three = issue_token(erin, name="three")

    data = run_json("revoke_api_token", prefix=one.prefix, dry_run=True)
    assert data["dryRun"] is True and [t["id"] for t in data["tokens"]] == [one.pk] and data["revoked"] == 0
    assert authenticate_token(raw_one) is not None

    assert run_json("revoke_api_token", prefix=one.prefix)["revoked"] == 1
    assert authenticate_token(raw_one) is None and authenticate_token(raw_two) is not None
    assert "Revoked 1 token(s)" in run("revoke_api_token", token_id=two.pk)
    assert run_json("revoke_api_token", user="erin")["revoked"] == 1
    assert authenticate_token(raw_three) is None
    assert not ApiToken.objects.filter(revoked_at__isnull=True).exists()
    with pytest.raises(CommandError):
        run("revoke_api_token", prefix="agt")
    with pytest.raises(CommandError):
        run("revoke_api_token", user="nobody")


# --- seed_demo_data ------------------------------------------------------------------------------------------------


def test_seed_demo_data() -> None:
    data = run_json("seed_demo_data", sessions=40, runs=400, users=4, stuck=2, transcripts=True, seed=7)
    assert (data["sessions"], data["runs"], data["users"], data["stuck"]) == (40, 400, 4, 2)
    assert ChatSession.objects.count() == 40 and Run.objects.count() == 400
    assert data["messages"] == Message.objects.count() > 400
    # The data keeps the lifecycle rules, except the stuck sessions on purpose.
    assert doctor.summary(doctor.check()) == {"dead_process_run": 2}
    assert not GatewayProcess.objects.exists()
    # Ids continue after the seeded ones (a sequence left behind would collide here).
    assert opsdata.send(opsdata.user(), "after-seed", "x1").pk > 400
    assert "Seeded 5 sessions" in run("seed_demo_data", sessions=5, runs=10)
    with pytest.raises(CommandError):
        run("seed_demo_data", sessions=0, runs=5)


def test_progress_bar_for_many_rows() -> None:
    err = io.StringIO()
    call_command("seed_demo_data", sessions=600, runs=600, progress="always", stdout=io.StringIO(), stderr=err)
    assert "seeding sessions" in err.getvalue()
