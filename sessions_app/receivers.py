"""The audit trail: one row per lifecycle change, written in the change's own transaction."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from .models import TERMINAL_STATES, ChatSession, LifecycleEvent, Run
from .signals import run_transitioned, session_changed


@receiver(run_transitioned, dispatch_uid="sessions_app-audit-run")
def record_run_transition(
    sender: Any, run: Run, session: ChatSession, from_state: str, to_state: str, reason: str, actor: str,
    **kwargs: Any,
) -> None:
    LifecycleEvent.objects.create(
        session=session, run=run, from_state=from_state, to_state=to_state, reason=reason, actor=actor,
        detail=run.error_message if to_state in TERMINAL_STATES else "",
    )


@receiver(session_changed, dispatch_uid="sessions_app-audit-session")
def record_session_change(
    sender: Any, session: ChatSession, reason: str, actor: str, deleted: bool = False, **kwargs: Any
) -> None:
    if not deleted:  # a deleted session's audit goes with it
        LifecycleEvent.objects.create(session=session, reason=reason, actor=actor)
