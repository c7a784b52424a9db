"""Server-process registry: which gateway processes are alive."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from sessions_app.models import ACTIVE_STATES, GatewayProcess, Run, RunState


def register(server_id: str) -> None:
    GatewayProcess.objects.update_or_create(
        server_id=server_id,
        defaults={
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "heartbeat_at": timezone.now(),
            "stopping": False,
            "stopped_at": None,
        },
    )


def heartbeat(server_id: str) -> None:
    if not GatewayProcess.objects.filter(server_id=server_id).update(heartbeat_at=timezone.now()):
        register(server_id)


def mark_stopped(server_id: str) -> None:
    now = timezone.now()
    GatewayProcess.objects.filter(server_id=server_id).update(stopping=True, stopped_at=now)


def stale_window_seconds() -> float:
    """How old a process's last heartbeat may be before it is dead (docs/deployment.md, "Heartbeats")."""
    return float(max(settings.GATEWAY_RECOVERY_SECONDS / 2, settings.GATEWAY_HEARTBEAT_SECONDS * 3))


def stale_before() -> datetime:
    """Processes whose last heartbeat is older than this are dead."""
    return timezone.now() - timedelta(seconds=stale_window_seconds())


# Spans of wall-clock time (start, end) during which the caller could not reach the database.
Blind = Sequence[tuple[datetime, datetime]]


def blind_seconds(blind: Blind, since: datetime) -> float:
    """How much of the time since `since` the caller could not reach the database."""
    return sum(max(0.0, (end - max(start, since)).total_seconds()) for start, end in blind)


def live_process_ids(blind: Blind = ()) -> set[str]:
    """Processes that have not stopped and heartbeat recently.

    `blind`: when the caller could not reach the database (an outage, or a stall of its own).
    It could not have seen a heartbeat then, so a peer whose last one is stale is still live
    - if its heartbeat's age, minus the blind time since that heartbeat, is within the window;
    - or if it was live when a blind span began and that span ended less than
      GATEWAY_RECOVERY_SECONDS ago: after an outage a peer may reach the database later than
      the caller (its pool still waiting out DB_POOL_TIMEOUT_SECONDS for a connection).
    Each peer is judged on its own: a peer already dead when the caller went blind is dead
    after it, and recurring outages delay the verdict on a dead peer by their own length only.
    """
    stale = stale_before()
    rows = GatewayProcess.objects.filter(stopped_at__isnull=True)
    live = set(rows.filter(heartbeat_at__gte=stale).values_list("server_id", flat=True))
    if blind:
        now = timezone.now()
        window = now - stale
        grace = timedelta(seconds=settings.GATEWAY_RECOVERY_SECONDS)
        for server_id, beat in rows.filter(heartbeat_at__lt=stale).values_list("server_id", "heartbeat_at"):
            seen = (now - beat).total_seconds() - blind_seconds(blind, beat)
            if seen < window.total_seconds() or any(
                beat >= start - window and now - end < grace for start, end in blind
            ):
                live.add(server_id)
    return live


def active_runs_of(server_id: str) -> list[int]:
    """The active runs a process owns."""
    return list(Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).values_list("pk", flat=True))


def unowned_active_runs() -> list[int]:
    """Dispatching runs no process executes (started by a process without a run manager)."""
    return list(Run.objects.filter(state=RunState.DISPATCHING, owner_process="").values_list("pk", flat=True)[:50])
