"""Reads for operators: stuck and failed sessions, counts, dead-process runs, open tool calls.

Every query here is driven by an index (see the `Meta.indexes` of the models), so the
admin and `/metrics` stay fast with 100 000 sessions and 1 000 000 runs on SQLite and
PostgreSQL: the selective side is the handful of open runs, never the big tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from sessions_app.models import (
    ACTIVE_STATES,
    TOOL_OPEN_STATES,
    ChatSession,
    GatewayProcess,
    Run,
    RunState,
    SessionStatus,
    ToolApproval,
    ToolCall,
)
from sessions_app.process import live_process_ids, stale_before

FAILED_WINDOW = timedelta(hours=24)


def stuck_cutoff(now: datetime | None = None) -> datetime:
    """Active runs dispatched before this have run longer than GATEWAY_STUCK_RUN_SECONDS."""
    return (now or timezone.now()) - timedelta(seconds=settings.GATEWAY_STUCK_RUN_SECONDS)


def claim_cutoff(now: datetime | None = None) -> datetime:
    """Unowned active runs dispatched before this were not claimed in time by any live process."""
    return (now or timezone.now()) - timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS)


def stuck_run_reasons(live: set[str], now: datetime | None = None) -> dict[str, Q]:
    """THE ways an active run is stuck, each a condition on `Run`, named by its doctor finding.

    `stuck_runs` ORs them; `gateway_doctor` reads them per run (as annotations) to name its
    finding. An unowned ('') active run is stuck when no process is alive to claim it, or
    when no live process claimed it within GATEWAY_RECOVERY_SECONDS (they do on each heartbeat).
    """
    too_long = Q(dispatched_at__lt=stuck_cutoff(now))
    if not live:  # nothing alive executes or claims any active run: together, every one of them
        return {
            "dead_process_run": ~Q(owner_process=""),
            "unclaimed_run": Q(owner_process=""),
            "long_running_run": too_long,
        }
    return {
        "dead_process_run": ~Q(owner_process__in=sorted(live)) & ~Q(owner_process=""),
        # (no dispatch time: impossible through the lifecycle, so nobody will claim it either)
        "unclaimed_run": Q(owner_process="") & (Q(dispatched_at__lt=claim_cutoff(now)) | Q(dispatched_at__isnull=True)),
        "long_running_run": too_long,
    }


def stuck_runs(live: set[str] | None = None) -> QuerySet[Run]:
    """Active runs with no live process behind them, or running longer than the threshold."""
    live = live_process_ids() if live is None else live
    if not live:  # `stuck_run_reasons` then covers every active run: no condition to evaluate
        return Run.objects.filter(state__in=ACTIVE_STATES)
    reasons = stuck_run_reasons(live)
    stuck = reasons["dead_process_run"] | reasons["unclaimed_run"] | reasons["long_running_run"]
    return Run.objects.filter(state__in=ACTIVE_STATES).filter(stuck)


def stranded_queue_runs() -> QuerySet[Run]:
    """Queued runs of a session with no active run: nothing will ever start them."""
    return Run.objects.filter(state=RunState.QUEUED, session__active_run__isnull=True)


def running_without_active_run() -> QuerySet[ChatSession]:
    """Sessions whose row says `running` without an active run."""
    # Spelt NOT (... IS NOT NULL): SQLite would otherwise walk the unique active_run
    # index for IS NULL (it expects one row there; nearly every session matches).
    return ChatSession.objects.filter(status=SessionStatus.RUNNING).filter(~Q(active_run__isnull=False))


def active_run_not_active() -> QuerySet[ChatSession]:
    """Sessions whose active-run slot points at a run that already ended (or never started)."""
    # `> 0` rather than IS NOT NULL: a range on the active_run index on both databases.
    return ChatSession.objects.filter(active_run__gt=0).exclude(active_run__state__in=ACTIVE_STATES)


def _stuck_branches(live: set[str], among: list[int] | None) -> list[QuerySet[Any]]:
    """The four ways a session is stuck, each a query of session ids driven by its own index.

    1. an active run that is stuck (see `stuck_runs`): the open runs by state;
    2. queued runs but no active run, so nothing will ever start them: the queued runs;
    3. a row that says `running` without an active run: the status index;
    4. the slot points at a run that already ended: the (few) filled active_run slots.
    """
    branches: list[QuerySet[Any]] = [
        stuck_runs(live).values("session_id"),
        stranded_queue_runs().values("session_id"),
        running_without_active_run().values("pk"),
        active_run_not_active().values("pk"),
    ]
    if among is not None:
        branches = [b.filter(session_id__in=among) if b.model is Run else b.filter(pk__in=among) for b in branches]
    return branches


def stuck_session_ids_query(live: set[str] | None = None, among: list[int] | None = None) -> QuerySet[Any]:
    """THE definition of a stuck session: the UNION of the four indexed branches above.

    The admin filter, its count, the list badge, `/metrics` and `gateway_doctor` all use
    it, so they cannot disagree. A UNION (not an OR of subqueries) keeps every branch on
    its own index; an OR makes PostgreSQL scan the sessions.
    """
    live = live_process_ids() if live is None else live
    first, *rest = _stuck_branches(live, among)
    return first.union(*rest)


def stuck_sessions(live: set[str] | None = None) -> QuerySet[ChatSession]:
    """Sessions that are running or queued with nothing behind them, or running too long."""
    return ChatSession.objects.filter(pk__in=stuck_session_ids_query(live))


def stuck_count(live: set[str] | None = None) -> int:
    return stuck_session_ids_query(live).count()


def stuck_session_ids(live: set[str] | None = None, among: list[int] | None = None) -> set[int]:
    """Ids of the stuck sessions (among `among` when given: one query for a page's badges)."""
    if among is not None and not among:
        return set()
    return {next(iter(row.values())) for row in stuck_session_ids_query(live, among)}


def failed_sessions(since: datetime | None = None, among: QuerySet[ChatSession] | None = None) -> QuerySet[ChatSession]:
    """THE definition of a failed session: its last run failed at or after `since` (default: the
    last 24 h). `among` narrows a queryset (the admin filter) instead of all sessions."""
    since = since or timezone.now() - FAILED_WINDOW
    sessions = ChatSession.objects.all() if among is None else among
    return sessions.filter(status=SessionStatus.FAILED, ended_at__gte=since)


def running_sessions() -> QuerySet[ChatSession]:
    """Sessions with an active run (driven by the active runs, not a scan of the sessions)."""
    return ChatSession.objects.filter(
        pk__in=Run.objects.filter(state__in=ACTIVE_STATES).values("session_id"), active_run__isnull=False
    )


@dataclass
class Counts:
    """The figures at the top of the session changelist."""

    running: int
    stuck: int
    failed_24h: int
    live_processes: int


def counts(live: set[str] | None = None) -> Counts:
    """Running, stuck and recently failed sessions: a few small indexed queries."""
    live = live_process_ids() if live is None else live
    return Counts(
        running=running_sessions().count(),
        stuck=stuck_count(live),
        failed_24h=failed_sessions().count(),
        live_processes=len(live),
    )


def oldest_active_run_age_seconds() -> float:
    """Age of the oldest active run (0 when none runs)."""
    oldest = Run.objects.filter(state__in=ACTIVE_STATES).aggregate(m=Min("dispatched_at"))["m"]
    return 0.0 if oldest is None else max(0.0, (timezone.now() - oldest).total_seconds())


def processes_with_liveness() -> QuerySet[GatewayProcess]:
    """Gateway processes, newest first, annotated with `is_live` and `has_active_runs`."""
    return GatewayProcess.objects.annotate(
        is_live=Q(heartbeat_at__gte=stale_before(), stopped_at__isnull=True),
        has_active_runs=Exists(Run.objects.filter(owner_process=OuterRef("server_id"), state__in=ACTIVE_STATES)),
    ).order_by("-started_at")


# --- tool calls and approvals (TOOLS.md §13) --------------------------------------------------------
#
# Driven by the few open rows: pending approvals by `approval_decision_expires` (decision ''),
# open calls by `toolcall_state_ended` (state first). Never a scan of the finished calls.


def pending_approvals() -> QuerySet[ToolApproval]:
    """Approvals still waiting for a decision."""
    return ToolApproval.objects.pending()


def runs_waiting_on_approval() -> QuerySet[Any]:
    """Ids of the runs with a pending approval (for `pk__in`)."""
    return pending_approvals().values("tool_call__run_id")


def sessions_waiting_on_approval(among: QuerySet[ChatSession] | None = None) -> QuerySet[ChatSession]:
    """Sessions whose row says `waitingFor: approval` (checked against the pending approvals, which
    drive the query: `waiting_for` has no index of its own)."""
    sessions = ChatSession.objects.all() if among is None else among
    return sessions.filter(pk__in=pending_approvals().values("session_id"), waiting_for="approval")


@dataclass
class ToolCounts:
    """Open tool calls by state (every open state, 0 when none) and the approvals pending among them."""

    open_calls: dict[str, int]
    pending_approvals: int


def tool_counts() -> ToolCounts:
    """One grouped query over the open calls (a pending approval always belongs to an open call:
    its decision and the call's move are one transaction)."""
    rows = (
        ToolCall.objects.filter(state__in=TOOL_OPEN_STATES)
        .order_by()
        .values("state")
        .annotate(calls=Count("id"), approvals=Count("approval", filter=Q(approval__decision="")))
    )
    found = {str(state): 0 for state in TOOL_OPEN_STATES}
    approvals = 0
    for row in rows:
        found[row["state"]] = row["calls"]
        approvals += row["approvals"]
    return ToolCounts(open_calls=found, pending_approvals=approvals)


# --- counts that need not be exact --------------------------------------------------------------------

ESTIMATE_ABOVE = 10_000  # below this, counting exactly is cheap enough


def estimated_count(queryset: QuerySet[Any], *, exact_below: int = ESTIMATE_ABOVE) -> tuple[int, bool]:
    """(count, exact): the planner's row estimate when it is large, an exact COUNT otherwise.

    On PostgreSQL a COUNT over a million runs reads a million index entries on every page
    load; the planner's estimate (EXPLAIN, no rows read) is within a few percent after
    ANALYZE. Small results, and every count on SQLite, are exact.
    """
    if connection.vendor != "postgresql":
        return queryset.count(), True
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        row = cursor.fetchone()
    document = row[0] if row else None
    if isinstance(document, str):
        document = json.loads(document)
    estimate = int(document[0]["Plan"]["Plan Rows"]) if document else 0
    if estimate < exact_below:
        return queryset.count(), True
    return estimate, False
