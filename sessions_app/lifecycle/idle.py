"""Idle sessions: the one definition of idle, and deleting them re-checked under their row locks."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from sessions_app.lifecycle.core import row_changed
from sessions_app.models import OPEN_STATES, Actor, ChatSession, LifecycleEvent, Message, Run, SessionStatus


@dataclass
class PruneBatch:
    """What one retention batch deleted; `skipped` sessions had become busy or fresh again."""

    sessions: int = 0
    runs: int = 0
    messages: int = 0
    audit: int = 0
    skipped: int = 0
    keys: list[str] = field(default_factory=list)


# --- THE definition of an idle session (selection in `operations.prune`, the re-check below) ---


def idle_rows(cutoff: datetime) -> QuerySet[ChatSession]:
    """The row half of "idle": unchanged since `cutoff`, no active run, not `running`."""
    return ChatSession.objects.filter(updated_at__lt=cutoff, active_run__isnull=True).exclude(
        status=SessionStatus.RUNNING
    )


def open_runs() -> QuerySet[Run]:
    """The run half of "idle": a session with any of these (active or queued) is busy."""
    return Run.objects.filter(state__in=OPEN_STATES)


def idle_sessions(cutoff: datetime) -> QuerySet[ChatSession]:
    """Sessions unchanged since `cutoff` with no active or queued run (both halves, one query)."""
    return idle_rows(cutoff).exclude(Exists(open_runs().filter(session_id=OuterRef("pk"))))


def prune_idle_sessions(
    session_pks: list[int], *, idle_before: datetime, actor: str = Actor.SYSTEM, broadcast: bool = True
) -> PruneBatch:
    """Delete idle sessions with their runs, messages and audit rows.

    The idle test is repeated here under the row locks, so a session that got a run
    (active or queued) or any change since it was selected is skipped, never deleted.
    Each deleted session is announced like `sessions.delete` (reason `delete`).
    """
    with transaction.atomic():
        # `idle_sessions` in two steps: lock the idle rows, then look for their open runs, so a
        # run admitted before the lock was taken is seen (it bumps the row, or it is read here).
        locked = list(idle_rows(idle_before).select_for_update().filter(pk__in=session_pks).order_by("pk"))
        busy = set(open_runs().filter(session_id__in=[s.pk for s in locked]).values_list("session_id", flat=True))
        victims = [s for s in locked if s.pk not in busy]
        batch = PruneBatch(skipped=len(session_pks) - len(victims))
        if not victims:
            return batch
        ids = [s.pk for s in victims]
        if broadcast:
            for session in victims:
                session.version += 1
                row_changed(session, reason="delete", actor=actor, deleted=True)
        # Children first, in bulk: the cascade would otherwise load every row it deletes.
        batch.audit = LifecycleEvent.objects.filter(session_id__in=ids).delete()[0]
        batch.messages = Message.objects.filter(session_id__in=ids).delete()[0]
        _total, per_model = ChatSession.objects.filter(pk__in=ids).delete()
        batch.runs = per_model.get(Run._meta.label, 0)
        batch.audit += per_model.get(LifecycleEvent._meta.label, 0)
        batch.sessions = per_model.get(ChatSession._meta.label, 0)
        batch.keys = [s.key for s in victims]
        return batch
