"""Operator admin: filters, counts, detail page, actions (through the lifecycle, broadcast), scale."""

from __future__ import annotations

import re
from datetime import timedelta
from http import HTTPStatus
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils import timezone

from sessions_app import operator_reads
from sessions_app.lifecycle import operators, runs
from sessions_app.lifecycle import sessions as session_services
from sessions_app.lifecycle.branches import Regeneration
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run, RunState, SessionStatus
from sessions_app.operations.seed import seed_demo_data
from sessions_app.run_requests import ClientTool, RunRequest
from tests.support import opsdata
from tests.support.communicator import open_client
from tests.support.db import admit_send

CHANGELIST = "admin:sessions_app_chatsession_changelist"


def changelist_keys(response: Any) -> set[str]:
    return {s.key for s in response.context["cl"].result_list}


def post_action(client: Client, action: str, sessions: list[ChatSession], **extra: Any) -> Any:
    data = {"action": action, "_selected_action": [s.pk for s in sessions], "index": "0", **extra}
    return client.post(reverse(CHANGELIST), data)


# --- filters, search, counts ---------------------------------------------------------------------------------


@pytest.fixture
def planted(db: None) -> dict[str, ChatSession]:
    """One session per situation the filters must tell apart."""
    owner = opsdata.user("carol")
    other = opsdata.user("dave")
    opsdata.register_live_process()
    sessions: dict[str, ChatSession] = {}

    run = opsdata.own(opsdata.send(owner, "dead-owner", "r-dead"), "dead-test-process")
    sessions["dead_owner"] = opsdata.session_of(run)
    run = opsdata.own(opsdata.send(owner, "healthy", "r-healthy"), opsdata.LIVE_PROCESS)
    sessions["healthy"] = opsdata.session_of(run)
    run = opsdata.own(
        opsdata.send(owner, "too-long", "r-long"), opsdata.LIVE_PROCESS, dispatched_ago=timedelta(hours=3)
    )
    sessions["too_long"] = opsdata.session_of(run)
    run = opsdata.send(owner, "unowned", "r-unowned")  # no live process claimed it in time
    Run.objects.filter(pk=run.pk).update(dispatched_at=timezone.now() - timedelta(minutes=10))
    sessions["unowned"] = opsdata.session_of(run)
    run = opsdata.send(owner, "just-dispatched", "r-fresh")  # unowned, but a live process claims it soon
    sessions["just_dispatched"] = opsdata.session_of(run)

    first = opsdata.own(opsdata.send(owner, "queued-orphan", "r-q1"), opsdata.LIVE_PROCESS)
    queued = opsdata.send(owner, "queued-orphan", "r-q2")
    assert queued.state == RunState.QUEUED
    ChatSession.objects.filter(pk=first.session_id).update(active_run=None)  # the slot released, queue left
    Run.objects.filter(pk=first.pk).update(state=RunState.DONE)
    sessions["queued_orphan"] = opsdata.session_of(first)

    run = opsdata.own(opsdata.send(owner, "ended-slot", "r-slot"), opsdata.LIVE_PROCESS)
    Run.objects.filter(pk=run.pk).update(state=RunState.DONE)  # planted: the slot holds an ended run
    sessions["ended_slot"] = opsdata.session_of(run)

    run = opsdata.finish(opsdata.send(other, "running-row", "r-row"))
    ChatSession.objects.filter(pk=run.session_id).update(status=SessionStatus.RUNNING)
    sessions["running_row"] = opsdata.session_of(run)

    run = opsdata.finish(
        opsdata.send(owner, "failed-now", "r-f1"), RunState.FAILED, error_kind="backend", error_message="model exploded"
    )
    sessions["failed_now"] = opsdata.session_of(run)
    run = opsdata.finish(
        opsdata.send(owner, "failed-old", "r-f2"), RunState.FAILED, error_kind="backend", error_message="old failure"
    )
    opsdata.ended_ago(opsdata.session_of(run), timedelta(days=3))
    sessions["failed_old"] = opsdata.session_of(run)
    run = opsdata.finish(opsdata.send(other, "done", "r-done"))
    sessions["done"] = opsdata.session_of(run)
    sessions["never"] = session_services.create_session(owner_id=owner.pk, key="agent:main:never")
    return sessions


STUCK = {"dead_owner", "too_long", "unowned", "queued_orphan", "running_row", "ended_slot"}


@override_settings(GATEWAY_STUCK_RUN_SECONDS=3600)
def test_stuck_filter_selects_exactly_the_stuck_sessions(admin_client: Client, planted: dict[str, Any]) -> None:
    res = admin_client.get(reverse(CHANGELIST), {"stuck": "yes"})
    assert res.status_code == HTTPStatus.OK
    assert changelist_keys(res) == {planted[name].key for name in STUCK}
    assert set(operator_reads.stuck_sessions().values_list("key", flat=True)) == {planted[n].key for n in STUCK}
    assert "· stuck" in res.content.decode()


def test_failed_filters(admin_client: Client, planted: dict[str, Any]) -> None:
    res = admin_client.get(reverse(CHANGELIST), {"failed": "24h"})
    assert changelist_keys(res) == {planted["failed_now"].key}
    res = admin_client.get(reverse(CHANGELIST), {"failed": "7d"})
    assert changelist_keys(res) == {planted["failed_now"].key, planted["failed_old"].key}


def test_run_error_kind_filter_offers_unavailable(admin_client: Client, django_user_model: Any) -> None:
    """A run the database outage ended (`errorKind: "unavailable"`) is one click away, like the rest."""
    owner = django_user_model.objects.create_user("erin")
    opsdata.finish(opsdata.send(owner, "outage", "r-out"), RunState.FAILED, error_kind="unavailable")
    opsdata.finish(opsdata.send(owner, "model", "r-model"), RunState.FAILED, error_kind="backend")
    res = admin_client.get(reverse("admin:sessions_app_run_changelist"), {"error_kind": "unavailable"})
    assert [r.run_id for r in res.context["cl"].result_list] == ["r-out"]
    (kinds,) = [f for f in res.context["cl"].filter_specs if getattr(f, "parameter_name", "") == "error_kind"]
    assert "unavailable" in [value for value, _label in kinds.lookup_choices]  # offered among its choices


def test_status_filter(admin_client: Client, planted: dict[str, Any]) -> None:
    res = admin_client.get(reverse(CHANGELIST), {"status": "done"})
    assert changelist_keys(res) == {planted["done"].key}
    res = admin_client.get(reverse(CHANGELIST), {"status": "none"})
    assert changelist_keys(res) == {planted["never"].key}
    res = admin_client.get(reverse(CHANGELIST), {"status": "running"})
    assert planted["healthy"].key in changelist_keys(res)


@pytest.mark.parametrize(
    ("term", "expected"),
    [("queued-orph", {"queued_orphan"}), ("dave", {"running_row", "done"}), ("r-f2", {"failed_old"})],
    ids=["key", "owner", "runId"],
)
def test_search(admin_client: Client, planted: dict[str, Any], term: str, expected: set[str]) -> None:
    res = admin_client.get(reverse(CHANGELIST), {"q": term})
    assert changelist_keys(res) == {planted[name].key for name in expected}


def test_counts_at_the_top(admin_client: Client, planted: dict[str, Any]) -> None:
    res = admin_client.get(reverse(CHANGELIST))
    counts = {label: number for label, number, _url in res.context["agentgate_counts"]}
    running = ChatSession.objects.filter(active_run__state__in=["dispatching", "running"]).count()
    assert counts == {"running": running, "stuck": len(STUCK), "failed (24 h)": 1, "live processes": 1}
    html = res.content.decode()
    assert 'id="agentgate-counts"' in html and "?stuck=yes" in html and "?failed=24h" in html


def test_list_columns(admin_client: Client, planted: dict[str, Any]) -> None:
    html = admin_client.get(reverse(CHANGELIST), {"q": "failed-now"}).content.decode()
    for text in ("failed-now", "carol", "r-f1", "model exploded"):
        assert text in html


def test_detail_page_shows_runs_and_timeline(admin_client: Client, planted: dict[str, Any]) -> None:
    session = planted["queued_orphan"]
    res = admin_client.get(reverse("admin:sessions_app_chatsession_change", args=[session.pk]))
    assert res.status_code == HTTPStatus.OK
    html = res.content.decode()
    assert "r-q1" in html and "r-q2" in html  # runs inline
    assert 'class="agentgate-timeline"' in html
    assert "<td>send</td>" in html and "<td>queued</td>" in html and "<td>user</td>" in html
    for action in ("abort_runs", "mark_failed", "reset_sessions"):
        assert f'value="{action}"' in html


def test_detail_page_shows_the_active_branch_and_the_others(admin_client: Client, db: None) -> None:
    owner = opsdata.user("branchy")
    first = admit_send(owner, "b1", "pick a colour")
    assert first.run is not None and runs.finish_run(first.run.pk, RunState.DONE, owner_process="", reply="Blue.")
    blue = Message.objects.get(run=first.run, role="assistant")
    again = admit_send(owner, "b2", "", regeneration=Regeneration(blue.pk))
    assert again.run is not None and runs.finish_run(again.run.pk, RunState.DONE, owner_process="", reply="Green.")
    green = Message.objects.get(run=again.run, role="assistant")
    html = admin_client.get(reverse("admin:sessions_app_chatsession_change", args=[first.session.pk])).content.decode()
    assert "pick a colour" in html and "Green." in html and "Blue." not in html  # the active branch only
    assert f"#{green.pk} (2 messages, active), #{blue.pk} (2 messages)" in html
    assert "regenerate" in html  # the leaf's move is in the timeline


def test_a_runs_page_shows_what_its_http_request_gave_it(admin_client: Client, db: None) -> None:
    run = opsdata.send(opsdata.user("erin"), "api-1", "r-http", message="what is my name?")
    tool = ClientTool("get_weather", parameters={"type": "object", "properties": {"city": {}}})
    request = RunRequest(context=[{"role": "user", "content": "I am Zed."}], client_tools=[tool], stateless=True)
    Run.objects.filter(pk=run.pk).update(request=request.as_json())  # as the HTTP door admits it
    html = admin_client.get(reverse("admin:sessions_app_run_change", args=[run.pk])).content.decode()
    assert "I am Zed." in html and "get_weather" in html and "properties" not in html  # tools by name


def test_run_and_process_admin_pages(admin_client: Client, planted: dict[str, Any]) -> None:
    res = admin_client.get(reverse("admin:sessions_app_run_changelist"), {"q": "r-dead"})
    assert [r.run_id for r in res.context["cl"].result_list] == ["r-dead"]
    run = Run.objects.get(run_id="r-dead")
    assert admin_client.get(reverse("admin:sessions_app_run_change", args=[run.pk])).status_code == HTTPStatus.OK
    res = admin_client.get(reverse("admin:sessions_app_run_changelist"), {"session__id__exact": run.session_id})
    assert [r.run_id for r in res.context["cl"].result_list] == ["r-dead"]
    res = admin_client.get(reverse("admin:sessions_app_gatewayprocess_changelist"))
    assert opsdata.LIVE_PROCESS in res.content.decode()


# --- actions (synchronous: effects on rows and audit) ------------------------------------------------------------


def test_abort_action_ends_active_and_queued_runs(admin_client: Client, db: None) -> None:
    owner = opsdata.user()
    active = opsdata.send(owner, "busy", "a1")
    queued = opsdata.send(owner, "busy", "a2")
    session = opsdata.session_of(active)
    res = post_action(admin_client, "abort_runs", [session])
    assert res.status_code == HTTPStatus.FOUND
    assert {r.run_id: (r.state, r.stop_reason) for r in Run.objects.filter(pk__in=[active.pk, queued.pk])} == {
        "a1": (RunState.KILLED, "operator"),
        "a2": (RunState.KILLED, "operator"),
    }
    session.refresh_from_db()
    assert session.status == SessionStatus.KILLED and session.active_run_id is None
    assert LifecycleEvent.objects.filter(session=session, actor="operator", to_state=RunState.KILLED).count() == 2
    assert LogEntry.objects.filter(object_id=str(session.pk), change_message__contains="a1").exists()


def test_action_from_the_session_page_returns_to_it(admin_client: Client, db: None) -> None:
    session = opsdata.session_of(opsdata.send(opsdata.user(), "busy", "a1"))
    res = post_action(admin_client, "abort_runs", [session], agentgate_return=str(session.pk))
    assert res.status_code == HTTPStatus.FOUND
    assert res["Location"] == reverse("admin:sessions_app_chatsession_change", args=[session.pk])


def test_mark_failed_requires_a_reason_and_records_it(admin_client: Client, db: None) -> None:
    owner = opsdata.user()
    run = opsdata.send(owner, "busy", "m1")
    session = opsdata.session_of(run)
    res = post_action(admin_client, "mark_failed", [session])
    assert res.status_code == HTTPStatus.OK  # the reason form
    assert b'name="reason"' in res.content
    res = post_action(admin_client, "mark_failed", [session], apply="yes", reason=" ")
    assert res.status_code == HTTPStatus.OK and b"errorlist" in res.content
    run.refresh_from_db()
    assert run.state == RunState.DISPATCHING  # nothing changed without a reason

    res = post_action(admin_client, "mark_failed", [session], apply="yes", reason="backend wedged")
    assert res.status_code == HTTPStatus.FOUND
    run.refresh_from_db()
    session.refresh_from_db()
    assert run.state == RunState.FAILED and "backend wedged" in run.error_message and "(by admin)" in run.error_message
    assert session.status == SessionStatus.FAILED and "backend wedged" in session.last_run_error
    audit = LifecycleEvent.objects.get(run=run, to_state=RunState.FAILED)
    assert audit.actor == "operator" and "backend wedged" in audit.detail


def test_reset_action(admin_client: Client, db: None) -> None:
    run = opsdata.send(opsdata.user(), "busy", "z1")
    session = opsdata.session_of(run)
    old_generation = session.session_id
    post_action(admin_client, "reset_sessions", [session])
    session.refresh_from_db()
    run.refresh_from_db()
    assert session.session_id != old_generation and session.status is None
    assert run.state == RunState.KILLED and run.stop_reason == "reset"


def test_delete_goes_through_the_lifecycle(admin_client: Client, db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = session_services.delete_session

    def spy(*, pk: int, actor: str) -> list[str]:
        calls.append(pk)
        assert actor == "operator"
        return real(pk=pk, actor=actor)

    monkeypatch.setattr(session_services, "delete_session", spy)
    owner = opsdata.user()
    one = opsdata.session_of(opsdata.send(owner, "one", "d1"))
    two = opsdata.session_of(opsdata.send(owner, "two", "d2"))
    three = opsdata.session_of(opsdata.send(owner, "three", "d3"))
    res = post_action(admin_client, "delete_selected", [one, two])  # the confirmation page
    assert res.status_code == HTTPStatus.OK and b"Runs: 2" in res.content
    assert ChatSession.objects.count() == 3
    res = post_action(admin_client, "delete_selected", [one, two], post="yes")
    assert res.status_code == HTTPStatus.FOUND
    url = reverse("admin:sessions_app_chatsession_delete", args=[three.pk])
    assert admin_client.post(url, {"post": "yes"}).status_code == HTTPStatus.FOUND
    assert sorted(calls) == sorted([one.pk, two.pk, three.pk])
    assert not ChatSession.objects.exists() and not Run.objects.exists()


def test_run_admin_abort_action(admin_client: Client, db: None) -> None:
    owner = opsdata.user()
    opsdata.send(owner, "busy", "ra1")
    queued = opsdata.send(owner, "busy", "ra2")
    url = reverse("admin:sessions_app_run_changelist")
    res = admin_client.post(url, {"action": "abort_selected", "_selected_action": [queued.pk], "index": "0"})
    assert res.status_code == HTTPStatus.FOUND
    queued.refresh_from_db()
    assert queued.state == RunState.KILLED and queued.stop_reason == "operator"
    assert Run.objects.get(run_id="ra1").state == RunState.DISPATCHING


def test_label_edit_goes_through_the_lifecycle(admin_client: Client, db: None) -> None:
    session = session_services.create_session(owner_id=opsdata.user().pk, key="agent:main:label-me")
    url = reverse("admin:sessions_app_chatsession_change", args=[session.pk])
    res = admin_client.post(url, {"label": "Renamed", "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0"})
    assert res.status_code == HTTPStatus.FOUND, res.content[:2000]
    session.refresh_from_db()
    assert session.label == "Renamed" and session.version == 2
    assert LifecycleEvent.objects.filter(session=session, reason="patch", actor="operator").exists()


# --- a session deleted between the change list and the action ------------------------------------------------------
#
# The action has read its rows; a client deletes one of them (`sessions.delete`, through the
# lifecycle) before the action reaches it, so that row's lifecycle call finds it gone. The
# wrapper below changes no service: it only makes that delete happen right before the first
# call the action makes, whichever row that is for.


def delete_before_first_call(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, victim: ChatSession) -> None:
    real = getattr(module, name)
    delete = session_services.delete_session  # the real one, even when `name` is delete_session
    calls: list[object] = []

    def ordered(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            delete(owner_id=victim.owner_id, key=victim.key, actor="user")
        calls.append(args or kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, ordered)


def admin_messages(res: Any) -> list[str]:
    return [str(m) for m in get_messages(res.wsgi_request)]


def three_busy_sessions() -> tuple[list[ChatSession], list[Run]]:
    owner = opsdata.user()
    runs = [opsdata.send(owner, f"busy-{n}", f"x{n}") for n in range(3)]
    return [opsdata.session_of(r) for r in runs], runs


def logged_changes(session: ChatSession) -> int:
    return LogEntry.objects.filter(object_id=str(session.pk), action_flag=CHANGE).count()


@pytest.mark.parametrize(
    ("action", "module", "name", "extra", "message"),
    [
        (
            "abort_runs",
            session_services,
            "abort_all",
            {},
            r"Aborted 2 run\(s\) in 2 session\(s\); skipped 1: deleted meanwhile\.",
        ),
        (
            "mark_failed",
            operators,
            "mark_failed",
            {"apply": "yes", "reason": "backend wedged"},
            r"Marked 2 run\(s\) failed: (x0, x2|x2, x0); skipped 1: deleted meanwhile\.",
        ),
        (
            "reset_sessions",
            session_services,
            "reset_session",
            {},
            r"Reset 2 session\(s\); skipped 1: deleted meanwhile\.",
        ),
    ],
)
def test_session_action_skips_a_session_deleted_meanwhile(
    admin_client: Client,
    db: None,
    monkeypatch: pytest.MonkeyPatch,
    action: str,
    module: Any,
    name: str,
    extra: dict[str, str],
    message: str,
) -> None:
    (first, victim, last), runs = three_busy_sessions()
    delete_before_first_call(monkeypatch, module, name, victim)
    res = post_action(admin_client, action, [first, victim, last], **extra)
    assert res.status_code == HTTPStatus.FOUND
    (shown,) = admin_messages(res)
    assert re.fullmatch(message, shown), shown  # the rows are acted on newest first
    assert not ChatSession.objects.filter(pk=victim.pk).exists()
    expected = {"abort_runs": RunState.KILLED, "mark_failed": RunState.FAILED, "reset_sessions": RunState.KILLED}[
        action
    ]
    for session, run in ((first, runs[0]), (last, runs[2])):
        run.refresh_from_db()
        assert run.state == expected
        assert LifecycleEvent.objects.filter(run=run, to_state=expected, actor="operator").exists()
        assert logged_changes(session) == 1
    if action == "reset_sessions":
        assert LifecycleEvent.objects.filter(session__in=[first, last], reason="reset", actor="operator").count() == 2


def test_bulk_delete_skips_a_session_deleted_meanwhile(
    admin_client: Client, db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first, victim, last), _runs = three_busy_sessions()
    delete_before_first_call(monkeypatch, session_services, "delete_session", victim)
    res = post_action(admin_client, "delete_selected", [first, victim, last], post="yes")
    assert res.status_code == HTTPStatus.FOUND
    assert admin_messages(res) == ["Deleted 2 chat session(s); skipped 1: deleted meanwhile."]
    assert not ChatSession.objects.exists() and not Run.objects.exists()
    deletions = LogEntry.objects.filter(action_flag=DELETION)
    assert sorted(deletions.values_list("object_id", flat=True)) == sorted([str(first.pk), str(last.pk)])


def test_delete_page_of_a_session_deleted_meanwhile(
    admin_client: Client, db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = opsdata.session_of(opsdata.send(opsdata.user(), "busy", "d1"))
    delete_before_first_call(monkeypatch, session_services, "delete_session", session)
    res = admin_client.post(reverse("admin:sessions_app_chatsession_delete", args=[session.pk]), {"post": "yes"})
    assert res.status_code == HTTPStatus.FOUND and res["Location"] == reverse(CHANGELIST)
    assert admin_messages(res) == [f"Skipped the chat session “{session.key}”: deleted meanwhile."]
    assert not LogEntry.objects.filter(action_flag=DELETION).exists()  # the client deleted it, not this operator


def test_label_edit_of_a_session_deleted_meanwhile(
    admin_client: Client, db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = session_services.create_session(owner_id=opsdata.user().pk, key="agent:main:label-me")
    delete_before_first_call(monkeypatch, session_services, "patch_session", session)
    url = reverse("admin:sessions_app_chatsession_change", args=[session.pk])
    res = admin_client.post(url, {"label": "Renamed", "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0"})
    assert res.status_code == HTTPStatus.FOUND and res["Location"] == reverse(CHANGELIST)
    assert admin_messages(res) == [f"Skipped the change of the chat session “{session.key}”: deleted meanwhile."]
    assert not LogEntry.objects.filter(action_flag=CHANGE).exists()


def test_run_abort_skips_a_run_whose_session_was_deleted_meanwhile(
    admin_client: Client, db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    (_first, victim, _last), runs = three_busy_sessions()
    delete_before_first_call(monkeypatch, session_services, "abort", victim)
    url = reverse("admin:sessions_app_run_changelist")
    res = admin_client.post(url, {"action": "abort_selected", "_selected_action": [r.pk for r in runs], "index": "0"})
    assert res.status_code == HTTPStatus.FOUND
    assert admin_messages(res) == ["Aborted 2 run(s); skipped 1: deleted meanwhile."]
    for run in (runs[0], runs[2]):
        run.refresh_from_db()
        assert run.state == RunState.KILLED and run.stop_reason == "operator"
        assert LifecycleEvent.objects.filter(run=run, to_state=RunState.KILLED, actor="operator").exists()
        assert LogEntry.objects.filter(object_id=str(run.pk), action_flag=CHANGE).exists()
    assert not Run.objects.filter(pk=runs[1].pk).exists()


# --- query counts and index use --------------------------------------------------------------------------------------


def _count_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == HTTPStatus.OK
    return len(captured.captured_queries)


@pytest.mark.parametrize("query", ["", "?stuck=yes", "?failed=24h", "?status=done", "?q=seed-user-1"])
def test_changelist_queries_do_not_grow_with_rows(
    admin_client: Client, db: None, django_assert_max_num_queries: Any, query: str
) -> None:
    url = reverse(CHANGELIST) + query
    # (an empty page skips the row queries: both sizes have rows on every filter)
    seed_demo_data(sessions=100, runs=600, users=3, stuck=2, rng_seed=1)
    ChatSession.objects.filter(pk=ChatSession.objects.order_by("pk")[0].pk).update(
        status=SessionStatus.FAILED, ended_at=timezone.now()
    )
    small = _count_queries(admin_client, url)
    seed_demo_data(sessions=600, runs=6000, users=3, rng_seed=2)
    large = _count_queries(admin_client, url)
    assert small == large
    # session + user, live processes, 3 counts, page count, page ids, page rows, stuck and queued badges
    with django_assert_max_num_queries(12):
        admin_client.get(url)


def test_detail_page_queries_do_not_grow_with_runs(
    admin_client: Client, db: None, django_assert_max_num_queries: Any
) -> None:
    seed_demo_data(sessions=2, runs=6, users=1, stuck=0, transcripts=True, rng_seed=3)
    seed_demo_data(sessions=2, runs=400, users=1, stuck=0, transcripts=True, rng_seed=4)
    small, large = ChatSession.objects.order_by("pk")[0], ChatSession.objects.order_by("-pk")[0]
    assert Run.objects.filter(session=large).count() == 200
    url = "admin:sessions_app_chatsession_change"
    assert _count_queries(admin_client, reverse(url, args=[small.pk])) == _count_queries(
        admin_client, reverse(url, args=[large.pk])
    )
    with django_assert_max_num_queries(12):  # (two of them the transcript's tree and the texts shown)
        admin_client.get(reverse(url, args=[large.pk]))
    run_url = reverse("admin:sessions_app_run_changelist")
    with django_assert_max_num_queries(6):
        admin_client.get(run_url)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="EXPLAIN QUERY PLAN is SQLite's")
@pytest.mark.parametrize(
    "name",
    ["stuck", "failed", "running", "counts"],
)
def test_operator_filters_use_indexes(db: None, name: str) -> None:
    seed_demo_data(sessions=50, runs=200, users=2, rng_seed=5)
    querysets = {
        "stuck": operator_reads.stuck_sessions({"some-live-process"}),
        "failed": operator_reads.failed_sessions(),
        "running": operator_reads.running_sessions(),
        "counts": operator_reads.stuck_runs(set()),
    }
    sql, params = querysets[name].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        steps = [row[-1] for row in cursor.fetchall()]
    full_scans = [s for s in steps if s.startswith("SCAN") and "USING" not in s]
    assert not full_scans, steps
    assert any("INDEX" in s or "PRIMARY KEY" in s for s in steps), steps


# --- the broadcast an action causes (real run manager, WebSocket client of the owner) --------------------------------


@pytest.fixture
async def operator_client(make_user: Any) -> Client:
    def make() -> Client:
        admin = get_user_model().objects.create_superuser("root", password="pw-12345678")
        client = Client()
        client.force_login(admin)
        return client

    return await database_sync_to_async(make)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("action", "extra", "chat_state", "stop", "reason"),
    [
        ("abort_runs", {}, "aborted", "operator", "operator"),
        ("mark_failed", {"apply": "yes", "reason": "stuck backend"}, "error", None, "operator"),
        ("reset_sessions", {}, "aborted", "reset", "reset"),
        ("delete_selected", {"post": "yes"}, "aborted", "delete", "delete"),
    ],
)
async def test_admin_action_reaches_connected_clients(
    alice: tuple[Any, str],
    operator_client: Client,
    action: str,
    extra: dict[str, str],
    chat_state: str,
    stop: str | None,
    reason: str,
) -> None:
    client = await open_client(alice[1])
    try:
        ack = await client.ok("chat.send", {"sessionKey": "main", "message": "hi [[hang]]", "idempotencyKey": "h1"})
        assert ack["status"] == "started"
        await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("phase") == "running")
        session = await database_sync_to_async(ChatSession.objects.get)(key="agent:main:main")
        mark = len(client.events)
        res = await database_sync_to_async(post_action)(operator_client, action, [session], **extra)
        assert res.status_code == HTTPStatus.FOUND
        final = await client.wait_terminal("h1")
        assert final["state"] == chat_state
        if stop is not None:
            assert final["stopReason"] == stop
        else:
            assert "stuck backend" in final["errorMessage"]
        changed = await client.wait_event(
            lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == reason, start=mark
        )
        row = changed["payload"]["session"]
        assert row["hasActiveRun"] is False and row["status"] != "running"
        if action == "delete_selected":
            assert row.get("deleted") is True
    finally:
        await client.close()


def test_runs_cannot_be_deleted_one_by_one(admin_client: Client, db: None) -> None:
    """A bare run delete would strand its session; only session delete / abort are offered."""
    owner = opsdata.user("erin")
    run = opsdata.own(opsdata.send(owner, "busy", "r-busy"), opsdata.LIVE_PROCESS)
    changelist = admin_client.get(reverse("admin:sessions_app_run_changelist"))
    assert "delete_selected" not in changelist.content.decode()
    res = admin_client.post(
        reverse("admin:sessions_app_run_changelist"),
        {"action": "delete_selected", "_selected_action": [run.pk], "post": "yes"},
    )
    assert Run.objects.filter(pk=run.pk).exists()
    assert res.status_code in (HTTPStatus.OK, HTTPStatus.FOUND)
    delete_page = admin_client.post(reverse("admin:sessions_app_run_delete", args=[run.pk]), {"post": "yes"})
    assert delete_page.status_code == HTTPStatus.FORBIDDEN
    assert Run.objects.get(pk=run.pk).state in ("dispatching", "running")
