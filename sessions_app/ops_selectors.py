"""Reads for operators: stuck and failed sessions, counts, dead-process runs.

Every query here is driven by an index (see the `Meta.indexes` of the models and
migration 0002), so the admin and `/metrics` stay fast with 100 000 sessions and
1 000 000 runs: the selective side is the handful of open runs, never the big tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from .models import ACTIVE_STATES, ChatSession, GatewayProcess, Run, RunState, SessionStatus
from .process import live_process_ids, stale_before

FAILED_WINDOW = timedelta(hours=24)


def stuck_cutoff() -> datetime:
    """Active runs dispatched before this have run longer than GATEWAY_STUCK_RUN_SECONDS."""
    return timezone.now() - timedelta(seconds=settings.GATEWAY_STUCK_RUN_SECONDS)


def stuck_runs(live: set[str] | None = None) -> QuerySet[Run]:
    """Active runs with no live process behind them, or running longer than the threshold.

    An unowned ('') active run counts as stuck: no process executes it until one claims it.
    """
    live = live_process_ids() if live is None else live
    return Run.objects.filter(state__in=ACTIVE_STATES).filter(
        ~Q(owner_process__in=sorted(live)) | Q(dispatched_at__lt=stuck_cutoff())
    )


def stuck_sessions(live: set[str] | None = None) -> QuerySet[ChatSession]:
    """Sessions that are running or queued with nothing behind them, or running too long.

    - an active run that is stuck (see `stuck_runs`);
    - queued runs but no active run: nothing will ever start them;
    - a row that says `running` without an active run.
    """
    live = live_process_ids() if live is None else live
    # Each branch starts from a selective index (open runs by state, status), never
    # from the ~all sessions whose active_run is NULL.
    queued = Run.objects.filter(state=RunState.QUEUED).values("session_id")
    # the slot points at a run that already ended: nothing will ever release it
    # (a subquery, so the few rows with a slot are found through the active_run index)
    ended_slots = (
        ChatSession.objects.filter(active_run__gt=0).exclude(active_run__state__in=ACTIVE_STATES).values("pk")
    )
    return ChatSession.objects.filter(
        Q(pk__in=stuck_runs(live).values("session_id"))
        | Q(pk__in=queued, active_run__isnull=True)
        # Spelt NOT (... IS NOT NULL): SQLite would otherwise walk the unique active_run
        # index for IS NULL (it expects one row there; nearly every session matches).
        | (Q(status=SessionStatus.RUNNING) & ~Q(active_run__isnull=False))
        # the slot points at a run that already ended: nothing will ever release it
        | Q(pk__in=ended_slots)
    )


def failed_sessions(since: datetime | None = None) -> QuerySet[ChatSession]:
    """Sessions whose last run failed at or after `since` (default: the last 24 h)."""
    since = since or timezone.now() - FAILED_WINDOW
    return ChatSession.objects.filter(status=SessionStatus.FAILED, ended_at__gte=since)


def running_sessions() -> QuerySet[ChatSession]:
    """Sessions with an active run (driven by the active runs, not a scan of the sessions)."""
    return ChatSession.objects.filter(pk__in=Run.objects.filter(state__in=ACTIVE_STATES).values("session_id"),
                                      active_run__isnull=False)


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
        stuck=stuck_sessions(live).count(),
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
