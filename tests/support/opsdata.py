"""Data helpers for operator tests: sessions and runs in known (or deliberately broken) states.

`send()` admits runs through the lifecycle service, as a client would. The `plant_*`
helpers then bend rows with plain UPDATEs to build the inconsistencies that
recovery, the stuck filter and gateway_doctor must find; only tests do that.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from sessions_app.lifecycle import runs
from sessions_app.models import ChatSession, GatewayProcess, Run, RunState
from tests.support.db import admit_send

LIVE_PROCESS = "live-test-process"


def user(username: str = "owner", **extra: Any) -> Any:
    User = get_user_model()
    existing = User.objects.filter(username=username).first()
    return existing or User.objects.create_user(username=username, password="pw-12345678", **extra)


def send(owner: Any, key: str, run_id: str, message: str = "hello") -> Run:
    """Admit a chat.send through the lifecycle; the first run of an idle session becomes active."""
    outcome = admit_send(
        owner, run_id, message, key=key if key.startswith("agent:") else f"agent:main:{key}", timeout_ms=600_000
    )
    assert outcome.run is not None, outcome.admission
    return outcome.run


def session_of(run: Run) -> ChatSession:
    return ChatSession.objects.get(pk=run.session_id)


def register_live_process(server_id: str = LIVE_PROCESS) -> GatewayProcess:
    process, _ = GatewayProcess.objects.update_or_create(
        server_id=server_id, defaults={"heartbeat_at": timezone.now(), "stopped_at": None, "stopping": False}
    )
    return process


def register_dead_process(server_id: str = "dead-test-process") -> GatewayProcess:
    process, _ = GatewayProcess.objects.update_or_create(
        server_id=server_id, defaults={"heartbeat_at": timezone.now() - timedelta(hours=1), "stopped_at": None}
    )
    return process


def own(run: Run, server_id: str, *, dispatched_ago: timedelta | None = None) -> Run:
    """Give an active run an owner process (and optionally an older dispatch time)."""
    values: dict[str, Any] = {"owner_process": server_id}
    if dispatched_ago is not None:
        values["dispatched_at"] = timezone.now() - dispatched_ago
    Run.objects.filter(pk=run.pk).update(**values)
    run.refresh_from_db()
    return run


def finish(run: Run, state: str = RunState.DONE, **kwargs: Any) -> Run:
    if state == RunState.DONE and Run.objects.get(pk=run.pk).state == RunState.DISPATCHING:
        runs.mark_running(run.pk)
    assert runs.finish_run(run.pk, state, owner_process="", **kwargs)
    run.refresh_from_db()
    return run


def age_session(session: ChatSession, *, days: float) -> None:
    ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(days=days))


def ended_ago(session: ChatSession, delta: timedelta) -> None:
    ChatSession.objects.filter(pk=session.pk).update(ended_at=timezone.now() - delta)


def random_generation() -> uuid.UUID:
    return uuid.uuid4()


def doctor_json(**options: Any) -> tuple[dict[str, Any], int]:
    """`gateway_doctor --json` with these options: its report and exit code."""
    out = io.StringIO()
    try:
        call_command("gateway_doctor", json=True, stdout=out, stderr=io.StringIO(), **options)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return json.loads(out.getvalue()), code
