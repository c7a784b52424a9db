"""Operators at scale: one stuck definition, commands cron can trust, health, logs, audit, alerts."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path, reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chat.base import health
from chat.runtime.gateway import GatewayRuntime
from chat.web import ops, state_gauges
from gatewayproject import logs
from sessions_app import operator_reads, process
from sessions_app.models import (
    ChatSession,
    GatewayProcess,
    LifecycleEvent,
    Run,
    RunState,
    SessionStatus,
    SessionTombstone,
)
from sessions_app.operations import doctor, recovery
from tests.support import opsdata

ROOT = Path(__file__).resolve().parents[2]
CHANGELIST = "admin:sessions_app_chatsession_changelist"


def _boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("kaboom in a view")


urlpatterns = [path("boom", _boom)]


# --- one definition of "stuck" ------------------------------------------------------------------------


def plant_every_kind_of_stuck() -> set[str]:
    owner = opsdata.user("erin")
    opsdata.register_live_process()
    stuck: set[str] = set()
    stuck.add(opsdata.session_of(opsdata.own(opsdata.send(owner, "dead", "a1"), "gone-process")).key)
    long = opsdata.own(opsdata.send(owner, "long", "b1"), opsdata.LIVE_PROCESS, dispatched_ago=timedelta(hours=3))
    stuck.add(opsdata.session_of(long).key)
    unclaimed = opsdata.send(owner, "unclaimed", "c1")
    Run.objects.filter(pk=unclaimed.pk).update(dispatched_at=timezone.now() - timedelta(minutes=5))
    stuck.add(opsdata.session_of(unclaimed).key)
    # not stuck: a healthy run, a fresh unowned run (a live process claims it), a finished session
    opsdata.own(opsdata.send(owner, "healthy", "d1"), opsdata.LIVE_PROCESS)
    opsdata.send(owner, "fresh", "e1")
    opsdata.finish(opsdata.send(owner, "done", "f1"))
    row = opsdata.finish(opsdata.send(owner, "row", "g1"))
    ChatSession.objects.filter(pk=row.session_id).update(status=SessionStatus.RUNNING)
    stuck.add(opsdata.session_of(row).key)
    slot = opsdata.own(opsdata.send(owner, "slot", "h1"), opsdata.LIVE_PROCESS)
    Run.objects.filter(pk=slot.pk).update(state=RunState.DONE)
    stuck.add(opsdata.session_of(slot).key)
    return stuck


@override_settings(GATEWAY_STUCK_RUN_SECONDS=3600)
def test_filter_count_badge_metrics_and_doctor_agree(admin_client: Client) -> None:
    expected = plant_every_kind_of_stuck()
    filtered = admin_client.get(reverse(CHANGELIST), {"stuck": "yes"})
    assert {s.key for s in filtered.context["cl"].result_list} == expected
    listed = admin_client.get(reverse(CHANGELIST))
    badged = {s.key for s in listed.context["cl"].result_list if s.is_stuck}
    assert badged == expected
    counts = {label: n for label, n, _ in listed.context["agentgate_counts"]}
    assert counts["stuck"] == len(expected) == operator_reads.stuck_count()
    scraped = Client().get("/metrics").content.decode()
    assert re.search(rf"^agentgate_stuck_sessions {len(expected)}\.0$", scraped, re.M)
    doctored = {f.session_key for f in doctor.check()}
    assert expected <= doctored
    # each stuck session's detail page shows the badge too
    session = ChatSession.objects.get(key=sorted(expected)[0])
    page = admin_client.get(reverse("admin:sessions_app_chatsession_change", args=[session.pk]))
    assert "· stuck" in page.content.decode()


def test_doctor_is_not_clean_when_no_server_can_claim_unowned_runs(db: None) -> None:
    owner = opsdata.user()
    opsdata.send(owner, "s", "r1")  # unowned; no process registered at all
    assert operator_reads.stuck_count() == 1
    assert [f.kind for f in doctor.check()] == ["unclaimed_run"]


# --- commands cron can trust --------------------------------------------------------------------------


def _run_command(*args: str) -> tuple[int, str, str, float]:
    env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:9/nowhere", "DB_CONNECT_TIMEOUT_SECONDS": "2"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def test_database_down_is_exit_2_with_one_line_and_json() -> None:
    code, out, err, seconds = _run_command("prune_sessions", "--older-than-days", "60", "--json")
    assert code == 2 and seconds < 20
    assert json.loads(out) == {"ok": False, "error": json.loads(out)["error"], "exitCode": 2}
    assert "database unreachable" in json.loads(out)["error"]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, err, _ = _run_command("gateway_doctor")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_exit_codes_clean_findings_error(db: None) -> None:
    call_command("gateway_doctor", stdout=io.StringIO())  # 0: no exception
    opsdata.send(opsdata.user(), "s", "r1")  # an unclaimed run with no server running
    with pytest.raises(CommandError) as raised:
        call_command("gateway_doctor", stdout=io.StringIO())
    assert raised.value.returncode == 1
    with pytest.raises(CommandError) as raised:
        call_command("prune_sessions", older_than_days=-1, stdout=io.StringIO())
    assert raised.value.returncode == 2


def test_prune_needs_force_below_the_minimum(db: None) -> None:
    session = opsdata.session_of(opsdata.finish(opsdata.send(opsdata.user(), "old", "r1")))
    opsdata.age_session(session, days=1)
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("prune_sessions", older_than_days=0, json=True, stdout=out)
    assert raised.value.returncode == 2 and "--force" in str(raised.value)
    assert json.loads(out.getvalue())["ok"] is False
    out = io.StringIO()
    call_command("prune_sessions", older_than_days=0.5, force=True, json=True, stdout=out)
    assert json.loads(out.getvalue())["sessions"] == 1
    tomb = SessionTombstone.objects.get(key=session.key)
    assert tomb.reason == "prune" and tomb.actor_name.startswith("prune_sessions")


@override_settings(GATEWAY_ADMIN_BULK_LIMIT=2)
def test_bulk_admin_actions_are_capped(admin_client: Client) -> None:
    owner = opsdata.user()
    sessions = [opsdata.session_of(opsdata.send(owner, f"s{i}", f"r{i}")) for i in range(3)]
    res = admin_client.post(
        reverse(CHANGELIST),
        {"action": "reset_sessions", "index": "0", "_selected_action": [s.pk for s in sessions]},
        follow=True,
    )
    assert "at most 2 at a time" in res.content.decode()
    assert not LifecycleEvent.objects.filter(reason="reset").exists()
    res = admin_client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "index": "0", "post": "yes", "_selected_action": [s.pk for s in sessions]},
        follow=True,
    )
    assert ChatSession.objects.count() == 3


# --- audit: which operator, and what was deleted -------------------------------------------------------


def test_audit_names_the_operator_and_deletes_leave_tombstones(admin_client: Client, admin_user: Any) -> None:
    run = opsdata.own(opsdata.send(opsdata.user(), "s", "r1"), "gone")
    session = opsdata.session_of(run)
    admin_client.post(reverse(CHANGELIST), {"action": "abort_runs", "index": "0", "_selected_action": [session.pk]})
    event = LifecycleEvent.objects.filter(session=session, actor="operator").latest("id")
    assert (event.actor_user_id, event.actor_name) == (admin_user.pk, admin_user.get_username())
    admin_client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "index": "0", "post": "yes", "_selected_action": [session.pk]},
    )
    tomb = SessionTombstone.objects.get(key=session.key)
    assert (tomb.reason, tomb.actor_user_id, tomb.owner_id) == ("delete", admin_user.pk, session.owner_id)


def _outages(since: datetime, until: datetime, down: float, up: float) -> list[tuple[datetime, datetime]]:
    """Outages of `down` seconds every `down + up` seconds, the last ending at `until`."""
    spans = []
    end = until
    while end > since:
        spans.append((end - timedelta(seconds=down), end))
        end -= timedelta(seconds=down + up)
    return spans[::-1]


def test_time_the_sweeper_could_not_see_does_not_count_against_a_peer(db: None, settings: Any) -> None:
    """A peer's silence is its heartbeat's age minus the time the sweeper could not reach the
    database since that heartbeat: a peer that was beating when the outage began is live after it."""
    settings.GATEWAY_RECOVERY_SECONDS = 30
    opsdata.register_live_process("sweeper")
    silent = opsdata.register_dead_process("silent-peer")
    run = opsdata.own(opsdata.send(opsdata.user(), "s", "r1"), "silent-peer")
    window = (timezone.now() - process.stale_before()).total_seconds()
    now = timezone.now()
    GatewayProcess.objects.filter(pk=silent.pk).update(heartbeat_at=now - timedelta(seconds=window + 10))
    outage = [(now - timedelta(seconds=window + 9), now - timedelta(seconds=1))]  # began just after its beat
    assert "silent-peer" in process.live_process_ids(outage)
    assert recovery.sweep("sweeper", outage).ended == 0
    assert not Run.objects.get(pk=run.pk).is_terminal
    assert "silent-peer" not in process.live_process_ids()  # without the outage: dead
    GatewayProcess.objects.filter(pk=silent.pk).update(stopped_at=timezone.now())  # drained: dead at once
    assert "silent-peer" not in process.live_process_ids(outage)


def test_a_peer_live_when_the_sweeper_went_blind_has_a_recovery_window_after_it_sees_again(
    db: None, settings: Any
) -> None:
    """The peer may reach the database a while after the sweeper does (its pool still waiting for
    a connection): it is not dead before GATEWAY_RECOVERY_SECONDS have passed since the sweeper
    could see again."""
    settings.GATEWAY_RECOVERY_SECONDS = 30
    opsdata.register_live_process("sweeper")
    peer = opsdata.register_dead_process("slow-to-return")
    now = timezone.now()
    GatewayProcess.objects.filter(pk=peer.pk).update(heartbeat_at=now - timedelta(seconds=45))
    outage = [(now - timedelta(seconds=40), now - timedelta(seconds=29))]  # it was beating when this began
    assert "slow-to-return" in process.live_process_ids(outage)
    later = [(start, end - timedelta(seconds=2)) for start, end in outage]
    assert "slow-to-return" not in process.live_process_ids(later)


def test_a_dead_peer_is_reaped_in_bounded_time_however_often_the_sweepers_outages_recur(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's own bookkeeping, outage after outage (each ending just before a sweep):
    the dead peer is reaped within a window and a recovery period (and an outage) of its death,
    not never."""
    from chat.runtime.supervisor import Supervisor

    settings.GATEWAY_RECOVERY_SECONDS = 30
    opsdata.register_live_process("sweeper")
    peer = opsdata.register_dead_process("dead-peer")
    clock = {"now": timezone.now()}
    monkeypatch.setattr(timezone, "now", lambda: clock["now"])
    window = (timezone.now() - process.stale_before()).total_seconds()
    died = clock["now"]
    GatewayProcess.objects.filter(pk=peer.pk).update(heartbeat_at=died)
    sup = Supervisor(runtime=None)  # type: ignore[arg-type]  # (only its heartbeat bookkeeping is used)
    interval = settings.GATEWAY_HEARTBEAT_SECONDS
    reaped_after = None
    for _ in range(200):
        clock["now"] += timedelta(seconds=3.0 + interval)
        sup.beat_after(3.0 + interval)  # blind for 3 s, then a beat
        clock["now"] += timedelta(seconds=3.0)
        sup.beat_after(interval)  # seeing for 3 s
        if "dead-peer" not in process.live_process_ids(list(sup.blind)):
            reaped_after = (clock["now"] - died).total_seconds()
            break
    assert reaped_after is not None, "a dead peer escaped recovery"
    assert reaped_after <= window + settings.GATEWAY_RECOVERY_SECONDS + 2 * (6.0 + interval), (reaped_after, window)
    assert len(sup.blind) <= (settings.GATEWAY_RECOVERY_SECONDS + 3 * interval) / 6 + 2  # old spans forgotten


def test_a_peer_dead_before_an_outage_is_reaped_on_schedule(db: None, settings: Any) -> None:
    settings.GATEWAY_RECOVERY_SECONDS = 30
    opsdata.register_live_process("sweeper")
    silent = opsdata.register_dead_process("dead-before")
    run = opsdata.own(opsdata.send(opsdata.user(), "s", "r1"), "dead-before")
    window = (timezone.now() - process.stale_before()).total_seconds()
    now = timezone.now()
    GatewayProcess.objects.filter(pk=silent.pk).update(heartbeat_at=now - timedelta(seconds=window + 20))
    just_over = [(now - timedelta(seconds=10), now - timedelta(seconds=0.5))]  # long after it went silent
    assert "dead-before" not in process.live_process_ids(just_over)
    assert recovery.sweep("sweeper", just_over).ended == 1
    ended = Run.objects.get(pk=run.pk)
    assert (ended.state, ended.error_kind) == (RunState.FAILED, "interrupted")


def test_recurring_outages_only_delay_the_verdict_on_a_dead_peer(db: None, settings: Any) -> None:
    """Outages that keep coming back (each just over) never make a dead peer immortal: it is dead
    once the time the sweeper could see since its last heartbeat exceeds the window, and the
    outages it was still live at the start of ended a recovery period ago."""
    settings.GATEWAY_RECOVERY_SECONDS = 30
    opsdata.register_live_process("sweeper")
    silent = opsdata.register_dead_process("dead-peer")
    window = (timezone.now() - process.stale_before()).total_seconds()
    now = timezone.now()
    recovery = settings.GATEWAY_RECOVERY_SECONDS
    for age, live in ((2 * window - 4, True), (window + recovery + 8, False), (10 * window, False)):
        beat = now - timedelta(seconds=age)
        GatewayProcess.objects.filter(pk=silent.pk).update(heartbeat_at=beat)
        # half of every 6 s blind, the last outage just over: the sweeper saw half the peer's silence
        blind = _outages(beat, now, down=3.0, up=3.0)
        assert process.blind_seconds(blind, beat) == pytest.approx(age / 2, abs=3.5)
        assert ("dead-peer" in process.live_process_ids(blind)) is live, (age, window)


def test_sweep_forgets_long_dead_processes(db: None) -> None:
    old = opsdata.register_dead_process("long-gone")
    GatewayProcess.objects.filter(pk=old.pk).update(heartbeat_at=timezone.now() - timedelta(days=3))
    busy = opsdata.register_dead_process("gone-but-busy")
    GatewayProcess.objects.filter(pk=busy.pk).update(heartbeat_at=timezone.now() - timedelta(days=3))
    Run.objects.filter(pk=opsdata.send(opsdata.user(), "s", "r1").pk).update(owner_process="gone-but-busy")
    opsdata.register_dead_process("recently-dead")
    assert recovery.forget_dead_processes() == 1
    assert set(GatewayProcess.objects.values_list("pk", flat=True)) == {"gone-but-busy", "recently-dead"}


# --- health --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readyz_answers_within_its_deadline_when_the_database_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_check_database_sync", lambda *_trial: time.sleep(6))
    started = time.monotonic()
    res = Client().get("/readyz")
    assert time.monotonic() - started < ops.READY_TIMEOUT_SECONDS + 2
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    assert "timed out" in res.json()["checks"]["database"]["detail"]


@pytest.mark.django_db
def test_readyz_503_when_a_background_loop_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GatewayRuntime, "running", property(lambda self: True))
    health.reset()
    health.ok("sweep")
    health.failed("listener", ConnectionError("redis went away"), restart=True)
    try:
        res = Client().get("/readyz")
    finally:
        health.reset()
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    loops = res.json()["checks"]["backgroundLoops"]
    assert loops["ok"] is False and "redis went away" in loops["detail"]["listener"]


# --- logs ----------------------------------------------------------------------------------------------


@override_settings(ROOT_URLCONF=__name__, DEBUG=False, ADMINS=[])
def test_unhandled_500_is_logged_with_traceback_and_request_id() -> None:
    handler = next(h for h in logging.getLogger("django").handlers if isinstance(h, logging.StreamHandler))
    buffer = io.StringIO()
    old = handler.setStream(buffer)
    try:
        res = Client(raise_request_exception=False).get("/boom", headers={"X-Request-ID": "req-42"})
    finally:
        handler.setStream(old)
    assert res.status_code == HTTPStatus.INTERNAL_SERVER_ERROR and res["X-Request-ID"] == "req-42"
    text = buffer.getvalue()
    assert "Internal Server Error: /boom" in text and "request_id=req-42" in text
    assert "Traceback" in text and "kaboom in a view" in text


def test_json_log_lines_carry_the_ids() -> None:
    record = logging.makeLogRecord(
        {"name": "chat.x", "levelname": "INFO", "levelno": 20, "msg": "hello %s", "args": ("world",)}
    )
    tokens = [logs.conn_id.set("c-1"), logs.run_id.set("run-9")]
    try:
        logs.ContextFilter().filter(record)
    finally:
        logs.run_id.reset(tokens[1])
        logs.conn_id.reset(tokens[0])
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["message"] == "hello world" and line["conn_id"] == "c-1" and line["run_id"] == "run-9"
    assert "request_id" not in line and line["level"] == "INFO" and line["logger"] == "chat.x"


def test_access_log_lines() -> None:
    buffer = io.StringIO()
    logger = logging.getLogger("test.access")
    logger.propagate = False
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logs.JsonFormatter())
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    access = logs.AccessLog(logger)
    access(
        "http",
        "complete",
        {"path": "/readyz", "status": 200, "method": "GET", "client": "1.2.3.4:5", "time_taken": 0.0123, "size": 99},
    )
    access("websocket", "connected", {"path": "/ws/gateway", "client": "1.2.3.4:6"})
    first, second = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert first["path"] == "/readyz" and first["status"] == 200 and first["duration_ms"] == 12.3
    assert second["ws_event"] == "connected"


# --- alert rules and dashboard -------------------------------------------------------------------------


@pytest.mark.django_db
def test_alert_rules_and_dashboard_name_only_existing_metrics() -> None:
    exported: set[str] = set(state_gauges.POOL_METRIC_NAMES)
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        # a labelled metric with no children yet has no samples: derive its sample names from the type
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "info": ["_info"]}
        exported |= {sample.name for sample in family.samples} | {family.name}
        exported |= {family.name + suffix for suffix in suffixes.get(family.type, [])}
    rules = json.loads((ROOT / "docs/ops/alerts.json").read_text())
    exprs = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["expr"] and rule["labels"]["severity"] in ("page", "ticket"), rule
            assert rule["annotations"]["runbook"].startswith("docs/operators.md#")
            assert rule["expr"].count("(") == rule["expr"].count(")"), rule
            exprs.append(rule["expr"])
    dashboard = json.loads((ROOT / "docs/ops/grafana-dashboard.json").read_text())
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\bagentgate_[a-z_]+", expr)}
    assert named and not named - exported, sorted(named - exported)
    anchors = {
        a.lower().replace(" ", "-") for a in re.findall(r"^#+ (.+)$", (ROOT / "docs/operators.md").read_text(), re.M)
    }
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["annotations"]["runbook"].split("#", 1)[1] in anchors, rule["annotations"]["runbook"]
