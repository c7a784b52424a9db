"""Tools for operators (TOOLS.md §13): the admin's tool calls and filters, gateway_doctor's tool-call
findings, and the tool gauges of /metrics.

Calls are made through the lifecycle services (`sessions_app.lifecycle.toolcalls`), as the runtime makes
them; the broken states the doctor must find are planted with plain UPDATEs, as in test_commands.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
from datetime import timedelta
from http import HTTPStatus
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from sessions_app import operator_reads
from sessions_app.lifecycle import toolcalls
from sessions_app.models import (
    ChatSession,
    LifecycleEvent,
    Run,
    RunState,
    ToolApproval,
    ToolCall,
    ToolCallState,
)
from sessions_app.operations import doctor
from sessions_app.operations.seed import seed_demo_data
from tests.support import opsdata
from tests.support.opsdata import doctor_json

pytestmark = pytest.mark.django_db

TOOLCALLS = "admin:sessions_app_toolcall_changelist"


# --- calls made through the lifecycle ---------------------------------------------------------------


def calls_in(run: Run, *specs: tuple[str, str, str]) -> list[ToolCall]:
    """Record one step of calls (server, tool, arguments JSON) of an active run: all `pending`."""
    rows = toolcalls.record_calls(
        run.pk,
        step=1,
        calls=[toolcalls.NewCall(f"call_{i}", server, tool, args) for i, (server, tool, args) in enumerate(specs)],
        reply_offset=0,
        recorded_before=Run.objects.get(pk=run.pk).tool_calls,
    )
    assert rows is not None
    return rows


def ask(call: ToolCall, *, expires_in: timedelta = timedelta(minutes=2)) -> ToolApproval:
    approval = toolcalls.request_approval(call.pk, expires_at=timezone.now() + expires_in)
    assert approval is not None
    return approval


def run_call(call: ToolCall, state: str = ToolCallState.SUCCEEDED, result: str = "ok", kind: str = "") -> None:
    assert toolcalls.begin_call(call.pk)
    is_error = state != ToolCallState.SUCCEEDED
    assert toolcalls.finish_call(call.pk, state, result=result, is_error=is_error, error_kind=kind)


def state_of(call: ToolCall) -> str:
    return ToolCall.objects.get(pk=call.pk).state


# --- gateway_doctor ---------------------------------------------------------------------------------------


def doctor_text(**options: Any) -> str:
    out = io.StringIO()
    with contextlib.suppress(CommandError):  # exit 1: findings remain
        call_command("gateway_doctor", stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def snapshot() -> list[Any]:
    """Every row a tool repair could change, to prove a dry run changed nothing."""
    return [
        *ToolCall.objects.order_by("pk").values_list("pk", "state", "result", "ended_at"),
        *ToolApproval.objects.order_by("pk").values_list("pk", "decision", "resolved_at"),
        *Run.objects.order_by("pk").values_list("pk", "state", "stream_seq"),
        ("audit", LifecycleEvent.objects.count()),
    ]


def reopen(call: ToolCall, state: str) -> None:
    """Plant: the call open again after its run ended (and its approval pending again)."""
    ToolCall.objects.filter(pk=call.pk).update(state=state, result="", is_error=False, error_kind="", ended_at=None)
    ToolApproval.objects.filter(tool_call_id=call.pk).update(decision="", decided_by="", resolved_at=None)


@pytest.mark.parametrize(
    ("end", "running_becomes"),
    [(RunState.FAILED, ToolCallState.UNKNOWN), (RunState.KILLED, ToolCallState.CANCELLED)],
    ids=["failed-run", "aborted-run"],
)
def test_doctor_finds_and_closes_calls_that_outlived_their_run(end: str, running_becomes: str) -> None:
    owner = opsdata.user()
    run = opsdata.send(owner, "tools", "t1")
    ran, waited, later = calls_in(
        run, ("demo", "add_note", '{"text": "a"}'), ("demo", "add_note", '{"text": "b"}'), ("demo", "clock", "{}")
    )
    assert toolcalls.begin_call(ran.pk)
    ask(waited)
    ending = {"stop_reason": "operator"} if end == RunState.KILLED else {"error_kind": "backend", "error_message": "x"}
    opsdata.finish(run, end, **ending)
    assert doctor.check() == []  # the run's end closed all three
    reopen(ran, ToolCallState.RUNNING)
    reopen(waited, ToolCallState.PENDING_APPROVAL)
    reopen(later, ToolCallState.PENDING)

    data, code = doctor_json()
    assert code == 1
    (finding,) = data["findings"]
    assert finding["kind"] == "tool_call_outlived_run" and finding["runId"] == "t1"
    assert finding["toolCallIds"] == [ran.call_id, waited.call_id, later.call_id]
    assert f"{ran.call_id} demo.add_note (running)" in finding["detail"]

    before = snapshot()
    data, code = doctor_json(fix=True, dry_run=True)
    assert code == 1 and not any(r["changed"] for r in data["repairs"])
    assert snapshot() == before

    data, code = doctor_json(fix=True)
    assert (code, data["ok"], data["remaining"]) == (0, True, [])
    assert [state_of(c) for c in (ran, waited, later)] == [
        running_becomes,
        ToolCallState.CANCELLED,
        ToolCallState.CANCELLED,
    ]
    assert ToolApproval.objects.get(tool_call=waited).decision == "cancelled"
    # through the lifecycle: one audit row per change, by the operator
    closed = LifecycleEvent.objects.filter(tool_call__in=[ran, waited, later], actor="operator")
    assert {e.reason for e in closed} >= {f"tool.{running_becomes}", "approval.cancelled", "tool.cancelled"}
    assert doctor.check() == []


def test_doctor_reports_a_call_running_under_a_dead_process_and_recovery_ends_it_unknown() -> None:
    owner = opsdata.user()
    opsdata.register_dead_process("crashed-1")
    run = opsdata.own(opsdata.send(owner, "busy", "t1"), "crashed-1")
    (call,) = calls_in(run, ("demo", "add_note", '{"text": "x"}'))
    assert toolcalls.begin_call(call.pk)

    findings = doctor.check()
    assert [f.kind for f in findings] == ["dead_process_run", "tool_call_dead_process"]
    reported = findings[1]
    assert reported.tool_call_ids == [call.call_id] and reported.run_id == "t1"
    assert "crashed-1 is not alive" in reported.detail and "unknown" in reported.detail
    assert "report only: nothing here" in doctor_text(fix=True, dry_run=True)

    data, code = doctor_json(fix=True)
    assert (code, data["ok"]) == (0, True)  # ending the run (dead_process_run) ended the call
    repairs = {r["kind"]: r["changed"] for r in data["repairs"]}
    assert repairs == {"dead_process_run": True, "tool_call_dead_process": False}
    ended = ToolCall.objects.get(pk=call.pk)
    assert (ended.state, ended.error_kind, ended.is_error) == (ToolCallState.UNKNOWN, "unknown", True)
    assert "not known" in ended.result


def test_doctor_reports_an_overdue_approval_and_leaves_it() -> None:
    owner = opsdata.user()
    live = opsdata.register_live_process().server_id
    grace = timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS)
    late_run = opsdata.own(opsdata.send(owner, "late", "t1"), live)
    (late,) = calls_in(late_run, ("demo", "add_note", "{}"))
    approval = ask(late, expires_in=-(grace + timedelta(minutes=5)))
    fresh_run = opsdata.own(opsdata.send(owner, "fresh", "t2"), live)
    (fresh,) = calls_in(fresh_run, ("demo", "add_note", "{}"))
    ask(fresh, expires_in=-grace / 2)  # expired just now: its process is about to resolve it

    data, code = doctor_json()
    assert code == 1 and [(f["kind"], f["runId"]) for f in data["findings"]] == [("approval_overdue", "t1")]
    assert approval.approval_id in data["findings"][0]["detail"]
    assert data["findings"][0]["toolCallIds"] == [late.call_id]

    data, code = doctor_json(fix=True)
    assert code == 1 and [f["kind"] for f in data["remaining"]] == ["approval_overdue"]
    assert [r["changed"] for r in data["repairs"]] == [False]  # reported once, not retried
    assert ToolApproval.objects.get(pk=approval.pk).pending and state_of(late) == ToolCallState.PENDING_APPROVAL


def test_doctor_is_quiet_about_healthy_tool_calls() -> None:
    owner = opsdata.user()
    live = opsdata.register_live_process().server_id
    run = opsdata.own(opsdata.send(owner, "busy", "t1"), live)
    running, waiting, queued = calls_in(
        run, ("demo", "clock", "{}"), ("demo", "add_note", "{}"), ("demo", "clock", "{}")
    )
    assert toolcalls.begin_call(running.pk)
    ask(waiting)
    done = opsdata.send(owner, "done", "t2")
    (call,) = calls_in(done, ("demo", "clock", "{}"))
    run_call(call)
    opsdata.finish(done)
    assert state_of(queued) == ToolCallState.PENDING
    assert doctor.check() == []


# --- the admin --------------------------------------------------------------------------------------------


@pytest.fixture
def tooled(db: None) -> dict[str, Any]:
    """A run with calls in every kind of state, another waiting on an approval, and a plain run."""
    owner = opsdata.user("owner")
    run = opsdata.send(owner, "tools", "r-tools")
    ok, approved, denied, hostile = calls_in(
        run,
        ("demo", "calculate", '{"expression": "6*7"}'),
        ("demo", "add_note", '{"text": "milk"}'),
        ("demo", "add_note", '{"text": "rm -rf"}'),
        ("demo", "clock", '{"timezone": "<script>alert(1)</script>"}'),
    )
    run_call(ok, result="6*7 = 42 " + "x" * 500)
    approval = ask(approved)
    toolcalls.resolve_approval(approval.approval_id, decision="allow-once", user_id=owner.pk, user_name="owner")
    run_call(approved, result="Saved note: milk")
    toolcalls.resolve_approval(ask(denied).approval_id, decision="deny", user_id=owner.pk, user_name="owner")
    run_call(hostile, ToolCallState.FAILED, result="<b>unknown timezone</b>", kind="tool_error")
    opsdata.finish(run)

    waiting_run = opsdata.send(owner, "waiting", "r-waiting")
    (waits,) = calls_in(waiting_run, ("demo", "add_note", '{"text": "later"}'))
    ask(waits)
    opsdata.send(owner, "plain", "r-plain")
    return {
        "run": Run.objects.get(pk=run.pk),
        "waiting_run": waiting_run,
        "calls": [ok, approved, denied, hostile, waits],
    }


def test_run_page_lists_its_tool_calls_and_their_timeline(admin_client: Client, tooled: dict[str, Any]) -> None:
    run = tooled["run"]
    ok, approved, denied, hostile, _ = tooled["calls"]
    res = admin_client.get(reverse("admin:sessions_app_run_change", args=[run.pk]))
    assert res.status_code == HTTPStatus.OK
    html = res.content.decode()
    for call in (ok, approved, denied, hostile):
        assert reverse("admin:sessions_app_toolcall_change", args=[call.pk]) in html and call.call_id in html
    assert "demo.calculate" in html and "6*7 = 42" in html and f"({len('6*7 = 42 ') + 500} chars)" in html
    assert "allow-once by owner" in html and "deny by owner" in html and "error: tool_error" in html
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # untrusted text
    assert "<b>unknown" not in html and "&lt;b&gt;unknown timezone" in html
    # the timeline holds the run's transitions and every call and approval change, with who decided
    assert "<td>tool.recorded</td>" in html and "<td>approval.requested</td>" in html
    assert "<td>approval.allow-once</td>" in html and "<td>user (owner)</td>" in html
    assert "<td>queued → dispatching</td>" in html and "<td>running → done</td>" in html  # the run's own


def test_waiting_on_approval_filters(admin_client: Client, tooled: dict[str, Any]) -> None:
    res = admin_client.get(reverse("admin:sessions_app_run_changelist"), {"waiting": "approval"})
    assert [r.run_id for r in res.context["cl"].result_list] == ["r-waiting"]
    res = admin_client.get(reverse("admin:sessions_app_chatsession_changelist"), {"waiting": "approval"})
    assert [s.key for s in res.context["cl"].result_list] == ["agent:main:waiting"]
    assert "running · needs approval" in res.content.decode()
    session = ChatSession.objects.get(key="agent:main:waiting")
    page = admin_client.get(reverse("admin:sessions_app_chatsession_change", args=[session.pk])).content.decode()
    assert "running · needs approval" in page and "<td>approval.requested</td>" in page


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {0, 1, 2, 3, 4}),
        ({"state": "open"}, {4}),
        ({"state": "succeeded"}, {0, 1}),
        ({"state": "denied"}, {2}),
        ({"error_kind": "tool_error"}, {3}),
        ({"error_kind": "deny"}, {2}),
        ({"q": "demo.add_note"}, {1, 2, 4}),
        ({"q": "clock"}, {3}),
        ({"q": "r-waiting"}, {4}),
        ({"q": "CALL_ID_0"}, {0}),
    ],
    ids=["all", "open", "succeeded", "denied", "tool_error", "deny", "name", "tool", "runId", "toolCallId"],
)
def test_tool_call_list_filters_and_search(
    admin_client: Client, tooled: dict[str, Any], params: dict[str, str], expected: set[int]
) -> None:
    calls = tooled["calls"]
    if params.get("q") == "CALL_ID_0":
        params = {"q": calls[0].call_id}
    res = admin_client.get(reverse(TOOLCALLS), params)
    assert res.status_code == HTTPStatus.OK
    listed = [c.call_id for c in res.context["cl"].result_list]
    assert set(listed) == {calls[i].call_id for i in expected}
    assert listed == sorted(listed, key=lambda cid: -ToolCall.objects.get(call_id=cid).pk)  # newest first


def test_tool_call_page_is_read_only(admin_client: Client, tooled: dict[str, Any]) -> None:
    hostile = tooled["calls"][3]
    url = reverse("admin:sessions_app_toolcall_change", args=[hostile.pk])
    res = admin_client.get(url)
    assert res.status_code == HTTPStatus.OK
    html = res.content.decode()
    assert hostile.call_id in html and "r-tools" in html and "&lt;b&gt;unknown timezone&lt;/b&gt;" in html
    assert "<td>tool.started</td>" in html and "<td>tool.failed</td>" in html  # the call's own audit rows
    assert 'name="_save"' not in html
    changelist = admin_client.get(reverse(TOOLCALLS)).content.decode()
    assert "action-toggle" not in changelist and reverse("admin:sessions_app_toolcall_add") not in changelist
    assert admin_client.get(reverse("admin:sessions_app_toolcall_add")).status_code == HTTPStatus.FORBIDDEN
    assert admin_client.post(url, {"state": "succeeded"}).status_code == HTTPStatus.FORBIDDEN
    delete = reverse("admin:sessions_app_toolcall_delete", args=[hostile.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == HTTPStatus.FORBIDDEN
    assert state_of(hostile) == ToolCallState.FAILED and ToolCall.objects.count() == 5


def test_an_unknown_call_says_what_to_do(admin_client: Client) -> None:
    opsdata.register_dead_process("crashed-1")
    run = opsdata.own(opsdata.send(opsdata.user(), "busy", "t1"), "crashed-1")
    (call,) = calls_in(run, ("demo", "add_note", "{}"))
    assert toolcalls.begin_call(call.pk)
    call_command("recover_runs", stdout=io.StringIO(), stderr=io.StringIO())
    assert state_of(call) == ToolCallState.UNKNOWN
    html = admin_client.get(reverse("admin:sessions_app_toolcall_change", args=[call.pk])).content.decode()
    assert "side effects by hand" in html and "never runs it again" in html
    res = admin_client.get(reverse(TOOLCALLS), {"error_kind": "unknown"})
    assert [c.call_id for c in res.context["cl"].result_list] == [call.call_id]


def test_a_call_handed_to_the_api_client_is_recorded_ended_and_shown(admin_client: Client) -> None:
    run = opsdata.send(opsdata.user(), "api", "h1")
    before = Run.objects.get(pk=run.pk).tool_calls
    (mcp,) = calls_in(run, ("demo", "clock", "{}"))
    new = [toolcalls.NewCall("call_w", "", "get_weather", '{"city": "Oslo"}')]
    handed = toolcalls.hand_to_client(run.pk, step=1, calls=new, reply_offset=5, recorded_before=before + 1)
    assert handed is not None
    (call,) = handed
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.state, stored.name, stored.model_call_id, stored.result, stored.reply_offset, stored.seq) == (
        ToolCallState.CLIENT,
        "get_weather",
        "call_w",
        "",
        5,
        2,
    )
    assert stored.ended_at is not None and stored.started_at is None  # never run here
    audit = (
        LifecycleEvent.objects.filter(tool_call=stored).order_by("id").values_list("from_state", "to_state", "reason")
    )
    assert list(audit) == [("", "pending", "tool.recorded"), ("pending", "client", "tool.client")]
    # a retry whose answer was lost gets the same rows back; an ended run takes none
    assert [
        c.pk
        for c in toolcalls.hand_to_client(run.pk, step=1, calls=new, reply_offset=5, recorded_before=before + 1) or []
    ] == [call.pk]
    run_call(mcp)
    opsdata.finish(run)
    assert toolcalls.hand_to_client(run.pk, step=2, calls=new, reply_offset=5, recorded_before=before + 2) is None
    assert ToolCall.objects.filter(run=run).count() == 2

    res = admin_client.get(reverse(TOOLCALLS), {"state": "client"})
    assert [c.call_id for c in res.context["cl"].result_list] == [call.call_id]
    assert "Handed to the API client" in res.content.decode()  # the filter's choice
    page = admin_client.get(reverse("admin:sessions_app_toolcall_change", args=[call.pk])).content.decode()
    assert "handed to that client" in page and "<td>tool.client</td>" in page
    run_page = admin_client.get(reverse("admin:sessions_app_run_change", args=[run.pk])).content.decode()
    assert "<td>client</td>" in run_page


# --- scale: a fixed number of queries whatever the number of calls ------------------------------------------


def plant_calls(per_run: int, runs: int, *, approvals_every: int = 3) -> list[Run]:
    """`per_run` finished calls on each of the newest `runs` runs (plain rows: only the pages' cost is measured)."""
    chosen = list(Run.objects.select_related("session").order_by("-pk")[:runs])
    states = [
        (ToolCallState.SUCCEEDED, ""),
        (ToolCallState.FAILED, "tool_error"),
        (ToolCallState.DENIED, "deny"),
        (ToolCallState.UNKNOWN, "unknown"),
    ]
    now = timezone.now()
    rows = []
    for run in chosen:
        start = run.tool_calls
        for i in range(per_run):
            state, kind = states[(start + i) % len(states)]
            rows.append(
                ToolCall(
                    call_id=f"tc_{secrets.token_hex(12)}",
                    run=run,
                    seq=start + i + 1,
                    step=1,
                    server="demo",
                    tool=("clock", "add_note")[i % 2],
                    arguments=json.dumps({"text": "y" * 300}),
                    state=state,
                    result="z" * 2000,
                    is_error=bool(kind),
                    error_kind=kind,
                    started_at=now,
                    ended_at=now,
                )
            )
        Run.objects.filter(pk=run.pk).update(tool_calls=start + per_run)
    ToolCall.objects.bulk_create(rows, batch_size=500)
    approvals = [
        ToolApproval(
            approval_id=f"ap_{secrets.token_hex(12)}",
            tool_call=row,
            session_id=row.run.session_id,
            owner_id=row.run.session.owner_id,
            decision="allow-once",
            decided_by="someone",
            expires_at=now,
            resolved_at=now,
        )
        for row in rows[::approvals_every]
    ]
    ToolApproval.objects.bulk_create(approvals, batch_size=500)
    return chosen


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == HTTPStatus.OK
    return len(captured.captured_queries)


@pytest.mark.parametrize("query", ["", "?state=open", "?state=unknown", "?error_kind=tool_error", "?q=demo.clock"])
def test_tool_call_list_queries_do_not_grow_with_rows(admin_client: Client, query: str) -> None:
    seed_demo_data(sessions=20, runs=60, users=2, stuck=0, rng_seed=11)
    opsdata.register_live_process()
    open_run = opsdata.own(opsdata.send(opsdata.user(), "open", "o1"), opsdata.LIVE_PROCESS)
    calls_in(open_run, ("demo", "clock", "{}"))
    plant_calls(per_run=4, runs=10)  # every state on both sizes (an empty page skips the row queries)
    url = reverse(TOOLCALLS) + query
    small = _queries(admin_client, url)
    plant_calls(per_run=20, runs=60)
    assert ToolCall.objects.count() > 1200
    assert _queries(admin_client, url) == small
    # session + user, count, page ids, page rows (run, session, owner, approval joined in)
    assert small <= 6, small


def test_run_and_call_pages_do_not_grow_with_calls(admin_client: Client) -> None:
    seed_demo_data(sessions=4, runs=8, users=1, stuck=0, rng_seed=12)
    many, few = plant_calls(per_run=3, runs=2)
    plant_calls(per_run=200, runs=1)  # the newest run again: 203 calls
    assert ToolCall.objects.filter(run=many).count() == 203 and ToolCall.objects.filter(run=few).count() == 3
    page = "admin:sessions_app_run_change"
    assert _queries(admin_client, reverse(page, args=[few.pk])) == _queries(admin_client, reverse(page, args=[many.pk]))
    html = admin_client.get(reverse(page, args=[many.pk])).content.decode()
    assert "all 203 tool calls of this run" in html and f"run__id__exact={many.pk}" in html
    call = ToolCall.objects.filter(run=many).order_by("seq").first()
    assert call is not None
    assert _queries(admin_client, reverse("admin:sessions_app_toolcall_change", args=[call.pk])) <= 6


# --- /metrics -------------------------------------------------------------------------------------------


def test_tool_gauges_count_open_calls_by_state_and_pending_approvals() -> None:
    owner = opsdata.user()
    run = opsdata.send(owner, "busy", "t1")
    running, waiting, _pending, done = calls_in(
        run, ("demo", "clock", "{}"), ("demo", "add_note", "{}"), ("demo", "clock", "{}"), ("demo", "clock", "{}")
    )
    assert toolcalls.begin_call(running.pk)
    ask(waiting)
    other = opsdata.send(owner, "other", "t2")
    (decided,) = calls_in(other, ("demo", "add_note", "{}"))
    toolcalls.resolve_approval(ask(decided).approval_id, decision="deny", user_id=owner.pk, user_name="owner")
    run_call(done)  # ended: not open

    with CaptureQueriesContext(connection) as captured:
        counts = operator_reads.tool_counts()
    assert len(captured.captured_queries) == 1
    assert counts.open_calls == {"pending": 1, "pending_approval": 1, "running": 1}
    assert counts.pending_approvals == 1

    found = {}
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert found[("agentgate_open_tool_calls", (("state", "running"),))] == 1
    assert found[("agentgate_open_tool_calls", (("state", "pending_approval"),))] == 1
    assert found[("agentgate_open_tool_calls", (("state", "pending"),))] == 1
    assert found[("agentgate_pending_approvals", ())] == 1
