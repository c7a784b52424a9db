"""Consistency checks of the lifecycle rules (PROTOCOL.md §7, §8) across the database.

`check()` reads; `fix()` repairs each finding through the lifecycle service, so every
repair writes its audit row and reaches connected clients like any other change.
The checks are driven by the open runs (few) and three indexed session queries,
so they cost the same with a million finished runs as with none.

Every session the admin shows as stuck (`operator_reads.stuck_session_ids_query`) has a
finding here, because the checks are built from the same definitions: a stuck active run
is `dead_process_run`, `unclaimed_run` or `long_running_run` by the conditions of
`operator_reads.stuck_run_reasons` (read per run, as annotations of the open-run query);
`active_run_not_active`, `running_without_active_run` and `queued_without_active_run` are
`operator_reads.active_run_not_active`, `running_without_active_run` and `stranded_queue_runs`.
The doctor finds more than "stuck" (overdue, stale-generation and stray runs, rows not
saying `running`); a run-level finding takes the place of the row-level one it explains.

Tool calls (TOOLS.md §13), driven by the few open calls and pending approvals: a call still open
after its run ended (its end closes them in the same transaction, so this must never happen;
--fix closes them as that end would have), a call running under a dead process (recovery ends
it `unknown` with its run: reported, so an operator checks its side effects by hand) and an
approval pending long past its expiry in an active run (its owner process should have expired
it: reported). The last two are in REPORT_ONLY: --fix leaves them to the run's own repair.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from sessions_app import operator_reads
from sessions_app.lifecycle import operators, runs, toolcalls
from sessions_app.models import (
    ACTIVE_STATES,
    OPEN_STATES,
    TERMINAL_STATES,
    TOOL_OPEN_STATES,
    Actor,
    ChatSession,
    Run,
    RunErrorKind,
    RunState,
    SessionStatus,
    ToolCall,
    ToolCallState,
)
from sessions_app.operations.recovery import INTERRUPTED_MESSAGE
from sessions_app.process import live_process_ids

# kind -> what it means (shown by `gateway_doctor --list-checks` and in docs/operators.md)
CHECKS: dict[str, str] = {
    "dead_process_run": "an active run is owned by a process that stopped heartbeating",
    "unclaimed_run": "an active run has no owner process and no live process claimed it (within "
    "GATEWAY_RECOVERY_SECONDS, or none is running)",
    "overdue_run": "an active run outlived its own timeoutMs (plus GATEWAY_RECOVERY_SECONDS)",
    "long_running_run": "an active run has been running longer than GATEWAY_STUCK_RUN_SECONDS (within its budget)",
    "stale_generation_run": "a queued or active run belongs to an older sessionId than the session's",
    "stray_active_run": "an active run is not its session's active run (at most one per session)",
    "active_run_not_active": "the session's active run has already ended or never started",
    "running_without_active_run": "the session row says running but no run is active",
    "active_without_running_status": "the session has an active run but its row does not say running",
    "queued_without_active_run": "queued runs wait in a session with no active run, so nothing starts them",
    "tool_call_outlived_run": "tool calls are still open (pending, pending_approval, running) though their run "
    "has ended (its end closes them)",
    "tool_call_dead_process": "a tool call is running in a run whose owner process stopped heartbeating: recovery "
    "will end it unknown (check its side effects by hand)",
    "approval_overdue": "an approval is still pending more than GATEWAY_RECOVERY_SECONDS past its expiresAt, "
    "in a run that is still active",
}
# The tool-call checks (tests plant them with tool calls: tests/sessions_app/test_tool_operations.py)
TOOL_CHECKS = ("tool_call_outlived_run", "tool_call_dead_process", "approval_overdue")
# Findings --fix does not repair itself: ending the run (dead_process_run, overdue_run, ...) ends
# them, and the report says so.
REPORT_ONLY = frozenset({"tool_call_dead_process", "approval_overdue"})
# Run-level repairs go first: ending a run also fixes its row and starts the next queued run.
ORDER = list(CHECKS)


@dataclass
class Finding:
    kind: str
    session_pk: int
    session_key: str
    owner: str
    detail: str
    run_pk: int | None = None
    run_id: str | None = None
    tool_call_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sessionPk": self.session_pk,
            "sessionKey": self.session_key,
            "owner": self.owner,
            "runPk": self.run_pk,
            "runId": self.run_id,
            "toolCallIds": self.tool_call_ids,
            "detail": self.detail,
        }


@dataclass
class Repair:
    finding: Finding
    action: str
    changed: bool

    def as_dict(self) -> dict[str, Any]:
        return {**self.finding.as_dict(), "action": self.action, "changed": self.changed}


_OPEN_RUN_FIELDS = (
    "pk",
    "run_id",
    "state",
    "session_id",
    "session_generation",
    "owner_process",
    "dispatched_at",
    "timeout_ms",
    "session__active_run_id",
    "session__session_id",
    "session__key",
    "session__owner__username",
)


def check(*, now: Any = None) -> list[Finding]:
    """Every violation of the lifecycle invariants, ordered by kind (run-level first)."""
    now = now or timezone.now()
    live = live_process_ids()
    grace = timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS)
    # THE stuck conditions (operator_reads), evaluated by the database for each open run
    reasons = operator_reads.stuck_run_reasons(live, now)
    open_runs = Run.objects.filter(state__in=OPEN_STATES).annotate(**reasons).values(*_OPEN_RUN_FIELDS, *reasons)
    findings: list[Finding] = []
    queued_sessions: dict[int, dict[str, Any]] = {}
    active_sessions: set[int] = set()

    for run in open_runs.iterator(chunk_size=2000):
        base = {
            "session_pk": run["session_id"],
            "session_key": run["session__key"],
            "owner": run["session__owner__username"],
            "run_pk": run["pk"],
            "run_id": run["run_id"],
        }
        if run["session_generation"] != run["session__session_id"]:
            findings.append(Finding("stale_generation_run", detail=f"{run['state']} run of an older sessionId", **base))
            continue
        if run["state"] == RunState.QUEUED:
            queued_sessions.setdefault(run["session_id"], base)
            continue
        active_sessions.add(run["session_id"])
        owner = run["owner_process"]
        if run["dead_process_run"]:
            findings.append(Finding("dead_process_run", detail=f"owner process {owner} is not alive", **base))
            continue
        started = run["dispatched_at"]
        if run["unclaimed_run"]:
            detail = "no owner process; " + ("no live process claimed it" if live else "no live process to claim it")
            findings.append(Finding("unclaimed_run", detail=detail, **base))
            continue
        if started is not None and started + timedelta(milliseconds=run["timeout_ms"]) + grace < now:
            age = int((now - started).total_seconds())
            findings.append(Finding("overdue_run", detail=f"active for {age}s, budget {run['timeout_ms']} ms", **base))
            continue
        if run["long_running_run"]:
            assert started is not None  # the condition compares it
            age = int((now - started).total_seconds())
            findings.append(
                Finding(
                    "long_running_run",
                    detail=f"active for {age}s (stuck threshold {settings.GATEWAY_STUCK_RUN_SECONDS}s)",
                    **base,
                )
            )
            continue
        if run["session__active_run_id"] != run["pk"]:
            findings.append(Finding("stray_active_run", detail="not the session's active run", **base))

    related = ("owner", "active_run")
    for s in operator_reads.active_run_not_active().select_related(*related):
        ended = s.active_run
        assert ended is not None
        findings.append(_session_finding("active_run_not_active", s, f"active run {ended.run_id} is {ended.state}"))
    for s in operator_reads.running_without_active_run().select_related(*related):
        findings.append(_session_finding("running_without_active_run", s, "status running, no active run"))
    rows = ChatSession.objects.select_related(*related)
    for s in rows.filter(active_run__isnull=False, active_run__state__in=ACTIVE_STATES).exclude(
        status=SessionStatus.RUNNING
    ):
        findings.append(_session_finding("active_without_running_status", s, f"status {s.status}"))

    # the stranded queues among those with a current-generation queued run (stale ones are reported above)
    stranded = operator_reads.stranded_queue_runs().filter(session_id__in=list(queued_sessions))
    for pk in set(stranded.values_list("session_id", flat=True)):
        if pk not in active_sessions:  # a stray active run is reported (and fixed) on its own
            base = queued_sessions[pk]
            findings.append(Finding("queued_without_active_run", detail="queued runs wait behind nothing", **base))

    findings += _tool_findings(live, now, grace)
    findings.sort(key=lambda f: (ORDER.index(f.kind), f.session_pk, f.run_pk or 0))
    return findings


_CALL_FIELDS = (
    "call_id",
    "server",
    "tool",
    "state",
    "started_at",
    "run_id",
    "run__run_id",
    "run__state",
    "run__owner_process",
    "run__session_id",
    "run__session__key",
    "run__session__owner__username",
)


def _call_base(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "session_pk": call["run__session_id"],
        "session_key": call["run__session__key"],
        "owner": call["run__session__owner__username"],
        "run_pk": call["run_id"],
        "run_id": call["run__run_id"],
    }


def _call_name(call: dict[str, Any]) -> str:
    return f"{call['server']}.{call['tool']}" if call["server"] else call["tool"]


def _tool_findings(live: set[str], now: Any, grace: timedelta) -> list[Finding]:
    """The tool-call checks: the open calls (state index) and the pending approvals (decision index)."""
    findings: list[Finding] = []
    outlived: dict[int, list[dict[str, Any]]] = {}
    open_calls = ToolCall.objects.filter(state__in=TOOL_OPEN_STATES).order_by("run_id", "seq").values(*_CALL_FIELDS)
    for call in open_calls.iterator(chunk_size=2000):
        if call["run__state"] in TERMINAL_STATES:
            outlived.setdefault(call["run_id"], []).append(call)
            continue
        owner = call["run__owner_process"]
        if call["state"] == ToolCallState.RUNNING and call["run__state"] in ACTIVE_STATES and owner not in live:
            since = call["started_at"]
            age = f"running for {int((now - since).total_seconds())}s" if since else "running"
            where = f"owner process {owner} is not alive" if owner else "the run has no owner process"
            findings.append(
                Finding(
                    "tool_call_dead_process",
                    detail=f"{call['call_id']} {_call_name(call)} {age}; {where}: recovery ends it unknown "
                    "(whether it took effect is not known; check its side effects by hand)",
                    tool_call_ids=[call["call_id"]],
                    **_call_base(call),
                )
            )
    for calls in outlived.values():
        first = calls[0]
        listed = ", ".join(f"{c['call_id']} {_call_name(c)} ({c['state']})" for c in calls)
        findings.append(
            Finding(
                "tool_call_outlived_run",
                detail=f"the run is {first['run__state']}; still open: {listed}",
                tool_call_ids=[c["call_id"] for c in calls],
                **_call_base(first),
            )
        )
    overdue = (
        operator_reads.pending_approvals()
        .filter(expires_at__lt=now - grace, tool_call__run__state__in=ACTIVE_STATES)
        .order_by("id")
        .values("approval_id", "expires_at", *(f"tool_call__{name}" for name in _CALL_FIELDS))
    )
    for row in overdue:
        call = {name: row[f"tool_call__{name}"] for name in _CALL_FIELDS}
        late = int((now - row["expires_at"]).total_seconds())
        owner = call["run__owner_process"] or "no owner process"
        findings.append(
            Finding(
                "approval_overdue",
                detail=f"approval {row['approval_id']} of {call['call_id']} {_call_name(call)} expired {late}s ago "
                f"and is still pending (run on {owner}, which should have resolved it expired)",
                tool_call_ids=[call["call_id"]],
                **_call_base(call),
            )
        )
    return findings


def _session_finding(kind: str, session: ChatSession, detail: str) -> Finding:
    return Finding(kind, session.pk, session.key, session.owner.get_username(), detail)


def _end_run(finding: Finding, to_state: str, **kwargs: Any) -> bool:
    assert finding.run_pk is not None
    return runs.finish_run(finding.run_pk, to_state, owner_process="", **kwargs)


def _time_out(finding: Finding, message: str) -> bool:
    return _end_run(
        finding,
        RunState.TIMEOUT,
        error_kind=RunErrorKind.TIMEOUT,
        stop_reason="timeout",
        reason="run.timeout",
        error_message=message,
        actor=Actor.OPERATOR,
    )


def _interrupt(finding: Finding) -> bool:
    assert finding.run_pk is not None
    return runs.interrupt_run(finding.run_pk, message=INTERRUPTED_MESSAGE, actor=Actor.REAPER)


def _close_tool_calls(finding: Finding) -> bool:
    assert finding.run_pk is not None
    return bool(toolcalls.close_calls_of_ended_run(finding.run_pk, actor=Actor.OPERATOR))


def _report_only(finding: Finding) -> bool:
    return False


def _repair_row(finding: Finding) -> bool:
    return bool(operators.repair_session_row(finding.session_pk, actor=Actor.OPERATOR))


FIXERS: dict[str, tuple[str, Callable[[Finding], bool]]] = {
    "dead_process_run": ("end the run as failed (interrupted)", lambda f: _interrupt(f)),
    "unclaimed_run": ("end the run as failed (interrupted)", lambda f: _interrupt(f)),
    "long_running_run": (
        "end the run as timeout",
        lambda f: _time_out(f, "run exceeded GATEWAY_STUCK_RUN_SECONDS; ended by gateway_doctor"),
    ),
    "overdue_run": (
        "end the run as timeout",
        lambda f: _time_out(f, "run outlived its budget; ended by gateway_doctor"),
    ),
    "stale_generation_run": (
        "abort the run (stopReason reset)",
        lambda f: _end_run(f, RunState.KILLED, stop_reason="reset", reason="run.aborted", actor=Actor.OPERATOR),
    ),
    "stray_active_run": (
        "end the run as failed",
        lambda f: _end_run(
            f,
            RunState.FAILED,
            error_kind=RunErrorKind.UNKNOWN,
            reason="operator",
            actor=Actor.OPERATOR,
            error_message="ended by gateway_doctor: not its session's active run",
        ),
    ),
    "active_run_not_active": ("repair the session row", _repair_row),
    "running_without_active_run": ("repair the session row", _repair_row),
    "active_without_running_status": ("repair the session row", _repair_row),
    "queued_without_active_run": (
        "start the next queued run",
        lambda f: bool(operators.start_next(f.session_pk, actor=Actor.OPERATOR)),
    ),
    "tool_call_outlived_run": (
        "close the run's open tool calls as its end would have (running: unknown, or cancelled if the run "
        "was stopped; not started: cancelled; approvals: cancelled)",
        _close_tool_calls,
    ),
    "tool_call_dead_process": ("nothing here: the dead_process_run repair (or recovery) ends it unknown", _report_only),
    "approval_overdue": (
        "nothing here: its owner process should expire it; the run's timeout or repair ends it",
        _report_only,
    ),
}


def fix(
    findings: Iterable[Finding], *, dry_run: bool = False, progress: Callable[[int], None] | None = None
) -> list[Repair]:
    """Repair each finding through the lifecycle service (one transaction per finding)."""
    repairs: list[Repair] = []
    for finding in findings:
        action, fixer = FIXERS[finding.kind]
        changed = False if dry_run else fixer(finding)
        repairs.append(Repair(finding, action, changed))
        if progress is not None:
            progress(1)
    return repairs


@dataclass
class DoctorReport:
    findings: list[Finding]
    repairs: list[Repair]
    remaining: list[Finding]

    @property
    def ok(self) -> bool:
        return not self.remaining

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.as_dict() for f in self.findings],
            "repairs": [r.as_dict() for r in self.repairs],
            "remaining": [f.as_dict() for f in self.remaining],
            "counts": {kind: sum(1 for f in self.findings if f.kind == kind) for kind in CHECKS},
        }


def run(
    *,
    fix_findings: bool = False,
    dry_run: bool = False,
    progress_factory: Callable[[int], Callable[[int], None] | None] | None = None,
) -> DoctorReport:
    """Check; with `fix_findings`, repair and check again (a repair can reveal the next step)."""
    findings = check()
    if not fix_findings or not findings:
        return DoctorReport(findings, [], findings)
    progress = progress_factory(len(findings)) if progress_factory else None
    repairs = fix(findings, dry_run=dry_run, progress=progress)
    if dry_run:
        return DoctorReport(findings, repairs, findings)
    remaining = check()
    for _ in range(2):  # e.g. a released slot lets a queued run start on the next pass
        fixable = [f for f in remaining if f.kind not in REPORT_ONLY]
        if not fixable:
            break
        repairs += fix(fixable)
        remaining = check()
    return DoctorReport(findings, repairs, remaining)


def summary(findings: Iterable[Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return counts
