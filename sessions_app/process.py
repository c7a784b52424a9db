"""Server-process registry: which gateway processes are alive."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from sessions_app.models import GatewayProcess, Run, RunState


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


def stale_before() -> datetime:
    """Processes whose last heartbeat is older than this are dead."""
    window = max(settings.GATEWAY_RECOVERY_SECONDS / 2, settings.GATEWAY_HEARTBEAT_SECONDS * 3)
    return timezone.now() - timedelta(seconds=window)


def live_process_ids() -> set[str]:
    return set(
        GatewayProcess.objects.filter(heartbeat_at__gte=stale_before(), stopped_at__isnull=True).values_list(
            "server_id", flat=True
        )
    )


def unowned_active_runs() -> list[int]:
    """Dispatching runs no process executes (started by a process without a run manager)."""
    return list(Run.objects.filter(state=RunState.DISPATCHING, owner_process="").values_list("pk", flat=True)[:50])
